//! `ccm-reaper CMD [ARG...]`: runs CMD as a child subreaper, so that the processes it leaves
//! behind (a workload started with `setsid -f`, the tree `criu restore -d` detaches, the plugin's
//! driver agent) are re-parented here instead of to pid 1, and reaps them. On a host whose pid 1
//! does not reap (a container's shell, a minimal init) they would otherwise stay as zombies.
//!
//! Reaps them as they end while CMD runs (a zombie keeps its pid, which a restore needs again).
//! After CMD exits, waits up to `CCM_REAPER_GRACE` seconds (default 30) for the rest to end, then
//! kills what is left (naming each) and exits with CMD's status. A demo and test tool, never
//! packaged.

use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

const USAGE: &str = "usage: ccm-reaper CMD [ARG...]\n\nRuns CMD as a child subreaper and reaps what it leaves behind; after CMD exits, waits up to\nCCM_REAPER_GRACE seconds (default 30) for the rest, kills what is left and exits with CMD's status.";

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let Some(cmd) = args.next() else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    if cmd == "--help" || cmd == "-h" {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
        eprintln!("ccm-reaper: cannot become a child subreaper ({e}); running the command without");
    }
    let child = match Command::new(&cmd).args(args).spawn() {
        // std hands out the kernel's pid_t as u32: it fits back.
        #[allow(clippy::cast_possible_wrap)]
        Ok(c) => Pid::from_raw(c.id() as i32),
        Err(e) => {
            eprintln!("ccm-reaper: cannot run {}: {e}", cmd.to_string_lossy());
            return ExitCode::from(127);
        }
    };
    // Reap as they end, the command's orphans included, while it runs: a dumped task left as a zombie
    // would keep its pid, which the restore needs again.
    let code = loop {
        match waitpid(Pid::from_raw(-1), None) {
            Ok(WaitStatus::Exited(pid, c)) if pid == child => break u8::try_from(c).unwrap_or(1),
            Ok(WaitStatus::Signaled(pid, ..)) if pid == child => break 1,
            Ok(_) | Err(Errno::EINTR) => continue,
            Err(e) => {
                eprintln!("ccm-reaper: waiting for the command failed: {e}");
                break 1;
            }
        }
    };
    let grace = std::env::var("CCM_REAPER_GRACE").ok().and_then(|v| v.parse().ok()).unwrap_or(30);
    reap_orphans(Duration::from_secs(grace));
    ExitCode::from(code)
}

/// Reaps every process re-parented here until none is left, or kills those still running after `grace`.
fn reap_orphans(grace: Duration) {
    let deadline = Instant::now() + grace;
    loop {
        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Err(Errno::ECHILD) => return,
            Err(Errno::EINTR) | Ok(WaitStatus::Exited(..)) | Ok(WaitStatus::Signaled(..)) => continue,
            Err(e) => {
                eprintln!("ccm-reaper: waitpid failed: {e}");
                return;
            }
            Ok(_) => {}
        }
        if Instant::now() >= deadline {
            for pid in children() {
                eprintln!("ccm-reaper: pid {pid} ({}) still runs {grace:?} after the command ended: killed", comm(pid));
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
            // Killed children end at once; wait for each without a deadline of our own.
            while !matches!(waitpid(Pid::from_raw(-1), None), Err(Errno::ECHILD)) {}
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// This process's children (from every thread's `children` list).
fn children() -> Vec<i32> {
    let me = std::process::id();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{me}/task")) else { return Vec::new() };
    let mut out: Vec<i32> = tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|s| s.split_whitespace().filter_map(|p| p.parse().ok()).collect::<Vec<i32>>())
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

fn comm(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).map(|s| s.trim().to_string()).unwrap_or_default()
}
