//! The plugin's side: a handle on the agent, callable from several threads at once (the
//! parallel checkpoint and restore workers). One socket; each call sends its request and waits
//! for the reply with its id, one caller at a time reading for all of them.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use ccm_driver::checkpoint::ProcessState;
use ccm_driver::CudaError;
use ccm_identity::{GpuUuid, PciAddress};

use crate::protocol::{
    read_frame, write_frame, Answer, Call, CuInitInfo, DriverInfo, NodeInfo, Reply, Request, WireError,
};

/// The name the agent process shows in `ps` (its `comm`).
pub const AGENT_PROCESS_NAME: &str = "ccm-agent";

/// How long the end of a CRIU run waits for the agent to be gone.
const EXIT_WAIT: Duration = Duration::from_secs(2);

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
    #[error("the driver agent (the helper process that makes the plugin's driver calls) failed: {0}")]
    Agent(String),
}

impl AgentError {
    /// The `CUresult` of a failed driver call.
    pub fn cuda_code(&self) -> Option<i32> {
        match self {
            AgentError::Cuda(e) => Some(e.code),
            _ => None,
        }
    }
}

/// The driver calls' names, so that errors keep the `&'static str` [`CudaError`] carries.
const CALL_NAMES: [&str; 8] = [
    "cuInit",
    "cuDriverGetVersion",
    "cuCheckpointProcessGetRestoreThreadId",
    "cuCheckpointProcessGetState",
    "cuCheckpointProcessLock",
    "cuCheckpointProcessCheckpoint",
    "cuCheckpointProcessRestore",
    "cuCheckpointProcessUnlock",
];

impl From<WireError> for AgentError {
    fn from(e: WireError) -> AgentError {
        match e {
            WireError::Cuda { call, code, name, description } => AgentError::Cuda(CudaError {
                call: CALL_NAMES.iter().find(|c| **c == call).copied().unwrap_or("a driver call"),
                code,
                name,
                description,
            }),
            WireError::NoDriver(m) => AgentError::NoDriver(m),
            WireError::Nvml(m) => AgentError::Nvml(m),
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
    /// The socket failed or closed: every later call fails with this.
    gone: Option<String>,
}

/// The running agent.
pub struct Agent {
    stream: UnixStream,
    writing: Mutex<()>,
    inbox: Mutex<Inbox>,
    arrived: Condvar,
    /// Whether [`Agent::exit`] waits until the agent is gone (see [`Agent::exit_without_waiting`]).
    wait_at_exit: std::sync::atomic::AtomicBool,
}

impl Agent {
    /// Forks the agent (see `ccm_process::helper`) and starts its warm-up. `keep` are fds of this
    /// process the agent keeps open (CRIU's log, so that its lines land there).
    pub fn spawn(keep: &[RawFd]) -> Result<Agent, AgentError> {
        let (ours, theirs) =
            UnixStream::pair().map_err(|e| AgentError::Agent(format!("cannot make its socket: {e}")))?;
        let mut keep = keep.to_vec();
        keep.push(theirs.as_raw_fd());
        ccm_process::helper::spawn_detached(AGENT_PROCESS_NAME, &keep, move || crate::server::serve(theirs))
            .map_err(|e| AgentError::Agent(e.to_string()))?;
        Ok(Agent {
            stream: ours,
            writing: Mutex::new(()),
            inbox: Mutex::new(Inbox::default()),
            wait_at_exit: std::sync::atomic::AtomicBool::new(true),
            arrived: Condvar::new(),
        })
    }

    fn call(&self, call: Call) -> Result<Answer, AgentError> {
        let id = {
            let mut i = self.inbox.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(g) = &i.gone {
                return Err(AgentError::Agent(g.clone()));
            }
            i.next_id += 1;
            i.next_id
        };
        {
            let _w = self.writing.lock().unwrap_or_else(|p| p.into_inner());
            write_frame(&mut &self.stream, &Request { id, call })
                .map_err(|e| AgentError::Agent(format!("cannot send it a request: {e}")))?;
        }
        let mut inbox = self.inbox.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(r) = inbox.replies.remove(&id) {
                return r.map_err(AgentError::from);
            }
            if let Some(g) = &inbox.gone {
                return Err(AgentError::Agent(g.clone()));
            }
            if inbox.reading {
                inbox = self.arrived.wait(inbox).unwrap_or_else(|p| p.into_inner());
                continue;
            }
            inbox.reading = true;
            drop(inbox);
            let got = read_frame::<Reply>(&mut &self.stream);
            inbox = self.inbox.lock().unwrap_or_else(|p| p.into_inner());
            inbox.reading = false;
            match got {
                Ok(Some(r)) => {
                    inbox.replies.insert(r.id, r.result);
                }
                Ok(None) => inbox.gone = Some("it exited (its socket closed); look for its last lines above".into()),
                Err(e) => inbox.gone = Some(format!("its socket failed: {e}")),
            }
            self.arrived.notify_all();
        }
    }

    fn unexpected(a: Answer) -> AgentError {
        AgentError::Agent(format!("unexpected answer {a:?}"))
    }

    /// Waits until libcuda is loaded in the agent.
    pub fn driver(&self) -> Result<DriverInfo, AgentError> {
        match self.call(Call::Driver)? {
            Answer::Driver(d) => Ok(d),
            a => Err(Self::unexpected(a)),
        }
    }

    /// Waits until NVML has listed the GPUs as well.
    pub fn node(&self) -> Result<NodeInfo, AgentError> {
        match self.call(Call::Node)? {
            Answer::Node(n) => Ok(n),
            a => Err(Self::unexpected(a)),
        }
    }

    /// Waits for the agent's `cuInit(0)`.
    pub fn cuinit(&self) -> Result<CuInitInfo, AgentError> {
        match self.call(Call::CuInit)? {
            Answer::CuInit(c) => Ok(c),
            a => Err(Self::unexpected(a)),
        }
    }

    fn done(&self, call: Call) -> Result<(), AgentError> {
        match self.call(call)? {
            Answer::Done => Ok(()),
            a => Err(Self::unexpected(a)),
        }
    }

    /// `cuCheckpointProcessGetRestoreThreadId`: fails for a process that is not a CUDA process.
    pub fn restore_thread_id(&self, pid: i32) -> Result<i32, AgentError> {
        match self.call(Call::RestoreThreadId { pid })? {
            Answer::Tid(t) => Ok(t),
            a => Err(Self::unexpected(a)),
        }
    }

    pub fn state(&self, pid: i32) -> Result<ProcessState, AgentError> {
        match self.call(Call::State { pid })? {
            Answer::State(s) => Ok(ProcessState::from_raw(s)),
            a => Err(Self::unexpected(a)),
        }
    }

    pub fn lock(&self, pid: i32, timeout_ms: u32) -> Result<(), AgentError> {
        self.done(Call::Lock { pid, timeout_ms })
    }

    pub fn checkpoint(&self, pid: i32) -> Result<(), AgentError> {
        self.done(Call::Checkpoint { pid })
    }

    /// An empty `pairs` restores onto the same GPUs.
    pub fn restore(&self, pid: i32, pairs: &[(GpuUuid, GpuUuid)]) -> Result<(), AgentError> {
        self.done(Call::Restore { pid, pairs: pairs.to_vec() })
    }

    pub fn unlock(&self, pid: i32) -> Result<(), AgentError> {
        self.done(Call::Unlock { pid })
    }

    /// The UUID of the GPU NVML finds at `pci` (`None`: "Not Found").
    pub fn uuid_at_pci(&self, pci: PciAddress) -> Result<Option<GpuUuid>, AgentError> {
        match self.call(Call::UuidAtPci { pci })? {
            Answer::Uuid(u) => Ok(u),
            a => Err(Self::unexpected(a)),
        }
    }

    /// Every GPU's free memory and compute processes, as NVML reports them now.
    pub fn device_memory(&self) -> Result<Vec<ccm_driver::nvml::GpuMemory>, AgentError> {
        match self.call(Call::DeviceMemory)? {
            Answer::DeviceMemory(m) => Ok(m),
            a => Err(Self::unexpected(a)),
        }
    }

    /// Makes [`Agent::exit`] (and the drop) return once the agent was told, without waiting for
    /// its exit (about 4 ms: the driver's teardown). For a dump: the agent runs beside CRIU, in
    /// its cgroup, and ends by itself. A restore keeps the wait, because under runc the agent
    /// runs in the restored container's cgroup, which must hold only the container's processes
    /// once CRIU is done.
    pub fn exit_without_waiting(&self) {
        self.wait_at_exit.store(false, std::sync::atomic::Ordering::Relaxed);
    }

    /// Tells the agent to exit without touching any process, and waits (briefly) until it has.
    pub fn exit(&self) {
        {
            let _w = self.writing.lock().unwrap_or_else(|p| p.into_inner());
            if write_frame(&mut &self.stream, &Request { id: 0, call: Call::Exit }).is_err() {
                return;
            }
        }
        let mut inbox = self.inbox.lock().unwrap_or_else(|p| p.into_inner());
        if inbox.gone.is_some() || inbox.reading {
            return;
        }
        inbox.gone = Some("it was told to exit".into());
        drop(inbox);
        if !self.wait_at_exit.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        // The agent's socket closes when it exits; replies still in flight are dropped.
        let _ = self.stream.set_read_timeout(Some(EXIT_WAIT));
        let mut buf = [0u8; 4096];
        while matches!(std::io::Read::read(&mut &self.stream, &mut buf), Ok(n) if n > 0) {}
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.exit();
    }
}

impl ccm_driver::checkpoint::PutBackCalls for Agent {
    type Error = AgentError;
    fn state(&self, pid: i32) -> Result<ProcessState, AgentError> {
        Agent::state(self, pid)
    }
    fn restore(&self, pid: i32, pairs: &[(GpuUuid, GpuUuid)]) -> Result<(), AgentError> {
        Agent::restore(self, pid, pairs)
    }
    fn unlock(&self, pid: i32) -> Result<(), AgentError> {
        Agent::unlock(self, pid)
    }
}
