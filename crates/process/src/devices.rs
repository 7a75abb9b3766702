//! Which NVIDIA GPU device nodes a process uses, and which libraries it maps.
//!
//! A CUDA process holds `/dev/nvidiaN` open and mapped for every GPU its libcuda opened (all
//! GPUs it can see, not only the ones it computes on). After a driver checkpoint it holds none
//! (GPU-FACTS), so this is only meaningful on a running or locked process.

use crate::maps::read_maps;
use crate::procfs::{io_error, proc_path};
use crate::tree::threads;
use crate::ProcessError;
use std::collections::BTreeSet;
use std::os::unix::fs::{FileTypeExt, MetadataExt};

/// Character-device major of the NVIDIA GPU nodes (`/dev/nvidiaN`, `nvidiactl`, `nvidia-modeset`).
const NVIDIA_MAJOR: u64 = 195;
/// Minors at and above this are the control nodes: 254 `nvidia-modeset`, 255 `nvidiactl`.
const NVIDIA_FIRST_CONTROL_MINOR: u64 = 254;

/// The minor N of a path naming a GPU node `.../dev/nvidiaN` (see
/// [`ccm_settings::spec::nvidia_minor_of_path`]); a deleted file's ` (deleted)` is ignored.
pub fn gpu_minor_of_path(path: &str) -> Option<u32> {
    ccm_settings::spec::nvidia_minor_of_path(path.strip_suffix(" (deleted)").unwrap_or(path))
}

/// The GPU minor of an open fd `/proc/PID/task/TID/fd/N`: by its link target's name, or by the
/// device it opens (char major 195, minor below 254) when the name does not tell (a node
/// reached through a mount namespace this process cannot name).
fn gpu_minor_of_fd(fd_link: &std::path::Path) -> Option<u32> {
    if let Ok(target) = std::fs::read_link(fd_link) {
        if let Some(minor) = gpu_minor_of_path(&target.to_string_lossy()) {
            return Some(minor);
        }
        // Sockets, pipes and anonymous inodes are not files: skip the stat.
        if !target.to_string_lossy().starts_with('/') {
            return None;
        }
    }
    let meta = std::fs::metadata(fd_link).ok()?;
    if !meta.file_type().is_char_device() {
        return None;
    }
    let rdev = meta.rdev();
    let (major, minor) = (nix::sys::stat::major(rdev), nix::sys::stat::minor(rdev));
    if major == NVIDIA_MAJOR && minor < NVIDIA_FIRST_CONTROL_MINOR {
        u32::try_from(minor).ok()
    } else {
        None
    }
}

/// Minors N of the `/dev/nvidiaN` GPU nodes that `pid` holds open (in any thread's fd table)
/// or mapped.
pub fn nvidia_minors_in_use(pid: u32) -> Result<BTreeSet<u32>, ProcessError> {
    // The maps are shared by all threads (CLONE_THREAD implies CLONE_VM); read them first so a
    // missing or unreadable process fails here with a precise error.
    nvidia_minors_in_use_with(pid, &read_maps(pid)?)
}

/// [`nvidia_minors_in_use`] with the process's mappings already read (`maps`, of `pid`).
pub fn nvidia_minors_in_use_with(pid: u32, maps: &[crate::Mapping]) -> Result<BTreeSet<u32>, ProcessError> {
    let mut minors = BTreeSet::new();
    for m in maps {
        if let Some(minor) = gpu_minor_of_path(&m.path) {
            minors.insert(minor);
        }
    }

    // A thread may have unshared its fd table (CLONE_FILES off), so look at every thread's.
    let mut tids = threads(pid);
    if tids.is_empty() {
        tids.push(pid);
    }
    for tid in tids {
        let dir = proc_path(pid, &format!("task/{tid}/fd"));
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            // The thread exited since it was listed.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) || e.raw_os_error() == Some(libc::ESRCH) => continue,
            Err(e) => return Err(io_error(pid, "listing", &dir, e)),
        };
        for entry in entries.flatten() {
            if let Some(minor) = gpu_minor_of_fd(&entry.path()) {
                minors.insert(minor);
            }
        }
    }
    Ok(minors)
}

/// Whether `pid` maps a file whose path contains `name_fragment` (e.g. `"libcuda.so"`).
pub fn maps_library(pid: u32, name_fragment: &str) -> Result<bool, ProcessError> {
    Ok(read_maps(pid)?.iter().any(|m| m.path.contains(name_fragment)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names themselves are ccm_settings::spec's rules (tested there); this wrapper adds
    /// only the ` (deleted)` of an fd's link target.
    #[test]
    fn gpu_minor_of_a_deleted_node() {
        assert_eq!(gpu_minor_of_path("/dev/nvidia1 (deleted)"), Some(1));
        assert_eq!(gpu_minor_of_path("/tmp/sim state/dev/nvidia3"), Some(3));
        assert_eq!(gpu_minor_of_path("/dev/nvidiactl (deleted)"), None);
    }

    #[test]
    fn own_process_has_no_gpu_and_maps_libc() {
        let pid = std::process::id();
        // The test process itself never opens NVIDIA nodes, unless the harness runs on a GPU host
        // with something odd; only check that the call works and libc shows up.
        assert!(nvidia_minors_in_use(pid).is_ok());
        assert!(maps_library(pid, "libc").unwrap());
        assert!(!maps_library(pid, "libcuda-definitely-not-mapped").unwrap());
    }
}
