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

/// The `CUresult` codes and `CUprocessState` values the doubles use (cuda.h, CUDA 13).
pub mod cuda {
    pub const CUDA_SUCCESS: i32 = 0;
    pub const CUDA_ERROR_INVALID_VALUE: i32 = 1;
    pub const CUDA_ERROR_OUT_OF_MEMORY: i32 = 2;
    pub const CUDA_ERROR_NOT_INITIALIZED: i32 = 3;
    pub const CUDA_ERROR_NO_DEVICE: i32 = 100;
    pub const CUDA_ERROR_INVALID_DEVICE: i32 = 101;
    pub const CUDA_ERROR_INVALID_CONTEXT: i32 = 201;
    pub const CUDA_ERROR_OPERATING_SYSTEM: i32 = 304;
    pub const CUDA_ERROR_ILLEGAL_STATE: i32 = 401;
    pub const CUDA_ERROR_NOT_FOUND: i32 = 500;
    pub const CUDA_ERROR_NOT_READY: i32 = 600;
    pub const CUDA_ERROR_UNKNOWN: i32 = 999;

    pub const STATE_RUNNING: i32 = 0;
    pub const STATE_LOCKED: i32 = 1;
    pub const STATE_CHECKPOINTED: i32 = 2;

    /// `cuGetErrorName` / `cuGetErrorString` texts, NUL-terminated for the C ABI.
    pub fn error_texts(code: i32) -> Option<(&'static str, &'static str)> {
        Some(match code {
            CUDA_SUCCESS => ("CUDA_SUCCESS\0", "no error\0"),
            CUDA_ERROR_INVALID_VALUE => ("CUDA_ERROR_INVALID_VALUE\0", "invalid argument\0"),
            CUDA_ERROR_OUT_OF_MEMORY => ("CUDA_ERROR_OUT_OF_MEMORY\0", "out of memory\0"),
            CUDA_ERROR_NOT_INITIALIZED => ("CUDA_ERROR_NOT_INITIALIZED\0", "initialization error\0"),
            CUDA_ERROR_NO_DEVICE => ("CUDA_ERROR_NO_DEVICE\0", "no CUDA-capable device is detected\0"),
            CUDA_ERROR_INVALID_DEVICE => ("CUDA_ERROR_INVALID_DEVICE\0", "invalid device ordinal\0"),
            CUDA_ERROR_INVALID_CONTEXT => ("CUDA_ERROR_INVALID_CONTEXT\0", "invalid device context\0"),
            CUDA_ERROR_OPERATING_SYSTEM => {
                ("CUDA_ERROR_OPERATING_SYSTEM\0", "OS call failed or operation not supported on this OS\0")
            }
            CUDA_ERROR_ILLEGAL_STATE => {
                ("CUDA_ERROR_ILLEGAL_STATE\0", "the operation cannot be performed in the present state\0")
            }
            CUDA_ERROR_NOT_FOUND => ("CUDA_ERROR_NOT_FOUND\0", "named symbol not found\0"),
            CUDA_ERROR_NOT_READY => ("CUDA_ERROR_NOT_READY\0", "device not ready\0"),
            CUDA_ERROR_UNKNOWN => ("CUDA_ERROR_UNKNOWN\0", "unknown error\0"),
            _ => return None,
        })
    }
}
