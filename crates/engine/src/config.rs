//! The plugin's configuration: environment of `criu`, overridden by CRIU plugin options.

use std::time::Duration;

pub use ccm_settings::value::{IpcImporters, ManagedMemory, MultiProcess, Staging, Strictness};

/// A setting's value and where it came from (`CRIU_CUDA_MIGRATE_DEVICE_MAP`,
/// `--plugin-option criu-cuda-migrate.device-map`, the CLI's `--device-map`), so that an error
/// about it names what the user wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sourced<T> {
    pub value: T,
    pub from: String,
}

#[derive(Debug, Clone)]
pub struct Config {
    pub disabled: bool,
    /// `CRIU_CUDA_MIGRATE_DEVICE_MAP`: explicit `OLD=NEW` pairs, parsed; `None`: the automatic map.
    pub device_map: Option<Sourced<Vec<(GpuUuid, GpuUuid)>>>,
    /// `CRIU_CUDA_MIGRATE_USABLE_GPUS`: UUIDs or NVML indices, parsed (resolved against the node's GPUs by
    /// the preflight, after [`crate::preflight::usable_source`] decided that the setting applies).
    pub usable_gpus: Option<Sourced<UsableGpus>>,
    pub strictness: Strictness,
    /// `CRIU_CUDA_MIGRATE_RECONCILE=off` skips the identity rewrite (to reproduce the bug).
    pub reconcile: bool,
    /// `CRIU_CUDA_MIGRATE_MEMORY_CHECK=off` skips the preflight's free-memory check.
    pub memory_check: bool,
    /// Lock timeout: CRIU's `--timeout` (seconds) when we can see it, else 10 s like CRIU.
    pub lock_timeout: Duration,
    /// `CRIU_CUDA_MIGRATE_DRIVER_TIMEOUT`: how long one checkpoint or restore call may take
    /// before the driver agent is given up on; `None`: [`Config::call_deadline`]'s default.
    pub driver_timeout: Option<Duration>,
    /// Whether the dump leaves the tree running (`-R`/`--leave-running`).
    pub leave_running: LeaveRunning,
    /// `CRIU_CUDA_MIGRATE_MULTI_PROCESS`: what a dump of several CUDA processes does.
    pub multi_process: MultiProcess,
    /// `CRIU_CUDA_MIGRATE_IPC`: what a dump whose tree holds a CUDA IPC importer does.
    pub ipc: IpcImporters,
    /// `CRIU_CUDA_MIGRATE_MANAGED`: what a dump of a CUDA process with managed memory does.
    pub managed: ManagedMemory,
    /// `CRIU_CUDA_MIGRATE_STAGING`: who writes the driver's staging pages at dump.
    pub staging: Staging,
    /// `CRIU_CUDA_MIGRATE_STAGING_THREADS`: the staging copy's threads; `None`: [`Config::staging_threads`]'s default.
    pub staging_threads_setting: Option<usize>,
    /// `CRIU_CUDA_MIGRATE_LIBCUDA` / `_LIBNVML` (the driver agent reads them from the same
    /// environment); shown in the `settings:` line.
    pub libcuda: Option<String>,
    pub libnvml: Option<String>,
    /// `CCM_TEST_DOUBLE_NVIDIA_DEVICES` (CI's test doubles only): device numbers that stand for NVIDIA nodes
    /// beside `/proc/devices`' (`char:10:237=nvidiactl,block:7:0=nvidia0`), checked here; shown in the
    /// `settings:` line whenever set, so that no run hides it.
    pub test_double_devices: Option<String>,
}

/// The test doubles' stand-in device numbers (docs/TEST-DOUBLES.md); never a setting of the product.
pub const ENV_TEST_DOUBLE_DEVICES: &str = "CCM_TEST_DOUBLE_NVIDIA_DEVICES";

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

use ccm_identity::map::UsableGpus;
use ccm_identity::GpuUuid;
use ccm_settings::options::GivenOption;
use ccm_settings::value::{self, DeviceMapSetting, ValueError};
use ccm_settings::{self as settings, Setting};

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
    Invalid { name: String, value: String, expected: String },
    #[error("{ENV_TEST_DOUBLE_DEVICES}: {0}")]
    TestDoubleDevices(String),
}

impl ConfigError {
    fn invalid(name: impl Into<String>, value: impl Into<String>, expected: impl Into<String>) -> ConfigError {
        ConfigError::Invalid { name: name.into(), value: value.into(), expected: expected.into() }
    }
}

/// A setting's value read by its syntax ([`ccm_settings::value`], the functions the plugin-option reader checks
/// with); an error names where the value came from.
fn read<T>(
    got: Option<(String, String)>,
    parse: impl Fn(&str) -> Result<T, ValueError>,
) -> Result<Option<Sourced<T>>, ConfigError> {
    got.map(|(v, from)| match parse(&v) {
        Ok(value) => Ok(Sourced { value, from }),
        Err(e) => Err(ConfigError::Invalid { name: from, value: v, expected: e.expected }),
    })
    .transpose()
}

/// Explicit (dump GPU, restore GPU) pairs, as a device map setting gives them.
pub type DevicePairs = Vec<(GpuUuid, GpuUuid)>;

/// Parses a device map setting (`auto` or nothing: the automatic map) by [`value::parse_device_map`], naming its
/// source.
pub fn parse_device_map(text: &str, from: &str) -> Result<Option<Sourced<DevicePairs>>, ConfigError> {
    match value::parse_device_map(text) {
        Ok(DeviceMapSetting::Auto) => Ok(None),
        Ok(DeviceMapSetting::Pairs(pairs)) => Ok(Some(Sourced { value: pairs, from: from.to_string() })),
        Err(e) => Err(ConfigError::invalid(from, text.trim(), e.expected)),
    }
}

/// Longest lock timeout taken from CRIU's `--timeout` (the driver takes milliseconds in 32 bits).
const MAX_LOCK_TIMEOUT_S: u64 = (u32::MAX / 1000) as u64;
/// The default deadline of one checkpoint or restore call: this much, plus [`DEADLINE_PER_GIB`]
/// for every GiB of the process's device memory (the driver copies 2-6 GB/s: ten times margin).
const DEADLINE_BASE: Duration = Duration::from_secs(60);
const DEADLINE_PER_GIB: Duration = Duration::from_secs(5);

impl Config {
    /// Builds the configuration from an environment lookup, CRIU's own command line and the
    /// plugin options CRIU passed (`key=value`, already stripped of [`OPTION_PREFIX`]).
    pub fn from_sources(
        env: impl Fn(&str) -> Option<String>,
        criu_args: &[String],
        plugin_options: &[GivenOption],
    ) -> Result<Config, ConfigError> {
        // A plugin option overrides the environment; each value keeps where it came from. An empty environment
        // variable is no setting; an option of ours always has a value (the device map's empty value is `auto`).
        let get = |s: &Setting| -> Option<(String, String)> {
            plugin_options
                .iter()
                .rev()
                .find(|g| g.setting == *s)
                .map(|g| (g.value.clone(), format!("--plugin-option {}", g.given_as)))
                .or_else(|| env(s.env).filter(|v| !v.trim().is_empty()).map(|v| (v, s.env.to_string())))
        };
        // Each value is parsed here, once, by its setting's syntax: a malformed one is the setting's error, named
        // by its source, before any node is asked.
        let device_map = match get(&settings::DEVICE_MAP) {
            Some((v, from)) => parse_device_map(&v, &from)?,
            None => None,
        };
        let usable_gpus = read(get(&settings::USABLE_GPUS), value::parse_usable_gpus)?;
        let libcuda = read(get(&settings::LIBCUDA), value::parse_path)?.map(|s| s.value);
        let libnvml = read(get(&settings::LIBNVML), value::parse_path)?.map(|s| s.value);
        let strictness = read(get(&settings::MODE), value::parse_mode)?.map_or(Strictness::Strict, |s| s.value);
        let on_off = |s: &Setting, default: bool| -> Result<bool, ConfigError> {
            Ok(read(get(s), value::parse_switch)?.map_or(default, |s| s.value))
        };
        let reconcile = on_off(&settings::RECONCILE, true)?;
        let memory_check = on_off(&settings::MEMORY_CHECK, true)?;
        let disabled = on_off(&settings::DISABLE, false)?;
        let args = parse_criu_args(criu_args)?;
        let leave_running = match read(get(&settings::LEAVE_RUNNING), value::parse_leave_running)? {
            _ if args.leave_running => LeaveRunning::Yes,
            Some(Sourced { value: true, .. }) => LeaveRunning::Yes,
            Some(Sourced { value: false, .. }) => LeaveRunning::No,
            None if args.over_rpc => LeaveRunning::Unknown,
            None => LeaveRunning::No,
        };
        let multi_process =
            read(get(&settings::MULTI_PROCESS), value::parse_multi_process)?.map_or(MultiProcess::Check, |s| s.value);
        let ipc = read(get(&settings::IPC), value::parse_ipc)?.map_or(IpcImporters::Refuse, |s| s.value);
        let managed = read(get(&settings::MANAGED), value::parse_managed)?.map_or(ManagedMemory::Refuse, |s| s.value);
        let driver_timeout = read(get(&settings::DRIVER_TIMEOUT), value::parse_timeout)?.map(|s| s.value);
        let staging = read(get(&settings::STAGING), value::parse_staging)?.map_or(Staging::Plugin, |s| s.value);
        let staging_threads_setting = read(get(&settings::STAGING_THREADS), value::parse_threads)?.map(|s| s.value);
        let test_double_devices = env(ENV_TEST_DOUBLE_DEVICES).filter(|v| !v.trim().is_empty());
        if let Some(v) = &test_double_devices {
            ccm_identity::claims::NvidiaDevices::default()
                .with_stand_ins(v)
                .map_err(|e| ConfigError::TestDoubleDevices(e.to_string()))?;
        }
        Ok(Config {
            disabled,
            device_map,
            usable_gpus,
            strictness,
            reconcile,
            memory_check,
            lock_timeout: Duration::from_secs(args.timeout_s.unwrap_or(10).max(1)),
            driver_timeout,
            leave_running,
            multi_process,
            ipc,
            managed,
            staging,
            staging_threads_setting,
            libcuda,
            libnvml,
            test_double_devices,
        })
    }

    /// The staging copy's threads: the setting, else the CPUs this process may run on, at most 16.
    pub fn staging_threads(&self) -> usize {
        self.staging_threads_setting
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(4, |n| n.get()).min(16))
            .max(1)
    }

    /// The deadline of one checkpoint or restore call on a process holding `device_bytes` of
    /// device memory (`None`: unknown): the setting, else [`DEADLINE_BASE`] plus
    /// [`DEADLINE_PER_GIB`] per GiB (an unknown amount counts as 80 GiB).
    pub fn call_deadline(&self, device_bytes: Option<u64>) -> Duration {
        if let Some(t) = self.driver_timeout {
            return t;
        }
        let gib = device_bytes.unwrap_or(80 << 30).div_ceil(1 << 30);
        DEADLINE_BASE + DEADLINE_PER_GIB * u32::try_from(gib).unwrap_or(u32::MAX)
    }

    /// The driver libraries the environment's settings name, by the rule [`Config::from_sources`] reads them
    /// with, for the CLI's commands that need no other setting (the driver crate reads no environment).
    pub fn driver_libs_in_env() -> ccm_agent::DriverLibs {
        let get = |s: &Setting| std::env::var(s.env).ok().and_then(|v| value::parse_path(&v).ok());
        ccm_agent::DriverLibs { libcuda: get(&settings::LIBCUDA), libnvml: get(&settings::LIBNVML) }
    }

    /// The driver libraries the agent loads.
    pub fn driver_libs(&self) -> ccm_agent::DriverLibs {
        ccm_agent::DriverLibs { libcuda: self.libcuda.clone(), libnvml: self.libnvml.clone() }
    }

    pub fn from_process(plugin_options: &[GivenOption]) -> Result<Config, ConfigError> {
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
            "device map {}, usable GPUs {}, mode {}, reconcile {}, leave-running {}, ipc {}, multi-process {}, managed {}, staging {}, lock timeout {} s, libcuda {}, NVML {}",
            self.device_map
                .as_ref()
                .map(|m| m.value.iter().map(|(o, n)| format!("{o}={n}")).collect::<Vec<_>>().join(","))
                .unwrap_or_else(|| "automatic".into()),
            self.usable_gpus.as_ref().map(|u| u.value.to_string()).unwrap_or_else(|| "all".into()),
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
            match self.ipc {
                IpcImporters::Refuse => "refuse",
                IpcImporters::Allow => "allow",
            },
            match self.multi_process {
                MultiProcess::Check => "check",
                MultiProcess::Warn => "warn",
                MultiProcess::Refuse => "refuse",
            },
            match self.managed {
                ManagedMemory::Refuse => "refuse",
                ManagedMemory::Try => "try",
            },
            match self.staging {
                Staging::Plugin => match self.staging_threads_setting {
                    Some(n) => format!("plugin ({n} threads)"),
                    None => "plugin".to_string(),
                },
                Staging::Criu => "criu".to_string(),
            },
            self.lock_timeout.as_secs(),
            self.libcuda.as_deref().unwrap_or("default"),
            self.libnvml.as_deref().unwrap_or("default"),
        )?;
        if let Some(d) = &self.test_double_devices {
            write!(f, ", test-double NVIDIA devices {d}")?;
        }
        Ok(())
    }
}

/// CRIU's arguments from `/proc/self/cmdline`. A CRIU serving an RPC request has retitled itself through
/// libbsd's setproctitle, which leaves one NUL-free string (`criu: dump --rpc -t 4242 -D /ckpt`, measured
/// under runc 1.1): that one is split into words.
fn criu_command_line(raw: &[u8]) -> Vec<String> {
    let raw = raw.strip_suffix(&[0]).unwrap_or(raw);
    let mut args: Vec<String> = raw.split(|&c| c == 0).map(|s| String::from_utf8_lossy(s).into_owned()).collect();
    // A retitled CRIU (setproctitle) pads its old argument space with empty strings, as many as its
    // arguments and environment filled: without them the title is the one word to split.
    while args.len() > 1 && args.last().is_some_and(String::is_empty) {
        args.pop();
    }
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

/// CRIU's own options as the plugin reads them; an error for a `--timeout` that is no number of
/// seconds the plugin can pass on (it is never silently replaced by the default).
fn parse_criu_args(args: &[String]) -> Result<CriuArgs, ConfigError> {
    let mut parsed = CriuArgs::default();
    let mut it = args.iter().skip(1).peekable();
    let mut command_seen = false;
    let seconds = |v: &str| match v.trim().parse::<u64>() {
        Ok(n) if n <= MAX_LOCK_TIMEOUT_S => Ok(n),
        _ => Err(ConfigError::invalid(
            "CRIU's --timeout",
            v,
            format!("a whole number of seconds CRIU can use (at most {MAX_LOCK_TIMEOUT_S})"),
        )),
    };
    while let Some(a) = it.next() {
        if a == "--timeout" {
            parsed.timeout_s = it.peek().map(|v| seconds(v)).transpose()?;
        } else if let Some(v) = a.strip_prefix("--timeout=") {
            parsed.timeout_s = Some(seconds(v)?);
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
    Ok(parsed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    fn parse_criu_args_ok(a: &[String]) -> CriuArgs {
        parse_criu_args(a).unwrap()
    }

    #[test]
    fn settings_parse_alike_and_refuse_what_they_do_not_know() {
        let with = |name: &'static str, v: &str| {
            let v = v.to_string();
            Config::from_sources(move |k| (k == name).then(|| v.clone()), &[], &[])
        };
        for v in ["OFF", "no", "0", "False"] {
            assert!(!with(ENV_RECONCILE, v).unwrap().reconcile, "{v}");
            assert!(!with(settings::MEMORY_CHECK.env, v).unwrap().memory_check, "{v}");
            assert!(!with(ENV_DISABLE, v).unwrap().disabled, "{v}");
        }
        for v in ["yes", "ON", "1", "true"] {
            assert!(with(ENV_RECONCILE, v).unwrap().reconcile, "{v}");
            assert!(with(ENV_DISABLE, v).unwrap().disabled, "{v}");
        }
        for (name, v) in [(ENV_DISABLE, "y"), (ENV_RECONCILE, "sometimes"), (settings::MEMORY_CHECK.env, "2")] {
            let e = with(name, v).unwrap_err().to_string();
            assert!(e.contains(name) && e.contains("`on` or `off`"), "{e}");
        }
        let overflow = Config::from_sources(|_| None, &args("criu dump --timeout 99999999999999999999 -t 1"), &[]);
        assert!(overflow.unwrap_err().to_string().contains("--timeout"));
        assert!(Config::from_sources(|_| None, &args("criu dump --timeout=5000000 -t 1"), &[]).is_err());
        assert_eq!(
            Config::from_sources(|_| None, &args("criu dump --timeout=4294967"), &[]).unwrap().lock_timeout,
            Duration::from_secs(4294967)
        );
        assert_eq!(with(settings::DRIVER_TIMEOUT.env, "7").unwrap().driver_timeout, Some(Duration::from_secs(7)));
        for v in ["0", "-1", "1e3", "86401", "99999999999999999999"] {
            assert!(with(settings::DRIVER_TIMEOUT.env, v).is_err(), "{v}");
        }
    }

    /// The option reader checks a value by the same functions the configuration reads it with: an option is
    /// valid exactly when the same value in the environment is, and their errors expect the same.
    #[test]
    fn an_option_is_valid_exactly_when_the_same_environment_value_is() {
        const A: &str = "GPU-aaaaaaaa-0000-0000-0000-000000000000";
        const B: &str = "GPU-bbbbbbbb-0000-0000-0000-000000000000";
        let map = format!("{A}={B}");
        let values = [
            "auto",
            "0=1",
            "GPU-x=GPU-y",
            &map,
            "all",
            "0,1",
            "x",
            "strict",
            "permissive",
            "loose",
            "on",
            "OFF",
            "1",
            "0",
            "no",
            "maybe",
            "warn",
            "refuse",
            " 90 ",
            "86401",
            "/x.so",
        ];
        for s in settings::ALL {
            for v in values {
                let argv = vec!["criu-plugin".to_string(), format!("--{}={v}", s.option_name())];
                let by_option = ccm_settings::options::parse(&argv);
                let by_env = Config::from_sources(|k| (k == s.env).then(|| v.to_string()), &[], &[]);
                match (&by_option, &by_env) {
                    (Ok(given), Ok(_)) => {
                        assert!(Config::from_sources(|_| None, &[], given).is_ok(), "{}={v}", s.option)
                    }
                    (
                        Err(ccm_settings::options::OptionError::Invalid { expected: o, .. }),
                        Err(ConfigError::Invalid { name, expected: e, .. }),
                    ) => {
                        assert_eq!(name, s.env);
                        assert!(o.starts_with(e.as_str()), "{}={v}: {o} / {e}", s.option);
                    }
                    _ => panic!("{}={v}: option {by_option:?}, environment {by_env:?}", s.option),
                }
            }
        }
        // The environment's map refuses ordinal pairs like the option, named by the variable.
        let e = Config::from_sources(|k| (k == ENV_DEVICE_MAP).then(|| "0=1".to_string()), &[], &[]).unwrap_err();
        assert!(e.to_string().starts_with("CRIU_CUDA_MIGRATE_DEVICE_MAP=\"0=1\"") && e.to_string().contains("ordinal"));
        // And so does the CLI's --device-map, by the same function.
        assert!(parse_device_map("0=1", "--device-map").unwrap_err().to_string().starts_with("--device-map=\"0=1\""));
    }

    #[test]
    fn a_call_deadline_grows_with_device_memory() {
        let c = Config::from_sources(|_| None, &[], &[]).unwrap();
        assert_eq!(c.call_deadline(Some(0)), Duration::from_secs(60));
        assert_eq!(c.call_deadline(Some(8 << 30)), Duration::from_secs(100));
        assert_eq!(c.call_deadline(Some((8 << 30) + 1)), Duration::from_secs(105));
        assert_eq!(c.call_deadline(None), Duration::from_secs(460));
        let fixed =
            Config::from_sources(|k| (k == settings::DRIVER_TIMEOUT.env).then(|| "3".into()), &[], &[]).unwrap();
        assert_eq!(fixed.call_deadline(Some(80 << 30)), Duration::from_secs(3));
    }

    fn parsed(timeout_s: Option<u64>, leave_running: bool, over_rpc: bool) -> CriuArgs {
        CriuArgs { timeout_s, leave_running, over_rpc }
    }

    #[test]
    fn criu_command_lines() {
        assert_eq!(parse_criu_args_ok(&args("criu dump -t 5 -D d --timeout 30 -R")), parsed(Some(30), true, false));
        assert_eq!(parse_criu_args_ok(&args("criu dump --timeout=7 --leave-running")), parsed(Some(7), true, false));
        assert_eq!(parse_criu_args_ok(&args("criu dump -t 5 -D /R")), parsed(None, false, false));
        assert_eq!(parse_criu_args_ok(&args("criu swrk 3")), parsed(None, false, true));
        assert_eq!(
            parse_criu_args_ok(&args("/usr/sbin/criu service --address /run/criu.sock")),
            parsed(None, false, true)
        );
        assert_eq!(parse_criu_args_ok(&args("criu -v4 dump -t 5 -D swrk")), parsed(None, false, false));
        // What /proc/self/cmdline says while CRIU serves runc's or crun's request (measured under runc 1.1).
        let retitled = criu_command_line(b"criu: dump --rpc -t 4242 -D /ckpt\0");
        assert_eq!(retitled, args("criu: dump --rpc -t 4242 -D /ckpt"));
        // The same title padded with empty strings (seen under Podman's runc): still CRIU over RPC.
        let padded = criu_command_line(b"criu: dump --rpc -t 4242 -D /ckpt\0\0\0\0\0");
        assert_eq!(padded, args("criu: dump --rpc -t 4242 -D /ckpt"));
        assert_eq!(parse_criu_args_ok(&padded), parsed(None, false, true));
        assert_eq!(parse_criu_args_ok(&retitled), parsed(None, false, true));
        let restore = criu_command_line(b"criu: restore --rpc -D /ckpt\0");
        assert_eq!(parse_criu_args_ok(&restore), parsed(None, false, true));
        // A command line of several arguments keeps spaces inside them.
        assert_eq!(criu_command_line(b"criu\0dump\0-D\0/a -R b\0"), ["criu", "dump", "-D", "/a -R b"]);
        assert_eq!(parse_criu_args_ok(&criu_command_line(b"criu\0dump\0-D\0/a -R b\0")), parsed(None, false, false));
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
        const A: &str = "GPU-aaaaaaaa-0000-0000-0000-000000000000";
        const B: &str = "GPU-bbbbbbbb-0000-0000-0000-000000000000";
        const C: &str = "GPU-cccccccc-0000-0000-0000-000000000000";
        const D: &str = "GPU-dddddddd-0000-0000-0000-000000000000";
        let opt = |key: &str, value: &str| {
            let argv = vec!["criu-plugin".to_string(), format!("--criu-cuda-migrate.{key}={value}")];
            ccm_settings::options::parse(&argv).unwrap().remove(0)
        };
        let env = |k: &str| match k {
            ENV_DEVICE_MAP => Some(format!("{A}={B}")),
            ENV_MODE => Some("permissive".to_string()),
            _ => None,
        };
        let c = Config::from_sources(env, &[], &[opt("device-map", &format!("{C}={D}"))]).unwrap();
        let map = c.device_map.clone().unwrap();
        assert_eq!(map.value, vec![(C.parse().unwrap(), D.parse().unwrap())]);
        assert_eq!(map.from, "--plugin-option criu-cuda-migrate.device-map", "the value names its source");
        assert_eq!(c.strictness, Strictness::Permissive);
        assert!(c.reconcile);
        assert_eq!(c.lock_timeout, Duration::from_secs(10));
        assert_eq!(
            c.to_string(),
            format!("device map {C}={D}, usable GPUs all, mode permissive, reconcile on, leave-running no, ipc refuse, multi-process check, managed refuse, staging plugin, lock timeout 10 s, libcuda default, NVML default")
        );
        let bad = Config::from_sources(|k| (k == ENV_MODE).then(|| "loose".to_string()), &[], &[]);
        assert!(bad.unwrap_err().to_string().contains("strict"));
        // A bad map names where it came from.
        let e = Config::from_sources(|k| (k == ENV_DEVICE_MAP).then(|| "A=B".to_string()), &[], &[]).unwrap_err();
        assert!(e.to_string().starts_with("CRIU_CUDA_MIGRATE_DEVICE_MAP=\"A=B\""), "{e}");
        // Every setting has its option, `auto` is no map, and a leave-running option beats RPC's unknown.
        let env = |k: &str| match k {
            ENV_DEVICE_MAP => Some(format!("{A}={B}")),
            ENV_LEAVE_RUNNING => Some("0".to_string()),
            _ => None,
        };
        let c = Config::from_sources(
            env,
            &args("criu swrk 3"),
            &[opt("device-map", "auto"), opt("leave-running", "1"), opt("usable-gpus", "1"), opt("libcuda", "/x")],
        )
        .unwrap();
        assert_eq!((c.device_map, c.leave_running), (None, LeaveRunning::Yes));
        assert_eq!(
            c.usable_gpus.map(|u| (u.value.to_string(), u.from)),
            Some(("1".into(), "--plugin-option criu-cuda-migrate.usable-gpus".into()))
        );
        assert_eq!(c.libcuda.as_deref(), Some("/x"));
        assert!(Config::from_sources(|_| None, &[], &[opt("disable", "1")]).unwrap().disabled);
        assert_eq!(Config::from_sources(|_| None, &[], &[]).unwrap().multi_process, MultiProcess::Check);
        assert_eq!(
            Config::from_sources(|_| None, &[], &[opt("multi-process", "refuse")]).unwrap().multi_process,
            MultiProcess::Refuse
        );
        let refuse = |k: &str| (k == settings::MULTI_PROCESS.env).then(|| "refuse".to_string());
        assert_eq!(Config::from_sources(refuse, &[], &[]).unwrap().multi_process, MultiProcess::Refuse);
        assert_eq!(Config::from_sources(|_| None, &[], &[]).unwrap().ipc, IpcImporters::Refuse);
        assert_eq!(Config::from_sources(|_| None, &[], &[opt("ipc", "allow")]).unwrap().ipc, IpcImporters::Allow);
        let allow = |k: &str| (k == settings::IPC.env).then(|| "allow".to_string());
        assert_eq!(Config::from_sources(allow, &[], &[]).unwrap().ipc, IpcImporters::Allow);
        let bad_ipc = |k: &str| (k == settings::IPC.env).then(|| "warn".to_string());
        let e = Config::from_sources(bad_ipc, &[], &[]).unwrap_err().to_string();
        assert!(e.contains("CRIU_CUDA_MIGRATE_IPC") && e.contains("`allow`"), "{e}");
        let bad = |k: &str| (k == settings::MULTI_PROCESS.env).then(|| "sometimes".to_string());
        let e = Config::from_sources(bad, &[], &[]).unwrap_err().to_string();
        assert!(e.contains("CRIU_CUDA_MIGRATE_MULTI_PROCESS") && e.contains("`refuse`"), "{e}");
        assert!(
            !Config::from_sources(|k| (k == ENV_DISABLE).then(|| "1".into()), &[], &[opt("disable", "0")])
                .unwrap()
                .disabled
        );
    }
}
