//! The per-action tool path: what CRIU's own CUDA plugin pays by running the `cuda-checkpoint`
//! tool once per action. Modelled with this program: `ccm-bench action A --pid P` is a fresh
//! process that loads libcuda, calls `cuInit(0)` and makes the one API call. The sequence per pid
//! follows CRIU 4.1's `cuda_plugin.c` hooks:
//!
//! - PAUSE_DEVICES: get-restore-tid, get-state, lock
//! - CHECKPOINT_DEVICES: get-restore-tid, checkpoint
//! - RESUME_DEVICES_LATE (restore side): get-restore-tid, restore, unlock
//!
//! CRIU calls each hook once per pid, one pid after the other, so a tree of N processes pays
//! N times the sequence, serially.

use std::process::{Command, Stdio};
use std::time::Instant;

use ccm_driver::checkpoint::timed;
use ccm_driver::Libcuda;
use clap::ValueEnum;
use serde::{Deserialize, Serialize};

use crate::error::BenchError;
use crate::floor::Controller;

/// One call of the checkpoint API, as a `cuda-checkpoint` invocation would make it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    RestoreTid,
    State,
    Lock,
    Checkpoint,
    Restore,
    Unlock,
}

impl Action {
    pub fn name(self) -> &'static str {
        match self {
            Action::RestoreTid => "restore-tid",
            Action::State => "state",
            Action::Lock => "lock",
            Action::Checkpoint => "checkpoint",
            Action::Restore => "restore",
            Action::Unlock => "unlock",
        }
    }
}

/// The CRIU hooks in the order CRIU runs them, each with the tool invocations CRIU's CUDA plugin
/// makes in it for one pid.
pub const HOOKS: [(&str, &[Action]); 3] = [
    ("PAUSE_DEVICES", &[Action::RestoreTid, Action::State, Action::Lock]),
    ("CHECKPOINT_DEVICES", &[Action::RestoreTid, Action::Checkpoint]),
    ("RESUME_DEVICES_LATE", &[Action::RestoreTid, Action::Restore, Action::Unlock]),
];

/// What one `action` child reports on stdout.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ActionReport {
    pub action: Action,
    pub pid: i32,
    pub load_s: f64,
    pub cuinit_s: f64,
    pub call_s: f64,
}

/// Runs one action in this process (the child side).
pub fn run_action(action: Action, pid: i32, lock_timeout_ms: u32) -> Result<ActionReport, BenchError> {
    let t0 = Instant::now();
    let lib = Libcuda::load(std::env::var(ccm_settings::LIBCUDA.env).ok().filter(|v| !v.trim().is_empty()).as_deref())?;
    let api = ccm_driver::checkpoint::CheckpointApi::new(&lib)?;
    let load_s = t0.elapsed().as_secs_f64();
    let init = timed(|| lib.init());
    init.value.map_err(BenchError::Init)?;
    let call = timed(|| match action {
        Action::RestoreTid => api.restore_thread_id(pid).map(|_| ()),
        Action::State => api.state(pid).map(|_| ()),
        Action::Lock => api.lock(pid, lock_timeout_ms),
        Action::Checkpoint => api.checkpoint(pid),
        Action::Restore => api.restore(pid, &[]),
        Action::Unlock => api.unlock(pid),
    });
    call.value.map_err(|source| BenchError::Step { pid, source, left: String::new() })?;
    Ok(ActionReport { action, pid, load_s, cuinit_s: init.elapsed.as_secs_f64(), call_s: call.elapsed.as_secs_f64() })
}

/// One child as the parent saw it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ChildTime {
    pub hook: &'static str,
    pub action: Action,
    pub pid: i32,
    /// Spawn to exit, as the parent (CRIU's plugin) waits for it.
    pub wall_s: f64,
    pub cuinit_s: f64,
    pub call_s: f64,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PerActionRepeat {
    pub children: Vec<ChildTime>,
    /// Sum of the children's wall times: the whole tool path for the tree, serial.
    pub total_s: f64,
    /// Sum of the API calls alone.
    pub calls_s: f64,
    /// What the per-process design adds: total minus the calls (process starts, loads, cuInit).
    pub overhead_s: f64,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PerActionResult {
    pub kind: &'static str,
    pub pids: Vec<i32>,
    pub children_per_pid: usize,
    pub repeats: Vec<PerActionRepeat>,
}

/// Runs the whole per-action sequence `repeats` times on `pids`.
pub fn run(pids: &[i32], repeats: u32, lock_timeout_ms: u32) -> Result<PerActionResult, BenchError> {
    let exe = std::env::current_exe().map_err(BenchError::SelfPath)?;
    let mut out = Vec::new();
    for _ in 0..repeats {
        let mut children = Vec::new();
        for (hook, actions) in HOOKS {
            for &pid in pids {
                for &action in actions {
                    match spawn_action(&exe, action, pid, lock_timeout_ms) {
                        Ok((wall_s, r)) => children.push(ChildTime {
                            hook,
                            action,
                            pid,
                            wall_s,
                            cuinit_s: r.cuinit_s,
                            call_s: r.call_s,
                        }),
                        Err(e) => return Err(recover_after(pids, lock_timeout_ms, e)),
                    }
                }
            }
        }
        let total_s: f64 = children.iter().map(|c| c.wall_s).sum();
        let calls_s: f64 = children.iter().map(|c| c.call_s).sum();
        out.push(PerActionRepeat { children, total_s, calls_s, overhead_s: total_s - calls_s });
    }
    let children_per_pid = HOOKS.iter().map(|(_, a)| a.len()).sum();
    Ok(PerActionResult { kind: "per-action", pids: pids.to_vec(), children_per_pid, repeats: out })
}

/// After a failed child, puts every pid back to RUNNING (in this process) so the next
/// measurement starts clean; the error keeps what could not be undone.
fn recover_after(pids: &[i32], lock_timeout_ms: u32, e: BenchError) -> BenchError {
    let Ok(c) = Controller::start(lock_timeout_ms) else { return e };
    let left: Vec<String> = pids.iter().filter_map(|&p| c.recover(p).err()).collect();
    if left.is_empty() {
        e
    } else {
        BenchError::LeftBehind { cause: Box::new(e), left: left.join("; ") }
    }
}

fn spawn_action(
    exe: &std::path::Path,
    action: Action,
    pid: i32,
    lock_timeout_ms: u32,
) -> Result<(f64, ActionReport), BenchError> {
    let command = format!("{} action {} --pid {pid}", exe.display(), action.name());
    let t0 = Instant::now();
    let out = Command::new(exe)
        .args(["action", action.name(), "--pid", &pid.to_string(), "--lock-timeout-ms", &lock_timeout_ms.to_string()])
        .stdin(Stdio::null())
        .output()
        .map_err(|source| BenchError::Spawn { command: command.clone(), source })?;
    let wall_s = t0.elapsed().as_secs_f64();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        return Err(BenchError::Child {
            command,
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    let report: ActionReport =
        serde_json::from_str(stdout.trim()).map_err(|source| BenchError::ChildOutput { command, stdout, source })?;
    Ok((wall_s, report))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hooks_make_eight_tool_calls_per_pid_with_each_state_change_once() {
        let all: Vec<Action> = HOOKS.iter().flat_map(|(_, a)| a.iter().copied()).collect();
        assert_eq!(all.len(), 8);
        for a in [Action::Lock, Action::Checkpoint, Action::Restore, Action::Unlock] {
            assert_eq!(all.iter().filter(|x| **x == a).count(), 1, "{a:?}");
        }
        let pos = |a| all.iter().position(|x| *x == a).unwrap_or(usize::MAX);
        assert!(pos(Action::Lock) < pos(Action::Checkpoint));
        assert!(pos(Action::Checkpoint) < pos(Action::Restore));
        assert!(pos(Action::Restore) < pos(Action::Unlock));
    }

    #[test]
    fn action_names_round_trip_through_the_command_line_and_json() {
        for a in [Action::RestoreTid, Action::State, Action::Lock, Action::Checkpoint, Action::Restore, Action::Unlock]
        {
            assert_eq!(Action::from_str(a.name(), false), Ok(a));
            assert_eq!(serde_json::to_string(&a).unwrap_or_default(), format!("\"{}\"", a.name()));
        }
    }

    #[test]
    fn a_child_report_parses_back() {
        let r = ActionReport { action: Action::Checkpoint, pid: 42, load_s: 0.01, cuinit_s: 0.2, call_s: 0.9 };
        let text = serde_json::to_string(&r).unwrap_or_default();
        let back: ActionReport = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert_eq!(back, r);
    }
}
