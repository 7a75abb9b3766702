//! What the plugin can and cannot know about CUDA processes that share device memory, and what it
//! says about it.
//!
//! Measured on driver 580.159.04 (`tests/gpu/ipc-probe.sh`, docs/GPU-TESTING.md): a process that has another
//! process's device memory open, through legacy CUDA IPC (`cudaIpcOpenMemHandle`: torch.multiprocessing CUDA
//! tensors, vLLM/SGLang custom all-reduce) or a cuMem POSIX-fd handle (`cuMemImportFromShareableHandle`: NCCL's
//! P2P transport), locks and checkpoints without an error, but its restore fails (`CUDA_ERROR_INVALID_VALUE`
//! for legacy IPC, `CUDA_ERROR_NOT_SUPPORTED` for cuMem), in place too and in either order, and a retry answers
//! `CUDA_ERROR_OPERATING_SYSTEM`: the process stays CHECKPOINTED for good. The exporter restores fine.
//! Nothing outside the importer shows the sharing: its fds, their fdinfo, its mappings and NVML's view are
//! those of a process that shares nothing (the cuMem fd is a `/dev/nvidiactl` fd that the importer closes
//! after the import), and libcuda keeps no copy of the IPC handle in its heap. So no dump can be refused for
//! it with certainty: the plugin warns on every dump of more than one CUDA process, refuses such dumps
//! before any checkpoint when told to (`CRIU_CUDA_MIGRATE_MULTI_PROCESS=refuse`), and names IPC as the
//! likely cause where a restore then fails the way an importer's does.
//!
//! No I/O here: texts and rules, unit-tested.

use ccm_driver::abi::CudaCode;
use ccm_identity::HostPid;
use ccm_settings::MULTI_PROCESS;

/// The ways of sharing device memory users meet, for the lines below.
const IPC_KINDS: &str = "CUDA IPC (cudaIpcOpenMemHandle, or cuMemImportFromShareableHandle: torch.multiprocessing \
                         CUDA tensors, vLLM/SGLang custom all-reduce, NCCL's P2P transport between ranks of one node)";

/// The ways out, for every line that names IPC.
const IPC_WAYS_OUT: &str = "tear the IPC down before the checkpoint, or use driver r610 or newer, which checkpoints \
                            CUDA IPC for jobs started with `cuda-checkpoint --launch-job`";

fn pid_list(pids: &[HostPid]) -> String {
    pids.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(", ")
}

/// The warning of a dump of several CUDA processes (`multi-process warn`, the default).
pub fn several_processes_warning(pids: &[HostPid]) -> String {
    format!(
        "this dump holds {} CUDA processes (pids {}). If one of them has another's device memory open through {IPC_KINDS}, \
         driver 580 checkpoints it but cannot restore it, not even in place, and that job is lost; nothing visible from \
         outside a process shows such sharing, so this dump goes on. If they share device memory: {IPC_WAYS_OUT}; \
         set {}=refuse to have dumps of several CUDA processes refused before any checkpoint",
        pids.len(),
        pid_list(pids),
        MULTI_PROCESS.env
    )
}

/// Why a dump of several CUDA processes was refused (`multi-process refuse`).
pub fn several_processes_refusal(pids: &[HostPid]) -> String {
    format!(
        "refused before any checkpoint ({}=refuse): this dump holds {} CUDA processes (pids {}), and driver 580 \
         cannot restore one that has another's device memory open through {IPC_KINDS}. Every process is unlocked \
         and runs on. If they share no device memory, dump with {}=warn; if they do, {IPC_WAYS_OUT}",
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

    #[test]
    fn the_warning_and_the_refusal_name_every_pid_the_risk_and_the_way_out() {
        let w = several_processes_warning(&pids(&[41, 42]));
        for needle in ["2 CUDA processes", "pids 41, 42", "cudaIpcOpenMemHandle", "cannot restore", "=refuse", "r610"] {
            assert!(w.contains(needle), "{needle}: {w}");
        }
        let r = several_processes_refusal(&pids(&[7, 8, 9]));
        for needle in ["before any checkpoint", "pids 7, 8, 9", "runs on", "CRIU_CUDA_MIGRATE_MULTI_PROCESS=warn"] {
            assert!(r.contains(needle), "{needle}: {r}");
        }
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
