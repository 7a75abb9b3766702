//! The engine's errors: what fails a hook ([`EngineError`]), why one CUDA process's checkpoint or
//! restore failed ([`ProcessFailure`]), and the two parts of it that the engine's own steps make: why
//! a batch's work on a task did not run ([`BatchError`], `crate::batch`) and why a restored
//! process's identity could not be made right ([`ReconcileFailure`], `crate::reconcile`). Here, not
//! in those modules, so that the errors lie below everything that returns them: the node and the
//! driver agent's seam return [`EngineError`], and the batch and reconciliation work through them.

use std::sync::Arc;

use ccm_agent::AgentError;
use ccm_identity::pattern::PlanError;
use ccm_identity::GpuUuid;
use ccm_process::{ProcessError, PtraceError, SiteError};

use crate::host::PLUGIN_NAME;
use crate::{preflight, sharing};

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("no usable NVIDIA driver: {0}")]
    NoDriver(String),
    #[error("{0}")]
    Agent(#[source] AgentError),
    #[error("pid {pid}: {source}")]
    Driver {
        pid: ccm_identity::HostPid,
        #[source]
        source: AgentError,
    },
    /// A CUDA process of the tree whose checkpoint or restore failed.
    #[error("pid {pid}: {source}")]
    Process {
        pid: ccm_identity::HostPid,
        #[source]
        source: ProcessFailure,
    },
    #[error(transparent)]
    Preflight(#[from] preflight::PreflightError),
    #[error(transparent)]
    Image(#[from] preflight::ImageFileError),
    #[error(
        "CRIU's own CUDA plugin (cuda_plugin.so) is loaded too; both would checkpoint the same processes. Remove \
         cuda_plugin.so from CRIU's plugin directory (or point `libdir`/--libdir/CRIU_LIBS_DIR at a directory holding \
         only {PLUGIN_NAME}'s plugin), or set CRIU_CUDA_MIGRATE_DISABLE=1 to use CRIU's plugin instead"
    )]
    ConflictingPlugin,
    #[error(
        "the image inventory says these images were dumped with {PLUGIN_NAME}, but {dir} holds no cuda-migrate-*.img: \
         copy every cuda-migrate-*.img of the dump into it (they travel with the other images), or dump again"
    )]
    ImagesMissing { dir: String },
    #[error("the checkpoint holds {processes} CUDA process(es) but this node cannot restore them: {source}")]
    CannotRestore {
        processes: usize,
        #[source]
        source: Box<EngineError>,
    },
    #[error("the restoring runtime's spec cannot be read: {0}; fix the bundle, or name the container's GPUs with CRIU_CUDA_MIGRATE_USABLE_GPUS")]
    SpecFile(#[source] ccm_process::dir::FileError),
    #[error("the restoring runtime's ({runtime}) spec {path} {source}")]
    Spec {
        runtime: String,
        path: String,
        // Boxed: the spec's error is large, and every hook's Result carries this type.
        #[source]
        source: Box<ccm_settings::spec::SpecError>,
    },
    #[error(
        "the restoring runtime's {spec} does not let the container open {node}, the node of GPU {gpu} that this \
         restore puts {who} on: the container's devices cgroup would refuse it. Restore onto the \
         GPUs the spec gives the container (drop CRIU_CUDA_MIGRATE_USABLE_GPUS or the device map that names {gpu}), or \
         have the runtime give the container that GPU (Podman's `restore --import` keeps the checkpoint's devices; a \
         CRI restore builds a new spec from the new request); the images are unchanged"
    )]
    /// `spec`: `(runc) spec PATH`; `node`: `/dev/nvidia1 (char 195:1)`.
    NodeDenied { spec: String, node: String, gpu: String, who: String },
    #[error(
        "pid {pid}: only {left:.1} s of CRIU's --timeout ({timeout_s} s) are left to lock it; raise criu's --timeout"
    )]
    NoTimeToLock { pid: ccm_identity::HostPid, left: f64, timeout_s: u64 },
    #[error(
        "pid {pid}: its cgroup {path} is frozen (a paused container) and could not be thawed for the driver ({why}); \
         resume the container (`ctr task resume`, `podman unpause`) and checkpoint again"
    )]
    FrozenCgroup {
        pid: ccm_identity::HostPid,
        path: String,
        #[source]
        why: ccm_process::cgroup::CgroupError,
    },
    /// A claim of a forked process's NVIDIA nodes, or of a checkpoint's claims at restore.
    #[error(transparent)]
    Claim(#[from] ClaimError),
    /// The tree holds a CUDA IPC importer and `CRIU_CUDA_MIGRATE_IPC=refuse` (the default).
    #[error("{}", sharing::importer_refusal(.0))]
    IpcImporters(Vec<sharing::Importer>),
    /// Something of the tree CRIU cannot dump (an io_uring), found before the first lock: the line names the process
    /// and the way out.
    #[error("{0}. Refused before any lock: every process runs on")]
    CriuCannotDump(String),
    /// A CUDA process of the dump maps managed memory (`CRIU_CUDA_MIGRATE_MANAGED=refuse`).
    #[error("{}", sharing::managed_refusal(*.pid, .comm, .managed))]
    ManagedMemoryRefused { pid: ccm_identity::HostPid, comm: String, managed: ccm_identity::managed::ManagedMemory },
}

/// Why one CUDA process's checkpoint or restore failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ProcessFailure {
    #[error(transparent)]
    Batch(#[from] BatchError),
    #[error(transparent)]
    Driver(#[from] AgentError),
    #[error("cannot record its GPU identity: {0}")]
    Identity(std::sync::Arc<ccm_process::ProcessError>),
    #[error("its identity image cannot be written: {0}; nothing was written. Report this with the dump log")]
    ImageEncode(ccm_identity::ImageError),
    #[error("cannot write its identity image: {0}")]
    ImageWrite(std::sync::Arc<ccm_process::dir::FileError>),
    #[error("CRIU gave no image directory to write its identity image into")]
    NoImageDir,
    /// The GPU identity did not validate after the restore (strict mode kills the tree).
    #[error("GPU identity is inconsistent after restore: {}", .0.iter().map(|f| f.to_string()).collect::<Vec<_>>().join("; "))]
    Inconsistent(Vec<ReconcileFailure>),
    #[error("its CUDA state cannot be read: {0}")]
    State(AgentError),
    /// CHECKPOINTED at restore, but its identity image is not in the image directory (strict mode kills the tree).
    #[error("it is a CHECKPOINTED CUDA process, but its identity image {image} is missing: its GPUs cannot be mapped nor its identity checked")]
    NoIdentityImage { image: String },
    /// The driver answered NOT_SUPPORTED to its checkpoint (managed memory, MPS, MIG).
    #[error("{0}; {cause}", cause = sharing::checkpoint_failure_cause(Some(ccm_driver::abi::CudaCode::NotSupported)).unwrap_or_default())]
    Unsupported(AgentError),
    /// `CRIU_CUDA_MIGRATE_MULTI_PROCESS=refuse` and the dump holds several CUDA processes.
    #[error("{}", sharing::several_processes_refusal(.0))]
    SeveralProcessesRefused(Vec<ccm_identity::HostPid>),
    /// Several CUDA processes the importer check could not clear (`CRIU_CUDA_MIGRATE_MULTI_PROCESS=check`).
    #[error("{}", sharing::unchecked_processes_refusal(.0, .1))]
    UncheckedRefused(Vec<ccm_identity::HostPid>, String),
    /// A CUDA process of the dump imports another's device memory (`CRIU_CUDA_MIGRATE_IPC=refuse`).
    #[error("{}", sharing::importer_refusal(.0))]
    IpcImportersRefused(Vec<sharing::Importer>),
    /// Its staging pages were released, but the task's registers or code could not be put back exactly.
    #[error("its staging pages were released, but the task could not be put back as it was ({0}); the dump fails and the task must not run on: kill it")]
    StagingRelease(String),
    /// The restored task cannot take its staging pages (its mappings differ from the table, the page file is gone).
    #[error("its staging pages cannot be put back: {0}")]
    StagingMismatch(String),
    /// Its staging pages could not be filled back from its page file (restore, put-back).
    #[error("its staging pages cannot be filled back from its page file: {0}")]
    StagingFill(std::sync::Arc<ccm_process::staging_pages::StagingIoError>),
}

/// Why a task's work in a batch (`crate::batch`) did not run or did not finish.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BatchError {
    #[error("cannot resume its restore thread {tid}: {source}")]
    Resume {
        tid: u32,
        #[source]
        source: PtraceError,
    },
    #[error("internal error: the worker panicked")]
    Panicked,
}

/// Why a restored process's GPU identity could not be made right (`crate::reconcile`).
#[derive(Debug, Clone, thiserror::Error)]
pub enum ReconcileFailure {
    #[error("cannot open its memory: {0}")]
    Memory(Arc<ProcessError>),
    #[error("the scan for its PCI words failed: {0}")]
    Scan(Arc<ProcessError>),
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error("site {addr:#x} ({old} -> {new}): {source}")]
    Site {
        addr: u64,
        old: GpuUuid,
        new: GpuUuid,
        #[source]
        source: Arc<SiteError>,
    },
    #[error("environment edit at +{offset}: {source}")]
    Environ {
        offset: usize,
        #[source]
        source: Arc<ProcessError>,
    },
    #[error("cannot read its memory to validate: {0}")]
    Validate(Arc<ProcessError>),
    #[error("{old} -> {new}: one of them is unknown (not in the image / not on this node)")]
    Unknown { old: GpuUuid, new: GpuUuid },
    #[error("{old} -> {new}: {why}")]
    Mismatch { old: GpuUuid, new: GpuUuid, why: String },
}

/// Why a claim fails the dump, or a claims file the restore.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ClaimError {
    #[error(
        "pid {pid} ({comm}) is no CUDA process but holds {what} of the NVIDIA driver's {name}, which criu-cuda-migrate \
         does not claim: close it in that process before the checkpoint (a child forked after CUDA init inherits \
         every descriptor of its parent: start such workers with the 'spawn' or 'forkserver' start method)"
    )]
    Unclaimable { pid: ccm_identity::HostPid, comm: String, what: String, name: String },
    #[error("pid {pid}: what it holds of the NVIDIA nodes cannot be read ({why}); nothing is claimed for it, and CRIU dumps it as it can")]
    Unreadable { pid: ccm_identity::HostPid, why: Arc<ProcessError> },
    #[error(
        "CRIU met a mapping of {node}{} that the plugin did not record for that process at CHECKPOINT_DEVICES (its \
         holdings could not be read, or it was not seen holding the node); it cannot be restored. The warning above \
         names why, if one does; otherwise report this with the dump log",
        .pid.map(|p| format!(" in pid {p}")).unwrap_or_default()
    )]
    UnknownMapping { node: ccm_identity::claims::NvidiaNode, pid: Option<u32> },
    #[error(
        "pid {pid} ({comm}) holds more of the NVIDIA nodes than a checkpoint's device claims may record ({holders} \
         process(es) counted before it): {why}. The dump is refused and every process runs on. Close the descriptors such children inherit \
         (start DataLoader or multiprocessing workers with the 'spawn' or 'forkserver' start method), or run fewer \
         of them"
    )]
    OverBound { pid: u32, comm: String, holders: usize, why: ccm_identity::claims::ClaimsError },
    #[error(
        "the tree holds more than {max} open files of NVIDIA nodes, more than a checkpoint's device claims may record"
    )]
    TooManyFiles { max: usize },
    #[error(
        "writing the device claims took {spent:.1} s, more than a dump may spend on them: the image directory's \
         file system stalls; dump to a local directory"
    )]
    WriteDeadline { spent: f64 },
    #[error("an open file of {node} (CRIU's file {id:#x}) names GPU minor {minor}, which this node's GPU list does not hold")]
    UnknownGpu { node: ccm_identity::claims::NvidiaNode, id: u32, minor: u32 },
    #[error("the device claims cuda-migrate-devices.img cannot be written: {0}")]
    Write(Arc<ccm_process::dir::FileError>),
    #[error("CRIU gave no image directory to write the device claims cuda-migrate-devices.img into")]
    NoImageDir,
    #[error("the device claims {path}: {why}")]
    Read { path: std::path::PathBuf, why: ClaimsReadError },
    #[error(
        "the checkpoint's forked workers hold {node} (CRIU's file {id:#x}), which this node cannot give them: {why}. \
         Nothing was restored; the images are unchanged"
    )]
    NoNode { node: ccm_identity::claims::NvidiaNode, id: u32, why: NoNodeReason },
    #[error("restored task {pid}: its NVIDIA descriptor (CRIU's file {id:#x}) cannot be reopened: {why}; the restore fails, the images are unchanged")]
    Reopen { id: u32, pid: u32, why: Arc<ccm_process::claims::ReopenError> },
    #[error("restored task {pid}: the placeholder of its device mapping at {addr:#x} cannot be made: {errno}")]
    Placeholder { pid: u32, addr: u64, errno: ccm_process::claims::Errno },
}

/// Why the claims file of a checkpoint cannot be read.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ClaimsReadError {
    #[error(transparent)]
    File(Arc<ccm_process::dir::FileError>),
    #[error(transparent)]
    Format(#[from] ccm_identity::claims::ClaimsError),
}

/// Why the restoring node cannot give a forked process a node it held.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoNodeReason {
    #[error(
        "the CUDA processes' device maps send dump GPU {old} to {} different GPUs ({}); give one map with \
         CRIU_CUDA_MIGRATE_DEVICE_MAP",
        .new.len(),
        .new.iter().map(|u| u.to_string()).collect::<Vec<_>>().join(", ")
    )]
    MapsDisagree { old: GpuUuid, new: Vec<GpuUuid> },
    #[error(
        "dump GPU {old} is in no CUDA process's device map and not on this node, and {usable} GPUs are usable here: \
         name its GPU with CRIU_CUDA_MIGRATE_DEVICE_MAP"
    )]
    Unplaced { old: GpuUuid, usable: usize },
    #[error("GPU {0} has no minor in this node's GPU list")]
    NoMinor(GpuUuid),
    #[error(
        "dump GPU {old} would open GPU {new}, which this restore may not use (the usable GPUs are the \
         CRIU_CUDA_MIGRATE_USABLE_GPUS setting, else what the restoring runtime's spec gives the container): pair it \
         with a usable GPU in CRIU_CUDA_MIGRATE_DEVICE_MAP"
    )]
    NotUsable { old: GpuUuid, new: GpuUuid },
    #[error("this node's driver registered no {0} (see /proc/devices)")]
    NotRegistered(String),
}
