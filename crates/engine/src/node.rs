//! This node's driver stack, loaded once per CRIU run and only when a CUDA process shows up.

use std::time::Instant;

use ccm_driver::checkpoint::CheckpointApi;
use ccm_driver::nvml::Nvml;
use ccm_driver::Libcuda;
use ccm_identity::{GpuIdentity, GpuUuid};
use log::{info, warn};

use crate::EngineError;

pub struct Node {
    lib: Libcuda,
    cuinit: std::sync::OnceLock<Result<(), ccm_driver::CudaError>>,
    pub api: CheckpointApi,
    pub cuda_driver_version: i32,
    pub nvml: Option<Nvml>,
    pub driver_version: String,
    /// Every GPU NVML sees, NVML index order. Empty when NVML is unavailable.
    pub gpus: Vec<GpuIdentity>,
}

impl Node {
    /// Loads libcuda and reads the GPUs from NVML. NVML failing is not fatal here: the caller
    /// decides. `cuInit` comes later ([`Node::cuinit`]), when a process is actually handled.
    pub fn load() -> Result<Node, EngineError> {
        let t0 = Instant::now();
        let lib = Libcuda::load().map_err(EngineError::NoDriver)?;
        let api = CheckpointApi::new(&lib).map_err(EngineError::NoDriver)?;
        let cuda_driver_version = lib.driver_version().unwrap_or(0);
        info!(
            "driver: {} loaded, CUDA driver API {} ({:.3} s)",
            lib.path(),
            cuda_driver_version,
            t0.elapsed().as_secs_f64()
        );
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
        Ok(Node { lib, cuinit: std::sync::OnceLock::new(), api, cuda_driver_version, nvml, driver_version, gpus })
    }

    /// `cuInit(0)` once per CRIU run: the driver requires it in the process that restores
    /// another one. At restore it runs only after CRIU has forked every task, so no restored
    /// task inherits driver state from CRIU.
    pub fn cuinit(&self) -> Result<(), ccm_driver::CudaError> {
        self.cuinit
            .get_or_init(|| {
                let t0 = Instant::now();
                let r = self.lib.init();
                info!("cuInit {:.3} s", t0.elapsed().as_secs_f64());
                r
            })
            .clone()
    }

    pub fn gpu(&self, uuid: &GpuUuid) -> Option<&GpuIdentity> {
        self.gpus.iter().find(|g| &g.uuid == uuid)
    }

    pub fn gpu_by_minor(&self, minor: u32) -> Option<&GpuIdentity> {
        self.gpus.iter().find(|g| g.minor == minor)
    }
}
