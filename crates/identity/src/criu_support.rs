//! What CRIU itself cannot dump, among what GPU jobs hold: `criu-cuda-migrate job` names it before anyone dumps,
//! and the plugin refuses a tree holding an io_uring before it locks anything (CRIU would fail the dump after the
//! device checkpoint, in words that name neither the process nor a way out).
//!
//! CRIU 4.1 and 4.2 dump an open anonymous inode only of the kinds their `dump_one_file` knows (eventfd, eventpoll,
//! inotify, fanotify, signalfd, timerfd; pidfd where built with it; bpf maps where built with libbpf): any other
//! (`[io_uring]`, `[perf_event]`, `[userfaultfd]`, `bpf-prog`, ...) ends in "Can't dump file N of that type" unless a
//! plugin takes it. A mapping of an anonymous inode (`anon_inode:[io_uring]`'s rings, a perf buffer) is no file CRIU
//! can reopen: its `vma_get_mapfile` fails with "Unknown shit 600 (anon_inode:[io_uring])" (measured on the torchrun
//! agent with CRIU 4.1.1). Pure: the link texts and map paths come in as text.

use std::fmt;

/// The anonymous inode kinds CRIU 4.1/4.2 dump (the name inside `anon_inode:`).
const DUMPABLE_ANON: &[&str] =
    &["[eventfd]", "[eventpoll]", "inotify", "[fanotify]", "[signalfd]", "[timerfd]", "[pidfd]", "bpf-map"];

/// Something a process holds that CRIU cannot dump.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Undumpable {
    /// The anonymous inode's kind, as the kernel names it (`[io_uring]`).
    pub kind: String,
    /// Held as a descriptor (its number) or mapped (the mapping's start).
    pub held_as: HeldAs,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum HeldAs {
    Descriptor(u32),
    Mapping(u64),
}

impl fmt::Display for Undumpable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.held_as {
            HeldAs::Descriptor(fd) => write!(f, "descriptor {fd} (anon_inode:{})", crate::text::shown(&self.kind)),
            HeldAs::Mapping(a) => write!(f, "mapping at {a:#x} (anon_inode:{})", crate::text::shown(&self.kind)),
        }
    }
}

impl Undumpable {
    pub fn is_io_uring(&self) -> bool {
        self.kind == "[io_uring]"
    }
}

/// The anonymous inode kind of a descriptor's link text (`anon_inode:[io_uring]` → `[io_uring]`).
fn anon_kind(link: &str) -> Option<&str> {
    link.strip_prefix("anon_inode:")
}

/// A descriptor CRIU cannot dump, from its `/proc/PID/fd/N` link text.
pub fn undumpable_descriptor(fd: u32, link: &str) -> Option<Undumpable> {
    let kind = anon_kind(link)?;
    (!DUMPABLE_ANON.contains(&kind)).then(|| Undumpable { kind: kind.to_string(), held_as: HeldAs::Descriptor(fd) })
}

/// A mapping CRIU cannot dump, from its `/proc/PID/maps` path.
pub fn undumpable_mapping(start: u64, path: &str) -> Option<Undumpable> {
    let kind = anon_kind(path)?;
    Some(Undumpable { kind: kind.to_string(), held_as: HeldAs::Mapping(start) })
}

/// The way out for what one process holds (`held` not empty), in the words of `job` and the plugin.
pub fn way_out(held: &[Undumpable]) -> &'static str {
    if held.iter().any(Undumpable::is_io_uring) {
        IO_URING_WAY_OUT
    } else {
        "CRIU cannot checkpoint a process that holds such a file: close it before the checkpoint"
    }
}

/// Where a GPU job's io_uring comes from and how to run without it (measured on the GPU machine, torch 2.11:
/// docs/GPU-TESTING.md, "A torchrun tree"): no torchrun setting removes it (`--rdzv-backend static`,
/// `--rdzv-conf use_libuv=0`, `USE_LIBUV=0`, `UV_USE_IO_URING=0` all leave it).
pub const IO_URING_WAY_OUT: &str = "CRIU cannot checkpoint an io_uring. In a torchrun job it is the elastic agent's: \
     its rendezvous store (torch's TCPStore server, on libuv) makes one whatever torchrun is told. Start the job \
     without io_uring: `criu-cuda-migrate no-io-uring -- torchrun ...` (a seccomp filter the whole tree inherits: \
     io_uring_setup answers ENOSYS and libuv uses epoll), or switch io_uring off on the node (sysctl \
     kernel.io_uring_disabled=2) or in the pod's seccomp profile";

/// One line naming a process's holdings CRIU cannot dump.
pub fn line(pid: u32, comm: &str, held: &[Undumpable]) -> String {
    let shown: Vec<String> = held.iter().take(4).map(ToString::to_string).collect();
    let more = if held.len() > 4 { format!(" and {} more", held.len() - 4) } else { String::new() };
    format!(
        "pid {pid} ({}) holds what CRIU cannot dump: {}{more}; the dump would fail in CRIU. {}",
        crate::text::shown(comm),
        shown.join(", "),
        way_out(held)
    )
}

/// The first two numbers of a version or release text (`Version: 4.1.1` → (4, 1); `6.18.44-fc-v1272` → (6, 18)).
pub fn major_minor(text: &str) -> Option<(u32, u32)> {
    let start = text.find(|c: char| c.is_ascii_digit())?;
    let mut parts = text[start..].split(|c: char| !c.is_ascii_digit());
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// Whether CRIU of version `criu` cannot dump an inet socket on a kernel of release `kernel`: Linux 6.16 refuses
/// `SO_PASSCRED`/`SO_PASSSEC` on sockets other than unix and netlink ones, and CRIU before 4.2 asks every socket
/// for them (checkpoint-restore/criu#2705, fixed in 4.2). Measured on the GPU machines (6.18, CRIU 4.1.1): "sockets:
/// Can't get 1:16 opt: Operation not supported" for the torchrun tree's TCP connections.
pub fn inet_sockets_undumpable(criu: (u32, u32), kernel: (u32, u32)) -> bool {
    criu < (4, 2) && kernel >= (6, 16)
}

/// One line naming the processes that hold inet sockets CRIU `criu_version` cannot dump on this kernel.
pub fn inet_socket_line(holders: &[(u32, String, usize)], criu_version: &str, kernel: &str) -> String {
    let shown: Vec<String> = holders
        .iter()
        .take(4)
        .map(|(pid, comm, n)| format!("pid {pid} ({}) holds {n} inet socket(s)", crate::text::shown(comm)))
        .collect();
    let more = if holders.len() > 4 { format!(" and {} more process(es)", holders.len() - 4) } else { String::new() };
    format!(
        "{}{more}, which CRIU {} cannot dump on Linux {}: the dump would fail in CRIU (\"sockets: Can't get 1:16 opt: \
         Operation not supported\": Linux 6.16 refuses SO_PASSCRED on TCP and UDP sockets, which CRIU before 4.2 asks \
         every socket for). Use CRIU 4.2 or later (the runtime's `criu`), or a kernel before 6.16",
        shown.join(", "),
        crate::text::shown(criu_version),
        crate::text::shown(kernel)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn criu_before_4_2_cannot_dump_inet_sockets_from_linux_6_16_on() {
        assert_eq!(major_minor("Version: 4.1.1"), Some((4, 1)));
        assert_eq!(major_minor("6.18.44-fc-v1272"), Some((6, 18)));
        assert_eq!(major_minor("criu"), None);
        assert!(inet_sockets_undumpable((4, 1), (6, 18)));
        assert!(inet_sockets_undumpable((3, 19), (6, 16)));
        assert!(!inet_sockets_undumpable((4, 2), (6, 18)));
        assert!(!inet_sockets_undumpable((4, 1), (6, 15)));
        let line = inet_socket_line(&[(7, "pt_elastic".into(), 3)], "4.1.1", "6.18.44");
        assert!(
            line.contains("pid 7 (pt_elastic) holds 3 inet socket(s)") && line.contains("CRIU 4.2 or later"),
            "{line}"
        );
    }

    #[test]
    fn io_uring_and_unknown_anonymous_inodes_are_undumpable_the_known_kinds_are_not() {
        assert!(undumpable_descriptor(5, "anon_inode:[io_uring]").is_some_and(|u| u.is_io_uring()));
        assert!(undumpable_descriptor(6, "anon_inode:[perf_event]").is_some());
        assert!(undumpable_descriptor(6, "anon_inode:bpf-prog").is_some());
        for ok in [
            "anon_inode:[eventfd]",
            "anon_inode:[eventpoll]",
            "anon_inode:inotify",
            "anon_inode:[timerfd]",
            "anon_inode:[signalfd]",
            "anon_inode:[pidfd]",
            "socket:[123]",
            "pipe:[9]",
            "/dev/nvidiactl",
            "/tmp/anon_inode:[io_uring]",
        ] {
            assert_eq!(undumpable_descriptor(3, ok), None, "{ok}");
        }
        let m = undumpable_mapping(0x7f00_0000_0000, "anon_inode:[io_uring]").unwrap();
        assert_eq!(m.to_string(), "mapping at 0x7f0000000000 (anon_inode:[io_uring])");
        assert_eq!(undumpable_mapping(0x1000, "/usr/lib/libc.so.6"), None);
        assert_eq!(undumpable_mapping(0x1000, "[heap]"), None);
        let l = line(42, "pt_elastic", &[m, undumpable_descriptor(9, "anon_inode:[io_uring]").unwrap()]);
        assert!(l.starts_with("pid 42 (pt_elastic) holds what CRIU cannot dump: mapping at"), "{l}");
        assert!(l.contains("descriptor 9 (anon_inode:[io_uring])") && l.contains("io_uring"), "{l}");
    }
}
