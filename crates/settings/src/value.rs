//! The syntax of each setting's value, once: one function per kind of value reads its text into its type. The
//! plugin-option reader ([`crate::options`]) calls them for its early error, named by the option; the engine's
//! configuration calls them for the value it uses, named by the environment variable or the option it came from.
//! An error says only what was expected; whoever read the value adds its name.
//!
//! What an unset or empty value means is the caller's: an empty environment variable is no setting; an option
//! of ours always has a value (the device map's empty value is `auto`).

use std::time::Duration;

use ccm_identity::map::{self, UsableGpus};
use ccm_identity::GpuUuid;

/// Why a value is not valid: what was expected instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("expected {expected}")]
pub struct ValueError {
    pub expected: String,
}

fn expected(text: impl Into<String>) -> ValueError {
    ValueError { expected: text.into() }
}

/// A device map setting (`CRIU_CUDA_MIGRATE_DEVICE_MAP`, `criu-cuda-migrate.device-map`, CRIU cuda_plugin's
/// names, the CLI's `--device-map`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceMapSetting {
    /// `auto` or nothing: the automatic map.
    Auto,
    /// Explicit (dump GPU, restore GPU) pairs.
    Pairs(Vec<(GpuUuid, GpuUuid)>),
}

/// `GPU-<uuid>=GPU-<uuid>[,...]`, or `auto` (any case) or nothing for the automatic map. Ordinal pairs (`0=1`,
/// CRIU cuda_plugin's other form) are refused with what to write instead: an ordinal names a GPU only within one
/// node's enumeration.
pub fn parse_device_map(text: &str) -> Result<DeviceMapSetting, ValueError> {
    let t = text.trim();
    if t.is_empty() || t.eq_ignore_ascii_case("auto") {
        return Ok(DeviceMapSetting::Auto);
    }
    let ordinal = |side: &str| !side.trim().is_empty() && side.trim().bytes().all(|b| b.is_ascii_digit());
    if t.split(',')
        .filter(|i| !i.trim().is_empty())
        .any(|item| item.split_once('=').is_some_and(|(old, new)| ordinal(old) || ordinal(new)))
    {
        return Err(expected(
            "GPU UUID pairs GPU-<uuid>=GPU-<uuid>[,...] (UUIDs from `nvidia-smi -L` on this node and \
             `criu-cuda-migrate inspect` of the images), or auto; ordinal pairs such as 0=1 (CRIU cuda_plugin's \
             form) are not taken, since an ordinal names a GPU only within one node's enumeration",
        ));
    }
    map::parse_pairs(t)
        .map(DeviceMapSetting::Pairs)
        .map_err(|e| expected(format!("GPU-<uuid>=GPU-<uuid>[,...] or auto ({e})")))
}

/// `all`, or GPU UUIDs and NVML indices, comma-separated ([`UsableGpus`]'s syntax; the node resolves them later).
pub fn parse_usable_gpus(text: &str) -> Result<UsableGpus, ValueError> {
    text.parse::<UsableGpus>().map_err(|e| {
        expected(format!("GPU UUIDs or NVML indices from `nvidia-smi -L`, comma-separated, or `all`: {e}"))
    })
}

/// What to do when the restored identity cannot be made consistent (`CRIU_CUDA_MIGRATE_MODE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strictness {
    /// Kill the restored tree (images stay intact for a retry).
    Strict,
    /// Log an error and let the process run.
    Permissive,
}

/// `strict` or `permissive`.
pub fn parse_mode(text: &str) -> Result<Strictness, ValueError> {
    match text.trim() {
        "strict" => Ok(Strictness::Strict),
        "permissive" => Ok(Strictness::Permissive),
        _ => Err(expected("strict or permissive")),
    }
}

/// The forms every on/off setting reads.
pub const SWITCH_FORMS: &str = "`on` or `off` (also `1`/`0`, `yes`/`no`, `true`/`false`)";

/// The one reading of an on/off setting, for every switch: `1`, `yes`, `true`, `on` and `0`, `no`, `false`,
/// `off`, in any case.
pub fn parse_switch(text: &str) -> Result<bool, ValueError> {
    match text.trim().to_ascii_lowercase().as_str() {
        "1" | "yes" | "true" | "on" => Ok(true),
        "0" | "no" | "false" | "off" => Ok(false),
        _ => Err(expected(SWITCH_FORMS)),
    }
}

/// `CRIU_CUDA_MIGRATE_LEAVE_RUNNING`: a switch, whose error says what each side means for a dump.
pub fn parse_leave_running(text: &str) -> Result<bool, ValueError> {
    parse_switch(text).map_err(|_| {
        expected("`1` (the dump leaves the processes running) or `0` (it ends them); also yes/no, true/false, on/off")
    })
}

/// What a dump does with a CUDA IPC importer (`CRIU_CUDA_MIGRATE_IPC`): a process that has another process's
/// device memory open (`cudaIpcOpenMemHandle`, `cuMemImportFromShareableHandle`), which the kernel driver's resource
/// manager reports as memory it dup'd. Driver 580 checkpoints such a process but cannot restore it, in place or
/// anywhere else (measured: docs/GPU-TESTING.md), so its dump loses the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpcImporters {
    /// Refuse the dump before any checkpoint, every process unlocked and running on (the default).
    Refuse,
    /// Dump it anyway, with a warning that its restore will fail (for a driver that can restore importers).
    Allow,
}

/// `refuse` or `allow`.
pub fn parse_ipc(text: &str) -> Result<IpcImporters, ValueError> {
    match text.trim() {
        "refuse" => Ok(IpcImporters::Refuse),
        "allow" => Ok(IpcImporters::Allow),
        _ => Err(expected(
            "`refuse` (fail a dump holding a CUDA IPC importer before any checkpoint) or `allow` (dump it anyway; \
             driver 580 cannot restore it)",
        )),
    }
}

/// What a dump of a CUDA process with managed memory does (`CRIU_CUDA_MIGRATE_MANAGED`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ManagedMemory {
    /// Refuse before any lock (the default: driver 580's checkpoint answers CUDA_ERROR_NOT_SUPPORTED anyway).
    Refuse,
    /// Lock and let the driver decide (for a driver that checkpoints managed memory, or a mapping the check
    /// takes for managed memory wrongly).
    Try,
}

/// `refuse` or `try`.
pub fn parse_managed(text: &str) -> Result<ManagedMemory, ValueError> {
    match text.trim() {
        "refuse" => Ok(ManagedMemory::Refuse),
        "try" => Ok(ManagedMemory::Try),
        _ => Err(expected(
            "`refuse` (the default: a CUDA process with managed memory is refused before any lock) or `try` (lock it \
             and let the driver decide)",
        )),
    }
}

/// Who writes the driver's staging pages at dump (`CRIU_CUDA_MIGRATE_STAGING`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Staging {
    /// The plugin, into its page file, in parallel (the default where the staging mappings are found exactly).
    Plugin,
    /// CRIU's page walk, with the rest of the process's memory.
    Criu,
}

/// `plugin` or `criu`.
pub fn parse_staging(text: &str) -> Result<Staging, ValueError> {
    match text.trim() {
        "plugin" => Ok(Staging::Plugin),
        "criu" => Ok(Staging::Criu),
        _ => Err(expected(
            "`plugin` (the default: the plugin writes the driver's staging pages into its page file, in parallel) or \
             `criu` (CRIU writes them with the rest of the process's memory)",
        )),
    }
}

/// A number of threads, 1 to 256.
pub fn parse_threads(text: &str) -> Result<usize, ValueError> {
    match text.trim().parse::<usize>() {
        Ok(n) if (1..=256).contains(&n) => Ok(n),
        _ => Err(expected("a number of threads from 1 to 256")),
    }
}

/// What a dump of more than one CUDA process does (`CRIU_CUDA_MIGRATE_MULTI_PROCESS`), whatever the importer check
/// ([`IpcImporters`]) finds: for those who want every multi-process dump refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MultiProcess {
    /// Dump them when the importer check ran and found no importer; refuse them before any checkpoint when it
    /// cannot run (the default: such trees lose their job when one of them imports another's memory).
    Check,
    /// Dump them even when the importer check cannot run, with a warning naming why.
    Warn,
    /// Refuse before any checkpoint: every process is unlocked and runs on.
    Refuse,
}

/// `check`, `warn` or `refuse`.
pub fn parse_multi_process(text: &str) -> Result<MultiProcess, ValueError> {
    match text.trim() {
        "check" => Ok(MultiProcess::Check),
        "warn" => Ok(MultiProcess::Warn),
        "refuse" => Ok(MultiProcess::Refuse),
        _ => Err(expected(
            "`check` (the default: dump several CUDA processes when the importer check clears them, refuse them when \
             it cannot run), `warn` (dump them, with a warning when the importer check cannot run) or `refuse` (fail \
             every such dump before any checkpoint)",
        )),
    }
}

/// Longest `CRIU_CUDA_MIGRATE_DRIVER_TIMEOUT`: a day.
pub const MAX_DRIVER_TIMEOUT_S: u64 = 86_400;

/// `CRIU_CUDA_MIGRATE_DRIVER_TIMEOUT`: a whole number of seconds from 1 to [`MAX_DRIVER_TIMEOUT_S`].
pub fn parse_timeout(text: &str) -> Result<Duration, ValueError> {
    match text.trim().parse::<u64>() {
        Ok(n) if (1..=MAX_DRIVER_TIMEOUT_S).contains(&n) => Ok(Duration::from_secs(n)),
        _ => Err(expected(format!("a whole number of seconds from 1 to {MAX_DRIVER_TIMEOUT_S}"))),
    }
}

/// A library path (`CRIU_CUDA_MIGRATE_LIBCUDA`, `_LIBNVML`): any non-empty text, trimmed.
pub fn parse_path(text: &str) -> Result<String, ValueError> {
    match text.trim() {
        "" => Err(expected("a non-empty value")),
        t => Ok(t.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "GPU-aaaaaaaa-0000-0000-0000-000000000000";
    const B: &str = "GPU-bbbbbbbb-0000-0000-0000-000000000000";

    #[test]
    fn device_maps() {
        for auto in ["", " ", "auto", "AUTO"] {
            assert_eq!(parse_device_map(auto), Ok(DeviceMapSetting::Auto), "{auto:?}");
        }
        assert_eq!(
            parse_device_map(&format!(" {A}={B} ")),
            Ok(DeviceMapSetting::Pairs(vec![(A.parse().unwrap(), B.parse().unwrap())]))
        );
        for ordinal in ["0=1,1=0", &format!("{A}=1")] {
            let e = parse_device_map(ordinal).unwrap_err().to_string();
            assert!(e.contains("ordinal") && e.contains("nvidia-smi -L"), "{e}");
        }
        let e = parse_device_map("GPU-x=GPU-y").unwrap_err().to_string();
        assert!(e.starts_with("expected GPU-<uuid>=GPU-<uuid>[,...] or auto ("), "{e}");
    }

    #[test]
    fn switches_modes_and_numbers() {
        for v in ["1", "yes", "TRUE", " on "] {
            assert_eq!(parse_switch(v), Ok(true), "{v}");
            assert_eq!(parse_leave_running(v), Ok(true), "{v}");
        }
        for v in ["0", "No", "false", "OFF"] {
            assert_eq!(parse_switch(v), Ok(false), "{v}");
        }
        for v in ["", "y", "2", "sometimes"] {
            assert!(parse_switch(v).unwrap_err().expected.contains("`on` or `off`"), "{v}");
            assert!(parse_leave_running(v).unwrap_err().expected.contains("`0`"), "{v}");
        }
        assert_eq!(parse_mode(" permissive"), Ok(Strictness::Permissive));
        assert_eq!(parse_mode("loose").unwrap_err().expected, "strict or permissive");
        assert!(parse_mode("").is_err() && parse_mode("Strict").is_err());
        assert_eq!(parse_multi_process("refuse"), Ok(MultiProcess::Refuse));
        assert_eq!(parse_staging(" criu "), Ok(Staging::Criu));
        assert!(parse_staging("gpu").unwrap_err().expected.contains("`plugin`"));
        assert_eq!(parse_threads("16"), Ok(16));
        assert!(parse_threads("0").is_err() && parse_threads("999").is_err());
        assert_eq!(parse_ipc(" refuse"), Ok(IpcImporters::Refuse));
        assert_eq!(parse_ipc("allow"), Ok(IpcImporters::Allow));
        assert!(parse_ipc("warn").unwrap_err().expected.contains("`allow`"));
        assert_eq!(parse_managed(" try "), Ok(ManagedMemory::Try));
        assert_eq!(parse_managed("refuse"), Ok(ManagedMemory::Refuse));
        assert!(parse_managed("allow").unwrap_err().expected.contains("`try`"));
        assert!(parse_multi_process("sometimes").unwrap_err().expected.contains("`refuse`"));
        assert_eq!(parse_timeout(" 90 "), Ok(Duration::from_secs(90)));
        assert_eq!(parse_timeout("86400"), Ok(Duration::from_secs(86_400)));
        for v in ["", "0", "-1", "1e3", "86401", "99999999999999999999"] {
            assert!(parse_timeout(v).is_err(), "{v}");
        }
        assert_eq!(parse_path(" /x.so "), Ok("/x.so".to_string()));
        assert!(parse_path(" ").is_err());
        assert_eq!(parse_usable_gpus("0, 1").map(|u| u.to_string()), Ok("0,1".to_string()));
        assert!(parse_usable_gpus("x").unwrap_err().expected.contains("nvidia-smi -L"));
    }
}
