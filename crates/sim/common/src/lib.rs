//! **TEST DOUBLE support, for CI machines without GPUs. Never packaged, never installed.**
//!
//! Shared by the test doubles of `libcuda.so.1` (`cuda-test-double`) and `libnvidia-ml.so.1`
//! (`nvml-test-double`), and by the test tools `ccm-sim-ctl` (a checkpoint controller) and
//! `ccm-sim-target` (a small CUDA process). See `docs/TEST-DOUBLES.md`.
//!
//! - [`config`]: the simulated GPU set (`CCM_SIM_CONFIG`), the container view (`CCM_SIM_VISIBLE`)
//!   and the `CUDA_VISIBLE_DEVICES` rules.
//! - [`state`]: the state directory (`CCM_SIM_STATE_DIR`) shared by every process of a test.
//! - [`faults`]: fault knobs.
//! - [`protocol`]: the file channel between a controller and a process's restore thread.
//! - [`registry`], [`pidns`]: which processes are CUDA processes, found from a pid in any pid namespace.

pub mod config;
pub mod dl;
pub mod faults;
pub mod pidns;
pub mod protocol;
pub mod registry;
pub mod state;

pub use config::{
    container_view, cuda_ordinals, dev_gpu_minors, process_view, SimConfig, SimGpu, SimPci, SimUuid, ENV_CONFIG,
    ENV_VISIBLE,
};
pub use faults::{Faults, ENV_FAULTS};
pub use state::{write_atomic, StateDir, ENV_STATE_DIR};

/// Errors of the simulation's own setup (never a simulated driver error: those are codes).
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("CCM_SIM_CONFIG is not set: point it at a JSON GPU set file (see docs/TEST-DOUBLES.md)")]
    NoConfig,
    #[error(
        "CCM_SIM_STATE_DIR is not set: point it at a directory shared by the process under test and its controller"
    )]
    NoStateDir,
    #[error("bad GPU set: {what}")]
    BadConfig { what: String },
    #[error("`{0}` is not a GPU UUID; expected GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx")]
    BadUuid(String),
    #[error("cannot {what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("malformed control message: {0}")]
    BadMessage(String),
}

/// The CUDA ABI the double serves: declared once, in `ccm_driver::abi`, for the driver wrapper and
/// the double alike.
pub mod cuda {
    pub use ccm_driver::abi::{CheckpointArgs134, CustomStorageInfo, CustomStoragePerDevice, RestoreArgs134};
    pub use ccm_driver::abi::{
        CudaCode, GpuPair, LockArgs, RestoreArgs, CUDA_ERROR_ILLEGAL_STATE, CUDA_ERROR_INVALID_CONTEXT,
        CUDA_ERROR_INVALID_DEVICE, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_FOUND, CUDA_ERROR_NOT_INITIALIZED,
        CUDA_ERROR_NOT_READY, CUDA_ERROR_NO_DEVICE, CUDA_ERROR_OPERATING_SYSTEM, CUDA_ERROR_OUT_OF_MEMORY,
        CUDA_ERROR_UNKNOWN, CUDA_SUCCESS, STATE_CHECKPOINTED, STATE_CHECKPOINTING, STATE_LOCKED, STATE_RESTORING,
        STATE_RUNNING,
    };

    /// `cuGetErrorName` / `cuGetErrorString` texts, NUL-terminated for the C ABI.
    pub fn error_texts(code: i32) -> Option<(&'static std::ffi::CStr, &'static std::ffi::CStr)> {
        CudaCode::from_raw(code).texts()
    }
}
