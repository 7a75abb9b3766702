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
        let net = self.subdirectory(&self.dir, "net")?;
        Ok(parse_net_unix(&self.read_net_table(&net, "unix")?.unwrap_or_default()))
    }

    /// The table `net/NAME` of the process's network namespace, at most [`MAX_NET_UNIX_BYTES`] read, never through a
    /// link; `None` when the kernel has no such table.
    fn read_net_table(&self, net: &OwnedFd, name: &str) -> Result<Option<Vec<u8>>, ProcessError> {
        let path = proc_path(self.pid, &format!("net/{name}"));
        let file =
            match rustix::fs::openat(net, name, OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty()) {
                Ok(f) => f,
                Err(rustix::io::Errno::NOENT) => return Ok(None),
                Err(e) => return Err(errno_error(self.pid, "opening", path)(e)),
            };
        let mut bytes = Vec::new();
        std::fs::File::from(file)
            .take(MAX_NET_UNIX_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| io_error(self.pid, "reading", &path, e))?;
        if bytes.len() as u64 > MAX_NET_UNIX_BYTES {
            return Err(ProcessError::ProcFileTooLarge { pid: self.pid, path, limit: MAX_NET_UNIX_BYTES });
        }
        Ok(Some(bytes))
    }

    /// The inodes of the inet sockets (TCP, UDP, raw; IPv4 and IPv6) of the process's network namespace (`net/tcp`,
    /// `tcp6`, `udp`, `udp6`, `raw`, `raw6`, each at most [`MAX_NET_UNIX_BYTES`] read; a missing table is empty).
    pub fn inet_socket_inodes(&self) -> Result<BTreeSet<u64>, ProcessError> {
        let net = self.subdirectory(&self.dir, "net")?;
        let mut out = BTreeSet::new();
        for name in ["tcp", "tcp6", "udp", "udp6", "raw", "raw6"] {
            if let Some(bytes) = self.read_net_table(&net, name)? {
                out.extend(parse_net_inet(&bytes));
            }
        }
        Ok(out)
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

/// The bound paths of `/proc/net/unix` by inode; pure (no I/O), bounded by its input (one pass, the output no larger
/// than it) and never panicking, whatever the bytes (`fuzz/fuzz_targets/net_unix_parse.rs`).
///
/// A record is `Num: RefCount Protocol Flags Type St Inode[ Path]` and a line break, the path absent for an unbound
/// socket and starting with `@` for an abstract one (no file: nothing to carry), both left out. The kernel writes a
/// path's bytes as they are, line breaks included, so the text is not cut into records at every line break:
///
/// - a line that is no record header (see [`record_header`]) continues the path of the record before it (joined
///   with `\n`); text before the first record (the column titles) is no record's;
/// - a path can still hold a line that reads as a whole record (`/a\n0000000000000000: 00000002 00000000 00010000
///   0001 01 12345 /forged`); such a line names an inode that some record of the namespace names too when that
///   socket is there, so an inode named by more than one record is ambiguous and left out, never reported with
///   either path. (What the forger's own record then shows is the part of its path before the forged line.)
///
/// Paths that are no UTF-8 are read lossily (U+FFFD for each bad byte).
/// The socket inodes of a `/proc/net/{tcp,udp,raw}[6]` table: the tenth field of every line after the header (a
/// line that does not parse is skipped).
pub fn parse_net_inet(text: &[u8]) -> BTreeSet<u64> {
    String::from_utf8_lossy(text)
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().nth(9)?.parse::<u64>().ok())
        .filter(|&i| i != 0)
        .collect()
}

pub fn parse_net_unix(text: &[u8]) -> BTreeMap<u64, String> {
    // The text ends with the last record's line break; what follows it is no continuation.
    let body = text.strip_suffix(b"\n").unwrap_or(text);
    let mut records: Vec<(u64, Option<Vec<u8>>)> = Vec::new();
    for line in body.split(|&b| b == b'\n') {
        match record_header(line) {
            Some((inode, path)) => records.push((inode, path.map(<[u8]>::to_vec))),
            None => {
                if let Some((_, path)) = records.last_mut() {
                    // After an unbound socket's record the kernel writes no path, so nothing can continue it: a
                    // path made of a line break and the rest, which starts with no `/`, is never reported.
                    let path = path.get_or_insert_with(Vec::new);
                    path.push(b'\n');
                    path.extend_from_slice(line);
                }
            }
        }
    }
    let mut seen: BTreeMap<u64, usize> = BTreeMap::new();
    for (inode, _) in &records {
        *seen.entry(*inode).or_insert(0) += 1;
    }
    let mut out = BTreeMap::new();
    for (inode, path) in records {
        let Some(path) = path else { continue };
        if seen.get(&inode) == Some(&1) && path.first() == Some(&b'/') {
            out.insert(inode, String::from_utf8_lossy(&path).into_owned());
        }
    }
    out
}

/// A line of `/proc/net/unix` as a record header, as the kernel prints it (`unix_seq_show`: `"%pK: %08X %08X %08X
/// %04X %02X %5lu"`, then a space and the path if the socket has one): the inode and the path's first line. `None`
/// for anything else: 1 to 16 hex digits and a colon, five hex fields of exactly 8, 8, 8, 4 and 2 digits each after
/// one space, one space and the decimal inode (spaces before it, at most 20 digits), then the end or one space and
/// the path.
fn record_header(line: &[u8]) -> Option<(u64, Option<&[u8]>)> {
    let is_hex = |field: &[u8]| field.iter().all(u8::is_ascii_hexdigit);
    let colon = line.iter().position(|&b| b == b':')?;
    let (num, rest) = line.split_at_checked(colon)?;
    if num.is_empty() || num.len() > 16 || !is_hex(num) {
        return None;
    }
    let mut rest = rest.strip_prefix(b":")?;
    for width in [8, 8, 8, 4, 2] {
        let (field, tail) = rest.strip_prefix(b" ")?.split_at_checked(width)?;
        if !is_hex(field) {
            return None;
        }
        rest = tail;
    }
    let rest = rest.strip_prefix(b" ")?;
    let rest = rest.get(rest.iter().take_while(|&&b| b == b' ').count()..)?;
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 || digits > 20 {
        return None;
    }
    let (number, after) = rest.split_at_checked(digits)?;
    let inode = std::str::from_utf8(number).ok()?.parse::<u64>().ok()?;
    match after {
        [] => Some((inode, None)),
        [b' ', path @ ..] => Some((inode, Some(path))),
        _ => None,
    }
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
    fn the_inet_tables_give_their_socket_inodes() {
        let text = b"  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   0: 0100007F:7405 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 123456 1 0000000000000000 100 0 0 10 0\n   1: junk\n";
        assert_eq!(parse_net_inet(text), BTreeSet::from([123456]));
    }

    #[test]
    fn bound_paths_are_read_by_inode_and_abstract_or_unbound_sockets_are_left_out() {
        let m = parse_net_unix(NET_UNIX.as_bytes());
        assert_eq!(m.len(), 2);
        assert_eq!(m[&8276], "/tmp/pymp-x_jh4uwe/listener-ndkxs15z");
        // A padded inode, and a path with spaces (the rest of the line).
        assert_eq!(m[&9001], "/run/dbus/system bus socket");
    }

    /// Guards the record boundaries of `/proc/net/unix` (review finding: the text was cut at every line break). A
    /// path holding a line break and a whole forged record line must not give the forged inode a path, nor cut the
    /// real paths: before, inode 12345 read `/forged` (or `/real/socket`, whichever line came last) and the
    /// multi-line path was cut at its first line.
    #[test]
    fn a_line_break_in_a_path_cannot_forge_a_record_or_cut_a_path() {
        let record = |inode: u64, path: &str| {
            format!("0000000000000000: 00000002 00000000 00010000 0001 01 {inode:>5} {path}\n")
        };
        // The forger binds `/a` + a line break + a record line of inode 12345, before or after the real 12345.
        let forger = record(4242, &format!("/a\n{}", record(12345, "/forged").trim_end()));
        let real = record(12345, "/real/socket");
        let rest = record(7000, "/tmp/two\nlines")
            + &record(7001, "/tmp/ends with a break\n")
            + &record(7002, "@abstract\n/not/a/path");
        for (first, second) in [(&forger, &real), (&real, &forger)] {
            let text = format!("Num       RefCount Protocol Flags    Type St Inode Path\n{first}{second}{rest}");
            let m = parse_net_unix(text.as_bytes());
            assert!(!m.contains_key(&12345), "an inode of two records is ambiguous: {m:?}");
            // The forger's own socket reads as the part of its path before the forged line.
            assert_eq!(m.get(&4242).map(String::as_str), Some("/a"), "{m:?}");
            assert_eq!(m.get(&7000).map(String::as_str), Some("/tmp/two\nlines"), "{m:?}");
            assert_eq!(m.get(&7001).map(String::as_str), Some("/tmp/ends with a break\n"), "{m:?}");
            assert!(!m.contains_key(&7002), "an abstract name with a line break is still abstract: {m:?}");
            assert_eq!(m.len(), 3, "{m:?}");
        }
        // A line break before any record, or after an unbound socket's record, makes no path.
        let m = parse_net_unix(b"/x\n0000000000000000: 00000003 00000000 00000000 0001 03 22222\n/y\n");
        assert!(m.is_empty(), "{m:?}");
        // Bytes that are no UTF-8 are kept lossily; a CR stays part of the path.
        let m = parse_net_unix(b"0000000000000000: 00000002 00000000 00010000 0001 01  9 /a\xff\r\n");
        assert_eq!(m.get(&9).map(String::as_str), Some("/a\u{fffd}\r"));
    }

    /// Guards the strictness of a record header (a path's continuation line must not be taken for a record unless it
    /// has the kernel's whole form) and that no input panics: every cut and every one-byte change of the fixture.
    #[test]
    fn only_the_kernels_header_form_starts_a_record_and_no_input_panics() {
        let good = b"0000000000000000: 00000002 00000000 00010000 0001 01  8276 /p";
        assert_eq!(record_header(good), Some((8276, Some(&b"/p"[..]))));
        assert_eq!(record_header(b"ffff0000: 00000002 00000000 00010000 0001 01 8276"), Some((8276, None)));
        for bad in [
            &b"0000000000000000 00000002 00000000 00010000 0001 01  8276 /p"[..],
            b"00000000000000000: 00000002 00000000 00010000 0001 01  8276 /p",
            b": 00000002 00000000 00010000 0001 01  8276 /p",
            b"0000000000000000: 0000002 00000000 00010000 0001 01  8276 /p",
            b"0000000000000000: 00000002 00000000 00010000 0001 1  8276 /p",
            b"0000000000000000: 00000002 00000000 00010000 000g 01  8276 /p",
            b"0000000000000000: 00000002 00000000 00010000 0001 01  8276x /p",
            b"0000000000000000: 00000002 00000000 00010000 0001 01 ",
            b"0000000000000000: 00000002 00000000 00010000 0001 01  99999999999999999999999 /p",
            b"Num       RefCount Protocol Flags    Type St Inode Path",
        ] {
            assert_eq!(record_header(bad), None, "{}", String::from_utf8_lossy(bad));
        }
        let fixture = NET_UNIX.as_bytes();
        for cut in 0..=fixture.len() {
            parse_net_unix(&fixture[..cut]);
        }
        let mut changed = fixture.to_vec();
        for at in 0..changed.len() {
            let was = changed[at];
            for b in [b'\n', b' ', b':', b'0', b'/', 0xff] {
                changed[at] = b;
                for path in parse_net_unix(&changed).values() {
                    assert!(path.starts_with('/'), "{path:?}");
                }
            }
            changed[at] = was;
        }
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
