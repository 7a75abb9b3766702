//! What the engine needs from CRIU itself. The plugin shell implements it with `dlsym` on the
//! running `criu`; tests implement it in memory.

use std::os::fd::{OwnedFd, RawFd};

/// The name CRIU knows the plugin by (descriptor and image inventory).
pub const PLUGIN_NAME: &str = "criu-cuda-migrate";

pub trait CriuHost {
    /// A duplicate of `criu_get_image_dir()`, CRIU's images directory fd: every image is read and
    /// written through it (the directory may be in another mount namespace than any path we
    /// could name, and a path could be swapped under us).
    fn image_dir(&self) -> Option<OwnedFd>;
    /// `add_inventory_plugin(name)` (CRIU 4.1+): makes a restore without this plugin fail clearly.
    fn add_inventory_plugin(&self, name: &str) -> bool;
    /// `check_and_remove_inventory_plugin(name)` at restore: `None` when CRIU lacks it.
    fn check_and_remove_inventory_plugin(&self, name: &str) -> Option<bool>;
    /// `set_compel_interrupt_only_mode()` (4.1+) or `dont_use_freeze_cgroup()` (4.0): the driver
    /// needs the restore thread to run, so CRIU must not use the cgroup freezer.
    fn set_interrupt_only_mode(&self) -> bool;
    /// `log_get_fd()`: CRIU's log, which the driver agent keeps open to log into it.
    fn log_fd(&self) -> Option<RawFd>;
}

/// A host for tests and for the command-line tool: no CRIU around.
#[derive(Debug, Default)]
pub struct NoCriu;

impl CriuHost for NoCriu {
    fn image_dir(&self) -> Option<OwnedFd> {
        None
    }
    fn add_inventory_plugin(&self, _: &str) -> bool {
        false
    }
    fn check_and_remove_inventory_plugin(&self, _: &str) -> Option<bool> {
        None
    }
    fn set_interrupt_only_mode(&self) -> bool {
        false
    }
    fn log_fd(&self) -> Option<RawFd> {
        None
    }
}
