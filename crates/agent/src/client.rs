//! The plugin's side: a handle on the agent, callable from several threads at once (the
//! parallel checkpoint and restore workers). One socket; each call sends its request and waits
//! for the reply with its id, one caller at a time reading for all of them.
//!
//! Every call has a deadline. A call that misses it, a socket that breaks or closes, all mean the
//! same: the agent is lost. It is killed (through its pidfd), every call in flight and every later
//! call fails at once, and the engine puts back what the agent had done with a fresh agent.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use ccm_driver::abi::CudaCode;
use ccm_driver::checkpoint::ProcessState;
use ccm_driver::rm::{FramebufferReport, PidMemoryReport};
use ccm_driver::CudaError;
use ccm_identity::{GpuUuid, HostPid, HostTid, PciAddress};
use ccm_process::helper::Helper;

use crate::protocol::{
    take_frame, write_frame, Answer, Call, CuInitInfo, DriverInfo, DriverLibs, NodeInfo, Reply, Request, WireError,
};
use crate::server::WarmUp;

/// The name the agent process shows in `ps` (its `comm`).
pub const AGENT_PROCESS_NAME: &str = "ccm-agent";

/// How long the end of a CRIU run waits for the agent to be gone before it kills it.
const EXIT_WAIT: Duration = Duration::from_secs(2);
/// Deadline of the warm-up waits (libcuda loaded, NVML's GPU list, `cuInit`): a node with many
/// GPUs and persistence mode off takes seconds; a hung driver, forever.
pub const WARM_UP_DEADLINE: Duration = Duration::from_secs(60);
/// Deadline of the short driver and NVML queries (state, restore thread id, unlock, lookups).
pub const QUERY_DEADLINE: Duration = Duration::from_secs(30);
/// How much longer than the resource manager query's own deadline the plugin waits for its reply:
/// the agent answers `Rm` at that deadline, so only a stopped agent gets here.
const RM_REPLY_GRACE: Duration = Duration::from_secs(5);
/// How long one read of the socket waits before the reader lets other callers check their
/// deadlines.
const READ_SLICE: Duration = Duration::from_millis(50);
/// A request is a few hundred bytes: a write that blocks this long means the agent reads no more.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the agent is no longer usable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lost {
    /// Its socket closed: it exited or was killed.
    Gone,
    /// The socket failed or carried something that is no frame.
    Broken(String),
    /// A call missed its deadline; the agent was killed then.
    Deadline { call: &'static str, pid: Option<i32>, after: Duration },
    /// It was told to exit.
    Exited,
}

/// A driver or agent failure, as the engine sees it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// No usable libcuda (the message names the fix).
    #[error("{0}")]
    NoDriver(String),
    #[error("NVML: {0}")]
    Nvml(String),
    /// The kernel driver's resource manager could not be asked (its error's text).
    #[error("the resource manager: {0}")]
    Rm(String),
    #[error("the driver agent (the helper process that makes the plugin's driver calls) failed: {0}")]
    Agent(String),
    #[error("{}", lost_text(*agent_pid, lost))]
    Lost { agent_pid: u32, lost: Lost },
}

/// Whether a socket error means the agent's end is gone (it exited or was killed).
fn is_peer_gone(e: &std::io::Error) -> bool {
    matches!(e.kind(), std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe)
}

fn lost_text(agent_pid: u32, lost: &Lost) -> String {
    match lost {
        Lost::Gone => format!(
            "the driver agent (pid {agent_pid}, the helper process that makes the plugin's driver calls) is gone: it \
             exited or was killed before it answered"
        ),
        Lost::Broken(why) => {
            format!("the socket to the driver agent (pid {agent_pid}) failed ({why}); the agent was killed")
        }
        Lost::Deadline { call, pid, after } => format!(
            "the driver agent (pid {agent_pid}) did not answer {call}{} within {} s (stopped or hung); it was killed",
            pid.map(|p| format!(" for pid {p}")).unwrap_or_default(),
            after.as_secs_f64()
        ),
        Lost::Exited => format!("the driver agent (pid {agent_pid}) was told to exit"),
    }
}

impl AgentError {
    /// The `CUresult` of a failed driver call.
    pub fn cuda_code(&self) -> Option<CudaCode> {
        match self {
            AgentError::Cuda(e) => Some(e.code),
            _ => None,
        }
    }

    /// Whether the agent itself was lost (the driver's answer is unknown).
    pub fn is_lost(&self) -> bool {
        matches!(self, AgentError::Lost { .. })
    }
}

impl AgentError {
    /// A failure as the agent sent it, for the request `call` (whose name a driver error keeps).
    pub(crate) fn from_wire(call: &'static str, e: WireError) -> AgentError {
        match e {
            WireError::Cuda { code, name, description } => {
                AgentError::Cuda(CudaError { call, code: CudaCode::from_raw(code), name, description })
            }
            WireError::NoDriver(m) => AgentError::NoDriver(m),
            WireError::Nvml(m) => AgentError::Nvml(m),
            WireError::Rm(m) => AgentError::Rm(m),
            WireError::Agent(m) => AgentError::Agent(m),
        }
    }
}

#[derive(Default)]
struct Inbox {
    next_id: u64,
    replies: HashMap<u64, Result<Answer, WireError>>,
    /// A caller is blocked reading the socket for everyone.
    reading: bool,
    /// Bytes read that do not yet make a whole frame.
    partial: Vec<u8>,
    /// The agent is lost: every later call fails with this.
    lost: Option<Lost>,
}

/// The running agent.
pub struct Agent {
    stream: UnixStream,
    helper: Helper,
    writing: Mutex<()>,
    inbox: Mutex<Inbox>,
    arrived: Condvar,
    /// Whether [`Agent::exit`] waits until the agent is gone (see [`Agent::exit_without_waiting`]).
    wait_at_exit: AtomicBool,
    exited: AtomicBool,
}

impl Agent {
    /// Forks the agent (see `ccm_process::helper`) and starts its warm-up. `keep` are fds of this
    /// process the agent keeps open (CRIU's log, so that its lines land there); `libs` are the
    /// driver libraries it loads (the settings' paths, else the loader's search).
    pub fn spawn(keep: &[RawFd], libs: &DriverLibs, order: WarmUp) -> Result<Agent, AgentError> {
        let (ours, theirs) =
            UnixStream::pair().map_err(|e| AgentError::Agent(format!("cannot make its socket: {e}")))?;
        let mut keep = keep.to_vec();
        keep.push(theirs.as_raw_fd());
        let libs = libs.clone();
        let criu_parent = std::os::unix::process::parent_id();
        let helper = ccm_process::helper::spawn_detached(AGENT_PROCESS_NAME, &keep, move || {
            crate::server::serve(theirs, &libs, order, criu_parent)
        })
        .map_err(|e| AgentError::Agent(e.to_string()))?;
        let _ = ours.set_write_timeout(Some(WRITE_TIMEOUT));
        Ok(Agent {
            stream: ours,
            helper,
            writing: Mutex::new(()),
            inbox: Mutex::new(Inbox::default()),
            wait_at_exit: AtomicBool::new(true),
            exited: AtomicBool::new(false),
            arrived: Condvar::new(),
        })
    }

    /// The agent's pid.
    pub fn pid(&self) -> u32 {
        self.helper.pid
    }

    /// Why the agent is lost, if it is (a missed deadline, a dead or broken agent); `None` while
    /// it serves, and after a normal exit.
    pub fn lost(&self) -> Option<Lost> {
        self.inbox.lock().unwrap_or_else(|p| p.into_inner()).lost.clone().filter(|l| *l != Lost::Exited)
    }

    fn lose(&self, inbox: &mut Inbox, why: Lost) -> AgentError {
        if inbox.lost.is_none() {
            inbox.lost = Some(why.clone());
            if why != Lost::Exited {
                // Nothing it does from now on is waited for: it must not go on acting on processes.
                self.helper.kill();
                log::error!("{}", lost_text(self.helper.pid, &why));
            }
            self.arrived.notify_all();
        }
        AgentError::Lost { agent_pid: self.helper.pid, lost: inbox.lost.clone().unwrap_or(why) }
    }

    fn call(&self, call: Call, deadline: Duration) -> Result<Answer, AgentError> {
        let end = Instant::now() + deadline;
        let (name, pid) = (call.name(), call.pid());
        let id = {
            let mut i = self.inbox.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(l) = &i.lost {
                return Err(AgentError::Lost { agent_pid: self.helper.pid, lost: l.clone() });
            }
            i.next_id += 1;
            i.next_id
        };
        let sent = {
            let _w = self.writing.lock().unwrap_or_else(|p| p.into_inner());
            write_frame(&mut &self.stream, &Request { id, call })
        };
        let mut inbox = self.inbox.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = sent {
            let lost = if is_peer_gone(&e) { Lost::Gone } else { Lost::Broken(format!("cannot send it {name}: {e}")) };
            return Err(self.lose(&mut inbox, lost));
        }
        loop {
            if let Some(r) = inbox.replies.remove(&id) {
                return r.map_err(|e| AgentError::from_wire(name, e));
            }
            if let Some(l) = &inbox.lost {
                return Err(AgentError::Lost { agent_pid: self.helper.pid, lost: l.clone() });
            }
            let now = Instant::now();
            if now >= end {
                return Err(self.lose(&mut inbox, Lost::Deadline { call: name, pid, after: deadline }));
            }
            if inbox.reading {
                inbox = self.arrived.wait_timeout(inbox, end - now).unwrap_or_else(|p| p.into_inner()).0;
                continue;
            }
            inbox.reading = true;
            drop(inbox);
            let got = self.read_some((end - now).min(READ_SLICE));
            inbox = self.inbox.lock().unwrap_or_else(|p| p.into_inner());
            inbox.reading = false;
            match got {
                Ok(Some(bytes)) => {
                    inbox.partial.extend_from_slice(&bytes);
                    loop {
                        match take_frame::<Reply>(&mut inbox.partial) {
                            Ok(Some(r)) => {
                                inbox.replies.insert(r.id, r.result);
                            }
                            Ok(None) => break,
                            Err(e) => {
                                self.lose(&mut inbox, Lost::Broken(e.to_string()));
                                break;
                            }
                        }
                    }
                }
                Ok(None) => {}
                // A peer killed with our request still unread resets the connection instead of closing it:
                // it is gone all the same.
                Err(Some(e)) if is_peer_gone(&e) => {
                    self.lose(&mut inbox, Lost::Gone);
                }
                Err(Some(e)) => {
                    self.lose(&mut inbox, Lost::Broken(e.to_string()));
                }
                Err(None) => {
                    self.lose(&mut inbox, Lost::Gone);
                }
            }
            self.arrived.notify_all();
        }
    }

    /// One read of at most `wait`: `Ok(Some(bytes))`, `Ok(None)` when nothing came, `Err(None)` at
    /// the end of the stream (the agent is gone), `Err(Some(e))` when the socket failed.
    fn read_some(&self, wait: Duration) -> Result<Option<Vec<u8>>, Option<std::io::Error>> {
        let _ = self.stream.set_read_timeout(Some(wait.max(Duration::from_millis(1))));
        let mut buf = vec![0u8; 64 << 10];
        match std::io::Read::read(&mut &self.stream, &mut buf) {
            Ok(0) => Err(None),
            Ok(n) => {
                buf.truncate(n);
                Ok(Some(buf))
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => Ok(None),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => Ok(None),
            Err(e) => Err(Some(e)),
        }
    }

    fn unexpected(a: Answer) -> AgentError {
        AgentError::Agent(format!("unexpected answer {a:?}"))
    }

    /// Waits until libcuda is loaded in the agent.
    pub fn driver(&self) -> Result<DriverInfo, AgentError> {
        match self.call(Call::Driver, WARM_UP_DEADLINE)? {
            Answer::Driver(d) => Ok(d),
            a => Err(Self::unexpected(a)),
        }
    }

    /// Waits until NVML has listed the GPUs as well.
    pub fn node(&self) -> Result<NodeInfo, AgentError> {
        match self.call(Call::Node, WARM_UP_DEADLINE)? {
            Answer::Node(n) => Ok(n),
            a => Err(Self::unexpected(a)),
        }
    }

    /// Waits for the agent's `cuInit(0)`.
    pub fn cuinit(&self) -> Result<CuInitInfo, AgentError> {
        match self.call(Call::CuInit, WARM_UP_DEADLINE)? {
            Answer::CuInit(c) => Ok(c),
            a => Err(Self::unexpected(a)),
        }
    }

    fn done(&self, call: Call, deadline: Duration) -> Result<(), AgentError> {
        match self.call(call, deadline)? {
            Answer::Done => Ok(()),
            a => Err(Self::unexpected(a)),
        }
    }

    /// `cuCheckpointProcessGetRestoreThreadId`: fails for a process that is not a CUDA process.
    pub fn restore_thread_id(&self, pid: HostPid) -> Result<HostTid, AgentError> {
        self.restore_thread_id_within(pid, QUERY_DEADLINE)
    }

    /// [`Agent::restore_thread_id`] with a shorter deadline (inside CRIU's alarm at PAUSE_DEVICES).
    pub fn restore_thread_id_within(&self, pid: HostPid, deadline: Duration) -> Result<HostTid, AgentError> {
        match self.call(Call::RestoreThreadId { pid: pid.driver() }, deadline.min(QUERY_DEADLINE))? {
            Answer::Tid(t) => HostTid::new(t.into()).ok_or_else(|| {
                AgentError::Agent(format!("the driver named restore thread {t} for pid {pid}, which is no thread id"))
            }),
            a => Err(Self::unexpected(a)),
        }
    }

    pub fn state(&self, pid: HostPid) -> Result<ProcessState, AgentError> {
        self.state_within(pid, QUERY_DEADLINE)
    }

    /// [`Agent::state`] with a shorter deadline (inside CRIU's alarm at PAUSE_DEVICES).
    pub fn state_within(&self, pid: HostPid, deadline: Duration) -> Result<ProcessState, AgentError> {
        match self.call(Call::State { pid: pid.driver() }, deadline.min(QUERY_DEADLINE))? {
            Answer::State(s) => Ok(ProcessState::from_raw(s)),
            a => Err(Self::unexpected(a)),
        }
    }

    /// The driver's lock, given `timeout_ms` to wait for the process's work; the agent is given
    /// up on after `deadline` (at least the driver's wait plus a little).
    pub fn lock(&self, pid: HostPid, timeout_ms: u32, deadline: Duration) -> Result<(), AgentError> {
        let floor = Duration::from_millis(timeout_ms.into()) + Duration::from_millis(200);
        self.done(Call::Lock { pid: pid.driver(), timeout_ms }, deadline.max(floor))
    }

    pub fn checkpoint(&self, pid: HostPid, deadline: Duration) -> Result<(), AgentError> {
        self.done(Call::Checkpoint { pid: pid.driver() }, deadline)
    }

    /// An empty `pairs` restores onto the same GPUs.
    pub fn restore(&self, pid: HostPid, pairs: &[(GpuUuid, GpuUuid)], deadline: Duration) -> Result<(), AgentError> {
        self.done(Call::Restore { pid: pid.driver(), pairs: pairs.to_vec() }, deadline)
    }

    /// The checkpoint of `pid` to the driver's custom storage, copied by the agent into the empty page file at
    /// `page_file` (see [`Call::CheckpointToStorage`]).
    pub fn checkpoint_to_storage(
        &self,
        pid: HostPid,
        page_file: &str,
        deadline: Duration,
    ) -> Result<ccm_identity::staging::DriverStorage, AgentError> {
        match self.call(Call::CheckpointToStorage { pid: pid.driver(), page_file: page_file.to_string() }, deadline)? {
            Answer::DriverStorage(d) => Ok(d),
            a => Err(Self::unexpected(a)),
        }
    }

    /// The restore of `pid` from the driver's custom storage, filled from `page_file` by `storage` (see
    /// [`Call::RestoreFromStorage`]); an empty `pairs` restores onto the same GPUs.
    pub fn restore_from_storage(
        &self,
        pid: HostPid,
        pairs: &[(GpuUuid, GpuUuid)],
        page_file: &str,
        storage: &ccm_identity::staging::DriverStorage,
        deadline: Duration,
    ) -> Result<(), AgentError> {
        let call = Call::RestoreFromStorage {
            pid: pid.driver(),
            pairs: pairs.to_vec(),
            page_file: page_file.to_string(),
            storage: storage.clone(),
        };
        self.done(call, deadline)
    }

    /// Records that `pid`'s staging pages are in `page_file` and released in the task (see
    /// [`Call::StagingReleased`]).
    pub fn staging_released(
        &self,
        pid: HostPid,
        page_file: &str,
        table: &ccm_identity::staging::StagingTable,
    ) -> Result<(), AgentError> {
        self.done(
            Call::StagingReleased { pid: pid.driver(), page_file: page_file.to_string(), table: table.clone() },
            QUERY_DEADLINE,
        )
    }

    pub fn unlock(&self, pid: HostPid) -> Result<(), AgentError> {
        self.done(Call::Unlock { pid: pid.driver() }, QUERY_DEADLINE)
    }

    /// A successful dump hands its processes to CRIU (see [`Call::HandOver`]).
    pub fn hand_over(&self) -> Result<(), AgentError> {
        self.done(Call::HandOver, QUERY_DEADLINE)
    }

    /// The UUID of the GPU NVML finds at `pci` (`None`: "Not Found").
    pub fn uuid_at_pci(&self, pci: PciAddress) -> Result<Option<GpuUuid>, AgentError> {
        match self.call(Call::UuidAtPci { pci }, QUERY_DEADLINE)? {
            Answer::Uuid(u) => Ok(u),
            a => Err(Self::unexpected(a)),
        }
    }

    /// Every GPU's free memory and compute processes, as NVML reports them now.
    pub fn device_memory(&self) -> Result<Vec<ccm_driver::nvml::GpuMemory>, AgentError> {
        match self.call(Call::DeviceMemory, QUERY_DEADLINE)? {
            Answer::DeviceMemory(m) => Ok(m),
            a => Err(Self::unexpected(a)),
        }
    }

    /// What each of `pids` holds on every attached GPU, by the kernel driver's resource manager
    /// ([`ccm_driver::rm`]), answered by the agent within `deadline` (then [`AgentError::Rm`]); the
    /// plugin waits a little longer for the reply itself, so a slow driver never costs the agent.
    pub fn video_memory(&self, pids: &[HostPid], deadline: Duration) -> Result<PidMemoryReport, AgentError> {
        let call = Call::VideoMemory {
            pids: pids.iter().map(|p| p.get()).collect(),
            deadline_ms: u64::try_from(deadline.as_millis()).unwrap_or(u64::MAX),
        };
        match self.call(call, deadline + RM_REPLY_GRACE)? {
            Answer::VideoMemory(r) => Ok(r),
            a => Err(Self::unexpected(a)),
        }
    }

    /// Every attached GPU's free and total memory by the resource manager ([`ccm_driver::rm::framebuffer`]),
    /// answered within `deadline` as [`Agent::video_memory`].
    pub fn framebuffer(&self, deadline: Duration) -> Result<FramebufferReport, AgentError> {
        let call = Call::Framebuffer { deadline_ms: u64::try_from(deadline.as_millis()).unwrap_or(u64::MAX) };
        match self.call(call, deadline + RM_REPLY_GRACE)? {
            Answer::Framebuffer(r) => Ok(r),
            a => Err(Self::unexpected(a)),
        }
    }

    /// Makes [`Agent::exit`] (and the drop) return once the agent was told, without waiting for
    /// its exit (about 4 ms: the driver's teardown). For a dump: the agent runs beside CRIU, in
    /// its cgroup, and ends by itself. A restore keeps the wait, because under runc the agent
    /// runs in the restored container's cgroup, which must hold only the container's processes
    /// once CRIU is done.
    pub fn exit_without_waiting(&self) {
        self.wait_at_exit.store(false, Ordering::Relaxed);
    }

    /// Tells the agent to exit without touching any process. With the wait, kills it when it has
    /// not gone within [`EXIT_WAIT`] (a stopped or hung agent); without, kills it at once when it
    /// is stopped, since then it would never read the word.
    pub fn exit(&self) {
        if self.exited.swap(true, Ordering::SeqCst) {
            return;
        }
        let was_lost = {
            let mut inbox = self.inbox.lock().unwrap_or_else(|p| p.into_inner());
            let was = inbox.lost.is_some();
            if !was {
                inbox.lost = Some(Lost::Exited);
            }
            was
        };
        if !was_lost {
            let _w = self.writing.lock().unwrap_or_else(|p| p.into_inner());
            let _ = write_frame(&mut &self.stream, &Request { id: 0, call: Call::Exit });
        }
        // A stopped agent would never read the word: killed at once.
        if self.helper.is_stopped() {
            log::warn!("the driver agent (pid {}) is stopped at the end of the run: killed it", self.helper.pid);
            self.helper.kill();
            return;
        }
        if !self.wait_at_exit.load(Ordering::Relaxed) {
            return;
        }
        // The wait is for one case: CRIU in a cgroup of its own (the restored container's, under
        // runc), which must hold only the container once CRIU is done, and the agent still in it. An
        // agent that moved out at its start, or a CRIU in its caller's cgroup, needs no wait.
        use ccm_process::cgroup::cgroup_v2_of;
        let (criu, agent, caller) = (
            cgroup_v2_of(std::process::id()),
            cgroup_v2_of(self.helper.pid),
            cgroup_v2_of(std::os::unix::process::parent_id()),
        );
        if criu.is_some() && agent.is_some() && (agent != criu || criu == caller) {
            return;
        }
        if !self.helper.wait_gone(EXIT_WAIT) {
            log::warn!(
                "the driver agent (pid {}) did not exit within {} s of being told (stopped or hung): killed it",
                self.helper.pid,
                EXIT_WAIT.as_secs()
            );
            self.helper.kill();
            self.helper.wait_gone(Duration::from_secs(1));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.exit();
    }
}

impl ccm_driver::checkpoint::PutBackCalls for Agent {
    type Error = AgentError;
    fn restore_in_place(&self, pid: HostPid, deadline: Duration) -> Result<(), AgentError> {
        Agent::restore(self, pid, &[], deadline)
    }
    fn unlock(&self, pid: HostPid) -> Result<(), AgentError> {
        Agent::unlock(self, pid)
    }
}
