//! Letting the CUDA restore thread of a CRIU-stopped task run while the driver works, then
//! stopping it again: the dance CRIU's own CUDA plugin does around `cuda-checkpoint`
//! (CHECKPOINT_DEVICES and `resume_device` in `plugins/cuda/cuda_plugin.c`).
//!
//! libcuda's `cuCheckpointProcess{Checkpoint,Restore,Unlock}` need the target's restore thread
//! to run; CRIU holds every thread of the tree ptrace-stopped. So: resume just that thread with
//! every signal but SIGTRAP blocked (it must not run the application's signal handlers in the
//! middle of a dump or restore), call the driver, then interrupt it and put back the ptrace
//! options and signal mask CRIU expects.
//!
//! # Threads rule
//!
//! A ptrace request works only from the tracer THREAD, and CRIU's tracer is its main thread.
//! Every function here must run on the plugin hook's calling thread; only the driver calls
//! themselves may run on worker threads in between. [`RunningRestoreThread`] is therefore
//! neither `Send` nor `Sync`.

use crate::PtraceError;
use nix::errno::Errno;
use nix::sys::ptrace::{self, Options};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use std::marker::PhantomData;
use std::time::{Duration, Instant};

/// `PTRACE_GETSIGMASK` / `PTRACE_SETSIGMASK` (Linux 3.11), which nix does not wrap.
const PTRACE_GETSIGMASK: libc::c_uint = 0x420a;
const PTRACE_SETSIGMASK: libc::c_uint = 0x420b;

/// The kernel's signal set: 64 signals, one bit each (`_NSIG` = 64 on x86-64 and aarch64), and
/// the size PTRACE_{GET,SET}SIGMASK insist on.
type KernelSigset = u64;
const KERNEL_SIGSET_BYTES: usize = std::mem::size_of::<KernelSigset>();

/// The ptrace options CRIU has on its tasks when it hands them to a plugin, which the CUDA
/// plugin restores after re-stopping the thread.
const CRIU_PTRACE_OPTIONS: libc::c_int = libc::PTRACE_O_SUSPEND_SECCOMP | libc::PTRACE_O_TRACESYSGOOD;

/// Every signal blocked except SIGTRAP (the kernel keeps SIGKILL and SIGSTOP unblockable).
const fn all_blocked_but_sigtrap() -> KernelSigset {
    !(1 << (libc::SIGTRAP as u32 - 1))
}

fn request_error(tid: u32, request: &'static str) -> impl FnOnce(Errno) -> PtraceError {
    move |errno| PtraceError::Request { tid, request, errno }
}

/// A thread id as the kernel's `pid_t`. Linux hands out ids up to 2^22 (`HostTid` holds no more);
/// a number past `pid_t` would name no thread, and `pid_t::MAX` names none either (ESRCH).
fn raw_tid(tid: u32) -> libc::pid_t {
    libc::pid_t::try_from(tid).unwrap_or(libc::pid_t::MAX)
}

fn pid_of(tid: u32) -> Pid {
    Pid::from_raw(raw_tid(tid))
}

fn get_sigmask(tid: u32) -> Result<KernelSigset, PtraceError> {
    let mut set: KernelSigset = 0;
    // SAFETY: PTRACE_GETSIGMASK stores exactly `addr` bytes (here KERNEL_SIGSET_BYTES, the only
    // size the kernel accepts) at `data`, which points to `set`, a live, writable u64 of that
    // size owned by this frame. The request touches no other memory of this process.
    let rc = unsafe {
        libc::ptrace(
            PTRACE_GETSIGMASK as _,
            raw_tid(tid),
            KERNEL_SIGSET_BYTES as *mut libc::c_void,
            std::ptr::from_mut(&mut set).cast::<libc::c_void>(),
        )
    };
    if rc == -1 {
        return Err(PtraceError::Request { tid, request: "PTRACE_GETSIGMASK", errno: Errno::last() });
    }
    Ok(set)
}

fn set_sigmask(tid: u32, set: KernelSigset) -> Result<(), PtraceError> {
    // SAFETY: PTRACE_SETSIGMASK reads exactly `addr` bytes (KERNEL_SIGSET_BYTES) from `data`,
    // which points to `set`, a live u64 of that size owned by this frame; the kernel only reads it.
    let rc = unsafe {
        libc::ptrace(
            PTRACE_SETSIGMASK as _,
            raw_tid(tid),
            KERNEL_SIGSET_BYTES as *mut libc::c_void,
            &set as *const KernelSigset as *mut libc::c_void,
        )
    };
    if rc == -1 {
        return Err(PtraceError::Request { tid, request: "PTRACE_SETSIGMASK", errno: Errno::last() });
    }
    Ok(())
}

/// The signal mask of the stopped thread `tid` (for `crate::remote_syscall`, which puts it back).
pub(crate) fn sigmask_of(tid: u32) -> Result<u64, PtraceError> {
    get_sigmask(tid)
}

/// Blocks every signal but SIGTRAP in the stopped thread `tid`, so that it runs no handler of the application
/// while it is let run on the plugin's behalf.
pub(crate) fn block_all_but_sigtrap(tid: u32) -> Result<(), PtraceError> {
    set_sigmask(tid, all_blocked_but_sigtrap())
}

/// Puts back a signal mask read by [`sigmask_of`].
pub(crate) fn set_mask_of(tid: u32, mask: u64) -> Result<(), PtraceError> {
    set_sigmask(tid, mask)
}

/// The `Seccomp:` mode of a thread from `/proc/TID/status`; `None` if unknown.
fn seccomp_mode(tid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("Seccomp:")).and_then(|v| v.trim().parse().ok())
}

/// Puts back the ptrace options CRIU expects on a stopped thread.
///
/// `PTRACE_O_SUSPEND_SECCOMP` is refused (EINVAL/EPERM) by kernels without
/// CONFIG_CHECKPOINT_RESTORE or to a tracer that is itself under seccomp. It only matters for a
/// thread with a seccomp filter; for any other thread TRACESYSGOOD alone is the same state.
fn restore_criu_options(tid: u32) -> Result<(), PtraceError> {
    match ptrace::setoptions(pid_of(tid), Options::from_bits_retain(CRIU_PTRACE_OPTIONS)) {
        Ok(()) => Ok(()),
        Err(errno @ (Errno::EINVAL | Errno::EPERM)) if seccomp_mode(tid) == Some(0) => {
            log::debug!(
                "thread {tid}: PTRACE_O_SUSPEND_SECCOMP refused ({errno}); the thread has no seccomp \
                 filter, so setting PTRACE_O_TRACESYSGOOD alone"
            );
            ptrace::setoptions(pid_of(tid), Options::PTRACE_O_TRACESYSGOOD)
                .map_err(request_error(tid, "PTRACE_SETOPTIONS"))
        }
        Err(errno) => Err(PtraceError::Request { tid, request: "PTRACE_SETOPTIONS", errno }),
    }
}

/// Resumes the ptrace-stopped thread `tid` alone, with every signal but SIGTRAP blocked and no
/// ptrace options, so the CUDA driver can work through it.
///
/// `tid` must be seized and stopped by the calling thread (CRIU's tracer: call this from the
/// plugin hook's thread, see the module's threads rule). On error the thread is left stopped
/// with its signal mask as it was, as far as the kernel allows.
pub fn resume_restore_thread(tid: u32) -> Result<RunningRestoreThread, PtraceError> {
    let saved_sigmask = get_sigmask(tid)?;
    set_sigmask(tid, all_blocked_but_sigtrap())?;
    let undo = |err: PtraceError| {
        if let Err(e) = restore_criu_options(tid) {
            log::warn!("thread {tid}: could not put back CRIU's ptrace options after a failed resume: {e}");
        }
        if let Err(e) = set_sigmask(tid, saved_sigmask) {
            log::warn!("thread {tid}: could not put back its signal mask after a failed resume: {e}");
        }
        err
    };
    ptrace::setoptions(pid_of(tid), Options::empty()).map_err(request_error(tid, "PTRACE_SETOPTIONS")).map_err(undo)?;
    ptrace::cont(pid_of(tid), None).map_err(request_error(tid, "PTRACE_CONT")).map_err(undo)?;
    Ok(RunningRestoreThread { tid, saved_sigmask, stopped: false, _tracer_thread_only: PhantomData })
}

/// A restore thread resumed by [`resume_restore_thread`]. Call [`RunningRestoreThread::stop`]
/// on the same (tracer) thread once the driver is done; dropping it without that tries to stop
/// the thread and logs a failure.
#[derive(Debug)]
#[must_use = "the thread runs until stop() is called (or this is dropped)"]
pub struct RunningRestoreThread {
    tid: u32,
    saved_sigmask: KernelSigset,
    stopped: bool,
    /// ptrace requests must come from the tracer thread: keep this value on it (!Send, !Sync).
    _tracer_thread_only: PhantomData<*const ()>,
}

impl RunningRestoreThread {
    /// The running thread's id.
    pub fn tid(&self) -> u32 {
        self.tid
    }

    /// Stops the thread again (PTRACE_INTERRUPT, then wait for its stop) and puts back CRIU's
    /// ptrace options and the signal mask it had before [`resume_restore_thread`].
    ///
    /// Signals that the thread stops for before the interrupt takes effect are delivered to it
    /// and the wait goes on, as CRIU's `compel_wait_task` does. Fails if the thread exited or does
    /// not stop within [`STOP_DEADLINE`].
    pub fn stop(self) -> Result<(), PtraceError> {
        self.stop_within(STOP_DEADLINE)
    }

    /// [`RunningRestoreThread::stop`] with another deadline than [`STOP_DEADLINE`]. On
    /// [`PtraceError::StopTimeout`] the thread is left running, interrupted: it stops at its next
    /// return to user space, and its tracer sees that stop when it next waits for it.
    pub fn stop_within(mut self, deadline: Duration) -> Result<(), PtraceError> {
        self.stopped = true;
        stop_thread(self.tid, self.saved_sigmask, deadline)
    }
}

impl Drop for RunningRestoreThread {
    fn drop(&mut self) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        if let Err(e) = stop_thread(self.tid, self.saved_sigmask, STOP_DEADLINE) {
            log::error!("restore thread {} was left running and could not be stopped again: {e}", self.tid);
        }
    }
}

fn stop_thread(tid: u32, saved_sigmask: KernelSigset, deadline: Duration) -> Result<(), PtraceError> {
    let pid = pid_of(tid);
    ptrace::interrupt(pid).map_err(request_error(tid, "PTRACE_INTERRUPT"))?;
    wait_for_stop(tid, deadline)?;
    restore_criu_options(tid)?;
    set_sigmask(tid, saved_sigmask)
}

/// How long a resumed restore thread may take to stop after PTRACE_INTERRUPT. A thread stops at
/// its next return to user space, which takes microseconds; only a thread stuck inside the kernel
/// (an uninterruptible driver call) takes longer, and then waiting on would hang CRIU's restore.
pub const STOP_DEADLINE: Duration = Duration::from_secs(10);

/// Waits until `tid` reports a ptrace-stop after PTRACE_INTERRUPT, for at most `deadline`.
fn wait_for_stop(tid: u32, deadline: Duration) -> Result<(), PtraceError> {
    let pid = pid_of(tid);
    let started = Instant::now();
    // Polled (WNOHANG) so that the wait has a deadline; the pause grows from 20 µs to 2 ms, so
    // the usual stop is seen within microseconds and a slow one costs little CPU.
    let mut pause = Duration::from_micros(20);
    loop {
        match waitpid(pid, Some(WaitPidFlag::__WALL | WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => {
                if started.elapsed() >= deadline {
                    return Err(PtraceError::StopTimeout { tid, waited: deadline });
                }
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(2));
            }
            Err(Errno::EINTR) => continue,
            Err(errno) => return Err(PtraceError::Wait { tid, errno }),
            // The interrupt's stop (or a group-stop, which is as stopped).
            Ok(WaitStatus::PtraceEvent(_, _, event)) if event == libc::PTRACE_EVENT_STOP => return Ok(()),
            // A signal-delivery-stop came first: deliver the signal and wait for the interrupt.
            Ok(WaitStatus::Stopped(_, signal)) => {
                log::debug!("thread {tid}: delivering {signal} before its interrupt stop");
                ptrace::cont(pid, Some(signal)).map_err(request_error(tid, "PTRACE_CONT"))?;
            }
            // Any other ptrace-stop is a stop too (none is expected with options cleared).
            Ok(status @ (WaitStatus::PtraceEvent(..) | WaitStatus::PtraceSyscall(_))) => {
                log::debug!("thread {tid}: stopped by {status:?} instead of the interrupt stop");
                return Ok(());
            }
            Ok(WaitStatus::Exited(_, code)) => {
                return Err(PtraceError::Exited { tid, how: format!("exit status {code}") })
            }
            Ok(WaitStatus::Signaled(_, signal, _)) => {
                return Err(PtraceError::Exited { tid, how: format!("killed by {signal}") })
            }
            Ok(WaitStatus::Continued(_)) => continue,
        }
    }
}
