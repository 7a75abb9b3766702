//! This node's driver stack, loaded once per CRIU run and only when a CUDA process shows up.

use std::sync::{Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

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
    /// NVML's view of this node: started in the background by [`Node::load`], waited for on first use.
    nvml: OnceLock<NvmlView>,
    nvml_pending: Mutex<Option<JoinHandle<NvmlView>>>,
}

/// What NVML says about this node. Empty (`nvml: None`) when NVML is unavailable.
#[derive(Default)]
struct NvmlView {
    nvml: Option<Nvml>,
    driver_version: String,
    /// Every GPU NVML sees, NVML index order.
    gpus: Vec<GpuIdentity>,
    /// Why it is empty, logged by the thread that first waits for it.
    problem: Option<String>,
    elapsed: Duration,
}

impl NvmlView {
    fn read() -> NvmlView {
        let t0 = Instant::now();
        let mut view = match Nvml::init() {
            Ok(n) => {
                let driver_version = n.driver_version().unwrap_or_default();
                match n.gpus() {
                    Ok(gpus) => NvmlView { nvml: Some(n), driver_version, gpus, ..Default::default() },
                    Err(e) => NvmlView {
                        nvml: Some(n),
                        driver_version,
                        problem: Some(format!("NVML lists no GPUs: {e}")),
                        ..Default::default()
                    },
                }
            }
            Err(e) => NvmlView { problem: Some(e.to_string()), ..Default::default() },
        };
        view.elapsed = t0.elapsed();
        view
    }
}

impl Node {
    /// Loads libcuda and starts reading the GPUs from NVML in a background thread: NVML's
    /// initialisation (about 25 ms on an H200 node) then overlaps `cuInit`, the lock and CRIU's
    /// seizing of the tree instead of adding to the dump. NVML failing is not fatal here: the
    /// caller decides. `cuInit` comes later ([`Node::cuinit`]), when a process is actually handled.
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
        // The thread never logs: CRIU's logging is not thread-safe, and CRIU's own thread runs
        // while this one does. Whoever first needs the view logs what it found.
        let pending = std::thread::Builder::new().name("ccm-nvml".into()).spawn(NvmlView::read).ok();
        Ok(Node {
            lib,
            cuinit: std::sync::OnceLock::new(),
            api,
            cuda_driver_version,
            nvml: OnceLock::new(),
            nvml_pending: Mutex::new(pending),
        })
    }

    fn view(&self) -> &NvmlView {
        self.nvml.get_or_init(|| {
            let t0 = Instant::now();
            let pending = self.nvml_pending.lock().unwrap_or_else(|p| p.into_inner()).take();
            // Without a thread (spawn failed) read it here.
            let view = pending.map(|h| h.join().unwrap_or_default()).unwrap_or_else(NvmlView::read);
            if let Some(problem) = &view.problem {
                warn!("{problem}");
            }
            info!(
                "NVML: driver {}, {} GPU(s) ({:.3} s, waited {:.3} s for it)",
                view.driver_version,
                view.gpus.len(),
                view.elapsed.as_secs_f64(),
                t0.elapsed().as_secs_f64()
            );
            for (i, g) in view.gpus.iter().enumerate() {
                info!("  GPU {i}: {} {} {} minor {} {} MiB", g.uuid, g.pci, g.name, g.minor, g.memory_total >> 20);
            }
            view
        })
    }

    /// Every GPU NVML sees, in NVML index order; empty when NVML is unavailable.
    pub fn gpus(&self) -> &[GpuIdentity] {
        &self.view().gpus
    }

    pub fn nvml(&self) -> Option<&Nvml> {
        self.view().nvml.as_ref()
    }

    pub fn driver_version(&self) -> &str {
        &self.view().driver_version
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
        self.gpus().iter().find(|g| &g.uuid == uuid)
    }

    pub fn gpu_by_minor(&self, minor: u32) -> Option<&GpuIdentity> {
        self.gpus().iter().find(|g| g.minor == minor)
    }
}

impl Drop for Node {
    /// A view nobody asked for (no process turned out to need it) is still waited for, so that no
    /// thread of ours runs on inside CRIU after the plugin's exit.
    fn drop(&mut self) {
        if let Some(h) = self.nvml_pending.get_mut().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = h.join();
        }
    }
}
