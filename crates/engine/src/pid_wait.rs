//! `init(RESTORE)`'s wait for the checkpoint's pid numbers to be free, before CRIU forks the tasks with them.
//!
//! CRIU forks each task with `clone3` and `set_tid` = its dumped pid; the kernel answers `EEXIST` (CRIU: `Can't
//! fork for PID: File exists`) while the number is still taken: by a task, a zombie not reaped yet, or a live
//! process outside the tree whose process group or session it still is, even after the task with that pid was
//! reaped (measured: a restore right after a PyTorch tree's dump failed so in 0.07 s; the same restore 3 s later
//! passed). When the dump shared CRIU's pid namespace, the tree is restored into CRIU's with the same numbers,
//! so every pid and thread id of CRIU's `pstree.img` is waited for here, up to [`PID_WAIT`]; a number still
//! taken then is logged with what holds it and what to do, and the restore goes on (CRIU fails by itself).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use ccm_identity::criu_pstree::{self, MAX_PSTREE_BYTES, PSTREE_FILE};
use ccm_identity::HostPid;
use ccm_process::dir::{Dir, FileError};
use ccm_process::pid_use::PidHolder;
use log::{debug, error, info, warn};

use crate::seam::Targets;

/// How long `init(RESTORE)` waits for the checkpoint's pid numbers to be free.
pub const PID_WAIT: Duration = Duration::from_secs(5);
/// How often it looks again.
pub const PID_POLL: Duration = Duration::from_millis(20);
/// The most lines of each kind (freed, still taken) logged by one wait; a summary line counts the rest.
const MAX_LINES: usize = 8;

/// The numbers CRIU will fork the checkpoint's tasks with in its own pid namespace: every pid and thread id of
/// `pstree.img`, when the plugin's records (`(pid in its own namespace, pid CRIU saw at dump)` of each recorded
/// process) show that the dump shared CRIU's pid namespace. `None`, with a debug line why, otherwise.
pub fn checkpoint_pids(dir: &Dir, records: &[(u32, u32)]) -> Option<Vec<HostPid>> {
    if records.is_empty() {
        debug!("the checkpoint's pids are not checked: no process of the plugin's records tells its pid namespace");
        return None;
    }
    if let Some((ns, host)) = records.iter().find(|(ns, host)| ns != host) {
        debug!(
            "the checkpoint's pids are not checked: the dump ran in a pid namespace of its own (pid {ns} there was \
             {host} to CRIU), which CRIU restores anew"
        );
        return None;
    }
    let bytes = match dir.read_file(PSTREE_FILE, MAX_PSTREE_BYTES) {
        Ok(b) => b,
        Err(e @ FileError::Missing { .. }) => {
            debug!("the checkpoint's pids are not checked: {e}");
            return None;
        }
        Err(e) => {
            debug!("the checkpoint's pids are not checked: cannot read {PSTREE_FILE}: {e}");
            return None;
        }
    };
    let entries = match criu_pstree::decode(&bytes) {
        Ok(e) => e,
        Err(e) => {
            debug!("the checkpoint's pids are not checked: {e}");
            return None;
        }
    };
    let pids: BTreeSet<HostPid> = entries
        .iter()
        .flat_map(|e| std::iter::once(e.pid).chain(e.threads.iter().copied()))
        .filter_map(|p| HostPid::new(i64::from(p.0)))
        .collect();
    Some(pids.into_iter().collect())
}

/// What one wait found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct PidWait {
    /// Numbers that were taken at first and were freed: by what, and how long the wait took.
    pub freed: Vec<(HostPid, PidHolder, Duration)>,
    /// Numbers still taken at the deadline, by what.
    pub still_taken: Vec<(HostPid, PidHolder)>,
}

/// Waits until every number of `pids` is free in CRIU's pid namespace, looking every `poll`, at most `deadline`:
/// an info line for each number that was taken and was freed, an ERROR line for each still taken at the
/// deadline. Never fails: a check that cannot run ends the wait with a warning.
pub fn wait_until_free(targets: &dyn Targets, pids: &[HostPid], deadline: Duration, poll: Duration) -> PidWait {
    let t0 = Instant::now();
    let mut out = PidWait::default();
    let mut first: BTreeMap<HostPid, PidHolder> = BTreeMap::new();
    let mut pending: Vec<HostPid> = pids.to_vec();
    let mut checks = 0u32;
    while !pending.is_empty() {
        let numbers: Vec<u32> = pending.iter().map(|p| p.get()).collect();
        let held = match targets.pid_holders(&numbers) {
            Ok(h) => h,
            Err(e) => {
                warn!("cannot tell whether the checkpoint's pids are free ({e}); CRIU's restore goes on without the check");
                return out;
            }
        };
        checks += 1;
        let waited = t0.elapsed();
        pending.retain(|p| {
            if held.contains_key(&p.get()) {
                return true;
            }
            if let Some(h) = first.remove(p) {
                out.freed.push((*p, h, waited));
            }
            false
        });
        for p in &pending {
            if let Some(h) = held.get(&p.get()) {
                if !first.contains_key(p) {
                    if first.len() < MAX_LINES {
                        debug!(
                            "pid {p} of the checkpoint is taken by {h}; waiting up to {:.1} s",
                            deadline.as_secs_f64()
                        );
                    }
                    first.insert(*p, h.clone());
                }
            }
        }
        if pending.is_empty() || waited >= deadline {
            break;
        }
        std::thread::sleep(poll.min(deadline.saturating_sub(waited)));
    }
    out.still_taken = pending.iter().filter_map(|p| first.remove(p).map(|h| (*p, h))).collect();
    log_wait(&out, t0.elapsed(), checks, pids.len());
    out
}

fn log_wait(w: &PidWait, elapsed: Duration, checks: u32, count: usize) {
    for (p, h, waited) in w.freed.iter().take(MAX_LINES) {
        info!(
            "pid {p} of the checkpoint was still taken ({h}); waited {:.1} s until it was free",
            waited.as_secs_f64()
        );
    }
    if w.freed.len() > MAX_LINES {
        info!(
            "... and {} more pid(s) of the checkpoint were freed within {:.1} s",
            w.freed.len() - MAX_LINES,
            elapsed.as_secs_f64()
        );
    }
    for (p, h) in w.still_taken.iter().take(MAX_LINES) {
        error!(
            "pid {p} of the checkpoint is still taken by {h} after {:.1} s: CRIU will fail with \"Can't fork for PID: \
             File exists\": {}, then restore again",
            elapsed.as_secs_f64(),
            h.advice()
        );
    }
    if w.still_taken.len() > MAX_LINES {
        error!("... and {} more pid(s) of the checkpoint are still taken", w.still_taken.len() - MAX_LINES);
    }
    debug!(
        "the checkpoint's {count} pid(s) and thread id(s) checked in CRIU's pid namespace: {} check(s), {:.3} s",
        checks,
        elapsed.as_secs_f64()
    );
}
