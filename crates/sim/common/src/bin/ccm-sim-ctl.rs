//! `ccm-sim-ctl`: a TEST tool that drives the checkpoint API of `libcuda.so.1` (the test double,
//! or the real driver) on another process, like NVIDIA's `cuda-checkpoint`.
//!
//! ```text
//! ccm-sim-ctl PID tid | state | lock [TIMEOUT_MS] | checkpoint | lockckpt [TIMEOUT_MS]
//!             | restore [OLD=NEW[,OLD=NEW...] | swap] | unlock
//!             | custom-checkpoint FILE | custom-restore FILE [OLD=NEW,... | swap]
//! ```
//! `custom-checkpoint` and `custom-restore` use the driver's custom storage (CUDA 13.4, `ccm_driver::custom_storage`):
//! the device memory of a LOCKED process goes into FILE (`REGIONS` line, one size line per GPU region, then the
//! regions' bytes) and comes back from it onto the GPUs the map names.
//! `restore swap` pairs the GPU set's GPUs in reverse order (G0->G1, G1->G0 on two GPUs); the set is
//! read from `CCM_SIM_CONFIG`. Prints one `CTL` line per call; exits 0 when every call succeeded,
//! 1 when a call failed (its CUresult is printed), 2 on bad usage.

use std::process::ExitCode;
use std::time::Instant;

use ccm_driver::checkpoint::{CheckpointApi, ProcessState};
use ccm_driver::cuda::LoadError;
use ccm_driver::custom_storage::CustomStorageApi;
use ccm_driver::{CudaError, Libcuda};
use ccm_identity::GpuUuid;
use ccm_sim_common::dl::libcuda_path;
use ccm_sim_common::{SimConfig, SimError, SimUuid};

const USAGE: &str =
    "usage: ccm-sim-ctl PID tid|state|lock [MS]|checkpoint|lockckpt [MS]|restore [OLD=NEW,...|swap]|unlock\
                     |custom-checkpoint FILE|custom-restore FILE [OLD=NEW,...|swap]";

/// The controller: the project's own driver wrapper (`ccm_driver`), so the test double is driven
/// through exactly the calls the plugin makes.
struct Ctl {
    api: CheckpointApi,
    failed: bool,
}

fn state_code(s: ProcessState) -> i32 {
    match s {
        ProcessState::Running => 0,
        ProcessState::Locked => 1,
        ProcessState::Checkpointed => 2,
        ProcessState::Failed => 3,
        ProcessState::Checkpointing => 4,
        ProcessState::Restoring => 5,
        ProcessState::Other(v) => v,
    }
}

impl Ctl {
    fn report<T>(&mut self, what: &str, r: &Result<T, CudaError>, started: Instant) {
        let (code, name) = match r {
            Ok(_) => (0, "CUDA_SUCCESS".to_string()),
            Err(e) => (e.code.raw(), e.name.clone()),
        };
        println!("CTL {what} -> {code} {name} ({:.3}s)", started.elapsed().as_secs_f64());
        if code != 0 {
            self.failed = true;
        }
    }

    fn tid(&mut self, pid: i32) {
        let t = Instant::now();
        let r = self.api.restore_thread_id(pid);
        self.report("cuCheckpointProcessGetRestoreThreadId", &r, t);
        if let Ok(tid) = r {
            println!("CTL restore_tid={tid}");
        }
    }

    fn state(&mut self, pid: i32) {
        let t = Instant::now();
        let r = self.api.state(pid);
        self.report("cuCheckpointProcessGetState", &r, t);
        if let Ok(s) = r {
            println!("CTL state={}", state_code(s));
        }
    }

    fn call(&mut self, what: &str, f: impl FnOnce(&CheckpointApi) -> Result<(), CudaError>) {
        let t = Instant::now();
        let r = f(&self.api);
        self.report(what, &r, t);
    }

    fn restore(&mut self, pid: i32, pairs: &[(SimUuid, SimUuid)]) {
        for (o, n) in pairs {
            println!("CTL pair {o} -> {n}");
        }
        let pairs: Vec<(GpuUuid, GpuUuid)> =
            pairs.iter().map(|(o, n)| (GpuUuid::from_bytes(o.0), GpuUuid::from_bytes(n.0))).collect();
        self.call("cuCheckpointProcessRestore", |api| api.restore(pid, &pairs));
    }
}

/// The custom-storage copies of `custom-checkpoint` / `custom-restore`, in 1 MiB pieces.
const PIECE: usize = 1 << 20;

/// Why `custom-checkpoint` or `custom-restore` could not move the device memory (the driver's own failures are
/// `CTL` lines).
#[derive(Debug, thiserror::Error)]
enum CustomFileError {
    #[error("{file}: {source}")]
    File { file: String, source: std::io::Error },
    #[error("{0}: not a custom-storage file of ccm-sim-ctl (a `REGIONS N` line, then N sizes)")]
    Format(String),
    #[error("{0}: cut short")]
    Short(String),
    #[error("the driver's regions {driver:?} are not the file's {file:?}")]
    Regions { driver: Vec<u64>, file: Vec<u64> },
    #[error(transparent)]
    Copy(#[from] CudaError),
}

/// `custom-checkpoint FILE`: the regions the driver maps here, written to FILE, then the operation completed.
fn custom_checkpoint(ctl: &mut Ctl, api: &CustomStorageApi, pid: i32, file: &str) -> Result<(), CustomFileError> {
    let t = Instant::now();
    let op = api.checkpoint(pid);
    ctl.report("cuCheckpointProcessCheckpoint(custom storage)", &op, t);
    let Ok(op) = op else { return Ok(()) };
    let mut out = format!("REGIONS {}\n", op.regions.len()).into_bytes();
    for r in &op.regions {
        out.extend_from_slice(format!("{}\n", r.size).as_bytes());
    }
    let mut buf = vec![0u8; PIECE];
    for (i, r) in op.regions.clone().iter().enumerate() {
        let mut at = 0u64;
        while at < r.size {
            let n = PIECE.min(usize::try_from(r.size - at).unwrap_or(PIECE));
            op.read(i, at, &mut buf[..n])?;
            out.extend_from_slice(&buf[..n]);
            at += n as u64;
        }
    }
    std::fs::write(file, &out).map_err(|source| CustomFileError::File { file: file.into(), source })?;
    println!("CTL custom regions={} bytes={}", op.regions.len(), op.regions.iter().map(|r| r.size).sum::<u64>());
    let t = Instant::now();
    let done = op.complete();
    ctl.report("cuCheckpointOperationComplete", &done, t);
    Ok(())
}

/// `custom-restore FILE [PAIRS]`: the regions the driver maps here filled from FILE (their count and sizes must be
/// FILE's), then the operation completed.
fn custom_restore(
    ctl: &mut Ctl,
    api: &CustomStorageApi,
    pid: i32,
    file: &str,
    pairs: &[(GpuUuid, GpuUuid)],
) -> Result<(), CustomFileError> {
    let bytes = std::fs::read(file).map_err(|source| CustomFileError::File { file: file.into(), source })?;
    let mut lines = bytes.split(|b| *b == b'\n');
    let head = String::from_utf8_lossy(lines.next().unwrap_or_default()).into_owned();
    let format = || CustomFileError::Format(file.into());
    let n: usize = head.strip_prefix("REGIONS ").and_then(|v| v.parse().ok()).ok_or_else(format)?;
    let mut sizes = Vec::new();
    for _ in 0..n {
        let l = String::from_utf8_lossy(lines.next().unwrap_or_default()).into_owned();
        sizes.push(l.parse::<u64>().map_err(|_| format())?);
    }
    let header = head.len() + 1 + sizes.iter().map(|s| s.to_string().len() + 1).sum::<usize>();
    let t = Instant::now();
    let op = api.restore(pid, pairs);
    ctl.report("cuCheckpointProcessRestore(custom storage)", &op, t);
    let Ok(op) = op else { return Ok(()) };
    let got: Vec<u64> = op.regions.iter().map(|r| r.size).collect();
    if got != sizes {
        return Err(CustomFileError::Regions { driver: got, file: sizes });
    }
    let mut at_file = header;
    for (i, size) in sizes.iter().enumerate() {
        let mut at = 0u64;
        while at < *size {
            let n = PIECE.min(usize::try_from(size - at).unwrap_or(PIECE));
            let piece = bytes.get(at_file..at_file + n).ok_or_else(|| CustomFileError::Short(file.into()))?;
            op.write(i, at, piece)?;
            at += n as u64;
            at_file += n;
        }
    }
    let t = Instant::now();
    let done = op.complete();
    ctl.report("cuCheckpointOperationComplete", &done, t);
    Ok(())
}

/// Why `ccm-sim-ctl` could not make its calls (exit 2): the arguments, the GPU set or the library.
#[derive(Debug, thiserror::Error)]
enum CtlError {
    #[error("{USAGE}")]
    Usage,
    #[error("`{0}` is not a pid")]
    Pid(String),
    #[error("`{0}` is not a timeout in ms")]
    Timeout(String),
    #[error("`{0}` is not OLD=NEW")]
    Pair(String),
    /// A UUID of a pair, or the GPU set `swap` reads (`CCM_SIM_CONFIG`).
    #[error(transparent)]
    Sim(#[from] SimError),
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    CustomFile(#[from] CustomFileError),
}

fn parse_pairs(spec: &str) -> Result<Vec<(SimUuid, SimUuid)>, CtlError> {
    if spec == "swap" {
        let config = SimConfig::from_env()?;
        let n = config.gpus.len();
        return Ok((0..n).map(|i| (config.gpus[i].uuid, config.gpus[n - 1 - i].uuid)).collect());
    }
    spec.split(',')
        .filter(|s| !s.is_empty())
        .map(|p| {
            let (o, n) = p.split_once('=').ok_or_else(|| CtlError::Pair(p.to_string()))?;
            Ok((o.parse()?, n.parse()?))
        })
        .collect()
}

fn run(args: &[String]) -> Result<bool, CtlError> {
    let (pid, op) = match args {
        [pid, op, ..] => (pid.parse::<i32>().map_err(|_| CtlError::Pid(pid.clone()))?, op.as_str()),
        _ => return Err(CtlError::Usage),
    };
    let rest = &args[2..];
    let lib = Libcuda::load_from(&libcuda_path())?;
    let api = CheckpointApi::new(&lib)?;
    let mut ctl = Ctl { api, failed: false };
    let t = Instant::now();
    // The restoring process must have initialised the driver.
    let r = lib.init();
    ctl.report("cuInit", &r, t);
    let timeout =
        |i: usize| rest.get(i).map_or(Ok(10_000), |v| v.parse::<u32>().map_err(|_| CtlError::Timeout(v.clone())));
    match op {
        "tid" => ctl.tid(pid),
        "state" => ctl.state(pid),
        "lock" => {
            let ms = timeout(0)?;
            ctl.call("cuCheckpointProcessLock", |api| api.lock(pid, ms));
        }
        "checkpoint" => ctl.call("cuCheckpointProcessCheckpoint", |api| api.checkpoint(pid)),
        "lockckpt" => {
            let ms = timeout(0)?;
            ctl.call("cuCheckpointProcessLock", |api| api.lock(pid, ms));
            if !ctl.failed {
                ctl.call("cuCheckpointProcessCheckpoint", |api| api.checkpoint(pid));
            }
            ctl.state(pid);
        }
        "restore" => {
            let pairs = match rest.first() {
                Some(spec) => parse_pairs(spec)?,
                None => Vec::new(),
            };
            ctl.restore(pid, &pairs);
            ctl.state(pid);
        }
        "unlock" => {
            ctl.call("cuCheckpointProcessUnlock", |api| api.unlock(pid));
            ctl.state(pid);
        }
        "custom-checkpoint" | "custom-restore" => {
            let file = rest.first().ok_or(CtlError::Usage)?;
            let Some(custom) = CustomStorageApi::new(&lib) else {
                println!(
                    "CTL custom storage: not offered by this driver (CUDA 13.4 and cuCheckpointOperationComplete)"
                );
                return Ok(false);
            };
            let t = Instant::now();
            let r = custom.retain_contexts();
            ctl.report("cuDevicePrimaryCtxRetain (every GPU)", &r, t);
            if op == "custom-checkpoint" {
                custom_checkpoint(&mut ctl, &custom, pid, file)?;
            } else {
                let pairs: Vec<(GpuUuid, GpuUuid)> = match rest.get(1) {
                    Some(spec) => parse_pairs(spec)?
                        .iter()
                        .map(|(o, n)| (GpuUuid::from_bytes(o.0), GpuUuid::from_bytes(n.0)))
                        .collect(),
                    None => Vec::new(),
                };
                custom_restore(&mut ctl, &custom, pid, file, &pairs)?;
            }
            ctl.state(pid);
        }
        _ => return Err(CtlError::Usage),
    }
    Ok(!ctl.failed)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if matches!(args.first().map(String::as_str), Some("--help" | "-h")) {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("ccm-sim-ctl: {e}");
            ExitCode::from(2)
        }
    }
}
