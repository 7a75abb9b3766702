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

use std::os::fd::{OwnedFd, RawFd};
use std::time::Duration;

use rustix::fs::{Mode, OFlags};

use crate::ProcessError;

/// The first fd number no helper keeps unless asked: stdin, stdout and stderr are pointed at
/// `/dev/null` (a runtime hands the container's stdio to CRIU).
const FIRST_NON_STDIO_FD: RawFd = 3;

/// How long the parent waits for the middle process to name the helper.
const HANDSHAKE_WAIT: Duration = Duration::from_secs(5);

/// How many threads this process has now (`/proc/self/task`); forking is safe only at 1.
pub fn own_thread_count() -> usize {
    std::fs::read_dir("/proc/self/task").map(|d| d.count()).unwrap_or(0)
}

/// The helper, as its parent holds it: its pid and a pidfd, through which it is signalled (a pid
/// alone could name another process once the helper is gone and its number reused).
#[derive(Debug)]
pub struct Helper {
    pub pid: u32,
    pidfd: Option<OwnedFd>,
}

impl Helper {
    /// SIGKILL to the helper; nothing when it is already gone.
    pub fn kill(&self) {
        match &self.pidfd {
            Some(fd) => {
                let _ = rustix::process::pidfd_send_signal(fd, rustix::process::Signal::KILL);
            }
            // A kernel without pidfds (before 5.3): by pid, as the best left.
            None => {
                if let Some(p) = i32::try_from(self.pid).ok().and_then(rustix::process::Pid::from_raw) {
                    let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
                }
            }
        }
    }

    /// Waits up to `timeout` for the helper to exit; whether it has.
    pub fn wait_gone(&self, timeout: Duration) -> bool {
        match &self.pidfd {
            Some(fd) => {
                let mut fds = [rustix::event::PollFd::new(fd, rustix::event::PollFlags::IN)];
                let t = rustix::event::Timespec {
                    // Past i64::MAX seconds is forever either way.
                    tv_sec: i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX),
                    tv_nsec: i64::from(timeout.subsec_nanos()),
                };
                matches!(rustix::event::poll(&mut fds, Some(&t)), Ok(n) if n > 0)
            }
            None => {
                let end = std::time::Instant::now() + timeout;
                while std::time::Instant::now() < end {
                    if !crate::tree::is_alive(self.pid) {
                        return true;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                !crate::tree::is_alive(self.pid)
            }
        }
    }

    /// Whether the helper is stopped (SIGSTOP) or traced, as `/proc/PID/stat` says.
    pub fn is_stopped(&self) -> bool {
        crate::tree::state_letter(self.pid).is_some_and(|c| c == 'T' || c == 't')
    }
}

/// Forks a detached helper that runs `body` and exits with its return value (101 when it
/// panics). In the helper: a new session (a terminal's Ctrl-C for CRIU does not reach it), every
/// signal at its default action and unblocked, stdio on `/dev/null`, and every other fd closed
/// except `keep`. Returns once the middle process has exited, so the helper exists by then.
///
/// Refused while this process has more than one thread: the child of a multi-threaded process
/// may find locks held by threads that no longer exist (the plugin forks from CRIU's hooks, where
/// CRIU has one thread).
pub fn spawn_detached(name: &str, keep: &[RawFd], body: impl FnOnce() -> i32) -> Result<Helper, ProcessError> {
    let threads = own_thread_count();
    let io = |action: &'static str| {
        let e = std::io::Error::last_os_error();
        move || ProcessError::Io { pid: std::process::id(), action, path: "/proc/self".into(), source: e }
    };
    if threads != 1 {
        return Err(ProcessError::Io {
            pid: std::process::id(),
            action: "fork a helper from",
            path: "/proc/self".into(),
            source: std::io::Error::other(format!(
                "this process has {threads} threads, and a fork is safe only from one; this is a bug in \
                 criu-cuda-migrate, please report it with this log"
            )),
        });
    }
    // The middle process names the helper over this pair and waits for our word before it exits:
    // while it lives, the helper is its child and cannot be reaped, so the pidfd opened here is
    // the helper's and nobody else's.
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().map_err(|e| ProcessError::Io {
        pid: std::process::id(),
        action: "make the helper's handshake socket in",
        path: "/proc/self".into(),
        source: e,
    })?;
    // SAFETY: fork has no memory-safety preconditions of its own; the child only runs code that
    // is safe after fork in a process that had one thread (checked above), and leaves through
    // _exit without returning into the caller's frames.
    let middle = unsafe { libc::fork() };
    if middle < 0 {
        return Err(io("fork a helper from")());
    }
    if middle == 0 {
        // SAFETY: as above; the middle process forks once more, names the helper and exits.
        let helper = unsafe { libc::fork() };
        if helper != 0 {
            if helper > 0 {
                // Plain write and read syscalls on our own socket with buffers of this frame: no
                // allocation, no lock.
                let _ = rustix::io::write(&theirs, &helper.to_le_bytes());
                let _ = rustix::io::read(&theirs, &mut [0u8; 1]);
            }
            // SAFETY: _exit ends this process without running atexit handlers or destructors
            // (CRIU's).
            unsafe { libc::_exit(if helper > 0 { 0 } else { 1 }) };
        }
        prepare_helper(name, keep);
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)).unwrap_or(101);
        // SAFETY: as above.
        unsafe { libc::_exit(code) };
    }
    drop(theirs);
    let pid = read_helper_pid(&ours);
    let pidfd = pid.and_then(|p| rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()).ok());
    // Let the middle process go (a closed socket does the same if the write fails).
    let _ = std::io::Write::write_all(&mut &ours, &[1]);
    drop(ours);
    let wait_error = |source: std::io::Error| ProcessError::Io {
        pid: std::process::id(),
        action: "wait for the helper's middle process of",
        path: "/proc/self".into(),
        source,
    };
    // `middle` is positive here (below zero returned above, zero is the child).
    let middle = rustix::process::Pid::from_raw(middle)
        .ok_or_else(|| wait_error(std::io::Error::from(std::io::ErrorKind::InvalidInput)))?;
    // None: a SIGCHLD handler of the host reaped it first: it exited, which is all we wait for.
    let status = loop {
        match rustix::process::waitpid(Some(middle), rustix::process::WaitOptions::empty()) {
            Ok(Some((_, status))) => break Some(status),
            // Only WNOHANG answers "nothing yet", and it is not asked for.
            Ok(None) | Err(rustix::io::Errno::INTR) => continue,
            Err(rustix::io::Errno::CHILD) => break None,
            Err(e) => return Err(wait_error(e.into())),
        }
    };
    let exited_clean = match status {
        Some(s) => s.exit_status() == Some(0),
        None => true,
    };
    match pid.and_then(|p| u32::try_from(p.as_raw_nonzero().get()).ok()) {
        Some(pid) if exited_clean => Ok(Helper { pid, pidfd }),
        _ => {
            let status = status.map_or(0, rustix::process::WaitStatus::as_raw);
            Err(ProcessError::Io {
                pid: std::process::id(),
                action: "fork a helper (the second fork failed) from",
                path: "/proc/self".into(),
                source: std::io::Error::other(format!("middle process status {status:#x}")),
            })
        }
    }
}

/// The helper's pid as the middle process sends it (4 bytes), within [`HANDSHAKE_WAIT`].
fn read_helper_pid(sock: &std::os::unix::net::UnixStream) -> Option<rustix::process::Pid> {
    sock.set_read_timeout(Some(HANDSHAKE_WAIT)).ok()?;
    let mut b = [0u8; 4];
    std::io::Read::read_exact(&mut &*sock, &mut b).ok()?;
    let raw = i32::from_le_bytes(b);
    if raw > 0 {
        rustix::process::Pid::from_raw(raw)
    } else {
        None
    }
}

/// Makes the freshly forked helper independent of the process it came from.
fn prepare_helper(name: &str, keep: &[RawFd]) {
    let _ = rustix::process::setsid();
    // The kernel keeps 15 bytes and a NUL; a name with a NUL of its own ends there, as it would
    // for prctl(PR_SET_NAME) itself.
    let mut comm = [0u8; 16];
    for (d, s) in comm.iter_mut().zip(name.bytes().take(15)) {
        *d = s;
    }
    if let Ok(comm) = std::ffi::CStr::from_bytes_until_nul(&comm) {
        let _ = rustix::thread::set_name(comm);
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
    // Closed again before the close_range below, which must find no fd that Rust owns.
    if let Ok(null) = rustix::fs::open(c"/dev/null", OFlags::RDWR | OFlags::CLOEXEC, Mode::empty()) {
        for fd in 0..FIRST_NON_STDIO_FD {
            if !keep.contains(&fd) {
                let _ = match fd {
                    0 => rustix::stdio::dup2_stdin(&null),
                    1 => rustix::stdio::dup2_stdout(&null),
                    _ => rustix::stdio::dup2_stderr(&null),
                };
            }
        }
    }
    // Everything from 3 up, but the kept fds: close_range over the gaps between them (Linux 5.9);
    // without it, what /proc/self/fd lists; without that, every number below RLIMIT_NOFILE.
    let first: libc::c_uint = FIRST_NON_STDIO_FD.unsigned_abs();
    let mut kept: Vec<libc::c_uint> =
        keep.iter().filter_map(|fd| libc::c_uint::try_from(*fd).ok()).filter(|fd| *fd >= first).collect();
    kept.sort_unstable();
    kept.dedup();
    let mut from = first;
    let mut ranges = Vec::new();
    for &k in &kept {
        if k > from {
            ranges.push((from, k - 1));
        }
        from = k + 1;
    }
    ranges.push((from, libc::c_uint::MAX));
    let closed_by_range = ranges.iter().all(|(first, last)| {
        // SAFETY: close_range only closes descriptors; this freshly forked process runs no code of its
        // own that uses any of them.
        unsafe { libc::syscall(libc::SYS_close_range, *first, *last, 0 as libc::c_uint) == 0 }
    });
    if closed_by_range {
        return;
    }
    let open: Vec<RawFd> = match std::fs::read_dir("/proc/self/fd") {
        Ok(d) => d.flatten().filter_map(|e| e.file_name().to_str().and_then(|s| s.parse().ok())).collect(),
        Err(_) => {
            // No limit (RLIM_INFINITY) counts as the cap, 2^20, which fits an fd number.
            let lim = rustix::process::getrlimit(rustix::process::Resource::Nofile);
            let max = lim.current.map_or(1 << 20, |cur| RawFd::try_from(cur.min(1 << 20)).unwrap_or(1 << 20));
            (FIRST_NON_STDIO_FD..max).collect()
        }
    };
    for fd in open {
        if fd < FIRST_NON_STDIO_FD || keep.contains(&fd) {
            continue;
        }
        // SAFETY: closing an fd this freshly forked process inherited and no code of its own uses
        // (no OwnedFd of this process holds it).
        unsafe { rustix::io::close(fd) };
    }
}
