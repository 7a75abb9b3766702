//! Preflight: before CRIU restores anything, read the identity images, check this node and
//! choose the device map. Shared by the plugin (`init(RESTORE)`) and `criu-cuda-migrate preflight`.

use std::path::PathBuf;

use ccm_identity::image::{IdentityImage, ImageError};
use ccm_identity::map::{self, DeviceMap, MapRequest};
use ccm_identity::memory::{self, ProcessNeed, TargetNeed};
use ccm_identity::runtime::GivenGpus;
use ccm_identity::{GpuIdentity, GpuUuid};
use ccm_process::dir::{Dir, FileError};

use crate::{Config, EngineError};

/// Largest identity image read: the format's own bound.
const MAX_IMAGE_FILE: u64 = ccm_identity::image::MAX_IMAGE_BYTES as u64;

/// One CUDA process of the checkpoint and what restore will do with it.
#[derive(Debug, Clone)]
pub struct ProcessPlan {
    pub path: PathBuf,
    pub image: IdentityImage,
    /// The device map for this process: one pair per GPU its libcuda enumerated.
    pub map: DeviceMap,
}

/// Why an identity image of a checkpoint cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ImageFileError {
    /// The file itself (a link, a FIFO, too large, unreadable): the message names it and the rule.
    #[error("identity image: {0}")]
    File(#[from] FileError),
    #[error("identity image {path}: {source}")]
    Decode {
        path: PathBuf,
        #[source]
        source: ImageError,
    },
    #[error(
        "identity image {path} holds pid {inside}, but its name says pid {named}: it was renamed or copied from \
         another dump; put back the file the dump wrote, or dump again"
    )]
    PidMismatch { path: PathBuf, named: u32, inside: u32 },
}

/// Reads every `cuda-migrate-<pid>.img` of `dir`, sorted by pid. Never writes. Each file is read
/// through the directory's fd, without following a link, and at most [`MAX_IMAGE_FILE`] bytes.
pub fn read_images(dir: &Dir) -> Result<Vec<(PathBuf, IdentityImage)>, ImageFileError> {
    let mut out = Vec::new();
    for name in dir.names()? {
        let Some(name) = name.to_str() else { continue };
        if ccm_identity::image::is_image_file_name(name).is_none() {
            continue;
        }
        out.push((dir.shown_file(name), read_image(dir, name)?));
    }
    out.sort_by_key(|(_, i)| i.pid);
    Ok(out)
}

/// Reads the identity image `name` of `dir`, checking that the pid in its name is the one inside.
pub fn read_image(dir: &Dir, name: &str) -> Result<IdentityImage, ImageFileError> {
    let path = dir.shown_file(name);
    let bytes = dir.read_file(name, MAX_IMAGE_FILE)?;
    let image =
        IdentityImage::decode(&bytes).map_err(|source| ImageFileError::Decode { path: path.clone(), source })?;
    if let Some(named) = ccm_identity::image::is_image_file_name(name) {
        if named != image.pid {
            return Err(ImageFileError::PidMismatch { path, named, inside: image.pid });
        }
    }
    Ok(image)
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
