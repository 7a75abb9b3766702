//! The restore-thread dance on a real child: seize and stop one of its threads, resume it alone
//! with [`resume_restore_thread`], see it run, stop it again, see it stopped, detach.
//!
//! All ptrace requests run on the test's own thread, which is the tracer (the threads rule).

// Test code: a failed unwrap or expect names its line (the workspace lints keep them out of product code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

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

/// Passes once 100 ms go by without a tick. Ticks the thread wrote before it stopped may still
/// reach the reading thread late on a loaded machine, so a single window could see one of them;
/// a thread that runs ticks every 5 ms and never leaves a window empty for long.
fn assert_falls_silent(ticks: &AtomicUsize, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let before = ticks.load(Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(100));
        if ticks.load(Ordering::SeqCst) == before {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: the thread still ticks after 10 s");
    }
}

/// Seizes the thread `tid` as CRIU does and waits for its interrupt stop (signals on the way delivered).
fn seize_and_stop(tid: u32) -> Pid {
    let tracee = Pid::from_raw(i32::try_from(tid).expect("tid"));
    ptrace::seize(tracee, ptrace::Options::PTRACE_O_TRACESYSGOOD).expect("seize");
    ptrace::interrupt(tracee).expect("interrupt");
    loop {
        match waitpid(tracee, Some(WaitPidFlag::__WALL)).expect("wait") {
            WaitStatus::PtraceEvent(_, _, libc::PTRACE_EVENT_STOP) => return tracee,
            WaitStatus::Stopped(_, sig) => ptrace::cont(tracee, Some(sig)).expect("deliver"),
            other => panic!("unexpected {other:?}"),
        }
    }
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
    let tracee = seize_and_stop(tid);
    assert_eq!(thread_state(pid, tid), "t");
    assert_falls_silent(&ticks, "stopped thread");
    let mask_before = blocked_signals(pid, tid);

    let running = resume_restore_thread(tid).expect("resume");
    assert_eq!(running.tid(), tid);
    wait_for_ticks(&ticks, 3);
    let sigtrap_bit = 1u64 << (libc::SIGTRAP - 1);
    let kill_stop = (1u64 << (libc::SIGKILL - 1)) | (1u64 << (libc::SIGSTOP - 1));
    assert_eq!(blocked_signals(pid, tid), !sigtrap_bit & !kill_stop, "all but SIGTRAP blocked");

    running.stop().expect("stop");
    assert_eq!(thread_state(pid, tid), "t");
    assert_falls_silent(&ticks, "stopped again");
    assert_eq!(blocked_signals(pid, tid), mask_before, "signal mask put back");

    // Dropping a running handle stops the thread as well.
    let running = resume_restore_thread(tid).expect("resume again");
    wait_for_ticks(&ticks, 3);
    drop(running);
    assert_eq!(thread_state(pid, tid), "t");
    assert_falls_silent(&ticks, "stopped by drop");

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

#[test]
fn a_thread_that_cannot_stop_is_reported_at_the_deadline_instead_of_waited_for() {
    let mut child = TestChild::spawn("vforker", &[]);
    let pid = child.pid();
    let tid: u32 = child.expect("TID").parse().expect("tid");
    let tracee = Pid::from_raw(i32::try_from(tid).expect("tid"));
    ptrace::seize(tracee, ptrace::Options::PTRACE_O_TRACESYSGOOD).expect("seize");
    ptrace::interrupt(tracee).expect("interrupt");
    match waitpid(tracee, Some(WaitPidFlag::__WALL)).expect("wait") {
        WaitStatus::PtraceEvent(_, _, libc::PTRACE_EVENT_STOP) => {}
        other => panic!("unexpected {other:?}"),
    }

    let running = resume_restore_thread(tid).expect("resume");
    child.send("vfork");
    // The thread sleeps in vfork's wait (state D) until its child exits, 2 s from now.
    let deadline = Instant::now() + Duration::from_secs(1);
    while thread_state(pid, tid) != "D" {
        assert!(Instant::now() < deadline, "the thread never entered vfork");
        std::thread::sleep(Duration::from_millis(5));
    }
    let started = Instant::now();
    let err = running.stop_within(Duration::from_millis(300)).expect_err("cannot stop inside vfork");
    let waited = started.elapsed();
    assert!(matches!(err, ccm_process::PtraceError::StopTimeout { tid: t, .. } if t == tid), "{err}");
    assert!(waited >= Duration::from_millis(300) && waited < Duration::from_secs(1), "{waited:?}");
    assert!(err.to_string().contains("left running") && err.to_string().contains("kill it"), "{err}");

    // Once vfork returns, the interrupt takes effect: the late stop is there to be seen.
    loop {
        match waitpid(tracee, Some(WaitPidFlag::__WALL)).expect("late wait") {
            WaitStatus::PtraceEvent(_, _, libc::PTRACE_EVENT_STOP) => break,
            WaitStatus::Stopped(_, sig) => ptrace::cont(tracee, Some(sig)).expect("deliver"),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(started.elapsed() < Duration::from_secs(5), "the late stop came after vfork returned");
    ptrace::detach(tracee, None).expect("detach");
    assert_eq!(child.expect("VFORKED"), "");
    child.kill_and_reap();
}

/// `madvise(MADV_DONTNEED)` run inside a stopped task (the staging pages' release, issue 47): the pages read zero
/// afterwards, and the task, stopped in a `read` of its stdin, goes on exactly where it was once let go (its
/// registers, signal mask and code were put back): it answers the next command.
#[test]
fn a_madvise_run_inside_a_stopped_task_empties_its_pages_and_the_task_goes_on() {
    let sig = ccm_identity::PciSignature::from([1, 2, 3, 4, 5, 6]);
    let sig_env = common::sig_to_env(&sig);
    let mut child = TestChild::spawn("holder", &[(common::HOLDER_SIG_ENV, sig_env.as_str())]);
    let pid = child.pid();
    let _small = child.expect("ADDR");
    let big = common::parse_hex_u64(&child.expect("BIG"));
    let page = (big + 4 * 4096) & !4095;
    child.send(&format!("put {page:x}"));
    assert_eq!(child.expect("OK"), "");
    child.send(&format!("getbig {page:x}"));
    assert_ne!(child.expect("BIGSIG"), "0".repeat(48));
    let mask_before = blocked_signals(pid, pid);

    let tracee = seize_and_stop(pid);
    let regs_before = ptrace::getregs(tracee).expect("regs");
    let maps = ccm_process::read_maps(pid).expect("maps");
    ccm_process::remote_syscall::madvise_dontneed(pid, &maps, &[(page, page + 2 * 4096)]).expect("madvise");
    let regs_after = ptrace::getregs(tracee).expect("regs");
    assert_eq!(format!("{regs_before:?}"), format!("{regs_after:?}"), "registers put back");
    assert_eq!(blocked_signals(pid, pid), mask_before, "signal mask put back");
    let mem = ccm_process::ProcessMemory::open_read_only(pid).expect("mem");
    let mut bytes = [0xffu8; 24];
    mem.read_exact_at(page, &mut bytes).expect("read");
    assert_eq!(bytes, [0u8; 24], "released");

    ptrace::detach(tracee, None).expect("detach");
    child.send(&format!("getbig {page:x}"));
    assert_eq!(child.expect("BIGSIG"), "0".repeat(48), "the task went on and sees its page empty");
    child.send("sig");
    assert_eq!(child.expect("SIG").len(), 48);
    child.kill_and_reap();
}
