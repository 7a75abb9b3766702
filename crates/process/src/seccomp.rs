//! A job started without io_uring: CRIU cannot checkpoint an io_uring instance, and torch 2.11's elastic agent
//! (torchrun) makes one for its rendezvous store's libuv loop whatever torchrun is told (measured on the GPU machine:
//! `--rdzv-backend static`, `--rdzv-conf use_libuv=0`, `USE_LIBUV=0`, `UV_USE_IO_URING=0` all leave it; see
//! docs/GPU-TESTING.md). A seccomp filter that answers `io_uring_setup` with `ENOSYS`, installed before the job
//! starts and inherited by every process it forks, makes libuv fall back to epoll, as it does on a kernel without
//! io_uring; CRIU checkpoints and restores the filter with the processes.

use std::io;

/// `io_uring_setup`'s number: 425 in the one table every 64-bit architecture shares for new system calls.
const NR_IO_URING_SETUP: u32 = 425;
const AUDIT_ARCH_X86_64: u32 = 0xC000_003E;
const AUDIT_ARCH_AARCH64: u32 = 0xC000_00B7;
// Classic BPF, as <linux/filter.h> and <linux/seccomp.h> define it: BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K,
// BPF_RET|BPF_K (BPF_LD, BPF_W and BPF_K are 0).
const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JMP_JEQ_K: u16 = 0x05 | 0x10;
const BPF_RET_K: u16 = 0x06;
const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
/// `struct seccomp_data`: `int nr` at 0, `__u32 arch` at 4.
const DATA_NR: u32 = 0;
const DATA_ARCH: u32 = 4;

fn stmt(code: u16, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt: 0, jf: 0, k }
}

fn jeq(k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter { code: BPF_JMP_JEQ_K, jt, jf, k }
}

/// The filter: on this machine's architecture, `io_uring_setup` fails with `ENOSYS`; everything else is allowed.
fn program() -> Vec<libc::sock_filter> {
    let arch = if cfg!(target_arch = "aarch64") { AUDIT_ARCH_AARCH64 } else { AUDIT_ARCH_X86_64 };
    let enosys = u32::try_from(libc::ENOSYS).unwrap_or(38);
    vec![
        stmt(BPF_LD_W_ABS, DATA_ARCH),
        jeq(arch, 0, 3),
        stmt(BPF_LD_W_ABS, DATA_NR),
        jeq(NR_IO_URING_SETUP, 0, 1),
        stmt(BPF_RET_K, SECCOMP_RET_ERRNO | enosys),
        stmt(BPF_RET_K, SECCOMP_RET_ALLOW),
    ]
}

/// Installs the filter on the calling thread (and so on every process it then starts): `no_new_privs`, then the
/// filter. Call it in the process that will exec the job, before any other thread exists.
pub fn deny_io_uring() -> io::Result<()> {
    let mut filter = program();
    let prog = libc::sock_fprog { len: u16::try_from(filter.len()).unwrap_or(u16::MAX), filter: filter.as_mut_ptr() };
    // SAFETY: PR_SET_NO_NEW_PRIVS takes plain integers and touches no memory of ours.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `prog` points at `filter`, a valid array of `len` instructions that outlives the call; the kernel
    // copies the program and keeps no pointer to it.
    let r =
        unsafe { libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER, &prog as *const libc::sock_fprog, 0, 0) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_program_checks_the_architecture_then_the_call() {
        let p = program();
        assert_eq!(p.len(), 6);
        assert_eq!((p[0].code, p[0].k), (BPF_LD_W_ABS, DATA_ARCH));
        assert_eq!((p[3].code, p[3].k, p[3].jt, p[3].jf), (BPF_JMP_JEQ_K, NR_IO_URING_SETUP, 0, 1));
        assert_eq!(p[4].k, SECCOMP_RET_ERRNO | 38);
        assert_eq!(p[5].k, SECCOMP_RET_ALLOW);
        // Another architecture's calls are allowed: the arch test jumps straight to ALLOW.
        assert_eq!(1 + 1 + usize::from(p[1].jf), 5);
    }
}
