//! `ccm-sim-target`: a TEST process for the test doubles (or the real driver): it uses the app
//! side of `libcuda.so.1`, keeps data in device memory, waits, then reports what every identity
//! API says and whether the data survived.
//!
//! ```text
//! ccm-sim-target --go FILE [--bytes N]
//! ```
//! At start: allocates N bytes (default 1 MiB) on ordinal 0, fills them, prints `BEFORE` report
//! lines and `READY pid=PID`. Then it polls for FILE (holding no descriptor) and, once it exists,
//! prints `AFTER` report lines and `DATA intact|CORRUPT`, and exits 0 (1 if the data is corrupt).
//! A report line per ordinal:
//! `PHASE ordinal=0 cuda_uuid=GPU-.. cuda_bus_id=0000:06:00.0 attr_bus_id=0000:06:00.0 nvml_uuid_at_bus_id=GPU-..|NOT_FOUND agree=yes|no`.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use ccm_sim_common::dl::{cuda_error_name, libcuda_path, libnvml_path, Lib};
use ccm_sim_common::SimUuid;

const FILL: u32 = 0x5eed_c0de;

struct Cuda {
    lib: Lib,
    device_count: unsafe extern "C" fn(*mut c_int) -> c_int,
    bus_id: unsafe extern "C" fn(*mut c_char, c_int, c_int) -> c_int,
    uuid: unsafe extern "C" fn(*mut [u8; 16], c_int) -> c_int,
    attribute: unsafe extern "C" fn(*mut c_int, c_int, c_int) -> c_int,
    dtoh: unsafe extern "C" fn(*mut c_void, u64, usize) -> c_int,
}

struct Nvml {
    by_bus_id: unsafe extern "C" fn(*const c_char, *mut *mut c_void) -> c_int,
    uuid: unsafe extern "C" fn(*mut c_void, *mut c_char, c_uint) -> c_int,
    _lib: Lib,
}

impl Cuda {
    fn check(&self, call: &str, code: c_int) -> Result<(), String> {
        if code == 0 {
            Ok(())
        } else {
            Err(format!("{call} failed: {} ({code})", cuda_error_name(&self.lib, code)))
        }
    }
}

fn load_cuda() -> Result<Cuda, String> {
    let lib = Lib::open(&libcuda_path()).map_err(|e| e.to_string())?;
    // SAFETY: every type below is the cuda.h signature of the named function.
    unsafe {
        Ok(Cuda {
            device_count: lib.get("cuDeviceGetCount").map_err(|e| e.to_string())?,
            bus_id: lib.get("cuDeviceGetPCIBusId").map_err(|e| e.to_string())?,
            uuid: lib.get("cuDeviceGetUuid_v2").map_err(|e| e.to_string())?,
            attribute: lib.get("cuDeviceGetAttribute").map_err(|e| e.to_string())?,
            dtoh: lib.get("cuMemcpyDtoH_v2").map_err(|e| e.to_string())?,
            lib,
        })
    }
}

fn load_nvml() -> Result<Nvml, String> {
    let lib = Lib::open(&libnvml_path()).map_err(|e| e.to_string())?;
    // SAFETY: nvml.h signatures.
    unsafe {
        let init: unsafe extern "C" fn() -> c_int = lib.get("nvmlInit_v2").map_err(|e| e.to_string())?;
        let r = init();
        if r != 0 {
            return Err(format!("nvmlInit_v2 failed ({r})"));
        }
        Ok(Nvml {
            by_bus_id: lib.get("nvmlDeviceGetHandleByPciBusId_v2").map_err(|e| e.to_string())?,
            uuid: lib.get("nvmlDeviceGetUUID").map_err(|e| e.to_string())?,
            _lib: lib,
        })
    }
}

fn report(phase: &str, cuda: &Cuda, nvml: Option<&Nvml>) -> Result<bool, String> {
    let mut count: c_int = 0;
    // SAFETY: writes one int.
    cuda.check("cuDeviceGetCount", unsafe { (cuda.device_count)(&mut count) })?;
    let mut all_agree = true;
    for ordinal in 0..count {
        let mut bus = [0 as c_char; 32];
        // SAFETY: a 32-byte buffer.
        cuda.check("cuDeviceGetPCIBusId", unsafe { (cuda.bus_id)(bus.as_mut_ptr(), 32, ordinal) })?;
        // SAFETY: NUL-terminated by the driver.
        let bus_id = unsafe { CStr::from_ptr(bus.as_ptr()) }.to_string_lossy().into_owned();
        let mut uuid = [0u8; 16];
        // SAFETY: a 16-byte CUuuid.
        cuda.check("cuDeviceGetUuid_v2", unsafe { (cuda.uuid)(&mut uuid, ordinal) })?;
        let cuda_uuid = SimUuid(uuid).to_string();
        let mut attrs = [0 as c_int; 3];
        for (slot, attr) in attrs.iter_mut().zip([50, 33, 34]) {
            // SAFETY: writes one int.
            cuda.check("cuDeviceGetAttribute", unsafe { (cuda.attribute)(slot, attr, ordinal) })?;
        }
        let attr_bus_id = format!("{:04X}:{:02X}:{:02X}.0", attrs[0], attrs[1], attrs[2]);
        let nvml_uuid = match nvml {
            None => "NVML_UNAVAILABLE".to_string(),
            Some(n) => {
                let mut handle: *mut c_void = std::ptr::null_mut();
                // SAFETY: `bus` is NUL-terminated; writes one handle.
                let r = unsafe { (n.by_bus_id)(bus.as_ptr(), &mut handle) };
                if r == 6 {
                    "NOT_FOUND".to_string()
                } else if r != 0 {
                    format!("NVML_ERROR_{r}")
                } else {
                    let mut text = [0 as c_char; 96];
                    // SAFETY: a 96-byte buffer and a handle NVML gave out.
                    let r = unsafe { (n.uuid)(handle, text.as_mut_ptr(), 96) };
                    if r != 0 {
                        format!("NVML_ERROR_{r}")
                    } else {
                        // SAFETY: NUL-terminated by NVML.
                        unsafe { CStr::from_ptr(text.as_ptr()) }.to_string_lossy().into_owned()
                    }
                }
            }
        };
        let agree = nvml_uuid == cuda_uuid && attr_bus_id == bus_id;
        all_agree &= agree;
        println!(
            "{phase} ordinal={ordinal} cuda_uuid={cuda_uuid} cuda_bus_id={bus_id} attr_bus_id={attr_bus_id} nvml_uuid_at_bus_id={nvml_uuid} agree={}",
            if agree { "yes" } else { "no" }
        );
    }
    Ok(all_agree)
}

fn run(go: PathBuf, bytes: usize) -> Result<bool, String> {
    let cuda = load_cuda()?;
    let nvml = match load_nvml() {
        Ok(n) => Some(n),
        Err(e) => {
            eprintln!("ccm-sim-target: no NVML: {e}");
            None
        }
    };
    // SAFETY: every type below is the cuda.h signature of the named function.
    let (init, retain, set_current, alloc, memset) = unsafe {
        let l = &cuda.lib;
        let e = |e: ccm_sim_common::dl::DlError| e.to_string();
        (
            l.get::<unsafe extern "C" fn(c_uint) -> c_int>("cuInit").map_err(e)?,
            l.get::<unsafe extern "C" fn(*mut *mut c_void, c_int) -> c_int>("cuDevicePrimaryCtxRetain").map_err(e)?,
            l.get::<unsafe extern "C" fn(*mut c_void) -> c_int>("cuCtxSetCurrent").map_err(e)?,
            l.get::<unsafe extern "C" fn(*mut u64, usize) -> c_int>("cuMemAlloc_v2").map_err(e)?,
            l.get::<unsafe extern "C" fn(u64, c_uint, usize) -> c_int>("cuMemsetD32_v2").map_err(e)?,
        )
    };
    let words = bytes / 4;
    let mut ctx: *mut c_void = std::ptr::null_mut();
    let mut dptr: u64 = 0;
    // SAFETY: plain driver calls with valid out-pointers.
    unsafe {
        cuda.check("cuInit", init(0))?;
        cuda.check("cuDevicePrimaryCtxRetain", retain(&mut ctx, 0))?;
        cuda.check("cuCtxSetCurrent", set_current(ctx))?;
        cuda.check("cuMemAlloc_v2", alloc(&mut dptr, words * 4))?;
        cuda.check("cuMemsetD32_v2", memset(dptr, FILL, words))?;
    }
    report("BEFORE", &cuda, nvml.as_ref())?;
    println!("READY pid={}", std::process::id());
    while !go.exists() {
        std::thread::sleep(Duration::from_millis(20));
    }
    let agree = report("AFTER", &cuda, nvml.as_ref())?;
    let mut host = vec![0u8; words * 4];
    // SAFETY: `host` holds words * 4 bytes.
    cuda.check("cuMemcpyDtoH_v2", unsafe { (cuda.dtoh)(host.as_mut_ptr().cast::<c_void>(), dptr, host.len()) })?;
    let intact = host.chunks_exact(4).all(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]]) == FILL);
    println!("DATA {}", if intact { "intact" } else { "CORRUPT" });
    println!("IDENTITY {}", if agree { "agree" } else { "DISAGREE" });
    Ok(intact)
}

fn main() -> ExitCode {
    let mut go = None;
    let mut bytes = 1 << 20;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--help" || a == "-h" {
            println!("usage: ccm-sim-target --go FILE [--bytes N]");
            return ExitCode::SUCCESS;
        }
        match (a.as_str(), args.next()) {
            ("--go", Some(v)) => go = Some(PathBuf::from(v)),
            ("--bytes", Some(v)) => match v.parse::<usize>() {
                Ok(n) if n >= 4 => bytes = n,
                _ => {
                    eprintln!("ccm-sim-target: --bytes wants a number of bytes (at least 4), got `{v}`");
                    return ExitCode::from(2);
                }
            },
            _ => {
                eprintln!("usage: ccm-sim-target --go FILE [--bytes N]");
                return ExitCode::from(2);
            }
        }
    }
    let Some(go) = go else {
        eprintln!("usage: ccm-sim-target --go FILE [--bytes N]");
        return ExitCode::from(2);
    };
    match run(go, bytes) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("ccm-sim-target: {e}");
            ExitCode::from(3)
        }
    }
}
