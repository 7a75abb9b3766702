//! GPU identity types shared by every layer.

use std::fmt;
use std::str::FromStr;

/// A GPU's 16-byte UUID, as the driver and NVML report it.
///
/// Text form is NVML's: `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` (lower-case hex), also in JSON (the
/// tool's `--json` output is for scripts that compare it with `nvidia-smi`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GpuUuid(pub [u8; 16]);

/// Serde through the text form (`Display` / a parser whose error is `Display`), for types whose JSON should read as
/// people write them.
macro_rules! serde_as_text {
    ($ty:ty, $expecting:literal, $parse:expr) => {
        impl serde::Serialize for $ty {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_str(self)
            }
        }

        impl<'de> serde::Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                struct Text;
                impl serde::de::Visitor<'_> for Text {
                    type Value = $ty;
                    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                        f.write_str($expecting)
                    }
                    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<$ty, E> {
                        ($parse)(v).map_err(E::custom)
                    }
                }
                deserializer.deserialize_str(Text)
            }
        }
    };
}

serde_as_text!(GpuUuid, "a GPU UUID such as GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", |v: &str| v.parse::<GpuUuid>());

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{text}` is not a GPU UUID; expected GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx (as `nvidia-smi -L` prints)")]
pub struct UuidParseError {
    pub text: String,
}

impl GpuUuid {
    pub const fn from_bytes(bytes: [u8; 16]) -> Self {
        GpuUuid(bytes)
    }
    pub const fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }
}

impl fmt::Display for GpuUuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = &self.0;
        write!(
            f,
            "GPU-{:02x}{:02x}{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}-{:02x}{:02x}{:02x}{:02x}{:02x}{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]
        )
    }
}

impl fmt::Debug for GpuUuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for GpuUuid {
    type Err = UuidParseError;
    /// Accepts `GPU-` followed by 32 hex digits with the usual dashes (dashes are optional).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || UuidParseError { text: s.to_string() };
        let t = s.trim();
        let hex = t.strip_prefix("GPU-").ok_or_else(err)?;
        let digits: Vec<u8> = hex.bytes().filter(|&c| c != b'-').collect();
        if digits.len() != 32 || !digits.iter().all(u8::is_ascii_hexdigit) {
            return Err(err());
        }
        let mut out = [0u8; 16];
        for (i, pair) in digits.chunks(2).enumerate() {
            let s = std::str::from_utf8(pair).map_err(|_| err())?;
            out[i] = u8::from_str_radix(s, 16).map_err(|_| err())?;
        }
        Ok(GpuUuid(out))
    }
}

/// A PCI location: domain, bus, device, function. Text (and JSON) form `0000:06:00.0`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct PciAddress {
    pub domain: u32,
    pub bus: u32,
    pub device: u32,
    pub function: u32,
}

impl PciAddress {
    /// CUDA's and NVML's legacy form, `0000:06:00.0`.
    pub fn to_short_string(&self) -> String {
        format!("{:04x}:{:02x}:{:02x}.{:x}", self.domain, self.bus, self.device, self.function)
    }
    /// NVML's `busId` form, `00000000:06:00.0`.
    pub fn to_nvml_string(&self) -> String {
        format!("{:08x}:{:02x}:{:02x}.{:x}", self.domain, self.bus, self.device, self.function)
    }
    /// Parses `D:B:DEV.F`, `D:B:DEV` or `B:DEV.F` (hex, any width), as NVML accepts.
    pub fn parse(s: &str) -> Option<PciAddress> {
        let s = s.trim();
        let (head, function) = match s.rsplit_once('.') {
            Some((h, f)) => (h, u32::from_str_radix(f, 16).ok()?),
            None => (s, 0),
        };
        let parts: Vec<&str> = head.split(':').collect();
        let num = |p: &str| u32::from_str_radix(p, 16).ok();
        let (domain, bus, device) = match parts.as_slice() {
            [d, b, dev] => (num(d)?, num(b)?, num(dev)?),
            [b, dev] => (0, num(b)?, num(dev)?),
            _ => return None,
        };
        if bus > 0xff || device > 0x1f || function > 7 {
            return None;
        }
        Some(PciAddress { domain, bus, device, function })
    }
}

impl fmt::Display for PciAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_short_string())
    }
}

serde_as_text!(PciAddress, "a PCI address such as 0000:06:00.0", |v: &str| PciAddress::parse(v)
    .ok_or_else(|| PciAddressParseError { text: v.to_string() }));

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{text}` is not a PCI address (expected DOMAIN:BUS:DEVICE.FUNCTION)")]
pub struct PciAddressParseError {
    pub text: String,
}

/// The six 32-bit words that libcuda caches per GPU and answers `cuDeviceGetPCIBusId` from:
/// `{domain, bus, device, 0, pciDeviceId, pciSubSystemId}` (they are NVML's `nvmlPciInfo_t`
/// fields, so they are built from NVML without knowing libcuda's layout).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, serde::Serialize, serde::Deserialize)]
#[serde(from = "[u32; 6]", into = "[u32; 6]")]
pub struct PciSignature {
    pub domain: u32,
    pub bus: u32,
    pub device: u32,
    /// Always 0 where the driver keeps the words (the function number's slot in NVML's struct is
    /// elsewhere); part of the pattern all the same.
    pub zero: u32,
    /// `pciDeviceId`: device id << 16 | vendor id (e.g. 0x233510de).
    pub pci_device_id: u32,
    /// `pciSubSystemId` (e.g. 0x18bf10de).
    pub pci_subsystem_id: u32,
}

impl From<[u32; 6]> for PciSignature {
    fn from(w: [u32; 6]) -> Self {
        PciSignature { domain: w[0], bus: w[1], device: w[2], zero: w[3], pci_device_id: w[4], pci_subsystem_id: w[5] }
    }
}

impl From<PciSignature> for [u32; 6] {
    fn from(s: PciSignature) -> Self {
        s.words()
    }
}

impl PciSignature {
    pub const LEN_BYTES: usize = 24;

    pub fn new(pci: PciAddress, pci_device_id: u32, pci_subsystem_id: u32) -> Self {
        PciSignature { domain: pci.domain, bus: pci.bus, device: pci.device, zero: 0, pci_device_id, pci_subsystem_id }
    }
    /// The six words in memory order.
    pub fn words(&self) -> [u32; 6] {
        [self.domain, self.bus, self.device, self.zero, self.pci_device_id, self.pci_subsystem_id]
    }
    /// Native-endian bytes, as they sit in the target's memory (x86-64: little-endian).
    pub fn to_bytes(&self) -> [u8; 24] {
        let mut out = [0u8; 24];
        for (i, w) in self.words().iter().enumerate() {
            out[i * 4..i * 4 + 4].copy_from_slice(&w.to_ne_bytes());
        }
        out
    }
    pub fn from_bytes(b: &[u8; 24]) -> Self {
        let mut w = [0u32; 6];
        for (i, slot) in w.iter_mut().enumerate() {
            *slot = u32::from_ne_bytes([b[i * 4], b[i * 4 + 1], b[i * 4 + 2], b[i * 4 + 3]]);
        }
        PciSignature::from(w)
    }
    pub fn pci(&self) -> PciAddress {
        PciAddress { domain: self.domain, bus: self.bus, device: self.device, function: 0 }
    }
}

/// Everything the project records about one GPU (from NVML and the kernel driver).
#[derive(Clone, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
pub struct GpuIdentity {
    pub uuid: GpuUuid,
    pub pci: PciAddress,
    /// NVML `pciDeviceId`: device id in the high half, vendor in the low half (e.g. 0x233510de).
    pub pci_device_id: u32,
    /// NVML `pciSubSystemId`.
    pub pci_subsystem_id: u32,
    /// `/dev/nvidia<minor>`.
    pub minor: u32,
    /// Marketing name, e.g. "NVIDIA H200".
    pub name: String,
    /// Total device memory in bytes.
    pub memory_total: u64,
}

impl GpuIdentity {
    pub fn signature(&self) -> PciSignature {
        PciSignature::new(self.pci, self.pci_device_id, self.pci_subsystem_id)
    }
    /// Two GPUs are the same chip when their PCI device ids match (the driver's restore rule
    /// is "same chip type"); the subsystem id may differ between board vendors.
    pub fn same_chip(&self, other: &GpuIdentity) -> bool {
        self.pci_device_id == other.pci_device_id
    }
    /// One-line description for messages: `GPU-… (NVIDIA H200, 0000:06:00.0, 140 GiB)`.
    pub fn describe(&self) -> String {
        format!("{} ({}, {}, {})", self.uuid, self.name, self.pci, format_memory(self.memory_total))
    }
}

/// Device memory in whole GiB (rounded to nearest), or MiB below 1 GiB.
pub fn format_memory(bytes: u64) -> String {
    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;
    if bytes >= GIB {
        format!("{} GiB", bytes.saturating_add(GIB / 2) / GIB)
    } else {
        format!("{} MiB", (bytes + MIB / 2) / MIB)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_round_trip() {
        let s = "GPU-0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9";
        let u: GpuUuid = s.parse().unwrap();
        assert_eq!(u.to_string(), s);
        assert!("GPU-xyz".parse::<GpuUuid>().is_err());
        assert!("0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9".parse::<GpuUuid>().is_err());
    }

    #[test]
    fn json_holds_the_text_forms() {
        let g = GpuIdentity {
            uuid: "GPU-0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9".parse().unwrap(),
            pci: PciAddress::parse("0000:06:00.0").unwrap(),
            pci_device_id: 0x233510de,
            pci_subsystem_id: 0x18bf10de,
            minor: 0,
            name: "NVIDIA H200".into(),
            memory_total: 1 << 30,
        };
        let json = serde_json::to_string(&g).unwrap();
        assert!(json.contains(r#""uuid":"GPU-0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9""#), "{json}");
        assert!(json.contains(r#""pci":"0000:06:00.0""#), "{json}");
        assert_eq!(serde_json::from_str::<GpuIdentity>(&json).unwrap(), g);
        let bad = serde_json::from_str::<GpuUuid>(r#""GPU-12""#).unwrap_err().to_string();
        assert!(bad.contains("nvidia-smi -L"), "{bad}");
        assert!(serde_json::from_str::<PciAddress>(r#""06:00""#).is_ok());
        assert!(serde_json::from_str::<PciAddress>(r#""zz""#).is_err());
    }

    #[test]
    fn pci_forms() {
        let p = PciAddress::parse("00000000:06:00.0").unwrap();
        assert_eq!(p, PciAddress { domain: 0, bus: 6, device: 0, function: 0 });
        assert_eq!(p.to_short_string(), "0000:06:00.0");
        assert_eq!(p.to_nvml_string(), "00000000:06:00.0");
        assert_eq!(PciAddress::parse("0000:07:00.0").unwrap().bus, 7);
        assert_eq!(PciAddress::parse("07:00.0").unwrap().bus, 7);
        assert!(PciAddress::parse("zz").is_none());
    }

    #[test]
    fn signature_bytes() {
        let sig = PciSignature::from([0, 6, 0, 0, 0x233510de, 0x18bf10de]);
        assert_eq!(PciSignature::from_bytes(&sig.to_bytes()), sig);
    }
}
