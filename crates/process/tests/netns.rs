//! [`bring_loopback_up`] on real network namespaces: a fresh one (what runc's restore gets from
//! CRIU: loopback down), one already up, this process's own, and a process that is gone.

// Test code: a failed unwrap or expect names its line (the workspace lints keep them out of product code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use ccm_identity::HostPid;
use ccm_process::netns::{bring_loopback_up, Loopback};
use ccm_process::LoopbackError;
use std::process::{Command, Stdio};

mod common;
use common::{is_root, KillOnDrop as Sleeper};
use std::time::{Duration, Instant};

/// A `sleep` in a network namespace of its own (`unshare --net`, no fork: the sleep is the child).
fn sleeper_in_new_netns() -> Option<Sleeper> {
    if !is_root() {
        eprintln!("######## netns: needs root (network namespaces); skipped ########");
        return None;
    }
    let s = Sleeper(
        Command::new("unshare").args(["--net", "sleep", "1000"]).stdin(Stdio::null()).spawn().expect("unshare"),
    );
    let ours = std::fs::read_link("/proc/self/ns/net").expect("own netns");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let comm = std::fs::read_to_string(format!("/proc/{}/comm", s.0.id())).unwrap_or_default();
        let theirs = std::fs::read_link(format!("/proc/{}/ns/net", s.0.id())).ok();
        if comm.trim() == "sleep" && theirs.is_some_and(|t| t != ours) {
            return Some(s);
        }
        assert!(Instant::now() < deadline, "unshare --net never got to its sleep");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether `lo` of `pid`'s namespace is up, as the kernel shows it: the IPv4 local route table
/// holds 127.0.0.1 only while `lo` is up.
fn lo_is_up_for(pid: u32) -> bool {
    let route = std::fs::read_to_string(format!("/proc/{pid}/net/route")).unwrap_or_default();
    let fib = std::fs::read_to_string(format!("/proc/{pid}/net/fib_trie")).unwrap_or_default();
    // Either file names lo once it is up (its local routes); neither does while it is down.
    route.lines().skip(1).any(|l| l.starts_with("lo\t")) || fib.contains("127.0.0.1")
}

#[test]
fn a_fresh_namespace_gets_its_loopback_up_once() {
    let Some(s) = sleeper_in_new_netns() else { return };
    let pid = HostPid::new(i64::from(s.0.id())).expect("pid");
    assert!(!lo_is_up_for(pid.get()), "a fresh network namespace has lo down");
    assert_eq!(bring_loopback_up(pid).expect("bring lo up"), Loopback::BroughtUp);
    assert!(lo_is_up_for(pid.get()), "lo is up afterwards, as the kernel shows it");
    assert_eq!(bring_loopback_up(pid).expect("again"), Loopback::AlreadyUp);
    // Our own thread stayed where it was.
    let ours = std::fs::read_link("/proc/thread-self/ns/net").expect("own netns");
    assert_ne!(Some(ours), std::fs::read_link(format!("/proc/{}/ns/net", pid.get())).ok());
}

#[test]
fn our_own_namespace_is_left_alone() {
    if !is_root() {
        eprintln!("######## netns: needs root (network namespaces); skipped ########");
        return;
    }
    let me = HostPid::new(i64::from(std::process::id())).expect("pid");
    assert_eq!(bring_loopback_up(me).expect("own namespace"), Loopback::SharedWithUs);
}

#[test]
fn a_process_that_is_gone_is_named() {
    let mut child = Command::new("true").spawn().expect("true");
    let pid = child.id();
    child.wait().expect("reap");
    let err = bring_loopback_up(HostPid::new(i64::from(pid)).expect("pid")).expect_err("gone");
    assert!(matches!(err, LoopbackError::Gone { pid: p } if p == pid), "{err}");
    assert!(err.to_string().contains("CRTOOLS_INIT_PID"), "{err}");
}
