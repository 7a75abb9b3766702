//! This node's driver stack, loaded once per CRIU run and only when a CUDA process shows up.

use std::time::Instant;

use ccm_driver::checkpoint::CheckpointApi;
use ccm_driver::nvml::Nvml;
use ccm_driver::Libcuda;
use ccm_identity::{GpuIdentity, GpuUuid};
use log::{info, warn};

use crate::EngineError;

pub struct Node {
    pub api: CheckpointApi,
    pub cuda_driver_version: i32,
    pub nvml: Option<Nvml>,
    pub driver_version: String,
    /// Every GPU NVML sees, NVML index order. Empty when NVML is unavailable.
    pub gpus: Vec<GpuIdentity>,
}

impl Node {
    /// Loads libcuda, calls `cuInit` (the process that restores another one must have) and
    /// reads the GPUs from NVML. NVML failing is not fatal here: the caller decides.
    pub fn load() -> Result<Node, EngineError> {
        let t0 = Instant::now();
        let lib = Libcuda::load().map_err(EngineError::NoDriver)?;
        let api = CheckpointApi::new(&lib).map_err(EngineError::NoDriver)?;
        lib.init().map_err(|e| EngineError::Driver { pid: 0, source: e })?;
        let cuda_driver_version = lib.driver_version().unwrap_or(0);
        info!("driver: {} loaded, cuInit done, CUDA driver API {} ({:.3} s)", lib.path(), cuda_driver_version, t0.elapsed().as_secs_f64());
        let t1 = Instant::now();
        let (nvml, driver_version, gpus) = match Nvml::init() {
            Ok(n) => {
                let v = n.driver_version().unwrap_or_default();
                match n.gpus() {
                    Ok(g) => (Some(n), v, g),
                    Err(e) => {
                        warn!("NVML lists no GPUs: {e}");
                        (Some(n), v, Vec::new())
                    }
                }
            }
            Err(e) => {
                warn!("{e}");
                (None, String::new(), Vec::new())
            }
        };
        info!("NVML: driver {driver_version}, {} GPU(s) ({:.3} s)", gpus.len(), t1.elapsed().as_secs_f64());
        for (i, g) in gpus.iter().enumerate() {
            info!("  GPU {i}: {} {} {} minor {} {} MiB", g.uuid, g.pci, g.name, g.minor, g.memory_total >> 20);
        }
        Ok(Node { api, cuda_driver_version, nvml, driver_version, gpus })
    }

    pub fn gpu(&self, uuid: &GpuUuid) -> Option<&GpuIdentity> {
        self.gpus.iter().find(|g| &g.uuid == uuid)
    }

    pub fn gpu_by_minor(&self, minor: u32) -> Option<&GpuIdentity> {
        self.gpus.iter().find(|g| g.minor == minor)
    }
}
