//! The unix sockets a process has bound to a path. CRIU binds each one again at restore, at the same path, so a
//! move to another node needs the folders that hold them there (Python multiprocessing binds its workers' listeners
//! in `$TMPDIR/pymp-*/`, which a DataLoader with forked workers uses): `job` names them before anyone dumps.
//!
//! The descriptors decide which sockets are the process's (`/proc/PID/fd` links `socket:[INODE]`); the kernel's list
//! of its network namespace's unix sockets (`/proc/PID/net/unix`) gives each inode's path.

use std::collections::{BTreeMap, BTreeSet};

use rustix::fs::{Mode, OFlags};

use crate::claims::MAX_FDS_LOOKED_AT;
use crate::procfs::{io_error, proc_path, read_text};
use crate::ProcessError;

/// The most read of `/proc/PID/net/unix`: a line of about 60 bytes and the path per unix socket of the namespace, so
/// some 100 000 sockets with long paths; a host's namespace with more is refused, not read whole.
pub const MAX_NET_UNIX_BYTES: u64 = 16 << 20;

/// A `rustix` error on a `/proc` path as the crate's error for it.
fn errno_error<'a>(
    pid: u32,
    action: &'static str,
    path: &'a std::path::Path,
) -> impl FnOnce(rustix::io::Errno) -> ProcessError + 'a {
    move |e| io_error(pid, action, path, e.into())
}

/// The inodes of the sockets `pid` holds open (at most [`MAX_FDS_LOOKED_AT`] descriptors looked at): each link of
/// `/proc/PID/fd` read (never followed) relative to that directory, opened without following a link.
pub fn socket_inodes(pid: u32) -> Result<BTreeSet<u64>, ProcessError> {
    let path = proc_path(pid, "fd");
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = rustix::fs::open(&path, flags, Mode::empty()).map_err(errno_error(pid, "opening", &path))?;
    let dir = rustix::fs::Dir::read_from(&fd).map_err(errno_error(pid, "listing", &path))?;
    let mut inodes = BTreeSet::new();
    for entry in dir.take(MAX_FDS_LOOKED_AT) {
        let Ok(entry) = entry else { break };
        let Ok(target) = rustix::fs::readlinkat(&fd, entry.file_name(), Vec::new()) else { continue };
        if let Some(inode) = socket_inode(&target.to_string_lossy()) {
            inodes.insert(inode);
        }
    }
    Ok(inodes)
}

/// The inode of a descriptor's link text `socket:[INODE]`.
fn socket_inode(link: &str) -> Option<u64> {
    link.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
}

/// The identity of `pid`'s network namespace (`/proc/PID/ns/net`'s link text `net:[INODE]`, read, not followed):
/// processes with the same one see the same `/proc/PID/net/unix`.
pub fn net_namespace(pid: u32) -> Result<u64, ProcessError> {
    let path = proc_path(pid, "ns/net");
    let text = rustix::fs::readlink(&path, Vec::new()).map_err(errno_error(pid, "reading the link", &path))?;
    text.to_string_lossy()
        .strip_prefix("net:[")
        .and_then(|t| t.strip_suffix(']'))
        .and_then(|t| t.parse().ok())
        .ok_or_else(|| {
            io_error(pid, "reading the link", &path, std::io::Error::other(format!("not a namespace link: {text:?}")))
        })
}

/// The unix sockets of `pid`'s network namespace that are bound to a path, by inode.
pub fn bound_unix_sockets(pid: u32) -> Result<BTreeMap<u64, String>, ProcessError> {
    Ok(parse_net_unix(&read_text(pid, "net/unix", MAX_NET_UNIX_BYTES)?))
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
    }

    #[test]
    fn this_process_sees_its_own_bound_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("listener");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let me = std::process::id();
        let inodes = socket_inodes(me).unwrap();
        let bound = bound_unix_sockets(me).unwrap();
        let mine: Vec<&String> = inodes.iter().filter_map(|i| bound.get(i)).collect();
        assert!(mine.iter().any(|p| p.as_str() == path.to_str().unwrap()), "{mine:?}");
        assert!(net_namespace(me).unwrap() > 0);
        drop(listener);
    }
}
