//! Fault knobs: make the next calls fail on purpose.
//!
//! Knobs come from two places, merged on every call so a test can flip them while CRIU (or any
//! other process) is in the middle of its work:
//! - the environment variable `CCM_SIM_FAULTS` of the process that serves the call, and
//! - the file `STATE/faults`.
//!
//! Both hold knobs separated by commas or new lines; `#` starts a comment:
//!
//! | knob | effect |
//! |---|---|
//! | `lock-timeout` | `cuCheckpointProcessLock` waits its timeout, then CUDA_ERROR_NOT_READY (600) |
//! | `checkpoint-fail[=CODE]` | `cuCheckpointProcessCheckpoint` fails (default 999), process stays LOCKED |
//! | `restore-fail[=CODE]` | `cuCheckpointProcessRestore` fails (default 304), process stays CHECKPOINTED |
//! | `unlock-fail[=CODE]` | `cuCheckpointProcessUnlock` fails (default 999), process stays LOCKED |
//! | `nvml-missing` | `nvmlInit*` fails with NVML_ERROR_DRIVER_NOT_LOADED (9) |
//! | `nvml-init-hang[=MS]` | `nvmlInit*` sleeps MS milliseconds before it answers; without MS it never returns (a stuck driver) |
//! | `restore-thread-stall` | the restore thread stops answering (as if it were ptrace-stopped) |
//! | `restore-slow[=MS]` | the restore waits MS (2000) before it does anything |
//! | `agent-stop=CALL` | the CALLER (the plugin's driver agent) stops itself with SIGSTOP once it has posted CALL (`lock`, `checkpoint`, `restore`, `unlock`): the target works on, the caller never answers |
//! | `agent-kill=CALL` | the same with SIGKILL: the caller dies mid-call |
//!
//! The two caller knobs fire once per state directory (the marker `STATE/agent-fault-fired`), so the
//! fresh agent that puts things back afterwards is not stopped too.

use crate::{cuda, StateDir};

pub const ENV_FAULTS: &str = "CCM_SIM_FAULTS";

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Faults {
    pub lock_timeout: bool,
    pub checkpoint_fail: Option<i32>,
    pub restore_fail: Option<i32>,
    pub unlock_fail: Option<i32>,
    pub nvml_missing: bool,
    /// `nvmlInit*` hangs (`nvml-init-hang[=MS]`): `Some(Some(ms))` sleeps that long first,
    /// `Some(None)` never returns.
    pub nvml_init_hang_ms: Option<Option<u64>>,
    pub restore_thread_stall: bool,
    /// The restore takes this many milliseconds before it does anything (`restore-slow[=MS]`, 2000).
    pub restore_slow_ms: Option<u64>,
    /// The caller of this call stops itself (SIGSTOP) once it posted it (`agent-stop=CALL`).
    pub agent_stop: Option<String>,
    /// The caller of this call kills itself (SIGKILL) once it posted it (`agent-kill=CALL`).
    pub agent_kill: Option<String>,
    /// Knobs this build does not know: reported by the doubles on stderr, never silently ignored.
    pub unknown: Vec<String>,
}

impl Faults {
    /// Parses knob text (see the module docs).
    pub fn parse(text: &str) -> Faults {
        let mut f = Faults::default();
        f.merge_text(text);
        f
    }

    fn merge_text(&mut self, text: &str) {
        for line in text.lines() {
            let line = line.split('#').next().unwrap_or("");
            for item in line.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                let (key, value) = match item.split_once('=') {
                    Some((k, v)) => (k.trim(), Some(v.trim())),
                    None => (item, None),
                };
                let code = |default: i32| value.and_then(|v| v.parse().ok()).unwrap_or(default);
                match key {
                    "lock-timeout" => self.lock_timeout = true,
                    "checkpoint-fail" => self.checkpoint_fail = Some(code(cuda::CUDA_ERROR_UNKNOWN)),
                    "restore-fail" => self.restore_fail = Some(code(cuda::CUDA_ERROR_OPERATING_SYSTEM)),
                    "unlock-fail" => self.unlock_fail = Some(code(cuda::CUDA_ERROR_UNKNOWN)),
                    "nvml-missing" => self.nvml_missing = true,
                    "nvml-init-hang" => self.nvml_init_hang_ms = Some(value.and_then(|v| v.parse().ok())),
                    "restore-thread-stall" => self.restore_thread_stall = true,
                    "restore-slow" => self.restore_slow_ms = Some(value.and_then(|v| v.parse().ok()).unwrap_or(2000)),
                    "agent-stop" => self.agent_stop = value.map(str::to_string),
                    "agent-kill" => self.agent_kill = value.map(str::to_string),
                    other => self.unknown.push(other.to_string()),
                }
            }
        }
    }

    /// The knobs in force now for this process: `CCM_SIM_FAULTS` plus `STATE/faults` (if any).
    pub fn current(state: Option<&StateDir>) -> Faults {
        let mut f = Faults::default();
        if let Ok(text) = std::env::var(ENV_FAULTS) {
            f.merge_text(&text);
        }
        if let Some(state) = state {
            if let Ok(text) = std::fs::read_to_string(state.faults()) {
                f.merge_text(&text);
            }
        }
        f
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_knobs_codes_and_comments() {
        let f = Faults::parse("lock-timeout, restore-fail=1\n# checkpoint-fail\nunlock-fail\nbogus");
        assert!(f.lock_timeout);
        assert_eq!(f.restore_fail, Some(1));
        assert_eq!(f.checkpoint_fail, None);
        assert_eq!(f.unlock_fail, Some(999));
        assert!(!f.nvml_missing);
        assert_eq!(f.nvml_init_hang_ms, None);
        assert_eq!(f.unknown, vec!["bogus".to_string()]);
        assert_eq!(Faults::parse("nvml-init-hang").nvml_init_hang_ms, Some(None));
        assert_eq!(Faults::parse("nvml-init-hang=250").nvml_init_hang_ms, Some(Some(250)));
    }

    #[test]
    fn caller_knobs_name_the_call() {
        let f = Faults::parse("agent-stop=checkpoint\nagent-kill=restore");
        assert_eq!(f.agent_stop.as_deref(), Some("checkpoint"));
        assert_eq!(f.agent_kill.as_deref(), Some("restore"));
        assert!(f.unknown.is_empty());
    }

    #[test]
    fn file_knobs_are_read_per_call() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::new(dir.path());
        assert!(!Faults::current(Some(&state)).nvml_missing);
        std::fs::write(state.faults(), "nvml-missing\n").unwrap();
        assert!(Faults::current(Some(&state)).nvml_missing);
    }
}
