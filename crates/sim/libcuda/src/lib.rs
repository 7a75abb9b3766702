//! **TEST DOUBLE of `libcuda.so.1`, for CI machines without GPUs. Never packaged, never installed.**
//!
//! Loaded in place of NVIDIA's driver library (a copy or symlink named `libcuda.so.1` first on
//! `LD_LIBRARY_PATH`, or by path through `CRIU_CUDA_MIGRATE_LIBCUDA`), it models what
//! criu-cuda-migrate relies on in driver 580 (see `docs/TEST-DOUBLES.md` and GPU-FACTS.md):
//!
//! - the app side a small CUDA program uses (init, devices, primary contexts, device memory),
//!   with each device's PCI location cached at `cuInit` in a malloc'd object holding
//!   `{domain, bus, device, 0, pciDeviceId, pciSubSystemId}` that alone answers
//!   `cuDeviceGetPCIBusId` and the PCI attributes, plus a table entry and a mirror entry in
//!   anonymous mappings (3 sites per enumerated GPU);
//! - the checkpoint API on another process (`cuCheckpointProcess*`), served by the target's own
//!   restore thread through files in `CCM_SIM_STATE_DIR`, so a controller that leaves that thread
//!   ptrace-stopped gets no answer, like with the real driver;
//! - after a remapped restore, UUID answers follow the new GPU while the cached PCI object keeps
//!   the old location: the bug the plugin fixes.

// A test double of a C library: its casts are the C ABI's ints, sizes and counts of a few simulated
// GPUs, and it is never packaged; the workspace's cast lints are for the product.
#![allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap, clippy::cast_sign_loss)]

mod driver;

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use ccm_sim_common::cuda::*;
use ccm_sim_common::protocol::{self, ExchangeError, Op};
use ccm_sim_common::registry;
use ccm_sim_common::Faults;
use ccm_sim_common::{SimPci, SimUuid, StateDir};

type CuResult = c_int;
type CuDevice = c_int;
type CuDevicePtr = u64;
type CuContext = *mut c_void;

/// Runs `f` behind the C boundary: a panic becomes CUDA_ERROR_UNKNOWN instead of unwinding into C.
fn guard(f: impl FnOnce() -> Result<(), i32>) -> CuResult {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => CUDA_SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => {
            eprintln!("cuda-test-double: internal error (panic); returning CUDA_ERROR_UNKNOWN");
            CUDA_ERROR_UNKNOWN
        }
    }
}

/// Writes `value` through a C out-pointer, refusing NULL.
fn put<T>(out: *mut T, value: T) -> Result<(), i32> {
    if out.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller passed a non-NULL pointer to writable storage of T, per cuda.h.
    unsafe { out.write(value) };
    Ok(())
}

/// Copies `text` and a NUL into a caller's buffer of `len` bytes.
fn put_str(out: *mut c_char, len: c_int, text: &str) -> Result<(), i32> {
    let len = usize::try_from(len).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
    if out.is_null() || len == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let n = text.len().min(len - 1);
    // SAFETY: the caller's buffer holds `len` bytes; we write n + 1 <= len of them.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr().cast::<c_char>(), out, n);
        out.add(n).write(0);
    }
    Ok(())
}

// ---- version and errors ------------------------------------------------------------------

#[no_mangle]
pub extern "C" fn cuInit(flags: c_uint) -> CuResult {
    guard(|| {
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        driver::init().map(|_| ())
    })
}

#[no_mangle]
pub extern "C" fn cuDriverGetVersion(version: *mut c_int) -> CuResult {
    guard(|| {
        let v = ccm_sim_common::SimConfig::from_env().map(|c| c.cuda_driver_version).unwrap_or(13000);
        put(version, v)
    })
}

fn error_text(
    code: CuResult,
    out: *mut *const c_char,
    pick: fn((&'static CStr, &'static CStr)) -> &'static CStr,
) -> CuResult {
    guard(|| {
        let texts = error_texts(code).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        put(out, pick(texts).as_ptr())
    })
}

#[no_mangle]
pub extern "C" fn cuGetErrorName(code: CuResult, out: *mut *const c_char) -> CuResult {
    error_text(code, out, |t| t.0)
}

#[no_mangle]
pub extern "C" fn cuGetErrorString(code: CuResult, out: *mut *const c_char) -> CuResult {
    error_text(code, out, |t| t.1)
}

// ---- devices ------------------------------------------------------------------------------

#[no_mangle]
pub extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CuResult {
    guard(|| {
        let d = driver::get()?;
        let _g = d.enter();
        put(count, d.device_count() as c_int)
    })
}

#[no_mangle]
pub extern "C" fn cuDeviceGet(device: *mut CuDevice, ordinal: c_int) -> CuResult {
    guard(|| {
        let d = driver::get()?;
        let _g = d.enter();
        d.slot_of(ordinal)?;
        put(device, ordinal)
    })
}

#[no_mangle]
pub extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, device: CuDevice) -> CuResult {
    guard(|| {
        let d = driver::get()?;
        let g = d.enter();
        put_str(name, len, &d.current(&g, device)?.name)
    })
}

#[no_mangle]
pub extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, device: CuDevice) -> CuResult {
    guard(|| {
        let d = driver::get()?;
        let g = d.enter();
        put(bytes, d.current(&g, device)?.memory_total as usize)
    })
}

/// Answers from the cached heap object, never from the GPU set.
#[no_mangle]
pub extern "C" fn cuDeviceGetPCIBusId(bus_id: *mut c_char, len: c_int, device: CuDevice) -> CuResult {
    guard(|| {
        let d = driver::get()?;
        let _g = d.enter();
        let w = d.cached_pci_words(device)?;
        put_str(bus_id, len, &SimPci { domain: w[0], bus: w[1], device: w[2] }.to_cuda_string())
    })
}

fn device_uuid(uuid: *mut [u8; 16], device: CuDevice) -> CuResult {
    guard(|| {
        let d = driver::get()?;
        let g = d.enter();
        put(uuid, d.current(&g, device)?.uuid.0)
    })
}

/// Answers from the process's current ordinal → GPU mapping (a remapped restore changes it).
#[no_mangle]
pub extern "C" fn cuDeviceGetUuid(uuid: *mut [u8; 16], device: CuDevice) -> CuResult {
    device_uuid(uuid, device)
}

#[no_mangle]
pub extern "C" fn cuDeviceGetUuid_v2(uuid: *mut [u8; 16], device: CuDevice) -> CuResult {
    device_uuid(uuid, device)
}

const ATTR_MULTIPROCESSOR_COUNT: c_int = 16;
const ATTR_PCI_BUS_ID: c_int = 33;
const ATTR_PCI_DEVICE_ID: c_int = 34;
const ATTR_PCI_DOMAIN_ID: c_int = 50;
const ATTR_COMPUTE_CAPABILITY_MAJOR: c_int = 75;
const ATTR_COMPUTE_CAPABILITY_MINOR: c_int = 76;

/// The PCI attributes come from the cached heap object; a few others have H200 values; the rest
/// are not simulated and answer CUDA_ERROR_INVALID_VALUE.
#[no_mangle]
pub extern "C" fn cuDeviceGetAttribute(value: *mut c_int, attribute: c_int, device: CuDevice) -> CuResult {
    guard(|| {
        let d = driver::get()?;
        let _g = d.enter();
        let w = d.cached_pci_words(device)?;
        let v = match attribute {
            ATTR_PCI_BUS_ID => w[1] as c_int,
            ATTR_PCI_DEVICE_ID => w[2] as c_int,
            ATTR_PCI_DOMAIN_ID => w[0] as c_int,
            ATTR_MULTIPROCESSOR_COUNT => 132,
            ATTR_COMPUTE_CAPABILITY_MAJOR => 9,
            ATTR_COMPUTE_CAPABILITY_MINOR => 0,
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        };
        put(value, v)
    })
}

// ---- contexts -----------------------------------------------------------------------------

/// Primary contexts are tokens: a fixed non-NULL address per ordinal.
const CONTEXT_BASE: usize = 0xc0de_0000;

thread_local! {
    /// The calling thread's current context, as its CUDA ordinal.
    static CURRENT_ORDINAL: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxRetain(ctx: *mut CuContext, device: CuDevice) -> CuResult {
    guard(|| {
        let d = driver::get()?;
        let _g = d.enter();
        d.slot_of(device)?;
        put(ctx, (CONTEXT_BASE + device as usize) as CuContext)
    })
}

#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(device: CuDevice) -> CuResult {
    guard(|| {
        let d = driver::get()?;
        let _g = d.enter();
        d.slot_of(device).map(|_| ())
    })
}

#[no_mangle]
pub extern "C" fn cuCtxSetCurrent(ctx: CuContext) -> CuResult {
    guard(|| {
        let d = driver::get()?;
        let _g = d.enter();
        if ctx.is_null() {
            CURRENT_ORDINAL.with(|c| c.set(None));
            return Ok(());
        }
        let ordinal = (ctx as usize).checked_sub(CONTEXT_BASE).ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        if ordinal >= d.device_count() {
            return Err(CUDA_ERROR_INVALID_CONTEXT);
        }
        CURRENT_ORDINAL.with(|c| c.set(Some(ordinal)));
        Ok(())
    })
}

fn current_ordinal() -> Result<usize, i32> {
    CURRENT_ORDINAL.with(|c| c.get()).ok_or(CUDA_ERROR_INVALID_CONTEXT)
}

#[no_mangle]
pub extern "C" fn cuCtxGetDevice(device: *mut CuDevice) -> CuResult {
    guard(|| {
        let d = driver::get()?;
        let _g = d.enter();
        put(device, current_ordinal()? as CuDevice)
    })
}

#[no_mangle]
pub extern "C" fn cuCtxSynchronize() -> CuResult {
    guard(|| {
        let d = driver::get()?;
        let _g = d.enter();
        current_ordinal().map(|_| ())
    })
}

// ---- device memory ------------------------------------------------------------------------

#[no_mangle]
pub extern "C" fn cuMemAlloc_v2(dptr: *mut CuDevicePtr, bytes: usize) -> CuResult {
    guard(|| {
        let d = driver::get()?;
        let mut g = d.enter();
        let ordinal = current_ordinal()?;
        if dptr.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let p = d.mem_alloc(&mut g, ordinal, bytes as u64)?;
        put(dptr, p)
    })
}

#[no_mangle]
pub extern "C" fn cuMemFree_v2(dptr: CuDevicePtr) -> CuResult {
    guard(|| {
        let d = driver::get()?;
        let mut g = d.enter();
        current_ordinal()?;
        d.mem_free(&mut g, dptr)
    })
}

#[no_mangle]
pub extern "C" fn cuMemsetD32_v2(dptr: CuDevicePtr, value: c_uint, count: usize) -> CuResult {
    guard(|| {
        let d = driver::get()?;
        let g = d.enter();
        current_ordinal()?;
        d.memset_d32(&g, dptr, value, count as u64)
    })
}

#[no_mangle]
pub extern "C" fn cuMemcpyDtoH_v2(dst: *mut c_void, src: CuDevicePtr, bytes: usize) -> CuResult {
    guard(|| {
        let d = driver::get()?;
        let g = d.enter();
        current_ordinal()?;
        if bytes == 0 {
            return Ok(());
        }
        if dst.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the caller passes a writable host buffer of `bytes` bytes, per cuda.h.
        let host = unsafe { std::slice::from_raw_parts_mut(dst.cast::<u8>(), bytes) };
        d.copy_to_host(&g, host, src)
    })
}

#[no_mangle]
pub extern "C" fn cuMemcpyHtoD_v2(dst: CuDevicePtr, src: *const c_void, bytes: usize) -> CuResult {
    guard(|| {
        let d = driver::get()?;
        let g = d.enter();
        current_ordinal()?;
        if bytes == 0 {
            return Ok(());
        }
        if src.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the caller passes a readable host buffer of `bytes` bytes, per cuda.h.
        let host = unsafe { std::slice::from_raw_parts(src.cast::<u8>(), bytes) };
        d.copy_from_host(&g, dst, host)
    })
}

// ---- the checkpoint API on another process --------------------------------------------------

fn controller_state_dir() -> Result<StateDir, i32> {
    StateDir::from_env().map_err(|e| {
        eprintln!("cuda-test-double: {e}");
        CUDA_ERROR_NOT_INITIALIZED
    })
}

/// How long the controller waits for the target's restore thread beyond the operation's own time.
fn call_timeout() -> Duration {
    std::env::var(protocol::ENV_CALL_TIMEOUT_MS)
        .ok()
        .and_then(|v| v.parse().ok())
        .map(Duration::from_millis)
        .unwrap_or(protocol::DEFAULT_CALL_TIMEOUT)
}

/// The caller knobs (`agent-stop=CALL`, `agent-kill=CALL`): once the request is posted, this process
/// stops or kills itself, once per state directory.
fn caller_fault(state: &StateDir, call: &str) {
    let f = Faults::current(Some(state));
    let signal = if f.agent_kill.as_deref() == Some(call) {
        libc::SIGKILL
    } else if f.agent_stop.as_deref() == Some(call) {
        libc::SIGSTOP
    } else {
        return;
    };
    let marker = state.root().join("agent-fault-fired");
    if std::fs::OpenOptions::new().write(true).create_new(true).open(&marker).is_err() {
        return;
    }
    eprintln!(
        "cuda-test-double: {call}: the caller (pid {}) sends itself signal {signal} (fault knob)",
        std::process::id()
    );
    // SAFETY: raise has no preconditions; SIGSTOP stops this whole process, SIGKILL ends it.
    unsafe { libc::raise(signal) };
}

fn call_target(pid: c_int, op: Op, extra: Duration) -> Result<(), i32> {
    let state = controller_state_dir()?;
    let call = match &op {
        Op::Lock { .. } => "lock",
        Op::Checkpoint | Op::CheckpointCustom => "checkpoint",
        Op::Restore { .. } | Op::RestoreCustom { .. } => "restore",
        Op::Unlock => "unlock",
        Op::Complete => "complete",
    };
    match protocol::exchange_then(&state, pid, op, call_timeout() + extra, || caller_fault(&state, call)) {
        Ok(CUDA_SUCCESS) => Ok(()),
        Ok(code) => Err(code),
        Err(ExchangeError::NotRegistered { .. }) => Err(CUDA_ERROR_NOT_FOUND),
        Err(e @ ExchangeError::NoAnswer { .. }) => {
            eprintln!("cuda-test-double: {e}");
            Err(CUDA_ERROR_NOT_READY)
        }
        Err(e) => {
            eprintln!("cuda-test-double: {e}");
            Err(CUDA_ERROR_UNKNOWN)
        }
    }
}

/// The restore thread id of `pid` as the caller's `/proc` names it: for a process in a container (own pid
/// namespace) the host tid, which the plugin can ptrace-resume.
#[no_mangle]
pub extern "C" fn cuCheckpointProcessGetRestoreThreadId(pid: c_int, tid: *mut c_int) -> CuResult {
    guard(|| {
        let state = controller_state_dir()?;
        let t = protocol::registered_restore_tid(&state, pid).ok_or(CUDA_ERROR_NOT_FOUND)?;
        put(tid, t)
    })
}

/// Whether `tid` of `pid` is in a stop (`T`, or `t` under ptrace), from /proc/PID/task/TID/stat.
fn thread_is_stopped(pid: c_int, tid: c_int) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next()))
        .is_some_and(|c| c == 't' || c == 'T')
}

#[no_mangle]
pub extern "C" fn cuCheckpointProcessGetState(pid: c_int, out: *mut c_int) -> CuResult {
    guard(|| {
        let state = controller_state_dir()?;
        let resolved = registry::resolve(&state, pid).ok_or(CUDA_ERROR_NOT_FOUND)?;
        // The real driver asks the target's restore thread for its state: on driver 580 the call
        // hangs while that thread is ptrace-stopped. Model it: wait for the thread to run, and
        // give up with NOT_READY after the call timeout.
        let tid = resolved.host_tid;
        let deadline = std::time::Instant::now() + call_timeout();
        while thread_is_stopped(pid, tid) {
            if std::time::Instant::now() >= deadline {
                eprintln!("cuda-test-double: cuCheckpointProcessGetState({pid}): restore thread {tid} is stopped; the real driver hangs here");
                return Err(CUDA_ERROR_NOT_READY);
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        // From the process's memory, like the real driver's answer from its restore thread; the file (what
        // the process wrote last) only without ptrace access to it.
        let reg = &resolved.registration;
        if let Some(s) = reg.state_in_memory_of(pid).filter(|s| (STATE_RUNNING..=STATE_RESTORING).contains(s)) {
            return put(out, s);
        }
        let text = std::fs::read_to_string(reg.state()).map_err(|_| CUDA_ERROR_NOT_FOUND)?;
        put(out, text.trim().parse().map_err(|_| CUDA_ERROR_UNKNOWN)?)
    })
}

/// # Safety
/// `args` is NULL or points to a `CUcheckpointLockArgs`.
#[no_mangle]
pub unsafe extern "C" fn cuCheckpointProcessLock(pid: c_int, args: *const LockArgs) -> CuResult {
    guard(|| {
        // SAFETY: a non-NULL args points to a CUcheckpointLockArgs, per cuda.h.
        let timeout_ms = if args.is_null() { 0 } else { unsafe { (*args).timeout_ms } };
        call_target(pid, Op::Lock { timeout_ms }, Duration::from_millis(u64::from(timeout_ms)))
    })
}

/// A custom-storage operation this process called (CUDA 13.4): its target and the regions mapped here. Its address
/// is the operation's `CUcheckpointOperationHandle`; `cuCheckpointOperationComplete` frees it.
struct CustomOp {
    pid: c_int,
    info: CustomStorageInfo,
    per_device: Vec<CustomStoragePerDevice>,
}

/// Runs a custom-storage `op` on `pid`, then maps the regions it lists into this process (each at a device pointer
/// of the ordinal this process sees its GPU as, with that ordinal's stream) and returns the driver-owned info.
fn custom_op(pid: c_int, op: Op) -> Result<*mut CustomStorageInfo, i32> {
    // The caller must have initialised the driver (documented for custom storage).
    let d = driver::get()?;
    call_target(pid, op, Duration::ZERO)?;
    let state = controller_state_dir()?;
    let resolved = registry::resolve(&state, pid).ok_or(CUDA_ERROR_NOT_FOUND)?;
    let text = std::fs::read_to_string(resolved.registration.custom_regions()).map_err(|_| CUDA_ERROR_UNKNOWN)?;
    let mut g = d.enter();
    let mut per_device = Vec::new();
    for line in text.lines() {
        let mut w = line.splitn(3, ' ');
        let (Some(uuid), Some(size), Some(path)) = (w.next(), w.next(), w.next()) else {
            return Err(CUDA_ERROR_UNKNOWN);
        };
        let uuid: SimUuid = uuid.parse().map_err(|_| CUDA_ERROR_UNKNOWN)?;
        let size: u64 = size.parse().map_err(|_| CUDA_ERROR_UNKNOWN)?;
        // The caller needs a context on every GPU of the target (the real driver: CUDA_ERROR_INVALID_CONTEXT).
        let ordinal = d.ordinal_of(&g, &uuid).ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        let dev_ptr = d.map_region(&mut g, ordinal, std::path::PathBuf::from(path), size)?;
        per_device.push(CustomStoragePerDevice {
            dev_ptr,
            size: usize::try_from(size).map_err(|_| CUDA_ERROR_UNKNOWN)?,
            stream: (driver::STREAM_BASE + ordinal) as *mut c_void,
        });
    }
    let count = c_uint::try_from(per_device.len()).map_err(|_| CUDA_ERROR_UNKNOWN)?;
    let op = Box::into_raw(Box::new(CustomOp {
        pid,
        info: CustomStorageInfo { handle: std::ptr::null_mut(), per_device: std::ptr::null_mut(), device_count: count },
        per_device,
    }));
    // SAFETY: `op` was just made by Box::into_raw and is only freed by cuCheckpointOperationComplete.
    unsafe {
        (*op).info.per_device = (*op).per_device.as_mut_ptr();
        (*op).info.handle = op.cast();
        Ok(&raw mut (*op).info)
    }
}

/// # Safety
/// `args` is NULL or points to a `CUcheckpointCheckpointArgs` (CUDA 13.4's layout; older ones are its zeroed form).
#[no_mangle]
pub unsafe extern "C" fn cuCheckpointProcessCheckpoint(pid: c_int, args: *const CheckpointArgs134) -> CuResult {
    guard(|| {
        // SAFETY: a non-NULL args points to a CUcheckpointCheckpointArgs, per cuda.h.
        let out = if args.is_null() { std::ptr::null_mut() } else { unsafe { (*args).custom_storage_info_out } };
        if out.is_null() {
            return call_target(pid, Op::Checkpoint, Duration::ZERO);
        }
        let info = custom_op(pid, Op::CheckpointCustom)?;
        // SAFETY: customStorageInfo_out points to the caller's CUcheckpointCustomStorageInfo pointer, per cuda.h.
        unsafe { *out = info };
        Ok(())
    })
}

/// `cuCheckpointOperationComplete` (CUDA 13.4): ends the custom-storage operation `handle` on its target and unmaps
/// its regions here.
///
/// # Safety
/// `handle` is the `handle` of a `CUcheckpointCustomStorageInfo` this double returned and not yet completed.
#[no_mangle]
pub unsafe extern "C" fn cuCheckpointOperationComplete(handle: *mut c_void) -> CuResult {
    guard(|| {
        if handle.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: per the contract above, `handle` is a CustomOp made by custom_op and not freed yet.
        let op = unsafe { Box::from_raw(handle.cast::<CustomOp>()) };
        let done = call_target(op.pid, Op::Complete, Duration::ZERO);
        let d = driver::get()?;
        let mut g = d.enter();
        for p in &op.per_device {
            d.unmap_region(&mut g, p.dev_ptr);
        }
        done
    })
}

/// `cuStreamGetCtx`: the context of a custom-storage region's stream (the primary context of its ordinal).
#[no_mangle]
pub extern "C" fn cuStreamGetCtx(stream: *mut c_void, ctx: *mut CuContext) -> CuResult {
    guard(|| {
        let d = driver::get()?;
        let _g = d.enter();
        let ordinal = (stream as usize).checked_sub(driver::STREAM_BASE).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if ordinal >= d.device_count() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        put(ctx, (CONTEXT_BASE + ordinal) as CuContext)
    })
}

/// # Safety
/// `args` is NULL or points to a `CUcheckpointRestoreArgs` (CUDA 13.4's layout; 13.0-13.3's with zeros after the
/// map) whose `gpuPairs` holds `gpuPairsCount` pairs.
#[no_mangle]
pub unsafe extern "C" fn cuCheckpointProcessRestore(pid: c_int, args: *const RestoreArgs134) -> CuResult {
    guard(|| {
        // Like the real driver, the restoring process must have initialised the driver itself.
        driver::get()?;
        let pairs = if args.is_null() {
            None
        } else {
            // SAFETY: a non-NULL args points to a CUcheckpointRestoreArgs, per cuda.h.
            let (ptr, count) = unsafe { ((*args).gpu_pairs, (*args).gpu_pairs_count as usize) };
            if count == 0 {
                None
            } else if ptr.is_null() {
                return Err(CUDA_ERROR_INVALID_VALUE);
            } else {
                // SAFETY: gpuPairs points to gpuPairsCount pairs, per cuda.h.
                let raw = unsafe { std::slice::from_raw_parts(ptr, count) };
                Some(raw.iter().map(|p| (SimUuid(p.old_uuid), SimUuid(p.new_uuid))).collect())
            }
        };
        // SAFETY: a non-NULL args points to a CUcheckpointRestoreArgs, per cuda.h.
        let out = if args.is_null() { std::ptr::null_mut() } else { unsafe { (*args).custom_storage_info_out } };
        if out.is_null() {
            return call_target(pid, Op::Restore { pairs }, Duration::ZERO);
        }
        let info = custom_op(pid, Op::RestoreCustom { pairs })?;
        // SAFETY: customStorageInfo_out points to the caller's CUcheckpointCustomStorageInfo pointer, per cuda.h.
        unsafe { *out = info };
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cuCheckpointProcessUnlock(pid: c_int, _args: *const c_void) -> CuResult {
    guard(|| call_target(pid, Op::Unlock, Duration::ZERO))
}
