//! Putting a CUDA process back to RUNNING: restore its device memory onto the same GPUs when it
//! is CHECKPOINTED, then unlock it. The dump's rollback (through the driver agent) and the CLI's
//! `recover` (calling libcuda itself) both go through [`put_back`].

use std::time::{Duration, Instant};

use ccm_driver::checkpoint::PutBackCalls;

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
}

/// What one step did.
#[derive(Debug, Clone)]
pub struct StepDone {
    pub step: Step,
    pub elapsed: Duration,
    /// The driver's error text when it failed.
    pub error: Option<String>,
}

/// Restores `pid` (when `checkpointed`) and unlocks it (when `locked`), stopping at the first
/// failure. `starting` is called before each step (the CLI's progress line).
pub fn put_back<D: PutBackCalls + ?Sized>(
    api: &D,
    pid: i32,
    checkpointed: bool,
    locked: bool,
    mut starting: impl FnMut(Step),
) -> Vec<StepDone> {
    let mut done = Vec::new();
    let steps = [(checkpointed, Step::Restore), (locked, Step::Unlock)];
    for (wanted, step) in steps {
        if !wanted {
            continue;
        }
        starting(step);
        let t0 = Instant::now();
        let r = match step {
            Step::Restore => api.restore(pid, &[]),
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
    use ccm_driver::checkpoint::ProcessState;
    use ccm_identity::GpuUuid;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Fake {
        calls: Mutex<Vec<&'static str>>,
        fail_restore: bool,
    }

    impl PutBackCalls for Fake {
        type Error = String;
        fn state(&self, _: i32) -> Result<ProcessState, String> {
            Ok(ProcessState::Running)
        }
        fn restore(&self, _: i32, pairs: &[(GpuUuid, GpuUuid)]) -> Result<(), String> {
            assert!(pairs.is_empty(), "a put-back restores onto the same GPUs");
            self.calls.lock().unwrap().push("restore");
            if self.fail_restore {
                Err("CUDA_ERROR_OPERATING_SYSTEM (304)".into())
            } else {
                Ok(())
            }
        }
        fn unlock(&self, _: i32) -> Result<(), String> {
            self.calls.lock().unwrap().push("unlock");
            Ok(())
        }
    }

    #[test]
    fn a_checkpointed_process_is_restored_then_unlocked() {
        let f = Fake::default();
        let mut seen = Vec::new();
        let done = put_back(&f, 7, true, true, |s| seen.push(s));
        assert_eq!(*f.calls.lock().unwrap(), vec!["restore", "unlock"]);
        assert_eq!(seen, vec![Step::Restore, Step::Unlock]);
        assert!(done.iter().all(|d| d.error.is_none()));
    }

    #[test]
    fn a_failed_restore_stops_before_the_unlock() {
        let f = Fake { fail_restore: true, ..Default::default() };
        let done = put_back(&f, 7, true, true, |_| {});
        assert_eq!(*f.calls.lock().unwrap(), vec!["restore"]);
        assert_eq!(done.len(), 1);
        assert!(done[0].error.as_deref().unwrap().contains("304"));
    }

    #[test]
    fn a_locked_process_is_only_unlocked() {
        let f = Fake::default();
        put_back(&f, 7, false, true, |_| {});
        assert_eq!(*f.calls.lock().unwrap(), vec!["unlock"]);
    }
}
