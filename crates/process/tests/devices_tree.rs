//! Device nodes in use, the process tree, namespace pids and liveness, on real children.

// Test code: a failed unwrap or expect names its line (the workspace lints keep them out of product code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use ccm_identity::PciSignature;
use ccm_process::{children_recursive, is_alive, kill, maps_library, ns_pid, nvidia_minors_in_use, threads};
use common::{sig_to_env, TestChild, HOLDER_SIG_ENV};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

#[test]
fn zz_child_entry() {
    common::run_child_if_requested();
}

fn spawn_holder() -> TestChild {
    let sig = sig_to_env(&PciSignature::from([1, 2, 3, 0, 4, 5]));
    let mut child = TestChild::spawn("holder", &[(HOLDER_SIG_ENV, sig.as_str())]);
    child.expect("BIG");
    child
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn gpu_minors_from_fds_of_every_thread_and_from_maps() {
    let dir = tempfile::tempdir().expect("tempdir");
    let dev = dir.path().join("dev");
    std::fs::create_dir(&dev).expect("mkdir");
    for name in ["nvidia7", "nvidia8", "nvidia9", "nvidiactl", "nvidia-uvm", "nvidia-modeset"] {
        std::fs::write(dev.join(name), vec![0u8; 4096]).expect("stand-in node");
    }
    let path = |name: &str| dev.join(name).to_str().expect("utf-8 path").to_string();

    let mut child = spawn_holder();
    let pid = child.pid();
    assert_eq!(nvidia_minors_in_use(pid).expect("minors"), BTreeSet::new());

    for command in [
        format!("open {}", path("nvidia7")),
        format!("open_unshared {}", path("nvidia8")),
        format!("mmap {}", path("nvidia9")),
        format!("open {}", path("nvidiactl")),
        format!("open {}", path("nvidia-uvm")),
        format!("mmap {}", path("nvidia-modeset")),
    ] {
        child.send(&command);
        child.expect("OK");
    }
    assert!(threads(pid).len() >= 2, "the unshared-fd thread is listed");
    assert_eq!(nvidia_minors_in_use(pid).expect("minors"), BTreeSet::from([7, 8, 9]));
    assert!(maps_library(pid, "nvidia9").expect("maps"));
    assert!(!maps_library(pid, "libcuda.so").expect("maps"));
}

#[test]
fn liveness_and_zombies() {
    let mut child = spawn_holder();
    let pid = child.pid();
    child.send("env CCM_PROCESS_TEST_CHILD");
    assert_eq!(child.expect("ENV"), "holder");
    assert!(is_alive(pid));
    assert!(threads(pid).contains(&pid));

    // A killed but unreaped child is a zombie: not alive; killing it again is not an error.
    kill(pid).expect("kill");
    kill(pid).expect("kill a zombie");
    wait_until("the child to become a zombie", || !is_alive(pid));
    child.kill_and_reap();
    assert!(!is_alive(pid));
    assert!(children_recursive(pid).is_empty());
}

/// The child's own getpid() is its innermost namespace pid.
#[test]
fn ns_pid_matches_the_childs_getpid() {
    let sig = sig_to_env(&PciSignature::from([1, 2, 3, 0, 4, 5]));
    let mut child = TestChild::spawn("holder", &[(HOLDER_SIG_ENV, sig.as_str())]);
    let own_pid: u32 = child.expect("PID").parse().expect("pid");
    assert_eq!(ns_pid(child.pid()).expect("ns_pid"), own_pid);
}

#[test]
fn tree_is_breadth_first_from_the_root() {
    let mut sh =
        std::process::Command::new("sh").args(["-c", "sleep 30 & sleep 30 & exec sleep 30"]).spawn().expect("spawn sh");
    let root = sh.id();
    let mut tree = Vec::new();
    wait_until("sh to start its two children", || {
        tree = children_recursive(root);
        tree.len() == 3
    });
    assert_eq!(tree[0], root);
    for &child in &tree[1..] {
        let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).expect("stat");
        let ppid: u32 = stat.rsplit_once(')').unwrap().1.split_whitespace().nth(1).unwrap().parse().unwrap();
        assert_eq!(ppid, root);
    }
    let mine = children_recursive(std::process::id());
    assert_eq!(mine[0], std::process::id());
    let root_at = mine.iter().position(|&p| p == root).expect("sh is my descendant");
    for &child in &tree[1..] {
        assert!(mine.iter().position(|&p| p == child).expect("grandchild listed") > root_at);
    }

    for &pid in &tree[1..] {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(pid).expect("pid")),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    let _ = sh.kill();
    let _ = sh.wait();
}
