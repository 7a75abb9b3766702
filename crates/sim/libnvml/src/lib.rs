//! **TEST DOUBLE of `libnvidia-ml.so.1` (NVML), for CI machines without GPUs. Never packaged,
//! never installed.**
//!
//! Loaded in place of NVIDIA's NVML (a copy or symlink named `libnvidia-ml.so.1` first on
//! `LD_LIBRARY_PATH`, or by path through `CRIU_CUDA_MIGRATE_LIBNVML`). It answers from the GPU set
//! in `CCM_SIM_CONFIG`, restricted to this process's container view `CCM_SIM_VISIBLE` (GPUs outside
//! it do not exist here: lookups answer NVML_ERROR_NOT_FOUND and indices are renumbered), and it
//! exports the functions nvml-wrapper 0.13 calls for init, counts, handles by index / UUID / PCI
//! bus id, PCI info, UUID, minor number, name, memory, index and compute processes (by the
//! caller's pids, with the simulated device memory each holds). NVML never sees a process's
//! CUDA state: after a remapped restore it keeps telling the truth about the machine, which is
//! how the stale PCI location in libcuda shows. See `docs/TEST-DOUBLES.md`.

// A test double of a C library: its casts are the C ABI's ints, sizes and counts of a few simulated
// GPUs, and it is never packaged; the workspace's cast lints are for the product.
#![allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap, clippy::cast_sign_loss)]

use std::ffi::{c_char, c_int, c_uint, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;

use ccm_sim_common::{process_view, Faults, SimConfig, SimGpu, SimPci, StateDir};

type NvmlReturn = c_int;

const NVML_SUCCESS: NvmlReturn = 0;
const NVML_ERROR_UNINITIALIZED: NvmlReturn = 1;
const NVML_ERROR_INVALID_ARGUMENT: NvmlReturn = 2;
const NVML_ERROR_NOT_FOUND: NvmlReturn = 6;
const NVML_ERROR_INSUFFICIENT_SIZE: NvmlReturn = 7;
const NVML_ERROR_DRIVER_NOT_LOADED: NvmlReturn = 9;
const NVML_ERROR_UNKNOWN: NvmlReturn = 999;

/// One visible GPU. A device handle (`nvmlDevice_t`) is the address of one of these.
pub struct Device {
    /// NVML index within this process's view.
    index: u32,
    gpu: SimGpu,
}

/// `nvmlPciInfo_t`.
#[repr(C)]
pub struct PciInfo {
    bus_id_legacy: [c_char; 16],
    domain: c_uint,
    bus: c_uint,
    device: c_uint,
    pci_device_id: c_uint,
    pci_subsystem_id: c_uint,
    bus_id: [c_char; 32],
}

/// `nvmlMemory_t`.
#[repr(C)]
pub struct Memory {
    total: u64,
    free: u64,
    used: u64,
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
pub struct MemoryV2 {
    version: c_uint,
    total: u64,
    reserved: u64,
    free: u64,
    used: u64,
}

const _: () = {
    assert!(std::mem::size_of::<PciInfo>() == 68);
    assert!(std::mem::size_of::<MemoryV2>() == 40);
};

struct Nvml {
    config: SimConfig,
    state_dir: Option<StateDir>,
    /// Leaked: handles must stay valid for the life of the process, even across nvmlShutdown.
    devices: &'static [Device],
}

/// The loaded GPU set; `count` is NVML's init reference count. Like the real NVML, the first init
/// after a full shutdown enumerates the GPUs again (a restored container's view may have changed:
/// its `/dev` now holds another GPU's node). Each enumeration is leaked, so handles stay valid.
struct Loaded {
    nvml: Option<&'static Nvml>,
    count: u32,
}

static NVML: Mutex<Loaded> = Mutex::new(Loaded { nvml: None, count: 0 });

fn load() -> Result<Nvml, String> {
    let config = SimConfig::from_env().map_err(|e| e.to_string())?;
    let view = process_view(&config).map_err(|e| e.to_string())?;
    let devices: Vec<Device> =
        view.iter().enumerate().map(|(i, &g)| Device { index: i as u32, gpu: config.gpus[g].clone() }).collect();
    Ok(Nvml { config, state_dir: StateDir::from_env().ok(), devices: Box::leak(devices.into_boxed_slice()) })
}

fn guard(f: impl FnOnce() -> Result<(), NvmlReturn>) -> NvmlReturn {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => NVML_SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => {
            eprintln!("nvml-test-double: internal error (panic); returning NVML_ERROR_UNKNOWN");
            NVML_ERROR_UNKNOWN
        }
    }
}

/// The state after a successful init, else NVML_ERROR_UNINITIALIZED.
fn nvml() -> Result<&'static Nvml, NvmlReturn> {
    let l = NVML.lock().unwrap_or_else(|p| p.into_inner());
    match l.nvml {
        Some(n) if l.count > 0 => Ok(n),
        _ => Err(NVML_ERROR_UNINITIALIZED),
    }
}

fn device(handle: *const Device) -> Result<&'static Device, NvmlReturn> {
    let n = nvml()?;
    n.devices.iter().find(|d| std::ptr::eq(*d, handle)).ok_or(NVML_ERROR_INVALID_ARGUMENT)
}

fn put<T>(out: *mut T, value: T) -> Result<(), NvmlReturn> {
    if out.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: the caller passed a non-NULL pointer to writable storage of T, per nvml.h.
    unsafe { out.write(value) };
    Ok(())
}

fn get<T: Copy>(p: *const T) -> Result<T, NvmlReturn> {
    if p.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: the caller passed a non-NULL pointer to a readable T, per nvml.h.
    Ok(unsafe { p.read() })
}

/// Writes element `i` of a caller's array of `len` elements.
fn put_nth<T>(array: *mut T, i: usize, len: usize, value: T) -> Result<(), NvmlReturn> {
    if array.is_null() || i >= len {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: the caller's array holds `len` > i elements of T, per nvml.h.
    unsafe { array.add(i).write(value) };
    Ok(())
}

/// Copies `text` and a NUL into a caller's buffer of `len` bytes; NVML refuses short buffers.
fn put_str(out: *mut c_char, len: c_uint, text: &str) -> Result<(), NvmlReturn> {
    if out.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    if text.len() + 1 > len as usize {
        return Err(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    // SAFETY: the buffer holds `len` >= text.len() + 1 bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr().cast::<c_char>(), out, text.len());
        out.add(text.len()).write(0);
    }
    Ok(())
}

fn fixed<const N: usize>(text: &str) -> [c_char; N] {
    let mut out = [0 as c_char; N];
    for (slot, b) in out.iter_mut().zip(text.bytes().take(N - 1)) {
        *slot = b as c_char;
    }
    out
}

fn c_text<'a>(p: *const c_char) -> Result<&'a str, NvmlReturn> {
    if p.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: the caller passes a NUL-terminated string, per nvml.h.
    unsafe { CStr::from_ptr(p) }.to_str().map_err(|_| NVML_ERROR_INVALID_ARGUMENT)
}

// ---- init ---------------------------------------------------------------------------------

fn init() -> Result<(), NvmlReturn> {
    let faults = Faults::current(StateDir::from_env().ok().as_ref());
    if faults.nvml_missing {
        return Err(NVML_ERROR_DRIVER_NOT_LOADED);
    }
    if let Some(ms) = faults.nvml_init_hang_ms {
        // A driver stuck in its init: the call returns after `ms`, or never (`None` inside).
        match ms {
            Some(ms) => std::thread::sleep(std::time::Duration::from_millis(ms)),
            None => loop {
                std::thread::sleep(std::time::Duration::from_secs(3600));
            },
        }
    }
    let mut l = NVML.lock().unwrap_or_else(|p| p.into_inner());
    if l.count == 0 {
        match load() {
            Ok(n) => l.nvml = Some(Box::leak(Box::new(n))),
            Err(e) => {
                eprintln!("nvml-test-double: nvmlInit failed: {e}");
                return Err(NVML_ERROR_DRIVER_NOT_LOADED);
            }
        }
    }
    l.count += 1;
    Ok(())
}

#[no_mangle]
pub extern "C" fn nvmlInit_v2() -> NvmlReturn {
    guard(init)
}

#[no_mangle]
pub extern "C" fn nvmlInit() -> NvmlReturn {
    guard(init)
}

#[no_mangle]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> NvmlReturn {
    guard(init)
}

#[no_mangle]
pub extern "C" fn nvmlShutdown() -> NvmlReturn {
    guard(|| {
        let mut l = NVML.lock().unwrap_or_else(|p| p.into_inner());
        if l.count == 0 {
            return Err(NVML_ERROR_UNINITIALIZED);
        }
        l.count -= 1;
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn nvmlErrorString(code: NvmlReturn) -> *const c_char {
    let text: &'static str = match code {
        NVML_SUCCESS => "Success\0",
        NVML_ERROR_UNINITIALIZED => "Uninitialized\0",
        NVML_ERROR_INVALID_ARGUMENT => "Invalid Argument\0",
        NVML_ERROR_NOT_FOUND => "Not Found\0",
        NVML_ERROR_INSUFFICIENT_SIZE => "Insufficient Size\0",
        NVML_ERROR_DRIVER_NOT_LOADED => "Driver Not Loaded\0",
        _ => "Unknown Error\0",
    };
    text.as_ptr().cast::<c_char>()
}

// ---- system -------------------------------------------------------------------------------

#[no_mangle]
pub extern "C" fn nvmlSystemGetDriverVersion(version: *mut c_char, len: c_uint) -> NvmlReturn {
    guard(|| put_str(version, len, &nvml()?.config.driver_version))
}

#[no_mangle]
pub extern "C" fn nvmlSystemGetCudaDriverVersion(version: *mut c_int) -> NvmlReturn {
    guard(|| put(version, nvml()?.config.cuda_driver_version))
}

#[no_mangle]
pub extern "C" fn nvmlSystemGetCudaDriverVersion_v2(version: *mut c_int) -> NvmlReturn {
    guard(|| put(version, nvml()?.config.cuda_driver_version))
}

// ---- handles ------------------------------------------------------------------------------

#[no_mangle]
pub extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> NvmlReturn {
    guard(|| put(count, nvml()?.devices.len() as c_uint))
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetHandleByIndex_v2(index: c_uint, out: *mut *const Device) -> NvmlReturn {
    guard(|| {
        let d = nvml()?.devices.get(index as usize).ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
        put(out, d as *const Device)
    })
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetHandleByUUID(uuid: *const c_char, out: *mut *const Device) -> NvmlReturn {
    guard(|| {
        let text = c_text(uuid)?;
        let wanted: ccm_sim_common::SimUuid = text.parse().map_err(|_| NVML_ERROR_INVALID_ARGUMENT)?;
        let d = nvml()?.devices.iter().find(|d| d.gpu.uuid == wanted).ok_or(NVML_ERROR_NOT_FOUND)?;
        put(out, d as *const Device)
    })
}

/// Accepts `0000:06:00.0`, `00000000:06:00.0` and `06:00.0`, in either case.
#[no_mangle]
pub extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(bus_id: *const c_char, out: *mut *const Device) -> NvmlReturn {
    guard(|| {
        let wanted = SimPci::parse(c_text(bus_id)?).ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
        let d = nvml()?.devices.iter().find(|d| d.gpu.pci() == wanted).ok_or(NVML_ERROR_NOT_FOUND)?;
        put(out, d as *const Device)
    })
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetHandleByPciBusId(bus_id: *const c_char, out: *mut *const Device) -> NvmlReturn {
    nvmlDeviceGetHandleByPciBusId_v2(bus_id, out)
}

// ---- device queries -----------------------------------------------------------------------

#[no_mangle]
pub extern "C" fn nvmlDeviceGetPciInfo_v3(handle: *const Device, out: *mut PciInfo) -> NvmlReturn {
    guard(|| {
        let g = &device(handle)?.gpu;
        let pci = g.pci();
        put(
            out,
            PciInfo {
                bus_id_legacy: fixed(&pci.to_cuda_string()),
                domain: g.pci_domain,
                bus: g.pci_bus,
                device: g.pci_device,
                pci_device_id: g.pci_device_id,
                pci_subsystem_id: g.pci_subsystem_id,
                bus_id: fixed(&pci.to_nvml_string()),
            },
        )
    })
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetUUID(handle: *const Device, uuid: *mut c_char, len: c_uint) -> NvmlReturn {
    guard(|| put_str(uuid, len, &device(handle)?.gpu.uuid.to_string()))
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetMinorNumber(handle: *const Device, minor: *mut c_uint) -> NvmlReturn {
    guard(|| put(minor, device(handle)?.gpu.minor))
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetName(handle: *const Device, name: *mut c_char, len: c_uint) -> NvmlReturn {
    guard(|| put_str(name, len, &device(handle)?.gpu.name))
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetIndex(handle: *const Device, index: *mut c_uint) -> NvmlReturn {
    guard(|| put(index, device(handle)?.index))
}

/// Used memory is what all simulated processes hold on the GPU (their allocation files).
fn memory(d: &Device) -> (u64, u64) {
    let used = nvml().ok().and_then(|n| n.state_dir.as_ref()).map_or(0, |s| s.used_bytes(&d.gpu.uuid));
    (d.gpu.memory_total, used.min(d.gpu.memory_total))
}

/// `nvmlProcessInfo_t` (v2/v3 layout).
#[repr(C)]
pub struct ProcessInfo {
    pid: c_uint,
    used_gpu_memory: u64,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
}

const _: () = assert!(std::mem::size_of::<ProcessInfo>() == 24);

/// The simulated processes holding memory on `d`, by the pid this caller's `/proc` gives them
/// (found through the registry's index: each process keeps `proc-<key>` pointing at itself).
fn compute_processes(d: &Device) -> Vec<ProcessInfo> {
    let Some(state) = nvml().ok().and_then(|n| n.state_dir.as_ref()) else { return Vec::new() };
    let owners = state.used_bytes_by_owner(&d.gpu.uuid);
    if owners.is_empty() {
        return Vec::new();
    }
    let mut out = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else { return out };
    for e in procs.filter_map(Result::ok) {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        let Some(reg) = ccm_sim_common::pidns::key_of(pid).ok().and_then(|k| state.follow(&k)) else { continue };
        if let Some((_, bytes)) = owners.iter().find(|(o, _)| *o == reg.id_text()) {
            out.push(ProcessInfo {
                pid: pid as c_uint,
                used_gpu_memory: *bytes,
                gpu_instance_id: u32::MAX,
                compute_instance_id: u32::MAX,
            });
        }
    }
    out
}

/// NVML's contract: with `*count` too small (or `infos` NULL) it sets `*count` to what is needed
/// and answers NVML_ERROR_INSUFFICIENT_SIZE.
#[no_mangle]
pub extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    handle: *const Device,
    count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> NvmlReturn {
    guard(|| {
        let d = device(handle)?;
        if count.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        let list = compute_processes(d);
        let room = get(count)? as usize;
        put(count, list.len() as c_uint)?;
        if list.is_empty() {
            return Ok(());
        }
        if infos.is_null() || room < list.len() {
            return Err(NVML_ERROR_INSUFFICIENT_SIZE);
        }
        for (i, p) in list.into_iter().enumerate() {
            put_nth(infos, i, room, p)?;
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetMemoryInfo(handle: *const Device, out: *mut Memory) -> NvmlReturn {
    guard(|| {
        let (total, used) = memory(device(handle)?);
        put(out, Memory { total, free: total - used, used })
    })
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetMemoryInfo_v2(handle: *const Device, out: *mut MemoryV2) -> NvmlReturn {
    guard(|| {
        let (total, used) = memory(device(handle)?);
        // NVML_STRUCT_VERSION(Memory, 2): size | version << 24.
        let version = std::mem::size_of::<MemoryV2>() as c_uint | (2 << 24);
        put(out, MemoryV2 { version, total, reserved: 0, free: total - used, used })
    })
}
