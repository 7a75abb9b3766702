//! Preflight: before CRIU restores anything, read the identity images, check this node and
//! choose the device map. Shared by the plugin (`init(RESTORE)`) and `criu-cuda-migrate preflight`.

use std::path::PathBuf;

use ccm_driver::abi::restore_args_layout;
use ccm_identity::image::{IdentityImage, ImageError};
use ccm_identity::map::{self, Concern, DeviceMap, MapError, MapRequest, UsableGpus};
use ccm_identity::memory::{self, ProcessNeed, TargetNeed};
use ccm_identity::{GpuIdentity, GpuUuid};
use ccm_process::dir::{Dir, FileError};
use ccm_settings::spec::GivenGpus;

use crate::config::{Config, Sourced};

/// Largest identity image read: the format's own bound.
const MAX_IMAGE_FILE: u64 = ccm_identity::image::MAX_IMAGE_BYTES as u64;
/// Most identity images read from one directory (a checkpoint holds one per CUDA process): the
/// bound `ccm_archive::MAX_IMAGES` puts on an archive.
pub const MAX_IMAGES: usize = 4096;
/// Most bytes of identity images read from one directory together (sixteen maximal images; a real
/// image is a few KiB): the bound `ccm_archive::DEFAULT_MAX_KEPT_BYTES` puts on an archive. Forty
/// valid 16 MB images once held 660 MB in `inspect DIR` and in the plugin's `init(RESTORE)`.
pub const MAX_IMAGES_TOTAL: u64 = 256 << 20;

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
    #[error(
        "{dir} holds {count} identity images (cuda-migrate-*.img), more than the {MAX_IMAGES} criu-cuda-migrate \
         reads: a dump writes one per CUDA process; remove the images that are not this dump's"
    )]
    TooMany { dir: PathBuf, count: usize },
    #[error(
        "the identity images (cuda-migrate-*.img) in {dir} are more than {MAX_IMAGES_TOTAL} bytes (256 MiB) \
         together, the most criu-cuda-migrate reads (a dump writes a few KiB per process): remove the images that \
         are not this dump's"
    )]
    TooLarge { dir: PathBuf },
    #[error(
        "identity image {image} says its process's staging pages are in {page_file}, but {why}: the checkpoint is \
         incomplete (a copy or an archive that left the page file out or cut it); restore from a whole copy of \
         the checkpoint, or dump again"
    )]
    PageFile { image: PathBuf, page_file: PathBuf, why: String },
}

/// Reads every `cuda-migrate-<pid>.img` of `dir`, sorted by pid. Never writes. Each file is read
/// through the directory's fd, without following a link, and at most [`MAX_IMAGE_FILE`] bytes; at
/// most [`MAX_IMAGES`] of them, of [`MAX_IMAGES_TOTAL`] bytes together, checked from their sizes
/// before any is read (and held to while reading, should one grow meanwhile).
pub fn read_images(dir: &Dir) -> Result<Vec<(PathBuf, IdentityImage)>, ImageFileError> {
    let mut names = Vec::new();
    for name in dir.names()? {
        let Some(name) = name.to_str() else { continue };
        if ccm_identity::image::is_image_file_name(name).is_some() {
            names.push(name.to_owned());
        }
    }
    if names.len() > MAX_IMAGES {
        return Err(ImageFileError::TooMany { dir: dir.shown().to_path_buf(), count: names.len() });
    }
    let mut total = 0u64;
    for name in &names {
        let size = dir.file_size(name)?;
        if size > MAX_IMAGE_FILE {
            // One file too large is named on its own, as its read would.
            return Err(FileError::TooLarge { path: dir.shown_file(name), limit: MAX_IMAGE_FILE }.into());
        }
        total += size;
    }
    if total > MAX_IMAGES_TOTAL {
        return Err(ImageFileError::TooLarge { dir: dir.shown().to_path_buf() });
    }
    let mut out = Vec::new();
    let mut left = MAX_IMAGES_TOTAL;
    for name in &names {
        let bytes = match dir.read_file(name, MAX_IMAGE_FILE.min(left)) {
            Err(FileError::TooLarge { .. }) if left < MAX_IMAGE_FILE => {
                return Err(ImageFileError::TooLarge { dir: dir.shown().to_path_buf() })
            }
            read => read?,
        };
        left -= bytes.len() as u64;
        out.push((dir.shown_file(name), decode_image(dir.shown_file(name), name, &bytes)?));
    }
    for (path, img) in &out {
        check_page_file(dir, path, img)?;
    }
    out.sort_by_key(|(_, i)| i.pid);
    Ok(out)
}

/// The page file of an image with a staging table or a driver storage table: there, a regular file (not a link), of
/// exactly the size its table names. Refused before anything is restored; its contents are checked chunk by chunk at the fill.
pub fn check_page_file(dir: &Dir, image: &std::path::Path, img: &IdentityImage) -> Result<(), ImageFileError> {
    let Some(t) = img.page_table() else { return Ok(()) };
    let name = ccm_identity::staging::page_file_name(img.pid);
    if img.staging.is_some() && img.driver_storage.is_some() {
        return Err(ImageFileError::PageFile {
            image: image.to_path_buf(),
            page_file: dir.shown_file(&name),
            why: "its image names both a staging table and a driver storage table for it, which no dump writes"
                .to_string(),
        });
    }
    let why = match dir.file_size(&name) {
        Ok(size) if size == t.file_bytes => return Ok(()),
        Ok(size) => format!("it is {size} bytes where the table names {}", t.file_bytes),
        Err(FileError::Missing { .. }) => "it is not there".to_string(),
        Err(e) => e.to_string(),
    };
    Err(ImageFileError::PageFile { image: image.to_path_buf(), page_file: dir.shown_file(&name), why })
}

/// Reads the identity image `name` of `dir`, checking that the pid in its name is the one inside.
pub fn read_image(dir: &Dir, name: &str) -> Result<IdentityImage, ImageFileError> {
    let bytes = dir.read_file(name, MAX_IMAGE_FILE)?;
    decode_image(dir.shown_file(name), name, &bytes)
}

/// Decodes the bytes of the identity image file `name` (shown to the user as `path`: a file of a
/// directory, or a member of an archive), checking that the pid in its name is the one inside.
pub fn decode_image(path: PathBuf, name: &str, bytes: &[u8]) -> Result<IdentityImage, ImageFileError> {
    let image = IdentityImage::decode(bytes).map_err(|source| ImageFileError::Decode { path: path.clone(), source })?;
    if let Some(named) = ccm_identity::image::is_image_file_name(name) {
        if named != image.pid {
            return Err(ImageFileError::PidMismatch { path, named, inside: image.pid });
        }
    }
    Ok(image)
}

/// What the preflight needs to know of the node that restores. The plugin's [`crate::node::Node`]
/// (through its driver agent) and the command-line tool's direct NVML view both answer it, so the
/// two run the same checks and give the same verdicts.
pub trait NodeView {
    /// Every GPU of the node, NVML index order (empty when NVML lists none or is unavailable).
    fn gpus(&self) -> &[GpuIdentity];
    /// Each GPU's free memory now; `Err` with the reason when it cannot be read.
    fn free_memory(&self) -> Result<Vec<(GpuUuid, Option<u64>)>, FreeMemoryError>;
    /// The CUDA driver API version (`cuDriverGetVersion`, e.g. 13000), which decides whether a
    /// device map may be passed to the driver.
    fn cuda_driver_version(&self) -> i32;
    /// Why NVML gave no GPU list (its load or query error), when it failed: the refusal of a
    /// checkpoint with CUDA processes then says so, not "no GPU on this node".
    fn nvml_error(&self) -> Option<String> {
        None
    }
}

/// Why the GPUs' free memory cannot be read (the restore then goes on without the memory check).
#[derive(Debug, Clone, thiserror::Error)]
pub enum FreeMemoryError {
    /// The plugin's driver agent could not answer (its NVML, or the agent itself).
    #[error(transparent)]
    Agent(#[from] ccm_agent::AgentError),
    /// NVML, asked in this process (the command-line tool), failed.
    #[error(transparent)]
    Nvml(std::sync::Arc<ccm_driver::nvml::NvmlFailure>),
    /// NVML did not start in this process (the command-line tool).
    #[error("NVML is unavailable")]
    NoNvml,
}

/// Why the node cannot restore the checkpoint; each names what to do.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PreflightError {
    /// A setting's value that cannot be used: the message names where it came from.
    #[error("{from}: {source}")]
    Setting {
        from: String,
        #[source]
        source: MapError,
    },
    #[error("{0}")]
    Map(#[from] MapError),
    #[error(
        "the container being restored is given no GPU of this node ({source_of}), but the checkpoint holds CUDA \
         processes: give the container this node's GPUs (CDI, --device, the device plugin), or restore it elsewhere"
    )]
    GivenNoGpu { source_of: String },
    #[error(
        "the checkpoint holds CUDA processes but NVML lists no GPU on this node; check the NVIDIA driver \
         (`nvidia-smi`) and that CRIU runs where it sees the GPUs (runc runs a restore's CRIU in the container's \
         cgroup, whose device rules then apply)"
    )]
    NoGpu,
    #[error(
        "the checkpoint holds CUDA processes, but NVML, which names this node's GPUs, failed: {0}; check the NVIDIA \
         driver (`nvidia-smi`) and that CRIU runs where it sees the GPUs"
    )]
    NvmlFailed(String),
    /// The driver's restore arguments cannot carry a device map (older than CUDA 13.0, or newer than this build
    /// knows), and the map moves a GPU.
    #[error("{0}")]
    NoDeviceMap(String),
    /// The dump's driver copied the device memory out through its custom storage (CUDA 13.4), and this node's
    /// driver has none.
    #[error(
        "{image}: its device memory was checkpointed through the driver's custom storage (CUDA 13.4, driver r615 or \
         later), and this node's driver offers CUDA {found}, which has none: restore on a node whose driver is r615 \
         or later"
    )]
    NoCustomStorage { image: String, found: String },
    #[error(transparent)]
    Memory(#[from] memory::MemoryError),
}

/// What the free-memory check found.
#[derive(Debug, Clone)]
pub enum MemoryVerdict {
    /// The check is off (`CRIU_CUDA_MIGRATE_MEMORY_CHECK=off`).
    Off,
    /// The GPUs' free memory cannot be read: the restore goes on without the check.
    Unreadable(FreeMemoryError),
    /// What each target GPU takes; the pids whose images recorded no device memory (not checked).
    Checked { targets: Vec<TargetNeed>, unknown: Vec<u32> },
}

/// The preflight's answer: the plan of every CUDA process and the memory check.
#[derive(Debug, Clone)]
pub struct Verdict {
    pub plans: Vec<ProcessPlan>,
    pub memory: MemoryVerdict,
}

/// THE preflight, for the plugin's `init(RESTORE)` and for `criu-cuda-migrate preflight`: the
/// device map for the whole checkpoint, the driver's restore-argument layout when the map moves a
/// GPU, and each target GPU's free memory. `given` are the GPUs the restoring runtime's spec gives
/// the container (taken when no usable-GPU setting is given).
pub fn run(
    node: &dyn NodeView,
    images: Vec<(PathBuf, IdentityImage)>,
    config: &Config,
    usable: &UsableSource,
) -> Result<Verdict, PreflightError> {
    // NVML's failure first: without its list every other verdict (no GPU, a spec's GPUs absent)
    // would name the wrong cause.
    if !images.is_empty() && node.gpus().is_empty() {
        if let Some(e) = node.nvml_error() {
            return Err(PreflightError::NvmlFailed(ccm_identity::text::escaped(&e)));
        }
    }
    let plans = plan(images, node.gpus(), config, usable)?;
    let version = node.cuda_driver_version();
    if version < ccm_driver::abi::FIRST_CUSTOM_STORAGE_DRIVER_API {
        if let Some(p) = plans.iter().find(|p| p.image.driver_storage.is_some()) {
            return Err(PreflightError::NoCustomStorage {
                image: p.path.display().to_string(),
                found: format!("{}.{}", version / 1000, version % 1000 / 10),
            });
        }
    }
    if plans.iter().any(|p| !p.map.is_identity()) {
        if let Some(why) = restore_args_layout(node.cuda_driver_version()).no_map_why() {
            return Err(PreflightError::NoDeviceMap(why.to_string()));
        }
    }
    let memory = if plans.is_empty() {
        MemoryVerdict::Checked { targets: Vec::new(), unknown: Vec::new() }
    } else if !config.memory_check {
        MemoryVerdict::Off
    } else {
        match node.free_memory() {
            Ok(free) => {
                let (targets, unknown) = check_memory(&plans, &free, node.gpus())?;
                MemoryVerdict::Checked { targets, unknown }
            }
            Err(e) => MemoryVerdict::Unreadable(e),
        }
    };
    Ok(Verdict { plans, memory })
}

/// The GPUs a restore may use, and who decided it. The one place that orders the sources, for the plugin
/// and the CLI alike: the usable-GPU setting (`CRIU_CUDA_MIGRATE_USABLE_GPUS`, `--usable-gpus`), else the GPUs the
/// restoring container runtime gives the container (its spec), else every GPU of the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UsableSource {
    Setting(Sourced<UsableGpus>),
    Spec(GivenGpus),
    All,
}

/// Decides the [`UsableSource`]: `read_spec` (the restoring runtime's spec, which may be absent or refuse the
/// restore) is called only when no setting names the GPUs.
pub fn usable_source<E>(
    config: &Config,
    read_spec: impl FnOnce() -> Result<Option<GivenGpus>, E>,
) -> Result<UsableSource, E> {
    if let Some(u) = &config.usable_gpus {
        return Ok(UsableSource::Setting(u.clone()));
    }
    Ok(read_spec()?.map_or(UsableSource::All, UsableSource::Spec))
}

impl UsableSource {
    /// The node's GPUs it allows (`None`: all), each error named by who gave the list.
    fn resolve(&self, node_gpus: &[GpuIdentity]) -> Result<Option<Vec<GpuUuid>>, PreflightError> {
        match self {
            UsableSource::Setting(u) => u
                .value
                .resolve(node_gpus)
                .map(Some)
                .map_err(|source| PreflightError::Setting { from: u.from.clone(), source }),
            UsableSource::Spec(g) => Ok(Some(g.uuids.clone())),
            UsableSource::All => Ok(None),
        }
    }

    /// The node's GPUs a restore may use, every one of them when nobody narrowed the list: what forked workers'
    /// descriptors may open, by the same rule as the CUDA processes' map.
    pub fn gpus_of(&self, node_gpus: &[GpuIdentity]) -> Result<Vec<GpuUuid>, PreflightError> {
        if let UsableSource::Spec(g) = self {
            if g.uuids.is_empty() {
                return Err(PreflightError::GivenNoGpu { source_of: g.source.clone() });
            }
        }
        Ok(self.resolve(node_gpus)?.unwrap_or_else(|| node_gpus.iter().map(|g| g.uuid).collect()))
    }

    /// Who gave the list, for an error of the map about it (`None`: nobody; every GPU was allowed).
    fn named_as(&self) -> Option<String> {
        match self {
            UsableSource::Setting(u) => Some(u.from.clone()),
            UsableSource::Spec(g) => Some(format!("the restoring runtime's spec ({})", g.source)),
            UsableSource::All => None,
        }
    }
}

/// Plans one device map for the whole checkpoint (every process of a job must see the same
/// GPU move, or NCCL ranks would disagree), then gives each process its share of it, on the GPUs
/// `usable` allows ([`usable_source`]).
pub fn plan(
    images: Vec<(PathBuf, IdentityImage)>,
    node_gpus: &[GpuIdentity],
    config: &Config,
    usable: &UsableSource,
) -> Result<Vec<ProcessPlan>, PreflightError> {
    if images.is_empty() {
        return Ok(Vec::new());
    }
    if let UsableSource::Spec(g) = usable {
        if g.uuids.is_empty() {
            return Err(PreflightError::GivenNoGpu { source_of: g.source.clone() });
        }
    }
    if node_gpus.is_empty() {
        return Err(PreflightError::NoGpu);
    }
    let allowed = usable.resolve(node_gpus)?;
    let explicit: &[(GpuUuid, GpuUuid)] = config.device_map.as_ref().map_or(&[], |m| &m.value);
    let merged = merged_view(&images);
    let whole = map::plan(&MapRequest { image: &merged, node_gpus, usable: allowed.as_deref(), explicit }).map_err(
        |e| match (e.concerns(), &config.device_map, usable.named_as()) {
            (Concern::DeviceMap, Some(m), _) => PreflightError::Setting { from: m.from.clone(), source: e },
            (Concern::UsableGpus, _, Some(from)) => PreflightError::Setting { from, source: e },
            _ => PreflightError::Map(e),
        },
    )?;
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
) -> Result<(Vec<TargetNeed>, Vec<u32>), PreflightError> {
    let needs: Vec<ProcessNeed<'_>> = plans
        .iter()
        .map(|p| ProcessNeed { pid: p.image.pid, uses: p.image.device_memory.as_deref(), map: &p.map })
        .collect();
    let (targets, unknown) = memory::targets(&needs, free);
    memory::check(&targets, node_gpus)?;
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
