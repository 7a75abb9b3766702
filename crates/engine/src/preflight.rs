//! Preflight: before CRIU restores anything, read the identity images, check this node and
//! choose the device map. Shared by the plugin (`init(RESTORE)`) and `criu-cuda-migrate preflight`.

use std::path::{Path, PathBuf};

use ccm_identity::image::IdentityImage;
use ccm_identity::map::{self, DeviceMap, MapRequest};
use ccm_identity::memory::{self, ProcessNeed, TargetNeed};
use ccm_identity::runtime::GivenGpus;
use ccm_identity::{GpuIdentity, GpuUuid};

use crate::{Config, EngineError};

/// Largest identity image we read (the format bounds it too).
const MAX_IMAGE_FILE: u64 = 16 << 20;

/// One CUDA process of the checkpoint and what restore will do with it.
#[derive(Debug, Clone)]
pub struct ProcessPlan {
    pub path: PathBuf,
    pub image: IdentityImage,
    /// The device map for this process: one pair per GPU its libcuda enumerated.
    pub map: DeviceMap,
}

/// Reads every `cuda-migrate-<pid>.img` of `dir`, sorted by pid. Never writes.
pub fn read_images(dir: &Path) -> Result<Vec<(PathBuf, IdentityImage)>, EngineError> {
    let rd = std::fs::read_dir(dir)
        .map_err(|e| EngineError::Image { path: dir.display().to_string(), message: format!("cannot list: {e}") })?;
    let mut out = Vec::new();
    for entry in rd.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if ccm_identity::image::is_image_file_name(name).is_none() {
            continue;
        }
        let path = entry.path();
        out.push((path.clone(), read_image(&path)?));
    }
    out.sort_by_key(|(_, i)| i.pid);
    Ok(out)
}

pub fn read_image(path: &Path) -> Result<IdentityImage, EngineError> {
    let err = |message: String| EngineError::Image { path: path.display().to_string(), message };
    let meta = std::fs::metadata(path).map_err(|e| err(format!("cannot read: {e}")))?;
    if meta.len() > MAX_IMAGE_FILE {
        return Err(err(format!("{} bytes is larger than any identity image ({MAX_IMAGE_FILE}); the file is not one of ours or is corrupted: re-dump", meta.len())));
    }
    let bytes = std::fs::read(path).map_err(|e| err(format!("cannot read: {e}")))?;
    IdentityImage::decode(&bytes).map_err(|e| err(e.to_string()))
}

/// Plans one device map for the whole checkpoint (every process of a job must see the same
/// GPU move, or NCCL ranks would disagree), then gives each process its share of it.
///
/// The GPUs the map may use: `CRIU_CUDA_MIGRATE_USABLE_GPUS` when set, else the GPUs the
/// restoring container runtime gives the container (`given`, from its spec), else all of them.
pub fn plan(
    images: Vec<(PathBuf, IdentityImage)>,
    node_gpus: &[GpuIdentity],
    config: &Config,
    given: Option<&GivenGpus>,
) -> Result<Vec<ProcessPlan>, EngineError> {
    // A malformed map is an error even when there is nothing to map: it is the user's input.
    let explicit = match &config.device_map {
        Some(t) => {
            map::parse_pairs(t).map_err(|e| EngineError::Preflight(format!("CRIU_CUDA_MIGRATE_DEVICE_MAP: {e}")))?
        }
        None => Vec::new(),
    };
    if images.is_empty() {
        return Ok(Vec::new());
    }
    if let Some(g) = given.filter(|g| g.uuids.is_empty() && config.usable_gpus.is_none()) {
        // Under runc, CRIU (and so the driver agent) runs in the restored container's cgroup, so
        // NVML lists only the GPUs the container may open: none, here.
        return Err(EngineError::Preflight(format!(
            "the container being restored is given no GPU of this node ({}), but the checkpoint holds CUDA \
             processes: give the container this node's GPUs (device plugin / CDI), or restore it elsewhere",
            g.source
        )));
    }
    if node_gpus.is_empty() {
        return Err(EngineError::Preflight(
            "the checkpoint holds CUDA processes but NVML lists no GPU on this node; check the NVIDIA driver (`nvidia-smi`) and that CRIU runs where it sees the GPUs (runc runs a restore's CRIU in the container's cgroup, whose device rules then apply)".into(),
        ));
    }
    let usable = match &config.usable_gpus {
        Some(t) => Some(
            map::parse_usable(t, node_gpus)
                .map_err(|e| EngineError::Preflight(format!("CRIU_CUDA_MIGRATE_USABLE_GPUS: {e}")))?,
        ),
        None => given.map(|g| g.uuids.clone()),
    };
    let merged = merged_view(&images);
    let whole = map::plan(&MapRequest { image: &merged, node_gpus, usable: usable.as_deref(), explicit: &explicit })
        .map_err(|e| EngineError::Preflight(e.to_string()))?;
    let mut plans = Vec::new();
    for (path, image) in images {
        let pairs = whole.pairs.iter().filter(|p| image.enumerated.contains(&p.old)).cloned().map(|mut p| {
            p.used = image.used.contains(&p.old);
            p
        });
        let map = DeviceMap { pairs: pairs.collect() };
        plans.push(ProcessPlan { path, image, map });
    }
    Ok(plans)
}

/// Checks each target GPU's free memory (`free`, from NVML now) against what the plans bring
/// there, processes added up. Returns what each target takes, for the log.
pub fn check_memory(
    plans: &[ProcessPlan],
    free: &[(GpuUuid, Option<u64>)],
    node_gpus: &[GpuIdentity],
) -> Result<(Vec<TargetNeed>, Vec<u32>), EngineError> {
    let needs: Vec<ProcessNeed<'_>> = plans
        .iter()
        .map(|p| ProcessNeed { pid: p.image.pid, uses: p.image.device_memory.as_deref(), map: &p.map })
        .collect();
    let (targets, unknown) = memory::targets(&needs, free);
    memory::check(&targets, node_gpus).map_err(|e| EngineError::Preflight(e.to_string()))?;
    Ok((targets, unknown))
}

/// One line per target GPU: `GPU-… takes 4.1 GiB (…) of 139.0 GiB (…) free, pids [7]`.
pub fn render_memory(targets: &[TargetNeed]) -> String {
    targets
        .iter()
        .map(|t| {
            format!(
                "{} takes {} of {} free, pid(s) {:?}",
                t.gpu,
                memory::describe_bytes(t.need),
                t.free.map(memory::describe_bytes).unwrap_or_else(|| "an unknown amount".into()),
                t.pids
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// One image standing for the whole tree: the union of what every process enumerated and used,
/// in the order of the first process that named each GPU.
fn merged_view(images: &[(PathBuf, IdentityImage)]) -> IdentityImage {
    let mut merged = images[0].1.clone();
    let push_all = |dst: &mut Vec<GpuUuid>, src: &[GpuUuid]| {
        for u in src {
            if !dst.contains(u) {
                dst.push(*u);
            }
        }
    };
    for (_, img) in &images[1..] {
        push_all(&mut merged.enumerated, &img.enumerated);
        push_all(&mut merged.used, &img.used);
        for g in &img.node_gpus {
            if !merged.node_gpus.iter().any(|m| m.uuid == g.uuid) {
                merged.node_gpus.push(g.clone());
            }
        }
    }
    merged.sites.clear();
    merged
}
