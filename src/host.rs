//! [`CriuHost`] on the running `criu`: its exported functions, found with `dlsym` at run time.
//!
//! CRIU is linked with `-rdynamic`, so its internal functions are visible to plugins, but which
//! exist depends on the version (4.0 has `dont_use_freeze_cgroup`, 4.1 renamed it; the inventory
//! functions arrived in 4.1). Resolving them lazily keeps one plugin binary working on all of
//! them instead of failing to load with "undefined symbol".

use std::ffi::{c_char, c_int, CStr, CString};
use std::os::fd::{BorrowedFd, OwnedFd, RawFd};

use ccm_engine::CriuHost;

/// A function CRIU exports (it is linked with `-rdynamic`), as the function pointer type `F`, or
/// `None` when this CRIU has no such symbol. The one place a `dlsym` result becomes a function.
///
/// # Safety
/// `F` must be the `extern "C" fn` type of the symbol's C declaration in the CRIU versions that
/// export it.
pub(crate) unsafe fn criu_function<F: Copy>(name: &CStr) -> Option<F> {
    const { assert!(std::mem::size_of::<F>() == std::mem::size_of::<*mut libc::c_void>()) };
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name only performs a lookup.
    let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: `F` is a function pointer of the same size as `p` (asserted above) whose type the
    // caller vouches for; a non-null dlsym result of a function symbol is its address.
    Some(unsafe { std::mem::transmute_copy::<*mut libc::c_void, F>(&p) })
}

pub struct RunningCriu;

impl CriuHost for RunningCriu {
    fn image_dir(&self) -> Option<OwnedFd> {
        // SAFETY: criu-plugin.h declares `int criu_get_image_dir(void)`.
        let f = unsafe { criu_function::<extern "C" fn() -> c_int>(c"criu_get_image_dir") }?;
        let fd = f();
        if fd < 0 {
            return None;
        }
        // SAFETY: criu_get_image_dir returns CRIU's images-directory service fd, which CRIU keeps open for its
        // whole run; it is borrowed here only to duplicate it (F_DUPFD_CLOEXEC), never closed.
        let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
        borrowed.try_clone_to_owned().ok()
    }

    fn add_inventory_plugin(&self, name: &str) -> bool {
        let Ok(cname) = CString::new(name) else { return false };
        // SAFETY: CRIU 4.1+ (criu/image.c): `int add_inventory_plugin(const char *name)`; it
        // copies the name.
        let Some(f) = (unsafe { criu_function::<extern "C" fn(*const c_char) -> c_int>(c"add_inventory_plugin") })
        else {
            return false;
        };
        f(cname.as_ptr()) == 0
    }

    fn check_and_remove_inventory_plugin(&self, name: &str) -> Option<bool> {
        let cname = CString::new(name).ok()?;
        // SAFETY: CRIU 4.1+ (criu/image.c):
        // `bool check_and_remove_inventory_plugin(const char *name, size_t n)`.
        let f = unsafe {
            criu_function::<extern "C" fn(*const c_char, libc::size_t) -> bool>(c"check_and_remove_inventory_plugin")
        }?;
        Some(f(cname.as_ptr(), name.len()))
    }

    fn log_fd(&self) -> Option<RawFd> {
        // SAFETY: CRIU (criu/log.c): `int log_get_fd(void)`.
        let f = unsafe { criu_function::<extern "C" fn() -> c_int>(c"log_get_fd") }?;
        let fd = f();
        (fd >= 0).then_some(fd)
    }

    fn set_interrupt_only_mode(&self) -> bool {
        for name in [c"set_compel_interrupt_only_mode", c"dont_use_freeze_cgroup"] {
            // SAFETY: both are `void f(void)` in CRIU 4.1+ and 4.0 respectively.
            if let Some(f) = unsafe { criu_function::<extern "C" fn()>(name) } {
                f();
                return true;
            }
        }
        false
    }
}

/// The argument array CRIU hands plugins for `--plugin-option` (CRIU PR #3138): a synthetic `argv[0]`, then
/// every plugin option given, prefixed `--`. `None` when the running CRIU has no
/// `int criu_plugin_get_options(int *argc, char ***argv)` (CRIU 4.1.1 and 4.2.1 have none; criu-dev since
/// 2026-09 has it): looked up at run time, so one plugin file loads in both.
pub fn plugin_option_argv() -> Option<Vec<String>> {
    // SAFETY: CRIU's declaration is `int criu_plugin_get_options(int *argc, char ***argv)`.
    let f = unsafe {
        criu_function::<extern "C" fn(*mut c_int, *mut *mut *mut c_char) -> c_int>(c"criu_plugin_get_options")
    }?;
    let mut argc: c_int = 0;
    let mut argv: *mut *mut c_char = std::ptr::null_mut();
    let rc = f(&mut argc, &mut argv);
    if rc != 0 {
        log::warn!("criu_plugin_get_options failed ({rc}); plugin options are not read in this run");
        return Some(Vec::new());
    }
    if argv.is_null() {
        return Some(Vec::new());
    }
    let mut out = Vec::new();
    for i in 0..usize::try_from(argc).unwrap_or(0) {
        // SAFETY: CRIU returns `argc` valid pointers to NUL-terminated strings it owns (the array is also
        // NULL-terminated at `argc`).
        let s = unsafe { *argv.add(i) };
        if s.is_null() {
            break;
        }
        // SAFETY: non-null NUL-terminated string owned by CRIU for its whole run.
        out.push(unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned());
    }
    Some(out)
}
