//! The process layer of criu-cuda-migrate: everything that touches ANOTHER process.
//!
//! - [`maps`]: `/proc/PID/maps`, and which mappings may hold libcuda's identity words;
//! - [`mem`]: reading and writing another process's memory through `/proc/PID/mem`, and the
//!   scan for the six PCI identity words of each GPU;
//! - [`environ`]: the live environ block (`env_start..env_end` of `/proc/PID/stat`);
//! - [`container`]: the restoring runtime's OCI spec and a restored container's `/dev` (edited only
//!   when it is the container's own tmpfs, through its directory fd);
//! - [`dir`]: files read and written as root in directories others may control: relative to a
//!   directory fd, never through a link, reads capped, writes by a fresh file renamed into place;
//! - [`mountinfo`]: the mount table of a process (`/proc/PID/mountinfo`), parsed;
//! - [`netns`]: the loopback interface of a restored task's network namespace (CRIU's
//!   `setup-namespaces` action);
//! - [`cgroup`]: which cgroup a process is in, and moving the driver agent into CRIU's;
//! - [`devices`]: which `/dev/nvidiaN` a process holds open or mapped, and which libraries it maps;
//! - [`tree`]: namespace pids, process tree, threads;
//! - [`pid_use`]: who keeps a pid number taken (a task, a zombie, a thread, a process group or session);
//! - [`criu_self`]: which task CRIU is parsing when it asks about a device mapping;
//! - [`helper`]: forking the detached helper process that makes the plugin's driver calls;
//! - [`staging_pages`]: the driver's staging pages copied to and from the plugin's page files, in parallel;
//! - [`remote_syscall`]: `madvise` run inside a CRIU-stopped task (the staging pages released after their copy);
//! - [`ptrace`]: resuming and re-stopping the CUDA restore thread of a task that CRIU holds
//!   ptrace-stopped (CRIU is the tracer; see the threads rule on that module).
//!
//! All `unsafe` outside the FFI crates lives here, each block with a `// SAFETY:` comment.
//! Everything needs root (or `CAP_SYS_PTRACE` over the target): the product runs inside CRIU.

pub mod cgroup;
pub mod claims;
pub mod container;
pub mod criu_self;
pub mod devices;
pub mod dir;
pub mod environ;
pub mod forked;
pub mod helper;
pub mod maps;
pub mod mem;
pub mod mountinfo;
pub mod netns;
pub mod pid_use;
mod procfs;
pub mod ptrace;
pub mod remote_syscall;
pub mod seccomp;
pub mod sockets;
pub mod staging_pages;
pub mod tree;
pub mod undumpable;

pub use devices::{maps_library, nvidia_minors_in_use};
pub use environ::{env_var, read_environ_block, write_environ_edit, EnvBlock};
pub use maps::{is_scannable, parse_maps, read_maps, Mapping, ScanScope, DEFAULT_MAX_MAPPING_BYTES};
pub use mem::{
    read_signature, scan_identity_in, scan_identity_over, scan_signatures, scan_signatures_in, verify_and_write,
    verify_and_write_bytes, ProcessMemory, ScanReport,
};
pub use ptrace::{resume_restore_thread, RunningRestoreThread};
pub use tree::{children_recursive, is_alive, kill, ns_pid, threads, tracer, Tracer};

mod error;
pub use error::{LoopbackError, ProcessError, PtraceError, SiteError};
