//! Errors of the benchmark controller. Each names what went wrong and what to do about it.

use ccm_driver::cuda::LoadError;
use ccm_driver::CudaError;

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("the kernel driver's resource manager: {0}")]
    Rm(String),

    #[error("{0}; pass the pid of a live process (a DataLoader worker: `pgrep -f pt_data_worker`)")]
    Process(#[from] ccm_process::ProcessError),

    #[error("{0}")]
    Load(#[from] LoadError),

    #[error("cuInit failed in the benchmark controller: {0}; check the driver with nvidia-smi (the controller needs libcuda and a GPU)")]
    Init(#[source] CudaError),

    #[error("pid {pid} is not a CUDA process the driver can checkpoint ({source}); start the workload first and pass its pid")]
    NotCuda {
        pid: i32,
        #[source]
        source: CudaError,
    },

    #[error("pid {pid} is {state}, not RUNNING; the benchmark starts from a running process: restart the workload (or run `criu-cuda-migrate recover --pid {pid}`)")]
    NotRunning { pid: i32, state: String },

    #[error("pid {pid}: {source}{left}")]
    Step {
        pid: i32,
        #[source]
        source: CudaError,
        /// What the failure left behind and how to clean it up (empty when rolled back).
        left: String,
    },

    #[error("the {what} thread for pid {pid} panicked; the process may be left LOCKED or CHECKPOINTED: run `criu-cuda-migrate recover --pid {pid}`")]
    ThreadPanicked { what: &'static str, pid: i32 },

    #[error("cannot find this program's own path to start per-action children: {0}")]
    SelfPath(#[source] std::io::Error),

    #[error("cannot start `{command}`: {source}")]
    Spawn {
        command: String,
        #[source]
        source: std::io::Error,
    },

    #[error("`{command}` failed ({status}): {stderr}")]
    Child { command: String, status: String, stderr: String },

    #[error("`{command}` printed no valid result ({source}); its output was: {stdout}")]
    ChildOutput {
        command: String,
        stdout: String,
        #[source]
        source: serde_json::Error,
    },

    #[error("{cause}; rolling back failed too: {left}")]
    LeftBehind { cause: Box<BenchError>, left: String },

    #[error("cannot write the result: {0}")]
    Output(#[from] serde_json::Error),
}
