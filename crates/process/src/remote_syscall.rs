//! A system call made by a CRIU-stopped task on the plugin's behalf: `madvise(MADV_DONTNEED)` of the driver's
//! staging pages once the plugin has written them to its page file (issue 47), so that CRIU's page walk finds them
//! empty and writes none of them.
//!
//! Done the way CRIU's compel runs a syscall in a seized task (`compel_execute_syscall`): on the tracer thread, with
//! the task ptrace-stopped, save its registers and the first bytes of an executable mapping of its own, write
//! `syscall; int3` there, point the instruction pointer at it with the call's number and arguments (and
//! `orig_rax = -1`, so the kernel does no syscall-restart work on the way out), block every signal but SIGTRAP,
//! let it run to the trap, read the result, then put back the bytes, the registers and the signal mask exactly.
//! The task stays stopped throughout as far as CRIU can tell: it is in a ptrace-stop before and after.
//!
//! x86-64 only; elsewhere [`RemoteSyscallError::Unsupported`] (the staging pages are then left to CRIU).

use std::time::{Duration, Instant};

use crate::mem::ProcessMemory;
use crate::Mapping;

/// Why a syscall could not be made in the task. After any error the task's registers, signal mask and code bytes
/// were put back as far as the kernel allowed; an error that says otherwise names the task.
#[derive(Debug, thiserror::Error)]
pub enum RemoteSyscallError {
    #[error("running a syscall inside a stopped task is implemented on x86-64 only")]
    Unsupported,
    #[error("task {tid}: no private executable file mapping to run a syscall from")]
    NoExecutableArea { tid: u32 },
    #[error(transparent)]
    Ptrace(#[from] crate::PtraceError),
    #[error("task {tid}: {request} failed: {errno}")]
    Request { tid: u32, request: &'static str, errno: nix::errno::Errno },
    #[error("task {tid}: its code bytes at {addr:#x} could not be read or written: {source}")]
    Memory { tid: u32, addr: u64, source: crate::ProcessError },
    #[error("task {tid}: it did not reach the trap after the syscall within {waited:?} ({state})")]
    NoTrap { tid: u32, waited: Duration, state: String },
    #[error("task {tid}: madvise({addr:#x}, {len}) returned {errno}")]
    Failed { tid: u32, addr: u64, len: u64, errno: nix::errno::Errno },
    #[error("task {tid}: its registers or code could not be put back ({what}); the task must not run on: kill it")]
    NotPutBack { tid: u32, what: String },
}

/// How long one injected syscall may take (a `madvise` of tens of GiB takes about a second).
pub const SYSCALL_DEADLINE: Duration = Duration::from_secs(30);

/// `madvise(addr, len, MADV_DONTNEED)` of every range in the stopped task `tid` (its thread-group leader), one
/// syscall per range. Must run on CRIU's tracer thread (the hook's calling thread), with `tid` seized and stopped.
/// `maps` are the task's mappings (the executable area is chosen among them).
pub fn madvise_dontneed(tid: u32, maps: &[Mapping], ranges: &[(u64, u64)]) -> Result<(), RemoteSyscallError> {
    imp::madvise_dontneed(tid, maps, ranges)
}

/// The first private file mapping that is executable (not `[vsyscall]`, `[vdso]` or `[uprobes]`: special mappings),
/// as compel's `find_executable_area` chooses.
fn executable_area(maps: &[Mapping]) -> Option<u64> {
    maps.iter()
        .find(|m| m.executable && m.readable && !m.shared && m.inode != 0 && !m.path.starts_with('[') && m.len() >= 16)
        .map(|m| m.start)
}

#[cfg(target_arch = "x86_64")]
mod imp {
    use super::*;
    use nix::errno::Errno;
    use nix::sys::ptrace;
    use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
    use nix::unistd::Pid;

    /// `syscall` (0f 05) then `int3` (cc) to the end of the word.
    const CODE: [u8; 8] = [0x0f, 0x05, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc];

    pub(super) fn madvise_dontneed(
        tid: u32,
        maps: &[Mapping],
        ranges: &[(u64, u64)],
    ) -> Result<(), RemoteSyscallError> {
        if ranges.is_empty() {
            return Ok(());
        }
        let at = executable_area(maps).ok_or(RemoteSyscallError::NoExecutableArea { tid })?;
        let pid = Pid::from_raw(libc::pid_t::try_from(tid).unwrap_or(libc::pid_t::MAX));
        let req = |request: &'static str| move |errno| RemoteSyscallError::Request { tid, request, errno };
        let saved_regs = ptrace::getregs(pid).map_err(req("PTRACE_GETREGS"))?;
        let saved_mask = crate::ptrace::sigmask_of(tid)?;
        let mem = ProcessMemory::open_read_write(tid).map_err(|source| RemoteSyscallError::Memory {
            tid,
            addr: at,
            source,
        })?;
        let mut saved_code = [0u8; 8];
        mem.read_exact_at(at, &mut saved_code).map_err(|source| RemoteSyscallError::Memory {
            tid,
            addr: at,
            source,
        })?;
        mem.write_all_at(at, &CODE).map_err(|source| RemoteSyscallError::Memory { tid, addr: at, source })?;
        let mut result = crate::ptrace::block_all_but_sigtrap(tid).map_err(RemoteSyscallError::from);
        if result.is_ok() {
            for &(addr, end) in ranges {
                result = one_syscall(pid, tid, saved_regs, at, [addr, end - addr, libc::MADV_DONTNEED as u64])
                    .and_then(|rax| match rax {
                        0 => Ok(()),
                        r => Err(RemoteSyscallError::Failed {
                            tid,
                            addr,
                            len: end - addr,
                            errno: Errno::from_raw(i32::try_from(r.cast_signed().saturating_neg()).unwrap_or(i32::MAX)),
                        }),
                    });
                if result.is_err() {
                    break;
                }
            }
        }
        // Put everything back whatever happened: code, registers, signal mask.
        let mut not_back = Vec::new();
        if let Err(e) = mem.write_all_at(at, &saved_code) {
            not_back.push(format!("code at {at:#x}: {e}"));
        }
        if let Err(e) = ptrace::setregs(pid, saved_regs) {
            not_back.push(format!("registers: {e}"));
        }
        if let Err(e) = crate::ptrace::set_mask_of(tid, saved_mask) {
            not_back.push(format!("signal mask: {e}"));
        }
        if !not_back.is_empty() {
            return Err(RemoteSyscallError::NotPutBack { tid, what: not_back.join("; ") });
        }
        result
    }

    /// Runs `madvise(args)` from `at` and returns `rax` at the trap.
    fn one_syscall(
        pid: Pid,
        tid: u32,
        saved: libc::user_regs_struct,
        at: u64,
        args: [u64; 3],
    ) -> Result<u64, RemoteSyscallError> {
        let mut regs = saved;
        regs.rip = at;
        regs.rax = libc::SYS_madvise as u64;
        regs.orig_rax = u64::MAX; // -1: no syscall-restart work when the task leaves its stop
        regs.rdi = args[0];
        regs.rsi = args[1];
        regs.rdx = args[2];
        ptrace::setregs(pid, regs).map_err(|errno| RemoteSyscallError::Request {
            tid,
            request: "PTRACE_SETREGS",
            errno,
        })?;
        ptrace::cont(pid, None).map_err(|errno| RemoteSyscallError::Request { tid, request: "PTRACE_CONT", errno })?;
        let started = Instant::now();
        let mut pause = Duration::from_micros(20);
        loop {
            match waitpid(pid, Some(WaitPidFlag::__WALL | WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) => {
                    if started.elapsed() >= SYSCALL_DEADLINE {
                        // Stop it where it is; its registers are put back by the caller.
                        let _ = ptrace::interrupt(pid);
                        let _ = waitpid(pid, Some(WaitPidFlag::__WALL));
                        return Err(RemoteSyscallError::NoTrap {
                            tid,
                            waited: SYSCALL_DEADLINE,
                            state: "still in the syscall".into(),
                        });
                    }
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(2));
                }
                Err(Errno::EINTR) => continue,
                Err(errno) => return Err(RemoteSyscallError::Request { tid, request: "waitpid", errno }),
                Ok(WaitStatus::Stopped(_, nix::sys::signal::Signal::SIGTRAP)) => {
                    let after = ptrace::getregs(pid).map_err(|errno| RemoteSyscallError::Request {
                        tid,
                        request: "PTRACE_GETREGS",
                        errno,
                    })?;
                    // The trap is the int3 right after the syscall: rip points past it.
                    if after.rip != at + 3 {
                        return Err(RemoteSyscallError::NoTrap {
                            tid,
                            waited: started.elapsed(),
                            state: format!("trapped at {:#x}, not after the syscall at {at:#x}", after.rip),
                        });
                    }
                    return Ok(after.rax);
                }
                Ok(status) => {
                    return Err(RemoteSyscallError::NoTrap {
                        tid,
                        waited: started.elapsed(),
                        state: format!("{status:?}"),
                    })
                }
            }
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod imp {
    use super::*;
    pub(super) fn madvise_dontneed(_: u32, _: &[Mapping], _: &[(u64, u64)]) -> Result<(), RemoteSyscallError> {
        Err(RemoteSyscallError::Unsupported)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(start: u64, x: bool, inode: u64, path: &str) -> Mapping {
        Mapping {
            start,
            end: start + 0x1000,
            readable: true,
            writable: false,
            executable: x,
            shared: false,
            offset: 0,
            dev: (0, 0),
            inode,
            path: path.into(),
            deleted: false,
        }
    }

    #[test]
    fn the_syscall_runs_from_a_private_executable_file_mapping_not_a_special_one() {
        let maps =
            [map(0x1000, true, 0, "[vdso]"), map(0x2000, false, 5, "/usr/bin/x"), map(0x3000, true, 5, "/usr/bin/x")];
        assert_eq!(executable_area(&maps), Some(0x3000));
        assert_eq!(executable_area(&maps[..2]), None);
    }
}
