//! The simulated GPU set, read from the JSON file named by `CCM_SIM_CONFIG`.
//!
//! Example (every field but `gpus` is optional):
//!
//! ```json
//! {
//!   "driver_version": "580.159.04",
//!   "cuda_driver_version": 13000,
//!   "gpus": [
//!     { "uuid": "GPU-11111111-2222-3333-4444-555555555555", "pci_bus_id": "0000:06:00.0",
//!       "pci_device_id": "0x233510de", "pci_subsystem_id": "0x18bf10de", "minor": 0,
//!       "name": "NVIDIA H200", "memory_total": 150754820096 }
//!   ]
//! }
//! ```

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::Deserialize;

use crate::SimError;

/// Environment variable naming the GPU set file.
pub const ENV_CONFIG: &str = "CCM_SIM_CONFIG";

/// A GPU's 16-byte UUID in NVML's text form `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
///
/// The doubles keep their own copy of this type so they build independently of the product crates.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SimUuid(pub [u8; 16]);

impl fmt::Display for SimUuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("GPU-")?;
        for (i, b) in self.0.iter().enumerate() {
            if matches!(i, 4 | 6 | 8 | 10) {
                f.write_str("-")?;
            }
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for SimUuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for SimUuid {
    type Err = SimError;
    /// Accepts `GPU-` and 32 hex digits, dashes anywhere (NVML's form), case-insensitive.
    fn from_str(s: &str) -> Result<Self, SimError> {
        let bad = || SimError::BadUuid(s.to_string());
        let t = s.trim();
        let hex = t.strip_prefix("GPU-").or_else(|| t.strip_prefix("gpu-")).ok_or_else(bad)?;
        let digits: Vec<u8> = hex.bytes().filter(|&c| c != b'-').collect();
        if digits.len() != 32 {
            return Err(bad());
        }
        let mut out = [0u8; 16];
        for (slot, pair) in out.iter_mut().zip(digits.chunks(2)) {
            let text = std::str::from_utf8(pair).map_err(|_| bad())?;
            *slot = u8::from_str_radix(text, 16).map_err(|_| bad())?;
        }
        Ok(SimUuid(out))
    }
}

/// A PCI location `domain:bus:device.function`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct SimPci {
    pub domain: u32,
    pub bus: u32,
    pub device: u32,
}

impl SimPci {
    /// Parses `D:B:DEV.F`, `D:B:DEV` or `B:DEV.F` in hex of any width and case, as NVML accepts
    /// (`0000:06:00.0` and `00000000:06:00.0` name the same GPU). Only function 0 exists on GPUs.
    pub fn parse(text: &str) -> Option<SimPci> {
        let t = text.trim();
        let (head, function) = match t.rsplit_once('.') {
            Some((h, f)) => (h, u32::from_str_radix(f, 16).ok()?),
            None => (t, 0),
        };
        let num = |p: &str| if p.is_empty() { None } else { u32::from_str_radix(p, 16).ok() };
        let parts: Vec<&str> = head.split(':').collect();
        let (domain, bus, device) = match parts.as_slice() {
            [d, b, dev] => (num(d)?, num(b)?, num(dev)?),
            [b, dev] => (0, num(b)?, num(dev)?),
            _ => return None,
        };
        if bus > 0xff || device > 0x1f || function != 0 {
            return None;
        }
        Some(SimPci { domain, bus, device })
    }

    /// CUDA's `cuDeviceGetPCIBusId` form and NVML's `busIdLegacy`: `0000:06:00.0`, upper-case hex
    /// like the real driver.
    pub fn to_cuda_string(&self) -> String {
        format!("{:04X}:{:02X}:{:02X}.0", self.domain, self.bus, self.device)
    }

    /// NVML's `busId` form: `00000000:06:00.0`.
    pub fn to_nvml_string(&self) -> String {
        format!("{:08X}:{:02X}:{:02X}.0", self.domain, self.bus, self.device)
    }
}

/// One simulated GPU.
///
/// `repr(C)` with the PCI words NOT in libcuda's order `{domain, bus, device, 0, id, subsystem}`
/// (no zero word after `pci_device`): the doubles' own bookkeeping must never look like one of the
/// stale-identity sites the plugin scans for, or tests would count phantom sites.
#[repr(C)]
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct SimGpu {
    pub uuid: SimUuid,
    pub name: String,
    pub memory_total: u64,
    pub minor: u32,
    pub pci_domain: u32,
    pub pci_bus: u32,
    pub pci_device: u32,
    pub pci_device_id: u32,
    pub pci_subsystem_id: u32,
}

impl SimGpu {
    pub fn pci(&self) -> SimPci {
        SimPci { domain: self.pci_domain, bus: self.pci_bus, device: self.pci_device }
    }

    /// The six words libcuda caches per GPU: `{domain, bus, device, 0, pciDeviceId, pciSubSystemId}`.
    pub fn pci_words(&self) -> [u32; 6] {
        [self.pci_domain, self.pci_bus, self.pci_device, 0, self.pci_device_id, self.pci_subsystem_id]
    }
}

/// The whole simulated machine.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct SimConfig {
    /// What `nvmlSystemGetDriverVersion` answers.
    pub driver_version: String,
    /// What `cuDriverGetVersion` and `nvmlSystemGetCudaDriverVersion` answer (13000 = CUDA 13.0).
    pub cuda_driver_version: i32,
    /// Every GPU the simulated kernel driver has, in its enumeration order (NVML index order).
    pub gpus: Vec<SimGpu>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default = "default_driver_version")]
    driver_version: String,
    #[serde(default = "default_cuda_version")]
    cuda_driver_version: i32,
    gpus: Vec<RawGpu>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGpu {
    uuid: String,
    pci_bus_id: String,
    pci_device_id: HexOrNumber,
    pci_subsystem_id: HexOrNumber,
    minor: u32,
    #[serde(default = "default_name")]
    name: String,
    #[serde(default = "default_memory")]
    memory_total: u64,
}

/// Ids are easier to read in hex: accept `"0x233510de"` as well as a plain number.
#[derive(Deserialize)]
#[serde(untagged)]
enum HexOrNumber {
    Number(u32),
    Text(String),
}

impl HexOrNumber {
    fn value(&self, field: &str, gpu: usize) -> Result<u32, SimError> {
        match self {
            HexOrNumber::Number(n) => Ok(*n),
            HexOrNumber::Text(t) => {
                let digits = t.trim().trim_start_matches("0x").trim_start_matches("0X");
                u32::from_str_radix(digits, 16).map_err(|_| SimError::BadConfig {
                    what: format!("gpus[{gpu}].{field} = {t:?} is not a 32-bit hex number; write e.g. \"0x233510de\""),
                })
            }
        }
    }
}

fn default_driver_version() -> String {
    "580.159.04".to_string()
}
fn default_cuda_version() -> i32 {
    13000
}
fn default_name() -> String {
    "NVIDIA H200".to_string()
}
fn default_memory() -> u64 {
    150_754_820_096
}

impl SimConfig {
    /// Parses the JSON text of a GPU set and checks it (unique UUIDs, bus ids and minors).
    pub fn from_json(text: &str) -> Result<SimConfig, SimError> {
        let raw: RawConfig =
            serde_json::from_str(text).map_err(|e| SimError::BadConfig { what: format!("invalid JSON: {e}") })?;
        let mut gpus = Vec::with_capacity(raw.gpus.len());
        for (i, g) in raw.gpus.iter().enumerate() {
            let uuid: SimUuid = g.uuid.parse()?;
            let pci = SimPci::parse(&g.pci_bus_id).ok_or_else(|| SimError::BadConfig {
                what: format!(
                    "gpus[{i}].pci_bus_id = {:?} is not a PCI address; write e.g. \"0000:06:00.0\"",
                    g.pci_bus_id
                ),
            })?;
            gpus.push(SimGpu {
                uuid,
                name: g.name.clone(),
                memory_total: g.memory_total,
                minor: g.minor,
                pci_domain: pci.domain,
                pci_bus: pci.bus,
                pci_device: pci.device,
                pci_device_id: g.pci_device_id.value("pci_device_id", i)?,
                pci_subsystem_id: g.pci_subsystem_id.value("pci_subsystem_id", i)?,
            });
        }
        for (i, a) in gpus.iter().enumerate() {
            for b in &gpus[i + 1..] {
                if a.uuid == b.uuid || a.pci() == b.pci() || a.minor == b.minor {
                    return Err(SimError::BadConfig {
                        what: format!(
                            "GPUs {} and {} share a UUID, PCI address or minor number; give every GPU its own",
                            a.uuid, b.uuid
                        ),
                    });
                }
            }
        }
        Ok(SimConfig { driver_version: raw.driver_version, cuda_driver_version: raw.cuda_driver_version, gpus })
    }

    /// Reads and parses a GPU set file.
    pub fn load(path: &Path) -> Result<SimConfig, SimError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| SimError::Io { what: format!("read the GPU set file {}", path.display()), source })?;
        SimConfig::from_json(&text)
    }

    /// Reads the GPU set named by `CCM_SIM_CONFIG`.
    pub fn from_env() -> Result<SimConfig, SimError> {
        let path = std::env::var_os(ENV_CONFIG).map(PathBuf::from).ok_or(SimError::NoConfig)?;
        SimConfig::load(&path)
    }

    pub fn gpu_by_uuid(&self, uuid: &SimUuid) -> Option<usize> {
        self.gpus.iter().position(|g| &g.uuid == uuid)
    }

    /// The JSON text of this GPU set (for tests that write a config file).
    pub fn to_json(&self) -> String {
        let gpus: Vec<serde_json::Value> = self
            .gpus
            .iter()
            .map(|g| {
                serde_json::json!({
                    "uuid": g.uuid.to_string(),
                    "pci_bus_id": g.pci().to_cuda_string(),
                    "pci_device_id": format!("0x{:08x}", g.pci_device_id),
                    "pci_subsystem_id": format!("0x{:08x}", g.pci_subsystem_id),
                    "minor": g.minor,
                    "name": g.name,
                    "memory_total": g.memory_total,
                })
            })
            .collect();
        serde_json::json!({
            "driver_version": self.driver_version,
            "cuda_driver_version": self.cuda_driver_version,
            "gpus": gpus,
        })
        .to_string()
    }

    /// The machine of GPU-FACTS.md with made-up UUIDs: two H200 at `0000:06:00.0` (minor 0) and
    /// `0000:07:00.0` (minor 1). Memory is kept small so tests can allocate freely.
    pub fn two_h200() -> SimConfig {
        let gpu = |n: u8, bus: u32| SimGpu {
            uuid: SimUuid([0x5e, 0x11, 0, n, 0xaa, 0xbb, 0xcc, 0xdd, 0, 1, 2, 3, 4, 5, 6, n]),
            name: "NVIDIA H200".to_string(),
            memory_total: 1 << 30,
            minor: u32::from(n),
            pci_domain: 0,
            pci_bus: bus,
            pci_device: 0,
            pci_device_id: 0x2335_10de,
            pci_subsystem_id: 0x18bf_10de,
        };
        SimConfig {
            driver_version: default_driver_version(),
            cuda_driver_version: default_cuda_version(),
            gpus: vec![gpu(0, 6), gpu(1, 7)],
        }
    }
}

/// Environment variable: the GPUs this process may see at all (a container's view), as
/// comma-separated UUIDs or indices into the GPU set. Unset or empty: every GPU. Both doubles honour it.
pub const ENV_VISIBLE: &str = "CCM_SIM_VISIBLE";

/// Indices into `config.gpus` that a process with `CCM_SIM_VISIBLE = spec` sees, in set order.
pub fn container_view(config: &SimConfig, spec: Option<&str>) -> Result<Vec<usize>, SimError> {
    let spec = match spec.map(str::trim) {
        None | Some("") => return Ok((0..config.gpus.len()).collect()),
        Some(s) => s,
    };
    let mut chosen = Vec::new();
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let index = if item.starts_with("GPU-") || item.starts_with("gpu-") {
            let uuid: SimUuid = item.parse()?;
            config.gpu_by_uuid(&uuid)
        } else {
            item.parse::<usize>().ok().filter(|&i| i < config.gpus.len())
        };
        let index = index.ok_or_else(|| SimError::BadConfig {
            what: format!(
                "{ENV_VISIBLE} names `{item}`, which is not a GPU of the set; use a UUID or an index below {}",
                config.gpus.len()
            ),
        })?;
        if !chosen.contains(&index) {
            chosen.push(index);
        }
    }
    chosen.sort_unstable();
    Ok(chosen)
}

/// The GPUs this process sees: `CCM_SIM_VISIBLE` when set; otherwise, in a container whose `/dev`
/// holds GPU nodes (`/dev/nvidiaN`, as a runtime gives a container its GPUs), the GPUs of those
/// minors, as the real driver sees only the GPUs whose nodes it can open; otherwise every GPU (a
/// host without such nodes: the CI machines, the plugin's driver agent there).
pub fn process_view(config: &SimConfig) -> Result<Vec<usize>, SimError> {
    if let Some(spec) = std::env::var(ENV_VISIBLE).ok().filter(|s| !s.trim().is_empty()) {
        return container_view(config, Some(&spec));
    }
    let minors = dev_gpu_minors(std::path::Path::new("/dev"));
    if minors.is_empty() {
        return container_view(config, None);
    }
    Ok((0..config.gpus.len()).filter(|&i| minors.contains(&config.gpus[i].minor)).collect())
}

/// Minors of the `nvidiaN` entries of a `/dev` directory (names by the plugin's own rule).
pub fn dev_gpu_minors(dev: &std::path::Path) -> Vec<u32> {
    let Ok(rd) = std::fs::read_dir(dev) else { return Vec::new() };
    rd.flatten()
        .filter_map(|e| ccm_settings::spec::nvidia_minor_of_path(&format!("/dev/{}", e.file_name().to_string_lossy())))
        .collect()
}

/// CUDA ordinals under `CUDA_VISIBLE_DEVICES = spec`, as indices into `enumerated` (the UUIDs the
/// driver enumerated). Follows the real driver: entries are indices or (prefixes of) UUIDs; the
/// list stops at the first entry that names no device or repeats one; unset means all.
pub fn cuda_ordinals(enumerated: &[SimUuid], spec: Option<&str>) -> Vec<usize> {
    let Some(spec) = spec else {
        return (0..enumerated.len()).collect();
    };
    let mut ordinals = Vec::new();
    for item in spec.split(',').map(str::trim) {
        let found = if item.starts_with("GPU-") || item.starts_with("gpu-") {
            let wanted = item.to_ascii_lowercase();
            let matches: Vec<usize> = (0..enumerated.len())
                .filter(|&i| enumerated[i].to_string().to_ascii_lowercase().starts_with(&wanted))
                .collect();
            if matches.len() == 1 {
                Some(matches[0])
            } else {
                None
            }
        } else {
            item.parse::<usize>().ok().filter(|&i| i < enumerated.len())
        };
        match found {
            Some(i) if !ordinals.contains(&i) => ordinals.push(i),
            _ => break,
        }
    }
    ordinals
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_text_round_trip() {
        let u: SimUuid = "GPU-0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9".parse().unwrap();
        assert_eq!(u.to_string(), "GPU-0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9");
        assert!("0a1b2c3d".parse::<SimUuid>().is_err());
        assert!("GPU-zz".parse::<SimUuid>().is_err());
    }

    #[test]
    fn pci_forms_are_case_and_width_insensitive() {
        let p = SimPci { domain: 0, bus: 0x3b, device: 0 };
        for text in ["0000:3b:00.0", "00000000:3B:00.0", "3b:00.0", "0:3b:0"] {
            assert_eq!(SimPci::parse(text), Some(p), "{text}");
        }
        assert_eq!(p.to_cuda_string(), "0000:3B:00.0");
        assert_eq!(p.to_nvml_string(), "00000000:3B:00.0");
        assert_eq!(SimPci::parse("0000:3b:00.1"), None);
        assert_eq!(SimPci::parse("nonsense"), None);
    }

    #[test]
    fn config_round_trips_through_json() {
        let c = SimConfig::two_h200();
        assert_eq!(SimConfig::from_json(&c.to_json()).unwrap(), c);
        assert_eq!(c.gpus[1].pci_words(), [0, 7, 0, 0, 0x233510de, 0x18bf10de]);
    }

    #[test]
    fn config_rejects_duplicates_and_bad_ids() {
        let mut c = SimConfig::two_h200();
        c.gpus[1].minor = 0;
        assert!(SimConfig::from_json(&c.to_json()).is_err());
        let bad = r#"{"gpus":[{"uuid":"GPU-00000000-0000-0000-0000-000000000001","pci_bus_id":"0000:06:00.0",
            "pci_device_id":"xyz","pci_subsystem_id":1,"minor":0}]}"#;
        assert!(SimConfig::from_json(bad).is_err());
    }

    #[test]
    fn container_view_selects_by_uuid_or_index() {
        let c = SimConfig::two_h200();
        assert_eq!(container_view(&c, None).unwrap(), vec![0, 1]);
        assert_eq!(container_view(&c, Some("1")).unwrap(), vec![1]);
        let u1 = c.gpus[1].uuid.to_string();
        assert_eq!(container_view(&c, Some(&u1)).unwrap(), vec![1]);
        assert!(container_view(&c, Some("7")).is_err());
        let dev = std::env::temp_dir().join(format!("ccm-sim-dev-{}", std::process::id()));
        std::fs::create_dir_all(&dev).unwrap();
        for n in ["nvidia1", "nvidiactl", "nvidia-uvm", "null"] {
            std::fs::write(dev.join(n), b"").unwrap();
        }
        assert_eq!(dev_gpu_minors(&dev), vec![1]);
        std::fs::remove_dir_all(&dev).unwrap();
    }

    #[test]
    fn cuda_visible_devices_rules() {
        let c = SimConfig::two_h200();
        let e: Vec<SimUuid> = c.gpus.iter().map(|g| g.uuid).collect();
        assert_eq!(cuda_ordinals(&e, None), vec![0, 1]);
        assert_eq!(cuda_ordinals(&e, Some("1,0")), vec![1, 0]);
        assert_eq!(cuda_ordinals(&e, Some("1,5,0")), vec![1]);
        assert_eq!(cuda_ordinals(&e, Some("")), Vec::<usize>::new());
        let u1 = e[1].to_string();
        assert_eq!(cuda_ordinals(&e, Some(&u1)), vec![1]);
        // A prefix that names both GPUs is ambiguous and ends the list.
        assert_eq!(cuda_ordinals(&e, Some("GPU-5e11")), Vec::<usize>::new());
    }
}
