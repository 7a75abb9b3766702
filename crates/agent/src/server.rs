//! The agent's side: runs in the helper process, owns libcuda and NVML, answers calls.
//!
//! It warms up by itself as soon as it starts: libcuda is loaded, then `cuInit` and NVML's GPU
//! list run at the same time in two threads, so that by the time CRIU asks (a CUDA process found
//! at dump, the driver's restore at the end of a restore) they are usually done.
//!
//! If the plugin's end of the socket closes without an `Exit` (CRIU was killed), the agent puts
//! back every process it locked or checkpointed itself: the tasks are no longer traced once
//! CRIU is gone, so their restore threads answer the driver again. A process it restored for a
//! CRIU restore that never reached the unlock is half-restored (CRIU never finished it): the
//! agent kills it, and says so; the images are intact for another restore.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use ccm_driver::checkpoint::{put_back, CheckpointApi, Step};
use ccm_driver::cuda::LoadError;
use ccm_driver::custom_storage::CustomStorageApi;
use ccm_driver::nvml::{Nvml, NvmlFailure};
use ccm_driver::{CudaError, Libcuda};
use ccm_identity::GpuUuid;
use log::{error, info, warn};

use ccm_process::tree::ProcessHandle;

use crate::protocol::{
    read_frame, write_frame, Answer, Call, CuInitInfo, DriverInfo, DriverLibs, NodeInfo, NvmlInfo, NvmlUnavailable,
    Reply, Request, WireError,
};

/// How long an orphaned agent waits for calls still running in the driver (a lock waits up to
/// its own timeout) before it gives up on them.
const ORPHAN_DRAIN: Duration = Duration::from_secs(60);
/// How long, after a hand-over and CRIU's end, the dumped processes are given to show that CRIU ended them (its
/// SIGKILL is sent before it exits: pending or exiting by then).
const HAND_OVER_SETTLE: Duration = Duration::from_millis(500);
/// How long a call waits for the warm-up (libcuda loaded, NVML started, `cuInit`).
const READY_WAIT: Duration = Duration::from_secs(90);
/// The deadline of a restore the orphaned agent makes itself (it has no one to report to).
const ORPHAN_RESTORE_DEADLINE: Duration = Duration::from_secs(600);

/// A value set once by one thread and waited for by others.
struct Ready<T> {
    cell: OnceLock<T>,
    lock: Mutex<()>,
    set: Condvar,
}

impl<T> Ready<T> {
    fn new() -> Self {
        Ready { cell: OnceLock::new(), lock: Mutex::new(()), set: Condvar::new() }
    }
    fn put(&self, v: T) {
        let _ = self.cell.set(v);
        let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        self.set.notify_all();
    }
    /// The value, once set; `None` when it is not set within [`READY_WAIT`] (a hung driver load
    /// or NVML start: the caller answers with an error instead of waiting for ever).
    fn wait(&self) -> Option<&T> {
        let end = Instant::now() + READY_WAIT;
        let mut g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(v) = self.cell.get() {
                return Some(v);
            }
            let now = Instant::now();
            if now >= end {
                return None;
            }
            g = self.set.wait_timeout(g, end - now).unwrap_or_else(|p| p.into_inner()).0;
        }
    }
}

struct Loaded {
    lib: Libcuda,
    api: CheckpointApi,
    info: DriverInfo,
}

/// Processes this agent changed and has not yet put back.
#[derive(Default)]
struct Touched {
    locked: BTreeSet<i32>,
    checkpointed: BTreeSet<i32>,
    /// Restored by the driver for a CRIU restore (not locked by this agent) and not yet unlocked,
    /// each with a pidfd opened when its restore was asked for (the process is CRIU's then), so
    /// that a kill reaches that process and no other.
    restored: BTreeMap<i32, Option<ProcessHandle>>,
    /// Processes whose staging pages the plugin released, with their page file and table: filled back before any
    /// put-back of an orphaned agent.
    staged: BTreeMap<i32, (String, ccm_identity::staging::StagingTable)>,
    /// Processes this agent checkpointed to custom storage, with their page file and table: put back from there.
    stored: BTreeMap<i32, (String, ccm_identity::staging::DriverStorage)>,
}

struct Shared {
    driver: Ready<Result<Loaded, LoadError>>,
    nvml: Ready<NvmlState>,
    nvml_list: OnceLock<Result<NvmlInfo, NvmlUnavailable>>,
    cuinit: Ready<Result<f64, WireError>>,
    /// The driver's custom storage, made at its first use (after `cuInit`, with every GPU's primary context
    /// retained), or why it cannot be used.
    storage: OnceLock<Result<CustomStorageApi, StorageUnavailable>>,
    touched: Mutex<Touched>,
    inflight: AtomicUsize,
    /// The process of each driver call in flight (one entry per call).
    inflight_pids: Mutex<Vec<i32>>,
    /// A successful dump handed its processes to CRIU ([`Call::HandOver`]).
    handed_over: AtomicBool,
}

/// The agent's main loop; returns the process's exit code.
/// `criu_parent` is the process that started CRIU (the runtime), whose cgroup a restore's agent moves
/// into.
pub fn serve(stream: UnixStream, libs: &DriverLibs, order: WarmUp, criu_parent: u32) -> i32 {
    // A restore's agent leaves the cgroup CRIU runs in (under runc: the restored container's) for that
    // of the runtime that started CRIU: the container's cgroup then holds only the container once CRIU
    // is done, and the end of the restore need not wait for the agent's exit (the plugin sees that it
    // moved). In a thread of its own: a cgroup migration can take milliseconds, and the preflight
    // waits for the warm-up.
    if order == WarmUp::Restore {
        std::thread::spawn(move || match ccm_process::cgroup::follow(criu_parent) {
            Ok(Some((from, to))) => info!("driver agent: moved from CRIU's cgroup {from} to the runtime's {to}"),
            Ok(None) => {}
            Err(e) => warn!("driver agent: stays in CRIU's cgroup ({e}); the restore's end waits for it to exit"),
        });
    }
    let shared = Arc::new(Shared {
        driver: Ready::new(),
        nvml: Ready::new(),
        nvml_list: OnceLock::new(),
        cuinit: Ready::new(),
        storage: OnceLock::new(),
        touched: Mutex::new(Touched::default()),
        inflight: AtomicUsize::new(0),
        inflight_pids: Mutex::new(Vec::new()),
        handed_over: AtomicBool::new(false),
    });
    {
        let shared = shared.clone();
        let libs = libs.clone();
        std::thread::spawn(move || warm_up(&shared, &libs, order));
    }
    let writer = Arc::new(Mutex::new(match stream.try_clone() {
        Ok(s) => s,
        Err(e) => {
            error!("driver agent: cannot clone its socket: {e}");
            return 1;
        }
    }));
    loop {
        match read_frame::<Request>(&mut &stream) {
            // After a hand-over the agent stays until CRIU is gone (the end of its socket).
            Ok(Some(Request { call: Call::Exit, .. })) if !shared.handed_over.load(Ordering::SeqCst) => return 0,
            Ok(Some(Request { call: Call::Exit, .. })) => {}
            Ok(Some(req)) => {
                shared.inflight.fetch_add(1, Ordering::SeqCst);
                let pid = req.call.pid();
                if let Some(p) = pid {
                    shared.inflight_pids.lock().unwrap_or_else(|e| e.into_inner()).push(p);
                }
                let (shared, writer) = (shared.clone(), writer.clone());
                std::thread::spawn(move || {
                    // A restore for a CRIU restore: hold the process by a pidfd from now on.
                    let handle = match &req.call {
                        Call::Restore { pid, .. } | Call::RestoreFromStorage { pid, .. } => {
                            u32::try_from(*pid).ok().and_then(|p| ProcessHandle::open(p).ok())
                        }
                        _ => None,
                    };
                    let result = answer_guarded(&req.call, || {
                        failpoint(&req.call);
                        answer(&shared, &req.call)
                    });
                    track(&shared, &req.call, &result, handle);
                    if let Some(p) = pid {
                        let mut v = shared.inflight_pids.lock().unwrap_or_else(|e| e.into_inner());
                        if let Some(i) = v.iter().position(|x| *x == p) {
                            v.swap_remove(i);
                        }
                    }
                    let mut w = writer.lock().unwrap_or_else(|p| p.into_inner());
                    // A failed write means the plugin is gone; the read side sees that too.
                    let _ = write_frame(&mut *w, &Reply { id: req.id, result });
                    drop(w);
                    shared.inflight.fetch_sub(1, Ordering::SeqCst);
                });
            }
            Ok(None) | Err(_) => {
                orphaned(&shared);
                return 0;
            }
        }
    }
}

/// Test builds only (`debug_assertions`): `CCM_AGENT_FAILPOINT=panic:<call name>` in CRIU's
/// environment makes the agent panic while it answers that call (`panic:cuCheckpointProcessLock`),
/// so the suite under real CRIU proves the panic boundary below, as the doubles' `agent-stop` knob
/// proves the deadlines. Release builds (the package) have no such hook.
#[cfg(debug_assertions)]
fn failpoint(call: &Call) {
    if let Ok(v) = std::env::var("CCM_AGENT_FAILPOINT") {
        if v.strip_prefix("panic:") == Some(call.name()) {
            panic!("failpoint {v}");
        }
    }
}

#[cfg(not(debug_assertions))]
fn failpoint(_: &Call) {}

/// Answers one call, a panic included: a panic becomes an error reply naming the call, so the
/// plugin is never left waiting for an answer that will not come.
pub fn answer_guarded(call: &Call, f: impl FnOnce() -> Result<Answer, WireError>) -> Result<Answer, WireError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|p| {
        let msg = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        Err(WireError::Agent(format!(
            "internal error while answering {}{}: {msg}; this is a bug in criu-cuda-migrate, please report it with this log",
            call.name(),
            call.pid().map(|p| format!(" for pid {p}")).unwrap_or_default()
        )))
    })
}

fn warm_up(shared: &Arc<Shared>, libs: &DriverLibs, order: WarmUp) {
    // NVML starts at once, beside the libcuda load: a restore's preflight waits for nothing else.
    let nvml_started = {
        let shared = shared.clone();
        let lib = libs.libnvml.clone().unwrap_or_else(|| ccm_driver::nvml::LIBNVML_NAME.to_string());
        std::thread::spawn(move || {
            let t = Instant::now();
            let state = match Nvml::init_from(&lib) {
                Ok(n) => NvmlState {
                    driver_version: n.driver_version().unwrap_or_default(),
                    nvml: Ok(n),
                    seconds: t.elapsed().as_secs_f64(),
                },
                Err(e) => NvmlState { driver_version: String::new(), nvml: Err(e), seconds: t.elapsed().as_secs_f64() },
            };
            shared.nvml.put(state);
        })
    };
    let t0 = Instant::now();
    let path = libs.libcuda.as_deref().unwrap_or(ccm_driver::cuda::LIBCUDA_NAME);
    let loaded = Libcuda::load_from(path).and_then(|lib| {
        let api = CheckpointApi::new(&lib)?;
        let info = DriverInfo {
            agent_pid: std::process::id(),
            libcuda_path: lib.path().to_string(),
            cuda_driver_version: lib.driver_version().unwrap_or(0),
            load_seconds: t0.elapsed().as_secs_f64(),
            custom_storage: CustomStorageApi::new(&lib).is_some(),
        };
        Ok(Loaded { lib, api, info })
    });
    let lib = loaded.as_ref().ok().map(|l| l.lib.clone());
    let failed = loaded.as_ref().err().map(ToString::to_string);
    shared.driver.put(loaded);
    let Some(lib) = lib else {
        shared.cuinit.put(Err(WireError::NoDriver(failed.unwrap_or_default())));
        return;
    };
    if order == WarmUp::Restore {
        // A restore needs cuInit only at its end: NVML (which the preflight waits for) first, so that the
        // two do not contend in the driver.
        let _ = nvml_started.join();
    }
    let t = Instant::now();
    let r = lib.init().map(|()| t.elapsed().as_secs_f64()).map_err(|e| WireError::from_cuda(&e));
    shared.cuinit.put(r);
}

/// What the agent warms up first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WarmUp {
    /// A dump's PAUSE_DEVICES waits for `cuInit`: it starts as soon as libcuda is loaded.
    Dump,
    /// A restore's preflight waits for NVML; `cuInit` follows it.
    Restore,
}

/// NVML in the agent, once started.
struct NvmlState {
    nvml: Result<Nvml, NvmlFailure>,
    driver_version: String,
    seconds: f64,
}

/// NVML's GPU list, made once, at the first call that wants it (a restore whose kernel driver
/// lists the GPUs in /proc never asks).
fn nvml_list(shared: &Shared) -> Result<Result<NvmlInfo, NvmlUnavailable>, WireError> {
    let state = nvml(shared)?;
    Ok(shared
        .nvml_list
        .get_or_init(|| {
            let t = Instant::now();
            let n = state.nvml.as_ref().map_err(|e| NvmlUnavailable(e.to_string()))?;
            let (gpus, gpus_error) = match n.gpus() {
                Ok(g) => (g, None),
                Err(e) => (Vec::new(), Some(e.to_string())),
            };
            Ok(NvmlInfo {
                driver_version: state.driver_version.clone(),
                gpus,
                gpus_error,
                seconds: state.seconds + t.elapsed().as_secs_f64(),
            })
        })
        .clone())
}

fn not_ready(what: &str) -> WireError {
    WireError::Agent(format!(
        "{what} did not end within {} s in the driver agent (a hung driver?)",
        READY_WAIT.as_secs()
    ))
}

fn loaded(shared: &Shared) -> Result<&Loaded, WireError> {
    shared
        .driver
        .wait()
        .ok_or_else(|| not_ready("the load of libcuda"))?
        .as_ref()
        .map_err(|e| WireError::NoDriver(e.to_string()))
}

fn nvml(shared: &Shared) -> Result<&NvmlState, WireError> {
    shared.nvml.wait().ok_or_else(|| not_ready("NVML's start"))
}

/// The checkpoint API, once `cuInit` has ended (the driver wants it before any of its calls on
/// another process; its failure is reported by the calls themselves).
fn api(shared: &Shared) -> Result<&CheckpointApi, WireError> {
    let l = loaded(shared)?;
    shared.cuinit.wait().ok_or_else(|| not_ready("cuInit"))?;
    Ok(&l.api)
}

/// Why the driver's custom storage cannot be used in this agent.
#[derive(Debug, thiserror::Error)]
enum StorageUnavailable {
    #[error("this driver offers no custom storage (CUDA 13.4, driver r615)")]
    NotOffered,
    #[error("the GPUs' primary contexts cannot be retained for the driver's custom storage: {0}")]
    Contexts(CudaError),
}

/// The driver's custom storage, once `cuInit` has ended.
fn storage(shared: &Shared) -> Result<&CustomStorageApi, WireError> {
    api(shared)?;
    let lib = &loaded(shared)?.lib;
    shared
        .storage
        .get_or_init(|| {
            let s = CustomStorageApi::new(lib).ok_or(StorageUnavailable::NotOffered)?;
            s.retain_contexts().map_err(StorageUnavailable::Contexts)?;
            Ok(s)
        })
        .as_ref()
        .map_err(|e| WireError::Agent(e.to_string()))
}

fn storage_error(e: crate::storage::StorageError) -> WireError {
    match e {
        crate::storage::StorageError::Refused(e) => WireError::from_cuda(&e),
        e => WireError::Agent(e.to_string()),
    }
}

/// The page file at `page_file` (an absolute path in CRIU's mount namespace): its directory opened, then the file
/// relative to it, never through a link, a regular file only.
fn page_file_parts(page_file: &str) -> Result<(ccm_process::dir::Dir, &str), WireError> {
    let path = std::path::Path::new(page_file);
    match (path.parent(), path.file_name().and_then(|n| n.to_str())) {
        (Some(dir), Some(name)) => ccm_process::dir::Dir::open(dir)
            .map(|d| (d, name))
            .map_err(|e| WireError::Agent(format!("the page file's directory: {e}"))),
        _ => Err(WireError::Agent(format!("the page file {page_file} has no directory and name"))),
    }
}

fn restore_from_storage(
    shared: &Shared,
    pid: i32,
    pairs: &[(GpuUuid, GpuUuid)],
    page_file: &str,
    storage_table: &ccm_identity::staging::DriverStorage,
) -> Result<u64, WireError> {
    // The table's rules are checked by `restore_from_file`, before anything is read by it.
    let api = storage(shared)?;
    let (dir, name) = page_file_parts(page_file)?;
    let (file, size) = dir.open_file(name).map_err(|e| WireError::Agent(e.to_string()))?;
    crate::storage::restore_from_file(api, pid, pairs, &file, size, storage_table).map_err(storage_error)
}

fn cuda<T>(r: Result<T, CudaError>) -> Result<T, WireError> {
    r.map_err(|e| WireError::from_cuda(&e))
}

fn answer(shared: &Shared, call: &Call) -> Result<Answer, WireError> {
    match call {
        Call::Driver => Ok(Answer::Driver(loaded(shared)?.info.clone())),
        Call::Node => {
            let driver = loaded(shared)?.info.clone();
            let nvml = nvml_list(shared)?;
            Ok(Answer::Node(NodeInfo { driver, nvml }))
        }
        Call::CuInit => {
            let t0 = Instant::now();
            let seconds = shared.cuinit.wait().ok_or_else(|| not_ready("cuInit"))?.clone()?;
            Ok(Answer::CuInit(CuInitInfo { seconds, waited_seconds: t0.elapsed().as_secs_f64() }))
        }
        Call::RestoreThreadId { pid } => cuda(api(shared)?.restore_thread_id(*pid)).map(Answer::Tid),
        Call::State { pid } => cuda(api(shared)?.state_raw(*pid)).map(Answer::State),
        Call::Lock { pid, timeout_ms } => cuda(api(shared)?.lock(*pid, *timeout_ms)).map(|()| Answer::Done),
        Call::Checkpoint { pid } => cuda(api(shared)?.checkpoint(*pid)).map(|()| Answer::Done),
        Call::Restore { pid, pairs } => cuda(api(shared)?.restore(*pid, pairs)).map(|()| Answer::Done),
        Call::Unlock { pid } => cuda(api(shared)?.unlock(*pid)).map(|()| Answer::Done),
        Call::UuidAtPci { pci } => match &nvml(shared)?.nvml {
            Ok(n) => n.uuid_at_pci(pci).map(Answer::Uuid).map_err(|e| WireError::Nvml(e.to_string())),
            Err(e) => Err(WireError::Nvml(e.to_string())),
        },
        Call::DeviceMemory => match &nvml(shared)?.nvml {
            Ok(n) => n.device_memory().map(Answer::DeviceMemory).map_err(|e| WireError::Nvml(e.to_string())),
            Err(e) => Err(WireError::Nvml(e.to_string())),
        },
        // No libcuda needed: ioctls on /dev/nvidiactl, on a thread of their own with a deadline, so
        // that a wedged driver answers `Rm` here (the dump goes on without the check) and the
        // plugin's own deadline for the call, longer, never kills the agent for it.
        Call::VideoMemory { pids, deadline_ms } => {
            ccm_driver::rm::video_memory_within(pids, std::time::Duration::from_millis(*deadline_ms))
                .map(Answer::VideoMemory)
                .map_err(|e| WireError::Rm(e.to_string()))
        }
        Call::Framebuffer { deadline_ms } => {
            ccm_driver::rm::framebuffer_within(std::time::Duration::from_millis(*deadline_ms))
                .map(Answer::Framebuffer)
                .map_err(|e| WireError::Rm(e.to_string()))
        }
        Call::StagingReleased { pid, page_file, table } => {
            table.check().map_err(|e| WireError::Rm(format!("staging table of pid {pid}: {e}")))?;
            shared
                .touched
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .staged
                .insert(*pid, (page_file.clone(), table.clone()));
            Ok(Answer::Done)
        }
        Call::CheckpointToStorage { pid, page_file } => {
            let api = storage(shared)?;
            let (dir, name) = page_file_parts(page_file)?;
            let file = dir.open_empty_for_writing(name).map_err(|e| WireError::Agent(e.to_string()))?;
            crate::storage::checkpoint_to_file(api, *pid, &file).map(Answer::DriverStorage).map_err(storage_error)
        }
        Call::RestoreFromStorage { pid, pairs, page_file, storage } => {
            restore_from_storage(shared, *pid, pairs, page_file, storage).map(|_| Answer::Done)
        }
        Call::HandOver => {
            shared.handed_over.store(true, Ordering::SeqCst);
            Ok(Answer::Done)
        }
        Call::Exit => Ok(Answer::Done),
    }
}

/// After a hand-over, once CRIU is gone: the dumped processes CRIU ended (gone, exiting or with a SIGKILL pending) are
/// forgotten, as is one left stopped (`criu dump --leave-stopped`), named by an ERROR line; those left running were
/// resumed by CRIU while CHECKPOINTED (its post-dump action script failed), and stay for the put-back.
fn settle_hand_over(shared: &Shared) {
    let pids: Vec<i32> = {
        let t = shared.touched.lock().unwrap_or_else(|p| p.into_inner());
        t.checkpointed.union(&t.locked).copied().collect()
    };
    let ended = |p: i32| u32::try_from(p).map_or(true, ccm_process::tree::is_gone_or_ending);
    let until = Instant::now() + HAND_OVER_SETTLE;
    while pids.iter().any(|&p| !ended(p)) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut t = shared.touched.lock().unwrap_or_else(|p| p.into_inner());
    for p in pids {
        let stored = t.stored.get(&p).map(|s| s.0.clone());
        let stopped = u32::try_from(p).ok().and_then(ccm_process::tree::state_letter).is_some_and(|c| c == 'T');
        if stopped && t.checkpointed.contains(&p) {
            // Its restore thread is stopped too: the driver cannot restore it now. Its released staging pages go back
            // into it (the memory of a stopped process can be written), so that `recover` can, once it runs.
            let back = match t.staged.get(&p) {
                None => String::new(),
                Some((page_file, table)) => match fill_back(p, page_file, table) {
                    Ok(bytes) => format!("its {} MiB of staging pages are back in it; ", bytes >> 20),
                    Err(e) => format!(
                        "its staging pages could not be filled back from {page_file} ({e}): restore it from the \
                         images instead; "
                    ),
                },
            };
            error!(
                "pid {p} is left stopped and CHECKPOINTED after the dump (criu dump --leave-stopped): {back}before it \
                 runs on, continue it (kill -CONT {p}) and run `{}`",
                crate::storage::recover_command(p, stored.as_deref())
            );
        }
        if ended(p) || stopped {
            t.checkpointed.remove(&p);
            t.locked.remove(&p);
            t.staged.remove(&p);
            t.stored.remove(&p);
        } else {
            warn!(
                "pid {p}: CRIU resumed it after a dump it had called successful (a failed post-dump action script does \
                 that), while the driver holds it CHECKPOINTED: putting it back"
            );
        }
    }
}

/// Why an orphaned agent could not fill a process's staging pages back.
#[derive(Debug, thiserror::Error)]
enum FillBackError {
    #[error("the page file {path} has no directory and name")]
    BadPath { path: String },
    #[error(transparent)]
    File(#[from] ccm_process::dir::FileError),
    #[error(transparent)]
    Fill(#[from] ccm_process::staging_pages::StagingIoError),
    #[error("pid {0} is no process id")]
    Pid(i32),
}

/// An orphaned agent's fill of `pid`'s released staging pages from its page file, before its put-back. `Err`: the
/// process must not be restored by the driver (it would run on with other device data). The page file is opened by
/// the plugin's rules: its directory (the image directory's own path, which CRIU's descriptor named), then the file
/// relative to it, never through a link, a regular file only; only the extents its checked table names are read.
fn fill_back(pid: i32, page_file: &str, table: &ccm_identity::staging::StagingTable) -> Result<u64, FillBackError> {
    let path = std::path::Path::new(page_file);
    let (Some(dir), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str())) else {
        return Err(FillBackError::BadPath { path: page_file.to_string() });
    };
    let (file, size) = ccm_process::dir::Dir::open(dir)?.open_file(name)?;
    let opts = ccm_process::staging_pages::CopyOptions {
        chunk_bytes: table.chunk_bytes,
        threads: std::thread::available_parallelism().map_or(4, |n| n.get()).min(16),
        deadline: ORPHAN_RESTORE_DEADLINE,
    };
    let pid = u32::try_from(pid).map_err(|_| FillBackError::Pid(pid))?;
    Ok(ccm_process::staging_pages::fill_from_page_files(
        &[ccm_process::staging_pages::FillJob { pid, table, file: &file, file_size: size }],
        opts,
    )?)
}

/// The put-back calls of a process checkpointed to custom storage: its restore reads its page file.
struct FromStorage<'a> {
    shared: &'a Shared,
    api: &'a CheckpointApi,
    page_file: &'a str,
    table: &'a ccm_identity::staging::DriverStorage,
}

impl ccm_driver::checkpoint::PutBackCalls for FromStorage<'_> {
    type Error = crate::AgentError;
    fn restore_in_place(&self, pid: ccm_identity::HostPid, _deadline: Duration) -> Result<(), crate::AgentError> {
        let pid = pid.driver();
        let bytes = restore_from_storage(self.shared, pid, &[], self.page_file, self.table)
            .map_err(|e| crate::AgentError::from_wire("cuCheckpointProcessRestore from custom storage", e))?;
        info!("driver agent: pid {pid}: {} MiB of device memory filled back from {}", bytes >> 20, self.page_file);
        Ok(())
    }
    fn unlock(&self, pid: ccm_identity::HostPid) -> Result<(), crate::AgentError> {
        self.api.unlock(pid.driver()).map_err(crate::AgentError::Cuda)
    }
}

fn track(shared: &Shared, call: &Call, result: &Result<Answer, WireError>, handle: Option<ProcessHandle>) {
    if result.is_err() {
        return;
    }
    let mut t = shared.touched.lock().unwrap_or_else(|p| p.into_inner());
    match call {
        Call::Lock { pid, .. } => {
            t.locked.insert(*pid);
        }
        Call::Checkpoint { pid } => {
            t.checkpointed.insert(*pid);
        }
        Call::CheckpointToStorage { pid, page_file } => {
            t.checkpointed.insert(*pid);
            if let Ok(Answer::DriverStorage(d)) = result {
                t.stored.insert(*pid, (page_file.clone(), d.clone()));
            }
        }
        Call::Restore { pid, .. } | Call::RestoreFromStorage { pid, .. } => {
            t.stored.remove(pid);
            // A process this agent did not lock was checkpointed by an earlier CRIU run: this is
            // a CRIU restore, and the process stays LOCKED until the unlock.
            let put_back_by_us = t.checkpointed.remove(pid) || t.locked.contains(pid);
            if !put_back_by_us {
                t.restored.insert(*pid, handle);
            }
        }
        Call::Unlock { pid } => {
            t.locked.remove(pid);
            t.restored.remove(pid);
        }
        _ => {}
    }
}

/// CRIU went away in the middle: put back what this agent changed, then exit. A process is put
/// back only once no call on it is in flight (a checkpoint that was running when CRIU died ends
/// first, then the process is restored and unlocked, in that order); the others at once. What is
/// done follows the state the driver reports, not the one this agent assumes.
fn orphaned(shared: &Shared) {
    if shared.handed_over.load(Ordering::SeqCst) {
        settle_hand_over(shared);
    }
    let deadline = Instant::now() + ORPHAN_DRAIN;
    // After a hand-over CRIU ended normally, and each process it resumed was named already.
    let mut announced = shared.handed_over.load(Ordering::SeqCst);
    loop {
        let busy: Vec<i32> = shared.inflight_pids.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let (put_back_now, half_restored) = {
            let mut t = shared.touched.lock().unwrap_or_else(|p| p.into_inner());
            let mut ready: BTreeSet<i32> =
                t.checkpointed.union(&t.locked).copied().filter(|p| !busy.contains(p)).collect();
            t.checkpointed.retain(|p| busy.contains(p));
            t.locked.retain(|p| busy.contains(p));
            let restored: Vec<(i32, Option<ProcessHandle>)> = {
                let keys: Vec<i32> = t.restored.keys().copied().filter(|p| !busy.contains(p)).collect();
                keys.into_iter().filter_map(|k| t.restored.remove_entry(&k)).collect()
            };
            ready.retain(|p| !restored.iter().any(|(r, _)| r == p));
            (ready, restored)
        };
        for (pid, handle) in &half_restored {
            // CRIU died between the driver's restore and the unlock: CRIU never finished this
            // process (its memory, files, threads), so it must not run.
            let r = match handle {
                Some(h) => h.kill().map_err(|e| e.to_string()),
                None => Err("no pidfd was held for it".to_string()),
            };
            match r {
                Ok(()) => error!("pid {pid}: CRIU went away during its restore, after the driver had restored it but before the unlock; killed it (a half-restored process must not run). The images are intact: restore again from them"),
                Err(e) => error!("pid {pid} is left LOCKED and half-restored after CRIU went away during the restore, and killing it failed ({e}): kill it (`kill -9 {pid}`), then restore again from the same images"),
            }
        }
        if !put_back_now.is_empty() {
            if !announced {
                warn!("driver agent: CRIU went away in the middle of its work; putting back the CUDA processes it had locked or checkpointed");
                announced = true;
            }
            if let Ok(api) = api(shared) {
                for pid in &put_back_now {
                    let staged = shared.touched.lock().unwrap_or_else(|p| p.into_inner()).staged.remove(pid);
                    if let Some((page_file, table)) = staged {
                        match fill_back(*pid, &page_file, &table) {
                            Ok(bytes) => info!(
                                "driver agent: pid {pid}: {} MiB of staging pages filled back from {page_file}",
                                bytes >> 20
                            ),
                            Err(e) => {
                                error!("pid {pid} is left CHECKPOINTED after CRIU went away: its staging pages cannot be filled back from {page_file} ({e}), and restoring it without them would lose its device data. Restore it from the dump's images (criu restore), or kill it");
                                continue;
                            }
                        }
                    }
                    // A process checkpointed to custom storage holds no device memory: it comes back from its page
                    // file.
                    let stored = shared.touched.lock().unwrap_or_else(|p| p.into_inner()).stored.remove(pid);
                    let recover = crate::storage::recover_command(pid, stored.as_ref().map(|s| s.0.as_str()));
                    let state = match api.state(*pid) {
                        Ok(s) => s,
                        Err(e) => {
                            error!(
                                "pid {pid}: its CUDA state cannot be read after CRIU went away ({e}); run `{recover}`"
                            );
                            continue;
                        }
                    };
                    let Some(host_pid) = ccm_identity::HostPid::new((*pid).into()) else { continue };
                    let steps = match &stored {
                        Some((page_file, table)) => {
                            let calls = FromStorage { shared, api, page_file, table };
                            put_back(&calls, host_pid, state, ORPHAN_RESTORE_DEADLINE, |_| {})
                        }
                        None => put_back(api, host_pid, state, ORPHAN_RESTORE_DEADLINE, |_| {}),
                    };
                    for step in steps {
                        match (&step.error, step.step) {
                            (None, Step::Restore) => {
                                info!("driver agent: pid {pid}: restored onto its GPUs after CRIU went away")
                            }
                            (None, Step::Unlock) => {
                                info!("driver agent: pid {pid}: unlocked, RUNNING again after CRIU went away")
                            }
                            (Some(e), s) => {
                                error!("pid {pid} is left {} after CRIU went away: {e}; run `{recover}`", s.left_in())
                            }
                        }
                    }
                }
            }
        }
        let idle = shared.inflight.load(Ordering::SeqCst) == 0;
        let empty = {
            let t = shared.touched.lock().unwrap_or_else(|p| p.into_inner());
            t.checkpointed.is_empty() && t.locked.is_empty() && t.restored.is_empty()
        };
        if idle && empty {
            return;
        }
        if Instant::now() > deadline {
            error!("driver agent: driver calls still running {}s after CRIU went away; exiting. Check every CUDA process of that dump with `criu-cuda-migrate recover --pid PID`", ORPHAN_DRAIN.as_secs());
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_while_answering_becomes_an_error_reply() {
        let call = Call::Checkpoint { pid: 42 };
        let r = answer_guarded(&call, || panic!("injected"));
        match r {
            Err(WireError::Agent(m)) => {
                assert!(m.contains("cuCheckpointProcessCheckpoint for pid 42") && m.contains("injected"), "{m}")
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(answer_guarded(&call, || Ok(Answer::Done)), Ok(Answer::Done)));
    }
}
