//! `ccm-sim-ctl`: a TEST tool that drives the checkpoint API of `libcuda.so.1` (the test double,
//! or the real driver) on another process, like NVIDIA's `cuda-checkpoint`.
//!
//! ```text
//! ccm-sim-ctl PID tid | state | lock [TIMEOUT_MS] | checkpoint | lockckpt [TIMEOUT_MS]
//!             | restore [OLD=NEW[,OLD=NEW...] | swap] | unlock
//! ```
//! `restore swap` pairs the GPU set's GPUs in reverse order (G0->G1, G1->G0 on two GPUs); the set is
//! read from `CCM_SIM_CONFIG`. Prints one `CTL` line per call; exits 0 when every call succeeded,
//! 1 when a call failed (its CUresult is printed), 2 on bad usage.

use std::ffi::{c_int, c_uint, c_void};
use std::process::ExitCode;
use std::time::Instant;

use ccm_sim_common::dl::{cuda_error_name, libcuda_path, Lib};
use ccm_sim_common::{SimConfig, SimUuid};

#[repr(C)]
struct LockArgs {
    timeout_ms: c_uint,
    reserved0: c_uint,
    reserved1: [u64; 7],
}

#[repr(C)]
struct GpuPair {
    old_uuid: [u8; 16],
    new_uuid: [u8; 16],
}

#[repr(C)]
struct RestoreArgs {
    gpu_pairs: *const GpuPair,
    gpu_pairs_count: c_uint,
    reserved: [u8; 44],
    reserved1: u64,
}

type PidOutFn = unsafe extern "C" fn(c_int, *mut c_int) -> c_int;
type LockFn = unsafe extern "C" fn(c_int, *const LockArgs) -> c_int;
type PlainFn = unsafe extern "C" fn(c_int, *const c_void) -> c_int;
type RestoreFn = unsafe extern "C" fn(c_int, *const RestoreArgs) -> c_int;
type InitFn = unsafe extern "C" fn(c_uint) -> c_int;

const USAGE: &str =
    "usage: ccm-sim-ctl PID tid|state|lock [MS]|checkpoint|lockckpt [MS]|restore [OLD=NEW,...|swap]|unlock";

struct Ctl {
    lib: Lib,
    failed: bool,
}

impl Ctl {
    fn report(&mut self, what: &str, code: c_int, started: Instant) {
        println!("CTL {what} -> {code} {} ({:.3}s)", cuda_error_name(&self.lib, code), started.elapsed().as_secs_f64());
        if code != 0 {
            self.failed = true;
        }
    }

    fn pid_out(&mut self, name: &str, label: &str, pid: c_int) -> Result<(), String> {
        // SAFETY: both functions take (int pid, int *out) in cuda.h.
        let f: PidOutFn = unsafe { self.lib.get(name) }.map_err(|e| e.to_string())?;
        let mut out: c_int = -1;
        let t = Instant::now();
        // SAFETY: writes one int.
        let r = unsafe { f(pid, &mut out) };
        self.report(name, r, t);
        if r == 0 {
            println!("CTL {label}={out}");
        }
        Ok(())
    }

    fn lock(&mut self, pid: c_int, timeout_ms: u32) -> Result<(), String> {
        // SAFETY: cuCheckpointProcessLock(int, CUcheckpointLockArgs*).
        let f: LockFn = unsafe { self.lib.get("cuCheckpointProcessLock") }.map_err(|e| e.to_string())?;
        let args = LockArgs { timeout_ms, reserved0: 0, reserved1: [0; 7] };
        let t = Instant::now();
        // SAFETY: args is a valid 64-byte CUcheckpointLockArgs.
        let r = unsafe { f(pid, &args) };
        self.report("cuCheckpointProcessLock", r, t);
        Ok(())
    }

    fn plain(&mut self, name: &str, pid: c_int) -> Result<(), String> {
        // SAFETY: checkpoint and unlock take (int, args*) and accept NULL args.
        let f: PlainFn = unsafe { self.lib.get(name) }.map_err(|e| e.to_string())?;
        let t = Instant::now();
        // SAFETY: NULL args are allowed.
        let r = unsafe { f(pid, std::ptr::null()) };
        self.report(name, r, t);
        Ok(())
    }

    fn restore(&mut self, pid: c_int, pairs: &[(SimUuid, SimUuid)]) -> Result<(), String> {
        // SAFETY: cuCheckpointProcessRestore(int, CUcheckpointRestoreArgs*).
        let f: RestoreFn = unsafe { self.lib.get("cuCheckpointProcessRestore") }.map_err(|e| e.to_string())?;
        let raw: Vec<GpuPair> = pairs.iter().map(|(o, n)| GpuPair { old_uuid: o.0, new_uuid: n.0 }).collect();
        let args = RestoreArgs {
            gpu_pairs: raw.as_ptr(),
            gpu_pairs_count: raw.len() as c_uint,
            reserved: [0; 44],
            reserved1: 0,
        };
        for (o, n) in pairs {
            println!("CTL pair {o} -> {n}");
        }
        let t = Instant::now();
        // SAFETY: args points to `raw`, alive for the call; NULL args when there are no pairs.
        let r = unsafe { f(pid, if raw.is_empty() { std::ptr::null() } else { &args }) };
        self.report("cuCheckpointProcessRestore", r, t);
        Ok(())
    }
}

fn parse_pairs(spec: &str) -> Result<Vec<(SimUuid, SimUuid)>, String> {
    if spec == "swap" {
        let config = SimConfig::from_env().map_err(|e| e.to_string())?;
        let n = config.gpus.len();
        return Ok((0..n).map(|i| (config.gpus[i].uuid, config.gpus[n - 1 - i].uuid)).collect());
    }
    spec.split(',')
        .filter(|s| !s.is_empty())
        .map(|p| {
            let (o, n) = p.split_once('=').ok_or_else(|| format!("`{p}` is not OLD=NEW"))?;
            Ok((
                o.parse().map_err(|e: ccm_sim_common::SimError| e.to_string())?,
                n.parse().map_err(|e: ccm_sim_common::SimError| e.to_string())?,
            ))
        })
        .collect()
}

fn run(args: &[String]) -> Result<bool, String> {
    let (pid, op) = match args {
        [pid, op, ..] => (pid.parse::<c_int>().map_err(|_| format!("`{pid}` is not a pid"))?, op.as_str()),
        _ => return Err(USAGE.to_string()),
    };
    let rest = &args[2..];
    let lib = Lib::open(&libcuda_path()).map_err(|e| e.to_string())?;
    let mut ctl = Ctl { lib, failed: false };
    // SAFETY: cuInit(unsigned int).
    let init: InitFn = unsafe { ctl.lib.get("cuInit") }.map_err(|e| e.to_string())?;
    let t = Instant::now();
    // SAFETY: plain call; the restoring process must have initialised the driver.
    let r = unsafe { init(0) };
    ctl.report("cuInit", r, t);
    let timeout = |i: usize| {
        rest.get(i).map_or(Ok(10_000), |v| v.parse::<u32>().map_err(|_| format!("`{v}` is not a timeout in ms")))
    };
    match op {
        "tid" => ctl.pid_out("cuCheckpointProcessGetRestoreThreadId", "restore_tid", pid)?,
        "state" => ctl.pid_out("cuCheckpointProcessGetState", "state", pid)?,
        "lock" => ctl.lock(pid, timeout(0)?)?,
        "checkpoint" => ctl.plain("cuCheckpointProcessCheckpoint", pid)?,
        "lockckpt" => {
            ctl.lock(pid, timeout(0)?)?;
            if !ctl.failed {
                ctl.plain("cuCheckpointProcessCheckpoint", pid)?;
            }
            ctl.pid_out("cuCheckpointProcessGetState", "state", pid)?;
        }
        "restore" => {
            let pairs = match rest.first() {
                Some(spec) => parse_pairs(spec)?,
                None => Vec::new(),
            };
            ctl.restore(pid, &pairs)?;
            ctl.pid_out("cuCheckpointProcessGetState", "state", pid)?;
        }
        "unlock" => {
            ctl.plain("cuCheckpointProcessUnlock", pid)?;
            ctl.pid_out("cuCheckpointProcessGetState", "state", pid)?;
        }
        _ => return Err(USAGE.to_string()),
    }
    Ok(!ctl.failed)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("ccm-sim-ctl: {e}");
            ExitCode::from(2)
        }
    }
}
