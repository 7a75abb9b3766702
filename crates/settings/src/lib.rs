//! What criu-cuda-migrate is told, read without I/O: every setting of the plugin, once (its environment
//! variable, its plugin-option key, when it applies, its default and what it does: this file); the syntax of
//! their values, each read by one function into its type ([`value`]); CRIU's plugin options ([`options`]); and
//! the GPUs a container runtime's OCI spec gives a restored container ([`spec`]), the restore's other
//! source of its usable GPUs. The configuration reader, the `settings:` log line, the driver's library paths,
//! error messages and the documentation tables all take the names from here (a test holds the user guide's and
//! the architecture's tables to this list).

#![forbid(unsafe_code)]

pub mod options;
pub mod spec;
pub mod value;

/// One setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setting {
    /// The environment variable of `criu` (the product's interface for every caller).
    pub env: &'static str,
    /// The key after `criu-cuda-migrate.` in `--plugin-option` (CRIU with `criu_plugin_get_options`).
    pub option: &'static str,
    /// `dump`, `restore` or `both`.
    pub at: &'static str,
    /// What applies when it is unset.
    pub default: &'static str,
    pub help: &'static str,
}

/// The `--plugin-option` namespace (`criu-cuda-migrate.device-map=...`).
pub const OPTION_PREFIX: &str = "criu-cuda-migrate.";

pub const DEVICE_MAP: Setting = Setting {
    env: "CRIU_CUDA_MIGRATE_DEVICE_MAP",
    option: "device-map",
    at: "restore",
    default: "automatic",
    help: "explicit map OLD=NEW[,OLD=NEW...] of GPU UUIDs",
};

pub const USABLE_GPUS: Setting = Setting {
    env: "CRIU_CUDA_MIGRATE_USABLE_GPUS",
    option: "usable-gpus",
    at: "restore",
    default: "the GPUs the restoring runtime's spec gives the container, else all",
    help: "GPUs the restore may use: UUIDs or NVML indices, comma-separated",
};

pub const MODE: Setting = Setting {
    env: "CRIU_CUDA_MIGRATE_MODE",
    option: "mode",
    at: "restore",
    default: "strict",
    help: "strict: a failed identity check kills the restored tree; permissive: log it and let it run",
};

pub const RECONCILE: Setting = Setting {
    env: "CRIU_CUDA_MIGRATE_RECONCILE",
    option: "reconcile",
    at: "restore",
    default: "on",
    help: "off: restore without rewriting the stale identity (reproduces the bug; diagnosis only)",
};

pub const MEMORY_CHECK: Setting = Setting {
    env: "CRIU_CUDA_MIGRATE_MEMORY_CHECK",
    option: "memory-check",
    at: "restore",
    default: "on",
    help: "off: skip the preflight's check of each target GPU's free memory against what the dump recorded",
};

pub const LEAVE_RUNNING: Setting = Setting {
    env: "CRIU_CUDA_MIGRATE_LEAVE_RUNNING",
    option: "leave-running",
    at: "dump",
    default: "read from CRIU's command line; unknown over RPC",
    help: "1: the dump leaves the tree running; 0: the dump ends it",
};

pub const IPC: Setting = Setting {
    env: "CRIU_CUDA_MIGRATE_IPC",
    option: "ipc",
    at: "dump",
    default: "refuse",
    help: "refuse: a dump whose tree holds a CUDA IPC importer (a process with another process's device memory open, as the kernel driver's resource manager reports it) fails before any checkpoint, every process running on, because driver 580 cannot restore such a process; allow: dump it anyway (its restore will fail)",
};

pub const MULTI_PROCESS: Setting = Setting {
    env: "CRIU_CUDA_MIGRATE_MULTI_PROCESS",
    option: "multi-process",
    at: "dump",
    default: "check",
    help: "check: dump several CUDA processes when the importer check clears them, and refuse them before any checkpoint when it cannot run (no /dev/nvidiactl, another driver, no answer); warn: dump them even then, with a warning; refuse: every dump of more than one CUDA process fails before any checkpoint, every process running on, whatever the importer check says",
};

pub const MANAGED: Setting = Setting {
    env: "CRIU_CUDA_MIGRATE_MANAGED",
    option: "managed",
    at: "dump",
    default: "refuse",
    help: "refuse: a dump whose CUDA process maps managed memory (cudaMallocManaged: /dev/nvidia-uvm mappings beyond the driver's own) fails before any lock, every process running on, because driver 580's checkpoint does not support managed memory; try: lock and let the driver decide (it answers CUDA_ERROR_NOT_SUPPORTED, and the plugin unlocks the tree again)",
};

pub const STAGING: Setting = Setting {
    env: "CRIU_CUDA_MIGRATE_STAGING",
    option: "staging",
    at: "dump",
    default: "plugin",
    help: "plugin: the driver's staging pages (the device memory's copy in the process after its checkpoint) are written by the plugin into its page file, in parallel, all-zero chunks left out, and released in the task so that CRIU writes none of them; restored from it, every chunk checked, before the driver's restore (a process whose staging mappings cannot be told exactly is left to CRIU, one line saying why); criu: CRIU writes them with the rest of the process's memory",
};

pub const STAGING_THREADS: Setting = Setting {
    env: "CRIU_CUDA_MIGRATE_STAGING_THREADS",
    option: "staging-threads",
    at: "both",
    default: "the CPUs CRIU may use, at most 16",
    help: "how many threads copy the staging pages to and from the page files (each holds one 8 MiB buffer)",
};

pub const DRIVER_TIMEOUT: Setting = Setting {
    env: "CRIU_CUDA_MIGRATE_DRIVER_TIMEOUT",
    option: "driver-timeout",
    at: "both",
    default: "60 s + 5 s per GiB of the process's device memory",
    help: "seconds one checkpoint or restore call may take before the driver agent is given up on (killed, and what it did put back)",
};

pub const DISABLE: Setting = Setting {
    env: "CRIU_CUDA_MIGRATE_DISABLE",
    option: "disable",
    at: "both",
    default: "0",
    help: "1: the plugin stays out of everything",
};

pub const LIBCUDA: Setting = Setting {
    env: "CRIU_CUDA_MIGRATE_LIBCUDA",
    option: "libcuda",
    at: "both",
    default: "libcuda.so.1 (the dynamic loader's search)",
    help: "path of the driver's libcuda.so.1 to load",
};

pub const LIBNVML: Setting = Setting {
    env: "CRIU_CUDA_MIGRATE_LIBNVML",
    option: "libnvml",
    at: "both",
    default: "libnvidia-ml.so.1 (the dynamic loader's search)",
    help: "path of the driver's libnvidia-ml.so.1 to load",
};

/// All of them, in the order of the documentation tables.
pub const ALL: [Setting; 15] = [
    DEVICE_MAP,
    USABLE_GPUS,
    MODE,
    RECONCILE,
    MEMORY_CHECK,
    LEAVE_RUNNING,
    IPC,
    MULTI_PROCESS,
    MANAGED,
    STAGING,
    STAGING_THREADS,
    DRIVER_TIMEOUT,
    DISABLE,
    LIBCUDA,
    LIBNVML,
];

impl Setting {
    /// `criu-cuda-migrate.KEY`.
    pub fn option_name(&self) -> String {
        format!("{OPTION_PREFIX}{}", self.option)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_prefixed() {
        for (i, a) in ALL.iter().enumerate() {
            assert!(a.env.starts_with("CRIU_CUDA_MIGRATE_"), "{}", a.env);
            for b in &ALL[i + 1..] {
                assert_ne!(a.env, b.env);
                assert_ne!(a.option, b.option);
            }
        }
        assert_eq!(DEVICE_MAP.option_name(), "criu-cuda-migrate.device-map");
    }

    /// The device-map rules name these variables in their errors without depending on this crate.
    #[test]
    fn the_map_rules_name_these_variables() {
        assert_eq!(ccm_identity::map::DEVICE_MAP_VAR, DEVICE_MAP.env);
        assert_eq!(ccm_identity::map::USABLE_GPUS_VAR, USABLE_GPUS.env);
    }
}
