//! The driver floor: what the checkpoint API itself costs when called from one long-lived
//! controller, the least any tool can pay. One `cuInit`, then per repeat lock, checkpoint,
//! restore and unlock of every pid, each call timed. Several pids are checkpointed and restored
//! in parallel threads and locked / unlocked one after the other, as the plugin does, so the
//! floor of a tree is comparable with the plugin's `... took X s (parallel)` lines.

use std::time::{Duration, Instant};

use ccm_driver::checkpoint::{timed, CheckpointApi, ProcessState};
use ccm_driver::Libcuda;
use serde::Serialize;

use crate::error::BenchError;

/// The loaded driver, initialised in this process.
pub struct Controller {
    api: CheckpointApi,
    lock_timeout_ms: u32,
    /// Seconds to load libcuda and resolve the checkpoint API.
    pub load_s: f64,
    /// Seconds of this process's `cuInit(0)`.
    pub cuinit_s: f64,
}

/// Every call of one pid in one repeat, in seconds.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PidTimes {
    pub pid: i32,
    pub restore_tid_s: f64,
    pub lock_s: f64,
    pub checkpoint_s: f64,
    pub restore_s: f64,
    pub unlock_s: f64,
}

/// One repeat of the whole sequence. The `*_all_s` fields are wall times of each phase over all
/// pids (checkpoint and restore run in parallel, so they are not sums).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct FloorRepeat {
    pub per_pid: Vec<PidTimes>,
    pub lock_all_s: f64,
    pub checkpoint_all_s: f64,
    pub restore_all_s: f64,
    pub unlock_all_s: f64,
    /// Lock through unlock, wall time (without `cuInit`, which a controller pays once).
    pub total_s: f64,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct FloorResult {
    pub kind: &'static str,
    pub pids: Vec<i32>,
    pub load_s: f64,
    pub cuinit_s: f64,
    pub lock_timeout_ms: u32,
    pub repeats: Vec<FloorRepeat>,
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

impl Controller {
    /// Loads libcuda (`CRIU_CUDA_MIGRATE_LIBCUDA` may name another one, e.g. the test double)
    /// and calls `cuInit(0)`, which the driver requires in a process that restores another.
    pub fn start(lock_timeout_ms: u32) -> Result<Controller, BenchError> {
        let t0 = Instant::now();
        let lib =
            Libcuda::load(std::env::var(ccm_settings::LIBCUDA.env).ok().filter(|v| !v.trim().is_empty()).as_deref())?;
        let api = CheckpointApi::new(&lib)?;
        let load_s = secs(t0.elapsed());
        let init = timed(|| lib.init());
        init.value.map_err(BenchError::Init)?;
        Ok(Controller { api, lock_timeout_ms, load_s, cuinit_s: secs(init.elapsed) })
    }

    /// Runs `repeats` full sequences on `pids` and collects the times.
    pub fn run(&self, pids: &[i32], repeats: u32) -> Result<FloorResult, BenchError> {
        let mut out = Vec::new();
        for _ in 0..repeats {
            out.push(self.sequence(pids)?);
        }
        Ok(FloorResult {
            kind: "floor",
            pids: pids.to_vec(),
            load_s: self.load_s,
            cuinit_s: self.cuinit_s,
            lock_timeout_ms: self.lock_timeout_ms,
            repeats: out,
        })
    }

    /// Checks that `pid` is a RUNNING CUDA process; returns the time of the restore-thread query
    /// (the question every tool asks first).
    pub fn check_running(&self, pid: i32) -> Result<f64, BenchError> {
        let tid = timed(|| self.api.restore_thread_id(pid));
        tid.value.map_err(|source| BenchError::NotCuda { pid, source })?;
        match self.api.state(pid) {
            Ok(ProcessState::Running) => Ok(secs(tid.elapsed)),
            Ok(other) => Err(BenchError::NotRunning { pid, state: other.to_string() }),
            Err(source) => Err(BenchError::NotCuda { pid, source }),
        }
    }

    /// One lock → checkpoint → restore → unlock of every pid. On a failure every pid is put
    /// back to RUNNING as far as the driver allows, and the error says what is left.
    pub fn sequence(&self, pids: &[i32]) -> Result<FloorRepeat, BenchError> {
        let mut per_pid = Vec::with_capacity(pids.len());
        for &pid in pids {
            let restore_tid_s = self.check_running(pid)?;
            per_pid.push(PidTimes {
                pid,
                restore_tid_s,
                lock_s: 0.0,
                checkpoint_s: 0.0,
                restore_s: 0.0,
                unlock_s: 0.0,
            });
        }
        let t_all = Instant::now();

        let t0 = Instant::now();
        for t in per_pid.iter_mut() {
            let r = timed(|| self.api.lock(t.pid, self.lock_timeout_ms));
            t.lock_s = secs(r.elapsed);
            if let Err(source) = r.value {
                return Err(self.fail(t.pid, source, pids));
            }
        }
        let lock_all_s = secs(t0.elapsed());

        let t0 = Instant::now();
        let ckpt = self.parallel(pids, "checkpoint", |pid| self.api.checkpoint(pid))?;
        let checkpoint_all_s = secs(t0.elapsed());
        for (t, r) in per_pid.iter_mut().zip(ckpt) {
            match r {
                Ok(d) => t.checkpoint_s = d,
                Err(source) => return Err(self.fail(t.pid, source, pids)),
            }
        }

        let t0 = Instant::now();
        let rst = self.parallel(pids, "restore", |pid| self.api.restore(pid, &[]))?;
        let restore_all_s = secs(t0.elapsed());
        for (t, r) in per_pid.iter_mut().zip(rst) {
            match r {
                Ok(d) => t.restore_s = d,
                Err(source) => return Err(self.fail(t.pid, source, pids)),
            }
        }

        let t0 = Instant::now();
        for t in per_pid.iter_mut() {
            let r = timed(|| self.api.unlock(t.pid));
            t.unlock_s = secs(r.elapsed);
            if let Err(source) = r.value {
                return Err(self.fail(t.pid, source, pids));
            }
        }
        let unlock_all_s = secs(t0.elapsed());

        Ok(FloorRepeat {
            per_pid,
            lock_all_s,
            checkpoint_all_s,
            restore_all_s,
            unlock_all_s,
            total_s: secs(t_all.elapsed()),
        })
    }

    /// Runs `call` for every pid in its own thread; each result with the call's seconds.
    fn parallel<F>(
        &self,
        pids: &[i32],
        what: &'static str,
        call: F,
    ) -> Result<Vec<Result<f64, ccm_driver::CudaError>>, BenchError>
    where
        F: Fn(i32) -> Result<(), ccm_driver::CudaError> + Sync,
    {
        let call = &call;
        std::thread::scope(|s| {
            let handles: Vec<_> = pids
                .iter()
                .map(|&pid| {
                    (
                        pid,
                        s.spawn(move || {
                            let r = timed(|| call(pid));
                            r.value.map(|()| secs(r.elapsed))
                        }),
                    )
                })
                .collect();
            handles.into_iter().map(|(pid, h)| h.join().map_err(|_| BenchError::ThreadPanicked { what, pid })).collect()
        })
    }

    /// Puts every pid back to RUNNING after a failed step and builds the error for `pid`.
    fn fail(&self, pid: i32, source: ccm_driver::CudaError, pids: &[i32]) -> BenchError {
        let left: Vec<String> = pids.iter().filter_map(|&p| self.recover(p).err()).collect();
        let left = if left.is_empty() { String::new() } else { format!("; {}", left.join("; ")) };
        BenchError::Step { pid, source, left }
    }

    /// Best effort: CHECKPOINTED → restore → LOCKED → unlock → RUNNING. `Err` says what is left.
    pub fn recover(&self, pid: i32) -> Result<(), String> {
        let hint = || format!("run `criu-cuda-migrate recover --pid {pid}` or kill it");
        if matches!(self.api.state(pid), Ok(ProcessState::Checkpointed)) {
            self.api.restore(pid, &[]).map_err(|e| format!("pid {pid} is left CHECKPOINTED ({e}); {}", hint()))?;
        }
        if matches!(self.api.state(pid), Ok(ProcessState::Locked)) {
            self.api.unlock(pid).map_err(|e| format!("pid {pid} is left LOCKED ({e}); {}", hint()))?;
        }
        Ok(())
    }
}
