//! `--device-props`: a property cache like the one the CUDA runtime and frameworks keep.
//!
//! libcudart fills one `cudaDeviceProp` per device from driver queries, and PyTorch keeps its own
//! copy of each; after a migration those copies still name the dump node's GPU unless the plugin
//! rewrites them. This workload builds the same copies itself (CUDA 13's layout, from
//! `cuDeviceGetName`, `cuDeviceGetUuid` and the PCI attributes, as the runtime does), on the heap,
//! plus a decoy per device: the same name and UUID with the PCI words where no layout keeps them,
//! which the plugin must leave byte for byte. Each report says what the copies hold now.

use crate::app::CudaApp;
use ccm_identity::devprop::{self, LAYOUTS, NAME_BYTES, UUID_BYTES, UUID_OFFSET};
use ccm_identity::{GpuUuid, PciAddress};
use serde::Serialize;

/// `sizeof(cudaDeviceProp)` in CUDA 13.
const PROP_BYTES: usize = 1008;
/// Where the decoy keeps its PCI words: inside the struct, at no known layout's offset.
const DECOY_PCI_OFFSET: usize = 600;

/// One copy per device, kept for the life of the process (the heap, like the runtime's).
pub struct PropCache {
    /// CUDA 13 `cudaDeviceProp` per ordinal, in the Vec's heap buffer; u64 words keep it 8-byte
    /// aligned like the C struct.
    copies: Vec<[u64; PROP_BYTES / 8]>,
    decoys: Vec<[u64; PROP_BYTES / 8]>,
    /// The decoys' bytes as written.
    decoy_bytes: Vec<Vec<u8>>,
}

#[derive(Debug, Serialize)]
pub struct PropsReport {
    pub copies: Vec<PropCopyReport>,
    /// Every decoy still holds exactly what was written.
    pub decoys_intact: bool,
    /// Every copy names the GPU the driver reports for its ordinal now.
    pub all_agree: bool,
}

#[derive(Debug, Serialize)]
pub struct PropCopyReport {
    pub ordinal: u32,
    pub name: String,
    pub uuid: String,
    /// `(pciBusID, pciDeviceID, pciDomainID)` as `domain:bus:device`.
    pub pci: String,
    /// The copy's UUID is `cuDeviceGetUuid`'s and its PCI location the driver's bus id.
    pub agrees_with_driver: bool,
}

fn to_bytes(words: &[u64; PROP_BYTES / 8]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_ne_bytes()).collect()
}

fn from_bytes(bytes: &[u8]) -> [u64; PROP_BYTES / 8] {
    let mut w = [0u64; PROP_BYTES / 8];
    for (slot, chunk) in w.iter_mut().zip(bytes.chunks_exact(8)) {
        *slot = u64::from_ne_bytes([chunk[0], chunk[1], chunk[2], chunk[3], chunk[4], chunk[5], chunk[6], chunk[7]]);
    }
    w
}

impl PropCache {
    /// Builds the copies of every ordinal, as `cudaGetDeviceProperties` does.
    pub fn fill(app: &CudaApp) -> Result<PropCache, crate::app::AppError> {
        let l13 = LAYOUTS[0];
        let mut cache = PropCache { copies: Vec::new(), decoys: Vec::new(), decoy_bytes: Vec::new() };
        for ordinal in 0..app.device_count()? {
            let dev = app.device(ordinal)?;
            let name = app.device_name(dev)?;
            let uuid = app.device_uuid(dev)?;
            let pci = app.device_pci_attributes(dev)?.to_address();
            let mut b = vec![0u8; PROP_BYTES];
            let n = name.len().min(NAME_BYTES - 1);
            b[..n].copy_from_slice(&name.as_bytes()[..n]);
            b[UUID_OFFSET..UUID_OFFSET + UUID_BYTES].copy_from_slice(uuid.as_bytes());
            b[288..296].copy_from_slice(&app.device_total_mem(dev)?.to_le_bytes());
            b[l13.pci_bus_offset..l13.span()].copy_from_slice(&devprop::pci_triple(&pci));
            // The fields after it as an H200 has them (asyncEngineCount, unifiedAddressing,
            // memoryBusWidth): where CUDA 12's layout keeps the PCI words, so no other layout matches.
            for (at, v) in [(584usize, 3u32), (588, 1), (592, 6144)] {
                b[at..at + 4].copy_from_slice(&v.to_le_bytes());
            }
            cache.copies.push(from_bytes(&b));
            let mut d = b.clone();
            d[l13.pci_bus_offset..l13.span()].fill(0);
            d[DECOY_PCI_OFFSET..DECOY_PCI_OFFSET + 12].copy_from_slice(&devprop::pci_triple(&pci));
            cache.decoys.push(from_bytes(&d));
            cache.decoy_bytes.push(d);
        }
        Ok(cache)
    }

    /// What the copies hold now, against what the driver says.
    pub fn report(&self, app: &CudaApp) -> PropsReport {
        let l13 = LAYOUTS[0];
        let mut copies = Vec::new();
        for (ordinal, words) in (0u32..).zip(&self.copies) {
            let b = to_bytes(words);
            let name_end = b[..NAME_BYTES].iter().position(|c| *c == 0).unwrap_or(NAME_BYTES);
            let mut u = [0u8; 16];
            u.copy_from_slice(&b[UUID_OFFSET..UUID_OFFSET + UUID_BYTES]);
            let int = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
            let o = l13.pci_bus_offset;
            let pci = PciAddress { domain: int(o + 8), bus: int(o), device: int(o + 4), function: 0 };
            let uuid = GpuUuid::from_bytes(u);
            let driver = app
                .device(ordinal)
                .ok()
                .and_then(|d| Some((app.device_uuid(d).ok()?, app.device_pci_attributes(d).ok()?.to_address())));
            copies.push(PropCopyReport {
                ordinal,
                name: String::from_utf8_lossy(&b[..name_end]).into_owned(),
                uuid: uuid.to_string(),
                pci: pci.to_short_string(),
                agrees_with_driver: driver == Some((uuid, pci)),
            });
        }
        let decoys_intact = self.decoys.iter().zip(&self.decoy_bytes).all(|(w, want)| to_bytes(w) == *want);
        PropsReport { all_agree: copies.iter().all(|c| c.agrees_with_driver), copies, decoys_intact }
    }
}
