//! The unix sockets a process has bound to a path. CRIU binds each one again at restore, at the same path, so a
//! move to another node needs the folders that hold them there (Python multiprocessing binds its workers' listeners
//! in `$TMPDIR/pymp-*/`, which a DataLoader with forked workers uses): `job` names them before anyone dumps.
//!
//! The descriptors decide which sockets are the process's (`/proc/PID/fd` links `socket:[INODE]`); the kernel's list
//! of its network namespace's unix sockets (`/proc/PID/net/unix`) gives each inode's path.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;

use rustix::fs::{Mode, OFlags};

use crate::claims::MAX_FDS_LOOKED_AT;
use crate::procfs::{io_error, proc_path};
use crate::ProcessError;

/// The most read of `/proc/PID/net/unix`: a line of about 60 bytes and the path per unix socket of the namespace, so
/// some 100 000 sockets with long paths; a host's namespace with more is refused, not read whole.
pub const MAX_NET_UNIX_BYTES: u64 = 16 << 20;

/// The most read of a link's text: the kernel's `socket:[INODE]` and `net:[INODE]` are at most 29 bytes; a longer
/// link (a file's path) is not one of them and is not read whole.
const MAX_LINK_TEXT: usize = 64;

/// One process's `/proc/PID`, opened once without following a link: its descriptors, its network namespace and that
/// namespace's unix sockets are all read relative to this one directory, so the three answers are of one process
/// even if the pid is reused meanwhile (the directory of an exited process reads as gone, never as another's).
pub struct ProcessSockets {
    pid: u32,
    dir: OwnedFd,
}

impl ProcessSockets {
    /// Opens `/proc/PID`.
    pub fn open(pid: u32) -> Result<Self, ProcessError> {
        let path = proc_path(pid, "");
        let dir =
            rustix::fs::open(&path, directory_flags(), Mode::empty()).map_err(errno_error(pid, "opening", path))?;
        Ok(ProcessSockets { pid, dir })
    }

    /// The inodes of the sockets the process holds open (at most [`MAX_FDS_LOOKED_AT`] descriptors looked at): each
    /// link of its `fd` directory read, never followed, relative to that directory.
    pub fn socket_inodes(&self) -> Result<BTreeSet<u64>, ProcessError> {
        let fd = self.subdirectory(&self.dir, "fd")?;
        let dir =
            rustix::fs::Dir::read_from(&fd).map_err(errno_error(self.pid, "listing", proc_path(self.pid, "fd")))?;
        let mut inodes = BTreeSet::new();
        for entry in dir.take(MAX_FDS_LOOKED_AT) {
            let Ok(entry) = entry else { break };
            if let Some(inode) = link_text(&fd, entry.file_name()).as_deref().and_then(socket_inode) {
                inodes.insert(inode);
            }
        }
        Ok(inodes)
    }

    /// The identity of the process's network namespace (`ns/net`'s link text `net:[INODE]`, read, not followed):
    /// processes with the same one see the same `net/unix`.
    pub fn net_namespace(&self) -> Result<u64, ProcessError> {
        let ns = self.subdirectory(&self.dir, "ns")?;
        let text = link_text(&ns, c"net").ok_or_else(|| {
            io_error(self.pid, "reading the link", &proc_path(self.pid, "ns/net"), std::io::ErrorKind::NotFound.into())
        })?;
        net_namespace_inode(&text).ok_or_else(|| ProcessError::Parse {
            pid: self.pid,
            path: proc_path(self.pid, "ns/net"),
            detail: format!("its link reads {text:?}, not `net:[INODE]`"),
        })
    }

    /// The unix sockets of the process's network namespace that are bound to a path, by inode (`net/unix`, at most
    /// [`MAX_NET_UNIX_BYTES`] read).
    pub fn bound_unix_sockets(&self) -> Result<BTreeMap<u64, String>, ProcessError> {
        let path = proc_path(self.pid, "net/unix");
        let net = self.subdirectory(&self.dir, "net")?;
        let file =
            rustix::fs::openat(&net, c"unix", OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())
                .map_err(errno_error(self.pid, "opening", path.clone()))?;
        let mut bytes = Vec::new();
        std::fs::File::from(file)
            .take(MAX_NET_UNIX_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| io_error(self.pid, "reading", &path, e))?;
        if bytes.len() as u64 > MAX_NET_UNIX_BYTES {
            return Err(ProcessError::ProcFileTooLarge { pid: self.pid, path, limit: MAX_NET_UNIX_BYTES });
        }
        Ok(parse_net_unix(&String::from_utf8_lossy(&bytes)))
    }

    /// A directory below `/proc/PID` by one name, opened relative to its parent without following a link.
    fn subdirectory(&self, parent: &impl AsFd, name: &str) -> Result<OwnedFd, ProcessError> {
        rustix::fs::openat(parent, name, directory_flags(), Mode::empty()).map_err(errno_error(
            self.pid,
            "opening",
            proc_path(self.pid, name),
        ))
    }
}

fn directory_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

/// A `rustix` error on a `/proc` path as the crate's error for it.
fn errno_error(pid: u32, action: &'static str, path: PathBuf) -> impl FnOnce(rustix::io::Errno) -> ProcessError {
    move |e| io_error(pid, action, &path, e.into())
}

/// The text of the link `name` in `dir`, read (never followed) into a buffer of [`MAX_LINK_TEXT`] bytes; `None` when
/// it cannot be read or fills the buffer (then it is no link of the kernel's short forms).
fn link_text(dir: &impl AsFd, name: &std::ffi::CStr) -> Option<String> {
    let mut buf = [0u8; MAX_LINK_TEXT];
    let len = rustix::fs::readlinkat_raw(dir, name, &mut buf).ok()?;
    (len < buf.len()).then(|| String::from_utf8_lossy(&buf[..len]).into_owned())
}

/// The inode of a descriptor's link text `socket:[INODE]`.
fn socket_inode(link: &str) -> Option<u64> {
    link.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
}

/// The inode of a namespace's link text `net:[INODE]`.
fn net_namespace_inode(link: &str) -> Option<u64> {
    link.strip_prefix("net:[")?.strip_suffix(']')?.parse().ok()
}

/// The bound paths of `/proc/net/unix` by inode. A line is `Num RefCount Protocol Flags Type St Inode Path`; the path
/// is the rest of the line after the seventh field, absent for an unbound socket and starting with `@` for an
/// abstract one (no file: nothing to carry), both left out.
pub fn parse_net_unix(text: &str) -> BTreeMap<u64, String> {
    let mut out = BTreeMap::new();
    for line in text.lines().skip(1) {
        let mut rest = line;
        let mut fields = Vec::with_capacity(7);
        for _ in 0..7 {
            rest = rest.trim_start_matches(' ');
            let end = rest.find(' ').unwrap_or(rest.len());
            fields.push(&rest[..end]);
            rest = &rest[end..];
        }
        let path = rest.strip_prefix(' ').unwrap_or(rest);
        let Some(inode) = fields.get(6).and_then(|f| f.parse::<u64>().ok()) else { continue };
        if path.starts_with('/') {
            out.insert(inode, path.to_string());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const NET_UNIX: &str = "Num       RefCount Protocol Flags    Type St Inode Path
0000000000000000: 00000002 00000000 00010000 0001 01 8276 /tmp/pymp-x_jh4uwe/listener-ndkxs15z
0000000000000000: 00000003 00000000 00000000 0001 03  9001 /run/dbus/system bus socket
0000000000000000: 00000002 00000000 00010000 0001 01 12345 @/tmp/.X11-unix/X0
0000000000000000: 00000003 00000000 00000000 0001 03 22222
garbage
";

    #[test]
    fn bound_paths_are_read_by_inode_and_abstract_or_unbound_sockets_are_left_out() {
        let m = parse_net_unix(NET_UNIX);
        assert_eq!(m.len(), 2);
        assert_eq!(m[&8276], "/tmp/pymp-x_jh4uwe/listener-ndkxs15z");
        // A padded inode, and a path with spaces (the rest of the line).
        assert_eq!(m[&9001], "/run/dbus/system bus socket");
    }

    #[test]
    fn a_descriptor_link_names_a_socket_only_in_the_kernels_form() {
        assert_eq!(socket_inode("socket:[8276]"), Some(8276));
        assert_eq!(socket_inode("pipe:[8276]"), None);
        assert_eq!(socket_inode("/tmp/socket:[1]"), None);
        assert_eq!(socket_inode("socket:[x]"), None);
        assert_eq!(net_namespace_inode("net:[4026531840]"), Some(4026531840));
        assert_eq!(net_namespace_inode("mnt:[4026531840]"), None);
    }

    #[test]
    fn this_process_sees_its_own_bound_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("listener");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let me = ProcessSockets::open(std::process::id()).unwrap();
        let inodes = me.socket_inodes().unwrap();
        let bound = me.bound_unix_sockets().unwrap();
        let mine: Vec<&String> = inodes.iter().filter_map(|i| bound.get(i)).collect();
        assert!(mine.iter().any(|p| p.as_str() == path.to_str().unwrap()), "{mine:?}");
        assert!(me.net_namespace().unwrap() > 0);
        drop(listener);
    }

    #[test]
    fn a_process_that_is_gone_reads_as_gone() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert!(matches!(ProcessSockets::open(pid), Err(ProcessError::NoSuchProcess { .. })));
    }
}
