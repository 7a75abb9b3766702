//! The driver agent's seam: every call the sessions make on the driver agent ([`DriverAgent`], one
//! for one with `ccm_agent::Agent`'s) and how one is started ([`AgentStarter`]), with the real
//! implementations over `ccm_agent` ([`RealAgents`], `impl DriverAgent for Agent`); the tests script
//! fakes of both (`crate::fake`). It lies below the node ([`crate::node::Node`] holds an agent) and
//! the process seam ([`crate::seam`], whose [`crate::seam::Seams`] carries a starter and which
//! re-exports these names).

use std::time::Duration;

use ccm_agent::{Agent, AgentError, CuInitInfo, DriverInfo, Lost, NodeInfo, WarmUp};
use ccm_driver::checkpoint::ProcessState;
use ccm_driver::nvml::GpuMemory;
use ccm_driver::rm::{FramebufferReport, PidMemoryReport};
use ccm_identity::staging::DriverStorage;
use ccm_identity::{GpuUuid, HostPid, HostTid, PciAddress};

use crate::config::Config;
use crate::error::EngineError;
use crate::host::CriuHost;

/// Every call the sessions make on the driver agent (`ccm_agent::Agent`'s, one for one).
pub trait DriverAgent: Send + Sync {
    fn driver(&self) -> Result<DriverInfo, AgentError>;
    fn node(&self) -> Result<NodeInfo, AgentError>;
    fn cuinit(&self) -> Result<CuInitInfo, AgentError>;
    fn restore_thread_id(&self, pid: HostPid) -> Result<HostTid, AgentError>;
    fn restore_thread_id_within(&self, pid: HostPid, deadline: Duration) -> Result<HostTid, AgentError>;
    fn state(&self, pid: HostPid) -> Result<ProcessState, AgentError>;
    fn state_within(&self, pid: HostPid, deadline: Duration) -> Result<ProcessState, AgentError>;
    fn lock(&self, pid: HostPid, timeout_ms: u32, deadline: Duration) -> Result<(), AgentError>;
    fn checkpoint(&self, pid: HostPid, deadline: Duration) -> Result<(), AgentError>;
    fn restore(&self, pid: HostPid, pairs: &[(GpuUuid, GpuUuid)], deadline: Duration) -> Result<(), AgentError>;
    fn unlock(&self, pid: HostPid) -> Result<(), AgentError>;
    /// A successful dump hands its processes to CRIU: the agent puts back any CRIU resumes instead of ending it.
    fn hand_over(&self) -> Result<(), AgentError>;
    /// The checkpoint of `pid` to the driver's custom storage (CUDA 13.4), copied by the agent into the empty page
    /// file at `page_file` (absolute, in CRIU's mount namespace); its table.
    fn checkpoint_to_storage(
        &self,
        pid: HostPid,
        page_file: &str,
        deadline: Duration,
    ) -> Result<DriverStorage, AgentError>;
    /// The restore of `pid` from the driver's custom storage, filled from `page_file` by `storage`.
    fn restore_from_storage(
        &self,
        pid: HostPid,
        pairs: &[(GpuUuid, GpuUuid)],
        page_file: &str,
        storage: &DriverStorage,
        deadline: Duration,
    ) -> Result<(), AgentError>;
    /// Tells the agent that `pid`'s staging pages are in `page_file` and about to be released in the task
    /// (`crate::staging`): should CRIU go away, it fills them back before it puts the process back.
    fn staging_released(
        &self,
        pid: HostPid,
        page_file: &str,
        table: &ccm_identity::staging::StagingTable,
    ) -> Result<(), AgentError>;
    fn uuid_at_pci(&self, pci: PciAddress) -> Result<Option<GpuUuid>, AgentError>;
    fn device_memory(&self) -> Result<Vec<GpuMemory>, AgentError>;
    /// What each of `pids` holds on every GPU by the kernel driver's resource manager (CUDA IPC imports
    /// included), answered within `deadline`.
    fn video_memory(&self, pids: &[HostPid], deadline: Duration) -> Result<PidMemoryReport, AgentError>;
    /// Every GPU's free and total memory by the resource manager, answered within `deadline`.
    fn framebuffer(&self, deadline: Duration) -> Result<FramebufferReport, AgentError>;
    /// Why the agent is no longer usable, once it is not.
    fn lost(&self) -> Option<Lost>;
    /// Lets the agent end by itself once told to exit.
    fn exit_without_waiting(&self);
}

/// Starts a driver agent (at `init`, and for the dump's put-back after a lost one).
pub trait AgentStarter: Send + Sync {
    fn start(&self, host: &dyn CriuHost, config: &Config, order: WarmUp) -> Result<Box<dyn DriverAgent>, EngineError>;
}

/// Starts the driver agent for this CRIU run, keeping CRIU's log open in it, with the driver
/// libraries of the configuration.
pub fn spawn_agent(host: &dyn CriuHost, config: &Config, order: WarmUp) -> Result<Agent, EngineError> {
    let keep: Vec<i32> = host.log_fd().into_iter().collect();
    Agent::spawn(&keep, &config.driver_libs(), order).map_err(EngineError::Agent)
}

/// [`AgentStarter`] that forks the real driver agent.
#[derive(Debug, Default)]
pub struct RealAgents;

impl AgentStarter for RealAgents {
    fn start(&self, host: &dyn CriuHost, config: &Config, order: WarmUp) -> Result<Box<dyn DriverAgent>, EngineError> {
        Ok(Box::new(spawn_agent(host, config, order)?))
    }
}

impl DriverAgent for Agent {
    fn driver(&self) -> Result<DriverInfo, AgentError> {
        Agent::driver(self)
    }
    fn node(&self) -> Result<NodeInfo, AgentError> {
        Agent::node(self)
    }
    fn cuinit(&self) -> Result<CuInitInfo, AgentError> {
        Agent::cuinit(self)
    }
    fn restore_thread_id(&self, pid: HostPid) -> Result<HostTid, AgentError> {
        Agent::restore_thread_id(self, pid)
    }
    fn restore_thread_id_within(&self, pid: HostPid, deadline: Duration) -> Result<HostTid, AgentError> {
        Agent::restore_thread_id_within(self, pid, deadline)
    }
    fn state(&self, pid: HostPid) -> Result<ProcessState, AgentError> {
        Agent::state(self, pid)
    }
    fn state_within(&self, pid: HostPid, deadline: Duration) -> Result<ProcessState, AgentError> {
        Agent::state_within(self, pid, deadline)
    }
    fn lock(&self, pid: HostPid, timeout_ms: u32, deadline: Duration) -> Result<(), AgentError> {
        Agent::lock(self, pid, timeout_ms, deadline)
    }
    fn checkpoint(&self, pid: HostPid, deadline: Duration) -> Result<(), AgentError> {
        Agent::checkpoint(self, pid, deadline)
    }
    fn restore(&self, pid: HostPid, pairs: &[(GpuUuid, GpuUuid)], deadline: Duration) -> Result<(), AgentError> {
        Agent::restore(self, pid, pairs, deadline)
    }
    fn unlock(&self, pid: HostPid) -> Result<(), AgentError> {
        Agent::unlock(self, pid)
    }
    fn hand_over(&self) -> Result<(), AgentError> {
        Agent::hand_over(self)
    }
    fn checkpoint_to_storage(
        &self,
        pid: HostPid,
        page_file: &str,
        deadline: Duration,
    ) -> Result<DriverStorage, AgentError> {
        Agent::checkpoint_to_storage(self, pid, page_file, deadline)
    }
    fn restore_from_storage(
        &self,
        pid: HostPid,
        pairs: &[(GpuUuid, GpuUuid)],
        page_file: &str,
        storage: &DriverStorage,
        deadline: Duration,
    ) -> Result<(), AgentError> {
        Agent::restore_from_storage(self, pid, pairs, page_file, storage, deadline)
    }
    fn staging_released(
        &self,
        pid: HostPid,
        page_file: &str,
        table: &ccm_identity::staging::StagingTable,
    ) -> Result<(), AgentError> {
        Agent::staging_released(self, pid, page_file, table)
    }
    fn uuid_at_pci(&self, pci: PciAddress) -> Result<Option<GpuUuid>, AgentError> {
        Agent::uuid_at_pci(self, pci)
    }
    fn device_memory(&self) -> Result<Vec<GpuMemory>, AgentError> {
        Agent::device_memory(self)
    }
    fn video_memory(&self, pids: &[HostPid], deadline: Duration) -> Result<PidMemoryReport, AgentError> {
        Agent::video_memory(self, pids, deadline)
    }
    fn framebuffer(&self, deadline: Duration) -> Result<FramebufferReport, AgentError> {
        Agent::framebuffer(self, deadline)
    }
    fn lost(&self) -> Option<Lost> {
        Agent::lost(self)
    }
    fn exit_without_waiting(&self) {
        Agent::exit_without_waiting(self)
    }
}

/// The put-back of a process checkpointed to the driver's custom storage: its restore fills it from its page file.
pub struct FromStorage<'a> {
    pub agent: &'a dyn DriverAgent,
    pub page_file: &'a str,
    pub storage: &'a DriverStorage,
}

impl ccm_driver::checkpoint::PutBackCalls for FromStorage<'_> {
    type Error = AgentError;
    fn restore_in_place(&self, pid: HostPid, deadline: Duration) -> Result<(), AgentError> {
        self.agent.restore_from_storage(pid, &[], self.page_file, self.storage, deadline)
    }
    fn unlock(&self, pid: HostPid) -> Result<(), AgentError> {
        self.agent.unlock(pid)
    }
}

/// The put-back of `ccm_driver::checkpoint` through whichever agent the session holds.
impl ccm_driver::checkpoint::PutBackCalls for dyn DriverAgent + '_ {
    type Error = AgentError;
    fn restore_in_place(&self, pid: HostPid, deadline: Duration) -> Result<(), AgentError> {
        self.restore(pid, &[], deadline)
    }
    fn unlock(&self, pid: HostPid) -> Result<(), AgentError> {
        DriverAgent::unlock(self, pid)
    }
}
