//! The CUDA driver's checkpoint ABI, declared once: result codes, process states, the argument
//! structs of `cuCheckpointProcess*` with their layout checked at compile time, and which driver
//! versions this layout is known for. The driver wrapper ([`crate::checkpoint`]) and the test
//! double of libcuda (`crates/sim/libcuda`) both use these declarations.
//!
//! Every argument struct is 64 bytes in CUDA 13.0-13.3 (`cuda.h`); the restore arguments carry the
//! device map (`gpuPairs` at offset 0, `gpuPairsCount` at offset 8). CUDA 13.4 (driver r615) adds
//! custom-storage fields to `CUcheckpointRestoreArgs` in its reserved bytes and keeps the first
//! two; a driver newer than this build knows may change more, so [`restore_args_layout`] says
//! whether the map may be passed at all.

use std::ffi::{c_int, c_uint, CStr};

/// `CUresult`: 0 is success.
pub type CuResult = c_int;

/// The `CUresult` values the checkpoint path meets, by name, as nvml-wrapper names NVML's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CudaCode {
    Success,
    InvalidValue,
    OutOfMemory,
    NotInitialized,
    NoDevice,
    InvalidDevice,
    InvalidContext,
    OperatingSystem,
    IllegalState,
    NotFound,
    NotReady,
    NotSupported,
    Unknown,
    /// A value this build does not name.
    Other(CuResult),
}

/// The table behind [`CudaCode`]: value, enum, `cuGetErrorName`, `cuGetErrorString` of driver 580.
const CODES: [(CuResult, CudaCode, &CStr, &CStr); 13] = [
    (0, CudaCode::Success, c"CUDA_SUCCESS", c"no error"),
    (1, CudaCode::InvalidValue, c"CUDA_ERROR_INVALID_VALUE", c"invalid argument"),
    (2, CudaCode::OutOfMemory, c"CUDA_ERROR_OUT_OF_MEMORY", c"out of memory"),
    (3, CudaCode::NotInitialized, c"CUDA_ERROR_NOT_INITIALIZED", c"initialization error"),
    (100, CudaCode::NoDevice, c"CUDA_ERROR_NO_DEVICE", c"no CUDA-capable device is detected"),
    (101, CudaCode::InvalidDevice, c"CUDA_ERROR_INVALID_DEVICE", c"invalid device ordinal"),
    (201, CudaCode::InvalidContext, c"CUDA_ERROR_INVALID_CONTEXT", c"invalid device context"),
    (
        304,
        CudaCode::OperatingSystem,
        c"CUDA_ERROR_OPERATING_SYSTEM",
        c"OS call failed or operation not supported on this OS",
    ),
    (
        401,
        CudaCode::IllegalState,
        c"CUDA_ERROR_ILLEGAL_STATE",
        c"the operation cannot be performed in the present state",
    ),
    (500, CudaCode::NotFound, c"CUDA_ERROR_NOT_FOUND", c"named symbol not found"),
    (600, CudaCode::NotReady, c"CUDA_ERROR_NOT_READY", c"device not ready"),
    (801, CudaCode::NotSupported, c"CUDA_ERROR_NOT_SUPPORTED", c"operation not supported"),
    (999, CudaCode::Unknown, c"CUDA_ERROR_UNKNOWN", c"unknown error"),
];

impl CudaCode {
    pub fn from_raw(v: CuResult) -> CudaCode {
        CODES.iter().find(|c| c.0 == v).map(|c| c.1).unwrap_or(CudaCode::Other(v))
    }
    pub fn raw(self) -> CuResult {
        match self {
            CudaCode::Other(v) => v,
            known => CODES.iter().find(|c| c.1 == known).map(|c| c.0).unwrap_or(999),
        }
    }
    /// The driver's `cuGetErrorName` and `cuGetErrorString` texts (driver 580, NUL-terminated for
    /// the test double's C ABI), when this build names it.
    pub fn texts(self) -> Option<(&'static CStr, &'static CStr)> {
        CODES.iter().find(|c| c.1 == self).map(|c| (c.2, c.3))
    }
}

pub const CUDA_SUCCESS: CuResult = 0;
pub const CUDA_ERROR_INVALID_VALUE: CuResult = 1;
pub const CUDA_ERROR_OUT_OF_MEMORY: CuResult = 2;
pub const CUDA_ERROR_NOT_INITIALIZED: CuResult = 3;
pub const CUDA_ERROR_NO_DEVICE: CuResult = 100;
pub const CUDA_ERROR_INVALID_DEVICE: CuResult = 101;
pub const CUDA_ERROR_INVALID_CONTEXT: CuResult = 201;
pub const CUDA_ERROR_OPERATING_SYSTEM: CuResult = 304;
pub const CUDA_ERROR_ILLEGAL_STATE: CuResult = 401;
pub const CUDA_ERROR_NOT_FOUND: CuResult = 500;
pub const CUDA_ERROR_NOT_READY: CuResult = 600;
pub const CUDA_ERROR_NOT_SUPPORTED: CuResult = 801;
pub const CUDA_ERROR_UNKNOWN: CuResult = 999;

/// `CUprocessState` values.
pub const STATE_RUNNING: c_int = 0;
pub const STATE_LOCKED: c_int = 1;
pub const STATE_CHECKPOINTED: c_int = 2;
pub const STATE_FAILED: c_int = 3;
/// CUDA 13.4 (driver r615): a checkpoint to the caller's custom storage is under way (the target's device memory is
/// mapped into the caller until `cuCheckpointOperationComplete`).
pub const STATE_CHECKPOINTING: c_int = 4;
/// CUDA 13.4: a restore from the caller's custom storage is under way (until `cuCheckpointOperationComplete`).
pub const STATE_RESTORING: c_int = 5;

/// `CUcheckpointLockArgs`: `timeoutMs` at offset 0 (0: no timeout).
#[repr(C)]
#[derive(Default)]
pub struct LockArgs {
    pub timeout_ms: c_uint,
    pub reserved0: c_uint,
    pub reserved1: [u64; 7],
}

/// `CUcheckpointCheckpointArgs` and `CUcheckpointUnlockArgs`: reserved words only.
#[repr(C)]
#[derive(Default)]
pub struct ReservedArgs {
    pub reserved: [u64; 8],
}

/// `CUcheckpointGpuPair`: old and new `CUuuid`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct GpuPair {
    pub old_uuid: [u8; 16],
    pub new_uuid: [u8; 16],
}

/// `CUcheckpointRestoreArgs` (CUDA 13.0-13.3; 13.4 keeps the first two fields and puts its
/// custom-storage fields in what is reserved here, so zeros mean "none").
#[repr(C)]
pub struct RestoreArgs {
    pub gpu_pairs: *const GpuPair,
    pub gpu_pairs_count: c_uint,
    pub reserved: [u8; 44],
    pub reserved1: u64,
}

/// `CUcheckpointOperationHandle` (CUDA 13.4): the driver's opaque handle of a custom-storage operation.
pub type OperationHandle = *mut std::ffi::c_void;

/// `CUcheckpointCustomStoragePerDeviceData` (CUDA 13.4): one GPU's device memory of the target, mapped into the
/// calling process as one contiguous region, and a stream of the caller's primary context on that GPU.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CustomStoragePerDevice {
    pub dev_ptr: u64,
    pub size: usize,
    pub stream: *mut std::ffi::c_void,
}

/// `CUcheckpointCustomStorageInfo` (CUDA 13.4), allocated and filled by the driver.
#[repr(C)]
#[derive(Debug)]
pub struct CustomStorageInfo {
    pub handle: OperationHandle,
    pub per_device: *mut CustomStoragePerDevice,
    pub device_count: c_uint,
}

/// `CUcheckpointCheckpointArgs` of CUDA 13.4: `customStorageInfo_out` (NULL: the device memory goes to the target's
/// host memory, as before) and reserved bytes; zeroed, it is the older [`ReservedArgs`].
#[repr(C)]
pub struct CheckpointArgs134 {
    pub custom_storage_info_out: *mut *mut CustomStorageInfo,
    pub reserved: [u8; 56],
}

/// `CUcheckpointRestoreArgs` of CUDA 13.4: the device map, padding, `customStorageInfo_out`, reserved bytes; with a
/// NULL `customStorageInfo_out` it reads as the 13.0-13.3 [`RestoreArgs`].
#[repr(C)]
pub struct RestoreArgs134 {
    pub gpu_pairs: *const GpuPair,
    pub gpu_pairs_count: c_uint,
    pub padding0: c_uint,
    pub custom_storage_info_out: *mut *mut CustomStorageInfo,
    pub reserved: [u8; 40],
}

/// The first CUDA driver API version with custom storage (`cuCheckpointOperationComplete`): 13.4 (driver r615).
pub const FIRST_CUSTOM_STORAGE_DRIVER_API: i32 = 13040;

const _: () = {
    assert!(std::mem::size_of::<LockArgs>() == 64);
    assert!(std::mem::offset_of!(LockArgs, timeout_ms) == 0);
    assert!(std::mem::size_of::<ReservedArgs>() == 64);
    assert!(std::mem::size_of::<RestoreArgs>() == 64);
    assert!(std::mem::offset_of!(RestoreArgs, gpu_pairs) == 0);
    assert!(std::mem::offset_of!(RestoreArgs, gpu_pairs_count) == 8);
    assert!(std::mem::size_of::<GpuPair>() == 32);
    // CUDA 13.4's layout, as NVIDIA's cuda.h documents it (docs/ARCHITECTURE.md, the driver's custom storage).
    assert!(std::mem::size_of::<CustomStoragePerDevice>() == 24);
    assert!(std::mem::offset_of!(CustomStoragePerDevice, size) == 8);
    assert!(std::mem::offset_of!(CustomStoragePerDevice, stream) == 16);
    assert!(std::mem::size_of::<CustomStorageInfo>() == 24);
    assert!(std::mem::offset_of!(CustomStorageInfo, device_count) == 16);
    assert!(std::mem::size_of::<CheckpointArgs134>() == 64);
    assert!(std::mem::offset_of!(CheckpointArgs134, custom_storage_info_out) == 0);
    assert!(std::mem::size_of::<RestoreArgs134>() == 64);
    assert!(std::mem::offset_of!(RestoreArgs134, gpu_pairs_count) == 8);
    assert!(std::mem::offset_of!(RestoreArgs134, padding0) == 12);
    assert!(std::mem::offset_of!(RestoreArgs134, custom_storage_info_out) == 16);
};

/// The newest CUDA driver API version (`cuDriverGetVersion`) whose restore-argument layout this
/// build knows: 13.4.
pub const NEWEST_KNOWN_DRIVER_API: i32 = 13040;
/// The first CUDA driver API version whose `CUcheckpointRestoreArgs` carry a device map (`gpuPairs`): 13.0 (driver
/// r580). In 12.8 and 12.9 (r570, r575) the struct is reserved words only.
pub const FIRST_DEVICE_MAP_DRIVER_API: i32 = 13000;

/// Whether [`RestoreArgs`] may carry a device map on a driver of this `cuDriverGetVersion`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RestoreArgsLayout {
    /// CUDA 13.0 (the first restore arguments with GPU pairs) through [`NEWEST_KNOWN_DRIVER_API`].
    Known,
    /// CUDA 12.8 or 12.9: the restore arguments are reserved words; a restore onto the same GPUs (no arguments)
    /// works, a device map cannot be given. The text says what to do.
    NoDeviceMap(String),
    /// A newer driver: a restore onto the same GPUs (no arguments) is safe; a map is not passed,
    /// because its struct may have changed. The text says what to do.
    Unknown(String),
}

impl RestoreArgsLayout {
    /// Why no device map may be passed to this driver (`None`: it may).
    pub fn no_map_why(&self) -> Option<&str> {
        match self {
            RestoreArgsLayout::Known => None,
            RestoreArgsLayout::NoDeviceMap(why) | RestoreArgsLayout::Unknown(why) => Some(why),
        }
    }
}

pub fn restore_args_layout(driver_api: i32) -> RestoreArgsLayout {
    let shown = |v: i32| format!("{}.{}", v / 1000, (v % 1000) / 10);
    if driver_api < FIRST_DEVICE_MAP_DRIVER_API {
        return RestoreArgsLayout::NoDeviceMap(format!(
            "the driver's CUDA API {} (driver r570/r575) has no device map in its checkpoint restore arguments \
             (CUcheckpointRestoreArgs gained gpuPairs in CUDA {}, driver r580): restores onto the same GPUs work; \
             to restore onto other GPUs, install driver 580 or later on both nodes",
            shown(driver_api),
            shown(FIRST_DEVICE_MAP_DRIVER_API)
        ));
    }
    if driver_api <= NEWEST_KNOWN_DRIVER_API {
        return RestoreArgsLayout::Known;
    }
    RestoreArgsLayout::Unknown(format!(
        "the driver's CUDA API {} is newer than this build of criu-cuda-migrate knows ({}): its \
         CUcheckpointRestoreArgs may differ, so no device map is passed to it. Restores onto the same GPUs work; \
         for a migration, update criu-cuda-migrate",
        shown(driver_api),
        shown(NEWEST_KNOWN_DRIVER_API)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_unknown_ones_stay_numbers() {
        for (v, code, name, _) in CODES {
            assert_eq!(CudaCode::from_raw(v), code);
            assert_eq!(code.raw(), v);
            assert_eq!(code.texts().unwrap().0, name);
            assert!(code.texts().unwrap().1.to_bytes().len() > 3);
        }
        assert_eq!(CudaCode::from_raw(719), CudaCode::Other(719));
        assert_eq!(CudaCode::Other(719).raw(), 719);
        assert!(CudaCode::Other(719).texts().is_none());
    }

    #[test]
    fn a_newer_driver_gets_no_device_map() {
        assert_eq!(restore_args_layout(13000), RestoreArgsLayout::Known);
        // CUDA 12.8 and 12.9: the restore arguments are reserved words, no map can be given.
        for old in [12080, 12090] {
            let l = restore_args_layout(old);
            assert!(matches!(l, RestoreArgsLayout::NoDeviceMap(_)), "{old}: {l:?}");
            assert!(l.no_map_why().unwrap().contains("install driver 580 or later"), "{l:?}");
        }
        assert_eq!(restore_args_layout(13040), RestoreArgsLayout::Known);
        let RestoreArgsLayout::Unknown(why) = restore_args_layout(14000) else { panic!("14.0 is unknown") };
        assert!(why.contains("14.0") && why.contains("update criu-cuda-migrate"), "{why}");
    }
}
