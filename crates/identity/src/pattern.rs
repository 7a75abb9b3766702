//! PCI word patterns and rewrite plans.
//!
//! libcuda caches each GPU's six PCI words `{domain, bus, device, 0, pciDeviceId,
//! pciSubSystemId}` (NVML's `nvmlPciInfo_t` fields) in the process; after a remapped restore they
//! still name the old GPU. The dump records where they sit ([`find_signatures`] over the
//! process's writable memory); restore plans one write per site from that single snapshot
//! ([`plan_rewrites`]), so swaps and cycles are rewritten correctly (a search-and-replace done GPU
//! by GPU would turn a swapped pair back). UUID bytes are never rewritten: the driver's own
//! records must keep their UUIDs or the next restore of the process fails.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::gpu::{GpuIdentity, GpuUuid, PciSignature};
use crate::image::PciSite;
use crate::map::DeviceMap;

/// Index of the word that is tested first: the PCI device/vendor word (`pci_device_id`, e.g.
/// `0x233510de`) is rare in memory, unlike the domain (usually 0) that starts the signature.
const KEY_WORD: usize = 4;
const KEY_OFFSET: usize = KEY_WORD * 4;

/// Finds every 4-byte-aligned occurrence (by virtual address) of the wanted signatures in `buf`,
/// which holds the memory at `base_addr`. Returns `(gpu, address)` in address order.
///
/// One pass over the aligned words compares each with the few distinct device/vendor words
/// wanted and checks the full 24 bytes only on a match, so the cost is linear in `buf`.
pub fn find_signatures(buf: &[u8], base_addr: u64, wanted: &[(GpuUuid, PciSignature)]) -> Vec<(GpuUuid, u64)> {
    let mut hits = Vec::new();
    if wanted.is_empty() || buf.len() < PciSignature::LEN_BYTES {
        return hits;
    }
    let mut keys: Vec<u32> = wanted.iter().map(|(_, s)| s.pci_device_id).collect();
    keys.sort_unstable();
    keys.dedup();
    let patterns: Vec<(GpuUuid, [u8; 24])> = wanted.iter().map(|(u, s)| (*u, s.to_bytes())).collect();

    // First offset whose address is 4-byte aligned.
    let first = ((4 - (base_addr % 4)) % 4) as usize;
    if first >= buf.len() {
        return hits;
    }
    let words = buf[first..].chunks_exact(4);
    let check = |off: usize, hits: &mut Vec<(GpuUuid, u64)>| {
        let Some(window) = buf.get(off..off + PciSignature::LEN_BYTES) else { return };
        for (uuid, bytes) in &patterns {
            if window == bytes {
                hits.push((*uuid, base_addr.wrapping_add(off as u64)));
            }
        }
    };
    let single = (keys.len() == 1).then(|| keys[0]);
    for (i, chunk) in words.enumerate() {
        let word = u32::from_ne_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        let is_key = match single {
            Some(k) => word == k,
            None => keys.binary_search(&word).is_ok(),
        };
        if !is_key {
            continue;
        }
        let key_off = first + i * 4;
        if let Some(start) = key_off.checked_sub(KEY_OFFSET) {
            check(start, &mut hits);
        }
    }
    hits
}

/// Whether a mapping may hold libcuda's PCI words: libcuda keeps them in heap objects, never on the
/// main thread's stack, where a driver query leaves stale copies of them that come and go (counted,
/// they would make the per-GPU numbers uneven).
pub fn mapping_may_hold_pci_words(mapping_name: &str) -> bool {
    mapping_name != "[stack]"
}

/// One planned write of six words into the restored process.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SiteWrite {
    pub addr: u64,
    pub gpu_old: GpuUuid,
    pub gpu_new: GpuUuid,
    /// What must be there before the write (the old GPU's signature); anything else aborts.
    pub expect: PciSignature,
    /// What to write (the new GPU's signature).
    pub write: PciSignature,
}

/// Every write a restore makes, planned from one snapshot of the sites.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct RewritePlan {
    pub writes: Vec<SiteWrite>,
}

impl RewritePlan {
    /// Writes planned for the old GPU.
    pub fn count_for(&self, old: &GpuUuid) -> usize {
        self.writes.iter().filter(|w| w.gpu_old == *old).count()
    }
}

/// Why no rewrite plan is made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("the dump found PCI words for GPUs in uneven numbers ({counts}); libcuda keeps the same number per GPU, so some hits are something else; nothing was rewritten: re-dump the process, or restore onto the same GPUs")]
    UnevenSites { counts: String },
    #[error("GPU {old} moves to {new} but no place in the process holds its PCI words any more (none recorded at dump still matches, and a scan found none): its PCI identity cannot be corrected. Restore onto the same GPUs, or onto a GPU at the same PCI location, or dump again with this plugin")]
    NoSiteForChangedGpu { old: GpuUuid, new: GpuUuid },
    #[error("site at {addr:#x} recorded for {gpu} holds {found:x?}, not that GPU's signature {expected:x?}; the image is inconsistent: re-dump the process")]
    NotOldSignature { addr: u64, gpu: GpuUuid, found: PciSignature, expected: PciSignature },
    #[error("site at {addr:#x} lies outside its mapping {start:#x}-{end:#x}; the image is inconsistent: re-dump the process")]
    SiteOutsideMapping { addr: u64, start: u64, end: u64 },
    #[error("sites at {first:#x} and {second:#x} overlap; the image is inconsistent: re-dump the process")]
    OverlappingSites { first: u64, second: u64 },
    #[error("the device map names {gpu}, which the {side} GPU list lacks; the image or the map is inconsistent with this node: re-plan the map")]
    UnknownGpu { gpu: GpuUuid, side: &'static str },
    #[error("planned write at {addr:#x} would put UUID bytes of {gpu} into the process; refusing (the driver's records must keep their UUIDs)")]
    WouldWriteUuid { addr: u64, gpu: GpuUuid },
}

/// What the sites recorded at dump hold after the driver's restore, before any write of ours.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RecordedSites {
    /// Still the dump GPU's words: to be rewritten.
    pub stale: Vec<PciSite>,
    /// Already the words of the GPU their dump GPU maps to: the driver refreshed its own copy
    /// during the restore. Left as they are (and read back by the validation like a rewrite).
    pub fresh: Vec<PciSite>,
    /// Anything else (other words, or unreadable: `None`): the records no longer describe the
    /// process, and only a scan can tell where the stale words are.
    pub unexplained: Vec<(PciSite, Option<PciSignature>)>,
}

impl RecordedSites {
    /// Whether the records can be used as they are (no scan needed).
    pub fn usable(&self) -> bool {
        self.unexplained.is_empty() && !(self.stale.is_empty() && self.fresh.is_empty())
    }
}

/// Sorts the recorded sites by what each holds now (`now[i]` for `recorded[i]`; `None` when it
/// could not be read). Process memory after a restore is the dumped memory except where the
/// driver wrote, and the driver writes only current identities: a site that now holds the new
/// words of its own GPU's mapping was refreshed by the driver and is right. A site holding any
/// other words (another GPU's included: with a swap the restore GPUs are the dump GPUs) is not
/// explained and sends the caller to a scan.
pub fn classify_recorded_sites(
    recorded: &[PciSite],
    now: &[Option<PciSignature>],
    map: &DeviceMap,
    new_gpus: &[GpuIdentity],
) -> RecordedSites {
    let mut out = RecordedSites::default();
    for (site, words) in recorded.iter().zip(now.iter().copied().chain(std::iter::repeat(None))) {
        let new_words =
            map.new_for(&site.gpu).and_then(|n| new_gpus.iter().find(|g| g.uuid == n)).map(|g| g.signature());
        match words {
            Some(w) if w == site.words => out.stale.push(site.clone()),
            Some(w) if Some(w) == new_words => out.fresh.push(site.clone()),
            other => out.unexplained.push((site.clone(), other)),
        }
    }
    out
}

/// Plans the writes that make libcuda's cached PCI words name the new GPUs.
///
/// `sites` is the snapshot recorded at dump; `old_gpus` the dump node's GPUs (image), `new_gpus`
/// this node's. Only GPUs whose signature changes are written. Sites of GPUs outside the map
/// (not enumerated by the process) are ignored.
pub fn plan_rewrites(
    sites: &[PciSite],
    map: &DeviceMap,
    old_gpus: &[GpuIdentity],
    new_gpus: &[GpuIdentity],
) -> Result<RewritePlan, PlanError> {
    plan_rewrites_after_refresh(sites, &[], map, old_gpus, new_gpus)
}

/// [`plan_rewrites`] for sites sorted by [`classify_recorded_sites`]: `stale` still hold the dump GPU's words and
/// are written; `fresh` were refreshed by the driver's own restore and are not, but they count as the GPU's sites
/// for the snapshot's checks (a GPU whose every site the driver refreshed has nothing left to correct, and the
/// number of sites per GPU is that of stale and fresh together).
pub fn plan_rewrites_after_refresh(
    stale: &[PciSite],
    fresh: &[PciSite],
    map: &DeviceMap,
    old_gpus: &[GpuIdentity],
    new_gpus: &[GpuIdentity],
) -> Result<RewritePlan, PlanError> {
    let find = |list: &[GpuIdentity], u: &GpuUuid, side: &'static str| {
        list.iter().find(|g| g.uuid == *u).cloned().ok_or(PlanError::UnknownGpu { gpu: *u, side })
    };
    // Per mapped old GPU: its signature then and the new GPU's signature now.
    let mut signatures: HashMap<GpuUuid, (GpuUuid, PciSignature, PciSignature)> = HashMap::new();
    for pair in &map.pairs {
        let (old, new) = (find(old_gpus, &pair.old, "dump node's"), find(new_gpus, &pair.new, "restore node's"));
        match (old, new) {
            (Ok(old), Ok(new)) => {
                signatures.insert(pair.old, (pair.new, old.signature(), new.signature()));
            }
            // A GPU that stays where it was needs no write; without its records its sites are
            // left out of the checks rather than failing the whole plan.
            _ if pair.old == pair.new => {}
            (Err(e), _) | (_, Err(e)) => return Err(e),
        }
    }

    // Sanity of the snapshot, before anything is planned.
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    let mut mapped_sites: Vec<&PciSite> = Vec::new();
    let mut refreshed: BTreeSet<GpuUuid> = BTreeSet::new();
    let mut by_addr: Vec<u64> = Vec::new();
    for (site, is_stale) in stale.iter().map(|s| (s, true)).chain(fresh.iter().map(|s| (s, false))) {
        let Some((_, old_sig, _)) = signatures.get(&site.gpu) else { continue };
        let end = site.addr.checked_add(PciSignature::LEN_BYTES as u64);
        if site.addr < site.mapping_start || !matches!(end, Some(e) if e <= site.mapping_end) {
            return Err(PlanError::SiteOutsideMapping {
                addr: site.addr,
                start: site.mapping_start,
                end: site.mapping_end,
            });
        }
        if site.words != *old_sig {
            return Err(PlanError::NotOldSignature {
                addr: site.addr,
                gpu: site.gpu,
                found: site.words,
                expected: *old_sig,
            });
        }
        *counts.entry(site.gpu.to_string()).or_default() += 1;
        if is_stale {
            mapped_sites.push(site);
        } else {
            refreshed.insert(site.gpu);
        }
        by_addr.push(site.addr);
    }
    by_addr.sort_unstable();
    for pair in by_addr.windows(2) {
        if pair[1] - pair[0] < PciSignature::LEN_BYTES as u64 {
            return Err(PlanError::OverlappingSites { first: pair[0], second: pair[1] });
        }
    }
    let distinct: BTreeSet<usize> = counts.values().copied().collect();
    if distinct.len() > 1 {
        let counts = counts.iter().map(|(g, n)| format!("{g}: {n}")).collect::<Vec<_>>().join(", ");
        return Err(PlanError::UnevenSites { counts });
    }

    let mut writes = Vec::new();
    for pair in &map.pairs {
        let Some(&(new, old_sig, new_sig)) = signatures.get(&pair.old) else { continue };
        if old_sig == new_sig {
            continue;
        }
        let mut any = false;
        for site in mapped_sites.iter().filter(|s| s.gpu == pair.old) {
            any = true;
            let bytes = new_sig.to_bytes();
            for gpu in [pair.old, new] {
                if bytes.windows(16).any(|w| w == gpu.as_bytes()) {
                    return Err(PlanError::WouldWriteUuid { addr: site.addr, gpu });
                }
            }
            writes.push(SiteWrite {
                addr: site.addr,
                gpu_old: pair.old,
                gpu_new: new,
                expect: old_sig,
                write: new_sig,
            });
        }
        if !any && !refreshed.contains(&pair.old) {
            return Err(PlanError::NoSiteForChangedGpu { old: pair.old, new });
        }
    }
    writes.sort_by_key(|w| w.addr);
    Ok(RewritePlan { writes })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::PciAddress;
    use crate::image::tests::{h200, uuid};
    use proptest::prelude::*;

    fn site(g: &GpuIdentity, addr: u64) -> PciSite {
        PciSite {
            gpu: g.uuid,
            addr,
            mapping_start: addr & !0xfff,
            mapping_end: (addr & !0xfff) + 0x10000,
            mapping_name: String::new(),
            words: g.signature(),
        }
    }

    #[test]
    fn a_gpu_whose_every_site_the_driver_refreshed_needs_no_write_and_is_no_failure() {
        let (a, b) = (h200(0, 6), h200(1, 7));
        let node = [a.clone(), b.clone()];
        let swap = DeviceMap::explicit(&[(a.uuid, b.uuid), (b.uuid, a.uuid)]);
        // Both of a's sites refreshed, both of b's still stale: without the fresh ones a had no site (a failure)
        // and the counts looked uneven (0 against 2).
        let fresh = [site(&a, 0x1000), site(&a, 0x3000)];
        let stale = [site(&b, 0x2000), site(&b, 0x4000)];
        let plan = plan_rewrites_after_refresh(&stale, &fresh, &swap, &node, &node).unwrap();
        assert_eq!(plan.writes.iter().map(|w| w.addr).collect::<Vec<_>>(), [0x2000, 0x4000]);
        assert_eq!((plan.count_for(&a.uuid), plan.count_for(&b.uuid)), (0, 2));
        // Every site of both refreshed: nothing to write, nothing wrong.
        let all_fresh = [fresh.as_slice(), stale.as_slice()].concat();
        assert!(plan_rewrites_after_refresh(&[], &all_fresh, &swap, &node, &node).unwrap().writes.is_empty());
        // A partial refresh still counts per GPU: one of a's refreshed, one stale, b's both stale.
        let r = plan_rewrites_after_refresh(
            &[site(&a, 0x1000), site(&b, 0x2000), site(&b, 0x4000)],
            &[site(&a, 0x3000)],
            &swap,
            &node,
            &node,
        )
        .unwrap();
        assert_eq!(r.writes.len(), 3);
        // What stays refused: a GPU with neither, and uneven totals.
        assert!(matches!(
            plan_rewrites_after_refresh(&stale, &[], &swap, &node, &node),
            Err(PlanError::NoSiteForChangedGpu { .. })
        ));
        assert!(matches!(
            plan_rewrites_after_refresh(&stale, &[site(&a, 0x1000)], &swap, &node, &node),
            Err(PlanError::UnevenSites { .. })
        ));
    }

    #[test]
    fn recorded_sites_refreshed_by_the_driver_are_kept_and_anything_else_is_unexplained() {
        let (a, b) = (h200(0, 6), h200(1, 7));
        let swap = DeviceMap::explicit(&[(a.uuid, b.uuid), (b.uuid, a.uuid)]);
        let recorded = vec![site(&a, 0x1000), site(&b, 0x2000), site(&a, 0x3000), site(&b, 0x4000)];
        let gpus = [a.clone(), b.clone()];
        // Stale (still the dump words), refreshed (the mapped GPU's words), stale, refreshed.
        let now = [Some(a.signature()), Some(a.signature()), Some(a.signature()), Some(a.signature())];
        let c = classify_recorded_sites(&recorded, &now, &swap, &gpus);
        assert_eq!(c.stale.iter().map(|s| s.addr).collect::<Vec<_>>(), [0x1000, 0x3000]);
        assert_eq!(c.fresh.iter().map(|s| s.addr).collect::<Vec<_>>(), [0x2000, 0x4000]);
        assert!(c.usable());
        // A site of A that holds B's words now: under the swap B's words are A's new words, so
        // it is refreshed; under a map that keeps A, B's words there are unexplained.
        let c = classify_recorded_sites(&recorded[..1], &[Some(b.signature())], &swap, &gpus);
        assert_eq!(c.fresh.len(), 1);
        let keep = DeviceMap::explicit(&[(a.uuid, a.uuid), (b.uuid, b.uuid)]);
        let c = classify_recorded_sites(&recorded[..1], &[Some(b.signature())], &keep, &gpus);
        assert_eq!(c.unexplained.len(), 1);
        assert!(!c.usable());
        // Unreadable, other words, or fewer readings than sites: unexplained.
        let other = PciSignature::from([9; 6]);
        let c = classify_recorded_sites(&recorded, &[None, Some(other)], &swap, &gpus);
        assert_eq!(c.unexplained.len(), 4);
        assert!(!classify_recorded_sites(&[], &[], &swap, &gpus).usable());
    }

    #[test]
    fn the_main_stack_never_holds_libcudas_words() {
        assert!(!mapping_may_hold_pci_words("[stack]"));
        assert!(mapping_may_hold_pci_words("[heap]") && mapping_may_hold_pci_words(""));
    }

    #[test]
    fn finds_aligned_signatures_only() {
        let g0 = h200(0, 6);
        let g1 = h200(1, 7);
        let mut buf = vec![0u8; 4096];
        buf[100..124].copy_from_slice(&g0.signature().to_bytes());
        buf[200..224].copy_from_slice(&g1.signature().to_bytes());
        buf[301..325].copy_from_slice(&g1.signature().to_bytes()); // unaligned: ignored
        buf[4072..4096].copy_from_slice(&g0.signature().to_bytes()); // at the very end
        let wanted = [(g0.uuid, g0.signature()), (g1.uuid, g1.signature())];
        let hits = find_signatures(&buf, 0x1000, &wanted);
        assert_eq!(hits, vec![(g0.uuid, 0x1000 + 100), (g1.uuid, 0x1000 + 200), (g0.uuid, 0x1000 + 4072)]);
        // Alignment is by address: with base 0x1001 the word at offset 301 is aligned.
        let hits = find_signatures(&buf, 0x1003, &wanted);
        assert_eq!(hits, vec![(g1.uuid, 0x1003 + 301)]);
        assert!(find_signatures(&buf[..10], 0, &wanted).is_empty());
        assert!(find_signatures(&buf, 0, &[]).is_empty());
        // Key word found too close to the start: no match, no panic.
        let mut edge = vec![0u8; 24];
        edge[0..4].copy_from_slice(&g0.pci_device_id.to_ne_bytes());
        assert!(find_signatures(&edge, 0, &wanted).is_empty());
    }

    #[test]
    fn swap_plans_from_one_snapshot() {
        let g0 = h200(0, 6);
        let g1 = h200(1, 7);
        let node = vec![g0.clone(), g1.clone()];
        let sites = vec![site(&g0, 0x1000), site(&g1, 0x2000), site(&g0, 0x3000), site(&g1, 0x4000)];
        let map = DeviceMap::explicit(&[(g0.uuid, g1.uuid), (g1.uuid, g0.uuid)]);
        let plan = plan_rewrites(&sites, &map, &node, &node).unwrap();
        assert_eq!(plan.writes.len(), 4);
        for w in &plan.writes {
            let (expect, write) = if w.gpu_old == g0.uuid { (&g0, &g1) } else { (&g1, &g0) };
            assert_eq!(w.expect, expect.signature());
            assert_eq!(w.write, write.signature());
        }
        assert_eq!(plan.count_for(&g0.uuid), 2);
    }

    #[test]
    fn identity_and_same_signature_plan_nothing() {
        let g0 = h200(0, 6);
        let mut twin = h200(5, 6); // other machine, same slot and ids
        twin.uuid.0[0] = 0xb0;
        let sites = vec![site(&g0, 0x1000)];
        let one = std::slice::from_ref(&g0);
        let plan = plan_rewrites(&sites, &DeviceMap::explicit(&[(g0.uuid, g0.uuid)]), one, one).unwrap();
        assert!(plan.writes.is_empty());
        let plan = plan_rewrites(&[], &DeviceMap::explicit(&[(g0.uuid, twin.uuid)]), one, &[twin]).unwrap();
        assert!(plan.writes.is_empty());
    }

    #[test]
    fn refusals() {
        let g0 = h200(0, 6);
        let g1 = h200(1, 7);
        let node = vec![g0.clone(), g1.clone()];
        let swap = DeviceMap::explicit(&[(g0.uuid, g1.uuid), (g1.uuid, g0.uuid)]);

        let uneven = vec![site(&g0, 0x1000), site(&g1, 0x2000), site(&g0, 0x3000)];
        assert!(matches!(plan_rewrites(&uneven, &swap, &node, &node), Err(PlanError::UnevenSites { .. })));

        let missing = vec![site(&g0, 0x1000)];
        let one_way = DeviceMap::explicit(&[(g0.uuid, g1.uuid)]);
        let r = plan_rewrites(&missing, &swap, &node, &node);
        assert!(matches!(r, Err(PlanError::NoSiteForChangedGpu { .. })), "{r:?}");
        assert!(plan_rewrites(&missing, &one_way, &node, &node).is_ok());

        let mut wrong = site(&g0, 0x1000);
        wrong.words = g1.signature();
        let r = plan_rewrites(&[wrong, site(&g1, 0x2000)], &swap, &node, &node);
        assert!(matches!(r, Err(PlanError::NotOldSignature { .. })), "{r:?}");

        let mut outside = site(&g0, 0x1000);
        outside.mapping_end = 0x1010;
        let r = plan_rewrites(&[outside, site(&g1, 0x2000)], &swap, &node, &node);
        assert!(matches!(r, Err(PlanError::SiteOutsideMapping { .. })), "{r:?}");

        let r = plan_rewrites(&[site(&g0, 0x1000), site(&g1, 0x1008)], &swap, &node, &node);
        assert!(matches!(r, Err(PlanError::OverlappingSites { .. })), "{r:?}");

        let r = plan_rewrites(&[], &DeviceMap::explicit(&[(uuid(9), g0.uuid)]), &node, &node);
        assert!(matches!(r, Err(PlanError::UnknownGpu { .. })), "{r:?}");
        let r = plan_rewrites(&[], &DeviceMap::explicit(&[(g0.uuid, uuid(9))]), &node, &node);
        assert!(matches!(r, Err(PlanError::UnknownGpu { .. })), "{r:?}");
        // An unknown GPU that stays put is no reason to refuse.
        assert!(plan_rewrites(&[], &DeviceMap::explicit(&[(uuid(9), uuid(9))]), &node, &node).is_ok());
    }

    #[test]
    fn sites_of_unmapped_gpus_are_ignored() {
        let g0 = h200(0, 6);
        let g1 = h200(1, 7);
        let g2 = h200(2, 8);
        let node = vec![g0.clone(), g1.clone(), g2.clone()];
        let sites = vec![site(&g0, 0x1000), site(&g2, 0x2000), site(&g2, 0x3000)];
        let plan = plan_rewrites(&sites, &DeviceMap::explicit(&[(g0.uuid, g1.uuid)]), &node, &node).unwrap();
        assert_eq!(plan.writes.len(), 1);
    }

    /// Release-mode timing guard for the scan (60 MiB, two GPUs). Run with
    /// `cargo test -p ccm-identity --release -- --ignored scan_speed`.
    #[test]
    #[ignore]
    fn scan_speed() {
        let g0 = h200(0, 6);
        let g1 = h200(1, 7);
        let mut buf = vec![0u8; 60 << 20];
        for (i, b) in buf.iter_mut().enumerate() {
            *b = (i.wrapping_mul(2_654_435_761) >> 13).to_le_bytes()[0];
        }
        buf[1 << 20..(1 << 20) + 24].copy_from_slice(&g1.signature().to_bytes());
        let wanted = [(g0.uuid, g0.signature()), (g1.uuid, g1.signature())];
        let start = std::time::Instant::now();
        let hits = find_signatures(&buf, 0x7f00_0000_0000, &wanted);
        let took = start.elapsed();
        assert_eq!(hits.len(), 1);
        eprintln!("scanned 60 MiB in {took:?}");
        assert!(took.as_millis() < 100, "{took:?}");
    }

    proptest! {
        #[test]
        fn prop_finds_what_was_planted(
            noise in prop::collection::vec(any::<u8>(), 64..2048),
            spots in prop::collection::vec(any::<prop::sample::Index>(), 0..4),
            base in any::<u64>(),
        ) {
            let base = base & !0xffff_ffff; // keep addresses from wrapping
            let g0 = h200(0, 6);
            let mut buf = noise;
            let mut planted = Vec::new();
            for spot in spots {
                let off = spot.index(buf.len() - 24) & !3;
                if planted.iter().any(|&p: &usize| p.abs_diff(off) < 24) { continue; }
                buf[off..off + 24].copy_from_slice(&g0.signature().to_bytes());
                planted.push(off);
            }
            let hits = find_signatures(&buf, base, &[(g0.uuid, g0.signature())]);
            for off in planted {
                prop_assert!(hits.contains(&(g0.uuid, base + off as u64)));
            }
            for (_, addr) in hits {
                prop_assert_eq!(addr % 4, 0);
                let off = usize::try_from(addr - base).unwrap();
                prop_assert_eq!(&buf[off..off + 24], &g0.signature().to_bytes()[..]);
            }
        }

        #[test]
        fn prop_permutation_plans_write_each_site_to_its_new_gpu(perm in Just((0u8..4).collect::<Vec<_>>()).prop_shuffle()) {
            let node: Vec<GpuIdentity> = (0u8..4).map(|i| {
                let mut g = h200(i, 6 + u32::from(i));
                g.pci = PciAddress { domain: 0, bus: 0, device: 6 + u32::from(i), function: 0 };
                g
            }).collect();
            let sites: Vec<PciSite> = node.iter().enumerate()
                .flat_map(|(i, g)| [site(g, 0x10_000 * (i as u64 + 1)), site(g, 0x10_000 * (i as u64 + 1) + 0x100)])
                .collect();
            let map = DeviceMap::explicit(&perm.iter().enumerate().map(|(i, &j)| (node[i].uuid, node[usize::from(j)].uuid)).collect::<Vec<_>>());
            let plan = plan_rewrites(&sites, &map, &node, &node).unwrap();
            let moved = perm.iter().enumerate().filter(|(i, &j)| *i != usize::from(j)).count();
            prop_assert_eq!(plan.writes.len(), moved * 2);
            for w in &plan.writes {
                let new = map.new_for(&w.gpu_old).unwrap();
                prop_assert_eq!(w.gpu_new, new);
                prop_assert_eq!(Some(w.write), node.iter().find(|g| g.uuid == new).map(GpuIdentity::signature));
                prop_assert_eq!(sites.iter().find(|s| s.addr == w.addr).map(|s| s.words), Some(w.expect));
            }
        }
    }
}
