//! A container being restored, as the plugin can see it from CRIU's process: the OCI spec of the
//! runtime that runs this CRIU, and the restored task's `/dev`.
//!
//! runc, crun and youki run `criu swrk` as their own child, in the bundle directory or with
//! `restore --bundle DIR` on their command line; containerd's shim, CRI-O and Podman all call
//! them that way. The spec is read, never written, and only from such a runtime.
//!
//! The restored `/dev` is CRIU's copy of the dumped container's `/dev`. The plugin edits it only
//! when it is the container's own: reached from the task's root without following a link, a mount
//! of its own in the task's mount namespace, a tmpfs by `mountinfo`, and a file system that CRIU's
//! own mount namespace does not have mounted anywhere (the host's `/dev` bind-mounted into a
//! container, a privileged pod's hostPath `/dev`, a service with its own mount namespace on the
//! host's `/dev`: each of those reaches the host's nodes, which other tenants use). Every edit goes
//! through that directory's fd (`mknodat`, `fchownat` without following, `unlinkat`), and only a
//! character device of the NVIDIA major is ever removed.

use std::ffi::OsString;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};

use crate::dir::{Dir, FileError};
use crate::mountinfo::{self, MountEntry};
use crate::procfs::{io_error, proc_path};
use crate::ProcessError;

/// Largest spec read (a runtime's config.json is a few KiB; Kubernetes' rarely reach 100 KiB).
pub const MAX_SPEC_BYTES: u64 = 4 << 20;
/// Largest mountinfo read (a node with thousands of mounts stays far below).
const MAX_MOUNTINFO_BYTES: u64 = 16 << 20;
/// Character-device major of the NVIDIA GPU nodes.
pub const NVIDIA_MAJOR: u32 = 195;
/// Minors at and above this are the control nodes (254 `nvidia-modeset`, 255 `nvidiactl`).
const NVIDIA_FIRST_CONTROL_MINOR: u32 = 254;
/// The OCI runtimes that run CRIU for a container restore, by the name of their program.
pub const RESTORING_RUNTIMES: [&str; 3] = ["runc", "crun", "youki"];

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

/// Whether a program name is one of [`RESTORING_RUNTIMES`] (`runc`, or a distribution's
/// `runc.amd64`).
pub fn is_restoring_runtime(program: &str) -> bool {
    RESTORING_RUNTIMES
        .iter()
        .any(|r| program == *r || program.strip_prefix(r).is_some_and(|rest| rest.starts_with('.')))
}

/// The program name of CRIU's parent, from its executable's link (`/proc/PID/exe`) and its `comm`.
/// crun runs from a sealed in-memory copy of itself (its fix for CVE-2019-5736), whose link reads
/// `/` or `/memfd:crun (deleted)`: only then, and only for crun, is the name taken from `comm` or
/// from `argv[0]`, which any process can set, so a program with a real file never passes as a
/// runtime by them.
pub fn runtime_program(exe: Option<&Path>, comm: &str, argv0: &str) -> String {
    let name = exe
        .and_then(|p| p.file_name())
        .map(|n| n.to_string_lossy().trim_end_matches(" (deleted)").to_string())
        .unwrap_or_default();
    let in_memory = exe.is_some_and(|p| p == Path::new("/")) || name.starts_with("memfd:");
    let argv0_name = Path::new(argv0).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    if in_memory && (comm == "crun" || argv0_name == "crun") {
        return "crun".to_string();
    }
    name
}

/// The runtime's OCI spec for a restore: where it is and its text.
#[derive(Debug, Clone)]
pub struct RuntimeSpec {
    pub path: PathBuf,
    pub runtime: String,
    pub text: String,
}

/// The OCI spec (`config.json`) of the runtime that runs this process (CRIU): the bundle its
/// command line names, else its working directory. `Ok(None)` when CRIU's parent is no OCI
/// runtime ([`RESTORING_RUNTIMES`]) or its bundle has no `config.json`; an error when the file is
/// there but is a link, not a regular file, or too large, so that the restore is refused rather
/// than run with a guess.
pub fn restoring_runtime_spec() -> Result<Option<RuntimeSpec>, FileError> {
    let parent = std::os::unix::process::parent_id();
    let exe = std::fs::read_link(proc_path(parent, "exe")).ok();
    let comm = std::fs::read_to_string(proc_path(parent, "comm")).unwrap_or_default();
    let cmdline = Dir::open(&proc_path(parent, ""))?.read_file("cmdline", 1 << 20)?;
    let args: Vec<OsString> =
        cmdline.split(|b| *b == 0).filter(|a| !a.is_empty()).map(|a| OsString::from_vec(a.to_vec())).collect();
    let argv0 = args.first().map(|a| a.to_string_lossy().into_owned()).unwrap_or_default();
    let program = runtime_program(exe.as_deref(), comm.trim_end(), &argv0);
    if !is_restoring_runtime(&program) {
        log::debug!("CRIU's parent (pid {parent}, {program:?}) is no OCI runtime: no bundle to read");
        return Ok(None);
    }
    let cwd = proc_path(parent, "cwd");
    // The runtime's own bundle argument, resolved as the runtime resolves it (links in it are the
    // runtime's choice); config.json in it is reached without following a link.
    let dir = match bundle_of_command_line(&args) {
        Some(b) if b.is_absolute() => b,
        Some(b) => cwd.join(b),
        None => cwd,
    };
    let shown = std::fs::canonicalize(&dir).unwrap_or_else(|_| dir.clone());
    let bundle = match Dir::open(&dir) {
        Ok(d) => d,
        Err(FileError::Missing { .. }) => return Ok(None),
        Err(e) => return Err(e),
    };
    let bundle = bundle.named(shown);
    match bundle.read_file("config.json", MAX_SPEC_BYTES) {
        Ok(bytes) => Ok(Some(RuntimeSpec {
            path: bundle.shown_file("config.json"),
            runtime: program,
            text: String::from_utf8_lossy(&bytes).into_owned(),
        })),
        Err(FileError::Missing { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The inode of a process's mount namespace (`/proc/PID/ns/mnt`).
pub fn mount_namespace(pid: u32) -> Result<u64, ProcessError> {
    use std::os::unix::fs::MetadataExt;
    let p = proc_path(pid, "ns/mnt");
    std::fs::metadata(&p).map(|m| m.ino()).map_err(|e| io_error(pid, "stat", &p, e))
}

/// Why a restored task's `/dev` is not the container's own, so that it is left alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ForeignDev {
    /// `/dev` in the task's root is a symbolic link.
    Symlink {
        target: String,
    },
    NotDirectory,
    /// A directory of the task's root file system, no mount.
    NotAMount,
    /// A mount of another type (`devtmpfs` is the host's own `/dev`).
    NotTmpfs {
        fs_type: String,
    },
    /// CRIU's own mount namespace has the same file system mounted (a bind mount from the host).
    SharedWithHost {
        mount_point: String,
    },
    /// The directory opened is not the mount listed there (it changed while it was read).
    Changed,
}

impl std::fmt::Display for ForeignDev {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ForeignDev::Symlink { target } => write!(
                f,
                "its /dev is a symbolic link (to {}), which the plugin never follows out of the container",
                target.escape_debug()
            ),
            ForeignDev::NotDirectory => write!(f, "its /dev is not a directory"),
            ForeignDev::NotAMount => write!(f, "its /dev is no mount of its own (a directory of its root file system)"),
            ForeignDev::NotTmpfs { fs_type } if fs_type == "devtmpfs" => {
                write!(f, "its /dev is a devtmpfs: the host's own device nodes, which other tenants use")
            }
            ForeignDev::NotTmpfs { fs_type } => {
                write!(f, "its /dev is a {} mount, not a tmpfs of its own", fs_type.escape_debug())
            }
            ForeignDev::SharedWithHost { mount_point } => write!(
                f,
                "its /dev is a file system that the host also has mounted (at {}): a bind mount of host device nodes",
                mount_point.escape_debug()
            ),
            ForeignDev::Changed => write!(f, "its /dev changed while the plugin looked at it"),
        }
    }
}

/// A restored task's `/dev`, as far as the plugin may touch it.
#[derive(Debug)]
pub enum DevView {
    /// The task shares CRIU's mount namespace: the host's `/dev`, which has every GPU's node.
    HostNamespace,
    /// The container's own tmpfs: the plugin may edit it.
    Own(ContainerDev),
    /// Something the plugin must not edit; `gpu_minors` are the GPU nodes it shows, where they
    /// could be listed without following a link.
    Foreign { why: ForeignDev, gpu_minors: Vec<u32> },
}

/// A restored container's own `/dev`, open.
#[derive(Debug)]
pub struct ContainerDev {
    pub pid: u32,
    dev: OwnedFd,
    /// Minors of the `/dev/nvidiaN` character devices (major 195) it holds.
    pub gpu_minors: Vec<u32>,
    /// Entries named `nvidiaN` that are not NVIDIA character devices (left alone).
    pub impostors: Vec<(String, &'static str)>,
}

fn proc_err<'a>(pid: u32, action: &'static str, path: &'a Path) -> impl FnOnce(rustix::io::Errno) -> ProcessError + 'a {
    move |e| io_error(pid, action, path, e.into())
}

/// The GPU nodes of an open `/dev`, never following a link: `(minors of genuine nodes, impostors)`.
fn gpu_nodes(dev: &OwnedFd) -> (Vec<u32>, Vec<(String, &'static str)>) {
    let mut minors = Vec::new();
    let mut impostors = Vec::new();
    let Ok(mut dir) = rustix::fs::Dir::read_from(dev) else { return (minors, impostors) };
    while let Some(Ok(entry)) = dir.read() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(minor) = ccm_settings::spec::nvidia_minor_of_path(&format!("/dev/{name}")) else { continue };
        match node_minor(dev, &name) {
            Ok(m) if m == minor => minors.push(m),
            Ok(_) => impostors.push((name, "an NVIDIA node of another GPU")),
            Err(kind) => impostors.push((name, kind)),
        }
    }
    minors.sort_unstable();
    (minors, impostors)
}

/// The minor of `name` in `dir` when it is a GPU character device (major 195, below the control
/// minors), else what it is instead. Never follows a link.
fn node_minor(dir: impl AsFd, name: &str) -> Result<u32, &'static str> {
    let st = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW).map_err(|_| "gone")?;
    match FileType::from_raw_mode(st.st_mode) {
        FileType::CharacterDevice => {
            let (major, minor) = (rustix::fs::major(st.st_rdev), rustix::fs::minor(st.st_rdev));
            if major == NVIDIA_MAJOR && minor < NVIDIA_FIRST_CONTROL_MINOR {
                Ok(minor)
            } else {
                Err("a character device of another driver")
            }
        }
        t => Err(crate::dir::kind_name(t)),
    }
}

/// Where `pid`'s `/dev` stands (see the module's rules).
pub fn container_dev(pid: u32) -> Result<DevView, ProcessError> {
    if mount_namespace(pid)? == mount_namespace(std::process::id())? {
        return Ok(DevView::HostNamespace);
    }
    let root_path = proc_path(pid, "root");
    // The magic link /proc/PID/root is the task's root: following it is the point.
    let root = rustix::fs::open(&root_path, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
        .map_err(proc_err(pid, "open", &root_path))?;
    let dev = match rustix::fs::openat(
        &root,
        "dev",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::LOOP) | Err(rustix::io::Errno::NOTDIR) => {
            let why = match rustix::fs::readlinkat(&root, "dev", Vec::new()) {
                Ok(t) => ForeignDev::Symlink { target: t.to_string_lossy().into_owned() },
                Err(_) => ForeignDev::NotDirectory,
            };
            return Ok(DevView::Foreign { why, gpu_minors: Vec::new() });
        }
        Err(e) => return Err(proc_err(pid, "open", &root_path.join("dev"))(e)),
    };
    let (gpu_minors, impostors) = gpu_nodes(&dev);
    let foreign = |why| Ok(DevView::Foreign { why, gpu_minors: gpu_minors.clone() });
    let theirs = read_mountinfo(pid)?;
    let Some(mount) = mountinfo::top_mount_at(&theirs, "/dev") else { return foreign(ForeignDev::NotAMount) };
    let st = rustix::fs::fstat(&dev).map_err(proc_err(pid, "stat", &root_path.join("dev")))?;
    let on = (rustix::fs::major(st.st_dev), rustix::fs::minor(st.st_dev));
    if on != (mount.major, mount.minor) {
        // The directory is on another file system than the mount listed at /dev: no mount of its own.
        return foreign(if theirs.iter().any(|m| (m.major, m.minor) == on && m.mount_point == "/") {
            ForeignDev::NotAMount
        } else {
            ForeignDev::Changed
        });
    }
    if let Ok(x) = rustix::fs::statx(&dev, "", AtFlags::EMPTY_PATH, rustix::fs::StatxFlags::MNT_ID) {
        if x.stx_mask & rustix::fs::StatxFlags::MNT_ID.bits() != 0 && x.stx_mnt_id != mount.mount_id {
            return foreign(ForeignDev::Changed);
        }
    }
    if mount.fs_type != "tmpfs" {
        return foreign(ForeignDev::NotTmpfs { fs_type: mount.fs_type.clone() });
    }
    if let Some(host) = shared_with_host(mount)? {
        return foreign(ForeignDev::SharedWithHost { mount_point: host.mount_point.clone() });
    }
    Ok(DevView::Own(ContainerDev { pid, dev, gpu_minors, impostors }))
}

/// CRIU's own mounts (the mountinfo of its mount namespace), read in CRIU's process before any task is restored:
/// the file systems a restored task's `/dev` must not be ([`dev_in_root`]).
pub fn own_mounts() -> Result<Vec<MountEntry>, ProcessError> {
    read_mountinfo(std::process::id())
}

/// tmpfs's `statfs` magic (`TMPFS_MAGIC`; the host's devtmpfs reports it too, and is caught as one of CRIU's mounts).
const TMPFS_MAGIC: i64 = 0x0102_1994;

/// The `/dev` under the root directory `root`, as [`container_dev`] judges a task's `/dev`, for a caller inside the
/// task: CRIU calls RESTORE_EXT_FILE in the restored task, in its mount namespace and root, where `/proc` is not yet
/// the one that names it. The same rules, read from the file systems themselves instead of mountinfo: `dev` reached
/// without a link, a mount of its own (a file system other than the root's), a tmpfs (`statfs`), and none of the
/// file systems that CRIU's own mount namespace has mounted (`host`, from [`own_mounts`] in CRIU's process: the
/// host's `/dev` and any bind mount of it share their device number with one of those).
pub fn dev_in_root(root: BorrowedFd<'_>, pid: u32, host: &[MountEntry]) -> Result<DevView, ProcessError> {
    let shown = Path::new("/dev");
    let dev = match rustix::fs::openat(
        root,
        "dev",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::LOOP) | Err(rustix::io::Errno::NOTDIR) => {
            let why = match rustix::fs::readlinkat(root, "dev", Vec::new()) {
                Ok(t) => ForeignDev::Symlink { target: t.to_string_lossy().into_owned() },
                Err(_) => ForeignDev::NotDirectory,
            };
            return Ok(DevView::Foreign { why, gpu_minors: Vec::new() });
        }
        Err(e) => return Err(proc_err(pid, "open", shown)(e)),
    };
    let (gpu_minors, impostors) = gpu_nodes(&dev);
    let foreign = |why| Ok(DevView::Foreign { why, gpu_minors: gpu_minors.clone() });
    let st = rustix::fs::fstat(&dev).map_err(proc_err(pid, "stat", shown))?;
    let top = rustix::fs::fstat(root).map_err(proc_err(pid, "stat", Path::new("/")))?;
    if st.st_dev == top.st_dev {
        return foreign(ForeignDev::NotAMount);
    }
    let fs = rustix::fs::fstatfs(&dev).map_err(proc_err(pid, "statfs", shown))?;
    #[allow(clippy::useless_conversion)] // f_type's width differs between targets
    if i64::from(fs.f_type) != TMPFS_MAGIC {
        return foreign(ForeignDev::NotTmpfs { fs_type: format!("file system of type {:#x}", fs.f_type) });
    }
    let on = (rustix::fs::major(st.st_dev), rustix::fs::minor(st.st_dev));
    if let Some(m) = host.iter().find(|m| (m.major, m.minor) == on) {
        return foreign(ForeignDev::SharedWithHost { mount_point: m.mount_point.clone() });
    }
    Ok(DevView::Own(ContainerDev { pid, dev, gpu_minors, impostors }))
}

fn read_mountinfo(pid: u32) -> Result<Vec<MountEntry>, ProcessError> {
    let path = proc_path(pid, "mountinfo");
    let bytes =
        Dir::open(&proc_path(pid, "")).and_then(|d| d.read_file("mountinfo", MAX_MOUNTINFO_BYTES)).map_err(|e| {
            ProcessError::Io { pid, action: "read", path: path.clone(), source: std::io::Error::other(e.to_string()) }
        })?;
    Ok(mountinfo::parse(&String::from_utf8_lossy(&bytes)))
}

/// A mount of CRIU's own namespace on the same file system as `mount`, if any.
fn shared_with_host(mount: &MountEntry) -> Result<Option<MountEntry>, ProcessError> {
    let ours = read_mountinfo(std::process::id())?;
    Ok(ours.into_iter().find(|m| (m.major, m.minor) == (mount.major, mount.minor)))
}

fn node_name(minor: u32) -> String {
    format!("nvidia{minor}")
}

/// What went wrong with one `/dev` edit.
#[derive(Debug, thiserror::Error)]
pub enum NodeEditError {
    #[error("/dev/{name} in the container is {kind}, not the NVIDIA GPU node it is named after: left alone")]
    NotAGpuNode { name: String, kind: &'static str },
    #[error("/dev/{name} is already there as {kind}: left alone")]
    Exists { name: String, kind: &'static str },
    #[error("{action} /dev/{name} in the container of pid {pid} failed: {source}")]
    Io {
        pid: u32,
        action: &'static str,
        name: String,
        #[source]
        source: std::io::Error,
    },
}

/// Creates `/dev/nvidia<minor>` in the container: the host's node's device number (else
/// 195:minor), the mode and owner of a GPU node the container already has (else the host node's,
/// else 0666 root), all read without following a link.
pub fn create_gpu_node(dev: &ContainerDev, minor: u32) -> Result<(), NodeEditError> {
    let name = node_name(minor);
    if let Ok(st) = rustix::fs::statat(&dev.dev, name.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
        return Err(NodeEditError::Exists { name, kind: crate::dir::kind_name(FileType::from_raw_mode(st.st_mode)) });
    }
    let host_dev = rustix::fs::open("/dev", OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty()).ok();
    let host_node = host_dev.as_ref().and_then(|d| {
        node_minor(d, &name).ok().filter(|m| *m == minor)?;
        rustix::fs::statat(d, name.as_str(), AtFlags::SYMLINK_NOFOLLOW).ok()
    });
    let rdev = host_node.as_ref().map(|s| s.st_rdev).unwrap_or_else(|| rustix::fs::makedev(NVIDIA_MAJOR, minor));
    let like = dev
        .gpu_minors
        .iter()
        .find_map(|m| {
            node_minor(&dev.dev, &node_name(*m)).ok()?;
            rustix::fs::statat(&dev.dev, node_name(*m).as_str(), AtFlags::SYMLINK_NOFOLLOW).ok()
        })
        .or(host_node);
    let (mode, uid, gid) = like.map(|s| (s.st_mode & 0o7777, s.st_uid, s.st_gid)).unwrap_or((0o666, 0, 0));
    make_node(dev, &name, FileType::CharacterDevice, rdev, (mode, uid, gid))?;
    match node_minor(&dev.dev, &name) {
        Ok(m) if m == minor => Ok(()),
        Ok(_) => Err(NodeEditError::NotAGpuNode { name, kind: "an NVIDIA node of another GPU" }),
        Err(kind) => Err(NodeEditError::NotAGpuNode { name, kind }),
    }
}

/// Creates `/dev/<name>` in the container as the device `kind` `rdev` (the node of a moved GPU that a restored
/// task's descriptor opens, its number the host's), with the mode and owner of the container's `/dev/<like>` where
/// that is a device node (the node the task held at dump), else 0666 root (the driver's own nodes'). Never follows
/// a link; `Exists` when anything is at the name already (another task of the tree may have made it first).
pub fn create_node_like(
    dev: &ContainerDev,
    name: &str,
    kind: FileType,
    rdev: rustix::fs::Dev,
    like: &str,
) -> Result<(), NodeEditError> {
    if let Ok(st) = rustix::fs::statat(&dev.dev, name, AtFlags::SYMLINK_NOFOLLOW) {
        let kind = crate::dir::kind_name(FileType::from_raw_mode(st.st_mode));
        return Err(NodeEditError::Exists { name: name.to_string(), kind });
    }
    let like = rustix::fs::statat(&dev.dev, like, AtFlags::SYMLINK_NOFOLLOW)
        .ok()
        .filter(|st| matches!(FileType::from_raw_mode(st.st_mode), FileType::CharacterDevice | FileType::BlockDevice));
    let (mode, uid, gid) = like.map(|s| (s.st_mode & 0o7777, s.st_uid, s.st_gid)).unwrap_or((0o666, 0, 0));
    make_node(dev, name, kind, rdev, (mode, uid, gid))?;
    match rustix::fs::statat(&dev.dev, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) if FileType::from_raw_mode(st.st_mode) == kind && st.st_rdev == rdev => Ok(()),
        Ok(st) => Err(NodeEditError::NotAGpuNode {
            name: name.to_string(),
            kind: crate::dir::kind_name(FileType::from_raw_mode(st.st_mode)),
        }),
        Err(_) => Err(NodeEditError::NotAGpuNode { name: name.to_string(), kind: "gone" }),
    }
}

/// `mknodat` and `fchownat` of `name` in `dev`, the mode exactly `mode` and the owner `uid:gid`.
fn make_node(
    dev: &ContainerDev,
    name: &str,
    kind: FileType,
    rdev: rustix::fs::Dev,
    (mode, uid, gid): (u32, u32, u32),
) -> Result<(), NodeEditError> {
    let io = |action: &'static str| {
        move |e: rustix::io::Errno| NodeEditError::Io { pid: dev.pid, action, name: name.to_string(), source: e.into() }
    };
    // mknod applies the umask; the node must have the mode exactly. The calling process is single-threaded here
    // (CRIU's hook thread before any worker starts, or a restored task before CRIU's restorer makes its threads),
    // so the umask change is seen by no one else.
    let old = rustix::process::umask(Mode::empty());
    let made = rustix::fs::mknodat(&dev.dev, name, kind, Mode::from_raw_mode(mode), rdev);
    rustix::process::umask(old);
    made.map_err(io("mknod"))?;
    rustix::fs::chownat(
        &dev.dev,
        name,
        Some(rustix::fs::Uid::from_raw(uid)),
        Some(rustix::fs::Gid::from_raw(gid)),
        AtFlags::SYMLINK_NOFOLLOW,
    )
    .map_err(io("chown"))
}

/// Removes `/dev/nvidia<minor>` from the container, only when it is that GPU's character device.
pub fn remove_gpu_node(dev: &ContainerDev, minor: u32) -> Result<(), NodeEditError> {
    let name = node_name(minor);
    match node_minor(&dev.dev, &name) {
        Ok(m) if m == minor => {}
        Ok(_) => return Err(NodeEditError::NotAGpuNode { name, kind: "an NVIDIA node of another GPU" }),
        Err(kind) => return Err(NodeEditError::NotAGpuNode { name, kind }),
    }
    rustix::fs::unlinkat(&dev.dev, name.as_str(), AtFlags::empty()).map_err(|e| NodeEditError::Io {
        pid: dev.pid,
        action: "unlink",
        name,
        source: e.into(),
    })
}

/// The path a node has inside the container, for messages.
pub fn shown(minor: u32) -> String {
    format!("/dev/{}", node_name(minor))
}

#[cfg(test)]
mod tests {
    #[test]
    fn crun_is_known_by_comm_only_when_it_runs_from_memory() {
        use super::runtime_program;
        use std::path::Path;
        assert_eq!(runtime_program(Some(Path::new("/usr/bin/runc")), "runc", "runc"), "runc");
        assert_eq!(runtime_program(Some(Path::new("/usr/sbin/runc (deleted)")), "runc", "runc"), "runc");
        assert_eq!(runtime_program(Some(Path::new("/")), "crun", "crun"), "crun");
        assert_eq!(runtime_program(Some(Path::new("/memfd:crun (deleted)")), "3", "/usr/bin/crun"), "crun");
        // A program with a file of its own is what its file says, whatever it calls itself.
        assert_eq!(runtime_program(Some(Path::new("/usr/bin/bash")), "crun", "crun"), "bash");
        assert_eq!(runtime_program(Some(Path::new("/")), "bash", "bash"), "");
        assert_eq!(runtime_program(None, "crun", "crun"), "");
    }

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
    fn only_oci_runtimes_give_a_bundle() {
        for p in ["runc", "crun", "youki", "runc.amd64"] {
            assert!(is_restoring_runtime(p), "{p}");
        }
        for p in ["bash", "criu", "runcx", "podman", "containerd-shim-runc-v2", "", "sh"] {
            assert!(!is_restoring_runtime(p), "{p}");
        }
    }

    #[test]
    fn this_process_uses_the_host_dev() {
        assert!(matches!(container_dev(std::process::id()).unwrap(), DevView::HostNamespace));
    }
}
