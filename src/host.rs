//! [`CriuHost`] on the running `criu`: its exported functions, found with `dlsym` at run time.
//!
//! CRIU is linked with `-rdynamic`, so its internal functions are visible to plugins, but which
//! exist depends on the version (4.0 has `dont_use_freeze_cgroup`, 4.1 renamed it; the inventory
//! functions arrived in 4.1). Resolving them lazily keeps one plugin binary working on all of
//! them instead of failing to load with "undefined symbol".

use std::ffi::{c_char, c_int, CStr, CString};
use std::os::fd::RawFd;

use ccm_engine::CriuHost;

fn lookup(name: &CStr) -> *mut libc::c_void {
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name only performs a lookup.
    unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) }
}

pub struct RunningCriu;

impl CriuHost for RunningCriu {
    fn image_dir_fd(&self) -> Option<RawFd> {
        let p = lookup(c"criu_get_image_dir");
        if p.is_null() {
            return None;
        }
        // SAFETY: criu-plugin.h declares `int criu_get_image_dir(void)`.
        let f: extern "C" fn() -> c_int = unsafe { std::mem::transmute(p) };
        let fd = f();
        (fd >= 0).then_some(fd)
    }

    fn add_inventory_plugin(&self, name: &str) -> bool {
        let p = lookup(c"add_inventory_plugin");
        let Ok(cname) = CString::new(name) else { return false };
        if p.is_null() {
            return false;
        }
        // SAFETY: CRIU 4.1+ (criu/image.c): `int add_inventory_plugin(const char *name)`; it
        // copies the name.
        let f: extern "C" fn(*const c_char) -> c_int = unsafe { std::mem::transmute(p) };
        f(cname.as_ptr()) == 0
    }

    fn check_and_remove_inventory_plugin(&self, name: &str) -> Option<bool> {
        let p = lookup(c"check_and_remove_inventory_plugin");
        let cname = CString::new(name).ok()?;
        if p.is_null() {
            return None;
        }
        // SAFETY: CRIU 4.1+ (criu/image.c):
        // `bool check_and_remove_inventory_plugin(const char *name, size_t n)`.
        let f: extern "C" fn(*const c_char, libc::size_t) -> bool = unsafe { std::mem::transmute(p) };
        Some(f(cname.as_ptr(), name.len()))
    }

    fn log_fd(&self) -> Option<RawFd> {
        let p = lookup(c"log_get_fd");
        if p.is_null() {
            return None;
        }
        // SAFETY: CRIU (criu/log.c): `int log_get_fd(void)`.
        let f: extern "C" fn() -> c_int = unsafe { std::mem::transmute(p) };
        let fd = f();
        (fd >= 0).then_some(fd)
    }

    fn set_interrupt_only_mode(&self) -> bool {
        for name in [c"set_compel_interrupt_only_mode", c"dont_use_freeze_cgroup"] {
            let p = lookup(name);
            if !p.is_null() {
                // SAFETY: both are `void f(void)` in CRIU 4.1+ and 4.0 respectively.
                let f: extern "C" fn() = unsafe { std::mem::transmute(p) };
                f();
                return true;
            }
        }
        false
    }
}

/// `--plugin-option criu-cuda-migrate.KEY=VALUE` pairs, when the running CRIU offers
/// `criu_plugin_get_options(int *argc, char ***argv)` (newer than 4.2).
pub fn plugin_options() -> Vec<(String, String)> {
    let p = lookup(c"criu_plugin_get_options");
    if p.is_null() {
        return Vec::new();
    }
    // SAFETY: CRIU's declaration is `int criu_plugin_get_options(int *argc, char ***argv)`.
    let f: extern "C" fn(*mut c_int, *mut *mut *mut c_char) -> c_int = unsafe { std::mem::transmute(p) };
    let mut argc: c_int = 0;
    let mut argv: *mut *mut c_char = std::ptr::null_mut();
    if f(&mut argc, &mut argv) != 0 || argv.is_null() {
        return Vec::new();
    }
    let mut out = Vec::new();
    for i in 0..argc.max(0) as usize {
        // SAFETY: CRIU returns `argc` valid pointers to NUL-terminated strings it owns.
        let s = unsafe { *argv.add(i) };
        if s.is_null() {
            continue;
        }
        // SAFETY: non-null NUL-terminated string owned by CRIU for its whole run.
        let text = unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned();
        if let Some(kv) = text.strip_prefix(ccm_engine::config::OPTION_PREFIX) {
            if let Some((k, v)) = kv.split_once('=') {
                out.push((k.to_string(), v.to_string()));
            }
        }
    }
    out
}
