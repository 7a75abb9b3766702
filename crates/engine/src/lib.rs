//! The engine behind the plugin's hooks.
//!
//! * [`dump::DumpSession`]: PAUSE_DEVICES locks CUDA processes, the first CHECKPOINT_DEVICES
//!   checkpoints every locked process of the tree in parallel and writes identity images, and
//!   `exit(DUMP)` rolls everything back on a failed or leave-running dump.
//! * [`restore::RestoreSession`]: `init(RESTORE)` reads the images and runs the preflight (refusing
//!   a restore this node cannot serve before CRIU touches anything), the first RESUME_DEVICES_LATE
//!   restores every CUDA process of the tree in parallel with the planned device map, rewrites the
//!   stale PCI identity, validates it against NVML, and only then unlocks.
//!
//! Rule for threads: CRIU's own process must have no thread of ours when a hook returns (CRIU
//! then works on namespaces, which one extra thread breaks). Every driver call is made in the
//! driver agent (`ccm_agent`), a helper process; CRIU's main thread is the ptrace tracer, so
//! ptrace runs on the hook's thread; memory work runs on scoped worker threads, one per process,
//! which end before the hook returns.

#![forbid(unsafe_code)]

pub mod batch;
pub mod claims;
pub mod config;
pub mod driver_agent;
pub mod dump;
pub mod error;
pub mod host;
pub mod node;
pub mod pid_wait;
pub mod preflight;
pub mod reconcile;
pub mod restore;
pub mod seam;
pub mod sharing;
pub mod staging;

#[cfg(test)]
mod claims_tests;
#[cfg(test)]
mod dump_tests;
#[cfg(test)]
mod fake;
#[cfg(test)]
mod restore_tests;
#[cfg(test)]
mod seam_tests;

pub use config::{Config, IpcImporters, LeaveRunning, MultiProcess, Staging, Strictness};
pub use error::{EngineError, ProcessFailure};
pub use host::{CriuHost, NoCriu, PLUGIN_NAME};

/// CRIU's own CUDA plugin (`plugins/cuda`, which drives the `cuda-checkpoint` tool). Both
/// plugins would lock and checkpoint the same processes; whichever CRIU asks first wins, so
/// running both is refused.
pub const CRIU_CUDA_PLUGIN_FILE: &str = "/cuda_plugin.so";

/// An error when CRIU's own CUDA plugin is loaded into this CRIU too.
pub fn conflicting_plugin() -> Option<EngineError> {
    conflicting_plugin_in(&seam::RealTargets)
}

/// [`conflicting_plugin`] through `targets`.
pub fn conflicting_plugin_in(targets: &dyn seam::Targets) -> Option<EngineError> {
    match targets.maps_library(std::process::id(), CRIU_CUDA_PLUGIN_FILE) {
        Ok(true) => Some(EngineError::ConflictingPlugin),
        _ => None,
    }
}

/// How a process's mappings name the driver library (`/usr/lib/.../libcuda.so.580.x`,
/// `libcuda.so.1`), and not the CUDA runtime (`libcudart.so`), which alone makes no process a
/// CUDA process in the driver's sense.
pub const LIBCUDA_FILE: &str = "/libcuda.so";

/// Warns when CRIU's process has more than its own thread as a hook returns: CRIU then fails
/// every `setns` into a mount namespace (a container's dump or restore). The plugin calls it
/// after each hook; with the driver agent it never fires.
pub fn check_single_threaded(hook: &str) {
    let n = ccm_process::helper::own_thread_count();
    if n > 1 {
        log::warn!(
            "CRIU has {n} threads after {hook}: CRIU's namespace work (a container's dump or restore) fails with \
             them; this is a bug in {PLUGIN_NAME}, please report it with this log"
        );
    }
}

/// A hook's answer to CRIU.
#[derive(Debug)]
pub enum HookOutcome {
    /// Not a CUDA process (or the plugin is disabled): `-ENOTSUP`, so other plugins may take it.
    NotMine,
    Done,
    Failed(EngineError),
}
