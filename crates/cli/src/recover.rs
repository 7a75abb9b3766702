//! `recover --pid N`: bring a process a failed run left LOCKED or CHECKPOINTED back to RUNNING,
//! with the same put-back the dump's rollback and the agent use.
//!
//! Two rules of its own: it never acts on a process another tool traces (a CRIU dumping or
//! restoring it now holds it stopped: a put-back would race that CRIU, and the driver cannot reach
//! a stopped process anyway), and every driver step has a deadline, so a hung driver ends the
//! command with a message instead of holding the terminal forever.

use std::sync::mpsc;
use std::time::Duration;

use ccm_driver::checkpoint::{CheckpointApi, ProcessState, Step, StepDone};
use ccm_identity::HostPid;

use crate::{input, CliResult, Failure};

/// The most loading libcuda, `cuInit` and the first state query may take.
const LOAD_DEADLINE: Duration = Duration::from_secs(30);
/// Added to the put-back's own deadline for its unlock and the final state query.
const UNLOCK_SLACK: Duration = Duration::from_secs(10);

/// What the driver work reports to the waiting thread, as it goes.
enum Progress {
    /// libcuda is loaded and the process's state read.
    Before(ProcessState),
    /// The put-back ended: its steps and the state after.
    Done(Vec<StepDone>, String),
}

/// Refuses a process that another task traces, naming it: CRIU (a dump or restore of it under
/// way) or anything else (a debugger).
fn refuse_if_traced(pid: HostPid) -> Result<(), Failure> {
    let tracer = match ccm_process::tree::tracer(pid.get()) {
        Ok(t) => t,
        Err(ccm_process::ProcessError::NoSuchProcess { .. }) => return Err(not_here(pid.get())),
        Err(e) => return Err(Failure::Input(format!("pid {pid}: cannot tell whether it is traced: {e}"))),
    };
    let Some(t) = tracer else { return Ok(()) };
    // Every name from /proc is the traced process's or the tracer's choice: escaped before it reaches a line.
    let exe = t
        .exe
        .as_ref()
        .map(|e| format!(", {}", ccm_identity::text::shown(&e.display().to_string())))
        .unwrap_or_default();
    Err(Failure::Refused(if t.is_criu() {
        format!(
            "pid {pid} is held by CRIU (pid {}{exe}), which traces it: a dump or restore of it is under way, and a \
             put-back now would race it. Wait for that CRIU to end (it puts the process back itself when its dump \
             fails), or stop it (kill {}), then run recover again",
            t.pid, t.pid
        )
    } else {
        format!(
            "pid {pid} is traced by pid {} ({}{exe}): the driver cannot put back a process stopped for a tracer. \
             Detach or end the tracer, then run recover again",
            t.pid,
            ccm_identity::text::shown(&t.comm)
        )
    }))
}

fn not_here(pid: impl std::fmt::Display) -> Failure {
    Failure::Input(format!("pid {pid} does not exist on this host; pass the pid `ps` shows for the stuck process"))
}

/// The put-back's deadline: `CRIU_CUDA_MIGRATE_DRIVER_TIMEOUT`, else 60 s + 5 s per GiB of the
/// device memory NVML says the process holds (80 GiB when it cannot tell), as the plugin's.
fn put_back_deadline(pid: HostPid) -> Result<Duration, Failure> {
    let config = ccm_engine::Config::from_sources(|k| std::env::var(k).ok(), &[], &[]).map_err(input)?;
    let held =
        ccm_driver::nvml::Nvml::init(config.libnvml.as_deref()).ok().and_then(|n| n.device_memory().ok()).map(|gpus| {
            gpus.iter().flat_map(|g| &g.processes).filter(|(p, _)| *p == pid.get()).filter_map(|(_, b)| *b).sum::<u64>()
        });
    Ok(config.call_deadline(held.filter(|b| *b > 0)))
}

/// Waits for the next report of the driver work, at most `limit`; `what` names the step for the
/// message when the limit passes.
fn wait<T>(rx: &mpsc::Receiver<Result<T, Failure>>, limit: Duration, pid: HostPid, what: &str) -> Result<T, Failure> {
    match rx.recv_timeout(limit) {
        Ok(r) => r,
        Err(mpsc::RecvTimeoutError::Timeout) => Err(Failure::Refused(format!(
            "pid {pid}: the driver did not finish {what} within {} s; the process is left as the driver has it (see \
             `nvidia-smi`). Run recover again later, or give it longer with CRIU_CUDA_MIGRATE_DRIVER_TIMEOUT=SECONDS",
            limit.as_secs()
        ))),
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            Err(Failure::Input(format!("pid {pid}: the driver work ended without an answer during {what}")))
        }
    }
}

/// A process the plugin checkpointed to the driver's custom storage (CUDA 13.4) holds no device memory: its put-back
/// restores it from the page file of its dump, by the table of its identity image, both in `dir`.
struct FromPageFile {
    storage: ccm_driver::custom_storage::CustomStorageApi,
    api: CheckpointApi,
    table: ccm_identity::staging::DriverStorage,
    file: std::fs::File,
    size: u64,
}

impl FromPageFile {
    /// The identity image of `pid` (by the pid in its namespace) in `dir`, its driver storage table and its page file.
    fn open(
        dir: &std::path::Path,
        pid: HostPid,
    ) -> Result<(ccm_identity::staging::DriverStorage, std::fs::File, u64), Failure> {
        let d = ccm_process::dir::Dir::open(dir).map_err(input)?;
        let ns_pid = ccm_process::tree::ns_pid(pid.get()).unwrap_or(pid.get());
        let img =
            ccm_engine::preflight::read_image(&d, &ccm_identity::IdentityImage::file_name(ns_pid)).map_err(input)?;
        let Some(table) = img.driver_storage else {
            return Err(Failure::Input(format!(
                "{}: the image of pid {pid} has no driver storage table: its device memory was not checkpointed to \
                 the driver's custom storage; run recover without --images",
                d.shown_file(&ccm_identity::IdentityImage::file_name(ns_pid)).display()
            )));
        };
        let (file, size) = d.open_file(&ccm_identity::staging::page_file_name(ns_pid)).map_err(input)?;
        Ok((table, file, size))
    }
}

/// Why a put-back from a page file failed: its restore from the driver's custom storage, or the unlock.
#[derive(Debug, thiserror::Error)]
enum FromPageFileError {
    #[error(transparent)]
    Restore(#[from] ccm_agent::storage::StorageError),
    #[error(transparent)]
    Unlock(#[from] ccm_driver::CudaError),
}

impl ccm_driver::checkpoint::PutBackCalls for FromPageFile {
    type Error = FromPageFileError;
    fn restore_in_place(&self, pid: HostPid, _deadline: Duration) -> Result<(), FromPageFileError> {
        ccm_agent::storage::restore_from_file(&self.storage, pid.driver(), &[], &self.file, self.size, &self.table)?;
        Ok(())
    }
    fn unlock(&self, pid: HostPid) -> Result<(), FromPageFileError> {
        Ok(self.api.unlock(pid.driver())?)
    }
}

pub fn run(pid: i32, images: Option<&std::path::Path>, json: bool) -> CliResult {
    let pid = HostPid::new(pid.into()).ok_or_else(|| not_here(pid))?;
    if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
        return Err(not_here(pid));
    }
    refuse_if_traced(pid)?;
    let deadline = put_back_deadline(pid)?;
    let from_page_file = images.map(|dir| FromPageFile::open(dir, pid)).transpose()?;
    // The driver's calls on a thread of their own: a call that never returns cannot hold this one,
    // which gives up at the deadline (the process's exit ends the call).
    let (tx, rx) = mpsc::channel::<Result<Progress, Failure>>();
    std::thread::spawn(move || {
        let load = || -> Result<(CheckpointApi, ProcessState, Option<FromPageFile>), Failure> {
            let lib = ccm_driver::Libcuda::load(ccm_engine::Config::driver_libs_in_env().libcuda.as_deref())
                .map_err(input)?;
            let api = CheckpointApi::new(&lib).map_err(input)?;
            lib.init().map_err(input)?;
            let before = api.state(pid.driver()).map_err(|e| Failure::Input(format!("pid {pid}: {e}")))?;
            let from_page_file = match from_page_file {
                None => None,
                Some((table, file, size)) => {
                    let storage = ccm_driver::custom_storage::CustomStorageApi::new(&lib).ok_or_else(|| {
                        Failure::Refused(format!(
                            "pid {pid}: this driver offers no custom storage (CUDA 13.4, driver r615), which the \
                             restore from a page file needs"
                        ))
                    })?;
                    storage.retain_contexts().map_err(input)?;
                    Some(FromPageFile { storage, api: CheckpointApi::new(&lib).map_err(input)?, table, file, size })
                }
            };
            Ok((api, before, from_page_file))
        };
        let (api, before, from_page_file) = match load() {
            Ok(l) => l,
            Err(f) => {
                let _ = tx.send(Err(f));
                return;
            }
        };
        let _ = tx.send(Ok(Progress::Before(before)));
        // A CRIU may have seized the process since the first look.
        if let Err(f) = refuse_if_traced(pid) {
            let _ = tx.send(Err(f));
            return;
        }
        // Progress of the long step (the device memory back onto the GPUs, about 1 s per GiB) on
        // stderr, so that --json output stays one document on stdout.
        let starting = |step| {
            if step == Step::Restore {
                eprintln!("criu-cuda-migrate: pid {pid}: restoring its device memory onto the same GPUs ...");
            }
        };
        let done = match &from_page_file {
            Some(f) => ccm_driver::checkpoint::put_back(f, pid, before, deadline, starting),
            None => ccm_driver::checkpoint::put_back(&api, pid, before, deadline, starting),
        };
        let after = api.state(pid.driver()).map(|s| s.to_string()).unwrap_or_else(|e| e.to_string());
        let _ = tx.send(Ok(Progress::Done(done, after)));
    });
    let before = match wait(&rx, LOAD_DEADLINE, pid, "loading libcuda and reading the process's state")? {
        Progress::Before(s) => s,
        Progress::Done(..) => return Err(Failure::Input(format!("pid {pid}: the driver work answered out of order"))),
    };
    if !json {
        println!("pid {pid}: {before}");
    }
    if let Some(why) = custom_storage_refusal(pid, before) {
        return Err(Failure::Refused(why));
    }
    let (done, after) = match wait(&rx, deadline + UNLOCK_SLACK, pid, "the put-back to RUNNING")? {
        Progress::Done(d, a) => (d, a),
        Progress::Before(_) => return Err(Failure::Input(format!("pid {pid}: the driver work answered out of order"))),
    };
    let steps: Vec<serde_json::Value> = done
        .iter()
        .map(
            |d| serde_json::json!({"step": d.step.name(), "ok": d.error.is_none(), "seconds": d.elapsed.as_secs_f64()}),
        )
        .collect();
    let mut r: Result<(), StepFailed> = Ok(());
    for d in &done {
        match &d.error {
            None if !json => println!("pid {pid}: {} done ({:.3} s)", d.step.name(), d.elapsed.as_secs_f64()),
            None => {}
            Some(e) => r = Err(StepFailed { pid, step: d.step, error: e.clone() }),
        }
    }
    if json {
        println!(
            "{}",
            serde_json::json!({
                "pid": pid.get(), "before": before.to_string(), "steps": steps, "after": after,
                "ok": r.is_ok(), "error": r.as_ref().err().map(ToString::to_string),
            })
        );
        // The one document is out: a failure only sets the exit code.
        return match r {
            Ok(()) => Ok(()),
            Err(_) => {
                std::process::exit(1);
            }
        };
    }
    match r {
        Ok(()) => {
            println!("pid {pid}: {after}");
            Ok(())
        }
        Err(e) => Err(Failure::Refused(e.to_string())),
    }
}

/// Why a process in a custom-storage operation (CUDA 13.4) cannot be put back here: its device memory is mapped into
/// the tool that started the operation, and only that tool's `cuCheckpointOperationComplete` ends it.
fn custom_storage_refusal(pid: HostPid, state: ProcessState) -> Option<String> {
    let doing = match state {
        ProcessState::Checkpointing => "a checkpoint to another tool's custom storage",
        ProcessState::Restoring => "a restore from another tool's custom storage",
        _ => return None,
    };
    Some(format!(
        "pid {pid} is {state}: {doing} is in progress or was left unfinished (CUDA 13.4); its device memory is mapped \
         into that tool, and only that tool can complete the operation: let it finish, or kill pid {pid}"
    ))
}

/// A step of the put-back that the driver failed, with the driver's text.
#[derive(Debug, thiserror::Error)]
#[error("pid {pid}: {} failed: {error}", .step.name())]
struct StepFailed {
    pid: HostPid,
    step: Step,
    error: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_in_a_custom_storage_operation_is_refused_naming_what_to_do() {
        let pid = HostPid::new(42).unwrap();
        let why = custom_storage_refusal(pid, ProcessState::Checkpointing).unwrap();
        assert!(why.contains("pid 42 is CHECKPOINTING") && why.contains("kill pid 42"), "{why}");
        assert!(custom_storage_refusal(pid, ProcessState::Restoring).unwrap().contains("restore from"));
        for s in [ProcessState::Running, ProcessState::Locked, ProcessState::Checkpointed] {
            assert!(custom_storage_refusal(pid, s).is_none());
        }
    }

    #[test]
    fn a_driver_step_that_never_answers_ends_at_its_deadline() {
        let (tx, rx) = mpsc::channel::<Result<(), Failure>>();
        let pid = HostPid::new(4242).unwrap();
        let t0 = std::time::Instant::now();
        let r = wait(&rx, Duration::from_millis(200), pid, "the put-back to RUNNING");
        assert!(t0.elapsed() < Duration::from_secs(2));
        match r {
            Err(Failure::Refused(m)) => {
                assert!(m.contains("did not finish the put-back to RUNNING within 0 s"), "{m}");
                assert!(m.contains("CRIU_CUDA_MIGRATE_DRIVER_TIMEOUT"), "{m}");
            }
            other => panic!("{other:?}"),
        }
        tx.send(Ok(())).unwrap();
        assert!(wait(&rx, Duration::from_secs(1), pid, "x").is_ok());
    }
}
