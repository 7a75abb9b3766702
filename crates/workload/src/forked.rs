//! `--forked-child`: a child forked after `cuInit`, as a PyTorch DataLoader worker or a
//! `multiprocessing.Pool` worker is on Linux. It makes no CUDA call (CUDA forbids it after a fork); it
//! keeps what it inherited (the parent's descriptors) and, to stand in for the driver's device mappings a
//! real fork inherits, opens the given device nodes and maps the given one. Then it waits for
//! `D/child-exit` and exits with [`CHILD_EXIT_CODE`], which the parent reports: the code must survive a
//! checkpoint and restore.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// What the forked child exits with.
pub const CHILD_EXIT_CODE: i32 = 7;

/// What the child holds besides what it inherited: nodes it opens, and a node it maps (shared, read-only).
#[derive(Debug, Clone, Default)]
pub struct ChildHolds {
    pub open: Vec<PathBuf>,
    pub map: Option<(PathBuf, usize)>,
}

/// Forks the child; returns its pid in the parent. The child never returns.
pub fn fork_child(dir: &Path, holds: &ChildHolds) -> Result<u32, std::io::Error> {
    // SAFETY: the child only opens, maps, polls a file and exits (`_exit`): no lock another thread of the
    // parent might hold is taken (glibc's malloc is made fork-safe by its own atfork handlers), and it
    // never returns into the parent's code.
    match unsafe { nix::unistd::fork() }.map_err(std::io::Error::from)? {
        nix::unistd::ForkResult::Parent { child } => Ok(child.as_raw().unsigned_abs()),
        nix::unistd::ForkResult::Child => child_main(dir, holds),
    }
}

fn child_main(dir: &Path, holds: &ChildHolds) -> ! {
    let mut kept = Vec::new();
    for p in &holds.open {
        // Without O_CLOEXEC, as the driver's descriptors are inherited... and kept open for the child's life.
        match std::fs::OpenOptions::new().read(true).write(true).open(p) {
            Ok(f) => kept.push(f),
            Err(e) => child_fail(&format!("cannot open {}: {e}", p.display())),
        }
    }
    if let Some((path, len)) = &holds.map {
        if let Err(e) = map_node(path, *len) {
            child_fail(&format!("cannot map {}: {e}", path.display()));
        }
    }
    let _ = crate::files::write_atomic(dir, "forked", format!("{}\n", std::process::id()).as_bytes());
    while !dir.join("child-exit").exists() {
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(kept);
    // SAFETY: ends the child at once, without the parent's atexit handlers (they are the parent's).
    unsafe { libc::_exit(CHILD_EXIT_CODE) }
}

/// Maps `len` bytes of the node at `path`, shared and read-only, for the rest of the process's life (the stand-in
/// of a driver mapping: a forked child's inherited one, or managed memory's `/dev/nvidia-uvm` mapping).
pub fn map_node(path: &Path, len: usize) -> Result<(), std::io::Error> {
    let f = std::fs::File::open(path)?;
    // SAFETY: a fresh shared read-only mapping at an address the kernel chooses; nothing in this process refers
    // to it, and it stays mapped until the process exits (the descriptor may close: the mapping keeps the file).
    let r = unsafe {
        libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, std::os::fd::AsRawFd::as_raw_fd(&f), 0)
    };
    if r == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn child_fail(why: &str) -> ! {
    eprintln!("ccm-sample-workload forked child: {why}");
    // SAFETY: as above.
    unsafe { libc::_exit(2) }
}

/// The child's state, without blocking: `None` while it runs, else its exit code (or 128 + signal).
pub fn child_status(pid: u32, wait: bool) -> Option<i32> {
    use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
    let pid = nix::unistd::Pid::from_raw(i32::try_from(pid).ok()?);
    let flags = if wait { None } else { Some(WaitPidFlag::WNOHANG) };
    match waitpid(pid, flags) {
        Ok(WaitStatus::Exited(_, code)) => Some(code),
        Ok(WaitStatus::Signaled(_, sig, _)) => Some(128 + sig as i32),
        _ => None,
    }
}
