//! The real seams on this test's own process (no root needed: a process may read and write its
//! own `/proc/self/mem`), and the reconciliation of a recorded PCI site in its own heap.

use std::path::PathBuf;

use ccm_identity::image::{IdentityImage, PciSite, ProcessEnv};
use ccm_identity::{GpuIdentity, HostPid, PciAddress};
use ccm_process::mem::ProcessMemory;

use crate::fake::{capture_log, config, FakeAgent};
use crate::host::{CriuHost, NoCriu};
use crate::node::Node;
use crate::seam::{DevView, RealTargets, Targets};

/// A GPU of its own bus number, so that no other test's data holds its words.
fn lone_gpu(bus: u32) -> GpuIdentity {
    GpuIdentity {
        uuid: format!("GPU-{bus:08x}-1111-2222-3333-444444444444").parse().unwrap(),
        pci: PciAddress { domain: 0x77, bus, device: 0x1d, function: 0 },
        pci_device_id: 0x2335_10de,
        pci_subsystem_id: 0x18bf_10de,
        minor: bus,
        name: "NVIDIA H200".into(),
        memory_total: 140 << 30,
    }
}

fn own() -> u32 {
    std::process::id()
}

#[test]
fn the_real_targets_read_this_process() {
    let t = RealTargets;
    assert!(t.maps_library(own(), "libc").unwrap() || t.maps_library(own(), "ccm_engine").unwrap());
    assert!(t.maps_library(u32::MAX - 7, "libc").is_err());
    assert!(t.ns_pid(own()).is_some());
    let _ = t.children_recursive(own());
    let _ = t.process_env(own()).unwrap();
    let maps = t.read_maps(own()).unwrap();
    assert!(!maps.is_empty());
    assert!(t.nvidia_minors(own(), &maps).unwrap().is_empty());
    assert!(t.frozen_cgroup_of(own()).is_none());
    assert!(t.mount_namespace(own()).is_ok());
    assert!(matches!(t.container_dev(own()), Ok(DevView::HostNamespace)));
    let _ = t.restoring_runtime_spec();
    let _ = t.hostname();
    let _ = t.kernel_gpus();
    assert!(t.resume_restore_thread(u32::MAX - 7).is_err());
    assert!(t.thaw("/sys/fs/cgroup/ccm-engine-test-no-such-cgroup", std::time::Duration::from_millis(1)).is_err());
    assert!(crate::conflicting_plugin().is_none());
    crate::check_single_threaded("a test");
}

#[test]
fn the_real_targets_kill_a_child() {
    let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
    RealTargets.kill(child.id()).unwrap();
    let status = child.wait().unwrap();
    assert!(!status.success());
}

#[test]
fn the_real_scan_finds_words_in_this_process() {
    let g = lone_gpu(0x51);
    let words = g.signature().words().to_vec();
    let addr = words.as_ptr() as u64;
    let t = RealTargets;
    let maps: Vec<_> = t.read_maps(own()).unwrap().into_iter().filter(|m| m.start <= addr && addr < m.end).collect();
    let scan = t.scan_identity(own(), &maps, &[(g.uuid, g.signature())], &[], ccm_process::ScanScope::FULL).unwrap();
    assert!(scan.sites.iter().any(|s| s.addr == addr), "{:?}", scan.sites);
    std::hint::black_box(&words);
}

#[test]
fn no_criu_offers_nothing() {
    let h = NoCriu;
    assert!(h.image_dir().is_none());
    assert!(!h.add_inventory_plugin("x"));
    assert!(h.check_and_remove_inventory_plugin("x").is_none());
    assert!(!h.set_interrupt_only_mode());
    assert!(h.log_fd().is_none());
}

/// A plan moving `old` to `new` for an image whose recorded site is `site`.
fn plan(old: &GpuIdentity, new: &GpuIdentity, sites: Vec<PciSite>) -> crate::preflight::ProcessPlan {
    let image = IdentityImage {
        staging: None,
        driver_storage: None,
        pid: 7,
        host_pid: 7,
        dumped_at_unix: 0,
        hostname: "node-a".into(),
        driver_version: "580.159.04".into(),
        cuda_driver_version: 13000,
        node_gpus: vec![old.clone()],
        enumerated: vec![old.uuid],
        used: vec![old.uuid],
        env: ProcessEnv::default(),
        sites,
        prop_sites: Vec::new(),
        device_memory: None,
    };
    let mut plans = crate::preflight::plan(
        vec![(PathBuf::from("img"), image)],
        std::slice::from_ref(new),
        &config(&[]),
        &crate::preflight::UsableSource::All,
    )
    .unwrap();
    plans.remove(0)
}

fn node(gpus: Vec<GpuIdentity>) -> Node {
    Node::load(Box::new(FakeAgent::new(gpus))).unwrap()
}

fn site_of(g: &GpuIdentity, words: &[u32]) -> PciSite {
    let addr = words.as_ptr() as u64;
    PciSite {
        gpu: g.uuid,
        addr,
        mapping_start: addr & !0xfff,
        // Two pages: the six words (24 bytes) may straddle a page boundary, and a site must lie inside its mapping
        // (one page made the reconciliation refuse about one site in 170: a flaky test).
        mapping_end: (addr & !0xfff) + 0x2000,
        mapping_name: "[heap]".into(),
        words: g.signature(),
    }
}

fn read_back(addr: u64) -> [u32; 6] {
    let mem = ProcessMemory::open_read_only(own()).unwrap();
    ccm_process::mem::read_signature(&mem, addr).unwrap().words()
}

#[test]
fn a_recorded_site_in_this_process_is_rewritten_and_validated() {
    capture_log();
    let (old, new) = (lone_gpu(0x61), lone_gpu(0x62));
    let words = old.signature().words().to_vec();
    let p = plan(&old, &new, vec![site_of(&old, &words)]);
    let pid = HostPid::new(own().into()).unwrap();
    let s = RealTargets.reconcile(pid, &p, &node(vec![new.clone()]));
    assert!(s.failures.is_empty(), "{s}");
    assert_eq!(s.sites_rewritten, 1);
    assert!(s.used_recorded_sites);
    assert_eq!(read_back(words.as_ptr() as u64), new.signature().words());
    std::hint::black_box(&words);
}

#[test]
fn a_recorded_site_the_driver_refreshed_is_kept_beside_a_stale_one() {
    capture_log();
    let (old, new) = (lone_gpu(0x71), lone_gpu(0x72));
    let stale = old.signature().words().to_vec();
    let fresh = new.signature().words().to_vec();
    let p = plan(&old, &new, vec![site_of(&old, &stale), site_of(&old, &fresh)]);
    let s = RealTargets.reconcile(HostPid::new(own().into()).unwrap(), &p, &node(vec![new.clone()]));
    assert!(s.failures.is_empty(), "{:?}", s.failures);
    assert_eq!((s.sites_rewritten, s.fresh.len()), (1, 1));
    assert!(s.to_string().contains("1 more already refreshed by the driver"), "{s}");
    assert_eq!(read_back(stale.as_ptr() as u64), new.signature().words());
    std::hint::black_box((&stale, &fresh));
}

#[test]
fn a_gone_process_fails_its_reconciliation_and_an_identity_map_has_nothing_to_do() {
    capture_log();
    let (old, new) = (lone_gpu(0x81), lone_gpu(0x82));
    let p = plan(&old, &new, Vec::new());
    let s = RealTargets.reconcile(HostPid::new(4_194_303).unwrap(), &p, &node(vec![new.clone()]));
    assert!(s.failures.iter().any(|f| matches!(f, crate::reconcile::ReconcileFailure::Memory(_))), "{s}");
    assert!(s.failures.iter().any(|f| matches!(f, crate::reconcile::ReconcileFailure::Validate(_))), "{s}");

    let same = plan(&old, &old, Vec::new());
    let s = RealTargets.reconcile(HostPid::new(own().into()).unwrap(), &same, &node(vec![old.clone()]));
    assert_eq!(s.table, "identity map: nothing to reconcile");
}
