//! libcuda's process checkpoint API (`cuCheckpointProcess*`), called on another process.
//!
//! The argument structs and codes are declared once, in [`crate::abi`] (the test double of
//! libcuda uses the same declarations); their layouts are checked at compile time there.

use std::ffi::{c_int, c_uint};
use std::time::{Duration, Instant};

use ccm_identity::{GpuUuid, HostPid};

use crate::abi::{self, GpuPair, LockArgs, ReservedArgs, RestoreArgs};
use crate::cuda::{CuResult, CudaError, Libcuda, LoadError};

/// `CUprocessState`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessState {
    Running,
    Locked,
    Checkpointed,
    Failed,
    /// CUDA 13.4: a checkpoint to another caller's custom storage is under way, or was left unfinished.
    Checkpointing,
    /// CUDA 13.4: a restore from another caller's custom storage is under way, or was left unfinished.
    Restoring,
    /// A value this build does not know (a newer driver).
    Other(i32),
}

impl ProcessState {
    /// The state from the driver's raw `CUprocessState` value.
    pub fn from_raw(v: c_int) -> Self {
        match v {
            abi::STATE_RUNNING => ProcessState::Running,
            abi::STATE_LOCKED => ProcessState::Locked,
            abi::STATE_CHECKPOINTED => ProcessState::Checkpointed,
            abi::STATE_FAILED => ProcessState::Failed,
            abi::STATE_CHECKPOINTING => ProcessState::Checkpointing,
            abi::STATE_RESTORING => ProcessState::Restoring,
            o => ProcessState::Other(o),
        }
    }
}

impl std::fmt::Display for ProcessState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProcessState::Running => f.write_str("RUNNING"),
            ProcessState::Locked => f.write_str("LOCKED"),
            ProcessState::Checkpointed => f.write_str("CHECKPOINTED"),
            ProcessState::Failed => f.write_str("FAILED"),
            ProcessState::Checkpointing => f.write_str("CHECKPOINTING (custom storage)"),
            ProcessState::Restoring => f.write_str("RESTORING (custom storage)"),
            ProcessState::Other(v) => write!(f, "state {v}"),
        }
    }
}

type GetRestoreTidFn = unsafe extern "C" fn(c_int, *mut c_int) -> CuResult;
type GetStateFn = unsafe extern "C" fn(c_int, *mut c_int) -> CuResult;
type LockFn = unsafe extern "C" fn(c_int, *mut LockArgs) -> CuResult;
type CheckpointFn = unsafe extern "C" fn(c_int, *mut ReservedArgs) -> CuResult;
type RestoreFn = unsafe extern "C" fn(c_int, *mut RestoreArgs) -> CuResult;
type UnlockFn = unsafe extern "C" fn(c_int, *mut ReservedArgs) -> CuResult;

/// The six checkpoint entry points of a loaded libcuda. `Send + Sync`: the driver's checkpoint
/// calls are made from several threads at once (one per process).
#[derive(Clone)]
pub struct CheckpointApi {
    lib: Libcuda,
    /// `cuDriverGetVersion`, which decides whether a device map may be passed ([`abi::restore_args_layout`]).
    driver_api: i32,
    get_restore_tid: GetRestoreTidFn,
    get_state: GetStateFn,
    lock: LockFn,
    checkpoint: CheckpointFn,
    restore: RestoreFn,
    unlock: UnlockFn,
}

/// How long one driver call took, for the plugin's timing lines.
#[derive(Debug, Clone, Copy)]
pub struct Timed<T> {
    pub value: T,
    pub elapsed: Duration,
}

impl CheckpointApi {
    pub fn new(lib: &Libcuda) -> Result<CheckpointApi, LoadError> {
        // SAFETY: each type alias above is the C signature of the named function in cuda.h
        // (CUDA 12.8+), with the argument structs laid out as asserted at compile time.
        unsafe {
            Ok(CheckpointApi {
                get_restore_tid: lib.symbol("cuCheckpointProcessGetRestoreThreadId")?,
                get_state: lib.symbol("cuCheckpointProcessGetState")?,
                lock: lib.symbol("cuCheckpointProcessLock")?,
                checkpoint: lib.symbol("cuCheckpointProcessCheckpoint")?,
                restore: lib.symbol("cuCheckpointProcessRestore")?,
                unlock: lib.symbol("cuCheckpointProcessUnlock")?,
                driver_api: lib.driver_version().unwrap_or(0),
                lib: lib.clone(),
            })
        }
    }

    pub fn libcuda(&self) -> &Libcuda {
        &self.lib
    }

    /// The thread of `pid` that serves the driver's checkpoint requests. Fails for a process
    /// that is not a CUDA process.
    pub fn restore_thread_id(&self, pid: i32) -> Result<i32, CudaError> {
        let mut tid: c_int = 0;
        // SAFETY: writes one int.
        let r = unsafe { (self.get_restore_tid)(pid, &mut tid) };
        self.lib.check("cuCheckpointProcessGetRestoreThreadId", r)?;
        Ok(tid)
    }

    pub fn state(&self, pid: i32) -> Result<ProcessState, CudaError> {
        self.state_raw(pid).map(ProcessState::from_raw)
    }

    /// The raw `CUprocessState` (what crosses the driver agent's socket).
    pub fn state_raw(&self, pid: i32) -> Result<c_int, CudaError> {
        let mut st: c_int = 0;
        // SAFETY: CUprocessState is a C enum (int-sized); the driver writes one value.
        let r = unsafe { (self.get_state)(pid, &mut st) };
        self.lib.check("cuCheckpointProcessGetState", r)?;
        Ok(st)
    }

    /// Locks `pid`: waits up to `timeout_ms` (0 = no timeout) for its submitted work to finish
    /// and blocks further CUDA calls.
    pub fn lock(&self, pid: i32, timeout_ms: u32) -> Result<(), CudaError> {
        let mut args = LockArgs { timeout_ms, ..Default::default() };
        // SAFETY: args is a valid, zeroed CUcheckpointLockArgs that lives across the call.
        let r = unsafe { (self.lock)(pid, &mut args) };
        self.lib.check("cuCheckpointProcessLock", r)
    }

    /// Moves `pid`'s device state into its host memory and releases the GPU.
    pub fn checkpoint(&self, pid: i32) -> Result<(), CudaError> {
        let mut args = ReservedArgs::default();
        // SAFETY: zeroed reserved args, valid for the call.
        let r = unsafe { (self.checkpoint)(pid, &mut args) };
        self.lib.check("cuCheckpointProcessCheckpoint", r)
    }

    /// Puts `pid`'s device state back on GPUs. An empty `pairs` restores onto the same GPUs;
    /// otherwise it must pair every GPU the process's libcuda enumerated.
    pub fn restore(&self, pid: i32, pairs: &[(GpuUuid, GpuUuid)]) -> Result<(), CudaError> {
        let raw: Vec<GpuPair> =
            pairs.iter().map(|(o, n)| GpuPair { old_uuid: *o.as_bytes(), new_uuid: *n.as_bytes() }).collect();
        let layout = abi::restore_args_layout(self.driver_api);
        if let (false, Some(why)) = (raw.is_empty(), layout.no_map_why()) {
            // Never hand a driver a struct it reads differently (an older one's reserved words, a newer one's).
            return Err(CudaError {
                call: "cuCheckpointProcessRestore",
                code: abi::CudaCode::NotSupported,
                name: "CUDA_ERROR_NOT_SUPPORTED".into(),
                description: why.to_string(),
            });
        }
        let r = if raw.is_empty() {
            // SAFETY: NULL args mean "restore onto the same GPUs", as documented.
            unsafe { (self.restore)(pid, std::ptr::null_mut()) }
        } else {
            let count = c_uint::try_from(raw.len()).map_err(|_| CudaError {
                call: "cuCheckpointProcessRestore",
                code: abi::CudaCode::InvalidValue,
                name: "CUDA_ERROR_INVALID_VALUE".into(),
                description: "too many GPU pairs".into(),
            })?;
            let mut args =
                RestoreArgs { gpu_pairs: raw.as_ptr(), gpu_pairs_count: count, reserved: [0; 44], reserved1: 0 };
            // SAFETY: args points at `raw`, which outlives the call; count matches its length.
            unsafe { (self.restore)(pid, &mut args) }
        };
        self.lib.check("cuCheckpointProcessRestore", r)
    }

    pub fn unlock(&self, pid: i32) -> Result<(), CudaError> {
        let mut args = ReservedArgs::default();
        // SAFETY: zeroed reserved args, valid for the call.
        let r = unsafe { (self.unlock)(pid, &mut args) };
        self.lib.check("cuCheckpointProcessUnlock", r)
    }
}

// SAFETY: the struct holds plain function pointers into libcuda (kept loaded by `lib`); the
// driver's checkpoint entry points are thread-safe and take no process-global Rust state.
unsafe impl Send for CheckpointApi {}
// SAFETY: as above; all methods take `&self` and only pass stack data to the driver.
unsafe impl Sync for CheckpointApi {}

/// Runs `f` and measures it.
pub fn timed<T>(f: impl FnOnce() -> T) -> Timed<T> {
    let t0 = Instant::now();
    let value = f();
    Timed { value, elapsed: t0.elapsed() }
}

/// The calls that put a process back to RUNNING, from whichever process makes them: the CLI
/// calls libcuda itself ([`CheckpointApi`]), the plugin through its driver agent.
pub trait PutBackCalls: Sync {
    type Error: std::fmt::Display;
    /// Restores onto the same GPUs. `deadline` bounds a call made through a helper process (a
    /// direct call is bounded by the driver).
    fn restore_in_place(&self, pid: HostPid, deadline: Duration) -> Result<(), Self::Error>;
    fn unlock(&self, pid: HostPid) -> Result<(), Self::Error>;
}

impl PutBackCalls for CheckpointApi {
    type Error = CudaError;
    fn restore_in_place(&self, pid: HostPid, _deadline: Duration) -> Result<(), CudaError> {
        CheckpointApi::restore(self, pid.driver(), &[])
    }
    fn unlock(&self, pid: HostPid) -> Result<(), CudaError> {
        CheckpointApi::unlock(self, pid.driver())
    }
}

/// One step of [`put_back`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// `cuCheckpointProcessRestore` with no GPU pairs (about 1 s per GiB of device memory).
    Restore,
    /// `cuCheckpointProcessUnlock`.
    Unlock,
}

impl Step {
    pub fn name(self) -> &'static str {
        match self {
            Step::Restore => "restore",
            Step::Unlock => "unlock",
        }
    }

    /// The state a process is left in when this step fails.
    pub fn left_in(self) -> ProcessState {
        match self {
            Step::Restore => ProcessState::Checkpointed,
            Step::Unlock => ProcessState::Locked,
        }
    }
}

/// What one step did.
#[derive(Debug, Clone)]
pub struct StepDone {
    pub step: Step,
    pub elapsed: Duration,
    /// The driver's error text when it failed.
    pub error: Option<String>,
}

/// The steps that bring a process in `state` back to RUNNING: restore then unlock from
/// CHECKPOINTED, unlock from LOCKED, nothing from anything else.
pub fn put_back_steps(state: ProcessState) -> &'static [Step] {
    match state {
        ProcessState::Checkpointed => &[Step::Restore, Step::Unlock],
        ProcessState::Locked => &[Step::Unlock],
        _ => &[],
    }
}

/// Puts `pid` back to RUNNING from `state` (the state the driver reports), stopping at the first
/// failure: the dump's rollback, the agent's after CRIU died, and the CLI's `recover` all go
/// through here. `starting` is called before each step (the CLI's progress line).
pub fn put_back<D: PutBackCalls + ?Sized>(
    api: &D,
    pid: HostPid,
    state: ProcessState,
    restore_deadline: Duration,
    mut starting: impl FnMut(Step),
) -> Vec<StepDone> {
    let mut done = Vec::new();
    for &step in put_back_steps(state) {
        starting(step);
        let t0 = Instant::now();
        let r = match step {
            Step::Restore => api.restore_in_place(pid, restore_deadline),
            Step::Unlock => api.unlock(pid),
        };
        let failed = r.is_err();
        done.push(StepDone { step, elapsed: t0.elapsed(), error: r.err().map(|e| e.to_string()) });
        if failed {
            break;
        }
    }
    done
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Fake {
        calls: Mutex<Vec<&'static str>>,
        fail_restore: bool,
    }

    impl PutBackCalls for Fake {
        type Error = String;
        fn restore_in_place(&self, _: HostPid, _: Duration) -> Result<(), String> {
            self.calls.lock().unwrap().push("restore");
            if self.fail_restore {
                Err("CUDA_ERROR_OPERATING_SYSTEM (304)".into())
            } else {
                Ok(())
            }
        }
        fn unlock(&self, _: HostPid) -> Result<(), String> {
            self.calls.lock().unwrap().push("unlock");
            Ok(())
        }
    }

    const D: Duration = Duration::from_secs(1);

    const P7: HostPid = match HostPid::new(7) {
        Some(p) => p,
        None => panic!(),
    };

    #[test]
    fn a_checkpointed_process_is_restored_then_unlocked() {
        let f = Fake::default();
        let mut seen = Vec::new();
        let done = put_back(&f, P7, ProcessState::Checkpointed, D, |s| seen.push(s));
        assert_eq!(*f.calls.lock().unwrap(), vec!["restore", "unlock"]);
        assert_eq!(seen, vec![Step::Restore, Step::Unlock]);
        assert!(done.iter().all(|d| d.error.is_none()));
    }

    #[test]
    fn a_failed_restore_stops_before_the_unlock() {
        let f = Fake { fail_restore: true, ..Default::default() };
        let done = put_back(&f, P7, ProcessState::Checkpointed, D, |_| {});
        assert_eq!(*f.calls.lock().unwrap(), vec!["restore"]);
        assert_eq!(done.len(), 1);
        assert!(done[0].error.as_deref().unwrap().contains("304"));
        assert_eq!(done[0].step.left_in(), ProcessState::Checkpointed);
    }

    #[test]
    fn a_locked_process_is_only_unlocked_and_a_running_one_left_alone() {
        let f = Fake::default();
        put_back(&f, P7, ProcessState::Locked, D, |_| {});
        assert_eq!(*f.calls.lock().unwrap(), vec!["unlock"]);
        assert!(put_back(&f, P7, ProcessState::Running, D, |_| {}).is_empty());
        assert!(put_back(&f, P7, ProcessState::Failed, D, |_| {}).is_empty());
    }
}
