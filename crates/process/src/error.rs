//! The process layer's errors: each names the process, what was tried and what to do.

use ccm_identity::PciSignature;
use std::path::PathBuf;

/// Failures reading or writing another process through `/proc`.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error(
        "permission denied {action} {path}: criu-cuda-migrate must run as root (CAP_SYS_PTRACE over \
         process {pid}) inside CRIU"
    )]
    PermissionDenied { pid: u32, action: &'static str, path: PathBuf },

    #[error(
        "process {pid} is gone ({path} does not exist): it exited or was killed; check that the pid \
         is a live task of the tree CRIU handles"
    )]
    NoSuchProcess { pid: u32, path: PathBuf },

    #[error("{action} {path} failed for process {pid}: {source}")]
    Io {
        pid: u32,
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error(
        "cannot {action} {len} bytes at {addr:#x} in process {pid}: {source}; the address is not \
         mapped (or no longer mapped) in that process, so re-read its maps"
    )]
    Unmapped {
        pid: u32,
        action: &'static str,
        addr: u64,
        len: usize,
        #[source]
        source: std::io::Error,
    },

    #[error(
        "short {action} at {addr:#x} in process {pid}: {done} of {wanted} bytes; the mapping ends \
         there or the process exited, so re-read its maps"
    )]
    Short { pid: u32, action: &'static str, addr: u64, wanted: usize, done: usize },

    #[error(
        "{path} of process {pid} is larger than {limit} bytes, more than criu-cuda-migrate reads of it: the process \
         made it so (tens of thousands of mappings under long file names, say); it is not read"
    )]
    ProcFileTooLarge { pid: u32, path: PathBuf, limit: u64 },

    #[error("cannot parse {path} of process {pid}: {detail}; this kernel's format is not supported")]
    Parse { pid: u32, path: PathBuf, detail: String },

    #[error(
        "process {pid} hides its environ location (env_start/env_end read as 0 in /proc/{pid}/stat): \
         run as root with CAP_SYS_PTRACE over it; a kernel thread has no environ"
    )]
    EnvironHidden { pid: u32 },

    #[error(
        "process {pid} reports an environ block of {span} bytes ({start:#x}..{end:#x}, env_start..env_end in \
         /proc/{pid}/stat), more than the {max} bytes exec can give a process: the process set that range itself \
         (prctl PR_SET_MM), so it is not read and its environment is taken as unknown"
    )]
    EnvironTooLarge { pid: u32, start: u64, end: u64, span: u64, max: u64 },

    #[error(
        "environ edit at offset {offset} ({len} bytes) of process {pid} is outside its environ block \
         of {block_len} bytes at {block_start:#x}: re-read the block with read_environ_block"
    )]
    EnvironOutOfBounds { pid: u32, block_start: u64, block_len: u64, offset: usize, len: usize },

    #[error(
        "environ edit of process {pid} must keep the length: old is {old_len} bytes, new is \
         {new_len} (pad the new value or plan a same-length edit)"
    )]
    EnvironLengthMismatch { pid: u32, old_len: usize, new_len: usize },

    #[error(
        "memory at {addr:#x} in process {pid} changed before the write: expected {expected:?}, saw \
         {seen:?}; nothing was written (re-read and plan again)"
    )]
    MemoryChanged { pid: u32, addr: u64, expected: Vec<u8>, seen: Vec<u8> },

    #[error(
        "write at {addr:#x} in process {pid} did not stick: wrote {written:?}, read back {seen:?}; \
         the process is changing that memory concurrently (it must be stopped or locked)"
    )]
    WriteNotApplied { pid: u32, addr: u64, written: Vec<u8>, seen: Vec<u8> },
}

/// Failures checking or rewriting one PCI identity site (24 bytes) in another process.
#[derive(Debug, thiserror::Error)]
pub enum SiteError {
    #[error(
        "PCI words at {addr:#x} in process {pid} changed since they were found: expected \
         {expected:?}, saw {seen:?}; nothing was written there (scan the process again and re-plan)"
    )]
    SiteChanged { pid: u32, addr: u64, expected: PciSignature, seen: PciSignature },

    #[error(
        "rewrite of the PCI words at {addr:#x} in process {pid} did not stick: wrote {written:?}, \
         read back {seen:?}; the process is running and changing that memory (keep it locked or \
         ptrace-stopped while rewriting)"
    )]
    WriteNotApplied { pid: u32, addr: u64, written: PciSignature, seen: PciSignature },

    #[error(transparent)]
    Process(#[from] ProcessError),
}

/// Failures of the ptrace requests on a restore thread.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PtraceError {
    #[error(
        "{request} on thread {tid} failed: {errno}; ptrace requests work only from CRIU's tracer \
         thread (the plugin hook's calling thread) on a thread CRIU has seized and stopped"
    )]
    Request { tid: u32, request: &'static str, errno: nix::errno::Errno },

    #[error(
        "waiting for thread {tid} to stop failed: {errno}; it must be ptrace-seized by this \
         process (CRIU's tracer thread)"
    )]
    Wait { tid: u32, errno: nix::errno::Errno },

    #[error(
        "thread {tid} exited while resumed for the CUDA driver ({how}); the process is lost and \
         its restore or dump must be failed"
    )]
    Exited { tid: u32, how: String },

    #[error(
        "thread {tid} did not stop within {:?} of PTRACE_INTERRUPT (stuck in a driver call?); it is \
         left running with every signal but SIGTRAP blocked, so CRIU cannot finish this task: let \
         the restore or dump fail, and if the process is still there afterwards, kill it",
        waited
    )]
    StopTimeout { tid: u32, waited: std::time::Duration },
}

/// Failures bringing up the loopback interface of a restored task's network namespace.
#[derive(Debug, thiserror::Error)]
pub enum LoopbackError {
    #[error(
        "process {pid} is gone: CRIU's setup-namespaces action names the root task of the tree it \
         restores (CRTOOLS_INIT_PID), which lives until the restore ends; run this only as CRIU's \
         action script"
    )]
    Gone { pid: u32 },

    #[error(
        "cannot {action} process {pid}: {source}; this needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN), \
         as CRIU runs its action scripts"
    )]
    Failed {
        pid: u32,
        action: &'static str,
        #[source]
        source: std::io::Error,
    },
}
