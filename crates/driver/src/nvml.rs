//! NVML through `nvml-wrapper`: the node's GPUs as [`GpuIdentity`] values, and lookups by PCI
//! location. Loaded at run time (`libnvidia-ml.so.1`, or `$CRIU_CUDA_MIGRATE_LIBNVML`).

use std::ffi::OsStr;

use ccm_identity::{GpuIdentity, GpuUuid, PciAddress};
use nvml_wrapper::error::NvmlError;

/// NVML failures, with what to do about them.
#[derive(Debug, thiserror::Error)]
pub enum NvmlFailure {
    #[error("cannot initialise NVML from {lib}: {}. Install the NVIDIA driver's libnvidia-ml.so.1 or set {}", loader_text(source), ccm_settings::LIBNVML.env)]
    Init {
        lib: String,
        #[source]
        source: NvmlError,
    },
    #[error("NVML {what} failed: {source}")]
    Query {
        what: String,
        #[source]
        source: NvmlError,
    },
    #[error("refusing to load NVML from {lib}: {why}")]
    Untrusted {
        lib: String,
        #[source]
        why: crate::libfile::LibFileError,
    },
    #[error("NVML reported GPU UUID `{0}` that is not in GPU-xxxxxxxx-... form")]
    BadUuid(String),
}

/// NVML's error, without nvml-wrapper's "a libloading error occurred" wrapper around the loader's
/// own message (which names the missing file).
fn loader_text(e: &NvmlError) -> String {
    match e {
        NvmlError::LibloadingError(inner) => {
            let mut text = inner.to_string();
            let mut src = std::error::Error::source(inner);
            while let Some(s) = src {
                text = s.to_string();
                src = s.source();
            }
            text
        }
        other => other.to_string(),
    }
}

pub struct Nvml {
    nvml: nvml_wrapper::Nvml,
}

/// One GPU's memory as NVML reports it now.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GpuMemory {
    pub gpu: GpuUuid,
    /// Free device memory in bytes.
    pub free: Option<u64>,
    /// All of its device memory, in bytes.
    #[serde(default)]
    pub total: Option<u64>,
    /// `(pid as NVML names it, used device memory)` of each compute process.
    pub processes: Vec<(u32, Option<u64>)>,
    /// What NVML could not tell, when something failed.
    pub error: Option<String>,
}

fn q(what: impl Into<String>) -> impl FnOnce(NvmlError) -> NvmlFailure {
    let what = what.into();
    move |source| NvmlFailure::Query { what, source }
}

/// The library name the driver installs; `CRIU_CUDA_MIGRATE_LIBNVML` may name another path.
pub const LIBNVML_NAME: &str = "libnvidia-ml.so.1";

impl Nvml {
    /// NVML from the library a setting names (`CRIU_CUDA_MIGRATE_LIBNVML`, read by the caller's configuration:
    /// this crate reads no environment), else the loader's search.
    pub fn init(setting: Option<&str>) -> Result<Nvml, NvmlFailure> {
        Self::init_from(setting.unwrap_or(LIBNVML_NAME))
    }

    /// NVML from `lib`: a file name for the loader's search, or a path, which must be a file only
    /// root (or this user) can change, in directories only they can change (it is loaded as root);
    /// the path is opened and checked once, and the loader maps that very file (`crate::libfile`).
    pub fn init_from(lib: &str) -> Result<Nvml, NvmlFailure> {
        let file =
            crate::libfile::open_library(lib).map_err(|why| NvmlFailure::Untrusted { lib: lib.to_string(), why })?;
        let load_path = file.map_or_else(|| lib.to_string(), |f| f.into_loader_path());
        let nvml = nvml_wrapper::Nvml::builder()
            .lib_path(OsStr::new(&load_path))
            .init()
            .map_err(|source| NvmlFailure::Init { lib: lib.to_string(), source })?;
        Ok(Nvml { nvml })
    }

    /// The kernel driver's version, e.g. "580.159.04".
    pub fn driver_version(&self) -> Result<String, NvmlFailure> {
        self.nvml.sys_driver_version().map_err(q("system driver version"))
    }

    /// The CUDA driver API version the kernel driver supports (`cuDriverGetVersion`'s value, e.g. 13000).
    pub fn cuda_driver_version(&self) -> Result<i32, NvmlFailure> {
        self.nvml.sys_cuda_driver_version().map_err(q("CUDA driver version"))
    }

    /// Every GPU NVML sees, in NVML index order.
    pub fn gpus(&self) -> Result<Vec<GpuIdentity>, NvmlFailure> {
        let n = self.nvml.device_count().map_err(q("device count"))?;
        (0..n).map(|i| self.gpu_by_index(i)).collect()
    }

    pub fn gpu_by_index(&self, index: u32) -> Result<GpuIdentity, NvmlFailure> {
        let d = self.nvml.device_by_index(index).map_err(q(format!("device {index}")))?;
        identity_of(&d, &format!("device {index}"))
    }

    /// Each GPU's free memory and the device memory of each compute process on it, now. A GPU
    /// NVML cannot tell about keeps `None` (free) or an empty list, with the reason.
    pub fn device_memory(&self) -> Result<Vec<GpuMemory>, NvmlFailure> {
        let n = self.nvml.device_count().map_err(q("device count"))?;
        let mut out = Vec::new();
        for i in 0..n {
            let d = self.nvml.device_by_index(i).map_err(q(format!("device {i}")))?;
            let uuid_text = d.uuid().map_err(q(format!("uuid of device {i}")))?;
            let gpu: GpuUuid = uuid_text.parse().map_err(|_| NvmlFailure::BadUuid(uuid_text.clone()))?;
            let mut m = GpuMemory { gpu, free: None, total: None, processes: Vec::new(), error: None };
            match d.memory_info() {
                Ok(info) => {
                    m.free = Some(info.free);
                    m.total = Some(info.total);
                }
                Err(e) => m.error = Some(format!("memory info: {e}")),
            }
            match d.running_compute_processes() {
                Ok(list) => {
                    m.processes = list
                        .into_iter()
                        .map(|p| {
                            let bytes = match p.used_gpu_memory {
                                nvml_wrapper::enums::device::UsedGpuMemory::Used(b) => Some(b),
                                nvml_wrapper::enums::device::UsedGpuMemory::Unavailable => None,
                            };
                            (p.pid, bytes)
                        })
                        .collect()
                }
                Err(e) => m.error = Some(format!("compute processes: {e}")),
            }
            out.push(m);
        }
        Ok(out)
    }

    /// The UUID of the GPU at `pci` (None when NVML knows no GPU there: "Not Found").
    pub fn uuid_at_pci(&self, pci: &PciAddress) -> Result<Option<GpuUuid>, NvmlFailure> {
        match self.nvml.device_by_pci_bus_id(pci.to_nvml_string()) {
            Ok(d) => {
                let s = d.uuid().map_err(q(format!("uuid of {pci}")))?;
                Ok(Some(s.parse().map_err(|_| NvmlFailure::BadUuid(s))?))
            }
            Err(NvmlError::NotFound) => Ok(None),
            Err(e) => Err(NvmlFailure::Query { what: format!("handle by PCI bus id {pci}"), source: e }),
        }
    }
}

fn identity_of(d: &nvml_wrapper::Device<'_>, what: &str) -> Result<GpuIdentity, NvmlFailure> {
    let uuid_text = d.uuid().map_err(q(format!("uuid of {what}")))?;
    let uuid: GpuUuid = uuid_text.parse().map_err(|_| NvmlFailure::BadUuid(uuid_text.clone()))?;
    let pci = d.pci_info().map_err(q(format!("PCI info of {what}")))?;
    let minor = d.minor_number().map_err(q(format!("minor number of {what}")))?;
    let name = d.name().map_err(q(format!("name of {what}")))?;
    let mem = d.memory_info().map_err(q(format!("memory info of {what}")))?;
    let function = PciAddress::parse(&pci.bus_id).map(|p| p.function).unwrap_or(0);
    Ok(GpuIdentity {
        uuid,
        pci: PciAddress { domain: pci.domain, bus: pci.bus, device: pci.device, function },
        pci_device_id: pci.pci_device_id,
        pci_subsystem_id: pci.pci_sub_system_id.unwrap_or(0),
        minor,
        name,
        memory_total: mem.total,
    })
}
