//! The plugin's configuration: environment of `criu`, overridden by CRIU plugin options.

use std::time::Duration;

/// What to do when the restored identity cannot be made consistent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strictness {
    /// Kill the restored tree (images stay intact for a retry).
    Strict,
    /// Log an error and let the process run.
    Permissive,
}

#[derive(Debug, Clone)]
pub struct Config {
    pub disabled: bool,
    /// `CRIU_CUDA_MIGRATE_DEVICE_MAP`: `OLD=NEW,...`.
    pub device_map: Option<String>,
    /// `CRIU_CUDA_MIGRATE_USABLE_GPUS`: UUIDs or NVML indices.
    pub usable_gpus: Option<String>,
    pub strictness: Strictness,
    /// `CRIU_CUDA_MIGRATE_RECONCILE=off` skips the identity rewrite (to reproduce the bug).
    pub reconcile: bool,
    /// Lock timeout: CRIU's `--timeout` (seconds) when we can see it, else 10 s like CRIU.
    pub lock_timeout: Duration,
    /// Whether the dump leaves the tree running (`-R`/`--leave-running`).
    pub leave_running: bool,
}

pub const ENV_DISABLE: &str = "CRIU_CUDA_MIGRATE_DISABLE";
pub const ENV_DEVICE_MAP: &str = "CRIU_CUDA_MIGRATE_DEVICE_MAP";
pub const ENV_USABLE_GPUS: &str = "CRIU_CUDA_MIGRATE_USABLE_GPUS";
pub const ENV_MODE: &str = "CRIU_CUDA_MIGRATE_MODE";
pub const ENV_RECONCILE: &str = "CRIU_CUDA_MIGRATE_RECONCILE";
pub const ENV_LEAVE_RUNNING: &str = "CRIU_CUDA_MIGRATE_LEAVE_RUNNING";

/// The `--plugin-option` namespace (`criu-cuda-migrate.device-map=...`).
pub const OPTION_PREFIX: &str = "criu-cuda-migrate.";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{name}={value:?} is not valid: expected {expected}")]
    Invalid { name: &'static str, value: String, expected: &'static str },
}

fn truthy(v: &str) -> bool {
    matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "yes" | "true" | "on")
}

impl Config {
    /// Builds the configuration from an environment lookup, CRIU's own command line and the
    /// plugin options CRIU passed (`key=value`, already stripped of [`OPTION_PREFIX`]).
    pub fn from_sources(
        env: impl Fn(&str) -> Option<String>,
        criu_args: &[String],
        plugin_options: &[(String, String)],
    ) -> Result<Config, ConfigError> {
        let opt = |key: &str| plugin_options.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.clone());
        let device_map = opt("device-map").or_else(|| env(ENV_DEVICE_MAP)).filter(|s| !s.trim().is_empty());
        let usable_gpus = opt("usable-gpus").or_else(|| env(ENV_USABLE_GPUS)).filter(|s| !s.trim().is_empty());
        let strictness = match opt("mode").or_else(|| env(ENV_MODE)).as_deref().map(str::trim) {
            None | Some("") | Some("strict") => Strictness::Strict,
            Some("permissive") => Strictness::Permissive,
            Some(other) => {
                return Err(ConfigError::Invalid {
                    name: ENV_MODE,
                    value: other.to_string(),
                    expected: "`strict` or `permissive`",
                })
            }
        };
        let reconcile = match opt("reconcile").or_else(|| env(ENV_RECONCILE)).as_deref().map(str::trim) {
            None | Some("") | Some("on") | Some("1") => true,
            Some("off") | Some("0") => false,
            Some(other) => {
                return Err(ConfigError::Invalid {
                    name: ENV_RECONCILE,
                    value: other.to_string(),
                    expected: "`on` or `off`",
                })
            }
        };
        let disabled = env(ENV_DISABLE).is_some_and(|v| truthy(&v));
        let (timeout_s, leave_running_arg) = parse_criu_args(criu_args);
        let leave_running = leave_running_arg || env(ENV_LEAVE_RUNNING).is_some_and(|v| truthy(&v));
        Ok(Config {
            disabled,
            device_map,
            usable_gpus,
            strictness,
            reconcile,
            lock_timeout: Duration::from_secs(timeout_s.unwrap_or(10).max(1)),
            leave_running,
        })
    }

    pub fn from_process(plugin_options: &[(String, String)]) -> Result<Config, ConfigError> {
        let args: Vec<String> = std::fs::read("/proc/self/cmdline")
            .map(|b| b.split(|&c| c == 0).map(|s| String::from_utf8_lossy(s).into_owned()).collect())
            .unwrap_or_default();
        Config::from_sources(|k| std::env::var(k).ok(), &args, plugin_options)
    }
}

/// CRIU's own `--timeout N` / `--timeout=N` and `-R` / `--leave-running`, read from its command
/// line: the plugin ABI offers no access to CRIU's options. Under `criu swrk` (RPC) neither is on
/// the command line; `CRIU_CUDA_MIGRATE_LEAVE_RUNNING=1` tells the plugin instead.
fn parse_criu_args(args: &[String]) -> (Option<u64>, bool) {
    let mut timeout = None;
    let mut leave_running = false;
    let mut it = args.iter().peekable();
    while let Some(a) = it.next() {
        if a == "--timeout" {
            timeout = it.peek().and_then(|v| v.parse().ok());
        } else if let Some(v) = a.strip_prefix("--timeout=") {
            timeout = v.parse().ok();
        } else if a == "--leave-running" {
            leave_running = true;
        } else if a.starts_with('-') && !a.starts_with("--") && a.len() > 1 {
            // Short options may be bundled (`-vR`), but never look inside an option's value.
            if a[1..].chars().all(|c| c.is_ascii_alphabetic()) && a.contains('R') {
                leave_running = true;
            }
        }
    }
    (timeout, leave_running)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn criu_command_line() {
        assert_eq!(parse_criu_args(&args("criu dump -t 5 -D d --timeout 30 -R")), (Some(30), true));
        assert_eq!(parse_criu_args(&args("criu dump --timeout=7 --leave-running")), (Some(7), true));
        assert_eq!(parse_criu_args(&args("criu dump -t 5 -D /R")), (None, false));
        assert_eq!(parse_criu_args(&args("criu swrk 3")), (None, false));
    }

    #[test]
    fn options_override_env() {
        let env = |k: &str| match k {
            ENV_DEVICE_MAP => Some("A=B".to_string()),
            ENV_MODE => Some("permissive".to_string()),
            _ => None,
        };
        let c = Config::from_sources(env, &[], &[("device-map".into(), "C=D".into())]).unwrap();
        assert_eq!(c.device_map.as_deref(), Some("C=D"));
        assert_eq!(c.strictness, Strictness::Permissive);
        assert!(c.reconcile);
        assert_eq!(c.lock_timeout, Duration::from_secs(10));
        let bad = Config::from_sources(|k| (k == ENV_MODE).then(|| "loose".to_string()), &[], &[]);
        assert!(bad.unwrap_err().to_string().contains("strict"));
    }
}
