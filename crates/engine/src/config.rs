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
    /// `CRIU_CUDA_MIGRATE_MEMORY_CHECK=off` skips the preflight's free-memory check.
    pub memory_check: bool,
    /// Lock timeout: CRIU's `--timeout` (seconds) when we can see it, else 10 s like CRIU.
    pub lock_timeout: Duration,
    /// Whether the dump leaves the tree running (`-R`/`--leave-running`).
    pub leave_running: LeaveRunning,
    /// `CRIU_CUDA_MIGRATE_LIBCUDA` / `_LIBNVML` (the driver agent reads them from the same
    /// environment); shown in the `settings:` line.
    pub libcuda: Option<String>,
    pub libnvml: Option<String>,
}

/// What the plugin knows about CRIU's `--leave-running`, which the plugin ABI does not expose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaveRunning {
    /// `-R`/`--leave-running` on CRIU's command line, or `CRIU_CUDA_MIGRATE_LEAVE_RUNNING=1`.
    Yes,
    /// A `criu dump` command line without it, or `CRIU_CUDA_MIGRATE_LEAVE_RUNNING=0`.
    No,
    /// CRIU driven over RPC (`criu swrk` under runc and crun, `criu service`): the request carries the
    /// option and nobody said. The dump then restores the devices at its end as for `Yes`: a final dump
    /// only pays that time before CRIU ends the tasks, while treating a dump that leaves the tasks running
    /// as final would leave them CHECKPOINTED, hung on their next CUDA call.
    Unknown,
}

impl LeaveRunning {
    /// Whether the end of a successful dump restores the devices.
    pub fn restores_devices(self) -> bool {
        !matches!(self, LeaveRunning::No)
    }
}

use ccm_identity::settings::{self, Setting};

pub const ENV_DISABLE: &str = settings::DISABLE.env;
pub const ENV_DEVICE_MAP: &str = settings::DEVICE_MAP.env;
pub const ENV_USABLE_GPUS: &str = settings::USABLE_GPUS.env;
pub const ENV_MODE: &str = settings::MODE.env;
pub const ENV_RECONCILE: &str = settings::RECONCILE.env;
pub const ENV_LEAVE_RUNNING: &str = settings::LEAVE_RUNNING.env;

/// The `--plugin-option` namespace (`criu-cuda-migrate.device-map=...`).
pub const OPTION_PREFIX: &str = settings::OPTION_PREFIX;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{name}={value:?} is not valid: expected {expected}")]
    Invalid { name: &'static str, value: String, expected: &'static str },
}

fn truthy(v: &str) -> bool {
    matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "yes" | "true" | "on")
}

fn falsy(v: &str) -> bool {
    matches!(v.trim().to_ascii_lowercase().as_str(), "0" | "no" | "false" | "off")
}

impl Config {
    /// Builds the configuration from an environment lookup, CRIU's own command line and the
    /// plugin options CRIU passed (`key=value`, already stripped of [`OPTION_PREFIX`]).
    pub fn from_sources(
        env: impl Fn(&str) -> Option<String>,
        criu_args: &[String],
        plugin_options: &[(String, String)],
    ) -> Result<Config, ConfigError> {
        // A plugin option overrides the environment.
        let get = |s: &Setting| {
            plugin_options.iter().rev().find(|(k, _)| k == s.option).map(|(_, v)| v.clone()).or_else(|| env(s.env))
        };
        // `auto` (CRIU cuda_plugin's word) is what no map means: the automatic map.
        let device_map =
            get(&settings::DEVICE_MAP).filter(|s| !s.trim().is_empty() && !s.trim().eq_ignore_ascii_case("auto"));
        let usable_gpus = get(&settings::USABLE_GPUS).filter(|s| !s.trim().is_empty());
        let libcuda = get(&settings::LIBCUDA).filter(|s| !s.trim().is_empty());
        let libnvml = get(&settings::LIBNVML).filter(|s| !s.trim().is_empty());
        let strictness = match get(&settings::MODE).as_deref().map(str::trim) {
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
        let reconcile = match get(&settings::RECONCILE).as_deref().map(str::trim) {
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
        let memory_check = match get(&settings::MEMORY_CHECK).as_deref().map(str::trim) {
            None | Some("") => true,
            Some(v) if truthy(v) => true,
            Some(v) if falsy(v) => false,
            Some(other) => {
                return Err(ConfigError::Invalid {
                    name: settings::MEMORY_CHECK.env,
                    value: other.to_string(),
                    expected: "`on` or `off`",
                })
            }
        };
        let disabled = get(&settings::DISABLE).is_some_and(|v| truthy(&v));
        let args = parse_criu_args(criu_args);
        let leave_running = match get(&settings::LEAVE_RUNNING).filter(|v| !v.trim().is_empty()) {
            _ if args.leave_running => LeaveRunning::Yes,
            Some(v) if truthy(&v) => LeaveRunning::Yes,
            Some(v) if falsy(&v) => LeaveRunning::No,
            Some(other) => {
                return Err(ConfigError::Invalid {
                    name: ENV_LEAVE_RUNNING,
                    value: other,
                    expected: "`1` (the dump leaves the processes running) or `0` (it ends them)",
                })
            }
            None if args.over_rpc => LeaveRunning::Unknown,
            None => LeaveRunning::No,
        };
        Ok(Config {
            disabled,
            device_map,
            usable_gpus,
            strictness,
            reconcile,
            memory_check,
            lock_timeout: Duration::from_secs(args.timeout_s.unwrap_or(10).max(1)),
            leave_running,
            libcuda,
            libnvml,
        })
    }

    pub fn from_process(plugin_options: &[(String, String)]) -> Result<Config, ConfigError> {
        let args = criu_command_line(&std::fs::read("/proc/self/cmdline").unwrap_or_default());
        log::debug!("CRIU's command line: {args:?}");
        Config::from_sources(|k| std::env::var(k).ok(), &args, plugin_options)
    }
}

/// The one `settings:` line the plugin logs at every init, so that whoever configured it through a
/// runtime (containers.conf, a systemd drop-in, `sudo env`) can see in CRIU's log what arrived.
impl std::fmt::Display for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "device map {}, usable GPUs {}, mode {}, reconcile {}, leave-running {}, lock timeout {} s, libcuda {}, NVML {}",
            self.device_map.as_deref().unwrap_or("automatic"),
            self.usable_gpus.as_deref().unwrap_or("all"),
            match self.strictness {
                Strictness::Strict => "strict",
                Strictness::Permissive => "permissive",
            },
            if self.reconcile { "on" } else { "off" },
            match self.leave_running {
                LeaveRunning::Yes => "yes",
                LeaveRunning::No => "no",
                LeaveRunning::Unknown => "unknown (CRIU over RPC; devices restored after the dump)",
            },
            self.lock_timeout.as_secs(),
            self.libcuda.as_deref().unwrap_or("default"),
            self.libnvml.as_deref().unwrap_or("default"),
        )
    }
}

/// CRIU's arguments from `/proc/self/cmdline`. A CRIU serving an RPC request has retitled itself through
/// libbsd's setproctitle, which leaves one NUL-free string (`criu: dump --rpc -t 4242 -D /ckpt`, measured
/// under runc 1.1): that one is split into words.
fn criu_command_line(raw: &[u8]) -> Vec<String> {
    let raw = raw.strip_suffix(&[0]).unwrap_or(raw);
    let args: Vec<String> = raw.split(|&c| c == 0).map(|s| String::from_utf8_lossy(s).into_owned()).collect();
    match args.as_slice() {
        [title] if title.contains(' ') => title.split_whitespace().map(str::to_string).collect(),
        _ => args,
    }
}

/// What CRIU's own command line says: `--timeout N` / `--timeout=N`, `-R` / `--leave-running`, and
/// whether CRIU serves an RPC request (`criu swrk` under runc and crun, `criu service`), whose options never
/// appear on the command line: such a CRIU retitles itself `dump --rpc -t PID -D DIR` before it loads plugins. The plugin ABI offers no access to CRIU's options.
#[derive(Debug, Default, PartialEq, Eq)]
struct CriuArgs {
    timeout_s: Option<u64>,
    leave_running: bool,
    over_rpc: bool,
}

fn parse_criu_args(args: &[String]) -> CriuArgs {
    let mut parsed = CriuArgs::default();
    let mut it = args.iter().skip(1).peekable();
    let mut command_seen = false;
    while let Some(a) = it.next() {
        if a == "--timeout" {
            parsed.timeout_s = it.peek().and_then(|v| v.parse().ok());
        } else if let Some(v) = a.strip_prefix("--timeout=") {
            parsed.timeout_s = v.parse().ok();
        } else if a == "--leave-running" {
            parsed.leave_running = true;
        } else if a == "--rpc" {
            // CRIU serving an RPC request retitles itself `dump --rpc -t PID -D DIR` (setproctitle).
            parsed.over_rpc = true;
        } else if a.starts_with('-') && !a.starts_with("--") && a.len() > 1 {
            // Short options may be bundled (`-vR`), but never look inside an option's value.
            if a[1..].chars().all(|c| c.is_ascii_alphabetic()) && a.contains('R') {
                parsed.leave_running = true;
            }
        } else if !a.starts_with('-') && !command_seen {
            // CRIU's command is its first word that is not an option.
            command_seen = true;
            parsed.over_rpc |= a == "swrk" || a == "service";
        }
    }
    parsed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    fn parsed(timeout_s: Option<u64>, leave_running: bool, over_rpc: bool) -> CriuArgs {
        CriuArgs { timeout_s, leave_running, over_rpc }
    }

    #[test]
    fn criu_command_lines() {
        assert_eq!(parse_criu_args(&args("criu dump -t 5 -D d --timeout 30 -R")), parsed(Some(30), true, false));
        assert_eq!(parse_criu_args(&args("criu dump --timeout=7 --leave-running")), parsed(Some(7), true, false));
        assert_eq!(parse_criu_args(&args("criu dump -t 5 -D /R")), parsed(None, false, false));
        assert_eq!(parse_criu_args(&args("criu swrk 3")), parsed(None, false, true));
        assert_eq!(
            parse_criu_args(&args("/usr/sbin/criu service --address /run/criu.sock")),
            parsed(None, false, true)
        );
        assert_eq!(parse_criu_args(&args("criu -v4 dump -t 5 -D swrk")), parsed(None, false, false));
        // What /proc/self/cmdline says while CRIU serves runc's or crun's request (measured under runc 1.1).
        let retitled = criu_command_line(b"criu: dump --rpc -t 4242 -D /ckpt\0");
        assert_eq!(retitled, args("criu: dump --rpc -t 4242 -D /ckpt"));
        assert_eq!(parse_criu_args(&retitled), parsed(None, false, true));
        let restore = criu_command_line(b"criu: restore --rpc -D /ckpt\0");
        assert_eq!(parse_criu_args(&restore), parsed(None, false, true));
        // A command line of several arguments keeps spaces inside them.
        assert_eq!(criu_command_line(b"criu\0dump\0-D\0/a -R b\0"), ["criu", "dump", "-D", "/a -R b"]);
        assert_eq!(parse_criu_args(&criu_command_line(b"criu\0dump\0-D\0/a -R b\0")), parsed(None, false, false));
    }

    #[test]
    fn leave_running_is_known_from_the_command_line_or_the_environment_else_unknown_over_rpc() {
        let with_env = |value: Option<&str>, cmdline: &str| {
            let value = value.map(str::to_string);
            Config::from_sources(|k| if k == ENV_LEAVE_RUNNING { value.clone() } else { None }, &args(cmdline), &[])
                .map(|c| c.leave_running)
        };
        assert_eq!(with_env(None, "criu dump -t 5 -D d").unwrap(), LeaveRunning::No);
        assert_eq!(with_env(None, "criu dump -t 5 -D d -R").unwrap(), LeaveRunning::Yes);
        assert_eq!(with_env(Some("0"), "criu dump -t 5 -D d -R").unwrap(), LeaveRunning::Yes);
        assert_eq!(with_env(None, "criu swrk 3").unwrap(), LeaveRunning::Unknown);
        assert_eq!(with_env(Some(""), "criu swrk 3").unwrap(), LeaveRunning::Unknown);
        assert_eq!(with_env(Some("1"), "criu swrk 3").unwrap(), LeaveRunning::Yes);
        assert_eq!(with_env(Some("no"), "criu swrk 3").unwrap(), LeaveRunning::No);
        let bad = with_env(Some("sometimes"), "criu swrk 3").unwrap_err().to_string();
        assert!(bad.contains(ENV_LEAVE_RUNNING) && bad.contains("`0`"), "{bad}");
        assert!(LeaveRunning::Unknown.restores_devices() && LeaveRunning::Yes.restores_devices());
        assert!(!LeaveRunning::No.restores_devices());
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
        assert_eq!(
            c.to_string(),
            "device map C=D, usable GPUs all, mode permissive, reconcile on, leave-running no, lock timeout 10 s, libcuda default, NVML default"
        );
        let bad = Config::from_sources(|k| (k == ENV_MODE).then(|| "loose".to_string()), &[], &[]);
        assert!(bad.unwrap_err().to_string().contains("strict"));
        // Every setting has its option, `auto` is no map, and a leave-running option beats RPC's unknown.
        let env = |k: &str| match k {
            ENV_DEVICE_MAP => Some("A=B".to_string()),
            ENV_LEAVE_RUNNING => Some("0".to_string()),
            _ => None,
        };
        let o = |k: &str, v: &str| (k.to_string(), v.to_string());
        let c = Config::from_sources(
            env,
            &args("criu swrk 3"),
            &[o("device-map", "auto"), o("leave-running", "1"), o("usable-gpus", "1"), o("libcuda", "/x")],
        )
        .unwrap();
        assert_eq!((c.device_map, c.leave_running), (None, LeaveRunning::Yes));
        assert_eq!((c.usable_gpus.as_deref(), c.libcuda.as_deref()), (Some("1"), Some("/x")));
        assert!(Config::from_sources(|_| None, &[], &[o("disable", "1")]).unwrap().disabled);
        assert!(
            !Config::from_sources(|k| (k == ENV_DISABLE).then(|| "1".into()), &[], &[o("disable", "0")])
                .unwrap()
                .disabled
        );
    }
}
