//! CRIU's plugin options: `criu --plugin-option criu-cuda-migrate.KEY[=VALUE]` (CRIU PR #3138, in criu-dev
//! since 2026-09; not in CRIU 4.1.1 or 4.2.1). Over RPC the request's `plugin_options` field carries them, and
//! libcriu's `criu_add_plugin_option()` sets it.
//!
//! A CRIU that has them hands every plugin the same array through `criu_plugin_get_options(&argc, &argv)`: a
//! synthetic `argv[0]`, then each option as given, prefixed with `--` (`--criu-cuda-migrate.mode=permissive`),
//! in the order CRIU read them (configuration files first, then the command line or the RPC request). This
//! module reads that array, pure: which options are ours, which setting each one sets, and whether its value
//! is valid (by [`crate::value`], the syntax the configuration reads it with, so a bad option fails early and
//! named as given). The last one given for a setting wins; an option overrides the setting's environment variable.
//!
//! Besides our own names, the device map is also accepted under the names of CRIU's own CUDA plugin (CRIU PR
//! #3076): `cuda_plugin.device-map` and the earlier `cuda.device-map`. Its other options (`cuda_plugin.backend`,
//! `cuda_plugin.timeout`) are that plugin's and are left alone. Of its map forms, `auto` is accepted (it means
//! what no map means here: the automatic map) and UUID pairs are the same; ordinal pairs (`0=1`) are refused with
//! what to write instead, because an ordinal names a GPU only relative to one node's enumeration.

use crate::{self as settings, value, Setting, OPTION_PREFIX};

/// Names under which CRIU's own CUDA plugin (CRIU PR #3076) takes its device map, accepted as ours.
pub const CUDA_PLUGIN_DEVICE_MAP: [&str; 2] = ["cuda_plugin.device-map", "cuda.device-map"];

/// One option of ours, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GivenOption {
    pub setting: Setting,
    /// The value as given, trimmed and checked by the function the configuration reads it with
    /// ([`crate::value`]); a bare flag becomes `1`.
    pub value: String,
    /// The name it was given under, without `--` (`criu-cuda-migrate.mode`, `cuda_plugin.device-map`).
    pub given_as: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OptionError {
    #[error("--plugin-option {name}: criu-cuda-migrate has no option `{key}`; its options are {known}")]
    Unknown { name: String, key: String, known: String },
    #[error("--plugin-option {name} needs a value: write {name}={expected}")]
    NeedsValue { name: String, expected: &'static str },
    #[error("--plugin-option {name}={value:?} is not valid: expected {expected}")]
    Invalid { name: String, value: String, expected: String },
}

/// Which setting a name (without `--`) sets, or `None` for another plugin's option.
fn setting_of(name: &str) -> Option<Result<Setting, OptionError>> {
    if CUDA_PLUGIN_DEVICE_MAP.contains(&name) {
        return Some(Ok(settings::DEVICE_MAP));
    }
    let key = name.strip_prefix(OPTION_PREFIX)?;
    Some(settings::ALL.iter().copied().find(|s| s.option == key).ok_or_else(|| OptionError::Unknown {
        name: name.to_string(),
        key: key.to_string(),
        known: settings::ALL.iter().map(|s| s.option_name()).collect::<Vec<_>>().join(", "),
    }))
}

/// Checks one value by its setting's syntax ([`crate::value`], the functions the configuration reads it with),
/// and gives it trimmed (a bare flag becomes `1`).
fn checked(setting: Setting, name: &str, value: Option<&str>) -> Result<String, OptionError> {
    // The switches a bare name turns on.
    let flag = setting == settings::LEAVE_RUNNING || setting == settings::DISABLE;
    let Some(value) = value else {
        if flag {
            return Ok("1".to_string());
        }
        let expected = match setting {
            s if s == settings::DEVICE_MAP => "GPU-<uuid>=GPU-<uuid>[,...] or auto",
            s if s == settings::USABLE_GPUS => "UUIDs or NVML indices, comma-separated, or all",
            s if s == settings::MODE => "strict or permissive",
            s if s == settings::MULTI_PROCESS => "warn or refuse",
            s if s == settings::IPC => "refuse or allow",
            s if s == settings::MANAGED => "refuse or try",
            s if s == settings::RECONCILE || s == settings::MEMORY_CHECK => "on or off",
            s if s == settings::DRIVER_TIMEOUT => "a number of seconds",
            s if s == settings::STAGING => "plugin or criu",
            s if s == settings::STAGING_THREADS => "a number of threads",
            _ => "a path",
        };
        return Err(OptionError::NeedsValue { name: name.to_string(), expected });
    };
    let valid = match setting {
        s if s == settings::DEVICE_MAP => value::parse_device_map(value).map(drop),
        s if s == settings::USABLE_GPUS => value::parse_usable_gpus(value).map(drop),
        s if s == settings::MODE => value::parse_mode(value).map(drop),
        s if s == settings::MULTI_PROCESS => value::parse_multi_process(value).map(drop),
        s if s == settings::IPC => value::parse_ipc(value).map(drop),
        s if s == settings::MANAGED => value::parse_managed(value).map(drop),
        s if s == settings::DRIVER_TIMEOUT => value::parse_timeout(value).map(drop),
        s if s == settings::STAGING => value::parse_staging(value).map(drop),
        s if s == settings::STAGING_THREADS => value::parse_threads(value).map(drop),
        s if s == settings::LEAVE_RUNNING => value::parse_leave_running(value).map(drop),
        s if s == settings::DISABLE || s == settings::RECONCILE || s == settings::MEMORY_CHECK => {
            value::parse_switch(value).map(drop)
        }
        _ => value::parse_path(value).map(drop),
    };
    valid.map(|()| value.trim().to_string()).map_err(|e| OptionError::Invalid {
        name: name.to_string(),
        value: value.to_string(),
        expected: if flag { format!("{}, or the bare name for 1", e.expected) } else { e.expected },
    })
}

/// Our options out of the array `criu_plugin_get_options` gives (the synthetic `argv[0]` first), in the order
/// given; other plugins' options are skipped. The first bad option of ours is an error.
pub fn parse(argv: &[String]) -> Result<Vec<GivenOption>, OptionError> {
    let mut out = Vec::new();
    for arg in argv {
        // argv[0] ("criu-plugin") is skipped with anything else CRIU did not write as an option (it prefixes
        // every option with `--`).
        let Some(body) = arg.strip_prefix("--") else { continue };
        let (name, value) = match body.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (body, None),
        };
        let Some(setting) = setting_of(name) else { continue };
        let setting = setting?;
        out.push(GivenOption { setting, value: checked(setting, name, value)?, given_as: name.to_string() });
    }
    Ok(out)
}

/// `(KEY, VALUE)` pairs, as `Config::from_sources` of the engine takes them.
pub fn as_pairs(given: &[GivenOption]) -> Vec<(String, String)> {
    given.iter().map(|g| (g.setting.option.to_string(), g.value.clone())).collect()
}

/// Where each setting came from, for the `settings:` log line: `sources: mode from --plugin-option
/// criu-cuda-migrate.mode, device-map from CRIU_CUDA_MIGRATE_DEVICE_MAP, the rest defaults; plugin options not
/// offered by this CRIU`. `given` is `None` when the running CRIU has no `criu_plugin_get_options`.
pub fn sources(given: Option<&[GivenOption]>, env: impl Fn(&str) -> Option<String>) -> String {
    let mut from = Vec::new();
    for s in settings::ALL {
        if let Some(g) = given.and_then(|g| g.iter().rev().find(|g| g.setting == s)) {
            from.push(format!("{} from --plugin-option {}", s.option, g.given_as));
        } else if env(s.env).is_some_and(|v| !v.trim().is_empty()) {
            from.push(format!("{} from {}", s.option, s.env));
        }
    }
    let settings = if from.is_empty() {
        "all defaults".to_string()
    } else if from.len() == settings::ALL.len() {
        from.join(", ")
    } else {
        format!("{}, the rest defaults", from.join(", "))
    };
    let offered = match given {
        None => "plugin options not offered by this CRIU (no criu_plugin_get_options: CRIU 4.2 and older)",
        Some([]) => "no plugin option of ours given",
        Some(_) => "plugin options read",
    };
    format!("sources: {settings}; {offered}")
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "GPU-aaaaaaaa-0000-0000-0000-000000000000";
    const B: &str = "GPU-bbbbbbbb-0000-0000-0000-000000000000";

    fn argv(options: &[&str]) -> Vec<String> {
        std::iter::once("criu-plugin").chain(options.iter().copied()).map(String::from).collect()
    }

    fn pairs(options: &[&str]) -> Result<Vec<(String, String)>, OptionError> {
        parse(&argv(options)).map(|g| as_pairs(&g))
    }

    fn p(k: &str, v: &str) -> (String, String) {
        (k.to_string(), v.to_string())
    }

    #[test]
    fn every_setting_has_an_option_and_the_values_are_trimmed() {
        // One option per setting, each with a value of its kind.
        let given: Vec<String> = settings::ALL
            .iter()
            .map(|s| {
                let value = match s.option {
                    "device-map" => format!("={A}={B}"),
                    "usable-gpus" => "=0,1".to_string(),
                    "mode" => "=permissive".to_string(),
                    "leave-running" => String::new(),
                    "disable" => "=no".to_string(),
                    "multi-process" => "= refuse".to_string(),
                    "ipc" => "=allow ".to_string(),
                    "managed" => "= try".to_string(),
                    "driver-timeout" => "= 90 ".to_string(),
                    "staging" => "= criu ".to_string(),
                    "staging-threads" => "= 4".to_string(),
                    "reconcile" | "memory-check" => "=0".to_string(),
                    _ => format!("= /opt/nv/{}.so.1 ", s.option),
                };
                format!("--{}{value}", s.option_name())
            })
            .collect();
        let given: Vec<&str> = given.iter().map(String::as_str).collect();
        let got = pairs(&given).unwrap();
        assert_eq!(got.len(), settings::ALL.len());
        for (key, value) in &got {
            let expected = match key.as_str() {
                "device-map" => format!("{A}={B}"),
                "usable-gpus" => "0,1".to_string(),
                "mode" => "permissive".to_string(),
                "leave-running" => "1".to_string(),
                "disable" => "no".to_string(),
                "multi-process" => "refuse".to_string(),
                "ipc" => "allow".to_string(),
                "managed" => "try".to_string(),
                "reconcile" | "memory-check" => "0".to_string(),
                "driver-timeout" => "90".to_string(),
                "staging" => "criu".to_string(),
                "staging-threads" => "4".to_string(),
                other => format!("/opt/nv/{other}.so.1"),
            };
            assert_eq!(value, &expected, "{key}");
        }
        assert_eq!(pairs(&["--criu-cuda-migrate.reconcile=on"]).unwrap(), [p("reconcile", "on")]);
    }

    /// The user guide states the rule instead of a second table: the option of `CRIU_CUDA_MIGRATE_FOO_BAR` is
    /// `criu-cuda-migrate.foo-bar`.
    #[test]
    fn each_option_is_its_variable_name_lowercased_with_dashes() {
        for s in settings::ALL {
            let from_env = s.env.trim_start_matches("CRIU_CUDA_MIGRATE_").to_ascii_lowercase().replace('_', "-");
            assert_eq!(s.option, from_env, "{}", s.env);
        }
    }

    #[test]
    fn other_plugins_options_are_left_alone_and_order_is_kept() {
        let got = pairs(&[
            "--amdgpu.something=1",
            "--cuda_plugin.backend=driver-api",
            "--cuda_plugin.timeout=30",
            "--example.flag",
            "--criu-cuda-migrate.mode=strict",
            "--criu-cuda-migrate.mode=permissive",
        ])
        .unwrap();
        assert_eq!(got, [p("mode", "strict"), p("mode", "permissive")]);
        assert_eq!(pairs(&[]).unwrap(), []);
        assert_eq!(parse(&[]).unwrap(), []);
    }

    #[test]
    fn criu_cuda_plugin_device_map_names_and_forms() {
        for name in CUDA_PLUGIN_DEVICE_MAP {
            let given = parse(&argv(&[&format!("--{name}={A}={B}")])).unwrap();
            assert_eq!(given[0].setting, settings::DEVICE_MAP);
            assert_eq!(given[0].value, format!("{A}={B}"));
            assert_eq!(given[0].given_as, name);
        }
        // `auto` is the automatic map, which is what no map means (the configuration reads it so, and it overrides
        // the environment's map).
        assert_eq!(pairs(&["--cuda_plugin.device-map=auto"]).unwrap(), [p("device-map", "auto")]);
        assert_eq!(pairs(&["--criu-cuda-migrate.device-map=AUTO"]).unwrap(), [p("device-map", "AUTO")]);
        assert_eq!(pairs(&["--criu-cuda-migrate.device-map="]).unwrap(), [p("device-map", "")]);
        let ordinal = pairs(&["--cuda_plugin.device-map=0=1,1=0"]).unwrap_err().to_string();
        assert!(ordinal.contains("cuda_plugin.device-map") && ordinal.contains("nvidia-smi -L"), "{ordinal}");
        let mixed = pairs(&[&format!("--cuda_plugin.device-map={A}=1")]).unwrap_err().to_string();
        assert!(mixed.contains("ordinal"), "{mixed}");
        let bad = pairs(&["--criu-cuda-migrate.device-map=GPU-x=GPU-y"]).unwrap_err().to_string();
        assert!(bad.contains("criu-cuda-migrate.device-map") && bad.contains("GPU-<uuid>=GPU-<uuid>"), "{bad}");
    }

    #[test]
    fn bad_options_of_ours_are_errors_that_name_the_fix() {
        let unknown = pairs(&["--criu-cuda-migrate.devicemap=x"]).unwrap_err().to_string();
        assert!(unknown.contains("`devicemap`") && unknown.contains("criu-cuda-migrate.device-map"), "{unknown}");
        let mode = pairs(&["--criu-cuda-migrate.mode=loose"]).unwrap_err().to_string();
        assert!(mode.contains("strict or permissive"), "{mode}");
        let bare = pairs(&["--criu-cuda-migrate.mode"]).unwrap_err().to_string();
        assert!(bare.contains("criu-cuda-migrate.mode=strict or permissive"), "{bare}");
        let map = pairs(&["--cuda_plugin.device-map"]).unwrap_err().to_string();
        assert!(map.contains("needs a value"), "{map}");
        let flag = pairs(&["--criu-cuda-migrate.leave-running=sometimes"]).unwrap_err().to_string();
        assert!(flag.contains("or the bare name"), "{flag}");
        let reconcile = pairs(&["--criu-cuda-migrate.reconcile=maybe"]).unwrap_err();
        assert!(matches!(reconcile, OptionError::Invalid { .. }));
        let empty = pairs(&["--criu-cuda-migrate.libcuda="]).unwrap_err().to_string();
        assert!(empty.contains("non-empty"), "{empty}");
        // Every value is checked here by the syntax the configuration reads it with.
        let timeout = pairs(&["--criu-cuda-migrate.driver-timeout=86401"]).unwrap_err().to_string();
        assert!(timeout.contains("from 1 to 86400"), "{timeout}");
        let usable = pairs(&["--criu-cuda-migrate.usable-gpus=x"]).unwrap_err().to_string();
        assert!(usable.contains("criu-cuda-migrate.usable-gpus") && usable.contains("nvidia-smi -L"), "{usable}");
        let multi = pairs(&["--criu-cuda-migrate.multi-process=sometimes"]).unwrap_err().to_string();
        assert!(multi.contains("`refuse`"), "{multi}");
        let bare = pairs(&["--criu-cuda-migrate.multi-process"]).unwrap_err().to_string();
        assert!(bare.contains("criu-cuda-migrate.multi-process=warn or refuse"), "{bare}");
    }

    #[test]
    fn sources_say_where_each_value_came_from() {
        let env = |k: &str| match k {
            "CRIU_CUDA_MIGRATE_DEVICE_MAP" => Some(format!("{A}={B}")),
            "CRIU_CUDA_MIGRATE_MODE" => Some("permissive".to_string()),
            "CRIU_CUDA_MIGRATE_USABLE_GPUS" => Some(" ".to_string()),
            _ => None,
        };
        let given = parse(&argv(&["--cuda_plugin.device-map=auto", "--criu-cuda-migrate.reconcile=off"])).unwrap();
        assert_eq!(
            sources(Some(&given), env),
            "sources: device-map from --plugin-option cuda_plugin.device-map, mode from CRIU_CUDA_MIGRATE_MODE, \
             reconcile from --plugin-option criu-cuda-migrate.reconcile, the rest defaults; plugin options read"
        );
        assert_eq!(
            sources(None, env),
            "sources: device-map from CRIU_CUDA_MIGRATE_DEVICE_MAP, mode from CRIU_CUDA_MIGRATE_MODE, the rest \
             defaults; plugin options not offered by this CRIU (no criu_plugin_get_options: CRIU 4.2 and older)"
        );
        assert_eq!(sources(Some(&[]), |_| None), "sources: all defaults; no plugin option of ours given");
    }
}
