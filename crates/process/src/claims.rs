//! The NVIDIA device nodes held by a process that is no CUDA process (a child forked after its
//! parent's `cuInit`), as the dump claims them, and what the restore gives back in their place:
//! descriptors opened anew inside the restored task's root, mappings backed by an inert placeholder
//! (`ccm_identity::claims` says why).
//!
//! The device numbers decide, never a path: a mapping's or descriptor's target is `stat`ed through
//! `/proc/PID/map_files` and `/proc/PID/fd` (the inode itself, whatever mount namespace named it),
//! and a node opened at restore must be the character (or stand-in) device the restoring node's
//! driver registered, checked before and after the open.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use ccm_identity::claims::{ClaimedFd, ClaimedMapping, DevNumber, DevType, HolderCreds, NvidiaDevices, NvidiaNode};
use rustix::fs::{FileType, Mode, OFlags};
pub use rustix::io::Errno;

use crate::maps::Mapping;
use crate::procfs::{io_error, proc_path, read_text, MAX_SMALL_PROC_FILE};
use crate::ProcessError;

/// Where the kernel lists its device majors.
pub const PROC_DEVICES: &str = "/proc/devices";
/// Most read of `/proc/devices` (a few hundred bytes on any machine).
const MAX_PROC_DEVICES: u64 = 64 << 10;
/// Most descriptors looked at in one process (its `RLIMIT_NOFILE` can be a million).
pub const MAX_FDS_LOOKED_AT: usize = 1 << 16;

/// The NVIDIA device numbers of this node, from `/proc/devices`.
pub fn nvidia_devices() -> Result<NvidiaDevices, std::io::Error> {
    use std::io::Read;
    let fd = rustix::fs::open(PROC_DEVICES, OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())?;
    let mut text = String::new();
    std::fs::File::from(fd).take(MAX_PROC_DEVICES).read_to_string(&mut text)?;
    Ok(NvidiaDevices::from_proc_devices(&text))
}

/// The device number of a `stat`.
fn number_of(st: &rustix::fs::Stat) -> Option<DevNumber> {
    let kind = match FileType::from_raw_mode(st.st_mode) {
        FileType::CharacterDevice => DevType::Char,
        FileType::BlockDevice => DevType::Block,
        _ => return None,
    };
    Some(DevNumber { kind, major: rustix::fs::major(st.st_rdev), minor: rustix::fs::minor(st.st_rdev) })
}

/// The device number of an open descriptor, if it is a device.
pub fn device_of_fd(fd: BorrowedFd<'_>) -> Option<DevNumber> {
    number_of(&rustix::fs::fstat(fd).ok()?)
}

/// The open flags of a descriptor (`fcntl(F_GETFL)`), as the raw bits.
pub fn open_flags_of_fd(fd: BorrowedFd<'_>) -> Option<i32> {
    let bits = rustix::fs::fcntl_getfl(fd).ok()?.bits();
    i32::try_from(bits).ok()
}

/// What a process holds of the NVIDIA nodes.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Holdings {
    pub mappings: Vec<ClaimedMapping>,
    pub fds: Vec<ClaimedFd>,
    /// Nodes of the NVIDIA driver the plugin does not claim (`nvidia-caps`, ...): `(what, driver name)`.
    pub unclaimed: Vec<(String, String)>,
    /// What the process opens files with (`/proc/PID/status`), when it could be read.
    pub creds: Option<HolderCreds>,
}

impl Holdings {
    pub fn is_empty(&self) -> bool {
        self.mappings.is_empty() && self.fds.is_empty() && self.unclaimed.is_empty()
    }
}

/// The NVIDIA nodes `pid` maps (its `maps` read already) and holds open.
pub fn holdings(pid: u32, maps: &[Mapping], devices: &NvidiaDevices) -> Result<Holdings, ProcessError> {
    let mut h = Holdings::default();
    // One `stat` per mapped file, not per mapping: a torch process maps each of its ~300 libraries 4-5 times, and the
    // driver's nodes dozens of times (measured: 3.5 ms per DataLoader worker with a `stat` per mapping).
    let mut numbers: std::collections::HashMap<((u32, u32), u64), Option<DevNumber>> = std::collections::HashMap::new();
    for m in maps.iter().filter(|m| m.inode != 0 && m.path.starts_with('/')) {
        let number = *numbers.entry((m.dev, m.inode)).or_insert_with(|| {
            // The mapped inode itself (its link is followed to the file, in whatever namespace it lies).
            let link = proc_path(pid, &format!("map_files/{:x}-{:x}", m.start, m.end));
            rustix::fs::stat(&link).ok().and_then(|st| number_of(&st))
        });
        let Some(number) = number else { continue };
        if let Some(node) = devices.classify(number) {
            h.mappings.push(ClaimedMapping {
                start: m.start,
                end: m.end,
                perms: format!(
                    "{}{}{}{}",
                    if m.readable { 'r' } else { '-' },
                    if m.writable { 'w' } else { '-' },
                    if m.executable { 'x' } else { '-' },
                    if m.shared { 's' } else { 'p' }
                ),
                offset: m.offset,
                node,
            });
        } else if let Some(name) = devices.unclaimed_major(number) {
            h.unclaimed.push((format!("mapping {:#x}-{:#x} of {number}", m.start, m.end), name.to_string()));
        }
    }
    let dir = proc_path(pid, "fd");
    let entries = std::fs::read_dir(&dir).map_err(|e| io_error(pid, "listing", &dir, e))?;
    for entry in entries.flatten().take(MAX_FDS_LOOKED_AT) {
        let Some(fd) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(st) = rustix::fs::stat(entry.path()) else { continue };
        let Some(number) = number_of(&st) else { continue };
        if let Some(node) = devices.classify(number) {
            h.fds.push(ClaimedFd { fd, node });
        } else if let Some(name) = devices.unclaimed_major(number) {
            h.unclaimed.push((format!("descriptor {fd} of {number}"), name.to_string()));
        }
    }
    h.fds.sort_by_key(|f| f.fd);
    h.creds = read_text(pid, "status", MAX_SMALL_PROC_FILE).ok().and_then(|t| creds_of_status(&t));
    Ok(h)
}

/// The file-system uid and gid (the fourth of `Uid:` and `Gid:`) and the supplementary groups of a
/// `/proc/PID/status` text.
pub fn creds_of_status(status: &str) -> Option<HolderCreds> {
    let field = |name: &str| status.lines().find_map(|l| l.strip_prefix(name)).map(str::split_whitespace);
    let uid = field("Uid:")?.nth(3)?.parse().ok()?;
    let gid = field("Gid:")?.nth(3)?.parse().ok()?;
    let groups = field("Groups:")
        .map(|g| g.take(ccm_identity::claims::MAX_GROUPS).filter_map(|x| x.parse().ok()).collect())
        .unwrap_or_default();
    Some(HolderCreds { uid, gid, groups })
}

/// Whether descriptor `fd` of `pid` is the very open file (the same open file description, as `fork`
/// shares it) of some descriptor of `other` among `other_fds`: the kernel's `kcmp(KCMP_FILE)`.
/// `None` when the kernel cannot tell (no permission, a process gone).
pub fn shares_open_file(pid: u32, fd: u32, other: u32, other_fds: &[u32]) -> Option<bool> {
    const KCMP_FILE: libc::c_long = 0;
    let mut answered = false;
    for &ofd in other_fds {
        // SAFETY: kcmp only compares kernel objects of the two processes by their numbers; it reads and
        // writes no memory of ours, and any value of its arguments is valid (bad ones give an error).
        let r = unsafe {
            libc::syscall(
                libc::SYS_kcmp,
                libc::c_long::from(pid),
                libc::c_long::from(other),
                KCMP_FILE,
                libc::c_long::from(fd),
                libc::c_long::from(ofd),
            )
        };
        match r {
            0 => return Some(true),
            r if r > 0 => answered = true,
            _ => {}
        }
    }
    answered.then_some(false)
}

/// The name of `pid` (`/proc/PID/comm`), as the kernel keeps it (at most 15 bytes).
pub fn comm(pid: u32) -> String {
    read_text(pid, "comm", MAX_SMALL_PROC_FILE).map(|s| s.trim_end_matches('\n').to_string()).unwrap_or_default()
}

/// Why a claimed node cannot be opened at restore.
#[derive(Debug, thiserror::Error)]
pub enum ReopenError {
    #[error("the restored task's /dev cannot be opened ({0}); a /dev that is a link is refused")]
    Dev(rustix::io::Errno),
    #[error("/dev/{name} is not in the restored task's /dev ({errno}): the restoring runtime must give the container that device")]
    Missing { name: String, errno: rustix::io::Errno },
    #[error("/dev/{name} in the restored task's root is not {want} (it is {got}); refused")]
    NotTheDevice { name: String, want: DevNumber, got: String },
    #[error("/dev/{name}: {errno}")]
    Open { name: String, errno: rustix::io::Errno },
    #[error(
        "/dev/{name} is not in the restored task's /dev, and the plugin did not add it there: {why}; the restoring \
         runtime must give the container that device"
    )]
    NotAdded {
        name: String,
        #[source]
        why: NotAddedReason,
    },
    #[error(
        "/dev/{name} (mode {mode:o}, owner {owner}:{group}) cannot be opened {access} by the restored task's \
         credentials (uid {uid}, gid {gid}): refused (the task could not have opened it itself)"
    )]
    NotPermitted { name: String, mode: u32, owner: u32, group: u32, access: &'static str, uid: u32, gid: u32 },
}

/// Why the plugin did not add a moved GPU's node to a restored task's `/dev` ([`reopen_moved_gpu_node`]).
#[derive(Debug, thiserror::Error)]
pub enum NotAddedReason {
    /// `/dev` is not the container's own (the host's, a bind mount of it, a link, no mount of its own).
    #[error("{0}")]
    Foreign(crate::container::ForeignDev),
    #[error("the task is in CRIU's mount namespace")]
    HostNamespace,
    #[error(transparent)]
    Unreadable(#[from] ProcessError),
    #[error(transparent)]
    Edit(#[from] crate::container::NodeEditError),
}

/// The calling process's root directory, opened without following a link (a restored task's, from inside it).
fn own_root() -> Result<OwnedFd, ReopenError> {
    let dir = OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    rustix::fs::open("/", dir, Mode::empty()).map_err(ReopenError::Dev)
}

/// Opens `/dev/<node>` of the calling process's root (the restored task's: CRIU calls
/// `RESTORE_EXT_FILE` in the task, inside its mount namespace and root), with `flags`' access mode
/// and status flags. No link is followed (neither `/dev` nor the node), nothing is created, and the
/// node must be `want` both before the open (a FIFO or a file is never opened) and after it.
/// `creds`: the holder's credentials at dump: the node is opened only if they could open it here, for the access
/// `flags` ask (CRIU's restored task is still root when it asks).
pub fn reopen_node(
    node: NvidiaNode,
    want: DevNumber,
    flags: i32,
    creds: Option<&HolderCreds>,
) -> Result<OwnedFd, ReopenError> {
    reopen_node_as(own_root()?.as_fd(), node, want, flags, creds)
}

/// [`reopen_node`] for the node of a GPU the restore moved the descriptor to (`node`, the dump's `held`): when the
/// restored task's `/dev` lacks it, as CRIU's copy of the dumped container's `/dev` does, and that `/dev` is the
/// container's own ([`crate::container::dev_in_root`] against CRIU's mounts `host`), the node is added there first
/// with the number the plugin found on this node and the mode and owner of the dumped node, then opened by the
/// same rules. The plugin adds the moved GPUs' nodes for the driver's restore later (RESUME_DEVICES_LATE); CRIU
/// reopens the descriptors before that. Returns the descriptor and whether the node was added.
pub fn reopen_moved_gpu_node(
    node: NvidiaNode,
    held: NvidiaNode,
    want: DevNumber,
    flags: i32,
    creds: Option<&HolderCreds>,
    host: &[crate::mountinfo::MountEntry],
) -> Result<(OwnedFd, bool), ReopenError> {
    reopen_moved_gpu_node_in(own_root()?.as_fd(), std::process::id(), (node, held), want, flags, creds, host)
}

/// [`reopen_moved_gpu_node`] under the root directory `root` of task `pid` (for messages).
pub fn reopen_moved_gpu_node_in(
    root: BorrowedFd<'_>,
    pid: u32,
    (node, held): (NvidiaNode, NvidiaNode),
    want: DevNumber,
    flags: i32,
    creds: Option<&HolderCreds>,
    host: &[crate::mountinfo::MountEntry],
) -> Result<(OwnedFd, bool), ReopenError> {
    use crate::container::{create_node_like, dev_in_root, DevView, NodeEditError};
    let name = node.dev_name();
    match reopen_node_as(root, node, want, flags, creds) {
        Err(ReopenError::Missing { .. }) if matches!(node, NvidiaNode::Gpu(_)) && !name.contains('/') => {}
        other => return other.map(|fd| (fd, false)),
    }
    let not_added = |why: NotAddedReason| ReopenError::NotAdded { name: name.clone(), why };
    let dev = match dev_in_root(root, pid, host) {
        Ok(DevView::Own(dev)) => dev,
        Ok(DevView::Foreign { why, .. }) => return Err(not_added(NotAddedReason::Foreign(why))),
        Ok(DevView::HostNamespace) => return Err(not_added(NotAddedReason::HostNamespace)),
        Err(e) => return Err(not_added(e.into())),
    };
    let kind = match want.kind {
        DevType::Char => FileType::CharacterDevice,
        DevType::Block => FileType::BlockDevice,
    };
    let rdev = rustix::fs::makedev(want.major, want.minor);
    let added = match create_node_like(&dev, &name, kind, rdev, &held.dev_name()) {
        Ok(()) => true,
        // Another task of the tree added it between the look and the mknod: opened below by the same checks.
        Err(NodeEditError::Exists { .. }) => false,
        Err(e) => return Err(not_added(e.into())),
    };
    reopen_node_as(root, node, want, flags, creds).map(|fd| (fd, added))
}

/// [`reopen_node_in`] with the holder's credentials checked against the node found before it is opened.
pub fn reopen_node_as(
    root: BorrowedFd<'_>,
    node: NvidiaNode,
    want: DevNumber,
    flags: i32,
    creds: Option<&HolderCreds>,
) -> Result<OwnedFd, ReopenError> {
    reopen_node_checked(root, node, want, flags, creds, || {})
}

/// [`reopen_node`] under the root directory `root` (its `dev/`).
///
/// The node is looked at by name before the open and opened by name, so another node can be put at that name in
/// between: the open never blocks on what it finds there (`O_NONBLOCK`, always: a FIFO opened for reading alone
/// would wait for a writer without end), its result must be `want` (`fstat`, the same inode as before), and only
/// then is `O_NONBLOCK` cleared again when `flags` did not ask for it (`fcntl(F_SETFL)`).
///
/// On the NVIDIA driver an `O_NONBLOCK` open of `/dev/nvidiaN` whose GPU is not initialized yet (no other open
/// file, no persistence) is completed on the driver's own thread (`nvidia_open_deferred`) and the first `ioctl`
/// waits for it (what libcuda's own opens do): a failure of that open shows there, not here.
pub fn reopen_node_in(
    root: BorrowedFd<'_>,
    node: NvidiaNode,
    want: DevNumber,
    flags: i32,
) -> Result<OwnedFd, ReopenError> {
    reopen_node_checked(root, node, want, flags, None, || {})
}

#[cfg(test)]
/// [`reopen_node_in`] with `between` run after the node is looked at by name and before it is opened: the tests put
/// another node at the name there.
fn reopen_node_in_with(
    root: BorrowedFd<'_>,
    node: NvidiaNode,
    want: DevNumber,
    flags: i32,
    between: impl FnOnce(),
) -> Result<OwnedFd, ReopenError> {
    reopen_node_checked(root, node, want, flags, None, between)
}

fn reopen_node_checked(
    root: BorrowedFd<'_>,
    node: NvidiaNode,
    want: DevNumber,
    flags: i32,
    creds: Option<&HolderCreds>,
    between: impl FnOnce(),
) -> Result<OwnedFd, ReopenError> {
    let name = node.dev_name();
    let dir = OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let mut parent = rustix::fs::openat(root, "dev", dir, Mode::empty()).map_err(ReopenError::Dev)?;
    // A capability node lies one directory down (`nvidia-caps/`): walked component by component, no link followed.
    let (dirs, leaf) = match name.rsplit_once('/') {
        Some((d, l)) => (d.split('/').collect::<Vec<_>>(), l.to_string()),
        None => (Vec::new(), name.clone()),
    };
    for d in dirs {
        parent = rustix::fs::openat(&parent, d, dir, Mode::empty())
            .map_err(|errno| ReopenError::Missing { name: name.clone(), errno })?;
    }
    let shown = |st: &rustix::fs::Stat| match number_of(st) {
        Some(n) => n.to_string(),
        None => format!("{:?}", FileType::from_raw_mode(st.st_mode)),
    };
    let before = rustix::fs::statat(&parent, leaf.as_str(), rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
        .map_err(|errno| ReopenError::Missing { name: name.clone(), errno })?;
    if number_of(&before) != Some(want) {
        return Err(ReopenError::NotTheDevice { name, want, got: shown(&before) });
    }
    // Only the access mode and the status flags a device keeps; never O_CREAT, O_TRUNC and the like.
    let given = OFlags::from_bits_truncate(u32::try_from(flags).unwrap_or(0));
    if let Some(c) = creds {
        let (read, write) = match given & OFlags::RWMODE {
            m if m == OFlags::WRONLY => (false, true),
            m if m == OFlags::RDWR => (true, true),
            _ => (true, false),
        };
        if !ccm_identity::claims::may_open(before.st_mode, before.st_uid, before.st_gid, c, read, write) {
            return Err(ReopenError::NotPermitted {
                name,
                mode: before.st_mode & 0o7777,
                owner: before.st_uid,
                group: before.st_gid,
                access: match (read, write) {
                    (true, true) => "for reading and writing",
                    (false, true) => "for writing",
                    _ => "for reading",
                },
                uid: c.uid,
                gid: c.gid,
            });
        }
    }
    let keep = OFlags::RWMODE | OFlags::NONBLOCK | OFlags::APPEND | OFlags::SYNC | OFlags::DSYNC;
    let open = (given & keep) | OFlags::NONBLOCK | OFlags::NOFOLLOW | OFlags::NOCTTY | OFlags::CLOEXEC;
    between();
    let fd = rustix::fs::openat(&parent, leaf.as_str(), open, Mode::empty())
        .map_err(|errno| ReopenError::Open { name: name.clone(), errno })?;
    let after = rustix::fs::fstat(&fd).map_err(|errno| ReopenError::Open { name: name.clone(), errno })?;
    if number_of(&after) != Some(want) || after.st_ino != before.st_ino {
        return Err(ReopenError::NotTheDevice { name, want, got: shown(&after) });
    }
    if !given.contains(OFlags::NONBLOCK) {
        let now = rustix::fs::fcntl_getfl(&fd).map_err(|errno| ReopenError::Open { name: name.clone(), errno })?;
        rustix::fs::fcntl_setfl(&fd, now - OFlags::NONBLOCK).map_err(|errno| ReopenError::Open { name, errno })?;
    }
    Ok(fd)
}

/// The inert placeholder behind a claimed mapping at restore: a sealed-size anonymous shared file of
/// `bytes` (zeros), which CRIU maps at the mapping's address with its protection. Close-on-exec: a
/// descriptor CRIU leaves unused (it reuses the first one for consecutive mappings of one file) goes
/// away at the task's next exec.
pub fn placeholder(bytes: u64) -> Result<OwnedFd, rustix::io::Errno> {
    use rustix::fs::{MemfdFlags, SealFlags};
    let fd =
        rustix::fs::memfd_create("criu-cuda-migrate-placeholder", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
    rustix::fs::ftruncate(&fd, bytes)?;
    // Its size stays: a mapping that outgrew it would fault instead of reading zeros.
    rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
    Ok(fd)
}

/// The raw number of an owned descriptor handed to CRIU (which closes it).
pub fn into_raw(fd: OwnedFd) -> i32 {
    use std::os::fd::IntoRawFd;
    fd.into_raw_fd()
}

/// Borrows a descriptor number CRIU passed in for the length of a hook.
///
/// The caller promises `fd` is open for the whole call (CRIU's hook contract).
pub fn with_borrowed<T>(fd: i32, f: impl FnOnce(BorrowedFd<'_>) -> T) -> Option<T> {
    if fd < 0 {
        return None;
    }
    // SAFETY: CRIU passes a descriptor it holds open until the hook returns (HANDLE_DEVICE_VMA's
    // map_files fd, DUMP_EXT_FILE's local copy of the task's fd); the borrow does not outlive `f`,
    // which runs inside the hook, and nothing here closes it.
    let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
    Some(f(borrowed.as_fd()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_placeholder_is_sized_sealed_and_reads_zeros() {
        let fd = placeholder(8192).unwrap();
        assert_eq!(rustix::fs::fstat(&fd).unwrap().st_size, 8192);
        assert!(rustix::fs::ftruncate(&fd, 4096).is_err(), "sealed against shrinking");
        let mut buf = [1u8; 16];
        assert_eq!(rustix::io::pread(&fd, &mut buf, 4000).unwrap(), 16);
        assert_eq!(buf, [0u8; 16]);
    }

    #[test]
    fn a_descriptor_of_a_stand_in_device_is_classified_by_its_number() {
        // /dev/null is char 1:3 on every Linux: a stand-in for nvidiactl here.
        let devices = NvidiaDevices::default().with_stand_ins("char:1:3=nvidiactl").unwrap();
        let f = std::fs::File::open("/dev/null").unwrap();
        let n = device_of_fd(f.as_fd()).unwrap();
        assert_eq!(devices.classify(n), Some(NvidiaNode::Control));
        assert_eq!(open_flags_of_fd(f.as_fd()).map(|f| f & libc::O_ACCMODE), Some(libc::O_RDONLY));
        let me = std::process::id();
        let h = holdings(me, &crate::read_maps(me).unwrap(), &devices).unwrap();
        assert!(h.fds.iter().any(|c| c.node == NvidiaNode::Control), "{h:?}");
        drop(f);
    }

    /// A restored container's `/dev` is its tenant's: every shape of it that is not the planned device is refused
    /// without opening it (a FIFO would block, a link could point anywhere), and nothing is created.
    #[test]
    fn a_hostile_dev_is_refused_and_the_planned_device_opened() {
        let null = DevNumber { kind: DevType::Char, major: 1, minor: 3 };
        let root = tempfile::tempdir().unwrap();
        let open_root = || std::fs::File::open(root.path()).unwrap();
        let reopen = |node| reopen_node_in(open_root().as_fd(), node, null, libc::O_RDWR);
        // No /dev at all, then /dev a link to the host's.
        assert!(matches!(reopen(NvidiaNode::Control), Err(ReopenError::Dev(_))));
        std::os::unix::fs::symlink("/dev", root.path().join("dev")).unwrap();
        assert!(matches!(reopen(NvidiaNode::Control), Err(ReopenError::Dev(_))), "a /dev that is a link");
        std::fs::remove_file(root.path().join("dev")).unwrap();
        let dev = root.path().join("dev");
        std::fs::create_dir(&dev).unwrap();
        // The node missing: refused, not created.
        assert!(matches!(reopen(NvidiaNode::Control), Err(ReopenError::Missing { .. })));
        assert!(!dev.join("nvidiactl").exists());
        // A link to the right device, a FIFO, a regular file: each refused as not the device.
        std::os::unix::fs::symlink("/dev/null", dev.join("nvidiactl")).unwrap();
        let fifo = dev.join("nvidia0");
        rustix::fs::mknodat(rustix::fs::CWD, &fifo, FileType::Fifo, Mode::from_raw_mode(0o600), 0).unwrap();
        std::fs::write(dev.join("nvidia-uvm"), b"not a device").unwrap();
        for node in [NvidiaNode::Control, NvidiaNode::Gpu(0), NvidiaNode::Uvm] {
            match reopen(node) {
                Err(ReopenError::NotTheDevice { .. }) => {}
                other => panic!("{node}: {other:?}"),
            }
        }
        // A capability node's directory that is a link is refused the same way.
        std::os::unix::fs::symlink("/dev", dev.join("nvidia-caps")).unwrap();
        assert!(matches!(reopen(NvidiaNode::Cap(1)), Err(ReopenError::Missing { .. })));
        // As root: the device itself, at a name the plan gives it (here char 1:3, /dev/null's number), opens.
        if rustix::process::geteuid().is_root() {
            let real = dev.join("nvidia-modeset");
            rustix::fs::mknodat(
                rustix::fs::CWD,
                &real,
                FileType::CharacterDevice,
                Mode::from_raw_mode(0o600),
                rustix::fs::makedev(1, 3),
            )
            .unwrap();
            let fd = reopen(NvidiaNode::Modeset).unwrap();
            assert_eq!(device_of_fd(fd.as_fd()), Some(null));
            // The wrong device number at the right name: refused.
            let other = reopen_node_in(open_root().as_fd(), NvidiaNode::Modeset, DevNumber { minor: 5, ..null }, 2);
            assert!(matches!(other, Err(ReopenError::NotTheDevice { .. })));
        }
    }

    /// Runs `reopen` on a thread of its own and gives its answer, or panics when it has not answered within 10 s
    /// (a blocked open), after opening `fifo` for writing, which lets a reader blocked in its open go.
    fn answered_promptly<T: Send + 'static>(fifo: &std::path::Path, reopen: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(reopen());
        });
        match rx.recv_timeout(std::time::Duration::from_secs(10)) {
            Ok(answer) => answer,
            Err(_) => {
                let _ = rustix::fs::open(fifo, OFlags::WRONLY | OFlags::NONBLOCK | OFlags::CLOEXEC, Mode::empty());
                panic!("the reopen blocked on the FIFO at {} for 10 s", fifo.display());
            }
        }
    }

    /// A root standing for a restored task's, with an empty `dev/`.
    fn root_with_dev() -> (tempfile::TempDir, std::path::PathBuf) {
        let root = tempfile::tempdir().unwrap();
        let dev = root.path().join("dev");
        std::fs::create_dir(&dev).unwrap();
        (root, dev)
    }

    /// Guards the open of a restored node against blocking on a FIFO at its name, asked for reading alone (the flags
    /// a forked worker's read-only capability node has): an error, at once. (This passed before the fix too: the
    /// look before the open refuses a FIFO already there; the swap test below is the one that failed.)
    #[test]
    fn a_fifo_at_the_nodes_name_is_refused_promptly() {
        let null = DevNumber { kind: DevType::Char, major: 1, minor: 3 };
        let (root, dev) = root_with_dev();
        let fifo = dev.join("nvidiactl");
        rustix::fs::mknodat(rustix::fs::CWD, &fifo, FileType::Fifo, Mode::from_raw_mode(0o600), 0).unwrap();
        let path = root.path().to_path_buf();
        let answer = answered_promptly(&fifo, move || {
            let root = std::fs::File::open(path).unwrap();
            reopen_node_in(root.as_fd(), NvidiaNode::Control, null, libc::O_RDONLY).map(|_| ())
        });
        assert!(matches!(answer, Err(ReopenError::NotTheDevice { .. })), "{answer:?}");
    }

    /// Guards the window between the look at the node and its open (review finding: a FIFO put at the name there
    /// made the open wait without end, in the restored task, inside CRIU's restore): the device is there when it is
    /// looked at, a FIFO when it is opened. Before the fix the open blocked (this test's 10 s guard fired); now it is
    /// refused at once as not the device. Root only: it makes a character device.
    /// For the tests that make a character device (root only): `/dev/null`'s number, a root directory with its `dev/`,
    /// and the path of `dev/nvidiactl` there (not made yet). `None`, said, when not root.
    fn nvidiactl_stand_in() -> Option<(DevNumber, tempfile::TempDir, std::path::PathBuf)> {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: making a character device needs root");
            return None;
        }
        let (root, dev) = root_with_dev();
        Some((DevNumber { kind: DevType::Char, major: 1, minor: 3 }, root, dev.join("nvidiactl")))
    }

    #[test]
    fn a_fifo_swapped_in_after_the_check_is_refused_without_blocking() {
        let Some((null, root, node)) = nvidiactl_stand_in() else { return };
        let char_dev = |path: &std::path::Path| {
            let mode = Mode::from_raw_mode(0o600);
            rustix::fs::mknodat(rustix::fs::CWD, path, FileType::CharacterDevice, mode, rustix::fs::makedev(1, 3))
        };
        char_dev(&node).unwrap();
        let (path, swapped) = (root.path().to_path_buf(), node.clone());
        let answer = answered_promptly(&node, move || {
            let root = std::fs::File::open(path).unwrap();
            reopen_node_in_with(root.as_fd(), NvidiaNode::Control, null, libc::O_RDONLY, || {
                std::fs::remove_file(&swapped).unwrap();
                let fifo = Mode::from_raw_mode(0o600);
                rustix::fs::mknodat(rustix::fs::CWD, &swapped, FileType::Fifo, fifo, 0).unwrap();
            })
            .map(|_| ())
        });
        assert!(matches!(answer, Err(ReopenError::NotTheDevice { .. })), "{answer:?}");
        // The device back at its name: it opens, without O_NONBLOCK unless the recorded flags had it.
        std::fs::remove_file(&node).unwrap();
        char_dev(&node).unwrap();
        let open_root = || std::fs::File::open(root.path()).unwrap();
        for (flags, nonblocking) in [(libc::O_RDWR, false), (libc::O_RDWR | libc::O_NONBLOCK, true)] {
            let fd = reopen_node_in(open_root().as_fd(), NvidiaNode::Control, null, flags).unwrap();
            let got = rustix::fs::fcntl_getfl(&fd).unwrap();
            assert_eq!(got.contains(OFlags::NONBLOCK), nonblocking, "{flags:#o}: {got:?}");
            assert_eq!(got & OFlags::RWMODE, OFlags::RDWR);
        }
    }

    #[test]
    fn reopening_checks_the_device_number_and_refuses_others() {
        let null = DevNumber { kind: DevType::Char, major: 1, minor: 3 };
        // /dev/nvidiactl is not on this machine (or is not char 1:3): refused, nothing created.
        let e = reopen_node(NvidiaNode::Control, null, libc::O_RDWR, None).unwrap_err();
        assert!(matches!(e, ReopenError::Missing { .. } | ReopenError::NotTheDevice { .. }), "{e}");
        assert!(e.to_string().contains("/dev/nvidiactl"), "{e}");
    }

    /// Low finding of issue 46's review: the holder's credentials at dump decide, not root's: a 0400 root node is
    /// not reopened for a user's task; the same node is for root's; a 0666 node is for anyone.
    #[test]
    fn a_node_the_holder_could_not_open_is_refused() {
        let Some((null, root, node)) = nvidiactl_stand_in() else { return };
        // /dev/null's number under the node's name, with exactly `mode` (the umask aside).
        let make = |mode: u32| {
            let _ = std::fs::remove_file(&node);
            let made = rustix::fs::mknodat(
                rustix::fs::CWD,
                &node,
                FileType::CharacterDevice,
                Mode::from_raw_mode(mode),
                rustix::fs::makedev(1, 3),
            );
            made.and_then(|()| rustix::fs::chmod(&node, Mode::from_raw_mode(mode))).unwrap();
        };
        let user = HolderCreds { uid: 1000, gid: 1000, groups: vec![] };
        let open_root = || std::fs::File::open(root.path()).unwrap();
        make(0o400);
        let e =
            reopen_node_as(open_root().as_fd(), NvidiaNode::Control, null, libc::O_RDONLY, Some(&user)).unwrap_err();
        assert!(matches!(e, ReopenError::NotPermitted { .. }), "{e}");
        assert!(e.to_string().contains("uid 1000"), "{e}");
        let admin = HolderCreds { uid: 0, gid: 0, groups: vec![] };
        reopen_node_as(open_root().as_fd(), NvidiaNode::Control, null, libc::O_RDONLY, Some(&admin)).unwrap();
        make(0o666);
        reopen_node_as(open_root().as_fd(), NvidiaNode::Control, null, libc::O_RDWR, Some(&user)).unwrap();
    }

    #[test]
    fn the_credentials_are_the_file_system_ids_and_groups_of_status() {
        let status = "Name:\tx\nUid:\t1000\t1001\t1002\t1003\nGid:\t20\t21\t22\t23\nGroups:\t44 46 \n";
        assert_eq!(creds_of_status(status), Some(HolderCreds { uid: 1003, gid: 23, groups: vec![44, 46] }));
        assert_eq!(creds_of_status("Name:\tx\n"), None);
    }
}
