//! What an identity image holds: the records, with no knowledge of their bytes ([`super::codec`]).

use crate::gpu::PciSignature;
use crate::gpu::{GpuIdentity, GpuUuid};

/// The environment variables that decide which GPUs a CUDA process sees, as they were at dump.
#[derive(Clone, PartialEq, Eq, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct ProcessEnv {
    pub cuda_visible_devices: Option<String>,
    pub cuda_device_order: Option<String>,
    pub nvidia_visible_devices: Option<String>,
}

/// One place in the process's memory where libcuda kept a GPU's six PCI words at dump.
#[derive(Clone, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
pub struct PciSite {
    /// The GPU whose signature was found there.
    pub gpu: GpuUuid,
    /// Virtual address of the first word in the process.
    pub addr: u64,
    /// Start of the mapping that holds it (from `/proc/PID/maps`).
    pub mapping_start: u64,
    /// End (exclusive) of that mapping.
    pub mapping_end: u64,
    /// The mapping's name in `/proc/PID/maps` (`[heap]`, empty for anonymous memory).
    pub mapping_name: String,
    /// The words found there (the GPU's signature at dump).
    pub words: PciSignature,
}

/// Everything the dump recorded about one CUDA process's GPU identity.
#[derive(Clone, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
pub struct IdentityImage {
    /// Pid at dump as seen in the process's own pid namespace (innermost `NSpid`).
    pub pid: u32,
    /// Pid as CRIU saw it at dump.
    pub host_pid: u32,
    /// Seconds since the Unix epoch at dump.
    pub dumped_at_unix: u64,
    pub hostname: String,
    /// NVML system driver version, e.g. "580.159.04".
    pub driver_version: String,
    /// `cuDriverGetVersion`, e.g. 13000.
    pub cuda_driver_version: i32,
    /// Every GPU the kernel driver / NVML saw on the dump node, in NVML index order.
    pub node_gpus: Vec<GpuIdentity>,
    /// GPUs the process's libcuda enumerated at its start: the restore map must pair every one.
    pub enumerated: Vec<GpuUuid>,
    /// GPUs the process used (held `/dev/nvidiaN` open), in its CUDA ordinal order when known.
    pub used: Vec<GpuUuid>,
    pub env: ProcessEnv,
    /// Where the six PCI words sat at dump.
    pub sites: Vec<PciSite>,
    /// The CUDA runtime's (and frameworks') `cudaDeviceProp` copies found at dump (version 2).
    pub prop_sites: Vec<PropSite>,
    /// Device memory the process held per GPU just before its checkpoint; `None` when NVML could
    /// not tell (or a version-1 image).
    pub device_memory: Option<Vec<DeviceMemoryUse>>,
    /// The driver's staging pages the plugin wrote to its page file instead of CRIU (version 3); `None` when CRIU
    /// wrote them (`CRIU_CUDA_MIGRATE_STAGING=criu`, no staging mapping found exactly) or an older image.
    #[serde(default)]
    pub staging: Option<crate::staging::StagingTable>,
    /// The device memory the driver agent copied out through the driver's custom storage (version 4; CUDA 13.4,
    /// driver r615): the process holds none of it, and its restore goes through the same storage. `None`: the
    /// driver staged the device memory in the process (every driver before r615).
    #[serde(default)]
    pub driver_storage: Option<crate::staging::DriverStorage>,
}

/// One `cudaDeviceProp` copy the dump identified in the process (see [`crate::devprop`]).
#[derive(Clone, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
pub struct PropSite {
    /// The GPU it described at dump.
    pub gpu: GpuUuid,
    /// Address of the struct (of `name[0]`).
    pub addr: u64,
    /// Its layout ([`crate::devprop::PropLayout::runtime_major`]).
    pub runtime_major: u16,
    pub mapping_start: u64,
    pub mapping_end: u64,
    pub mapping_name: String,
}

/// Device memory one process held on one GPU at dump (NVML's `usedGpuMemory`, which includes
/// its context).
#[derive(Clone, Copy, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
pub struct DeviceMemoryUse {
    pub gpu: GpuUuid,
    pub bytes: u64,
}

impl IdentityImage {
    /// The file name of the image of the process with this pid: `cuda-migrate-<pid>.img`.
    pub fn file_name(pid: u32) -> String {
        format!("cuda-migrate-{pid}.img")
    }

    /// The table of the process's page file, whichever wrote it: the plugin (the driver's staging pages) or the
    /// driver agent (the driver's custom storage). A forged image naming both gives the staging table (the
    /// preflight refuses it).
    pub fn page_table(&self) -> Option<&crate::staging::StagingTable> {
        self.staging.as_ref().or(self.driver_storage.as_ref().map(|d| &d.table))
    }

    /// The dump node's record of a GPU.
    pub fn gpu(&self, u: &GpuUuid) -> Option<&GpuIdentity> {
        self.node_gpus.iter().find(|g| g.uuid == *u)
    }

    /// Every string field, named as errors name it.
    pub(crate) fn strings(&self) -> Vec<(&'static str, &str)> {
        let mut out = vec![("hostname", self.hostname.as_str()), ("driver_version", self.driver_version.as_str())];
        out.extend(self.node_gpus.iter().map(|g| ("gpu.name", g.name.as_str())));
        for (field, value) in [
            ("env.cuda_visible_devices", &self.env.cuda_visible_devices),
            ("env.cuda_device_order", &self.env.cuda_device_order),
            ("env.nvidia_visible_devices", &self.env.nvidia_visible_devices),
        ] {
            out.extend(value.as_deref().map(|v| (field, v)));
        }
        out.extend(self.sites.iter().map(|s| ("site.mapping_name", s.mapping_name.as_str())));
        out.extend(self.prop_sites.iter().map(|s| ("prop_site.mapping_name", s.mapping_name.as_str())));
        out
    }

    /// Escapes the control characters of every string field (`\n` for a newline): what the dump
    /// read from places it does not control (the hostname, another process's maps and environment)
    /// never reaches an image, a log or a terminal raw. Returns whether anything changed.
    pub fn escape_controls(&mut self) -> bool {
        let mut changed = false;
        let mut fix = |s: &mut String| {
            if crate::text::has_control(s) {
                *s = crate::text::escaped(s);
                changed = true;
            }
        };
        fix(&mut self.hostname);
        fix(&mut self.driver_version);
        self.node_gpus.iter_mut().for_each(|g| fix(&mut g.name));
        for v in
            [&mut self.env.cuda_visible_devices, &mut self.env.cuda_device_order, &mut self.env.nvidia_visible_devices]
                .into_iter()
                .flatten()
        {
            fix(v);
        }
        self.sites.iter_mut().for_each(|s| fix(&mut s.mapping_name));
        self.prop_sites.iter_mut().for_each(|s| fix(&mut s.mapping_name));
        changed
    }
}
