//! Scripted fakes of the engine's seams (`crate::seam`) for the sessions' unit tests: processes,
//! a driver that keeps each process's CUDA state as the real one does, and CRIU.
//!
//! Each fake is a cheap handle on shared state, so a test keeps one to script failures and to
//! read back what the session did after it handed a clone to the session.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::os::fd::{OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, Once};
use std::time::Duration;

use ccm_agent::{AgentError, CuInitInfo, DriverInfo, Lost, NodeInfo, NvmlInfo, WarmUp};
use ccm_driver::abi::CudaCode;
use ccm_driver::checkpoint::ProcessState;
use ccm_driver::cuda::CudaError;
use ccm_driver::nvml::GpuMemory;
use ccm_driver::procfs::ProcfsError;
use ccm_driver::rm::{
    FramebufferReport, GpuFramebuffer, GpuPidMemory, PidMemory, PidMemoryReport, RmStatus, VideoMemory,
};
use ccm_identity::image::{PciSite, ProcessEnv};
use ccm_identity::{GpuIdentity, GpuUuid, HostPid, HostTid, PciAddress, PciSignature};
use ccm_process::cgroup::CgroupError;
use ccm_process::container::{ForeignDev, NodeEditError, RuntimeSpec};
use ccm_process::dir::FileError;
use ccm_process::mem::ScanReport;
use ccm_process::{Mapping, ProcessError, PtraceError, ScanScope};

use crate::host::CriuHost;
use crate::node::Node;
use crate::preflight::ProcessPlan;
use crate::reconcile::ReconcileSummary;
use crate::seam::{AgentStarter, DevView, DriverAgent, OwnDev, RunningThread, Seams, Targets, ThawedCgroup};
use crate::{Config, EngineError};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// GPU `i` of a node of H200s: minor `i`, bus `i`.
pub fn gpu(i: u32) -> GpuIdentity {
    GpuIdentity {
        uuid: format!("GPU-{i:08x}-0000-0000-0000-000000000000").parse().unwrap(),
        pci: PciAddress { domain: 0, bus: i, device: 0, function: 0 },
        pci_device_id: 0x233510de,
        pci_subsystem_id: 0x18bf10de,
        minor: i,
        name: "NVIDIA H200".into(),
        memory_total: 140 << 30,
    }
}

/// A driver error as the agent reports it.
pub fn cuda_error(call: &'static str, code: CudaCode) -> AgentError {
    let name = code.texts().map(|(n, _)| n.to_string_lossy().into_owned()).unwrap_or_else(|| format!("{code:?}"));
    AgentError::Cuda(CudaError { call, code, name, description: "scripted".into() })
}

/// The agent lost at a call: gone (it died) or past its deadline (it stalled).
pub fn lost(stalled: bool) -> AgentError {
    AgentError::Lost {
        agent_pid: 4000,
        lost: if stalled {
            Lost::Deadline { call: "Scripted", pid: None, after: Duration::from_secs(1) }
        } else {
            Lost::Gone
        },
    }
}

/// A config as from an environment holding `env` (no CRIU command line).
pub fn config(env: &[(&str, &str)]) -> Config {
    let env: BTreeMap<String, String> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    Config::from_sources(|k| env.get(k).cloned(), &[], &[]).unwrap()
}

// ---------------------------------------------------------------------------------------------
// The driver agent.

/// What the fake driver does.
#[derive(Default)]
pub struct AgentScript {
    pub gpus: Vec<GpuIdentity>,
    /// `driver()`'s answer when not the default.
    pub driver_error: Option<AgentError>,
    pub cuinit_error: Option<AgentError>,
    /// `node()` fails (NVML through the agent).
    pub node_error: Option<AgentError>,
    pub device_memory_error: Option<AgentError>,
    /// Device memory each pid holds on GPU 0 (bytes).
    pub device_bytes: BTreeMap<u32, u64>,
    /// The CUDA processes: pid → restore thread (pid + 10000 unless set).
    pub cuda: BTreeMap<u32, u32>,
    /// Each CUDA process's state, as the driver keeps it.
    pub states: BTreeMap<u32, ProcessState>,
    /// `(call, pid)` → the error that call answers, once. A lost agent's error also loses the agent.
    pub fails: BTreeMap<(&'static str, u32), AgentError>,
    /// `(call, pid)` whose failure still takes effect (a lock that timed out but took).
    pub takes_effect: BTreeSet<(&'static str, u32)>,
    /// Pids whose state cannot be read.
    pub state_fails: BTreeSet<u32>,
    /// Every call made, `"call pid"`.
    pub calls: Vec<String>,
    pub exit_without_waiting: bool,
    /// The pairs each restore was given.
    pub restore_pairs: BTreeMap<u32, Vec<(GpuUuid, GpuUuid)>>,
    /// The driver offers custom storage (CUDA 13.4).
    pub custom_storage: bool,
    /// Memory each pid imported from another process on GPU 0, as the resource manager reports it (bytes).
    pub imported: BTreeMap<u32, u64>,
    /// The resource manager cannot be asked: the agent's answer.
    pub rm_error: Option<AgentError>,
    /// The pids of each resource manager query, in order.
    pub rm_queries: Vec<Vec<u32>>,
    /// Each GPU's free memory as the resource manager reports it, by PCI bus; a GPU missing here is not
    /// reported. `None`: the resource manager cannot be asked (the default, as on the test doubles).
    pub rm_free: Option<BTreeMap<u32, u64>>,
}

/// One agent on the node's driver: agents started one after the other share the driver's state
/// (`AgentScript`), each is lost on its own.
#[derive(Clone, Default)]
pub struct FakeAgent {
    pub driver: Arc<Mutex<AgentScript>>,
    lost: Arc<Mutex<Option<Lost>>>,
}

impl FakeAgent {
    pub fn new(gpus: Vec<GpuIdentity>) -> FakeAgent {
        FakeAgent { driver: Arc::new(Mutex::new(AgentScript { gpus, ..AgentScript::default() })), lost: Arc::default() }
    }
    /// Another agent on the same driver (the dump's fresh agent after a lost one).
    pub fn fresh(&self) -> FakeAgent {
        FakeAgent { driver: self.driver.clone(), lost: Arc::default() }
    }
    pub fn script(&self) -> MutexGuard<'_, AgentScript> {
        lock(&self.driver)
    }
    pub fn is_lost(&self) -> bool {
        lock(&self.lost).is_some()
    }
    /// A CUDA process in `state`.
    pub fn cuda(&self, pid: u32, state: ProcessState) -> &Self {
        let mut s = self.script();
        s.cuda.insert(pid, pid + 10000);
        s.states.insert(pid, state);
        self
    }
    pub fn fail(&self, call: &'static str, pid: u32, e: AgentError) -> &Self {
        self.script().fails.insert((call, pid), e);
        self
    }
    pub fn state_of(&self, pid: u32) -> ProcessState {
        self.script().states[&pid]
    }
    pub fn calls(&self) -> Vec<String> {
        self.script().calls.clone()
    }
    pub fn called(&self, call: &str) -> bool {
        self.calls().iter().any(|c| c == call)
    }

    fn lost_error(lost: &Lost) -> AgentError {
        AgentError::Lost { agent_pid: 4000, lost: lost.clone() }
    }

    /// Records the call and answers the scripted failure, if any; `then` is the state change of
    /// a call that succeeds (or fails but takes effect).
    fn call(
        &self,
        name: &'static str,
        pid: Option<HostPid>,
        then: impl FnOnce(&mut AgentScript, u32),
    ) -> Result<(), AgentError> {
        let mut s = self.script();
        let p = pid.map(|p| p.get()).unwrap_or(0);
        s.calls.push(if pid.is_some() { format!("{name} {p}") } else { name.to_string() });
        if let Some(l) = &*lock(&self.lost) {
            return Err(Self::lost_error(l));
        }
        if let Some(e) = s.fails.remove(&(name, p)) {
            if let AgentError::Lost { lost, .. } = &e {
                *lock(&self.lost) = Some(lost.clone());
            }
            if s.takes_effect.contains(&(name, p)) {
                then(&mut s, p);
            }
            return Err(e);
        }
        then(&mut s, p);
        Ok(())
    }

    fn transition(from: ProcessState, to: ProcessState, call: &'static str) -> impl FnOnce(&mut AgentScript, u32) {
        move |s, p| {
            if s.states.get(&p) == Some(&from) {
                s.states.insert(p, to);
            } else {
                panic!("fake driver: {call} of pid {p} in state {:?}", s.states.get(&p));
            }
        }
    }
}

impl DriverAgent for FakeAgent {
    fn driver(&self) -> Result<DriverInfo, AgentError> {
        self.call("driver", None, |_, _| {})?;
        if let Some(e) = self.script().driver_error.clone() {
            return Err(e);
        }
        Ok(DriverInfo {
            agent_pid: 4000,
            libcuda_path: "libcuda.so.1".into(),
            cuda_driver_version: if self.script().custom_storage { 13040 } else { 13000 },
            load_seconds: 0.0,
            custom_storage: self.script().custom_storage,
        })
    }
    fn node(&self) -> Result<NodeInfo, AgentError> {
        let driver = self.driver()?;
        let s = self.script();
        if let Some(e) = s.node_error.clone() {
            return Err(e);
        }
        Ok(NodeInfo {
            driver,
            nvml: Ok(NvmlInfo {
                driver_version: "580.159.04".into(),
                gpus: s.gpus.clone(),
                gpus_error: None,
                seconds: 0.0,
            }),
        })
    }
    fn cuinit(&self) -> Result<CuInitInfo, AgentError> {
        self.call("cuinit", None, |_, _| {})?;
        match self.script().cuinit_error.clone() {
            Some(e) => Err(e),
            None => Ok(CuInitInfo { seconds: 0.0, waited_seconds: 0.0 }),
        }
    }
    fn restore_thread_id(&self, pid: HostPid) -> Result<HostTid, AgentError> {
        self.call("restore_thread_id", Some(pid), |_, _| {})?;
        match self.script().cuda.get(&pid.get()) {
            Some(t) => Ok(HostTid::new((*t).into()).unwrap()),
            None => Err(cuda_error("cuCheckpointProcessGetRestoreThreadId", CudaCode::NotInitialized)),
        }
    }
    fn restore_thread_id_within(&self, pid: HostPid, _: Duration) -> Result<HostTid, AgentError> {
        self.restore_thread_id(pid)
    }
    fn state(&self, pid: HostPid) -> Result<ProcessState, AgentError> {
        self.call("state", Some(pid), |_, _| {})?;
        let s = self.script();
        if s.state_fails.contains(&pid.get()) {
            return Err(cuda_error("cuCheckpointProcessGetState", CudaCode::Unknown));
        }
        s.states.get(&pid.get()).copied().ok_or(cuda_error("cuCheckpointProcessGetState", CudaCode::NotInitialized))
    }
    fn state_within(&self, pid: HostPid, _: Duration) -> Result<ProcessState, AgentError> {
        self.state(pid)
    }
    fn lock(&self, pid: HostPid, _: u32, _: Duration) -> Result<(), AgentError> {
        self.call("lock", Some(pid), Self::transition(ProcessState::Running, ProcessState::Locked, "lock"))
    }
    fn checkpoint(&self, pid: HostPid, _: Duration) -> Result<(), AgentError> {
        self.call(
            "checkpoint",
            Some(pid),
            Self::transition(ProcessState::Locked, ProcessState::Checkpointed, "checkpoint"),
        )
    }
    fn restore(&self, pid: HostPid, pairs: &[(GpuUuid, GpuUuid)], _: Duration) -> Result<(), AgentError> {
        self.script().restore_pairs.insert(pid.get(), pairs.to_vec());
        self.call("restore", Some(pid), Self::transition(ProcessState::Checkpointed, ProcessState::Locked, "restore"))
    }
    fn unlock(&self, pid: HostPid) -> Result<(), AgentError> {
        self.call("unlock", Some(pid), Self::transition(ProcessState::Locked, ProcessState::Running, "unlock"))
    }
    fn hand_over(&self) -> Result<(), AgentError> {
        self.call("hand_over", None, |_, _| {})
    }
    fn checkpoint_to_storage(
        &self,
        pid: HostPid,
        _page_file: &str,
        _: Duration,
    ) -> Result<ccm_identity::staging::DriverStorage, AgentError> {
        self.call(
            "checkpoint_to_storage",
            Some(pid),
            Self::transition(ProcessState::Locked, ProcessState::Checkpointed, "checkpoint"),
        )?;
        Ok(ccm_identity::staging::DriverStorage {
            regions: Vec::new(),
            table: ccm_identity::staging::StagingTable {
                chunk_bytes: ccm_identity::staging::DEFAULT_CHUNK_BYTES,
                file_bytes: 0,
                regions: Vec::new(),
            },
        })
    }
    fn restore_from_storage(
        &self,
        pid: HostPid,
        pairs: &[(GpuUuid, GpuUuid)],
        _page_file: &str,
        _storage: &ccm_identity::staging::DriverStorage,
        _: Duration,
    ) -> Result<(), AgentError> {
        self.script().restore_pairs.insert(pid.get(), pairs.to_vec());
        self.call(
            "restore_from_storage",
            Some(pid),
            Self::transition(ProcessState::Checkpointed, ProcessState::Locked, "restore"),
        )
    }
    fn staging_released(
        &self,
        _pid: HostPid,
        _page_file: &str,
        _table: &ccm_identity::staging::StagingTable,
    ) -> Result<(), AgentError> {
        Ok(())
    }
    fn uuid_at_pci(&self, pci: PciAddress) -> Result<Option<GpuUuid>, AgentError> {
        Ok(self.script().gpus.iter().find(|g| g.pci == pci).map(|g| g.uuid))
    }
    fn video_memory(&self, pids: &[HostPid], _deadline: Duration) -> Result<PidMemoryReport, AgentError> {
        let mut s = self.script();
        s.calls.push("video_memory".into());
        s.rm_queries.push(pids.iter().map(|p| p.get()).collect());
        if let Some(e) = s.rm_error.clone() {
            return Err(e);
        }
        let gpus = s
            .gpus
            .iter()
            .enumerate()
            .map(|(i, g)| GpuPidMemory {
                pci: g.pci,
                minor: g.minor,
                pids: pids
                    .iter()
                    .map(|p| PidMemory {
                        pid: p.get(),
                        status: RmStatus::OK,
                        memory: VideoMemory {
                            private: 0,
                            shared_owned: if s.cuda.contains_key(&p.get()) { 512 << 20 } else { 0 },
                            shared_duped: if i == 0 { s.imported.get(&p.get()).copied().unwrap_or(0) } else { 0 },
                        },
                    })
                    .collect(),
            })
            .collect();
        Ok(PidMemoryReport { driver_version: "580.159.04".into(), gpus, seconds: 0.001 })
    }
    fn framebuffer(&self, _deadline: Duration) -> Result<FramebufferReport, AgentError> {
        let mut s = self.script();
        s.calls.push("framebuffer".into());
        let Some(free) = s.rm_free.clone() else {
            return Err(AgentError::Rm("/proc/driver/nvidia/version: cannot open it".into()));
        };
        let gpus = s
            .gpus
            .iter()
            .filter_map(|g| {
                free.get(&g.pci.bus).map(|f| GpuFramebuffer {
                    pci: g.pci,
                    minor: g.minor,
                    free: *f,
                    total: g.memory_total,
                })
            })
            .collect();
        Ok(FramebufferReport { driver_version: "580.159.04".into(), gpus, seconds: 0.001 })
    }
    fn device_memory(&self) -> Result<Vec<GpuMemory>, AgentError> {
        let mut s = self.script();
        s.calls.push("device_memory".into());
        if let Some(e) = s.device_memory_error.clone() {
            return Err(e);
        }
        Ok(s.gpus
            .iter()
            .enumerate()
            .map(|(i, g)| GpuMemory {
                gpu: g.uuid,
                free: Some(100 << 30),
                total: Some(g.memory_total),
                error: None,
                processes: if i == 0 {
                    s.device_bytes.iter().map(|(p, b)| (*p, Some(*b))).collect()
                } else {
                    Vec::new()
                },
            })
            .collect())
    }
    fn lost(&self) -> Option<Lost> {
        lock(&self.lost).clone()
    }
    fn exit_without_waiting(&self) {
        self.script().exit_without_waiting = true;
    }
}

/// Hands out the scripted agents in order; `Err` once none is left.
#[derive(Clone, Default)]
pub struct FakeStarter {
    pub agents: Arc<Mutex<VecDeque<Result<FakeAgent, String>>>>,
    pub started: Arc<Mutex<Vec<WarmUp>>>,
}

impl FakeStarter {
    pub fn with(agents: Vec<Result<FakeAgent, String>>) -> FakeStarter {
        FakeStarter { agents: Arc::new(Mutex::new(agents.into())), started: Arc::default() }
    }
}

impl AgentStarter for FakeStarter {
    fn start(&self, _: &dyn CriuHost, _: &Config, order: WarmUp) -> Result<Box<dyn DriverAgent>, EngineError> {
        lock(&self.started).push(order);
        match lock(&self.agents).pop_front() {
            Some(Ok(a)) => Ok(Box::new(a)),
            Some(Err(e)) => Err(EngineError::Agent(AgentError::Agent(e))),
            None => Err(EngineError::Agent(AgentError::Agent("no agent left in the script".into()))),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The target processes.

/// A container `/dev` of the script.
#[derive(Clone)]
pub enum FakeDev {
    Host,
    Own { minors: Vec<u32>, impostors: Vec<(String, &'static str)>, fail_edits: bool },
    Foreign { why: ForeignDev, minors: Vec<u32> },
    Unreadable,
}

#[derive(Default)]
pub struct TargetScript {
    /// Pids that map libcuda.
    pub libcuda: BTreeSet<u32>,
    /// Pids whose maps cannot be read.
    pub maps_unreadable: BTreeSet<u32>,
    /// CRIU's own CUDA plugin is loaded.
    pub criu_cuda_plugin: bool,
    pub ns_pids: BTreeMap<u32, u32>,
    pub children: BTreeMap<u32, Vec<u32>>,
    pub killed: Vec<u32>,
    pub env_unreadable: BTreeSet<u32>,
    pub env: BTreeMap<u32, ProcessEnv>,
    /// Pids whose maps cannot be read before the checkpoint.
    pub read_maps_fails: BTreeSet<u32>,
    pub minors: BTreeMap<u32, BTreeSet<u32>>,
    /// The sites each pid's scan finds (`None`: the scan fails); the narrow scan finds them only
    /// when `narrow_finds` holds the pid.
    pub sites: BTreeMap<u32, Option<Vec<PciSite>>>,
    pub narrow_finds: BTreeSet<u32>,
    pub scans: Vec<(u32, bool)>,
    /// What reconciliation of each pid finds wrong.
    pub reconcile_failures: BTreeMap<u32, Vec<crate::reconcile::ReconcileFailure>>,
    pub reconciled: Vec<u32>,
    pub resume_fails: BTreeSet<u32>,
    /// `resume TID` / `stop TID`, in order.
    pub ptrace: Vec<String>,
    pub stop_fails: BTreeSet<u32>,
    pub frozen: BTreeMap<u32, String>,
    pub thaw_fails: bool,
    pub refreeze_fails: bool,
    pub cgroup_events: Vec<String>,
    pub mount_ns: BTreeMap<u32, u64>,
    /// CRIU's own mounts (`own_mounts`).
    pub own_mounts: Vec<ccm_process::mountinfo::MountEntry>,
    pub devs: BTreeMap<u32, FakeDev>,
    pub dev_edits: Vec<String>,
    pub spec: Option<Result<RuntimeSpec, String>>,
    pub kernel_gpus: Option<Vec<GpuIdentity>>,
    /// The node's NVIDIA device numbers.
    pub devices: ccm_identity::claims::NvidiaDevices,
    /// What each pid holds of the NVIDIA nodes (absent: nothing).
    pub holdings: BTreeMap<u32, ccm_process::claims::Holdings>,
    /// Pids whose holdings cannot be read.
    pub holdings_fail: BTreeSet<u32>,
    /// Every pid whose holdings were read, in order.
    pub holdings_read: Vec<u32>,
    /// What each process holds that CRIU cannot dump.
    pub undumpable: BTreeMap<u32, Vec<ccm_identity::criu_support::Undumpable>>,
    /// Processes whose NVIDIA descriptors are all their parent's (forked after cuInit).
    pub forked: BTreeSet<u32>,
    /// The node's MPS servers.
    pub mps_servers: Vec<u32>,
    /// Start times that differ from the pid's default (the pid itself): a pid listed twice is reused between the
    /// two reads (first value, then the second).
    pub start_times: BTreeMap<u32, VecDeque<u64>>,
    /// Pid numbers taken in CRIU's namespace: what holds each and how many more checks find it taken
    /// (`u32::MAX`: every check).
    pub taken_pids: BTreeMap<u32, (ccm_process::pid_use::PidHolder, u32)>,
    /// The pids of each check whether they are free, in order.
    pub pid_checks: Vec<Vec<u32>>,
}

#[derive(Clone, Default)]
pub struct FakeTargets(pub Arc<Mutex<TargetScript>>);

impl FakeTargets {
    pub fn script(&self) -> MutexGuard<'_, TargetScript> {
        lock(&self.0)
    }
    /// A process that maps libcuda.
    pub fn cuda(&self, pid: u32) -> &Self {
        self.script().libcuda.insert(pid);
        self
    }
}

fn no_such(pid: u32) -> ProcessError {
    ProcessError::NoSuchProcess { pid, path: PathBuf::from(format!("/proc/{pid}")) }
}

impl Targets for FakeTargets {
    fn maps_library(&self, pid: u32, fragment: &str) -> Result<bool, ProcessError> {
        let s = self.script();
        if fragment == crate::CRIU_CUDA_PLUGIN_FILE {
            return Ok(s.criu_cuda_plugin);
        }
        if s.maps_unreadable.contains(&pid) {
            return Err(no_such(pid));
        }
        Ok(s.libcuda.contains(&pid))
    }
    fn ns_pid(&self, pid: u32) -> Option<u32> {
        self.script().ns_pids.get(&pid).copied()
    }
    fn children_recursive(&self, pid: u32) -> Vec<u32> {
        let s = self.script();
        let mut out = Vec::new();
        let mut todo = vec![pid];
        while let Some(p) = todo.pop() {
            for c in s.children.get(&p).into_iter().flatten() {
                out.push(*c);
                todo.push(*c);
            }
        }
        out
    }
    fn kill(&self, pid: u32) -> Result<(), ProcessError> {
        self.script().killed.push(pid);
        Ok(())
    }
    fn process_env(&self, pid: u32) -> Result<ProcessEnv, ProcessError> {
        let s = self.script();
        if s.env_unreadable.contains(&pid) {
            return Err(no_such(pid));
        }
        Ok(s.env.get(&pid).cloned().unwrap_or_default())
    }
    fn read_maps(&self, pid: u32) -> Result<Vec<Mapping>, ProcessError> {
        if self.script().read_maps_fails.contains(&pid) {
            return Err(no_such(pid));
        }
        Ok(Vec::new())
    }
    fn nvidia_minors(&self, pid: u32, _: &[Mapping]) -> Result<BTreeSet<u32>, ProcessError> {
        Ok(self.script().minors.get(&pid).cloned().unwrap_or_default())
    }
    fn scan_identity(
        &self,
        pid: u32,
        _: &[Mapping],
        _: &[(GpuUuid, PciSignature)],
        props: &[GpuIdentity],
        scope: ScanScope,
    ) -> Result<ScanReport, ProcessError> {
        let mut s = self.script();
        let narrow = !props.is_empty() || scope == ScanScope::LIBCUDA_OBJECTS;
        s.scans.push((pid, narrow));
        let sites = match s.sites.get(&pid) {
            Some(None) => return Err(no_such(pid)),
            Some(Some(v)) if !narrow || s.narrow_finds.contains(&pid) => v.clone(),
            _ => Vec::new(),
        };
        Ok(ScanReport { sites, bytes_scanned: 4 << 20, mappings_scanned: 3, ..ScanReport::default() })
    }
    fn reconcile(&self, pid: HostPid, _: &ProcessPlan, _: &Node) -> ReconcileSummary {
        let mut s = self.script();
        s.reconciled.push(pid.get());
        ReconcileSummary {
            sites_rewritten: 1,
            table: "scripted".into(),
            failures: s.reconcile_failures.get(&pid.get()).cloned().unwrap_or_default(),
            ..ReconcileSummary::default()
        }
    }
    fn resume_restore_thread(&self, tid: u32) -> Result<Box<dyn RunningThread>, PtraceError> {
        let mut s = self.script();
        if s.resume_fails.contains(&tid) {
            return Err(PtraceError::Exited { tid, how: "scripted".into() });
        }
        s.ptrace.push(format!("resume {tid}"));
        Ok(Box::new(FakeRunning { tid, targets: self.clone() }))
    }
    fn frozen_cgroup_of(&self, pid: u32) -> Option<String> {
        self.script().frozen.get(&pid).cloned()
    }
    fn thaw(&self, path: &str, _: Duration) -> Result<Box<dyn ThawedCgroup>, CgroupError> {
        let mut s = self.script();
        if s.thaw_fails {
            return Err(CgroupError::Thaw { path: path.to_string(), source: scripted_write(path) });
        }
        s.cgroup_events.push(format!("thaw {path}"));
        Ok(Box::new(FakeThawed { path: path.to_string(), targets: self.clone() }))
    }
    fn mount_namespace(&self, pid: u32) -> Result<u64, ProcessError> {
        self.script().mount_ns.get(&pid).copied().ok_or(no_such(pid))
    }
    fn container_dev(&self, pid: u32) -> Result<DevView, ProcessError> {
        Ok(match self.script().devs.get(&pid).cloned().unwrap_or(FakeDev::Host) {
            FakeDev::Host => DevView::HostNamespace,
            FakeDev::Own { minors, impostors, fail_edits } => {
                DevView::Own(Box::new(FakeOwnDev { minors, impostors, fail_edits, targets: self.clone() }))
            }
            FakeDev::Foreign { why, minors } => DevView::Foreign { why, gpu_minors: minors },
            FakeDev::Unreadable => return Err(no_such(pid)),
        })
    }
    fn own_mounts(&self) -> Result<Vec<ccm_process::mountinfo::MountEntry>, ProcessError> {
        Ok(self.script().own_mounts.clone())
    }
    fn anon_rollup(&self, _pid: u32) -> Option<ccm_process::maps::AnonRollup> {
        None
    }
    fn restoring_runtime_spec(&self) -> Result<Option<RuntimeSpec>, FileError> {
        match self.script().spec.clone() {
            None => Ok(None),
            Some(Ok(s)) => Ok(Some(s)),
            Some(Err(_)) => Err(FileError::Missing { path: PathBuf::from("/bundle/config.json") }),
        }
    }
    fn hostname(&self) -> String {
        "node-a".into()
    }
    fn kernel_gpus(&self) -> Result<Vec<GpuIdentity>, ProcfsError> {
        self.script().kernel_gpus.clone().ok_or_else(|| ProcfsError::Missing(ccm_driver::procfs::GPUS_DIR.into()))
    }
    fn nvidia_devices(&self) -> ccm_identity::claims::NvidiaDevices {
        self.script().devices.clone()
    }
    fn mps_servers(&self) -> Vec<u32> {
        self.script().mps_servers.clone()
    }
    fn start_time(&self, pid: u32) -> Option<u64> {
        let mut s = self.script();
        match s.start_times.get_mut(&pid) {
            Some(q) if q.len() > 1 => q.pop_front(),
            Some(q) => q.front().copied(),
            None => Some(u64::from(pid)),
        }
    }
    fn device_holdings(
        &self,
        pid: u32,
        _: &ccm_identity::claims::NvidiaDevices,
    ) -> Result<(String, ccm_process::claims::Holdings), ProcessError> {
        let mut s = self.script();
        s.holdings_read.push(pid);
        if s.holdings_fail.contains(&pid) {
            return Err(no_such(pid));
        }
        Ok((format!("proc{pid}"), s.holdings.get(&pid).cloned().unwrap_or_default()))
    }
    fn undumpable(&self, pid: u32) -> Vec<ccm_identity::criu_support::Undumpable> {
        self.script().undumpable.get(&pid).cloned().unwrap_or_default()
    }
    fn holds_only_parents_nvidia_files(&self, pid: u32, _: &ccm_identity::claims::NvidiaDevices) -> Option<bool> {
        Some(self.script().forked.contains(&pid))
    }
    fn pid_holders(&self, pids: &[u32]) -> Result<BTreeMap<u32, ccm_process::pid_use::PidHolder>, ProcessError> {
        let mut s = self.script();
        s.pid_checks.push(pids.to_vec());
        let mut held = BTreeMap::new();
        for p in pids {
            if let Some((h, left)) = s.taken_pids.get_mut(p) {
                if *left > 0 {
                    held.insert(*p, h.clone());
                    if *left != u32::MAX {
                        *left -= 1;
                    }
                }
            }
        }
        Ok(held)
    }
    /// The fake processes have no memory: every chunk is recorded as a hole (the sessions' offload logic is
    /// proven under real CRIU on the test doubles, tests/sim).
    fn write_staging(
        &self,
        jobs: &[ccm_process::staging_pages::WriteJob<'_>],
        opts: ccm_process::staging_pages::CopyOptions,
    ) -> Result<Vec<ccm_process::staging_pages::Written>, ccm_process::staging_pages::StagingIoError> {
        use ccm_identity::staging::{StagedChunk, StagingRegion, StagingTable};
        Ok(jobs
            .iter()
            .map(|j| ccm_process::staging_pages::Written {
                table: StagingTable {
                    chunk_bytes: opts.chunk_bytes,
                    file_bytes: 0,
                    regions: j
                        .ranges
                        .iter()
                        .map(|&(s, e)| StagingRegion {
                            start: s,
                            len: e - s,
                            // A test double's range is small: a count past usize would be a broken test.
                            chunks: vec![
                                StagedChunk::Hole;
                                usize::try_from((e - s).div_ceil(opts.chunk_bytes))
                                    .expect("chunk count fits usize")
                            ],
                        })
                        .collect(),
                },
                direct: false,
            })
            .collect())
    }
    fn fill_staging(
        &self,
        _jobs: &[ccm_process::staging_pages::FillJob<'_>],
        _opts: ccm_process::staging_pages::CopyOptions,
    ) -> Result<u64, ccm_process::staging_pages::StagingIoError> {
        Ok(0)
    }
    fn release_pages(
        &self,
        _pid: u32,
        _maps: &[Mapping],
        _ranges: &[(u64, u64)],
    ) -> Result<(), ccm_process::remote_syscall::RemoteSyscallError> {
        Ok(())
    }
}

/// The scripted failure of a write to a cgroup's `cgroup.freeze`.
fn scripted_write(cgroup: &str) -> FileError {
    FileError::Io {
        action: "write",
        path: Path::new(cgroup).join("cgroup.freeze"),
        source: std::io::Error::other("scripted"),
    }
}

struct FakeRunning {
    tid: u32,
    targets: FakeTargets,
}

impl RunningThread for FakeRunning {
    fn tid(&self) -> u32 {
        self.tid
    }
    fn stop(self: Box<Self>) -> Result<(), PtraceError> {
        let mut s = self.targets.script();
        s.ptrace.push(format!("stop {}", self.tid));
        if s.stop_fails.contains(&self.tid) {
            return Err(PtraceError::StopTimeout { tid: self.tid, waited: Duration::from_secs(1) });
        }
        Ok(())
    }
}

struct FakeThawed {
    path: String,
    targets: FakeTargets,
}

impl std::fmt::Debug for FakeThawed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FakeThawed({})", self.path)
    }
}

impl ThawedCgroup for FakeThawed {
    fn path(&self) -> &str {
        &self.path
    }
    fn refreeze(&self) -> Result<(), CgroupError> {
        let mut s = self.targets.script();
        s.cgroup_events.push(format!("refreeze {}", self.path));
        if s.refreeze_fails {
            return Err(CgroupError::Refreeze { path: self.path.clone(), source: scripted_write(&self.path) });
        }
        Ok(())
    }
}

struct FakeOwnDev {
    minors: Vec<u32>,
    impostors: Vec<(String, &'static str)>,
    fail_edits: bool,
    targets: FakeTargets,
}

impl OwnDev for FakeOwnDev {
    fn gpu_minors(&self) -> &[u32] {
        &self.minors
    }
    fn impostors(&self) -> &[(String, &'static str)] {
        &self.impostors
    }
    fn create_gpu_node(&self, minor: u32) -> Result<(), NodeEditError> {
        self.targets.script().dev_edits.push(format!("create {minor}"));
        if self.fail_edits {
            return Err(NodeEditError::Exists { name: format!("nvidia{minor}"), kind: "a directory" });
        }
        Ok(())
    }
    fn remove_gpu_node(&self, minor: u32) -> Result<(), NodeEditError> {
        self.targets.script().dev_edits.push(format!("remove {minor}"));
        if self.fail_edits {
            return Err(NodeEditError::NotAGpuNode { name: format!("nvidia{minor}"), kind: "a regular file" });
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// CRIU.

/// CRIU with an image directory (a fresh temporary one unless none).
pub struct FakeCriu {
    pub dir: Option<PathBuf>,
    /// `check_and_remove_inventory_plugin`'s answer.
    pub in_inventory: Option<bool>,
    pub inventory_added: Mutex<bool>,
}

impl FakeCriu {
    pub fn new(name: &str) -> FakeCriu {
        let dir = std::env::temp_dir().join(format!("ccm-engine-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        FakeCriu { dir: Some(dir), in_inventory: None, inventory_added: Mutex::new(false) }
    }
    pub fn without_dir() -> FakeCriu {
        FakeCriu { dir: None, in_inventory: None, inventory_added: Mutex::new(false) }
    }
    pub fn path(&self) -> &Path {
        self.dir.as_deref().unwrap()
    }
}

impl Drop for FakeCriu {
    fn drop(&mut self) {
        if let Some(d) = &self.dir {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

impl CriuHost for FakeCriu {
    fn image_dir(&self) -> Option<OwnedFd> {
        self.dir.as_ref().map(|d| OwnedFd::from(std::fs::File::open(d).unwrap()))
    }
    fn add_inventory_plugin(&self, _: &str) -> bool {
        *lock(&self.inventory_added) = true;
        true
    }
    fn check_and_remove_inventory_plugin(&self, _: &str) -> Option<bool> {
        self.in_inventory
    }
    fn set_interrupt_only_mode(&self) -> bool {
        true
    }
    fn log_fd(&self) -> Option<RawFd> {
        None
    }
}

/// The seams of a test: its targets and the agents it hands out.
pub fn seams(targets: &FakeTargets, agents: Vec<Result<FakeAgent, String>>) -> (Seams, FakeStarter) {
    let starter = FakeStarter::with(agents);
    (Seams { targets: Arc::new(targets.clone()), agents: Arc::new(starter.clone()) }, starter)
}

// ---------------------------------------------------------------------------------------------
// The log.

static LINES: Mutex<Vec<String>> = Mutex::new(Vec::new());

struct Capture;

impl log::Log for Capture {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, r: &log::Record<'_>) {
        lock(&LINES).push(format!("{} {}", r.level(), r.args()));
    }
    fn flush(&self) {}
}

/// Captures every log line of the test binary (tests run in parallel: each test finds its own
/// lines by the pids it uses).
pub fn capture_log() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = log::set_boxed_logger(Box::new(Capture));
        log::set_max_level(log::LevelFilter::Trace);
    });
}

/// Whether a captured line holds every one of `parts`.
pub fn seen(parts: &[&str]) -> bool {
    !logged(parts).is_empty()
}

/// The captured lines holding every one of `parts`.
pub fn logged(parts: &[&str]) -> Vec<String> {
    lock(&LINES).iter().filter(|l| parts.iter().all(|p| l.contains(p))).cloned().collect()
}
