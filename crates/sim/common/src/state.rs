//! The state directory named by `CCM_SIM_STATE_DIR`: the control channel between a controller and
//! a process's restore thread, the simulated device memory and the `/dev/nvidiaN` stand-ins.
//!
//! ```text
//! STATE/faults                        fault knobs, read on every call (see faults.rs)
//! STATE/dev/nvidia<minor>             regular files standing in for the device nodes
//! STATE/gpu-<uuid>/mem-<id>-<handle>  one file per allocation: the "device memory" (<id>: the owner's
//!                                     registration)
//! STATE/reg-<id>/tid                  the restore thread's tid in the process's pid namespace (the
//!                                     process is a CUDA process); key, id-at: see registry.rs
//! STATE/reg-<id>/state                0 RUNNING, 1 LOCKED, 2 CHECKPOINTED
//! STATE/reg-<id>/request              one request for the restore thread (atomic rename)
//! STATE/reg-<id>/response             its answer (atomic rename)
//! STATE/proc-<key> -> reg-<id>        the index by <pid-namespace inode>-<namespace pid> (registry.rs)
//! ```
//!
//! The process under test never keeps a descriptor open to anything here except the device-node
//! stand-ins while RUNNING, so CRIU can dump it once it is checkpointed.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::{SimError, SimUuid};

/// Environment variable naming the state directory.
pub const ENV_STATE_DIR: &str = "CCM_SIM_STATE_DIR";

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateDir {
    root: PathBuf,
}

impl StateDir {
    pub fn new(root: impl Into<PathBuf>) -> StateDir {
        StateDir { root: root.into() }
    }

    /// The directory named by `CCM_SIM_STATE_DIR`.
    pub fn from_env() -> Result<StateDir, SimError> {
        std::env::var_os(ENV_STATE_DIR).map(StateDir::new).ok_or(SimError::NoStateDir)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }
    pub fn faults(&self) -> PathBuf {
        self.root.join("faults")
    }
    pub fn dev_dir(&self) -> PathBuf {
        self.root.join("dev")
    }
    pub fn dev_node(&self, minor: u32) -> PathBuf {
        self.dev_dir().join(format!("nvidia{minor}"))
    }
    pub fn gpu_dir(&self, uuid: &SimUuid) -> PathBuf {
        self.root.join(format!("gpu-{uuid}"))
    }
    /// One allocation of the process registered as `owner` (`Registration::id_text`).
    pub fn allocation(&self, uuid: &SimUuid, owner: &str, handle: u64) -> PathBuf {
        self.gpu_dir(uuid).join(format!("mem-{owner}-{handle}"))
    }

    /// Bytes of simulated device memory in use on a GPU (all processes), for NVML's memory info.
    pub fn used_bytes(&self, uuid: &SimUuid) -> u64 {
        let Ok(entries) = std::fs::read_dir(self.gpu_dir(uuid)) else {
            return 0;
        };
        entries
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().starts_with("mem-"))
            .filter_map(|e| e.metadata().ok())
            .map(|m| m.len())
            .sum()
    }
}

impl StateDir {
    /// Bytes of simulated device memory each owner (`Registration::id_text`) holds on a GPU, for
    /// NVML's list of compute processes.
    pub fn used_bytes_by_owner(&self, uuid: &SimUuid) -> Vec<(String, u64)> {
        let mut out: Vec<(String, u64)> = Vec::new();
        let Ok(entries) = std::fs::read_dir(self.gpu_dir(uuid)) else {
            return out;
        };
        for e in entries.filter_map(Result::ok) {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(owner) = name.strip_prefix("mem-").and_then(|r| r.rsplit_once('-')).map(|(o, _)| o.to_string())
            else {
                continue;
            };
            let len = e.metadata().map(|m| m.len()).unwrap_or(0);
            match out.iter_mut().find(|(o, _)| *o == owner) {
                Some((_, n)) => *n += len,
                None => out.push((owner, len)),
            }
        }
        out
    }
}

/// Writes `bytes` to `path` atomically: a temporary file in the same directory, then rename, so a
/// reader polling for `path` never sees half a message. The descriptor is closed before returning.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), SimError> {
    let io = |what: &str, source| SimError::Io { what: format!("{what} {}", path.display()), source };
    let file_name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    // SAFETY: getpid and gettid have no preconditions.
    let (pid, tid) = unsafe { (libc::getpid(), libc::gettid()) };
    let tmp = path.with_file_name(format!(".{file_name}.{pid}.{tid}.tmp"));
    {
        let mut f = std::fs::File::create(&tmp).map_err(|e| io("create a temporary file for", e))?;
        f.write_all(bytes).map_err(|e| io("write", e))?;
    }
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        io("rename into place", e)
    })
}
