//! The CUDA runtime's `cudaDeviceProp` copies, and the rules that find and rewrite them.
//!
//! libcudart keeps one `cudaDeviceProp` per device once asked, and frameworks keep their own
//! (PyTorch: one per device from its first `get_device_properties`). After a migration these
//! copies still name the dump node's GPU: its UUID and its PCI location. libcuda's records are a
//! different matter: they must keep their UUIDs (rewriting them breaks the next restore with 304),
//! so a copy is rewritten only when it is a `cudaDeviceProp` beyond doubt:
//!
//! - the GPU's name, NUL-terminated, at offset 0 (`name[256]`);
//! - the GPU's 16 UUID bytes at offset 256 (`uuid`), 8-byte aligned like the struct;
//! - the GPU's `(pciBusID, pciDeviceID, pciDomainID)` as three `int`s at the offset of exactly one
//!   known layout ([`LAYOUTS`]);
//! - not inside a mapping of libcuda itself.
//!
//! Anything short of that is a look-alike and is never written. The dump records every copy it
//! identifies ([`PropSite`]); the restore checks each one still holds what was recorded
//! ([`check_recorded`]) and rewrites only those, from one snapshot ([`plan_prop_rewrites`]), so a
//! swap of two GPUs is rewritten correctly.

use crate::gpu::{GpuIdentity, GpuUuid, PciAddress};
use crate::map::DeviceMap;

/// Offset of `name[256]`.
pub const NAME_OFFSET: usize = 0;
/// Length of `name`.
pub const NAME_BYTES: usize = 256;
/// Offset of `cudaUUID_t uuid`.
pub const UUID_OFFSET: usize = 256;
/// Length of `uuid`.
pub const UUID_BYTES: usize = 16;
/// Length of the `(pciBusID, pciDeviceID, pciDomainID)` triple.
pub const PCI_TRIPLE_BYTES: usize = 12;

/// Where one CUDA runtime major version keeps the PCI triple in `cudaDeviceProp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PropLayout {
    /// CUDA runtime major version (the `cudart` the process or framework was built with).
    pub runtime_major: u16,
    /// Offset of `pciBusID`; `pciDeviceID` and `pciDomainID` follow it.
    pub pci_bus_offset: usize,
    /// Where the offsets come from.
    pub source: &'static str,
}

impl PropLayout {
    /// Bytes from the start of the struct to the end of the PCI triple: what must be readable.
    pub const fn span(&self) -> usize {
        self.pci_bus_offset + PCI_TRIPLE_BYTES
    }
}

/// The layouts this plugin knows.
pub const LAYOUTS: [PropLayout; 2] = [
    // offsetof() compiled against CUDA 13.0's cuda_runtime_api.h on the GPU machine
    // (tests/gpu/probe-props.sh): sizeof 1008, uuid 256, pciBusID 568.
    PropLayout { runtime_major: 13, pci_bus_offset: 568, source: "CUDA 13.0 headers, measured" },
    // CUDA 12's field order: clockRate, deviceOverlap, kernelExecTimeoutEnabled, computeMode and
    // maxTexture1DLinear still present (CUDA 13 removed them), which puts pciBusID 16 bytes later.
    PropLayout { runtime_major: 12, pci_bus_offset: 584, source: "CUDA 12 field order" },
];

/// Longest span of any known layout.
pub const MAX_SPAN: usize = {
    let mut m = 0;
    let mut i = 0;
    while i < LAYOUTS.len() {
        if LAYOUTS[i].span() > m {
            m = LAYOUTS[i].span();
        }
        i += 1;
    }
    m
};

/// The layout of a runtime major version.
pub fn layout(runtime_major: u16) -> Option<PropLayout> {
    LAYOUTS.iter().copied().find(|l| l.runtime_major == runtime_major)
}

pub use crate::image::PropSite;

/// What a scan found: identified copies, and look-alikes it left alone.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct PropScan {
    /// `(gpu, struct address, runtime major)` of every identified copy.
    pub found: Vec<(GpuUuid, u64, u16)>,
    /// A GPU's UUID bytes where a copy would keep them, but no name, or no PCI triple at the
    /// offset of exactly one layout: never written. Their struct addresses.
    pub lookalikes: Vec<u64>,
}

/// The PCI triple of a GPU as `cudaDeviceProp` holds it.
pub fn pci_triple(pci: &PciAddress) -> [u8; PCI_TRIPLE_BYTES] {
    let mut out = [0u8; PCI_TRIPLE_BYTES];
    for (i, v) in [pci.bus, pci.device, pci.domain].into_iter().enumerate() {
        out[i * 4..i * 4 + 4].copy_from_slice(&v.to_le_bytes());
    }
    out
}

/// Whether `bytes` (the start of a candidate struct) holds `gpu`'s name then NUL.
fn name_matches(bytes: &[u8], gpu: &GpuIdentity) -> bool {
    let name = gpu.name.as_bytes();
    !name.is_empty()
        && name.len() < NAME_BYTES
        && bytes.get(NAME_OFFSET..NAME_OFFSET + name.len()) == Some(name)
        && bytes.get(NAME_OFFSET + name.len()) == Some(&0)
}

/// The layouts whose PCI triple in `bytes` (a candidate struct) is `gpu`'s.
fn matching_layouts(bytes: &[u8], gpu: &GpuIdentity) -> Vec<PropLayout> {
    let triple = pci_triple(&gpu.pci);
    LAYOUTS.iter().copied().filter(|l| bytes.get(l.pci_bus_offset..l.span()) == Some(&triple[..])).collect()
}

/// Finds the `cudaDeviceProp` copies of the wanted GPUs in `buf`, the memory at `base_addr`.
///
/// A copy is reported once its whole span lies in `buf`; the caller carries at least
/// [`MAX_SPAN`] bytes from one window into the next so a copy crossing a border is seen whole.
/// Cost: one pass over the 8-byte-aligned words, comparing each with the wanted UUIDs' first
/// eight bytes.
pub fn find_device_props(buf: &[u8], base_addr: u64, wanted: &[GpuIdentity]) -> PropScan {
    let mut out = PropScan::default();
    if wanted.is_empty() || buf.len() < UUID_OFFSET + UUID_BYTES {
        return out;
    }
    // The wanted UUIDs' first eight bytes, sorted, each with the GPU it starts: a word is looked up
    // in O(log GPUs), and the pass costs about the same for one GPU as for eight (it compared every
    // word with every GPU's key before: 1.6 times slower with eight GPUs than with one).
    let mut keys: Vec<(u64, usize)> = wanted
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let b = g.uuid.as_bytes();
            (u64::from_ne_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]), i)
        })
        .collect();
    keys.sort_unstable();
    let (lowest, highest) = (keys[0].0, keys[keys.len() - 1].0);
    // The struct is 8-byte aligned (it holds size_t fields), so its UUID is too.
    let first = ((8 - (base_addr % 8)) % 8) as usize;
    let Some(aligned) = buf.get(first..) else { return out };
    for (n, chunk) in aligned.chunks_exact(8).enumerate() {
        let word = u64::from_ne_bytes([chunk[0], chunk[1], chunk[2], chunk[3], chunk[4], chunk[5], chunk[6], chunk[7]]);
        // Most words are outside the keys' range (zeros, small numbers, pointers): one comparison each.
        if word < lowest || word > highest {
            continue;
        }
        let at = keys.partition_point(|(k, _)| *k < word);
        for &(_, i) in keys[at..].iter().take_while(|(k, _)| *k == word) {
            check_candidate(buf, base_addr, first + n * 8, &wanted[i], &mut out);
        }
    }
    out
}

fn check_candidate(buf: &[u8], base_addr: u64, uuid_off: usize, gpu: &GpuIdentity, out: &mut PropScan) {
    if buf.get(uuid_off..uuid_off + UUID_BYTES) != Some(&gpu.uuid.as_bytes()[..]) {
        return;
    }
    let Some(start) = uuid_off.checked_sub(UUID_OFFSET) else {
        // Its name would lie before this window: the previous window (with the carried bytes)
        // has judged it already.
        return;
    };
    let s = &buf[start..];
    if s.len() < MAX_SPAN {
        // Not whole yet: the next window sees it with the carried bytes.
        return;
    }
    let layouts = matching_layouts(s, gpu);
    if name_matches(s, gpu) && layouts.len() == 1 {
        out.found.push((gpu.uuid, base_addr.wrapping_add(start as u64), layouts[0].runtime_major));
    } else {
        out.lookalikes.push(base_addr.wrapping_add(start as u64));
    }
}

/// Whether a mapping may hold copies the plugin rewrites: never libcuda's own.
pub fn mapping_may_hold_props(mapping_name: &str) -> bool {
    !mapping_name.contains("libcuda.so")
}

/// What a recorded copy holds now, read at its address (`now`: [`PropLayout::span`] bytes, or
/// `None` when unreadable).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PropState {
    /// The dump GPU's name, UUID and PCI triple: to be rewritten.
    Stale,
    /// Already the GPU it maps to (nothing to do).
    Fresh,
    /// Anything else: skipped and reported, never guessed at.
    Changed,
}

/// Classifies a recorded copy by what it holds now.
pub fn check_recorded(site: &PropSite, now: Option<&[u8]>, old: &GpuIdentity, new: &GpuIdentity) -> PropState {
    let (Some(bytes), Some(l)) = (now, layout(site.runtime_major)) else { return PropState::Changed };
    if bytes.len() < l.span() || !name_matches(bytes, old) {
        return PropState::Changed;
    }
    let holds = |g: &GpuIdentity| {
        bytes[UUID_OFFSET..UUID_OFFSET + UUID_BYTES] == g.uuid.as_bytes()[..]
            && bytes[l.pci_bus_offset..l.span()] == pci_triple(&g.pci)[..]
    };
    if holds(old) {
        PropState::Stale
    } else if old.name == new.name && holds(new) {
        PropState::Fresh
    } else {
        PropState::Changed
    }
}

/// One verified write into a copy: `expect` must be at `addr` right before `write` goes there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PropWrite {
    pub addr: u64,
    pub expect: Vec<u8>,
    pub write: Vec<u8>,
}

/// The writes that make one stale copy name its new GPU: the UUID and the PCI triple. The name
/// stays (the driver maps only onto the same chip). Nothing when old and new look the same.
pub fn plan_prop_rewrites(site: &PropSite, old: &GpuIdentity, new: &GpuIdentity) -> Vec<PropWrite> {
    let Some(l) = layout(site.runtime_major) else { return Vec::new() };
    let mut writes = Vec::new();
    if old.uuid != new.uuid {
        writes.push(PropWrite {
            addr: site.addr + UUID_OFFSET as u64,
            expect: old.uuid.as_bytes().to_vec(),
            write: new.uuid.as_bytes().to_vec(),
        });
    }
    if old.pci != new.pci {
        writes.push(PropWrite {
            addr: site.addr + l.pci_bus_offset as u64,
            expect: pci_triple(&old.pci).to_vec(),
            write: pci_triple(&new.pci).to_vec(),
        });
    }
    writes
}

/// The new GPU of a recorded copy, when the map moves its GPU.
pub fn moved_to<'a>(
    site: &PropSite,
    map: &DeviceMap,
    old_gpus: &'a [GpuIdentity],
    new_gpus: &'a [GpuIdentity],
) -> Option<(&'a GpuIdentity, &'a GpuIdentity)> {
    let new = map.new_for(&site.gpu).filter(|n| *n != site.gpu)?;
    Some((old_gpus.iter().find(|g| g.uuid == site.gpu)?, new_gpus.iter().find(|g| g.uuid == new)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::tests::h200;

    const L13: PropLayout = LAYOUTS[0];

    /// A `cudaDeviceProp` as CUDA 13's runtime fills it (the fields the rules look at, plus noise).
    fn props(g: &GpuIdentity, layout: PropLayout) -> Vec<u8> {
        let mut b = vec![0u8; 1008.max(layout.span())];
        b[..g.name.len()].copy_from_slice(g.name.as_bytes());
        b[UUID_OFFSET..UUID_OFFSET + 16].copy_from_slice(g.uuid.as_bytes());
        b[288..296].copy_from_slice(&g.memory_total.to_le_bytes());
        b[360..364].copy_from_slice(&9i32.to_le_bytes()); // major
        b[layout.pci_bus_offset..layout.span()].copy_from_slice(&pci_triple(&g.pci));
        b
    }

    fn memory_with(parts: &[(usize, Vec<u8>)], len: usize) -> Vec<u8> {
        let mut m = vec![0x5au8; len];
        for (at, p) in parts {
            m[*at..*at + p.len()].copy_from_slice(p);
        }
        m
    }

    #[test]
    fn finds_a_copy_of_each_layout_and_says_which() {
        let g = h200(0, 6);
        let mem = memory_with(&[(0x100, props(&g, LAYOUTS[0])), (0x800, props(&g, LAYOUTS[1]))], 0x1000);
        let s = find_device_props(&mem, 0x7000_0000, std::slice::from_ref(&g));
        assert_eq!(s.found, vec![(g.uuid, 0x7000_0100, 13), (g.uuid, 0x7000_0800, 12)]);
        assert!(s.lookalikes.is_empty());
    }

    /// Eight GPUs (their UUIDs alike in the first eight bytes, the search's key, and one unlike them): each copy is
    /// found once and named by its own GPU, whatever the order of the wanted list.
    #[test]
    fn copies_of_many_gpus_with_alike_keys_are_each_found_once() {
        let mut gpus: Vec<GpuIdentity> = (0u8..7).map(|n| h200(n, 6 + u32::from(n))).collect();
        let mut unlike = h200(7, 0x13);
        unlike.uuid.0[0] = 0x07;
        gpus.push(unlike);
        let mem = memory_with(
            &[(0x100, props(&gpus[6], L13)), (0x800, props(&gpus[2], L13)), (0x1000, props(&gpus[7], L13))],
            0x1800,
        );
        for wanted in [gpus.clone(), gpus.iter().rev().cloned().collect()] {
            let s = find_device_props(&mem, 0x4000, &wanted);
            assert_eq!(
                s.found,
                vec![(gpus[6].uuid, 0x4100, 13), (gpus[2].uuid, 0x4800, 13), (gpus[7].uuid, 0x5000, 13)]
            );
            assert!(s.lookalikes.is_empty(), "{:?}", s.lookalikes);
        }
    }

    #[test]
    fn decoys_are_left_alone() {
        let g = h200(0, 6);
        let other = h200(1, 7);
        // The UUID where a copy keeps it, but another GPU's name.
        let mut wrong_name = props(&g, L13);
        wrong_name[..other.name.len() + 1].copy_from_slice(b"NVIDIA A100\0");
        // Name and UUID, but the PCI triple at no known layout's offset.
        let mut moved_triple = props(&g, L13);
        moved_triple[L13.pci_bus_offset..L13.span()].fill(0);
        moved_triple[600..612].copy_from_slice(&pci_triple(&g.pci));
        // Name and UUID, and the triple of another GPU.
        let mut other_pci = props(&g, L13);
        other_pci[L13.pci_bus_offset..L13.span()].copy_from_slice(&pci_triple(&other.pci));
        // The bare UUID (how libcuda keeps it), with no name before it.
        let mut bare = vec![0u8; 1008];
        bare[UUID_OFFSET..UUID_OFFSET + 16].copy_from_slice(g.uuid.as_bytes());
        // A name that only starts like the GPU's.
        let mut longer = props(&g, L13);
        longer[g.name.len()] = b'X';
        let mem = memory_with(
            &[(0x0, wrong_name), (0x400, moved_triple), (0x800, other_pci), (0xc00, bare), (0x1000, longer)],
            0x1800,
        );
        let s = find_device_props(&mem, 0x1000, std::slice::from_ref(&g));
        assert!(s.found.is_empty(), "{:?}", s.found);
        assert_eq!(s.lookalikes, vec![0x1000, 0x1400, 0x1800, 0x1c00, 0x2000]);
    }

    #[test]
    fn a_copy_matching_two_layouts_is_ambiguous_and_left_alone() {
        let g = h200(0, 6);
        let mut b = props(&g, LAYOUTS[0]);
        b[LAYOUTS[1].pci_bus_offset..LAYOUTS[1].span()].copy_from_slice(&pci_triple(&g.pci));
        let s = find_device_props(&b, 0, std::slice::from_ref(&g));
        assert!(s.found.is_empty());
        assert_eq!(s.lookalikes, vec![0]);
    }

    #[test]
    fn unaligned_and_cut_copies_are_not_reported() {
        let g = h200(0, 6);
        let mem = memory_with(&[(0x104, props(&g, L13))], 0x800);
        assert!(find_device_props(&mem, 0, std::slice::from_ref(&g)).found.is_empty(), "UUID not 8-aligned");
        let p = props(&g, L13);
        let cut = &p[..MAX_SPAN - 1];
        assert_eq!(find_device_props(cut, 0, std::slice::from_ref(&g)), PropScan::default(), "span not whole yet");
        // Its UUID at the very start: the name lies in the previous window.
        assert!(find_device_props(&p[UUID_OFFSET..], 256, std::slice::from_ref(&g)).found.is_empty());
    }

    #[test]
    fn recorded_copies_are_classified_and_rewritten_only_when_stale() {
        let old = h200(0, 6);
        let new = h200(1, 7);
        let site = PropSite {
            gpu: old.uuid,
            addr: 0x1000,
            runtime_major: 13,
            mapping_start: 0,
            mapping_end: 0x10000,
            mapping_name: "[heap]".into(),
        };
        assert_eq!(check_recorded(&site, Some(&props(&old, L13)[..]), &old, &new), PropState::Stale);
        assert_eq!(check_recorded(&site, Some(&props(&new, L13)[..]), &old, &new), PropState::Fresh);
        assert_eq!(check_recorded(&site, Some(&[0u8; 600][..]), &old, &new), PropState::Changed);
        assert_eq!(check_recorded(&site, None, &old, &new), PropState::Changed);
        let mut half = props(&old, L13);
        half[UUID_OFFSET..UUID_OFFSET + 16].copy_from_slice(new.uuid.as_bytes());
        assert_eq!(
            check_recorded(&site, Some(&half[..]), &old, &new),
            PropState::Changed,
            "half-written: not guessed at"
        );
        assert_eq!(
            check_recorded(&PropSite { runtime_major: 11, ..site.clone() }, Some(&props(&old, L13)[..]), &old, &new),
            PropState::Changed,
            "unknown layout"
        );

        // Apply the plan to the stale bytes: they become the new GPU's copy, byte for byte.
        let mut bytes = props(&old, L13);
        for w in plan_prop_rewrites(&site, &old, &new) {
            let at = usize::try_from(w.addr - site.addr).unwrap();
            assert_eq!(bytes[at..at + w.expect.len()], w.expect[..]);
            bytes[at..at + w.write.len()].copy_from_slice(&w.write);
        }
        let mut want = props(&new, L13);
        want[288..296].copy_from_slice(&old.memory_total.to_le_bytes());
        assert_eq!(bytes, want);

        // Same PCI location on another node (the single-GPU machines): only the UUID changes.
        let mut elsewhere = h200(2, 6);
        elsewhere.pci = old.pci;
        let w = plan_prop_rewrites(&site, &old, &elsewhere);
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].addr, 0x1000 + UUID_OFFSET as u64);
    }

    #[test]
    fn a_swap_moves_each_copy_to_the_other_gpu() {
        let (a, b) = (h200(0, 6), h200(1, 7));
        let gpus = vec![a.clone(), b.clone()];
        let m = DeviceMap::explicit(&[(a.uuid, b.uuid), (b.uuid, a.uuid)]);
        let site = |g: &GpuIdentity| PropSite {
            gpu: g.uuid,
            addr: 0,
            runtime_major: 13,
            mapping_start: 0,
            mapping_end: 0,
            mapping_name: String::new(),
        };
        assert_eq!(moved_to(&site(&a), &m, &gpus, &gpus).map(|(o, n)| (o.uuid, n.uuid)), Some((a.uuid, b.uuid)));
        assert_eq!(moved_to(&site(&b), &m, &gpus, &gpus).map(|(o, n)| (o.uuid, n.uuid)), Some((b.uuid, a.uuid)));
        assert!(moved_to(&site(&a), &DeviceMap::explicit(&[(a.uuid, a.uuid)]), &gpus, &gpus).is_none());
    }

    #[test]
    fn libcuda_mappings_are_never_candidates() {
        assert!(!mapping_may_hold_props("/usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04"));
        assert!(mapping_may_hold_props("[heap]"));
        assert!(mapping_may_hold_props(""));
    }
}
