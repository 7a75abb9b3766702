//! Loading `libcuda.so.1` and calling into it with typed errors.

use std::ffi::{c_char, c_int, c_uint, CStr};
use std::sync::Arc;

pub use crate::abi::{
    CuResult, CudaCode, CUDA_ERROR_ILLEGAL_STATE, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_FOUND,
    CUDA_ERROR_NOT_INITIALIZED, CUDA_ERROR_NOT_READY, CUDA_ERROR_NOT_SUPPORTED, CUDA_ERROR_NO_DEVICE,
    CUDA_ERROR_OPERATING_SYSTEM, CUDA_ERROR_UNKNOWN, CUDA_SUCCESS,
};

/// A failed driver call: which call, the `CUresult` and the driver's own name for it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{call} failed: {name} ({}): {description}", code.raw())]
pub struct CudaError {
    pub call: &'static str,
    pub code: CudaCode,
    pub name: String,
    pub description: String,
}

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot load {path}: {source}. Install the NVIDIA driver (r580 or newer) or put its libcuda.so.1 on LD_LIBRARY_PATH")]
    Library {
        path: String,
        #[source]
        source: libloading::Error,
    },
    #[error(
        "{path} has no symbol {symbol}: the driver is too old for the checkpoint API; install driver r580 or newer"
    )]
    Symbol { path: String, symbol: &'static str },
    #[error("refusing to load {path}: {why}")]
    Untrusted {
        path: String,
        #[source]
        why: crate::libfile::LibFileError,
    },
}

/// The loaded `libcuda.so.1`. Cheap to clone.
#[derive(Clone)]
pub struct Libcuda {
    inner: Arc<Inner>,
}

struct Inner {
    lib: libloading::Library,
    path: String,
    get_error_name: unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult,
    get_error_string: unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult,
    init: unsafe extern "C" fn(c_uint) -> CuResult,
    driver_get_version: unsafe extern "C" fn(*mut c_int) -> CuResult,
}

/// The library name the driver installs; `CRIU_CUDA_MIGRATE_LIBCUDA` may name another path.
pub const LIBCUDA_NAME: &str = "libcuda.so.1";

impl Libcuda {
    /// Loads the library a setting names (`CRIU_CUDA_MIGRATE_LIBCUDA`, read by the caller's configuration:
    /// this crate reads no environment), else the loader's `libcuda.so.1`.
    pub fn load(setting: Option<&str>) -> Result<Libcuda, LoadError> {
        Self::load_from(setting.unwrap_or(LIBCUDA_NAME))
    }

    pub fn load_from(path: &str) -> Result<Libcuda, LoadError> {
        // A path is opened and checked once; the loader maps that very file (`crate::libfile`).
        let file =
            crate::libfile::open_library(path).map_err(|why| LoadError::Untrusted { path: path.to_string(), why })?;
        let load_path = file.map_or_else(|| path.to_string(), |f| f.into_loader_path());
        // RTLD_NODELETE: cuInit starts driver threads that run libcuda's code for the rest of
        // the process; unmapping the library when the last handle drops would crash them.
        let flags = libloading::os::unix::RTLD_NOW | libc::RTLD_NODELETE;
        // SAFETY: loading the NVIDIA driver library runs its initialisers; that is the documented
        // way to use it and it does not depend on our process state.
        let lib: libloading::Library = unsafe { libloading::os::unix::Library::open(Some(&load_path), flags) }
            .map_err(|source| LoadError::Library { path: path.to_string(), source })?
            .into();
        macro_rules! sym {
            ($name:literal) => {{
                // SAFETY: the symbol's C signature is the one declared in CUDA's cuda.h; the
                // function pointer type on the left matches it.
                let s = unsafe { lib.get(concat!($name, "\0").as_bytes()) }
                    .map_err(|_| LoadError::Symbol { path: path.to_string(), symbol: $name })?;
                *s
            }};
        }
        let inner = Inner {
            get_error_name: sym!("cuGetErrorName"),
            get_error_string: sym!("cuGetErrorString"),
            init: sym!("cuInit"),
            driver_get_version: sym!("cuDriverGetVersion"),
            path: path.to_string(),
            lib,
        };
        Ok(Libcuda { inner: Arc::new(inner) })
    }

    pub fn path(&self) -> &str {
        &self.inner.path
    }

    /// Resolves another driver symbol. The caller names the exact C signature as `T`.
    ///
    /// # Safety
    /// `T` must be the `unsafe extern "C" fn` type matching the symbol's declaration in cuda.h.
    pub unsafe fn symbol<T: Copy>(&self, name: &'static str) -> Result<T, LoadError> {
        let mut z = Vec::with_capacity(name.len() + 1);
        z.extend_from_slice(name.as_bytes());
        z.push(0);
        // SAFETY: guaranteed by this function's contract.
        let s = unsafe { self.inner.lib.get::<T>(&z) }
            .map_err(|_| LoadError::Symbol { path: self.inner.path.clone(), symbol: name })?;
        Ok(*s)
    }

    /// Turns a `CUresult` into `Result`, naming the call.
    pub fn check(&self, call: &'static str, code: CuResult) -> Result<(), CudaError> {
        if code == CUDA_SUCCESS {
            return Ok(());
        }
        Err(CudaError {
            call,
            code: CudaCode::from_raw(code),
            name: self.error_name(code),
            description: self.error_string(code),
        })
    }

    pub fn error_name(&self, code: CuResult) -> String {
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: cuGetErrorName writes a pointer to a static string or leaves it untouched.
        let r = unsafe { (self.inner.get_error_name)(code, &mut p) };
        static_str(r, p).unwrap_or_else(|| format!("CUDA_ERROR_{code}"))
    }

    pub fn error_string(&self, code: CuResult) -> String {
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: as for cuGetErrorName.
        let r = unsafe { (self.inner.get_error_string)(code, &mut p) };
        static_str(r, p).unwrap_or_else(|| "unknown error".to_string())
    }

    /// `cuInit(0)`. The driver requires it in the process that restores another process.
    pub fn init(&self) -> Result<(), CudaError> {
        // SAFETY: plain call with a flags word.
        let r = unsafe { (self.inner.init)(0) };
        self.check("cuInit", r)
    }

    /// `cuDriverGetVersion`, e.g. 13000 for CUDA 13.0.
    pub fn driver_version(&self) -> Result<i32, CudaError> {
        let mut v: c_int = 0;
        // SAFETY: writes one int.
        let r = unsafe { (self.inner.driver_get_version)(&mut v) };
        self.check("cuDriverGetVersion", r)?;
        Ok(v)
    }
}

fn static_str(r: CuResult, p: *const c_char) -> Option<String> {
    if r != CUDA_SUCCESS || p.is_null() {
        return None;
    }
    // SAFETY: the driver returned a pointer to a NUL-terminated static string.
    Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}
