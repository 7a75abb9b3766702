//! A container being restored, as the plugin can see it from CRIU's process: the OCI spec of the
//! runtime that runs this CRIU, and the restored task's `/dev`.
//!
//! runc and crun run `criu swrk` as their own child, in the bundle directory or with
//! `restore --bundle DIR` on their command line; containerd's shim, CRI-O and Podman all call
//! them that way. The spec is read, never written. The restored `/dev` is CRIU's copy of the
//! dumped container's `/dev` (a tmpfs), reached through `/proc/PID/root/dev`; a host `/dev`
//! (devtmpfs, or the same mount namespace as CRIU's) is never edited.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::procfs::{io_error, proc_path};
use crate::ProcessError;

/// Largest spec read (a runtime's config.json is a few KiB).
const MAX_SPEC_BYTES: u64 = 4 << 20;
/// Character-device major of the NVIDIA GPU nodes.
const NVIDIA_MAJOR: u64 = 195;

/// The bundle directory a runtime command line names (`--bundle DIR`, `--bundle=DIR`, `-b DIR`).
pub fn bundle_of_command_line(args: &[OsString]) -> Option<PathBuf> {
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let s = a.to_string_lossy();
        if s == "--bundle" || s == "-b" {
            return it.next().map(PathBuf::from);
        }
        if let Some(v) = s.strip_prefix("--bundle=") {
            return Some(PathBuf::from(v));
        }
    }
    None
}

/// The OCI spec (`config.json`) of the runtime that runs this process (CRIU), with its path:
/// the bundle its command line names, else its working directory. `None` when there is none.
pub fn restoring_runtime_spec() -> Option<(PathBuf, String)> {
    let parent = std::os::unix::process::parent_id();
    let cmdline = std::fs::read(proc_path(parent, "cmdline")).ok()?;
    let args: Vec<OsString> =
        cmdline.split(|b| *b == 0).filter(|a| !a.is_empty()).map(|a| OsString::from_vec(a.to_vec())).collect();
    let cwd = proc_path(parent, "cwd");
    let dir = match bundle_of_command_line(&args) {
        Some(b) if b.is_absolute() => b,
        Some(b) => cwd.join(b),
        None => cwd,
    };
    let path = dir.join("config.json");
    let meta = std::fs::metadata(&path).ok()?;
    if !meta.is_file() || meta.len() > MAX_SPEC_BYTES {
        return None;
    }
    let text = std::fs::read_to_string(&path).ok()?;
    // Name it as the runtime knows it, not through /proc.
    let shown = std::fs::canonicalize(&path).unwrap_or(path);
    Some((shown, text))
}

/// The inode of a process's mount namespace (`/proc/PID/ns/mnt`).
pub fn mount_namespace(pid: u32) -> Result<u64, ProcessError> {
    let p = proc_path(pid, "ns/mnt");
    std::fs::metadata(&p).map(|m| m.ino()).map_err(|e| io_error(pid, "stat", &p, e))
}

/// A restored container's `/dev`, when the plugin may edit it.
#[derive(Debug, Clone)]
pub struct ContainerDev {
    pub pid: u32,
    /// `/proc/PID/root/dev`.
    pub dir: PathBuf,
    /// Minors of the `/dev/nvidiaN` nodes it holds.
    pub gpu_minors: Vec<u32>,
}

/// The `/dev` of `pid` if it is a container's own (another mount namespace than this process's,
/// and a tmpfs); `None` for a process that uses the host's `/dev`.
pub fn container_dev(pid: u32) -> Result<Option<ContainerDev>, ProcessError> {
    if mount_namespace(pid)? == mount_namespace(std::process::id())? {
        return Ok(None);
    }
    let dir = proc_path(pid, "root/dev");
    match nix::sys::statfs::statfs(&dir) {
        Ok(fs) if fs.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC => {}
        Ok(_) => return Ok(None),
        Err(e) => return Err(io_error(pid, "statfs", &dir, std::io::Error::from(e))),
    }
    let mut gpu_minors: Vec<u32> = std::fs::read_dir(&dir)
        .map_err(|e| io_error(pid, "list", &dir, e))?
        .flatten()
        .filter_map(|e| crate::devices::gpu_minor_of_path(&format!("/dev/{}", e.file_name().to_string_lossy())))
        .collect();
    gpu_minors.sort_unstable();
    Ok(Some(ContainerDev { pid, dir, gpu_minors }))
}

fn node_path(dev: &ContainerDev, minor: u32) -> PathBuf {
    dev.dir.join(format!("nvidia{minor}"))
}

/// Creates `/dev/nvidia<minor>` in the container: the host's node's device number, the mode and
/// owner of a GPU node the container already has (else the host node's).
pub fn create_gpu_node(dev: &ContainerDev, minor: u32) -> Result<(), ProcessError> {
    let host = PathBuf::from(format!("/dev/nvidia{minor}"));
    let host_meta = std::fs::metadata(&host).ok().filter(|m| m.file_type().is_char_device());
    let rdev = host_meta.as_ref().map(|m| m.rdev()).unwrap_or(nix::sys::stat::makedev(NVIDIA_MAJOR, minor.into()));
    let like = dev.gpu_minors.first().and_then(|m| std::fs::metadata(node_path(dev, *m)).ok()).or(host_meta);
    let (mode, uid, gid) = like.map(|m| (m.mode() & 0o7777, m.uid(), m.gid())).unwrap_or((0o666, 0, 0));
    let path = node_path(dev, minor);
    let kind = nix::sys::stat::SFlag::S_IFCHR;
    let perm = nix::sys::stat::Mode::from_bits_truncate(mode);
    nix::sys::stat::mknod(&path, kind, perm, rdev)
        .map_err(|e| io_error(dev.pid, "mknod", &path, std::io::Error::from(e)))?;
    // mknod applies the umask; the node must have the container's mode exactly.
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(mode))
        .map_err(|e| io_error(dev.pid, "chmod", &path, e))?;
    std::os::unix::fs::chown(&path, Some(uid), Some(gid)).map_err(|e| io_error(dev.pid, "chown", &path, e))
}

/// Removes `/dev/nvidia<minor>` from the container.
pub fn remove_gpu_node(dev: &ContainerDev, minor: u32) -> Result<(), ProcessError> {
    let path = node_path(dev, minor);
    std::fs::remove_file(&path).map_err(|e| io_error(dev.pid, "unlink", &path, e))
}

/// The path a node has inside the container, for messages.
pub fn shown(minor: u32) -> String {
    Path::new("/dev").join(format!("nvidia{minor}")).display().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn the_bundle_is_read_from_a_runtime_command_line() {
        assert_eq!(
            bundle_of_command_line(&args(&["runc", "--root", "/r", "restore", "--bundle", "/b/c", "id"])),
            Some(PathBuf::from("/b/c"))
        );
        assert_eq!(bundle_of_command_line(&args(&["crun", "restore", "--bundle=/x", "id"])), Some(PathBuf::from("/x")));
        assert_eq!(bundle_of_command_line(&args(&["runc", "restore", "-b", "rel", "id"])), Some(PathBuf::from("rel")));
        assert_eq!(bundle_of_command_line(&args(&["runc", "restore", "id"])), None);
        assert_eq!(bundle_of_command_line(&args(&["runc", "restore", "--bundle"])), None);
    }

    #[test]
    fn this_process_uses_the_host_dev() {
        assert!(container_dev(std::process::id()).unwrap().is_none());
    }
}
