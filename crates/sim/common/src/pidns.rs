//! Pid namespaces, for the test doubles: the key a process registers under, which the process computes
//! itself and a controller in an ancestor pid namespace computes from the pid it sees (the "host" pid),
//! and the translation of a thread id from the process's own namespace into the controller's.
//!
//! A key is `<inode of the pid namespace>-<pid in that namespace>`. The target reads its own namespace
//! from `/proc/self/ns/pid` (inside a container `/proc` is the container's; `self` still resolves) and
//! its pid from `getpid()`; the controller stats `/proc/<pid>/ns/pid` and reads the last field of the
//! `NSpid:` line of `/proc/<pid>/status`. After CRIU restores a container the process has the same
//! namespace pid in a new namespace, so its key changes (see `registry.rs` for who follows it).

use std::fmt;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::str::FromStr;

use crate::SimError;

/// Where a process registers: its pid namespace (by inode) and its pid in that namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ProcKey {
    pub ns_inode: u64,
    pub ns_pid: i32,
}

impl fmt::Display for ProcKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.ns_inode, self.ns_pid)
    }
}

impl FromStr for ProcKey {
    type Err = SimError;
    fn from_str(s: &str) -> Result<ProcKey, SimError> {
        let bad = || SimError::BadMessage(format!("`{s}` is not a process key <pid-namespace inode>-<pid>"));
        let (ino, pid) = s.trim().split_once('-').ok_or_else(bad)?;
        Ok(ProcKey { ns_inode: ino.parse().map_err(|_| bad())?, ns_pid: pid.parse().map_err(|_| bad())? })
    }
}

/// The calling process's key.
pub fn own_key() -> io::Result<ProcKey> {
    let ns_inode = std::fs::metadata("/proc/self/ns/pid")?.ino();
    // SAFETY: getpid has no preconditions.
    let ns_pid = unsafe { libc::getpid() };
    Ok(ProcKey { ns_inode, ns_pid })
}

/// The key of `pid`, a pid of the `/proc` this process sees.
pub fn key_of(pid: i32) -> io::Result<ProcKey> {
    if pid <= 0 {
        return Err(io::Error::from(io::ErrorKind::NotFound));
    }
    let ns_inode = std::fs::metadata(format!("/proc/{pid}/ns/pid"))?.ino();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let ns_pid = innermost_ns_pid(&status)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("/proc/{pid}/status has no NSpid line")))?;
    Ok(ProcKey { ns_inode, ns_pid })
}

/// The values of the `NSpid:` line of a `/proc/.../status` text: the id in the namespace of that `/proc`
/// first, the id in the task's own namespace last.
pub fn ns_pid_chain(status: &str) -> Option<Vec<i32>> {
    let line = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
    let chain: Option<Vec<i32>> = line.split_whitespace().map(|v| v.parse().ok()).collect();
    chain.filter(|c| !c.is_empty())
}

/// The last value of the `NSpid:` line: the id in the task's own pid namespace.
pub fn innermost_ns_pid(status: &str) -> Option<i32> {
    ns_pid_chain(status)?.last().copied()
}

/// The tid, as this process's `/proc` names it, of the thread of `pid` whose tid in its own pid namespace
/// is `ns_tid`. `None` when `pid` has no such thread (or is gone).
pub fn host_tid(pid: i32, ns_tid: i32) -> Option<i32> {
    let innermost = |tid: &str| {
        std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).ok().and_then(|s| innermost_ns_pid(&s))
    };
    // Same namespace as ours (the common case): the thread's directory carries its own tid.
    if innermost(&ns_tid.to_string()) == Some(ns_tid) {
        return Some(ns_tid);
    }
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .find(|tid| innermost(&tid.to_string()) == Some(ns_tid))
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATUS: &str = "Name:\tccm-sim-target\nTgid:\t4242\nNgid:\t0\nPid:\t4242\nPPid:\t4100\n\
                          NStgid:\t4242\t1\nNSpid:\t4242\t1\nNSpgid:\t4242\t1\nNSsid:\t4100\t0\n";

    #[test]
    fn ns_pid_line_outermost_first() {
        assert_eq!(ns_pid_chain(STATUS), Some(vec![4242, 1]));
        assert_eq!(innermost_ns_pid(STATUS), Some(1));
        assert_eq!(innermost_ns_pid("Name:\tx\nNSpid:\t77\n"), Some(77));
        assert_eq!(innermost_ns_pid("Name:\tx\nNSpid:\t7\t6\t5\n"), Some(5));
        assert_eq!(innermost_ns_pid("Name:\tx\n"), None);
        assert_eq!(innermost_ns_pid("NSpid:\n"), None);
        assert_eq!(innermost_ns_pid("NSpid:\t12\tx\n"), None);
    }

    #[test]
    fn keys_print_and_parse() {
        let k = ProcKey { ns_inode: 4026531836, ns_pid: 1 };
        assert_eq!(k.to_string(), "4026531836-1");
        assert_eq!("4026531836-1".parse::<ProcKey>().unwrap(), k);
        assert!("4026531836".parse::<ProcKey>().is_err());
        assert!("x-1".parse::<ProcKey>().is_err());
    }

    #[test]
    fn the_controller_computes_the_key_the_process_computes() {
        // SAFETY: getpid and gettid have no preconditions.
        let (pid, tid) = unsafe { (libc::getpid(), libc::gettid()) };
        let own = own_key().unwrap();
        assert_eq!(own.ns_pid, pid);
        assert_eq!(key_of(pid).unwrap(), own);
        assert!(key_of(-1).is_err());
        // In our own namespace a thread id translates to itself; a thread we do not have translates to nothing.
        assert_eq!(host_tid(pid, tid), Some(tid));
        assert_eq!(host_tid(pid, i32::MAX), None);
        let other = std::thread::spawn(|| {
            // SAFETY: as above.
            unsafe { libc::gettid() }
        });
        let gone = other.join().unwrap();
        assert_eq!(host_tid(pid, gone), None);
    }

    /// A loud skip, straight to the process's stderr (the test harness captures `eprintln!` of passing tests).
    fn skip(why: &str) {
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), "\n######## SKIPPED {why} ########\n");
    }

    /// The first child of `pid`, once it has one.
    fn first_child(pid: u32) -> Option<i32> {
        for _ in 0..500 {
            let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
            if let Some(c) = children.split_whitespace().next() {
                return c.parse().ok();
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        None
    }

    #[test]
    fn a_process_in_a_child_pid_namespace() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            skip("a_process_in_a_child_pid_namespace: a pid namespace needs root");
            return;
        }
        let Ok(mut unshare) = std::process::Command::new("unshare")
            .args(["--pid", "--fork", "--", "sleep", "30"])
            .stdin(std::process::Stdio::null())
            .spawn()
        else {
            skip("a_process_in_a_child_pid_namespace: no unshare(1)");
            return;
        };
        let child = first_child(unshare.id());
        let checked = child.map(|c| (key_of(c), host_tid(c, 1), std::fs::read_to_string(format!("/proc/{c}/status"))));
        let _ = unshare.kill();
        if let Some(c) = child {
            // SAFETY: kill has no memory-safety preconditions; c is the sleep our unshare forked.
            unsafe { libc::kill(c, libc::SIGKILL) };
        }
        let exit = unshare.wait();
        let Some((key, tid, status)) = checked else {
            skip(&format!("a_process_in_a_child_pid_namespace: unshare --pid --fork started no child ({exit:?})"));
            return;
        };
        let key = key.unwrap();
        let c = child.unwrap();
        assert_eq!(key.ns_pid, 1, "{status:?}");
        assert_ne!(key.ns_inode, own_key().unwrap().ns_inode);
        assert_eq!(ns_pid_chain(&status.unwrap()), Some(vec![c, 1]));
        // Its namespace tid 1 is the host tid of its only thread.
        assert_eq!(tid, Some(c));
    }
}
