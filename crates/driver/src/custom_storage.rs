//! The driver's custom storage (CUDA 13.4, driver r615): instead of staging a checkpointed process's device memory
//! in that process's host memory, the driver maps it into the CALLER's GPU address space, one contiguous region per
//! GPU with a stream of the caller's primary context there; the caller copies the regions to its own storage and
//! completes the operation (`cuCheckpointOperationComplete`), and the process is CHECKPOINTED. A restore maps empty
//! regions on the new GPUs, which the caller fills before it completes; the process is then LOCKED.
//!
//! The layout and the protocol are NVIDIA's published CUDA 13.4 driver API (`crate::abi` asserts the layout at
//! compile time; docs/ARCHITECTURE.md names the sources). No r615 driver was on the machines this was built on: this
//! seam is proven on the test double of libcuda only, and the plugin does not use it yet.

use std::ffi::{c_int, c_uint, c_void};

use ccm_identity::GpuUuid;

use crate::abi::{self, CheckpointArgs134, CustomStorageInfo, GpuPair, OperationHandle, RestoreArgs134};
use crate::cuda::{CuResult, CudaError, Libcuda};

type CheckpointFn = unsafe extern "C" fn(c_int, *mut CheckpointArgs134) -> CuResult;
type RestoreFn = unsafe extern "C" fn(c_int, *mut RestoreArgs134) -> CuResult;
type CompleteFn = unsafe extern "C" fn(OperationHandle) -> CuResult;
type StreamGetCtxFn = unsafe extern "C" fn(*mut c_void, *mut *mut c_void) -> CuResult;
type CtxSetCurrentFn = unsafe extern "C" fn(*mut c_void) -> CuResult;
type MemcpyDtoHFn = unsafe extern "C" fn(*mut c_void, u64, usize) -> CuResult;
type MemcpyHtoDFn = unsafe extern "C" fn(u64, *const c_void, usize) -> CuResult;
type DeviceGetCountFn = unsafe extern "C" fn(*mut c_int) -> CuResult;
type DeviceGetFn = unsafe extern "C" fn(*mut c_int, c_int) -> CuResult;
type PrimaryCtxRetainFn = unsafe extern "C" fn(*mut *mut c_void, c_int) -> CuResult;
type CtxGetDeviceFn = unsafe extern "C" fn(*mut c_int) -> CuResult;
type DeviceGetUuidFn = unsafe extern "C" fn(*mut [u8; 16], c_int) -> CuResult;

/// The custom-storage entry points of a loaded libcuda that has them.
pub struct CustomStorageApi {
    lib: Libcuda,
    checkpoint: CheckpointFn,
    restore: RestoreFn,
    complete: CompleteFn,
    stream_get_ctx: StreamGetCtxFn,
    ctx_set_current: CtxSetCurrentFn,
    memcpy_dtoh: MemcpyDtoHFn,
    memcpy_htod: MemcpyHtoDFn,
    device_get_count: DeviceGetCountFn,
    device_get: DeviceGetFn,
    primary_ctx_retain: PrimaryCtxRetainFn,
    ctx_get_device: CtxGetDeviceFn,
    device_get_uuid: DeviceGetUuidFn,
}

/// One GPU's region of an operation in progress, as the driver handed it over (in its order).
#[derive(Debug, Clone, Copy)]
pub struct DeviceRegion {
    pub dev_ptr: u64,
    pub size: u64,
    /// The GPU the region is on (its stream's context's device).
    pub gpu: GpuUuid,
    ctx: *mut c_void,
}

/// A custom-storage operation in progress: the process is CHECKPOINTING or RESTORING until [`Operation::complete`].
/// Dropped without it, the operation stays open in the driver (the process with it): complete it.
pub struct Operation<'a> {
    api: &'a CustomStorageApi,
    handle: OperationHandle,
    pub regions: Vec<DeviceRegion>,
}

impl CustomStorageApi {
    /// The API, when the driver has it: CUDA 13.4 or later (`cuDriverGetVersion`) and `cuCheckpointOperationComplete`
    /// exported. `None` otherwise: the device memory is staged in the process as before.
    pub fn new(lib: &Libcuda) -> Option<CustomStorageApi> {
        if lib.driver_version().ok()? < abi::FIRST_CUSTOM_STORAGE_DRIVER_API {
            return None;
        }
        // SAFETY: each type alias above is the C signature of the named function in CUDA 13.4's cuda.h, with the
        // argument structs laid out as `crate::abi` asserts.
        unsafe {
            Some(CustomStorageApi {
                checkpoint: lib.symbol("cuCheckpointProcessCheckpoint").ok()?,
                restore: lib.symbol("cuCheckpointProcessRestore").ok()?,
                complete: lib.symbol("cuCheckpointOperationComplete").ok()?,
                stream_get_ctx: lib.symbol("cuStreamGetCtx").ok()?,
                ctx_set_current: lib.symbol("cuCtxSetCurrent").ok()?,
                memcpy_dtoh: lib.symbol("cuMemcpyDtoH_v2").ok()?,
                memcpy_htod: lib.symbol("cuMemcpyHtoD_v2").ok()?,
                device_get_count: lib.symbol("cuDeviceGetCount").ok()?,
                device_get: lib.symbol("cuDeviceGet").ok()?,
                primary_ctx_retain: lib.symbol("cuDevicePrimaryCtxRetain").ok()?,
                ctx_get_device: lib.symbol("cuCtxGetDevice").ok()?,
                device_get_uuid: lib.symbol("cuDeviceGetUuid_v2").ok()?,
                lib: lib.clone(),
            })
        }
    }

    /// Retains the primary context of every GPU this process sees, which the driver requires of the caller for every
    /// GPU the target uses (`CUDA_ERROR_INVALID_CONTEXT` otherwise). `cuInit` must have run.
    pub fn retain_contexts(&self) -> Result<(), CudaError> {
        let mut n: c_int = 0;
        // SAFETY: writes one int.
        self.lib.check("cuDeviceGetCount", unsafe { (self.device_get_count)(&mut n) })?;
        for ordinal in 0..n {
            let mut dev: c_int = 0;
            let mut ctx: *mut c_void = std::ptr::null_mut();
            // SAFETY: writes one device handle.
            self.lib.check("cuDeviceGet", unsafe { (self.device_get)(&mut dev, ordinal) })?;
            // SAFETY: writes one context handle; the retained context is kept for the process's life.
            self.lib.check("cuDevicePrimaryCtxRetain", unsafe { (self.primary_ctx_retain)(&mut ctx, dev) })?;
        }
        Ok(())
    }

    /// `cuCheckpointProcessCheckpoint` of the LOCKED `pid` to custom storage: its regions, to copy out.
    pub fn checkpoint(&self, pid: i32) -> Result<Operation<'_>, CudaError> {
        let mut info: *mut CustomStorageInfo = std::ptr::null_mut();
        let mut args = CheckpointArgs134 { custom_storage_info_out: &mut info, reserved: [0; 56] };
        // SAFETY: args is CUDA 13.4's layout; the driver writes `info`, which lives across the call.
        let r = unsafe { (self.checkpoint)(pid, &mut args) };
        self.lib.check("cuCheckpointProcessCheckpoint", r)?;
        self.operation(info, "cuCheckpointProcessCheckpoint")
    }

    /// `cuCheckpointProcessRestore` of the CHECKPOINTED `pid` from custom storage onto the GPUs `pairs` name (empty:
    /// the same GPUs): its regions, to fill.
    pub fn restore(&self, pid: i32, pairs: &[(GpuUuid, GpuUuid)]) -> Result<Operation<'_>, CudaError> {
        let raw: Vec<GpuPair> =
            pairs.iter().map(|(o, n)| GpuPair { old_uuid: *o.as_bytes(), new_uuid: *n.as_bytes() }).collect();
        let mut info: *mut CustomStorageInfo = std::ptr::null_mut();
        let mut args = RestoreArgs134 {
            gpu_pairs: if raw.is_empty() { std::ptr::null() } else { raw.as_ptr() },
            gpu_pairs_count: c_uint::try_from(raw.len()).map_err(|_| self.invalid("too many GPU pairs"))?,
            padding0: 0,
            custom_storage_info_out: &mut info,
            reserved: [0; 40],
        };
        // SAFETY: args is CUDA 13.4's layout, pointing at `raw` and `info`, which outlive the call.
        let r = unsafe { (self.restore)(pid, &mut args) };
        self.lib.check("cuCheckpointProcessRestore", r)?;
        self.operation(info, "cuCheckpointProcessRestore")
    }

    fn invalid(&self, why: &str) -> CudaError {
        CudaError {
            call: "custom storage",
            code: abi::CudaCode::InvalidValue,
            name: "CUDA_ERROR_INVALID_VALUE".into(),
            description: why.into(),
        }
    }

    /// The regions of the driver's `info`, each with its stream's context.
    fn operation(&self, info: *mut CustomStorageInfo, call: &'static str) -> Result<Operation<'_>, CudaError> {
        if info.is_null() {
            return Err(CudaError { call, ..self.invalid("the driver returned no custom storage info") });
        }
        // SAFETY: the driver allocated and filled `info` (and its array of deviceCount entries); both stay valid
        // until cuCheckpointOperationComplete.
        let (handle, per) = unsafe {
            let i = &*info;
            let per: &[abi::CustomStoragePerDevice] = if i.per_device.is_null() || i.device_count == 0 {
                &[]
            } else {
                std::slice::from_raw_parts(i.per_device, i.device_count as usize)
            };
            (i.handle, per.to_vec())
        };
        let mut op = Operation { api: self, handle, regions: Vec::with_capacity(per.len()) };
        for p in per {
            let mut ctx: *mut c_void = std::ptr::null_mut();
            // SAFETY: the stream is the driver's, of the caller's primary context on the region's GPU; the mapped
            // memory itself carries no context (peers' measurement), so the copies use the stream's.
            let r = unsafe { (self.stream_get_ctx)(p.stream, &mut ctx) };
            self.lib.check("cuStreamGetCtx", r)?;
            // SAFETY: a context the driver named; then one int and 16 bytes written.
            let gpu = unsafe {
                self.lib.check("cuCtxSetCurrent", (self.ctx_set_current)(ctx))?;
                let mut dev: c_int = 0;
                self.lib.check("cuCtxGetDevice", (self.ctx_get_device)(&mut dev))?;
                let mut uuid = [0u8; 16];
                self.lib.check("cuDeviceGetUuid_v2", (self.device_get_uuid)(&mut uuid, dev))?;
                GpuUuid(uuid)
            };
            op.regions.push(DeviceRegion { dev_ptr: p.dev_ptr, size: p.size as u64, gpu, ctx });
        }
        Ok(op)
    }
}

impl Operation<'_> {
    fn at(&self, region: usize, offset: u64, len: usize) -> Result<DeviceRegion, CudaError> {
        let r = *self.regions.get(region).ok_or_else(|| self.api.invalid("no such region"))?;
        if offset.checked_add(len as u64).is_none_or(|end| end > r.size) {
            return Err(self.api.invalid("a copy past the region's end"));
        }
        // SAFETY: a context the driver named for this region.
        self.api.lib.check("cuCtxSetCurrent", unsafe { (self.api.ctx_set_current)(r.ctx) })?;
        Ok(r)
    }

    /// Copies `buf.len()` bytes of region `region` from `offset` into `buf` (a checkpoint's copy out).
    pub fn read(&self, region: usize, offset: u64, buf: &mut [u8]) -> Result<(), CudaError> {
        let r = self.at(region, offset, buf.len())?;
        // SAFETY: `buf` is writable for its length; the source lies inside the mapped region (checked above).
        let code = unsafe { (self.api.memcpy_dtoh)(buf.as_mut_ptr().cast(), r.dev_ptr + offset, buf.len()) };
        self.api.lib.check("cuMemcpyDtoH_v2", code)
    }

    /// Copies `buf` into region `region` at `offset` (a restore's fill).
    pub fn write(&self, region: usize, offset: u64, buf: &[u8]) -> Result<(), CudaError> {
        let r = self.at(region, offset, buf.len())?;
        // SAFETY: `buf` is readable for its length; the target lies inside the mapped region (checked above).
        let code = unsafe { (self.api.memcpy_htod)(r.dev_ptr + offset, buf.as_ptr().cast(), buf.len()) };
        self.api.lib.check("cuMemcpyHtoD_v2", code)
    }

    /// `cuCheckpointOperationComplete`: the checkpoint's process is CHECKPOINTED (its device memory in the caller's
    /// storage only), the restore's LOCKED.
    pub fn complete(self) -> Result<(), CudaError> {
        // SAFETY: the handle of this operation, completed once (self is consumed).
        let r = unsafe { (self.api.complete)(self.handle) };
        self.api.lib.check("cuCheckpointOperationComplete", r)
    }
}
