//! TEMPORARY stand-in for ccm_identity::pattern until it lands (same signatures).
use ccm_identity::{GpuUuid, PciSignature};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PciSite {
    pub gpu: GpuUuid,
    pub addr: u64,
    pub mapping_start: u64,
    pub mapping_end: u64,
    pub mapping_name: String,
    pub words: PciSignature,
}

pub fn find_signatures(buf: &[u8], base_addr: u64, wanted: &[(GpuUuid, PciSignature)]) -> Vec<(GpuUuid, u64)> {
    let mut out = Vec::new();
    if buf.len() < 24 { return out; }
    for off in (0..=buf.len() - 24).step_by(4) {
        for (g, s) in wanted {
            if buf[off..off + 24] == s.to_bytes() { out.push((*g, base_addr + off as u64)); }
        }
    }
    out
}
