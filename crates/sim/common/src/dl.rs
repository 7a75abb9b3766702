//! Loading the driver libraries (real or test double) by name or path, for the test tools.

use std::ffi::{c_char, c_int, CStr};

/// `CRIU_CUDA_MIGRATE_LIBCUDA` or `libcuda.so.1`.
pub fn libcuda_path() -> String {
    std::env::var("CRIU_CUDA_MIGRATE_LIBCUDA").unwrap_or_else(|_| "libcuda.so.1".to_string())
}

/// `CRIU_CUDA_MIGRATE_LIBNVML` or `libnvidia-ml.so.1`.
pub fn libnvml_path() -> String {
    std::env::var("CRIU_CUDA_MIGRATE_LIBNVML").unwrap_or_else(|_| "libnvidia-ml.so.1".to_string())
}

#[derive(Debug, thiserror::Error)]
pub enum DlError {
    #[error("cannot load {path}: {source}; put the test doubles (or the driver) on LD_LIBRARY_PATH or set CRIU_CUDA_MIGRATE_LIBCUDA / CRIU_CUDA_MIGRATE_LIBNVML")]
    Load {
        path: String,
        #[source]
        source: libloading::Error,
    },
    #[error("{path} has no symbol {symbol}")]
    Symbol { path: String, symbol: String },
}

/// A loaded library that hands out typed symbols.
pub struct Lib {
    lib: libloading::Library,
    path: String,
}

impl Lib {
    pub fn open(path: &str) -> Result<Lib, DlError> {
        // SAFETY: loading a driver library (or its double) runs only its own initialisers.
        let lib = unsafe { libloading::Library::new(path) }
            .map_err(|source| DlError::Load { path: path.to_string(), source })?;
        Ok(Lib { lib, path: path.to_string() })
    }

    /// # Safety
    /// `T` must be the `extern "C" fn` type of the symbol as declared in cuda.h / nvml.h.
    pub unsafe fn get<T: Copy>(&self, name: &str) -> Result<T, DlError> {
        let mut z = name.as_bytes().to_vec();
        z.push(0);
        // SAFETY: guaranteed by the caller.
        unsafe { self.lib.get::<T>(&z) }
            .map(|s| *s)
            .map_err(|_| DlError::Symbol { path: self.path.clone(), symbol: name.to_string() })
    }
}

/// `cuGetErrorName` of a code, or the number.
pub fn cuda_error_name(lib: &Lib, code: c_int) -> String {
    // SAFETY: cuGetErrorName's signature in cuda.h.
    let Ok(f) = (unsafe { lib.get::<unsafe extern "C" fn(c_int, *mut *const c_char) -> c_int>("cuGetErrorName") })
    else {
        return format!("CUresult {code}");
    };
    let mut p: *const c_char = std::ptr::null();
    // SAFETY: writes a pointer to a static string on success.
    if unsafe { f(code, &mut p) } != 0 || p.is_null() {
        return format!("CUresult {code}");
    }
    // SAFETY: a NUL-terminated static string.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}
