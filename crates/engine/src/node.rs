//! This node's driver stack, as the driver agent sees it.
//!
//! Every libcuda and NVML call goes through [`ccm_agent::Agent`]: CRIU's own process must never get the
//! driver's threads (see `ccm_agent`). The agent is forked at `init` and warms up by itself;
//! [`Node::load`] waits for libcuda only when a CUDA process is actually handled, and
//! [`Node::gpus`] for NVML's GPU list only where it is needed.

use std::sync::OnceLock;
use std::time::Instant;

use ccm_driver::nvml::GpuMemory;

use ccm_agent::AgentError;
use ccm_driver::procfs::ProcfsError;
use ccm_identity::{GpuIdentity, GpuUuid, PciAddress};
use log::{debug, info, warn};

use crate::driver_agent::DriverAgent;
use crate::error::EngineError;

pub struct Node {
    pub agent: Box<dyn DriverAgent>,
    cuinit: OnceLock<Result<(), AgentError>>,
    pub cuda_driver_version: i32,
    /// The driver offers custom storage (CUDA 13.4, driver r615): the agent copies a checkpoint's device memory.
    pub custom_storage: bool,
    /// NVML's view, waited for at first use: a dump needs it only for the identity scan, which
    /// runs during the checkpoint, so the agent's NVML start (16-19 ms) stays off the hooks' path.
    nvml: OnceLock<NvmlView>,
    /// Each GPU's memory as NVML told it when the restore's preflight asked (`None` at dump).
    memory: Option<Result<Vec<GpuMemory>, AgentError>>,
    /// NVML's answers by bus id, asked once per node: every process's validation asks the same G
    /// questions, which cost a round trip to the agent each (N x G of them for N processes before).
    at_pci: std::sync::Mutex<std::collections::BTreeMap<PciAddress, Option<GpuUuid>>>,
}

struct NvmlView {
    /// NVML answered (lookups by bus id can validate).
    ok: bool,
    driver_version: String,
    /// Every GPU NVML sees, NVML index order. Empty when NVML is unavailable.
    gpus: Vec<GpuIdentity>,
    /// Why NVML gave no list: its load error, a failed query, or the lost agent.
    error: Option<String>,
}

/// NVML's own message in an agent error (without the `NVML: ` the agent's error adds), so the
/// plugin's refusal reads as the command-line tool's.
fn nvml_error_text(e: &AgentError) -> String {
    match e {
        AgentError::Nvml(m) => m.clone(),
        other => other.to_string(),
    }
}

impl Node {
    /// Waits until the agent has loaded libcuda. NVML's GPU list comes later ([`Node::gpus`]), and
    /// so does `cuInit` ([`Node::cuinit`]).
    pub fn load(agent: Box<dyn DriverAgent>) -> Result<Node, EngineError> {
        let d = agent.driver().map_err(|e| match e {
            AgentError::NoDriver(m) => EngineError::NoDriver(m),
            other => EngineError::Agent(other),
        })?;
        info!(
            "driver: {} loaded, CUDA driver API {}{} ({:.3} s, in the driver agent, pid {})",
            d.libcuda_path,
            d.cuda_driver_version,
            if d.custom_storage { ", custom storage offered" } else { "" },
            d.load_seconds,
            d.agent_pid
        );
        Ok(Node {
            agent,
            cuinit: OnceLock::new(),
            cuda_driver_version: d.cuda_driver_version,
            custom_storage: d.custom_storage,
            nvml: OnceLock::new(),
            memory: None,
            at_pci: Default::default(),
        })
    }

    /// The node for a restore's preflight: libcuda loaded (the restore needs it), the GPUs as the
    /// kernel driver lists them in /proc (no NVML list to wait for) with each GPU's free and total
    /// memory from the kernel driver's resource manager (about 1 ms; its free memory equals NVML's to
    /// the KiB, measured: docs/BENCHMARKS.md), so that CRIU's restore does not wait for NVML's start
    /// (15-20 ms), which goes on in the agent and is needed only at the end, to validate. Where the
    /// resource manager does not answer for every GPU, one NVML query, as before. Without that /proc
    /// list (another driver, the test doubles), NVML's whole list. `kernel_gpus` reads that list
    /// (the sessions pass `Targets::kernel_gpus`); it is asked once libcuda is loaded.
    ///
    /// Without `need_memory` (the free-memory check is off), NVML is not waited for at all: the GPUs'
    /// totals stay unknown (0), which the map rules do not hold against a GPU of the same chip.
    pub fn load_for_restore(
        agent: Box<dyn DriverAgent>,
        need_memory: bool,
        kernel_gpus: impl FnOnce() -> Result<Vec<GpuIdentity>, ProcfsError>,
    ) -> Result<Node, EngineError> {
        let t0 = Instant::now();
        let mut node = Node::load(agent)?;
        let listed = match kernel_gpus() {
            Ok(g) => g,
            Err(e) => {
                debug!("the kernel driver's GPU list is not usable ({e}); NVML's list instead");
                return Ok(node);
            }
        };
        if !need_memory {
            info!(
                "GPUs from {} ({:.3} s; NVML not waited for)",
                ccm_driver::procfs::GPUS_DIR,
                t0.elapsed().as_secs_f64()
            );
            for (i, g) in listed.iter().enumerate() {
                info!("  GPU {i}: {} {} {} minor {}", g.uuid, g.pci, g.name, g.minor);
            }
            let _ = node.nvml.set(NvmlView { ok: true, driver_version: String::new(), gpus: listed, error: None });
            return Ok(node);
        }
        if let Some((gpus, memory)) = memory_from_rm(&*node.agent, &listed) {
            info!(
                "GPUs from {} with the resource manager's memory ({:.3} s; NVML not waited for)",
                ccm_driver::procfs::GPUS_DIR,
                t0.elapsed().as_secs_f64()
            );
            for (i, g) in gpus.iter().enumerate() {
                info!("  GPU {i}: {} {} {} minor {} {} MiB", g.uuid, g.pci, g.name, g.minor, g.memory_total >> 20);
            }
            let _ = node.nvml.set(NvmlView { ok: true, driver_version: String::new(), gpus, error: None });
            node.memory = Some(Ok(memory));
            return Ok(node);
        }
        let memory = node.agent.device_memory();
        let view = match &memory {
            Ok(m) => {
                let gpus: Vec<GpuIdentity> = listed
                    .into_iter()
                    .map(|mut g| {
                        g.memory_total = m.iter().find(|x| x.gpu == g.uuid).and_then(|x| x.total).unwrap_or(0);
                        g
                    })
                    .collect();
                NvmlView { ok: true, driver_version: String::new(), gpus, error: None }
            }
            Err(e) => {
                // Without NVML the restore cannot be validated: the preflight refuses, saying why.
                warn!("NVML through the driver agent: {e}");
                NvmlView { ok: false, driver_version: String::new(), gpus: Vec::new(), error: Some(nvml_error_text(e)) }
            }
        };
        info!("GPUs from {} with NVML's memory ({:.3} s)", ccm_driver::procfs::GPUS_DIR, t0.elapsed().as_secs_f64());
        for (i, g) in view.gpus.iter().enumerate() {
            info!("  GPU {i}: {} {} {} minor {} {} MiB", g.uuid, g.pci, g.name, g.minor, g.memory_total >> 20);
        }
        let _ = node.nvml.set(view);
        node.memory = Some(memory);
        Ok(node)
    }

    /// Each GPU's memory now: from the preflight's query when there was one, else asked (NVML).
    pub fn memory(&self) -> Result<Vec<GpuMemory>, AgentError> {
        match &self.memory {
            Some(m) => m.clone(),
            None => self.agent.device_memory(),
        }
    }

    fn nvml(&self) -> &NvmlView {
        self.nvml.get_or_init(|| {
            let view = match self.agent.node().map(|n| n.nvml) {
                Ok(Ok(v)) => {
                    if let Some(e) = &v.gpus_error {
                        warn!("NVML lists no GPUs: {e}");
                    }
                    info!("NVML: driver {}, {} GPU(s) ({:.3} s)", v.driver_version, v.gpus.len(), v.seconds);
                    NvmlView { ok: true, driver_version: v.driver_version, gpus: v.gpus, error: v.gpus_error }
                }
                Ok(Err(e)) => {
                    warn!("{e}");
                    NvmlView { ok: false, driver_version: String::new(), gpus: Vec::new(), error: Some(e.to_string()) }
                }
                Err(e) => {
                    warn!("NVML through the driver agent: {e}");
                    NvmlView {
                        ok: false,
                        driver_version: String::new(),
                        gpus: Vec::new(),
                        error: Some(nvml_error_text(&e)),
                    }
                }
            };
            for (i, g) in view.gpus.iter().enumerate() {
                info!("  GPU {i}: {} {} {} minor {} {} MiB", g.uuid, g.pci, g.name, g.minor, g.memory_total >> 20);
            }
            view
        })
    }

    /// Every GPU NVML sees, NVML index order (empty without NVML); waits for NVML the first time.
    pub fn gpus(&self) -> &[GpuIdentity] {
        &self.nvml().gpus
    }

    /// The kernel driver's version as NVML reports it (empty without NVML).
    pub fn driver_version(&self) -> &str {
        &self.nvml().driver_version
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
        self.gpus().iter().find(|g| &g.uuid == uuid)
    }

    pub fn gpu_by_minor(&self, minor: u32) -> Option<&GpuIdentity> {
        self.gpus().iter().find(|g| g.minor == minor)
    }

    /// NVML's answer for "which GPU is at `pci`" (`None` for Not Found or without NVML).
    pub fn uuid_at_pci(&self, pci: &PciAddress) -> Option<GpuUuid> {
        if !self.nvml().ok {
            return None;
        }
        if let Some(known) = self.at_pci.lock().unwrap_or_else(|p| p.into_inner()).get(pci) {
            return *known;
        }
        match self.agent.uuid_at_pci(*pci) {
            Ok(u) => {
                self.at_pci.lock().unwrap_or_else(|p| p.into_inner()).insert(*pci, u);
                u
            }
            // Not kept: a later question may get an answer.
            Err(e) => {
                // The restore's preflight did not wait for NVML: its failure shows here, where it is needed.
                warn!("NVML through the driver agent, asked which GPU is at {pci}: {e}");
                None
            }
        }
    }
}

/// How long the preflight waits for the resource manager's memory before it asks NVML instead.
const RM_MEMORY_DEADLINE: std::time::Duration = std::time::Duration::from_secs(2);

/// The listed GPUs with their totals, and each one's memory, from the resource manager; `None` (NVML is
/// asked instead) when it cannot be asked or does not report every listed GPU.
fn memory_from_rm(agent: &dyn DriverAgent, listed: &[GpuIdentity]) -> Option<(Vec<GpuIdentity>, Vec<GpuMemory>)> {
    let report = match agent.framebuffer(RM_MEMORY_DEADLINE) {
        Ok(r) => r,
        Err(e) => {
            debug!("free memory from the resource manager: {e}; NVML's instead");
            return None;
        }
    };
    let mut gpus = Vec::new();
    let mut memory = Vec::new();
    for g in listed {
        let Some(fb) = report.gpus.iter().find(|f| f.pci == g.pci) else {
            debug!("the resource manager reports no memory of GPU {} at {}; NVML's instead", g.uuid, g.pci);
            return None;
        };
        gpus.push(GpuIdentity { memory_total: fb.total, ..g.clone() });
        memory.push(GpuMemory {
            gpu: g.uuid,
            free: Some(fb.free),
            total: Some(fb.total),
            processes: Vec::new(),
            error: None,
        });
    }
    Some((gpus, memory))
}

/// The plugin's view for the one preflight: the GPUs and memory the agent's NVML (or the kernel
/// driver's list) gave, the driver API version libcuda gave.
impl crate::preflight::NodeView for Node {
    fn gpus(&self) -> &[GpuIdentity] {
        Node::gpus(self)
    }
    fn free_memory(&self) -> Result<Vec<(GpuUuid, Option<u64>)>, crate::preflight::FreeMemoryError> {
        Ok(self.memory()?.into_iter().map(|g| (g.gpu, g.free)).collect())
    }
    fn cuda_driver_version(&self) -> i32 {
        self.cuda_driver_version
    }
    fn nvml_error(&self) -> Option<String> {
        self.nvml().error.clone()
    }
}
