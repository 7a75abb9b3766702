//! CUDA processes that share device memory: what the kernel driver shows of it, what the plugin
//! decides, and what it says.
//!
//! Measured on driver 580.159.04 (`tests/gpu/ipc-probe.sh`, `tests/gpu/ipc-criu.sh`, docs/GPU-TESTING.md): a
//! process that has another process's device memory open, through legacy CUDA IPC (`cudaIpcOpenMemHandle`:
//! torch.multiprocessing CUDA tensors, vLLM/SGLang custom all-reduce) or a cuMem POSIX-fd handle
//! (`cuMemImportFromShareableHandle`: NCCL's P2P transport), locks and checkpoints without an error, but its
//! restore fails (`CUDA_ERROR_INVALID_VALUE` for legacy IPC, `CUDA_ERROR_NOT_SUPPORTED` for cuMem), in place too
//! and in either order, and a retry answers `CUDA_ERROR_OPERATING_SYSTEM`: the process stays CHECKPOINTED for
//! good. The exporter restores fine. So a checkpoint of an importer loses the job.
//!
//! The process's fds, mappings and NVML's view look like those of a process that shares nothing, but the kernel
//! driver's resource manager does not (GPU-FACTS.md, "The resource manager sees CUDA IPC importers"): it keeps,
//! per process and GPU, the memory the process dup'd from another process's allocation, which is exactly what an
//! import is; no single process showed any (plain, exporters, managed memory, torch's caching allocator and
//! expandable segments, a one-rank NCCL communicator, a CUDA graph). `ccm_driver::rm` asks it from the driver
//! agent; [`importers_in`] reads the answer, and the dump refuses a tree with an importer before any checkpoint
//! (`CRIU_CUDA_MIGRATE_IPC=refuse`, the default), names every importer, and says how to get out. When the
//! resource manager cannot be asked, the dump goes on as before, with a warning for a tree of several CUDA
//! processes that says why the check could not run.
//!
//! No I/O here: texts and rules, unit-tested.

use ccm_driver::abi::CudaCode;
use ccm_driver::rm::{PidMemoryReport, RmStatus};
use ccm_identity::{GpuUuid, HostPid, PciAddress};
use ccm_settings::value::{IpcImporters, MultiProcess};
use ccm_settings::{IPC, MANAGED, MULTI_PROCESS};

/// The ways of sharing device memory users meet, for the lines below.
const IPC_KINDS: &str = "CUDA IPC (cudaIpcOpenMemHandle, or cuMemImportFromShareableHandle: torch.multiprocessing \
                         CUDA tensors, vLLM/SGLang custom all-reduce, NCCL's P2P transport between ranks of one node)";

/// The ways out, for every line that names IPC.
const IPC_WAYS_OUT: &str = "release the IPC before the checkpoint (drop the torch.multiprocessing CUDA tensors a \
                            process received, destroy NCCL communicators or suspend them with ncclCommSuspend, turn \
                            custom all-reduce off, e.g. vLLM's --disable-custom-all-reduce), or use a driver with \
                            job checkpointing (r610 or newer, jobs started with `cuda-checkpoint --launch-job`)";

fn pid_list(pids: &[HostPid]) -> String {
    pids.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(", ")
}

/// Mebibytes, never 0 for memory that is there.
fn mib(bytes: u64) -> u64 {
    bytes.div_ceil(1 << 20)
}

/// A process the resource manager reports holding device memory dup'd from another process's allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Importer {
    pub pid: HostPid,
    pub gpu: PciAddress,
    /// The GPU's UUID, where the node's GPU list names the PCI location.
    pub gpu_uuid: Option<GpuUuid>,
    /// The imported memory (RM's `memSharedDuped`).
    pub imported_bytes: u64,
    /// An MPS server holds memory on that GPU: the process is an MPS client (its memory is the server's), not a
    /// CUDA IPC importer ([`mark_mps_clients`]).
    pub mps_server: Option<HostPid>,
}

impl Importer {
    /// Whether it is an MPS client.
    pub fn is_mps_client(&self) -> bool {
        self.mps_server.is_some()
    }
}

impl std::fmt::Display for Importer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "pid {} has {} MiB of another process's device memory open on GPU {}",
            self.pid,
            mib(self.imported_bytes),
            self.gpu
        )?;
        if let Some(u) = self.gpu_uuid {
            write!(f, " ({u})")?;
        }
        if let Some(server) = self.mps_server {
            write!(f, ": it is an MPS client (the MPS server, pid {server}, holds memory on that GPU)")?;
        }
        Ok(())
    }
}

/// The importers that are live processes holding a GPU node, and the others: a process that died while a descriptor
/// it passed on (a forked child's) keeps its driver client alive leaves its memory under its pid number, which
/// another process may take (measured by the red team on an H200). `live(pid)`: the process that number names now
/// is the one the resource manager was asked about (same start time) and holds a GPU node.
pub fn split_live_importers(
    importers: Vec<Importer>,
    live: impl Fn(HostPid) -> bool,
) -> (Vec<Importer>, Vec<Importer>) {
    importers.into_iter().partition(|i| live(i.pid))
}

/// The line for importers that are not counted (see [`split_live_importers`]).
pub fn stale_importers_line(stale: &[Importer]) -> String {
    format!(
        "not counted as importers: {} — the process with that number holds no GPU node now, or is not the one the \
         resource manager answered for (its number was reused): the memory is a dead process's, kept by a descriptor \
         another process inherited",
        importer_list(stale)
    )
}

/// The executable of the MPS server (`nvidia-cuda-mps-control` starts one per user and GPU set).
pub const MPS_SERVER_EXE: &str = "nvidia-cuda-mps-server";

/// Marks the importers that are MPS clients: an MPS client's memory is the MPS server's, which the resource
/// manager shows as duped into the client, as for a CUDA IPC import. `servers` is the resource manager's report
/// for the node's MPS server processes: an importer on a GPU where a server holds memory is its client.
pub fn mark_mps_clients(importers: &mut [Importer], servers: &PidMemoryReport) {
    for i in importers.iter_mut() {
        i.mps_server = servers
            .gpus
            .iter()
            .filter(|g| g.pci == i.gpu)
            .flat_map(|g| g.pids.iter())
            .find(|p| p.status == RmStatus::OK && p.memory.total() > 0)
            .and_then(|p| HostPid::new(p.pid.into()));
    }
}

/// The way out for an MPS client.
pub const MPS_WAY_OUT: &str = "driver 580 cannot checkpoint an MPS client at all (its cuCheckpointProcessLock answers \
     CUDA_ERROR_NOT_SUPPORTED, measured): run the job without MPS to checkpoint it (start it where no MPS control \
     daemon serves its GPUs, or with CUDA_MPS_PIPE_DIRECTORY pointing at a directory no daemon listens on)";

/// What the resource manager said of the processes it was asked about.
#[derive(Debug, Clone, PartialEq)]
pub struct SharingFacts {
    /// Every process with imported memory, one entry per GPU it imported on.
    pub importers: Vec<Importer>,
    /// Processes the RM gave no answer for on a GPU (its status), which the check could not clear.
    pub unanswered: Vec<(HostPid, PciAddress, RmStatus)>,
    /// How many processes were asked about.
    pub asked: usize,
    pub seconds: f64,
}

/// The importers among the report's answers; `uuid_of` names a GPU by its PCI location.
pub fn importers_in(report: &PidMemoryReport, uuid_of: impl Fn(PciAddress) -> Option<GpuUuid>) -> SharingFacts {
    let mut importers = Vec::new();
    let mut unanswered = Vec::new();
    let mut asked = std::collections::BTreeSet::new();
    for gpu in &report.gpus {
        for p in &gpu.pids {
            let Some(pid) = HostPid::new(p.pid.into()) else { continue };
            asked.insert(pid);
            if p.status != RmStatus::OK {
                unanswered.push((pid, gpu.pci, p.status));
            } else if p.memory.shared_duped > 0 {
                importers.push(Importer {
                    pid,
                    gpu: gpu.pci,
                    gpu_uuid: uuid_of(gpu.pci),
                    imported_bytes: p.memory.shared_duped,
                    mps_server: None,
                });
            }
        }
    }
    SharingFacts { importers, unanswered, asked: asked.len(), seconds: report.seconds }
}

/// The importers' pids, each once, in order.
pub fn importer_pids(importers: &[Importer]) -> Vec<HostPid> {
    let mut pids: Vec<HostPid> = importers.iter().map(|i| i.pid).collect();
    pids.sort();
    pids.dedup();
    pids
}

fn importer_list(importers: &[Importer]) -> String {
    importers.iter().map(|i| i.to_string()).collect::<Vec<_>>().join("; ")
}

/// Why a dump holding an importer is refused (`ipc refuse`, the default).
pub fn importer_refusal(importers: &[Importer]) -> String {
    if importers.iter().all(Importer::is_mps_client) {
        return format!(
            "refused before any checkpoint: {}. {MPS_WAY_OUT}. Nothing was checkpointed; every process of the tree is \
             unlocked and runs on with its data",
            importer_list(importers)
        );
    }
    format!(
        "refused before any checkpoint: {} (a CUDA IPC import, as the kernel driver's resource manager reports it). \
         Driver 580 checkpoints such a process but cannot restore it, not even in place, so this dump would lose the \
         job. Nothing was checkpointed; every process of the tree is unlocked and runs on with its data. To \
         checkpoint it: {IPC_WAYS_OUT}. {}=allow dumps it anyway (its restore will fail on driver 580)",
        importer_list(importers),
        IPC.env
    )
}

/// The warning of a dump that holds an importer and was told to go on (`ipc allow`).
pub fn importers_allowed_warning(importers: &[Importer]) -> String {
    format!(
        "{}=allow: dumping although {} (a CUDA IPC import). Driver 580 cannot restore such a process, not even in \
         place: unless this driver can, the restore of these images will fail and the job is lost",
        IPC.env,
        importer_list(importers)
    )
}

/// The line of a dump the resource manager cleared.
pub fn no_importer_line(cuda_pids: &[HostPid], facts: &SharingFacts) -> String {
    format!(
        "the kernel driver's resource manager reports no device memory imported from another process by the {} CUDA \
         process(es) of this dump (pids {}; {} process(es) of the tree asked, {:.1} ms)",
        cuda_pids.len(),
        pid_list(cuda_pids),
        facts.asked,
        facts.seconds * 1e3
    )
}

/// The warning of a dump of several CUDA processes whose importer check could not run (`why`).
pub fn unchecked_processes_warning(pids: &[HostPid], why: &str) -> String {
    format!(
        "this dump holds {} CUDA processes (pids {}), and the importer check could not run ({why}). If one of them \
         has another's device memory open through {IPC_KINDS}, driver 580 checkpoints it but cannot restore it, not \
         even in place, and that job is lost; this dump goes on unchecked. If they share device memory: \
         {IPC_WAYS_OUT}; set {}=refuse to have dumps of several CUDA processes refused before any checkpoint",
        pids.len(),
        pid_list(pids),
        MULTI_PROCESS.env
    )
}

/// Why the check could not clear some processes: those the RM gave no answer for.
pub fn unanswered_text(unanswered: &[(HostPid, PciAddress, RmStatus)]) -> String {
    let each: Vec<String> = unanswered.iter().map(|(p, g, s)| format!("pid {p} on GPU {g}: {s}")).collect();
    format!("the resource manager gave no answer for {}", each.join("; "))
}

/// What a dump does about sharing, given its CUDA processes, the importer check's answer (or why it could not
/// run) and the settings: the plugin acts on it before the first checkpoint, and `criu-cuda-migrate job` reports
/// it in the same words.
#[derive(Debug, Clone, PartialEq)]
pub enum SharingVerdict {
    /// Refused before any checkpoint: importers (`ipc refuse`).
    Importers(Vec<Importer>),
    /// Refused before any checkpoint: several CUDA processes (`multi-process refuse`).
    SeveralProcesses(Vec<HostPid>),
    /// Refused before any checkpoint: several CUDA processes the importer check could not clear (`multi-process
    /// check`, the default), and why it could not.
    Unchecked(Vec<HostPid>, String),
    /// The dump goes on, with a line for the log and a warning when there is one.
    Proceed { info: Option<String>, warning: Option<String> },
}

impl SharingVerdict {
    /// The refusal's text, when the dump is refused.
    pub fn refusal(&self) -> Option<String> {
        match self {
            SharingVerdict::Importers(i) => Some(importer_refusal(i)),
            SharingVerdict::SeveralProcesses(p) => Some(several_processes_refusal(p)),
            SharingVerdict::Unchecked(p, why) => Some(unchecked_processes_refusal(p, why)),
            SharingVerdict::Proceed { .. } => None,
        }
    }
}

/// The rule (see [`SharingVerdict`]).
pub fn verdict(
    cuda_pids: &[HostPid],
    check: Result<&SharingFacts, &str>,
    ipc: IpcImporters,
    multi_process: MultiProcess,
) -> SharingVerdict {
    if cuda_pids.len() > 1 && multi_process == MultiProcess::Refuse {
        return SharingVerdict::SeveralProcesses(cuda_pids.to_vec());
    }
    let unchecked = |why: &str| match multi_process {
        MultiProcess::Warn => {
            SharingVerdict::Proceed { info: None, warning: Some(unchecked_processes_warning(cuda_pids, why)) }
        }
        _ => SharingVerdict::Unchecked(cuda_pids.to_vec(), why.to_string()),
    };
    let facts = match check {
        Err(why) if cuda_pids.len() > 1 => return unchecked(why),
        Err(why) => {
            let warning = (!cuda_pids.is_empty()).then(|| {
                format!(
                    "the importer check could not run ({why}); one CUDA process, dumped unchecked: if it has device \
                     memory of a process outside this dump open through {IPC_KINDS}, driver 580 cannot restore it"
                )
            });
            return SharingVerdict::Proceed { info: None, warning };
        }
        Ok(f) => f,
    };
    if !facts.importers.is_empty() {
        return match ipc {
            IpcImporters::Refuse => SharingVerdict::Importers(facts.importers.clone()),
            IpcImporters::Allow => {
                SharingVerdict::Proceed { info: None, warning: Some(importers_allowed_warning(&facts.importers)) }
            }
        };
    }
    if !facts.unanswered.is_empty() && cuda_pids.len() > 1 {
        return unchecked(&unanswered_text(&facts.unanswered));
    }
    SharingVerdict::Proceed { info: (!cuda_pids.is_empty()).then(|| no_importer_line(cuda_pids, facts)), warning: None }
}

/// Why a dump of several CUDA processes the importer check could not clear was refused (`multi-process check`).
pub fn unchecked_processes_refusal(pids: &[HostPid], why: &str) -> String {
    format!(
        "refused before any checkpoint: this dump holds {} CUDA processes (pids {}), and the importer check could not \
         run ({why}). If one of them has another's device memory open through {IPC_KINDS}, driver 580 checkpoints it \
         but cannot restore it, not even in place, and the job is lost. Nothing was checkpointed; every process is \
         unlocked and runs on. Make the check possible (CRIU must see /dev/nvidiactl and the NVIDIA kernel driver), \
         or set {}=warn to dump such trees unchecked (a warning stays)",
        pids.len(),
        pid_list(pids),
        MULTI_PROCESS.env
    )
}

/// Why a dump of several CUDA processes was refused (`multi-process refuse`).
pub fn several_processes_refusal(pids: &[HostPid]) -> String {
    format!(
        "refused before any checkpoint ({}=refuse): this dump holds {} CUDA processes (pids {}), and such dumps are \
         refused whatever the importer check finds. Every process is unlocked and runs on. To dump them, set {}=warn \
         (the default: a tree is refused only when the kernel driver reports a CUDA IPC importer in it)",
        MULTI_PROCESS.env,
        pids.len(),
        pid_list(pids),
        MULTI_PROCESS.env
    )
}

/// What a failed checkpoint's driver answer tells, for the dump's error line.
pub fn checkpoint_failure_cause(code: Option<CudaCode>) -> Option<&'static str> {
    (code == Some(CudaCode::NotSupported)).then_some(
        "the driver cannot checkpoint this process: driver 580 does not checkpoint managed (UVM) memory \
         (cudaMallocManaged, cuMemAllocManaged), MPS clients or processes on a MIG instance. The dump fails and \
         the process is put back to RUNNING with its data (the rollback lines say so); free the managed memory \
         (or stop MPS, or use a whole GPU) before the checkpoint",
    )
}

/// The managed memory among what a process holds of the NVIDIA nodes (its `/dev/nvidia-uvm` mappings).
pub fn managed_memory_of(held: &ccm_process::claims::Holdings) -> ccm_identity::managed::ManagedMemory {
    let uvm = held.mappings.iter().filter(|m| m.node == ccm_identity::claims::NvidiaNode::Uvm);
    ccm_identity::managed::managed_memory(uvm.map(|m| ccm_identity::managed::UvmMapping { start: m.start, end: m.end }))
}

/// Why a dump of a process with managed memory is refused before any lock (`managed refuse`, the default).
pub fn managed_refusal(pid: HostPid, comm: &str, managed: &ccm_identity::managed::ManagedMemory) -> String {
    let largest = managed
        .largest
        .map(|l| format!(", the largest {} at {:#x}", ccm_identity::memory::format_precise(l.len()), l.start))
        .unwrap_or_default();
    format!(
        "refused before any lock: pid {pid} ({comm}) maps {} of CUDA managed memory ({} /dev/nvidia-uvm mapping(s) \
         beyond the driver's own{largest}): driver 580's checkpoint does not support managed memory (cudaMallocManaged, \
         cuMemAllocManaged; it answers CUDA_ERROR_NOT_SUPPORTED). Nothing was locked; every process of the tree runs \
         on with its data. To checkpoint it: allocate device memory with cudaMalloc or the framework's default \
         allocator instead (CuPy: not cupy.cuda.malloc_managed; PyTorch: no managed CUDAPluggableAllocator; JAX/XLA: \
         no managed client allocator), or free the managed memory before the checkpoint. {}=try locks it and lets the \
         driver decide",
        ccm_identity::memory::format_precise(managed.bytes),
        managed.mappings,
        MANAGED.env
    )
}

/// The cause and the fix a failed driver restore's line gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestoreAdvice {
    /// What the code tells of the cause, to follow the driver's error (empty: nothing).
    pub cause: &'static str,
    /// What the user can do, after "The images are intact: ".
    pub fix: &'static str,
    /// Whether `criu-cuda-migrate recover` can bring the process back (not for an IPC importer).
    pub recoverable: bool,
}

/// Advice for a driver restore that answered `code`, of a process restored with a device map (`mapped`)
/// or in place, out of a checkpoint or dump of `cuda_processes` CUDA processes.
pub fn restore_advice(code: Option<CudaCode>, mapped: bool, cuda_processes: usize) -> RestoreAdvice {
    let ipc_like = matches!(code, Some(CudaCode::InvalidValue | CudaCode::NotSupported)) && cuda_processes > 1;
    match code {
        _ if ipc_like && mapped => RestoreAdvice {
            cause: " (the driver refused either the device map, which must pair every GPU the process enumerated \
                    with a distinct GPU of the same chip and enough memory, or the process itself: one of several \
                    CUDA processes that had another's device memory open through CUDA IPC, which driver 580 \
                    checkpoints but cannot restore)",
            fix: "if the map is right, these images cannot be restored on driver 580: restart the job from its own \
                  checkpoint, and before the next dump tear the IPC down (or use driver r610 or newer with \
                  `--launch-job`)",
            recoverable: false,
        },
        _ if ipc_like => RestoreAdvice {
            cause: " (likely cause: this is one of several CUDA processes and had another's device memory open \
                    through CUDA IPC, cudaIpcOpenMemHandle or cuMemImportFromShareableHandle, which driver 580 \
                    checkpoints but cannot restore, in place or anywhere)",
            fix: "these images cannot be restored on driver 580: restart the job from its own checkpoint, and \
                  before the next dump tear the IPC down (or use driver r610 or newer with `--launch-job`)",
            recoverable: false,
        },
        Some(CudaCode::InvalidValue) if mapped => RestoreAdvice {
            cause: " (the driver refused the device map: it must pair every GPU the process enumerated with a \
                    distinct GPU of the same chip and enough memory)",
            fix: "restore with a map that pairs every GPU of the dump (CRIU_CUDA_MIGRATE_DEVICE_MAP), or onto the \
                  same GPUs",
            recoverable: true,
        },
        Some(CudaCode::OutOfMemory) => RestoreAdvice {
            cause: " (a target GPU ran out of memory: something took it after the preflight's check)",
            fix: "free the GPU's memory and restore again",
            recoverable: true,
        },
        _ => RestoreAdvice { cause: "", fix: "fix the cause and restore again", recoverable: true },
    }
}

/// The driver code an error text names (the put-back's errors arrive as text).
pub fn code_named_in(text: &str) -> Option<CudaCode> {
    [CudaCode::InvalidValue, CudaCode::NotSupported, CudaCode::OutOfMemory, CudaCode::OperatingSystem]
        .into_iter()
        .find(|c| c.texts().and_then(|(name, _)| name.to_str().ok()).is_some_and(|name| text.contains(name)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pids(n: &[u32]) -> Vec<HostPid> {
        n.iter().map(|&p| HostPid::new(p.into()).unwrap()).collect()
    }

    fn report(entries: &[(u32, u32, u64, u32)]) -> PidMemoryReport {
        // (gpu bus, pid, duped bytes, status)
        let mut gpus: Vec<ccm_driver::rm::GpuPidMemory> = Vec::new();
        for &(bus, pid, duped, status) in entries {
            let pci = PciAddress { domain: 0, bus, device: 0, function: 0 };
            if !gpus.iter().any(|g| g.pci == pci) {
                gpus.push(ccm_driver::rm::GpuPidMemory { pci, minor: bus, pids: Vec::new() });
            }
            let g = gpus.iter_mut().find(|g| g.pci == pci).unwrap();
            g.pids.push(ccm_driver::rm::PidMemory {
                pid,
                status: RmStatus(status),
                memory: ccm_driver::rm::VideoMemory { private: 0, shared_owned: 582 << 20, shared_duped: duped },
            });
        }
        PidMemoryReport { driver_version: "580.159.04".into(), gpus, seconds: 0.0012 }
    }

    #[test]
    fn importers_are_the_processes_with_duped_memory_on_any_gpu() {
        let r = report(&[
            (6, 41, 0, 0),
            (6, 42, 64 << 20, 0),
            (7, 41, 0, 0),
            (7, 42, 0, 0),
            (7, 43, 4 << 20, 0),
            (7, 44, 0, 0x5e),
        ]);
        let uuid: GpuUuid = "GPU-00000006-0000-0000-0000-000000000000".parse().unwrap();
        let f = importers_in(&r, |pci| (pci.bus == 6).then_some(uuid));
        assert_eq!(f.asked, 4);
        assert_eq!(importer_pids(&f.importers), pids(&[42, 43]));
        assert_eq!(f.importers[0].imported_bytes, 64 << 20);
        assert_eq!(f.importers[0].gpu_uuid, Some(uuid));
        assert_eq!(f.importers[1].gpu_uuid, None);
        assert_eq!(f.unanswered.len(), 1);
        assert!(unanswered_text(&f.unanswered).contains("pid 44 on GPU 0000:07:00.0: NV_ERR_PID_NOT_FOUND"));
        let none = importers_in(&report(&[(6, 41, 0, 0), (6, 42, 0, 0)]), |_| None);
        assert!(none.importers.is_empty() && none.unanswered.is_empty());
        let line = no_importer_line(&pids(&[41, 42]), &none);
        assert!(
            line.contains("no device memory imported") && line.contains("pids 41, 42") && line.contains("1.2 ms"),
            "{line}"
        );
    }

    #[test]
    fn an_importer_on_a_gpu_where_an_mps_server_holds_memory_is_named_an_mps_client() {
        let mut f = importers_in(&report(&[(6, 42, 4 << 20, 0), (7, 43, 64 << 20, 0)]), |_| None);
        // The MPS server (pid 900) holds memory on GPU 6 only.
        mark_mps_clients(&mut f.importers, &report(&[(6, 900, 0, 0)]));
        assert_eq!(f.importers[0].mps_server, pids(&[900]).first().copied());
        assert_eq!(f.importers[1].mps_server, None);
        let mixed = importer_refusal(&f.importers);
        assert!(
            mixed.contains("it is an MPS client (the MPS server, pid 900") && mixed.contains("torch.multiprocessing"),
            "{mixed}"
        );
        let only = importer_refusal(&f.importers[..1]);
        assert!(
            only.contains("MPS client")
                && only.contains("CUDA_ERROR_NOT_SUPPORTED")
                && only.contains("without MPS")
                && !only.contains("a CUDA IPC import"),
            "{only}"
        );
    }

    #[test]
    fn the_refusal_names_each_importer_its_gpu_and_size_why_and_the_ways_out() {
        let imp = vec![
            Importer {
                pid: pids(&[42])[0],
                gpu: PciAddress { domain: 0, bus: 6, device: 0, function: 0 },
                gpu_uuid: None,
                imported_bytes: 64 << 20,
                mps_server: None,
            },
            Importer {
                pid: pids(&[43])[0],
                gpu: PciAddress { domain: 0, bus: 7, device: 0, function: 0 },
                gpu_uuid: None,
                imported_bytes: 1,
                mps_server: None,
            },
        ];
        let r = importer_refusal(&imp);
        for needle in [
            "refused before any checkpoint",
            "pid 42 has 64 MiB of another process's device memory open on GPU 0000:06:00.0",
            "pid 43 has 1 MiB",
            "cannot restore it, not even in place",
            "Nothing was checkpointed",
            "runs on",
            "torch.multiprocessing",
            "ncclCommSuspend",
            "custom all-reduce",
            "r610",
            "--launch-job",
            "CRIU_CUDA_MIGRATE_IPC=allow",
        ] {
            assert!(r.contains(needle), "{needle}: {r}");
        }
        let w = importers_allowed_warning(&imp);
        assert!(w.contains("CRIU_CUDA_MIGRATE_IPC=allow") && w.contains("pid 42") && w.contains("will fail"), "{w}");
    }

    #[test]
    fn the_unchecked_warning_and_the_multi_process_refusal_say_what_happened() {
        let w = unchecked_processes_warning(&pids(&[41, 42]), "/dev/nvidiactl cannot be opened");
        for needle in [
            "2 CUDA processes",
            "pids 41, 42",
            "could not run (/dev/nvidiactl cannot be opened)",
            "cudaIpcOpenMemHandle",
            "cannot restore",
            "unchecked",
            "=refuse",
            "r610",
        ] {
            assert!(w.contains(needle), "{needle}: {w}");
        }
        let r = several_processes_refusal(&pids(&[7, 8, 9]));
        for needle in ["before any checkpoint", "pids 7, 8, 9", "runs on", "CRIU_CUDA_MIGRATE_MULTI_PROCESS=warn"] {
            assert!(r.contains(needle), "{needle}: {r}");
        }
    }

    #[test]
    fn the_verdict_refuses_importers_or_several_processes_as_told_and_warns_only_when_unchecked() {
        let two = pids(&[41, 42]);
        let clear = importers_in(&report(&[(6, 41, 0, 0), (6, 42, 0, 0)]), |_| None);
        let importer = importers_in(&report(&[(6, 41, 0, 0), (6, 42, 8 << 20, 0)]), |_| None);
        let (r, a) = (IpcImporters::Refuse, IpcImporters::Allow);
        let (w, m) = (MultiProcess::Warn, MultiProcess::Refuse);
        assert!(matches!(verdict(&two, Ok(&importer), r, w), SharingVerdict::Importers(i) if i.len() == 1));
        let allowed = verdict(&two, Ok(&importer), a, w);
        assert!(
            matches!(&allowed, SharingVerdict::Proceed { warning: Some(t), .. } if t.contains("=allow")),
            "{allowed:?}"
        );
        assert!(matches!(verdict(&two, Ok(&clear), r, m), SharingVerdict::SeveralProcesses(_)));
        let cleared = verdict(&two, Ok(&clear), r, w);
        assert!(matches!(&cleared, SharingVerdict::Proceed { info: Some(_), warning: None }), "{cleared:?}");
        assert_eq!(cleared.refusal(), None);
        let unchecked = verdict(&two, Err("no /dev/nvidiactl"), r, w);
        assert!(
            matches!(&unchecked, SharingVerdict::Proceed { warning: Some(t), .. } if t.contains("no /dev/nvidiactl"))
        );
        let one = verdict(&two[..1], Err("no /dev/nvidiactl"), r, w);
        assert!(
            matches!(&one, SharingVerdict::Proceed { info: None, warning: Some(t) } if t.contains("no /dev/nvidiactl")),
            "{one:?}"
        );
        let partly = importers_in(&report(&[(6, 41, 0, 0), (6, 42, 0, 0x5e)]), |_| None);
        assert!(matches!(verdict(&two, Ok(&partly), r, w), SharingVerdict::Proceed { warning: Some(_), .. }));
        // The default, `check`: several processes the check could not clear are refused, naming why and `warn`;
        // one process gets a warning (issue 41 part 1).
        let c = MultiProcess::Check;
        let refused = verdict(&two, Err("no /dev/nvidiactl"), r, c);
        assert!(matches!(&refused, SharingVerdict::Unchecked(p, why) if p.len() == 2 && why == "no /dev/nvidiactl"));
        let text = refused.refusal().unwrap();
        for needle in [
            "refused before any checkpoint",
            "pids 41, 42",
            "no /dev/nvidiactl",
            "CRIU_CUDA_MIGRATE_MULTI_PROCESS=warn",
        ] {
            assert!(text.contains(needle), "{needle}: {text}");
        }
        assert!(matches!(verdict(&two, Ok(&partly), r, c), SharingVerdict::Unchecked(..)));
        assert!(matches!(verdict(&two[..1], Err("x"), r, c), SharingVerdict::Proceed { warning: Some(_), .. }));
        assert!(matches!(verdict(&two, Ok(&clear), r, c), SharingVerdict::Proceed { warning: None, .. }));
        assert!(verdict(&two, Ok(&importer), r, w).refusal().unwrap().contains("pid 42 has 8 MiB"));
    }

    #[test]
    fn not_supported_at_checkpoint_names_uvm_mps_and_mig_and_says_the_process_runs_on() {
        let c = checkpoint_failure_cause(Some(CudaCode::NotSupported)).unwrap();
        for needle in ["managed (UVM)", "MPS", "MIG", "RUNNING"] {
            assert!(c.contains(needle), "{needle}: {c}");
        }
        assert_eq!(checkpoint_failure_cause(Some(CudaCode::Unknown)), None);
        assert_eq!(checkpoint_failure_cause(None), None);
    }

    #[test]
    fn a_restore_refused_like_an_importers_names_ipc_only_among_several_processes() {
        for code in [CudaCode::InvalidValue, CudaCode::NotSupported] {
            let a = restore_advice(Some(code), false, 2);
            assert!(a.cause.contains("CUDA IPC") && !a.recoverable, "{a:?}");
            assert!(!a.fix.contains("free the GPU"), "{a:?}");
            // One process alone shares nothing: no IPC story.
            let alone = restore_advice(Some(code), false, 1);
            assert!(!alone.cause.contains("IPC") && alone.recoverable, "{alone:?}");
        }
        let mapped = restore_advice(Some(CudaCode::InvalidValue), true, 3);
        assert!(mapped.cause.contains("device map") && mapped.cause.contains("CUDA IPC"), "{mapped:?}");
        let map_only = restore_advice(Some(CudaCode::InvalidValue), true, 1);
        assert!(map_only.cause.contains("device map") && !map_only.cause.contains("IPC"), "{map_only:?}");
        let oom = restore_advice(Some(CudaCode::OutOfMemory), false, 4);
        assert!(oom.fix.contains("free the GPU's memory") && oom.recoverable, "{oom:?}");
        let other = restore_advice(Some(CudaCode::OperatingSystem), false, 2);
        assert_eq!((other.cause, other.recoverable), ("", true));
    }

    #[test]
    fn codes_are_read_back_from_error_texts() {
        let text = "cuCheckpointProcessRestore failed: CUDA_ERROR_NOT_SUPPORTED (801): operation not supported";
        assert_eq!(code_named_in(text), Some(CudaCode::NotSupported));
        assert_eq!(code_named_in("CUDA_ERROR_INVALID_VALUE (1)"), Some(CudaCode::InvalidValue));
        assert_eq!(code_named_in("agent gone"), None);
    }
}
