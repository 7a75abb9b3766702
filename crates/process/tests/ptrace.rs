//! The restore-thread dance on a real child: seize and stop one of its threads, resume it alone
//! with [`resume_restore_thread`], see it run, stop it again, see it stopped, detach.
//!
//! All ptrace requests run on the test's own thread, which is the tracer (the threads rule).

mod common;

use ccm_process::resume_restore_thread;
use common::TestChild;
use nix::sys::ptrace;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use std::io::BufRead;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[test]
fn zz_child_entry() {
    common::run_child_if_requested();
}

/// `SigBlk` of a thread, as the kernel reports it.
fn blocked_signals(pid: u32, tid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).expect("status");
    let hex = status.lines().find_map(|l| l.strip_prefix("SigBlk:")).expect("SigBlk line");
    u64::from_str_radix(hex.trim(), 16).expect("hex mask")
}

/// Thread state letter from `/proc/PID/task/TID/stat` (`t`: stopped by a tracer).
fn thread_state(pid: u32, tid: u32) -> String {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).expect("stat");
    stat.rsplit_once(')').expect(")").1.split_whitespace().next().expect("state").to_string()
}

fn ticks_after(ticks: &AtomicUsize, wait: Duration) -> usize {
    let before = ticks.load(Ordering::SeqCst);
    std::thread::sleep(wait);
    ticks.load(Ordering::SeqCst) - before
}

fn wait_for_ticks(ticks: &AtomicUsize, more: usize) {
    let target = ticks.load(Ordering::SeqCst) + more;
    let deadline = Instant::now() + Duration::from_secs(10);
    while ticks.load(Ordering::SeqCst) < target {
        assert!(Instant::now() < deadline, "the resumed thread does not run");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn restore_thread_resumes_and_stops_again() {
    let mut child = TestChild::spawn("ticker", &[]);
    let pid = child.pid();
    let tid: u32 = child.expect("TID").parse().expect("tid");
    let ticks = Arc::new(AtomicUsize::new(0));
    let mut stdout = child.take_stdout();
    let counter = Arc::clone(&ticks);
    std::thread::spawn(move || {
        let mut line = String::new();
        while stdout.read_line(&mut line).map(|n| n > 0).unwrap_or(false) {
            if line.trim_end() == "tick" {
                counter.fetch_add(1, Ordering::SeqCst);
            }
            line.clear();
        }
    });
    wait_for_ticks(&ticks, 3);

    // Be CRIU: seize the thread and stop it.
    let tracee = Pid::from_raw(tid as i32);
    ptrace::seize(tracee, ptrace::Options::PTRACE_O_TRACESYSGOOD).expect("seize");
    ptrace::interrupt(tracee).expect("interrupt");
    loop {
        match waitpid(tracee, Some(WaitPidFlag::__WALL)).expect("wait") {
            WaitStatus::PtraceEvent(_, _, libc::PTRACE_EVENT_STOP) => break,
            WaitStatus::Stopped(_, sig) => ptrace::cont(tracee, Some(sig)).expect("deliver"),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(thread_state(pid, tid), "t");
    assert_eq!(ticks_after(&ticks, Duration::from_millis(100)), 0, "stopped thread is silent");
    let mask_before = blocked_signals(pid, tid);

    let running = resume_restore_thread(tid).expect("resume");
    assert_eq!(running.tid(), tid);
    wait_for_ticks(&ticks, 3);
    let sigtrap_bit = 1u64 << (libc::SIGTRAP - 1);
    let kill_stop = (1u64 << (libc::SIGKILL - 1)) | (1u64 << (libc::SIGSTOP - 1));
    assert_eq!(blocked_signals(pid, tid), !sigtrap_bit & !kill_stop, "all but SIGTRAP blocked");

    running.stop().expect("stop");
    assert_eq!(thread_state(pid, tid), "t");
    // A tick already in flight may land; after that, silence.
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(ticks_after(&ticks, Duration::from_millis(100)), 0, "stopped again");
    assert_eq!(blocked_signals(pid, tid), mask_before, "signal mask put back");

    // Dropping a running handle stops the thread as well.
    let running = resume_restore_thread(tid).expect("resume again");
    wait_for_ticks(&ticks, 3);
    drop(running);
    assert_eq!(thread_state(pid, tid), "t");
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(ticks_after(&ticks, Duration::from_millis(100)), 0, "stopped by drop");

    ptrace::detach(tracee, None).expect("detach");
    wait_for_ticks(&ticks, 3);
    child.kill_and_reap();
}

#[test]
fn requests_on_an_untraced_thread_fail_with_the_fix_in_the_message() {
    let mut child = TestChild::spawn("ticker", &[]);
    let tid: u32 = child.expect("TID").parse().expect("tid");
    let err = resume_restore_thread(tid).expect_err("not traced by us");
    let text = err.to_string();
    assert!(text.contains("PTRACE_GETSIGMASK") && text.contains("tracer thread"), "{text}");
}
