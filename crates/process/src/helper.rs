//! A helper process forked from this one and detached from it, running a closure.
//!
//! Why it exists: CRIU must stay single-threaded while it works on namespaces. `setns` into a
//! mount namespace fails with `EINVAL` in a process that shares its filesystem attributes with
//! another thread (measured: one idle thread in CRIU makes every container dump fail with
//! `Can't setns .../mnt: Invalid argument`), and the NVIDIA driver's `cuInit` starts threads that
//! never end. So the plugin makes its driver calls in a helper process.
//!
//! The helper is made by `fork` without `exec`: it already holds the plugin's code, needs no
//! binary on any path (inside a container's CRIU there may be none), and costs about a
//! millisecond, once per CRIU run. It is forked twice so that it is not CRIU's child: at restore
//! CRIU treats the exit of any child as a failed restore, and at dump compel's SIGCHLD handler
//! complains about children it did not make. The middle process exits at once and is reaped here.

use std::os::fd::RawFd;

use crate::ProcessError;

/// The first fd number no helper keeps unless asked: stdin, stdout and stderr are pointed at
/// `/dev/null` (a runtime hands the container's stdio to CRIU).
const FIRST_NON_STDIO_FD: RawFd = 3;

/// How many threads this process has now (`/proc/self/task`); forking is safe only at 1.
pub fn own_thread_count() -> usize {
    std::fs::read_dir("/proc/self/task").map(|d| d.count()).unwrap_or(0)
}

/// Forks a detached helper that runs `body` and exits with its return value (101 when it
/// panics). In the helper: a new session (a terminal's Ctrl-C for CRIU does not reach it), every
/// signal at its default action and unblocked, stdio on `/dev/null`, and every other fd closed
/// except `keep`. Returns once the middle process has exited, so the helper exists by then.
///
/// Call it only while this process has one thread (the plugin does so from CRIU's hooks): the
/// child of a multi-threaded process may find locks held by threads that no longer exist.
pub fn spawn_detached(name: &str, keep: &[RawFd], body: impl FnOnce() -> i32) -> Result<(), ProcessError> {
    let threads = own_thread_count();
    if threads > 1 {
        log::warn!("forking the {name} helper from a process with {threads} threads");
    }
    let io = |action: &'static str| {
        let e = std::io::Error::last_os_error();
        move || ProcessError::Io { pid: std::process::id(), action, path: "/proc/self".into(), source: e }
    };
    // SAFETY: fork has no memory-safety preconditions of its own; the child only runs code that
    // is safe after fork in a process that had one thread (checked above, warned otherwise), and
    // leaves through _exit without returning into the caller's frames.
    let middle = unsafe { libc::fork() };
    if middle < 0 {
        return Err(io("fork a helper from")());
    }
    if middle == 0 {
        // SAFETY: as above; the middle process forks once more and exits at once.
        let helper = unsafe { libc::fork() };
        if helper != 0 {
            // SAFETY: _exit ends this process without running atexit handlers or destructors,
            // which belong to CRIU.
            unsafe { libc::_exit(if helper > 0 { 0 } else { 1 }) };
        }
        prepare_helper(name, keep);
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)).unwrap_or(101);
        // SAFETY: as above.
        unsafe { libc::_exit(code) };
    }
    let mut status: libc::c_int = 0;
    loop {
        // SAFETY: waits for our own child; `status` is a live int of this frame.
        let r = unsafe { libc::waitpid(middle, &mut status, 0) };
        if r == middle {
            break;
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            // A SIGCHLD handler of the host reaped it first: it exited, which is all we wait for.
            Some(libc::ECHILD) => return Ok(()),
            _ => return Err(io("wait for the helper's middle process of")()),
        }
    }
    if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
        Ok(())
    } else {
        Err(ProcessError::Io {
            pid: std::process::id(),
            action: "fork a helper (the second fork failed) from",
            path: "/proc/self".into(),
            source: std::io::Error::other(format!("middle process status {status:#x}")),
        })
    }
}

/// Makes the freshly forked helper independent of the process it came from.
fn prepare_helper(name: &str, keep: &[RawFd]) {
    // SAFETY: setsid and prctl(PR_SET_NAME) take no pointers into Rust memory except the name,
    // a NUL-terminated buffer that outlives the call.
    unsafe {
        libc::setsid();
        let mut comm = [0u8; 16];
        for (d, s) in comm.iter_mut().zip(name.bytes().take(15)) {
            *d = s;
        }
        libc::prctl(libc::PR_SET_NAME, comm.as_ptr() as libc::c_ulong, 0, 0, 0);
    }
    for sig in 1..=64 {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        // A dead peer's socket must give EPIPE, not kill the helper.
        let action = if sig == libc::SIGPIPE { libc::SIG_IGN } else { libc::SIG_DFL };
        // SAFETY: installs a default or ignore disposition; no handler code is involved.
        unsafe { libc::signal(sig, action) };
    }
    // SAFETY: an empty, initialised set, applied to this thread's mask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
    }
    close_fds_except(keep);
}

fn close_fds_except(keep: &[RawFd]) {
    let open: Vec<RawFd> = match std::fs::read_dir("/proc/self/fd") {
        Ok(d) => d.flatten().filter_map(|e| e.file_name().to_str().and_then(|s| s.parse().ok())).collect(),
        Err(_) => (0..1024).collect(),
    };
    // SAFETY: opens /dev/null with a NUL-terminated literal path.
    let null = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    for fd in open {
        if keep.contains(&fd) || fd == null {
            continue;
        }
        if fd < FIRST_NON_STDIO_FD {
            if null >= 0 {
                // SAFETY: dup2 onto a stdio number; both are plain fd numbers.
                unsafe { libc::dup2(null, fd) };
            }
            continue;
        }
        // SAFETY: closing an fd this freshly forked process inherited and no code of its own uses.
        unsafe { libc::close(fd) };
    }
    if null >= FIRST_NON_STDIO_FD {
        // SAFETY: our own /dev/null fd, no longer needed.
        unsafe { libc::close(null) };
    }
}
