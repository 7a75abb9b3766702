//! The driver agent: the process that makes every libcuda and NVML call of the plugin.
//!
//! CRIU's own process must stay single-threaded: `setns` into a mount namespace fails with
//! `EINVAL` in a process whose filesystem attributes are shared with another thread, and CRIU
//! does that while it dumps or restores a container. `cuInit` starts driver threads that live as
//! long as the process. So the plugin forks this agent once per CRIU run (at `init`), before
//! CRIU has any work in flight, and talks to it over a socket pair: the driver's threads live
//! there, never in CRIU.
//!
//! What stays in CRIU's process: the ptrace of the restore threads (CRIU is their tracer, and a
//! thread has only one), and the memory work on the target (`ccm-process`), whose worker
//! threads end before each hook returns.
//!
//! - [`client::Agent`]: the plugin's handle (spawn, one method per call, exit);
//! - [`server`]: the agent's loop, warm-up (`cuInit` and NVML start at once), rollback when
//!   CRIU dies mid-dump;
//! - [`protocol`]: the frames between them;
//! - [`storage`]: the driver's custom storage (CUDA 13.4): the device memory copied by the agent itself.

#![forbid(unsafe_code)]

pub mod client;
pub mod protocol;
pub mod server;
pub mod storage;

pub use client::{Agent, AgentError, Lost, AGENT_PROCESS_NAME};
pub use protocol::{CuInitInfo, DriverInfo, DriverLibs, NodeInfo, NvmlInfo, NvmlUnavailable};
pub use server::WarmUp;
