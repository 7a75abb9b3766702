//! The control channel between a controller (`cuCheckpointProcess*` in any process) and the target
//! process's restore thread: one request file and one response file per target, each written
//! atomically by rename and polled every [`POLL_INTERVAL`].
//!
//! Files rather than sockets or pipes because the target must hold no descriptor that CRIU would
//! have to dump: the restore thread only sleeps (`nanosleep`) and opens a file when one appears.
//! The request is served BY THE TARGET'S RESTORE THREAD, so while CRIU keeps that thread
//! ptrace-stopped nobody answers and the controller's call times out, as with the real driver.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::registry::{self, Registration};
use crate::state::write_atomic;
use crate::{pidns, SimError, SimUuid, StateDir};

/// How often both sides look at the channel.
pub const POLL_INTERVAL: Duration = Duration::from_millis(2);

/// Environment variable (controller side): how long to wait for the restore thread, in ms.
pub const ENV_CALL_TIMEOUT_MS: &str = "CCM_SIM_CALL_TIMEOUT_MS";
/// Default wait for the restore thread beyond the operation's own timeout.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    Lock {
        timeout_ms: u32,
    },
    Checkpoint,
    /// `pairs: None` is a restore with NULL arguments (or no pairs): every GPU onto itself.
    Restore {
        pairs: Option<Vec<(SimUuid, SimUuid)>>,
    },
    Unlock,
    /// CUDA 13.4's checkpoint to the caller's custom storage: the device memory is laid out per GPU in region files
    /// the caller maps ([`crate::registry::Registration::custom_regions`]); the process is CHECKPOINTING until
    /// [`Op::Complete`].
    CheckpointCustom,
    /// The restore from the caller's custom storage: empty region files the caller fills; RESTORING until
    /// [`Op::Complete`].
    RestoreCustom {
        pairs: Option<Vec<(SimUuid, SimUuid)>>,
    },
    /// `cuCheckpointOperationComplete`: the custom-storage operation in progress ends.
    Complete,
}

impl Op {
    pub fn name(&self) -> &'static str {
        match self {
            Op::Lock { .. } => "lock",
            Op::Checkpoint => "checkpoint",
            Op::Restore { .. } => "restore",
            Op::Unlock => "unlock",
            Op::CheckpointCustom => "checkpoint-custom",
            Op::RestoreCustom { .. } => "restore-custom",
            Op::Complete => "complete",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// Unique per call, so a late answer to an abandoned call is never taken for the next one.
    pub id: String,
    pub op: Op,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    pub id: String,
    /// The `CUresult` of the operation.
    pub result: i32,
}

impl Request {
    pub fn encode(&self) -> String {
        let mut s = format!("id={}\nop={}\n", self.id, self.op.name());
        match &self.op {
            Op::Lock { timeout_ms } => s.push_str(&format!("timeout_ms={timeout_ms}\n")),
            Op::Restore { pairs: Some(pairs) } | Op::RestoreCustom { pairs: Some(pairs) } => {
                let list: Vec<String> = pairs.iter().map(|(o, n)| format!("{o}>{n}")).collect();
                s.push_str(&format!("pairs={}\n", list.join(",")));
            }
            _ => {}
        }
        s
    }

    pub fn decode(text: &str) -> Result<Request, SimError> {
        let bad = |why: &str| SimError::BadMessage(format!("{why} in request {text:?}"));
        let mut id = None;
        let mut op = None;
        let mut timeout_ms = None;
        let mut pairs = None;
        for line in text.lines() {
            let Some((k, v)) = line.split_once('=') else { continue };
            match k {
                "id" => id = Some(v.to_string()),
                "op" => op = Some(v.to_string()),
                "timeout_ms" => timeout_ms = Some(v.parse::<u32>().map_err(|_| bad("bad timeout_ms"))?),
                "pairs" => {
                    let mut list = Vec::new();
                    for p in v.split(',').filter(|p| !p.is_empty()) {
                        let (o, n) = p.split_once('>').ok_or_else(|| bad("bad pair"))?;
                        list.push((o.parse()?, n.parse()?));
                    }
                    pairs = Some(list);
                }
                _ => {}
            }
        }
        let id = id.ok_or_else(|| bad("no id"))?;
        let op = match op.as_deref() {
            Some("lock") => Op::Lock { timeout_ms: timeout_ms.unwrap_or(0) },
            Some("checkpoint") => Op::Checkpoint,
            Some("restore") => Op::Restore { pairs },
            Some("unlock") => Op::Unlock,
            Some("checkpoint-custom") => Op::CheckpointCustom,
            Some("restore-custom") => Op::RestoreCustom { pairs },
            Some("complete") => Op::Complete,
            _ => return Err(bad("unknown op")),
        };
        Ok(Request { id, op })
    }
}

impl Response {
    pub fn encode(&self) -> String {
        format!("id={}\nresult={}\n", self.id, self.result)
    }

    pub fn decode(text: &str) -> Result<Response, SimError> {
        let bad = || SimError::BadMessage(format!("bad response {text:?}"));
        let mut id = None;
        let mut result = None;
        for line in text.lines() {
            match line.split_once('=') {
                Some(("id", v)) => id = Some(v.to_string()),
                Some(("result", v)) => result = Some(v.parse().map_err(|_| bad())?),
                _ => {}
            }
        }
        Ok(Response { id: id.ok_or_else(bad)?, result: result.ok_or_else(bad)? })
    }
}

/// Why a controller's call got no answer.
#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    #[error("process {pid} is not a CUDA process of the simulated driver (no live registration at {path}); start it on the test double")]
    NotRegistered { pid: i32, path: String },
    #[error("the restore thread of process {pid} did not answer within {waited_ms} ms; if CRIU holds it ptrace-stopped, resume it first")]
    NoAnswer { pid: i32, waited_ms: u128 },
    #[error(transparent)]
    Sim(#[from] SimError),
}

/// A new unique request id: controller pid, thread, time and a counter.
pub fn new_request_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    // SAFETY: getpid and gettid have no preconditions.
    let (pid, tid) = unsafe { (libc::getpid(), libc::gettid()) };
    format!("{pid}.{tid}.{nanos}.{n}")
}

/// Controller side: posts `op` for `pid`'s restore thread and waits up to `wait` for its answer. `pid` is a
/// pid of the controller's `/proc`; the target may live in any pid namespace below (registry.rs).
pub fn exchange(state: &StateDir, pid: i32, op: Op, wait: Duration) -> Result<i32, ExchangeError> {
    exchange_then(state, pid, op, wait, || {})
}

/// [`exchange`], with `posted` run once the request is on the channel (the target may be at work
/// on it while the caller waits): the fault knobs that stop or kill the caller mid-call use it.
pub fn exchange_then(
    state: &StateDir,
    pid: i32,
    op: Op,
    wait: Duration,
    posted: impl FnOnce(),
) -> Result<i32, ExchangeError> {
    let Some(resolved) = registry::resolve(state, pid) else {
        let path = match pidns::key_of(pid) {
            Ok(key) => state.index(&key).display().to_string(),
            Err(_) => format!("/proc/{pid}"),
        };
        return Err(ExchangeError::NotRegistered { pid, path });
    };
    let reg = &resolved.registration;
    let request = Request { id: new_request_id(), op };
    let response_path = reg.response();
    let _ = std::fs::remove_file(&response_path);
    write_atomic(&reg.request(), request.encode().as_bytes())?;
    posted();
    let start = Instant::now();
    loop {
        if let Some(r) = read_response(&response_path) {
            let _ = std::fs::remove_file(&response_path);
            if r.id == request.id {
                return Ok(r.result);
            }
        }
        if start.elapsed() >= wait {
            // Withdraw the request so a thread that wakes up later does not act on an abandoned call.
            let _ = std::fs::remove_file(reg.request());
            return Err(ExchangeError::NoAnswer { pid, waited_ms: start.elapsed().as_millis() });
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

fn read_response(path: &Path) -> Option<Response> {
    let text = std::fs::read_to_string(path).ok()?;
    Response::decode(&text).ok()
}

/// Server side (the restore thread): takes the pending request, if any, off the channel.
pub fn take_request(reg: &Registration) -> Option<Result<Request, SimError>> {
    let path = reg.request();
    let text = std::fs::read_to_string(&path).ok()?;
    let _ = std::fs::remove_file(&path);
    Some(Request::decode(&text))
}

/// Server side: posts the answer.
pub fn answer(reg: &Registration, response: &Response) -> Result<(), SimError> {
    write_atomic(&reg.response(), response.encode().as_bytes())
}

/// Whether `pid` is a live process registered by the simulated driver (a stale registration of a dead
/// process does not count).
pub fn is_registered(state: &StateDir, pid: i32) -> bool {
    registry::resolve(state, pid).is_some()
}

/// The registered restore thread of a live `pid`, as the caller's `/proc` names it (a host tid for a
/// process in a container).
pub fn registered_restore_tid(state: &StateDir, pid: i32) -> Option<i32> {
    let resolved = registry::resolve(state, pid)?;
    // Asked while CRIU still holds the restored process stopped: the moment to drop a request a dead
    // controller left (a driver agent killed mid-call), before the restore thread runs and acts on it.
    drop_abandoned_request(&resolved.registration);
    Some(resolved.host_tid)
}

/// Removes the pending request of `reg` when the controller that posted it is gone. The real driver keeps
/// no such state across processes: a process CRIU restores again from the same images starts clean. The
/// controller's pid leads the request id and is a pid of the controllers' own `/proc` (they all run in
/// CRIU's pid namespace).
pub fn drop_abandoned_request(reg: &Registration) {
    let Ok(text) = std::fs::read_to_string(reg.request()) else { return };
    let Ok(request) = Request::decode(&text) else { return };
    let Some(controller) = request.id.split('.').next().and_then(|p| p.parse::<u32>().ok()) else { return };
    if !Path::new(&format!("/proc/{controller}")).exists() {
        let _ = std::fs::remove_file(reg.request());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uuid(n: u8) -> SimUuid {
        SimUuid([n; 16])
    }

    #[test]
    fn requests_round_trip() {
        for op in [
            Op::Lock { timeout_ms: 10_000 },
            Op::Checkpoint,
            Op::Restore { pairs: None },
            Op::Restore { pairs: Some(vec![]) },
            Op::Restore { pairs: Some(vec![(uuid(1), uuid(2)), (uuid(2), uuid(1))]) },
            Op::Unlock,
        ] {
            let r = Request { id: new_request_id(), op };
            assert_eq!(Request::decode(&r.encode()).unwrap(), r);
        }
        let a = Response { id: "x".into(), result: 401 };
        assert_eq!(Response::decode(&a.encode()).unwrap(), a);
        assert!(Request::decode("op=dance\nid=1\n").is_err());
    }

    #[test]
    fn unregistered_pid_is_refused_quickly() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::new(dir.path());
        let t0 = Instant::now();
        let e = exchange(&state, 999_999, Op::Checkpoint, Duration::from_secs(5)).unwrap_err();
        assert!(matches!(e, ExchangeError::NotRegistered { .. }));
        assert!(t0.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn exchange_with_a_serving_thread_and_timeout_without_one() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::new(dir.path());
        // SAFETY: getpid and gettid have no preconditions.
        let (pid, tid) = unsafe { (libc::getpid(), libc::gettid()) };
        let id = Box::new(42_u64);
        let reg = Registration::new(&state, *id);
        std::fs::create_dir_all(reg.dir()).unwrap();
        std::fs::write(reg.tid(), tid.to_string()).unwrap();
        std::fs::write(reg.id_at(), format!("{:x}", &*id as *const u64 as usize)).unwrap();
        state.point_index(&pidns::own_key().unwrap(), &reg).unwrap();
        assert_eq!(registered_restore_tid(&state, pid), Some(tid));

        // Nobody serves: the call times out and the request is withdrawn.
        let e = exchange(&state, pid, Op::Unlock, Duration::from_millis(30)).unwrap_err();
        assert!(matches!(e, ExchangeError::NoAnswer { .. }));
        assert!(!reg.request().exists());

        let server = std::thread::spawn(move || loop {
            if let Some(req) = take_request(&reg) {
                let req = req.unwrap();
                answer(&reg, &Response { id: req.id, result: 401 }).unwrap();
                return;
            }
            std::thread::sleep(POLL_INTERVAL);
        });
        assert_eq!(exchange(&state, pid, Op::Checkpoint, Duration::from_secs(5)).unwrap(), 401);
        server.join().unwrap();
    }
}
