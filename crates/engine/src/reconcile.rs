//! Reconciliation of a restored process's stale PCI identity, between the driver's restore and
//! the unlock: verify the sites recorded at dump (scan only when they no longer match), rewrite
//! them from one snapshot, fix the environment's GPU names, then validate against NVML.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ccm_identity::image::PciSite;
use ccm_identity::pattern::{classify_recorded_sites, plan_rewrites_after_refresh};
use ccm_identity::validate::{validate_gpu, GpuObservation, ReconcileReport, ReportRow, Verdict};
use ccm_identity::{GpuUuid, PciSignature};
use ccm_process::mem::ProcessMemory;
use log::{debug, info, warn};

pub use crate::error::ReconcileFailure;
use crate::node::Node;
use crate::preflight::ProcessPlan;

/// What reconciliation did to one process.
#[derive(Debug, Default)]
pub struct ReconcileSummary {
    pub sites_rewritten: usize,
    /// `(old GPU, address)` of every site rewritten.
    pub written: Vec<(GpuUuid, u64)>,
    /// `(old GPU, address)` of every recorded site the driver's restore had already refreshed.
    pub fresh: Vec<(GpuUuid, u64)>,
    /// The sites recorded at dump still held the old words (no scan was needed).
    pub used_recorded_sites: bool,
    pub env_edits: usize,
    /// The runtime's `cudaDeviceProp` copies recorded at dump: rewritten to name the new GPU,
    /// found already right, and skipped because they no longer hold what was recorded.
    pub props_rewritten: usize,
    pub props_fresh: usize,
    pub props_skipped: usize,
    /// One row per changed GPU: ordinal, old → new, sites, validation.
    /// The per-GPU report, rendered as a table.
    pub table: String,
    /// Empty when every changed GPU validated.
    pub failures: Vec<ReconcileFailure>,
    pub elapsed: Duration,
}

/// The one line (and the table below it) of the log and of `cuda-migrate-restore-<pid>.txt`.
impl std::fmt::Display for ReconcileSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let source = match (self.used_recorded_sites, self.fresh.len()) {
            (false, _) => "found by scan".to_string(),
            (true, 0) => "sites recorded at dump".to_string(),
            (true, n) => format!("sites recorded at dump; {n} more already refreshed by the driver"),
        };
        write!(
            f,
            "{} site(s) rewritten ({source}), cudaDeviceProp copies: {} rewritten, {} already right, {} skipped, {} \
             environment edit(s), {:.3} s\n{}",
            self.sites_rewritten,
            self.props_rewritten,
            self.props_fresh,
            self.props_skipped,
            self.env_edits,
            self.elapsed.as_secs_f64(),
            self.table
        )
    }
}

pub fn reconcile(pid: ccm_identity::HostPid, plan: &ProcessPlan, node: &Node) -> ReconcileSummary {
    // The process layer names processes by their number in CRIU's pid namespace.
    let pid = pid.get();
    let t0 = Instant::now();
    let mut s = ReconcileSummary::default();
    let changed = plan.map.changed();
    if changed.is_empty() {
        s.table = "identity map: nothing to reconcile".into();
        s.elapsed = t0.elapsed();
        return s;
    }
    if let Err(e) = rewrite(pid, plan, node, &mut s) {
        s.failures.push(e);
    }
    rewrite_props(pid, plan, node, &mut s);
    validate(pid, plan, node, &changed, &mut s);
    s.elapsed = t0.elapsed();
    s
}

fn old_signature(plan: &ProcessPlan, u: &GpuUuid) -> Option<PciSignature> {
    plan.image.gpu(u).map(|g| g.signature())
}

/// The sites to rewrite, and those the driver already refreshed: the sites recorded at dump when
/// each still holds its old words or the new words of its own mapping, otherwise a fresh scan
/// for the old signatures of every enumerated GPU (one snapshot before any write, so swaps and
/// cycles are never rewritten twice).
fn current_sites(
    pid: u32,
    plan: &ProcessPlan,
    node: &Node,
    mem: &ProcessMemory,
) -> Result<CurrentSites, ReconcileFailure> {
    let recorded = &plan.image.sites;
    if !recorded.is_empty() {
        let now: Vec<Option<PciSignature>> =
            recorded.iter().map(|site| ccm_process::mem::read_signature(mem, site.addr).ok()).collect();
        let c = classify_recorded_sites(recorded, &now, &plan.map, node.gpus());
        if c.usable() {
            if !c.fresh.is_empty() {
                info!(
                    "pid {pid}: {} of {} PCI sites recorded at dump were already refreshed by the driver's restore",
                    c.fresh.len(),
                    recorded.len()
                );
            }
            return Ok(CurrentSites { stale: c.stale, fresh: c.fresh, recorded: true });
        }
        // Say what the unexplained records hold now: it tells whether a driver reused that
        // memory, which decides whether a scan can be avoided.
        let (mut unreadable, mut other) = (0, 0);
        for (site, words) in &c.unexplained {
            match words {
                Some(w) => {
                    other += 1;
                    debug!(
                        "pid {pid}: recorded site {:#x} ({}) now holds {:x?}",
                        site.addr,
                        site.mapping_name,
                        w.words()
                    );
                }
                None => unreadable += 1,
            }
        }
        warn!(
            "pid {pid}: {} of {} PCI sites recorded at dump are unexplained ({other} hold other words, {unreadable} \
             unreadable; {} still stale, {} refreshed by the driver); scanning its memory",
            c.unexplained.len(),
            recorded.len(),
            c.stale.len(),
            c.fresh.len()
        );
    }
    let wanted: Vec<(GpuUuid, PciSignature)> =
        plan.image.enumerated.iter().filter_map(|u| old_signature(plan, u).map(|s| (*u, s))).collect();
    // The heap and small mappings first (where libcuda keeps the words); all of the process's
    // memory, which after a restore also holds the host copy of its device memory, only when
    // the narrow scan does not find every enumerated GPU the same number of times.
    let mut scan = ccm_process::scan_signatures_in(pid, &wanted, ccm_process::ScanScope::LIBCUDA_OBJECTS)
        .map_err(|e| ReconcileFailure::Scan(Arc::new(e)))?;
    if !evenly_found(&scan.sites, &wanted) {
        let narrow = scan.elapsed;
        scan = ccm_process::scan_signatures_in(pid, &wanted, ccm_process::ScanScope::FULL)
            .map_err(|e| ReconcileFailure::Scan(Arc::new(e)))?;
        scan.elapsed += narrow;
    }
    info!(
        "pid {pid}: scanned {} MiB in {} mapping(s) in {:.3} s: {} site(s)",
        scan.bytes_scanned >> 20,
        scan.mappings_scanned,
        scan.elapsed.as_secs_f64(),
        scan.sites.len()
    );
    Ok(CurrentSites { stale: scan.sites, fresh: Vec::new(), recorded: false })
}

/// Where the process's PCI words are, just before the rewrite.
struct CurrentSites {
    /// Holding the dump GPUs' words: rewritten.
    stale: Vec<PciSite>,
    /// Already holding the new GPUs' words (the driver refreshed them): kept, and validated.
    fresh: Vec<PciSite>,
    /// From the records of the dump (no scan).
    recorded: bool,
}

/// Every wanted GPU found, and found the same number of times (libcuda keeps the same objects
/// for each GPU it enumerated).
fn evenly_found(sites: &[PciSite], wanted: &[(GpuUuid, PciSignature)]) -> bool {
    let counts: Vec<usize> = wanted.iter().map(|(u, _)| sites.iter().filter(|s| s.gpu == *u).count()).collect();
    counts.first().is_some_and(|&c| c > 0 && counts.iter().all(|&n| n == c))
}

fn rewrite(pid: u32, plan: &ProcessPlan, node: &Node, s: &mut ReconcileSummary) -> Result<(), ReconcileFailure> {
    let mem = ProcessMemory::open_read_write(pid).map_err(|e| ReconcileFailure::Memory(Arc::new(e)))?;
    let sites = current_sites(pid, plan, node, &mem)?;
    s.used_recorded_sites = sites.recorded;
    s.fresh = sites.fresh.iter().map(|site| (site.gpu, site.addr)).collect();
    let rewrites =
        plan_rewrites_after_refresh(&sites.stale, &sites.fresh, &plan.map, &plan.image.node_gpus, node.gpus())?;
    for w in &rewrites.writes {
        ccm_process::mem::verify_and_write(&mem, w.addr, &w.expect, &w.write).map_err(|e| ReconcileFailure::Site {
            addr: w.addr,
            old: w.gpu_old,
            new: w.gpu_new,
            source: Arc::new(e),
        })?;
        s.sites_rewritten += 1;
        s.written.push((w.gpu_old, w.addr));
    }
    // Children and frameworks map GPUs through these variables: keep them naming the GPUs the
    // process now runs on. Same length, in place.
    match ccm_process::environ::read_environ_block(pid) {
        Ok(block) => {
            let plan_env =
                ccm_identity::env::plan_env_edits(&block.bytes, &plan.map, &plan.image.node_gpus, node.gpus());
            for w in &plan_env.warnings {
                warn!("pid {pid}: {w}");
            }
            for e in &plan_env.edits {
                ccm_process::environ::write_environ_edit(pid, block.start, e.offset, &e.old, &e.new)
                    .map_err(|err| ReconcileFailure::Environ { offset: e.offset, source: Arc::new(err) })?;
                s.env_edits += 1;
            }
        }
        Err(e) => warn!("pid {pid}: cannot read its environment ({e}); GPU names in it are left as they were"),
    }
    Ok(())
}

/// Makes the runtime's `cudaDeviceProp` copies recorded at dump name their new GPUs. A copy that
/// no longer holds the dump GPU's name, UUID and PCI location is skipped and reported, never
/// guessed at; every write is verified before and read back after.
fn rewrite_props(pid: u32, plan: &ProcessPlan, node: &Node, s: &mut ReconcileSummary) {
    use ccm_identity::devprop::{self, PropState};
    if plan.image.prop_sites.is_empty() {
        return;
    }
    let mem = match ProcessMemory::open_read_write(pid) {
        Ok(m) => m,
        Err(e) => {
            warn!("pid {pid}: cannot open its memory for the cudaDeviceProp copies ({e}); they still name the dump node's GPUs");
            s.props_skipped += plan.image.prop_sites.len();
            return;
        }
    };
    // One snapshot of every copy before any write (a swap must not rewrite a copy twice).
    let mut planned = Vec::new();
    for site in &plan.image.prop_sites {
        let Some((old, new)) = devprop::moved_to(site, &plan.map, &plan.image.node_gpus, node.gpus()) else {
            continue;
        };
        let span = devprop::layout(site.runtime_major).map_or(0, |l| l.span());
        let mut now = vec![0u8; span];
        let readable = span > 0 && mem.read_exact_at(site.addr, &mut now).is_ok();
        match devprop::check_recorded(site, readable.then_some(&now[..]), old, new) {
            PropState::Stale => planned.push((site, devprop::plan_prop_rewrites(site, old, new))),
            PropState::Fresh => s.props_fresh += 1,
            PropState::Changed => {
                s.props_skipped += 1;
                warn!(
                    "pid {pid}: the cudaDeviceProp copy of {} recorded at {:#x} ({}) no longer holds that GPU's name, UUID and PCI location; left as it is",
                    site.gpu,
                    site.addr,
                    if site.mapping_name.is_empty() { "[anonymous]" } else { &site.mapping_name }
                );
            }
        }
    }
    for (site, writes) in planned {
        let mut ok = true;
        for w in &writes {
            if let Err(e) = ccm_process::mem::verify_and_write_bytes(&mem, w.addr, &w.expect, &w.write) {
                warn!("pid {pid}: cudaDeviceProp copy at {:#x}: {e}; left as it is", site.addr);
                ok = false;
                break;
            }
        }
        if ok {
            s.props_rewritten += 1;
        } else {
            s.props_skipped += 1;
        }
    }
}

fn validate(pid: u32, plan: &ProcessPlan, node: &Node, changed: &[(GpuUuid, GpuUuid)], s: &mut ReconcileSummary) {
    let mem = match ProcessMemory::open_read_only(pid) {
        Ok(m) => m,
        Err(e) => {
            s.failures.push(ReconcileFailure::Validate(Arc::new(e)));
            return;
        }
    };
    let mut report = ReconcileReport::default();
    for (old, new) in changed {
        let (Some(old_gpu), Some(new_gpu)) = (plan.image.gpu(old), node.gpu(new)) else {
            s.failures.push(ReconcileFailure::Unknown { old: *old, new: *new });
            continue;
        };
        // Read back every place rewritten (or found refreshed) for this GPU: what the process
        // reads after unlock.
        let words: Vec<PciSignature> = s
            .written
            .iter()
            .chain(&s.fresh)
            .filter(|(gpu, _)| gpu == old)
            .filter_map(|(_, addr)| ccm_process::mem::read_signature(&mem, *addr).ok())
            .collect();
        let sites = words.len();
        // NVML by the PCI location the process will now report must be the GPU the driver
        // restored onto.
        let named = words.first().map(|w| w.pci()).unwrap_or(new_gpu.pci);
        let nvml_uuid = node.uuid_at_pci(&named);
        let obs = GpuObservation { old: *old, new: *new, words_in_process: words, nvml_uuid_at_new_pci: nvml_uuid };
        let verdict = validate_gpu(&obs, new_gpu);
        if let Verdict::Mismatch(m) = &verdict {
            s.failures.push(ReconcileFailure::Mismatch { old: *old, new: *new, why: m.clone() });
        }
        let ordinal = plan.image.used.iter().position(|u| u == old).and_then(|i| u32::try_from(i).ok());
        report.rows.push(ReportRow::from_verdict(ordinal, old_gpu, new_gpu, sites, &verdict));
    }
    s.table = report.render_table();
}
