//! A dumped process's identity: what it holds before its checkpoint, the scan of its memory for
//! the node's PCI words, its image and the device memory NVML lists for it.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ccm_identity::image::{IdentityImage, ProcessEnv};
use ccm_identity::memory::DeviceMemoryUse;
use ccm_identity::{GpuIdentity, GpuUuid, HostPid, PciSignature};
use ccm_process::dir::Dir;
use ccm_process::mem::ScanReport;
use log::{debug, info, warn};

use super::MemoryByPid;
use crate::node::Node;
use crate::seam::Targets;
use crate::ProcessFailure;

/// Device memory per GPU of each of `pids` (host pids, as NVML names them), from one NVML pass.
/// `None` where NVML could not tell (unavailable, MIG, or the process listed on no GPU), so that
/// the restore's preflight skips it rather than guessing.
pub(super) fn device_memory_by_pid(node: &Node, pids: &[HostPid]) -> MemoryByPid {
    let t0 = Instant::now();
    let mut out: MemoryByPid = pids.iter().map(|p| (*p, Some(Vec::new()))).collect();
    match node.agent.device_memory() {
        Ok(gpus) => {
            for g in &gpus {
                if let Some(e) = &g.error {
                    warn!("NVML cannot tell the device memory of processes on {} ({e}); their restore will not check free memory there", g.gpu);
                }
                for (pid, bytes) in &g.processes {
                    let Some(entry) = HostPid::new((*pid).into()).and_then(|p| out.get_mut(&p)) else { continue };
                    match (bytes, entry.as_mut()) {
                        (Some(b), Some(uses)) => uses.push(DeviceMemoryUse { gpu: g.gpu, bytes: *b }),
                        (None, _) => *entry = None,
                        (Some(_), None) => {}
                    }
                }
            }
        }
        Err(e) => {
            warn!(
                "cannot read the device memory of the CUDA processes ({e}); their restore will not check free memory"
            );
            out.values_mut().for_each(|v| *v = None);
        }
    }
    for uses in out.values_mut() {
        // A CUDA process with a context is listed on its GPUs; one listed nowhere was not seen
        // (another pid namespace?): unknown, not zero.
        if uses.as_ref().is_some_and(Vec::is_empty) {
            *uses = None;
        }
    }
    for (pid, uses) in &out {
        match uses {
            Some(u) => debug!(
                "pid {pid}: device memory {}",
                u.iter()
                    .map(|x| format!("{} on {}", ccm_identity::memory::describe_bytes(x.bytes), x.gpu))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            None => debug!("pid {pid}: device memory unknown"),
        }
    }
    debug!("device memory of {} process(es) read in {:.3} s", pids.len(), t0.elapsed().as_secs_f64());
    out
}

/// What a process's identity needs from before its driver checkpoint starts, which changes it: the
/// GPU nodes it holds open (the checkpoint closes them) and its mappings (the checkpoint adds the
/// copy of its device memory). Its environment is read here too, being as cheap.
pub(super) struct BeforeCheckpoint {
    env: ProcessEnv,
    minors: std::collections::BTreeSet<u32>,
    maps: Vec<ccm_process::Mapping>,
    elapsed: std::time::Duration,
}

impl BeforeCheckpoint {
    pub(super) fn read(targets: &dyn Targets, pid: HostPid) -> Result<BeforeCheckpoint, ccm_process::ProcessError> {
        let t0 = Instant::now();
        let upid = pid.get();
        let env = match targets.process_env(upid) {
            Ok(env) => env,
            Err(e) => {
                warn!("pid {pid}: cannot read its environment ({e}); its ordinal view is not recorded");
                ProcessEnv::default()
            }
        };
        let maps = targets.read_maps(upid)?;
        let minors = targets.nvidia_minors(upid, &maps)?;
        Ok(BeforeCheckpoint { env, minors, maps, elapsed: t0.elapsed() })
    }

    /// The mappings before the checkpoint, as the staging rules see them (`crate::staging`).
    pub(super) fn map_views(&self) -> Vec<ccm_identity::staging::MapView> {
        crate::staging::map_views(&self.maps)
    }
}

/// The identity image of `pid`: the GPUs it uses (in its CUDA order), the PCI words of every GPU
/// of the node its memory holds, its runtime's `cudaDeviceProp` copies.
pub(super) fn collect_identity(
    pid: HostPid,
    node: &Node,
    targets: &dyn Targets,
    before: BeforeCheckpoint,
    device_memory: impl FnOnce() -> Option<Vec<DeviceMemoryUse>>,
) -> Result<IdentityImage, ccm_process::ProcessError> {
    let t0 = Instant::now().checked_sub(before.elapsed).unwrap_or_else(Instant::now);
    let upid = pid.get();
    let BeforeCheckpoint { env, minors, maps, .. } = before;
    let mut used: Vec<&GpuIdentity> = minors.iter().filter_map(|m| node.gpu_by_minor(*m)).collect();
    order_by_cuda_view(&mut used, &env, node.gpus());
    let scan = scan_identity(pid, node, targets, &maps)?;
    let enumerated = enumerated_gpus(pid, node, &scan);
    let mut img = IdentityImage {
        pid: targets.ns_pid(upid).unwrap_or(upid),
        host_pid: upid,
        dumped_at_unix: SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
        hostname: targets.hostname(),
        driver_version: node.driver_version().to_string(),
        cuda_driver_version: node.cuda_driver_version,
        node_gpus: node.gpus().to_vec(),
        enumerated,
        used: used.iter().map(|g| g.uuid).collect(),
        env,
        sites: scan.sites,
        prop_sites: scan.prop_sites,
        device_memory: device_memory(),
        // Filled after the checkpoint, when the plugin writes the staging pages (`crate::staging`).
        staging: None,
        driver_storage: None,
    };
    // The hostname, the process's mapping names and environment are not ours: no control
    // character of theirs reaches an image or a log raw.
    if img.escape_controls() {
        warn!("pid {pid}: its identity holds control characters (in a mapping name, its environment or the hostname); they are recorded escaped");
    }
    log_identity(pid, &img, scan.prop_lookalikes, scan.bytes_scanned, scan.mappings_scanned, scan.elapsed, t0);
    info!(
        "timing: identity scan of pid {pid}: {} MiB of resident memory read, {} MiB not resident skipped, {:.4} s",
        scan.bytes_scanned >> 20,
        scan.bytes_not_resident >> 20,
        scan.elapsed.as_secs_f64()
    );
    if let Some(why) = &scan.stopped {
        warn!(
            "pid {pid}: the identity scan stopped early: {why}; what it found is recorded (a restore onto GPUs at other \
             PCI locations may then leave some PCI words unrewritten, which its validation reports)"
        );
    }
    Ok(img)
}

/// Where libcuda keeps its words first (heap and small mappings: tens of ms even for a framework
/// process with gigabytes of host memory); everything only when that finds nothing. The same pass
/// finds the runtime's cudaDeviceProp copies (libcudart's and frameworks', in the heap like
/// libcuda's objects).
fn scan_identity(
    pid: HostPid,
    node: &Node,
    targets: &dyn Targets,
    maps: &[ccm_process::Mapping],
) -> Result<ScanReport, ccm_process::ProcessError> {
    let upid = pid.get();
    let wanted: Vec<(GpuUuid, PciSignature)> = node.gpus().iter().map(|g| (g.uuid, g.signature())).collect();
    let mut scan = targets.scan_identity(upid, maps, &wanted, node.gpus(), ccm_process::ScanScope::LIBCUDA_OBJECTS)?;
    if scan.sites.is_empty() && !wanted.is_empty() {
        debug!("pid {pid}: no PCI words in the heap or small mappings; scanning all of its memory");
        let narrow = scan.elapsed;
        let (props, lookalikes) = (std::mem::take(&mut scan.prop_sites), scan.prop_lookalikes);
        scan = targets.scan_identity(upid, maps, &wanted, &[], ccm_process::ScanScope::FULL)?;
        scan.elapsed += narrow;
        scan.prop_sites = props;
        scan.prop_lookalikes = lookalikes;
    }
    Ok(scan)
}

/// libcuda keeps the six words of every GPU it enumerated at start: that is the set the driver
/// wants pairs for at restore (CUDA_VISIBLE_DEVICES does not shrink it).
fn enumerated_gpus(pid: HostPid, node: &Node, scan: &ScanReport) -> Vec<GpuUuid> {
    let mut enumerated: Vec<GpuUuid> =
        node.gpus().iter().map(|g| g.uuid).filter(|u| scan.sites.iter().any(|s| s.gpu == *u)).collect();
    if node.gpus().is_empty() {
        warn!(
            "pid {pid}: NVML is unavailable, so its image records no GPU identity: this checkpoint can be restored only \
             onto the same GPUs, without a device map. Fix NVML (libnvidia-ml.so.1) and dump again to allow migration"
        );
    } else if enumerated.is_empty() {
        warn!("pid {pid}: found no PCI identity words of any GPU in its memory; assuming it enumerated every GPU of the node");
        enumerated = node.gpus().iter().map(|g| g.uuid).collect();
    }
    enumerated
}

/// The identity's summary line and one debug line per site.
fn log_identity(
    pid: HostPid,
    img: &IdentityImage,
    prop_lookalikes: usize,
    bytes_scanned: u64,
    mappings_scanned: usize,
    scan_elapsed: Duration,
    t0: Instant,
) {
    info!(
        "pid {pid}: identity: uses {} GPU(s) [{}], enumerated {}, {} PCI site(s), {} cudaDeviceProp cop(ies) ({} look-alike(s) left alone), device memory {}; scanned {} MiB in {} mapping(s) in {:.3} s (total {:.3} s)",
        img.used.len(),
        img.used.iter().map(|u| u.to_string()).collect::<Vec<_>>().join(", "),
        img.enumerated.len(),
        img.sites.len(),
        img.prop_sites.len(),
        prop_lookalikes,
        match &img.device_memory {
            Some(u) => ccm_identity::memory::describe_bytes(u.iter().map(|x| x.bytes).sum()),
            None => "unknown".into(),
        },
        bytes_scanned >> 20,
        mappings_scanned,
        scan_elapsed.as_secs_f64(),
        t0.elapsed().as_secs_f64()
    );
    for p in &img.prop_sites {
        debug!(
            "pid {pid}: cudaDeviceProp (CUDA {} layout) of {} at {:#x} in {}",
            p.runtime_major,
            p.gpu,
            p.addr,
            if p.mapping_name.is_empty() { "[anonymous]" } else { &p.mapping_name }
        );
    }
    for site in &img.sites {
        debug!(
            "pid {pid}: PCI site of {} at {:#x} in {} ({:#x}-{:#x}, {} KiB)",
            site.gpu,
            site.addr,
            if site.mapping_name.is_empty() { "[anonymous]" } else { &site.mapping_name },
            site.mapping_start,
            site.mapping_end,
            (site.mapping_end - site.mapping_start) >> 10
        );
    }
}

/// Orders the used GPUs as the process's CUDA ordinals: `CUDA_VISIBLE_DEVICES` order when it
/// names them, otherwise PCI bus order (what `CUDA_DEVICE_ORDER=PCI_BUS_ID` gives, and what the
/// default order gives on machines of identical GPUs).
fn order_by_cuda_view(used: &mut [&GpuIdentity], env: &ProcessEnv, node_gpus: &[GpuIdentity]) {
    used.sort_by_key(|g| g.pci);
    let Some(cvd) = env.cuda_visible_devices.as_deref() else { return };
    let rank = |g: &GpuIdentity| -> usize {
        for (i, item) in cvd.split(',').map(str::trim).enumerate() {
            if let Ok(u) = item.parse::<GpuUuid>() {
                if u == g.uuid {
                    return i;
                }
            } else if item.starts_with("GPU-") && g.uuid.to_string().starts_with(item) {
                return i;
            } else if let Ok(idx) = item.parse::<usize>() {
                if node_gpus.get(idx).is_some_and(|n| n.uuid == g.uuid) {
                    return i;
                }
            }
        }
        usize::MAX
    };
    used.sort_by_key(|g| rank(g));
}

pub(super) fn write_image(dir: &Dir, img: &IdentityImage) -> Result<(), ProcessFailure> {
    let t0 = Instant::now();
    // Refused here, failing the dump (which rolls the processes back), rather than written and
    // then refused by the restore.
    let bytes = img.try_encode().map_err(ProcessFailure::ImageEncode)?;
    // A fresh file renamed into place: whatever stood under that name (a planted link) is replaced.
    dir.write_file(&IdentityImage::file_name(img.pid), &bytes, 0o600)
        .map_err(|e| ProcessFailure::ImageWrite(Arc::new(e)))?;
    info!(
        "pid {}: wrote {} ({} bytes, {:.3} s)",
        img.host_pid,
        IdentityImage::file_name(img.pid),
        bytes.len(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::gpu;

    fn image(gpus: u32) -> IdentityImage {
        IdentityImage {
            staging: None,
            driver_storage: None,
            pid: 7,
            host_pid: 7,
            dumped_at_unix: 0,
            hostname: "node".into(),
            driver_version: "580.159.04".into(),
            cuda_driver_version: 13000,
            node_gpus: (0..gpus).map(gpu).collect(),
            enumerated: Vec::new(),
            used: Vec::new(),
            env: ProcessEnv::default(),
            sites: Vec::new(),
            prop_sites: Vec::new(),
            device_memory: None,
        }
    }

    #[test]
    fn an_image_over_the_format_bounds_fails_the_dump_and_writes_nothing() {
        let dir = std::env::temp_dir().join(format!("ccm-dump-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let d = Dir::open(&dir).unwrap();
        let err = write_image(&d, &image(u32::try_from(ccm_identity::image::MAX_GPUS).unwrap() + 1)).unwrap_err();
        assert!(err.to_string().contains("cannot be written"), "{err}");
        assert!(!dir.join(IdentityImage::file_name(7)).exists(), "nothing may be written");
        write_image(&d, &image(2)).unwrap();
        assert!(dir.join(IdentityImage::file_name(7)).exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
