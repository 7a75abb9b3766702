//! This node's driver stack, as the driver agent sees it.
//!
//! Every libcuda and NVML call goes through [`Agent`]: CRIU's own process must never get the
//! driver's threads (see `ccm_agent`). The agent is forked at `init` and warms up by itself;
//! [`Node::load`] waits for its GPU list only when a CUDA process is actually handled.

use std::sync::OnceLock;

use ccm_agent::{Agent, AgentError};
use ccm_identity::{GpuIdentity, GpuUuid, PciAddress};
use log::{info, warn};

use crate::host::CriuHost;
use crate::EngineError;

pub struct Node {
    pub agent: Agent,
    cuinit: OnceLock<Result<(), AgentError>>,
    pub cuda_driver_version: i32,
    /// NVML answered (lookups by bus id can validate).
    pub nvml_ok: bool,
    pub driver_version: String,
    /// Every GPU NVML sees, NVML index order. Empty when NVML is unavailable.
    pub gpus: Vec<GpuIdentity>,
}

/// Starts the driver agent for this CRIU run, keeping CRIU's log open in it.
pub fn spawn_agent(host: &dyn CriuHost) -> Result<Agent, EngineError> {
    let keep: Vec<i32> = host.log_fd().into_iter().collect();
    Agent::spawn(&keep).map_err(EngineError::Agent)
}

impl Node {
    /// Waits until the agent has loaded libcuda and listed the GPUs. NVML failing is not fatal
    /// here: the caller decides. `cuInit` is awaited later ([`Node::cuinit`]).
    pub fn load(agent: Agent) -> Result<Node, EngineError> {
        let n = agent.node().map_err(|e| match e {
            AgentError::NoDriver(m) => EngineError::NoDriver(m),
            other => EngineError::Agent(other),
        })?;
        info!(
            "driver: {} loaded, CUDA driver API {} ({:.3} s, in the driver agent, pid {})",
            n.driver.libcuda_path, n.driver.cuda_driver_version, n.driver.load_seconds, n.driver.agent_pid
        );
        let (nvml_ok, driver_version, gpus) = match n.nvml {
            Ok(v) => {
                if let Some(e) = &v.gpus_error {
                    warn!("NVML lists no GPUs: {e}");
                }
                info!("NVML: driver {}, {} GPU(s) ({:.3} s)", v.driver_version, v.gpus.len(), v.seconds);
                (true, v.driver_version, v.gpus)
            }
            Err(e) => {
                warn!("{e}");
                (false, String::new(), Vec::new())
            }
        };
        for (i, g) in gpus.iter().enumerate() {
            info!("  GPU {i}: {} {} {} minor {} {} MiB", g.uuid, g.pci, g.name, g.minor, g.memory_total >> 20);
        }
        Ok(Node {
            agent,
            cuinit: OnceLock::new(),
            cuda_driver_version: n.driver.cuda_driver_version,
            nvml_ok,
            driver_version,
            gpus,
        })
    }

    /// The agent's `cuInit(0)`, which it started at its own start: the driver requires it in the
    /// process that checkpoints or restores another one. The log line says how long CRIU waited.
    pub fn cuinit(&self) -> Result<(), AgentError> {
        self.cuinit
            .get_or_init(|| {
                let r = self.agent.cuinit();
                if let Ok(c) = &r {
                    info!(
                        "cuInit {:.3} s in the driver agent (started at init; this hook waited {:.3} s for it)",
                        c.seconds, c.waited_seconds
                    );
                }
                r.map(|_| ())
            })
            .clone()
    }

    pub fn gpu(&self, uuid: &GpuUuid) -> Option<&GpuIdentity> {
        self.gpus.iter().find(|g| &g.uuid == uuid)
    }

    pub fn gpu_by_minor(&self, minor: u32) -> Option<&GpuIdentity> {
        self.gpus.iter().find(|g| g.minor == minor)
    }

    /// NVML's answer for "which GPU is at `pci`" (`None` for Not Found or without NVML).
    pub fn uuid_at_pci(&self, pci: &PciAddress) -> Option<GpuUuid> {
        if !self.nvml_ok {
            return None;
        }
        self.agent.uuid_at_pci(*pci).ok().flatten()
    }
}
