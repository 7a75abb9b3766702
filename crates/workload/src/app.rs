//! App-side driver calls: what an ordinary CUDA program does (enumerate devices, read their
//! identity, make a context, hold and check device memory).
//!
//! The sample workload uses this to watch its own device identity across checkpoint, restore
//! and migration, both against the real `libcuda.so.1` and against the test double, which
//! implements exactly the symbols resolved here. The plugin itself never uses this module.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::fmt;
use std::sync::Arc;

use ccm_identity::{GpuUuid, PciAddress};

use ccm_driver::cuda::{CuResult, CudaError, Libcuda, LoadError};

/// `CUdevice_attribute` values used here (cuda.h).
pub const CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: c_int = 33;
pub const CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: c_int = 34;
pub const CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: c_int = 50;

/// Room for `cuDeviceGetPCIBusId`'s answer: cuda.h asks for at least 13 bytes
/// (`0000:00:00.0` plus NUL); a longer buffer costs nothing and survives longer domains.
const BUS_ID_LEN: usize = 64;
/// Room for `cuDeviceGetName`'s answer.
const NAME_LEN: usize = 256;

/// A buffer's length as the driver's `int` argument; a longer buffer is offered as `c_int::MAX`
/// bytes, still within it.
fn c_len(len: usize) -> c_int {
    c_int::try_from(len).unwrap_or(c_int::MAX)
}

/// Failures of the app-side calls.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    Cuda(#[from] CudaError),
    #[error(
        "device copy of {len} bytes at offset {offset} does not fit in a buffer of {size} bytes; copy a smaller range"
    )]
    OutOfBounds { offset: usize, len: usize, size: usize },
    #[error("{what} = {value} does not fit the driver's argument type; use a smaller size")]
    TooLarge { what: &'static str, value: usize },
}

/// A `CUdevice` handle as `cuDeviceGet` returns it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Device(c_int);

impl Device {
    /// The raw `CUdevice` value (for logs; on every driver seen it equals the ordinal).
    pub fn raw(self) -> i32 {
        self.0
    }
}

/// A `CUcontext` handle. Only identifies the context; the driver owns it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Context(*mut c_void);

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Context({:p})", self.0)
    }
}

/// The PCI location as `cuDeviceGetAttribute` reports it (three separate attributes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PciAttributes {
    pub domain: u32,
    pub bus: u32,
    pub device: u32,
}

impl PciAttributes {
    pub fn to_address(self) -> PciAddress {
        PciAddress { domain: self.domain, bus: self.bus, device: self.device, function: 0 }
    }
}

type FnInt = unsafe extern "C" fn(*mut c_int) -> CuResult;
type FnDeviceGet = unsafe extern "C" fn(*mut c_int, c_int) -> CuResult;
type FnString = unsafe extern "C" fn(*mut c_char, c_int, c_int) -> CuResult;
type FnTotalMem = unsafe extern "C" fn(*mut usize, c_int) -> CuResult;
type FnUuid = unsafe extern "C" fn(*mut [u8; 16], c_int) -> CuResult;
type FnAttribute = unsafe extern "C" fn(*mut c_int, c_int, c_int) -> CuResult;
type FnPrimaryCtxRetain = unsafe extern "C" fn(*mut *mut c_void, c_int) -> CuResult;
type FnCtxSetCurrent = unsafe extern "C" fn(*mut c_void) -> CuResult;
type FnVoid = unsafe extern "C" fn() -> CuResult;
type FnMemAlloc = unsafe extern "C" fn(*mut u64, usize) -> CuResult;
type FnMemFree = unsafe extern "C" fn(u64) -> CuResult;
type FnMemsetD32 = unsafe extern "C" fn(u64, c_uint, usize) -> CuResult;
type FnMemcpyDtoH = unsafe extern "C" fn(*mut c_void, u64, usize) -> CuResult;
type FnMemcpyHtoD = unsafe extern "C" fn(u64, *const c_void, usize) -> CuResult;

struct Fns {
    device_get_count: FnInt,
    device_get: FnDeviceGet,
    device_get_name: FnString,
    device_total_mem: FnTotalMem,
    device_get_pci_bus_id: FnString,
    device_get_uuid: FnUuid,
    device_get_attribute: FnAttribute,
    primary_ctx_retain: FnPrimaryCtxRetain,
    ctx_set_current: FnCtxSetCurrent,
    ctx_get_device: FnInt,
    ctx_synchronize: FnVoid,
    mem_alloc: FnMemAlloc,
    mem_free: FnMemFree,
    memset_d32: FnMemsetD32,
    memcpy_dtoh: FnMemcpyDtoH,
    memcpy_htod: FnMemcpyHtoD,
}

/// The app-side driver API of a loaded `libcuda.so.1`. Cheap to clone.
///
/// Contexts and device memory follow the driver's rules: a call works on the calling thread's
/// current context (set with [`CudaApp::set_current`]).
#[derive(Clone)]
pub struct CudaApp {
    lib: Libcuda,
    fns: Arc<Fns>,
}

impl CudaApp {
    /// Resolves every app-side symbol in `lib`. Fails naming the first missing symbol.
    pub fn new(lib: Libcuda) -> Result<CudaApp, AppError> {
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: each field's fn-pointer type is the C signature cuda.h declares for
                // the named symbol (CUdevice = int, CUdeviceptr = unsigned long long,
                // CUcontext = pointer, CUuuid = 16 bytes, size_t = usize).
                unsafe { lib.symbol($name)? }
            };
        }
        let fns = Fns {
            device_get_count: sym!("cuDeviceGetCount"),
            device_get: sym!("cuDeviceGet"),
            device_get_name: sym!("cuDeviceGetName"),
            device_total_mem: sym!("cuDeviceTotalMem_v2"),
            device_get_pci_bus_id: sym!("cuDeviceGetPCIBusId"),
            device_get_uuid: sym!("cuDeviceGetUuid_v2"),
            device_get_attribute: sym!("cuDeviceGetAttribute"),
            primary_ctx_retain: sym!("cuDevicePrimaryCtxRetain"),
            ctx_set_current: sym!("cuCtxSetCurrent"),
            ctx_get_device: sym!("cuCtxGetDevice"),
            ctx_synchronize: sym!("cuCtxSynchronize"),
            mem_alloc: sym!("cuMemAlloc_v2"),
            mem_free: sym!("cuMemFree_v2"),
            memset_d32: sym!("cuMemsetD32_v2"),
            memcpy_dtoh: sym!("cuMemcpyDtoH_v2"),
            memcpy_htod: sym!("cuMemcpyHtoD_v2"),
        };
        Ok(CudaApp { lib, fns: Arc::new(fns) })
    }

    /// Loads `libcuda.so.1` (or `$CRIU_CUDA_MIGRATE_LIBCUDA`), calls `cuInit(0)` and resolves
    /// the app-side symbols.
    pub fn load_and_init() -> Result<CudaApp, AppError> {
        // The plugin's setting names the driver library for the workload too (the test doubles, a driver
        // outside the loader's path); an empty value is no setting.
        let setting = std::env::var(ccm_settings::LIBCUDA.env).ok().filter(|v| !v.trim().is_empty());
        let lib = Libcuda::load(setting.as_deref())?;
        lib.init()?;
        CudaApp::new(lib)
    }

    pub fn libcuda(&self) -> &Libcuda {
        &self.lib
    }

    /// `cuDeviceGetCount`.
    pub fn device_count(&self) -> Result<u32, AppError> {
        let mut n: c_int = 0;
        // SAFETY: writes one int.
        let r = unsafe { (self.fns.device_get_count)(&mut n) };
        self.lib.check("cuDeviceGetCount", r)?;
        Ok(u32::try_from(n).unwrap_or(0))
    }

    /// `cuDeviceGet` for an ordinal of this process's view.
    pub fn device(&self, ordinal: u32) -> Result<Device, AppError> {
        let ordinal =
            c_int::try_from(ordinal).map_err(|_| AppError::TooLarge { what: "ordinal", value: ordinal as usize })?;
        let mut d: c_int = 0;
        // SAFETY: writes one CUdevice (int).
        let r = unsafe { (self.fns.device_get)(&mut d, ordinal) };
        self.lib.check("cuDeviceGet", r)?;
        Ok(Device(d))
    }

    /// `cuDeviceGetName`, e.g. "NVIDIA H200".
    pub fn device_name(&self, dev: Device) -> Result<String, AppError> {
        let mut buf = [0 as c_char; NAME_LEN];
        // SAFETY: the driver writes at most `len` bytes including the NUL.
        let r = unsafe { (self.fns.device_get_name)(buf.as_mut_ptr(), c_len(NAME_LEN), dev.0) };
        self.lib.check("cuDeviceGetName", r)?;
        Ok(c_buf_to_string(&buf))
    }

    /// `cuDeviceTotalMem_v2`, in bytes.
    pub fn device_total_mem(&self, dev: Device) -> Result<u64, AppError> {
        let mut bytes: usize = 0;
        // SAFETY: writes one size_t.
        let r = unsafe { (self.fns.device_total_mem)(&mut bytes, dev.0) };
        self.lib.check("cuDeviceTotalMem_v2", r)?;
        Ok(bytes as u64)
    }

    /// `cuDeviceGetPCIBusId` as the driver's text (e.g. `0000:00:06.0`). This is the answer
    /// that goes stale after a remapped restore; see [`CudaApp::device_pci_bus_id`] for the
    /// parsed form.
    pub fn device_pci_bus_id_text(&self, dev: Device) -> Result<String, AppError> {
        let mut buf = [0 as c_char; BUS_ID_LEN];
        // SAFETY: the driver writes at most `len` bytes including the NUL.
        let r = unsafe { (self.fns.device_get_pci_bus_id)(buf.as_mut_ptr(), c_len(BUS_ID_LEN), dev.0) };
        self.lib.check("cuDeviceGetPCIBusId", r)?;
        Ok(c_buf_to_string(&buf))
    }

    /// `cuDeviceGetUuid_v2` (the NVML-compatible UUID).
    pub fn device_uuid(&self, dev: Device) -> Result<GpuUuid, AppError> {
        let mut bytes = [0u8; 16];
        // SAFETY: CUuuid is `struct { char bytes[16]; }`; the driver writes 16 bytes.
        let r = unsafe { (self.fns.device_get_uuid)(&mut bytes, dev.0) };
        self.lib.check("cuDeviceGetUuid_v2", r)?;
        Ok(GpuUuid::from_bytes(bytes))
    }

    /// `cuDeviceGetAttribute` with a raw `CUdevice_attribute`.
    pub fn device_attribute(&self, dev: Device, attribute: c_int) -> Result<i32, AppError> {
        let mut v: c_int = 0;
        // SAFETY: writes one int.
        let r = unsafe { (self.fns.device_get_attribute)(&mut v, attribute, dev.0) };
        self.lib.check("cuDeviceGetAttribute", r)?;
        Ok(v)
    }

    /// The PCI domain, bus and device attributes (33, 34, 50).
    pub fn device_pci_attributes(&self, dev: Device) -> Result<PciAttributes, AppError> {
        // The driver's int, bit for bit (PCI numbers are never negative).
        let word = |attr| self.device_attribute(dev, attr).map(|v| u32::from_ne_bytes(v.to_ne_bytes()));
        Ok(PciAttributes {
            domain: word(CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)?,
            bus: word(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)?,
            device: word(CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)?,
        })
    }

    /// `cuDevicePrimaryCtxRetain`. The retain is kept for the life of the process (the
    /// workload never releases its primary contexts).
    pub fn primary_context(&self, dev: Device) -> Result<Context, AppError> {
        let mut ctx: *mut c_void = std::ptr::null_mut();
        // SAFETY: writes one CUcontext.
        let r = unsafe { (self.fns.primary_ctx_retain)(&mut ctx, dev.0) };
        self.lib.check("cuDevicePrimaryCtxRetain", r)?;
        Ok(Context(ctx))
    }

    /// `cuCtxSetCurrent` on the calling thread.
    pub fn set_current(&self, ctx: Context) -> Result<(), AppError> {
        // SAFETY: the handle came from the driver (primary_context) and is still retained.
        let r = unsafe { (self.fns.ctx_set_current)(ctx.0) };
        self.lib.check("cuCtxSetCurrent", r)?;
        Ok(())
    }

    /// `cuCtxGetDevice`: the device of the calling thread's current context.
    pub fn current_device(&self) -> Result<Device, AppError> {
        let mut d: c_int = 0;
        // SAFETY: writes one CUdevice.
        let r = unsafe { (self.fns.ctx_get_device)(&mut d) };
        self.lib.check("cuCtxGetDevice", r)?;
        Ok(Device(d))
    }

    /// `cuCtxSynchronize` on the current context.
    pub fn synchronize(&self) -> Result<(), AppError> {
        // SAFETY: no arguments.
        let r = unsafe { (self.fns.ctx_synchronize)() };
        self.lib.check("cuCtxSynchronize", r)?;
        Ok(())
    }

    /// `cuMemAlloc_v2` in `ctx` (made current first). The buffer is freed on drop.
    pub fn alloc(&self, ctx: Context, bytes: usize) -> Result<DeviceBuffer, AppError> {
        self.set_current(ctx)?;
        let mut ptr: u64 = 0;
        // SAFETY: writes one CUdeviceptr.
        let r = unsafe { (self.fns.mem_alloc)(&mut ptr, bytes) };
        self.lib.check("cuMemAlloc_v2", r)?;
        Ok(DeviceBuffer { app: self.clone(), ctx, ptr, bytes })
    }
}

/// Device memory from [`CudaApp::alloc`]; every operation makes its context current first.
pub struct DeviceBuffer {
    app: CudaApp,
    ctx: Context,
    ptr: u64,
    bytes: usize,
}

impl fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DeviceBuffer({:#x}, {} bytes, {:?})", self.ptr, self.bytes, self.ctx)
    }
}

impl DeviceBuffer {
    pub fn len(&self) -> usize {
        self.bytes
    }
    pub fn context(&self) -> Context {
        self.ctx
    }

    fn range(&self, offset: usize, len: usize) -> Result<u64, AppError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.bytes => Ok(self.ptr + offset as u64),
            _ => Err(AppError::OutOfBounds { offset, len, size: self.bytes }),
        }
    }

    /// `cuMemsetD32_v2`: `words` 32-bit words from byte `offset` (a multiple of 4) set to `value`.
    pub fn fill_u32(&self, offset: usize, words: usize, value: u32) -> Result<(), AppError> {
        let len = words.checked_mul(4).ok_or(AppError::TooLarge { what: "word count", value: words })?;
        let dst = self.range(offset, len)?;
        self.app.set_current(self.ctx)?;
        // SAFETY: [dst, dst+len) lies inside this allocation (checked above).
        let r = unsafe { (self.app.fns.memset_d32)(dst, value, words) };
        self.app.lib.check("cuMemsetD32_v2", r)?;
        Ok(())
    }

    /// `cuMemcpyDtoH_v2`: device bytes from `offset` into all of `dst`.
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), AppError> {
        let src = self.range(offset, dst.len())?;
        self.app.set_current(self.ctx)?;
        // SAFETY: the driver writes exactly dst.len() bytes into dst; the source range lies
        // inside this allocation.
        let r = unsafe { (self.app.fns.memcpy_dtoh)(dst.as_mut_ptr().cast(), src, dst.len()) };
        self.app.lib.check("cuMemcpyDtoH_v2", r)?;
        Ok(())
    }

    /// `cuMemcpyHtoD_v2`: all of `src` to device bytes from `offset`.
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<(), AppError> {
        let dst = self.range(offset, src.len())?;
        self.app.set_current(self.ctx)?;
        // SAFETY: the driver reads exactly src.len() bytes from src; the destination range lies
        // inside this allocation.
        let r = unsafe { (self.app.fns.memcpy_htod)(dst, src.as_ptr().cast(), src.len()) };
        self.app.lib.check("cuMemcpyHtoD_v2", r)?;
        Ok(())
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // A failure here cannot be returned; the memory goes with the context at exit anyway.
        if self.app.set_current(self.ctx).is_err() {
            return;
        }
        // SAFETY: ptr came from cuMemAlloc_v2 in this context and is freed only here.
        let r = unsafe { (self.app.fns.mem_free)(self.ptr) };
        if let Err(e) = self.app.lib.check("cuMemFree_v2", r) {
            log::warn!("{e}");
        }
    }
}

/// A NUL-terminated C string in a fixed buffer (an unterminated buffer is taken whole).
fn c_buf_to_string(buf: &[c_char]) -> String {
    // SAFETY: c_char and u8 have the same size and alignment; the slice stays borrowed.
    let bytes: &[u8] = unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), buf.len()) };
    match CStr::from_bytes_until_nul(bytes) {
        Ok(s) => s.to_string_lossy().into_owned(),
        Err(_) => String::from_utf8_lossy(bytes).into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_buffers_become_strings() {
        let mut buf = [0 as c_char; 16];
        for (slot, b) in buf.iter_mut().zip(b"0000:00:06.0") {
            *slot = c_char::from_ne_bytes([*b]);
        }
        assert_eq!(c_buf_to_string(&buf), "0000:00:06.0");
        let full = [c_char::from_ne_bytes([b'a']); 4];
        assert_eq!(c_buf_to_string(&full), "aaaa");
    }

    #[test]
    fn attributes_make_an_address() {
        let a = PciAttributes { domain: 0, bus: 0, device: 6 };
        assert_eq!(a.to_address().to_short_string(), "0000:00:06.0");
    }
}
