//! The node's GPUs as the kernel driver lists them: `/proc/driver/nvidia/gpus/<bus>/information`
//! (UUID, bus, minor, model) and the PCI device's ids in sysfs. No library is loaded and no driver
//! thread starts, so the restore's preflight has the GPU list in well under a millisecond while
//! NVML starts beside it; only each GPU's memory comes from NVML.

use std::path::Path;

use ccm_identity::{GpuIdentity, GpuUuid, PciAddress};

/// Where the NVIDIA kernel driver lists its GPUs.
pub const GPUS_DIR: &str = "/proc/driver/nvidia/gpus";
/// Where the PCI devices' ids are.
pub const PCI_DEVICES_DIR: &str = "/sys/bus/pci/devices";
/// Largest file read here (the files are a few hundred bytes).
const MAX_FILE: u64 = 64 << 10;

/// Why the kernel driver's list cannot be used (the caller then asks NVML for the whole list).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProcfsError {
    #[error("{0} is not there (no NVIDIA kernel driver, or another /proc)")]
    Missing(String),
    #[error("{path}: {why}")]
    Unreadable { path: String, why: String },
    #[error("{path}: {why}")]
    Information {
        path: String,
        #[source]
        why: InformationError,
    },
}

/// What an `information` file lacks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InformationError {
    #[error("no `{key}:` line")]
    NoLine { key: &'static str },
    #[error("`{key}: {value}` is no {what}")]
    BadValue { key: &'static str, value: String, what: &'static str },
}

/// The fields of one `information` file that the plugin uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Information {
    pub model: String,
    pub uuid: GpuUuid,
    pub bus: PciAddress,
    pub minor: u32,
}

/// Parses an `information` file (`Key: value` lines; the whitespace varies between drivers).
pub fn parse_information(text: &str) -> Result<Information, InformationError> {
    let field = |key: &'static str| {
        text.lines()
            .find_map(|l| l.split_once(':').filter(|(k, _)| k.trim() == key).map(|(_, v)| v.trim().to_string()))
            .ok_or(InformationError::NoLine { key })
    };
    let bad = |key: &'static str, value: String, what: &'static str| InformationError::BadValue { key, value, what };
    let uuid_text = field("GPU UUID")?;
    let uuid = uuid_text.parse().map_err(|_| bad("GPU UUID", uuid_text.clone(), "GPU UUID"))?;
    let bus_text = field("Bus Location")?;
    let bus = PciAddress::parse(&bus_text).ok_or_else(|| bad("Bus Location", bus_text.clone(), "PCI address"))?;
    let minor_text = field("Device Minor")?;
    let minor = minor_text.parse().map_err(|_| bad("Device Minor", minor_text.clone(), "number"))?;
    Ok(Information { model: field("Model")?, uuid, bus, minor })
}

/// A sysfs id file (`0x10de`).
fn parse_id(text: &str) -> Option<u32> {
    u32::from_str_radix(text.trim().strip_prefix("0x")?, 16).ok().filter(|v| *v <= 0xffff)
}

fn read(path: &Path) -> Result<String, ProcfsError> {
    let unreadable = |why: String| ProcfsError::Unreadable { path: path.display().to_string(), why };
    let meta = std::fs::symlink_metadata(path).map_err(|e| unreadable(e.to_string()))?;
    if !meta.is_file() {
        return Err(unreadable("not a regular file".into()));
    }
    let mut s = String::new();
    std::io::Read::read_to_string(
        &mut std::io::Read::take(std::fs::File::open(path).map_err(|e| unreadable(e.to_string()))?, MAX_FILE),
        &mut s,
    )
    .map_err(|e| unreadable(e.to_string()))?;
    Ok(s)
}

/// Every GPU the kernel driver lists, in PCI order (NVML's default index order), with
/// `memory_total` 0: the caller fills it from NVML.
pub fn gpus() -> Result<Vec<GpuIdentity>, ProcfsError> {
    gpus_under(Path::new(GPUS_DIR), Path::new(PCI_DEVICES_DIR))
}

/// [`gpus`] from other directories (tests).
pub fn gpus_under(gpus_dir: &Path, pci_dir: &Path) -> Result<Vec<GpuIdentity>, ProcfsError> {
    let entries = std::fs::read_dir(gpus_dir).map_err(|_| ProcfsError::Missing(gpus_dir.display().to_string()))?;
    let mut out = Vec::new();
    for e in entries.flatten().take(1024) {
        let info_path = e.path().join("information");
        let info = parse_information(&read(&info_path)?)
            .map_err(|why| ProcfsError::Information { path: info_path.display().to_string(), why })?;
        let dev = pci_dir.join(info.bus.to_string().to_ascii_lowercase());
        let id = |name: &str| -> Result<u32, ProcfsError> {
            let p = dev.join(name);
            parse_id(&read(&p)?).ok_or_else(|| ProcfsError::Unreadable {
                path: p.display().to_string(),
                why: "no 16-bit hex id".into(),
            })
        };
        out.push(GpuIdentity {
            uuid: info.uuid,
            pci: info.bus,
            // NVML's `pciDeviceId` and `pciSubSystemId`: (device << 16) | vendor.
            pci_device_id: (id("device")? << 16) | id("vendor")?,
            pci_subsystem_id: (id("subsystem_device")? << 16) | id("subsystem_vendor")?,
            minor: info.minor,
            name: info.model,
            memory_total: 0,
        });
    }
    if out.is_empty() {
        return Err(ProcfsError::Missing(format!("a GPU under {}", gpus_dir.display())));
    }
    out.sort_by_key(|g| g.pci);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As driver 580 writes it (tabs and spaces as there).
    const INFO: &str =
        "Model: \t\t NVIDIA H200\nIRQ:   \t\t 0\nGPU UUID: \t GPU-5e110000-aabb-ccdd-0001-020304050600\n\
        Video BIOS: \t 96.00.af.00.01\nBus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\n\
        Bus Location: \t 0000:00:06.0\nDevice Minor: \t 0\nGPU Firmware: \t 580.159.04\nGPU Excluded:\t No\n";

    #[test]
    fn the_information_file_is_read() {
        let i = parse_information(INFO).unwrap();
        assert_eq!(i.model, "NVIDIA H200");
        assert_eq!(i.uuid.to_string(), "GPU-5e110000-aabb-ccdd-0001-020304050600");
        assert_eq!(i.bus.to_string().to_ascii_lowercase(), "0000:00:06.0");
        assert_eq!(i.minor, 0);
        assert!(parse_information("Model: x\n").unwrap_err().to_string().contains("GPU UUID"));
        assert!(parse_information(&INFO.replace("Device Minor: \t 0", "Device Minor: \t zero")).is_err());
    }

    #[test]
    fn a_node_is_listed_with_its_pci_ids() {
        let t = tempfile::tempdir().unwrap();
        let (gpus, pci) = (t.path().join("gpus"), t.path().join("pci"));
        for (bus, uuid, minor) in [
            ("0000:00:07.0", "GPU-5e110001-aabb-ccdd-0001-020304050601", 1),
            ("0000:00:06.0", "GPU-5e110000-aabb-ccdd-0001-020304050600", 0),
        ] {
            std::fs::create_dir_all(gpus.join(bus)).unwrap();
            let text = INFO
                .replace("GPU-5e110000-aabb-ccdd-0001-020304050600", uuid)
                .replace("0000:00:06.0", bus)
                .replace("Device Minor: \t 0", &format!("Device Minor: \t {minor}"));
            std::fs::write(gpus.join(bus).join("information"), text).unwrap();
            let d = pci.join(bus);
            std::fs::create_dir_all(&d).unwrap();
            for (f, v) in [
                ("vendor", "0x10de"),
                ("device", "0x2335"),
                ("subsystem_vendor", "0x10de"),
                ("subsystem_device", "0x18bf"),
            ] {
                std::fs::write(d.join(f), format!("{v}\n")).unwrap();
            }
        }
        let list = gpus_under(&gpus, &pci).unwrap();
        assert_eq!(list.iter().map(|g| g.minor).collect::<Vec<_>>(), [0, 1], "PCI order");
        assert_eq!((list[0].pci_device_id, list[0].pci_subsystem_id), (0x233510de, 0x18bf10de));
        assert!(matches!(gpus_under(&t.path().join("none"), &pci), Err(ProcfsError::Missing(_))));
    }
}
