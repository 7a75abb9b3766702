//! criu-cuda-migrate: the CRIU plugin shell.
//!
//! CRIU `dlopen`s this `cdylib` and reads [`CR_PLUGIN_DESC`]. Every entry point is thin: it catches
//! any panic (none may cross the C ABI), calls the engine, and turns the outcome into CRIU's
//! convention: `0` done, `-ENOTSUP` "not mine, ask the next plugin", another negative errno fails
//! the step. All logging goes into CRIU's own log.

mod criu_log;
mod host;

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Mutex, MutexGuard, Once};

use ccm_engine::claims::Claim;
use ccm_engine::dump::DumpSession;
use ccm_engine::restore::RestoreSession;
use ccm_engine::{Config, HookOutcome};
use ccm_identity::claims::{DevNumber, DevType};
use criu_plugin_sys as sys;
use log::{debug, error, info, warn};

pub use criu_log::PREFIX as LOG_PREFIX;

/// `CRIU_PLUGIN_VERSION`: `GEN_VERSION(MAJOR, MINOR, SUBLEVEL)` of the header we were built from
/// (0x200 for CRIU 3.18 through 4.2). A higher value makes older CRIU reject the plugin.
pub const PLUGIN_VERSION: c_uint =
    (sys::CRIU_PLUGIN_VERSION_MAJOR << 16) + (sys::CRIU_PLUGIN_VERSION_MINOR << 8) + sys::CRIU_PLUGIN_VERSION_SUBLEVEL;

/// Hooks up to CHECKPOINT_DEVICES (index 11), so 12. CRIU rejects a plugin whose `max_hooks` is
/// above its own `CR_PLUGIN_HOOK__MAX` (12 on 4.0/4.1, 13 on 4.2) and fails the whole dump, so
/// this must never grow past what the oldest supported CRIU knows.
pub const MAX_HOOKS: c_uint = sys::CR_PLUGIN_HOOK__CHECKPOINT_DEVICES + 1;

const _: () = assert!(MAX_HOOKS as usize <= sys::CR_PLUGIN_HOOK__MAX as usize);
const _: () = assert!(PLUGIN_VERSION == 0x200);

const HOOK_COUNT: usize = sys::CR_PLUGIN_HOOK__MAX as usize;

/// The descriptor CRIU looks up by name. `#[repr(transparent)]` over bindgen's struct so the
/// layout is CRIU's; the wrapper only adds `Sync` (the pointers are to immutable statics and
/// functions).
#[repr(transparent)]
pub struct PluginDescriptor(sys::cr_plugin_desc_t);

// SAFETY: the descriptor is never mutated after load; its pointers refer to 'static data and
// functions, so sharing it between threads is sound.
unsafe impl Sync for PluginDescriptor {}

const fn hooks() -> [*mut c_void; HOOK_COUNT] {
    let mut h = [std::ptr::null_mut(); HOOK_COUNT];
    h[sys::CR_PLUGIN_HOOK__DUMP_EXT_FILE as usize] = dump_ext_file as *mut c_void;
    h[sys::CR_PLUGIN_HOOK__RESTORE_EXT_FILE as usize] = restore_ext_file as *mut c_void;
    h[sys::CR_PLUGIN_HOOK__HANDLE_DEVICE_VMA as usize] = handle_device_vma as *mut c_void;
    h[sys::CR_PLUGIN_HOOK__UPDATE_VMA_MAP as usize] = update_vma_map as *mut c_void;
    h[sys::CR_PLUGIN_HOOK__RESUME_DEVICES_LATE as usize] = resume_devices_late as *mut c_void;
    h[sys::CR_PLUGIN_HOOK__PAUSE_DEVICES as usize] = pause_devices as *mut c_void;
    h[sys::CR_PLUGIN_HOOK__CHECKPOINT_DEVICES as usize] = checkpoint_devices as *mut c_void;
    h
}

#[no_mangle]
#[used]
pub static CR_PLUGIN_DESC: PluginDescriptor = PluginDescriptor(sys::cr_plugin_desc_t {
    name: c"criu-cuda-migrate".as_ptr() as *mut c_char,
    init: Some(plugin_init),
    exit: Some(plugin_exit),
    version: PLUGIN_VERSION,
    max_hooks: MAX_HOOKS,
    hooks: hooks(),
});

/// The plugin's state for one CRIU run.
enum Session {
    /// Pre-dump, disabled, or not initialised: every hook answers -ENOTSUP.
    Off,
    /// No NVIDIA driver on this host: no process can be a CUDA process.
    NoDriver,
    // Boxed: one session lives per CRIU run, and `Off` should not carry a session's size.
    Dump(Box<DumpSession>),
    Restore(Box<RestoreSession>),
}

static SESSION: Mutex<Session> = Mutex::new(Session::Off);

fn session() -> MutexGuard<'static, Session> {
    // A panic inside a hook poisons the lock; the state is still the best we have.
    SESSION.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs `f`, turning a panic into `on_panic` and an ERROR line instead of unwinding into C.
fn guard<T>(what: &str, on_panic: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(p) => {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            // Logging itself must not unwind out of here.
            let _ = catch_unwind(|| {
                error!("internal error in {what}: {msg}; this is a bug in criu-cuda-migrate, please report it with this log")
            });
            on_panic
        }
    }
}

fn install_panic_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // The default hook writes to stderr, which under runc is the container's stdio.
        std::panic::set_hook(Box::new(|info| {
            error!("panic: {info}");
        }));
    });
}

fn not_cuda(pid: c_int) -> HookOutcome {
    debug!("pid {pid} is not a CUDA process; leaving it to CRIU (-ENOTSUP)");
    HookOutcome::NotMine
}

/// CRIU's answer for a hook's outcome, with the hook's timing line when it did work: for a CUDA
/// process, or for the process whose call did the whole tree's work (a non-CUDA root).
fn outcome_code(pid: c_int, hook: &str, o: HookOutcome, worked: bool, started: std::time::Instant) -> c_int {
    if worked || !matches!(o, HookOutcome::NotMine) {
        ccm_engine::check_single_threaded(hook);
        // What CRIU waited for in this hook: the benchmark adds these up (bench/summarize.py).
        info!("timing: {hook}(pid {pid}) {:.4} s in the plugin", started.elapsed().as_secs_f64());
    }
    match o {
        HookOutcome::NotMine => -libc::ENOTSUP,
        HookOutcome::Done => 0,
        HookOutcome::Failed(e) => {
            error!("{hook}(pid {pid}) failed: {e}");
            // Any negative value but -ENOTSUP fails CRIU's step; CRIU reports our ERROR line.
            -libc::EIO
        }
    }
}

fn stage_name(stage: c_int) -> &'static str {
    // A negative stage is no stage: c_uint::MAX matches none.
    match c_uint::try_from(stage).unwrap_or(c_uint::MAX) {
        sys::CR_PLUGIN_STAGE__DUMP => "dump",
        sys::CR_PLUGIN_STAGE__PRE_DUMP => "pre-dump",
        sys::CR_PLUGIN_STAGE__RESTORE => "restore",
        _ => "unknown",
    }
}

extern "C" fn plugin_init(stage: c_int) -> c_int {
    let started = std::time::Instant::now();
    let rc = plugin_init_inner(stage);
    let _ = catch_unwind(|| {
        info!("timing: init({}) {:.4} s in the plugin", stage_name(stage), started.elapsed().as_secs_f64())
    });
    rc
}

fn plugin_init_inner(stage: c_int) -> c_int {
    guard("init", -libc::EIO, || {
        criu_log::install();
        install_panic_hook();
        info!("{} {}: init stage={}", ccm_engine::PLUGIN_NAME, env!("CARGO_PKG_VERSION"), stage_name(stage));
        let host = host::RunningCriu;
        // Plugin options (where this CRIU offers them) override the environment; a bad one of ours fails the
        // init with what to write, like a bad environment variable.
        let given = match host::plugin_option_argv().map(|argv| ccm_settings::options::parse(&argv)).transpose() {
            Ok(g) => g,
            Err(e) => {
                error!("configuration: {e}");
                return -libc::EINVAL;
            }
        };
        let config = match Config::from_process(given.as_deref().unwrap_or_default()) {
            Ok(c) => c,
            Err(e) => {
                error!("configuration: {e}");
                return -libc::EINVAL;
            }
        };
        info!("settings: {config}; {}", ccm_settings::options::sources(given.as_deref(), |k| std::env::var(k).ok()));
        let mut s = session();
        *s = Session::Off;
        if config.disabled {
            warn!("disabled: {}=1", ccm_engine::config::ENV_DISABLE);
            return 0;
        }
        match c_uint::try_from(stage).unwrap_or(c_uint::MAX) {
            sys::CR_PLUGIN_STAGE__DUMP => {
                // Without a driver (logged by the session) CUDA processes are left to CRIU: hosts
                // without the NVIDIA driver must dump as before.
                *s = match DumpSession::init(config, &host) {
                    Ok(d) => Session::Dump(Box::new(d)),
                    Err(_) => Session::NoDriver,
                };
                0
            }
            sys::CR_PLUGIN_STAGE__RESTORE => match RestoreSession::init(config, &host) {
                Ok(r) => {
                    *s = Session::Restore(Box::new(r));
                    0
                }
                Err(e) => {
                    error!("restore refused before anything was restored: {e}. The images are unchanged; fix this and run the restore again.");
                    -libc::EINVAL
                }
            },
            // CRIU cannot pre-dump device mappings; the plugin stays out (PAUSE_DEVICES still
            // comes in pre-dump and gets -ENOTSUP).
            _ => 0,
        }
    })
}

extern "C" fn plugin_exit(stage: c_int, ret: c_int) {
    let started = std::time::Instant::now();
    guard("exit", (), || {
        let mut s = session();
        match &mut *s {
            Session::Dump(d) => d.finish(ret, &host::RunningCriu),
            Session::Restore(r) => r.finish(ret),
            Session::Off | Session::NoDriver => {}
        }
        *s = Session::Off;
        debug!("exit stage={} ret={ret}", stage_name(stage));
        info!("timing: exit({}) {:.4} s in the plugin", stage_name(stage), started.elapsed().as_secs_f64());
    })
}

extern "C" fn pause_devices(pid: c_int) -> c_int {
    guard("PAUSE_DEVICES", -libc::EIO, || {
        let started = std::time::Instant::now();
        let o = match &mut *session() {
            Session::Dump(d) => d.pause_devices(pid, &host::RunningCriu),
            Session::NoDriver => not_cuda(pid),
            _ => HookOutcome::NotMine,
        };
        outcome_code(pid, "PAUSE_DEVICES", o, false, started)
    })
}

extern "C" fn checkpoint_devices(pid: c_int) -> c_int {
    guard("CHECKPOINT_DEVICES", -libc::EIO, || {
        let started = std::time::Instant::now();
        let o = match &mut *session() {
            Session::Dump(d) => d.checkpoint_devices(pid, &host::RunningCriu),
            Session::NoDriver => not_cuda(pid),
            _ => HookOutcome::NotMine,
        };
        outcome_code(pid, "CHECKPOINT_DEVICES", o, false, started)
    })
}

extern "C" fn resume_devices_late(pid: c_int) -> c_int {
    guard("RESUME_DEVICES_LATE", -libc::EIO, || {
        let started = std::time::Instant::now();
        let (o, worked) = match &mut *session() {
            Session::Restore(r) => r.resume_devices_late(pid),
            Session::NoDriver => (not_cuda(pid), false),
            _ => (HookOutcome::NotMine, false),
        };
        outcome_code(pid, "RESUME_DEVICES_LATE", o, worked, started)
    })
}

/// CRIU's answer for a claim (HANDLE_DEVICE_VMA, DUMP_EXT_FILE), with a timing line when it was ours.
fn claim_code(hook: &str, what: std::fmt::Arguments<'_>, claim: Claim, started: std::time::Instant) -> c_int {
    match claim {
        Claim::NotMine => -libc::ENOTSUP,
        Claim::Mine => {
            info!("timing: {hook}({what}) {:.4} s in the plugin", started.elapsed().as_secs_f64());
            0
        }
        Claim::Refused(e) => {
            error!("{hook}({what}) failed: {e}");
            -libc::EIO
        }
    }
}

/// The device number of a `stat` CRIU hands over.
fn dev_number(mode: libc::mode_t, rdev: libc::dev_t) -> Option<DevNumber> {
    let kind = match mode & libc::S_IFMT {
        libc::S_IFCHR => DevType::Char,
        libc::S_IFBLK => DevType::Block,
        _ => return None,
    };
    Some(DevNumber { kind, major: libc::major(rdev), minor: libc::minor(rdev) })
}

/// HANDLE_DEVICE_VMA (dump): "is this device mapping yours?" 0 makes it a plugin mapping whose content
/// CRIU does not dump; an NVIDIA node held by a forked process (recorded at its CHECKPOINT_DEVICES) is.
extern "C" fn handle_device_vma(fd: c_int, st: *const libc::stat) -> c_int {
    guard("HANDLE_DEVICE_VMA", -libc::EIO, || {
        let started = std::time::Instant::now();
        if st.is_null() {
            return -libc::ENOTSUP;
        }
        // SAFETY: CRIU passes the `struct stat` of the mapped file (proc_parse.c, handle_vma_plugin), valid
        // for the length of the call; it is only read here.
        let (mode, rdev) = unsafe { ((*st).st_mode, (*st).st_rdev) };
        let Some(number) = dev_number(mode, rdev) else { return -libc::ENOTSUP };
        let claim = match &mut *session() {
            Session::Dump(d) => d.handle_device_vma(number, ccm_process::criu_self::task_being_parsed()),
            _ => Claim::NotMine,
        };
        claim_code("HANDLE_DEVICE_VMA", format_args!("fd {fd}, {number}"), claim, started)
    })
}

/// DUMP_EXT_FILE (dump): an open file CRIU cannot dump; an NVIDIA node of a forked process is claimed
/// and recorded (its node, its GPU, its open flags) for RESTORE_EXT_FILE.
extern "C" fn dump_ext_file(fd: c_int, id: c_int) -> c_int {
    guard("DUMP_EXT_FILE", -libc::EIO, || {
        let started = std::time::Instant::now();
        let facts = ccm_process::claims::with_borrowed(fd, |f| {
            (ccm_process::claims::device_of_fd(f), ccm_process::claims::open_flags_of_fd(f))
        });
        let (Some((Some(number), Some(flags))), Ok(id)) = (facts, u32::try_from(id)) else { return -libc::ENOTSUP };
        let claim = match &mut *session() {
            Session::Dump(d) => d.dump_ext_file(id, number, flags, &host::RunningCriu),
            _ => Claim::NotMine,
        };
        claim_code("DUMP_EXT_FILE", format_args!("file {id:#x}, {number}"), claim, started)
    })
}

/// RESTORE_EXT_FILE (restore, in the restored task): the descriptor of a claimed file, opened anew on
/// this node; CRIU installs it at the task's descriptor number.
extern "C" fn restore_ext_file(id: c_int) -> c_int {
    guard("RESTORE_EXT_FILE", -libc::EIO, || {
        let started = std::time::Instant::now();
        let Ok(id) = u32::try_from(id) else { return -libc::ENOTSUP };
        let r = match &*session() {
            Session::Restore(r) => r.restore_ext_file(id),
            _ => None,
        };
        match r {
            None => -libc::ENOTSUP,
            Some(Ok(fd)) => {
                let raw = ccm_process::claims::into_raw(fd);
                info!(
                    "timing: RESTORE_EXT_FILE(file {id:#x}) {:.4} s in the plugin: reopened as fd {raw} in task {}",
                    started.elapsed().as_secs_f64(),
                    std::process::id()
                );
                raw
            }
            Some(Err(e)) => {
                error!("RESTORE_EXT_FILE(file {id:#x}) failed: {e}");
                -libc::EIO
            }
        }
    })
}

/// UPDATE_VMA_MAP (restore, in the restored task): a claimed device mapping gets its placeholder: the
/// descriptor CRIU maps instead of the device (at offset 0). 1 means "updated".
extern "C" fn update_vma_map(
    _path: *const c_char,
    addr: u64,
    old_pgoff: u64,
    new_pgoff: *mut u64,
    plugin_fd: *mut c_int,
) -> c_int {
    guard("UPDATE_VMA_MAP", -libc::EIO, || {
        let started = std::time::Instant::now();
        if new_pgoff.is_null() || plugin_fd.is_null() {
            return -libc::ENOTSUP;
        }
        // CRIU runs this hook in the task it restores, in the task's own pid namespace: its pid there is the
        // one the dump recorded.
        let ns_pid = std::process::id();
        let r = match &*session() {
            Session::Restore(r) => r.update_vma_map(ns_pid, addr),
            _ => None,
        };
        match r {
            None => -libc::ENOTSUP,
            Some(Ok(fd)) => {
                let raw = ccm_process::claims::into_raw(fd);
                // SAFETY: CRIU passes pointers to its own locals (files-reg.c, open_filemap), valid and
                // writable for the length of the call; both were checked non-null above.
                unsafe {
                    *new_pgoff = 0;
                    *plugin_fd = raw;
                }
                info!(
                    "timing: UPDATE_VMA_MAP({addr:#x}, offset {old_pgoff:#x}) {:.4} s in the plugin: placeholder fd {raw} in task {ns_pid}",
                    started.elapsed().as_secs_f64()
                );
                1
            }
            Some(Err(e)) => {
                error!("UPDATE_VMA_MAP({addr:#x}) failed: {e}");
                -libc::EIO
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptor_matches_the_abi() {
        let d = &CR_PLUGIN_DESC.0;
        assert_eq!(d.version, 0x200);
        assert_eq!(d.max_hooks, 12);
        assert!(d.hooks[sys::CR_PLUGIN_HOOK__PAUSE_DEVICES as usize] == pause_devices as *mut c_void);
        assert!(d.hooks[sys::CR_PLUGIN_HOOK__DUMP_UNIX_SK as usize].is_null());
        assert!(d.hooks[sys::CR_PLUGIN_HOOK__HANDLE_DEVICE_VMA as usize] == handle_device_vma as *mut c_void);
        assert!(d.hooks[sys::CR_PLUGIN_HOOK__UPDATE_VMA_MAP as usize] == update_vma_map as *mut c_void);
        assert!(d.hooks[sys::CR_PLUGIN_HOOK__DUMP_EXT_FILE as usize] == dump_ext_file as *mut c_void);
        assert!(d.hooks[sys::CR_PLUGIN_HOOK__RESTORE_EXT_FILE as usize] == restore_ext_file as *mut c_void);
        // SAFETY: the name is a 'static C string literal.
        assert_eq!(unsafe { std::ffi::CStr::from_ptr(d.name) }.to_str().unwrap(), "criu-cuda-migrate");
    }

    #[test]
    fn a_panic_becomes_an_error_code() {
        assert_eq!(guard("test", -5, || panic!("boom")), -5);
    }
}
