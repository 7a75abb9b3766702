//! The dump side: lock (PAUSE_DEVICES), checkpoint every CUDA process of the tree in parallel and
//! write identity images (first CHECKPOINT_DEVICES), roll back at `exit(DUMP)` when needed.
//!
//! Each hook is a short list of steps: every step returns what happened, and the hook (the edge)
//! logs it and answers CRIU. What is done to processes goes through [`Targets`], every driver call
//! through [`DriverAgent`] (`crate::seam`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ccm_agent::{AgentError, WarmUp};
use ccm_driver::abi::CudaCode;
use ccm_driver::checkpoint::{put_back, timed, ProcessState, Step, Timed};
use ccm_identity::image::IdentityImage;
use ccm_identity::memory::DeviceMemoryUse;
use ccm_identity::{HostPid, HostTid};
use ccm_process::dir::Dir;
use log::{debug, error, info, warn};

mod identity;

use identity::{collect_identity, device_memory_by_pid, write_image, BeforeCheckpoint};

use crate::batch::{with_restore_threads_running, BatchError, OnResumeError};
use crate::claims::{read_holdings, Claim, DumpClaims, ReadHoldings};
use crate::host::CriuHost;
use crate::node::Node;
use crate::seam::{DriverAgent, Seams, Targets, ThawedCgroup};
use crate::sharing::{importers_in, SharingFacts, SharingVerdict};
use crate::{
    Config, EngineError, HookOutcome, IpcImporters, LeaveRunning, MultiProcess, ProcessFailure, LIBCUDA_FILE,
    PLUGIN_NAME,
};

/// One CUDA process this dump touched.
#[derive(Debug)]
struct Tracked {
    pid: HostPid,
    restore_tid: HostTid,
    initial: ProcessState,
    locked_by_us: bool,
    checkpointed_by_us: bool,
    /// Set once the batch checkpoint ran.
    checkpoint_result: Option<Result<(), ProcessFailure>>,
    /// Device memory the process held at dump (bytes), when NVML told.
    device_bytes: Option<u64>,
    /// A driver call on it was in flight when the agent was lost: until then the driver may still
    /// change its state by itself (a lock within its timeout, a checkpoint finishing), so the
    /// rollback waits for the state to settle before it puts the process back.
    settles_by: Option<(Instant, ProcessState)>,
    /// Its staging pages in its page file (issue 47): a put-back fills them back first.
    staged: Option<crate::staging::Staged>,
    /// Its device memory in its page file, copied there by the driver agent through the driver's custom storage
    /// (CUDA 13.4): a put-back restores it from there.
    stored: Option<Stored>,
}

/// A page file made (empty) for the driver agent's copy: its name in the image directory and its absolute path.
#[derive(Debug)]
struct StorageFile {
    name: String,
    path: String,
}

/// A process checkpointed to the driver's custom storage: its page file (absolute, for the driver agent) and table.
#[derive(Debug)]
struct Stored {
    page_file: String,
    storage: ccm_identity::staging::DriverStorage,
}

impl Tracked {
    fn new(pid: HostPid, restore_tid: HostTid, initial: ProcessState) -> Tracked {
        Tracked {
            pid,
            restore_tid,
            initial,
            locked_by_us: false,
            checkpointed_by_us: false,
            checkpoint_result: None,
            device_bytes: None,
            settles_by: None,
            staged: None,
            stored: None,
        }
    }
}

pub struct DumpSession {
    config: Config,
    seams: Seams,
    /// The driver agent until [`Node::load`] takes it.
    agent: Option<Box<dyn DriverAgent>>,
    node: Option<Arc<Node>>,
    node_failed: bool,
    tracked: BTreeMap<HostPid, Tracked>,
    inventory_added: bool,
    batch_done: bool,
    /// When CRIU's alarm for the collection of the tree (its `--timeout`, set right after init) fires.
    alarm_end: Instant,
    /// Frozen cgroups the dump thawed for the driver, frozen again at exit(DUMP).
    thawed: Vec<Box<dyn ThawedCgroup>>,
    /// The dump's root task: the first pid of PAUSE_DEVICES (CRIU seizes the root before its children).
    root: Option<HostPid>,
    /// What the importer check of the whole tree, before the first lock, found.
    tree_check: TreeCheck,
    /// The NVIDIA nodes of processes that are no CUDA processes (forked workers), claimed for CRIU.
    claims: DumpClaims,
    /// What each process of the tree that is no CUDA process holds of the NVIDIA nodes, read at the first
    /// CHECKPOINT_DEVICES beside the checkpoint (`None` before it); each one's own hook takes its entry.
    holdings: Option<ReadHoldings>,
    /// Whether the tree was checked before the first lock (what CRIU cannot dump, the claims file's bound).
    tree_checked_before_lock: bool,
}

/// The importer check of the tree at the first CUDA process's PAUSE_DEVICES.
#[derive(Debug)]
enum TreeCheck {
    NotAsked,
    /// The resource manager answered (importers allowed by `ipc allow`, if any).
    Asked(SharingFacts),
    /// It could not be asked: why.
    Unavailable(String),
}

/// How long the resource manager may take to answer the importer check (measured: 1-2 ms for 14 pids);
/// past it the dump goes on without the check, as when the driver cannot be asked.
const RM_DEADLINE: Duration = Duration::from_secs(2);
/// The most processes of a tree asked about before the first lock (a query answers 200 at a time).
const MAX_TREE_PIDS: usize = 4096;

/// Why `init(DUMP)` set up no dump session (logged there): CUDA processes are then left to CRIU.
#[derive(Debug)]
pub enum NoDumpDriver {
    /// The driver agent could not start.
    Agent(EngineError),
    /// The agent started but has no usable libcuda.
    Driver(AgentError),
}

/// How long a thawed cgroup may take to say it is thawed.
const THAW_DEADLINE: Duration = Duration::from_secs(1);

/// What is kept free before CRIU's alarm: the agent's answer and the hook's return.
const ALARM_GUARD: Duration = Duration::from_millis(500);
/// Less than this left before CRIU's alarm, and a lock is not even tried.
const MIN_LOCK_BUDGET: Duration = Duration::from_millis(600);

/// What the driver says `pid` is, at PAUSE_DEVICES.
enum Query {
    Cuda {
        restore_tid: HostTid,
        initial: ProcessState,
    },
    /// It maps libcuda but has no CUDA restore thread.
    NotCuda(AgentError),
}

/// How the lock of a RUNNING process ended.
enum LockOutcome {
    Locked,
    /// Too little of CRIU's alarm was left to try.
    NoTime {
        left: Duration,
    },
    /// The driver's lock failed (or its agent was lost).
    Failed {
        error: AgentError,
        /// The unlock of a failed lock that took effect anyway.
        unlocked: Option<Result<(), AgentError>>,
    },
}

impl DumpSession {
    /// `init(DUMP)`: starts the driver agent, which loads libcuda (no cuInit wait here: hosts
    /// without the NVIDIA driver must dump as before; its cuInit and NVML go on while CRIU
    /// collects the tree), and asks CRIU not to freeze the tree.
    pub fn init(config: Config, host: &dyn CriuHost) -> Result<DumpSession, NoDumpDriver> {
        DumpSession::init_with(config, host, Seams::real())
    }

    /// [`DumpSession::init`] through the given seams.
    pub fn init_with(config: Config, host: &dyn CriuHost, seams: Seams) -> Result<DumpSession, NoDumpDriver> {
        let agent = match seams.agents.start(host, &config, WarmUp::Dump) {
            Ok(a) => a,
            Err(e) => {
                error!("{e}; CUDA processes cannot be checkpointed in this run");
                return Err(NoDumpDriver::Agent(e));
            }
        };
        match agent.driver() {
            Ok(d) => {
                debug!("driver agent pid {} loaded {}", d.agent_pid, d.libcuda_path);
                // The driver's restore thread must run during CHECKPOINT_DEVICES, which the cgroup
                // freezer would prevent.
                let set = host.set_interrupt_only_mode();
                debug!("compel interrupt-only mode: {}", if set { "set" } else { "not offered by this CRIU" });
                Ok(DumpSession::new(config, agent, seams))
            }
            Err(e) => {
                warn!("disabled: {e}");
                Err(NoDumpDriver::Driver(e))
            }
        }
    }

    fn new(config: Config, agent: Box<dyn DriverAgent>, seams: Seams) -> DumpSession {
        let config_lock_timeout = config.lock_timeout;
        // One CRIU run is one dump: its scans share one budget.
        ccm_process::mem::DumpScanBudget::reset();
        // The dump's agent ends by itself once told (CRIU need not wait for the driver's teardown).
        agent.exit_without_waiting();
        DumpSession {
            config,
            seams,
            agent: Some(agent),
            node: None,
            node_failed: false,
            tracked: BTreeMap::new(),
            inventory_added: false,
            batch_done: false,
            alarm_end: Instant::now() + config_lock_timeout,
            thawed: Vec::new(),
            root: None,
            tree_check: TreeCheck::NotAsked,
            tree_checked_before_lock: false,
            claims: DumpClaims::default(),
            holdings: None,
        }
    }

    fn node(&mut self) -> Option<Arc<Node>> {
        if self.node.is_none() && !self.node_failed {
            match self.agent.take().map(Node::load) {
                Some(Ok(n)) => self.node = Some(Arc::new(n)),
                Some(Err(e)) => {
                    warn!("disabled: {e}");
                    self.node_failed = true;
                }
                None => self.node_failed = true,
            }
        }
        self.node.clone()
    }

    /// What is left of CRIU's alarm for a driver call, less the guard.
    fn alarm_budget(&self) -> Duration {
        self.alarm_end.saturating_duration_since(Instant::now()).saturating_sub(ALARM_GUARD)
    }

    /// PAUSE_DEVICES: the task still runs. Decide whether it is a CUDA process, remember its
    /// state and lock it.
    pub fn pause_devices(&mut self, pid: i32, host: &dyn CriuHost) -> HookOutcome {
        let Some(pid) = HostPid::new(pid.into()) else { return HookOutcome::NotMine };
        self.root.get_or_insert(pid);
        if self.tracked.contains_key(&pid) {
            return HookOutcome::NotMine;
        }
        // Cheap filter first: a process that has not mapped libcuda cannot be a CUDA process, and
        // this keeps cuInit off every dump of plain processes.
        match self.seams.targets.maps_library(pid.get(), LIBCUDA_FILE) {
            Ok(true) => {}
            Ok(false) => {
                debug!("pid {pid} is not a CUDA process; leaving it to CRIU (-ENOTSUP)");
                return HookOutcome::NotMine;
            }
            Err(e) => {
                debug!("pid {pid}: cannot read its mappings ({e}); leaving it to CRIU (-ENOTSUP)");
                return HookOutcome::NotMine;
            }
        }
        if let Some(e) = crate::conflicting_plugin_in(&*self.seams.targets) {
            return HookOutcome::Failed(e);
        }
        let Some(node) = self.node() else { return HookOutcome::NotMine };
        if let Err(e) = node.cuinit() {
            return HookOutcome::Failed(EngineError::Driver { pid, source: e });
        }
        match self.thaw_for_driver(pid) {
            Ok(Some(path)) => info!(
                "pid {pid}: its cgroup {path} was frozen (containerd pauses a task before its checkpoint); thawed it for the driver, which needs the process's threads, until the dump ends"
            ),
            Ok(None) => {}
            Err(e) => return HookOutcome::Failed(e),
        }
        let (restore_tid, initial) = match self.query(&*node.agent, pid) {
            Ok(Query::Cuda { restore_tid, initial }) => (restore_tid, initial),
            Ok(Query::NotCuda(e)) => {
                debug!("pid {pid} maps libcuda but has no CUDA restore thread ({e}); leaving it to CRIU (-ENOTSUP)");
                return HookOutcome::NotMine;
            }
            Err(e) => return HookOutcome::Failed(e),
        };
        // Before its lock: managed memory, which driver 580 cannot checkpoint (it would answer NOT_SUPPORTED after
        // the lock, and the tree would be unlocked again).
        if let Err(e) = self.check_managed_memory(pid) {
            return HookOutcome::Failed(e);
        }
        // Before the first lock: a tree holding a CUDA IPC importer is refused while nothing is locked.
        if let Err(e) = self.check_tree_for_importers(&node, pid) {
            return HookOutcome::Failed(e);
        }
        // Before the first lock: a tree whose NVIDIA holdings the claims file could not record (the restore would
        // refuse such a file) is refused while nothing is locked.
        if let Err(e) = self.check_tree_before_lock(pid) {
            return HookOutcome::Failed(e);
        }
        if !self.inventory_added {
            self.inventory_added = host.add_inventory_plugin(PLUGIN_NAME);
            debug!(
                "image inventory entry {PLUGIN_NAME}: {}",
                if self.inventory_added { "added" } else { "not offered by this CRIU" }
            );
        }
        let mut t = Tracked::new(pid, restore_tid, initial);
        if initial == ProcessState::Running {
            let outcome = self.lock(&*node.agent, &mut t);
            self.tracked.insert(pid, t);
            match outcome {
                LockOutcome::Locked => {}
                LockOutcome::NoTime { left } => {
                    return HookOutcome::Failed(EngineError::NoTimeToLock {
                        pid,
                        left: left.as_secs_f64(),
                        timeout_s: self.config.lock_timeout.as_secs(),
                    })
                }
                LockOutcome::Failed { error, unlocked } => {
                    match unlocked {
                        Some(Ok(())) => warn!("pid {pid}: lock failed, unlocked it again"),
                        Some(Err(u)) => error!("pid {pid} is left LOCKED after a failed lock ({u}); run `criu-cuda-migrate recover --pid {pid}`"),
                        None => {}
                    }
                    return HookOutcome::Failed(EngineError::Driver { pid, source: error });
                }
            }
        } else {
            warn!(
                "pid {pid} is already {initial} (an earlier run that died, or another tool?); leaving its CUDA state as found. \
                 If nothing else is checkpointing it, run `criu-cuda-migrate recover --pid {pid}` after this dump"
            );
            self.tracked.insert(pid, t);
        }
        info!("pid {pid}: CUDA process, restore thread {restore_tid}, initial state {initial}");
        HookOutcome::Done
    }

    /// `CRIU_CUDA_MIGRATE_MANAGED=refuse` (the default): a CUDA process that maps managed memory
    /// ([`ccm_identity::managed`]) is refused before its lock. Mappings that cannot be read leave it to the driver.
    fn check_managed_memory(&mut self, pid: HostPid) -> Result<(), EngineError> {
        if self.config.managed == crate::config::ManagedMemory::Try {
            return Ok(());
        }
        let devices = self.claims.devices(&self.config, &*self.seams.targets);
        let (comm, held) = match self.seams.targets.device_holdings(pid.get(), devices) {
            Ok(h) => h,
            Err(e) => {
                debug!("pid {pid}: its mappings cannot be read for the managed-memory check ({e}); the driver decides");
                return Ok(());
            }
        };
        let managed = crate::sharing::managed_memory_of(&held);
        if managed.is_empty() {
            return Ok(());
        }
        Err(EngineError::ManagedMemoryRefused { pid, comm: ccm_identity::text::shown(&comm), managed })
    }

    /// The importer check of the whole tree, once, at the first CUDA process (before its lock): the
    /// kernel driver's resource manager is asked about the root and every descendant (and `pid`),
    /// whoever exported the memory. An importer fails the hook under `ipc refuse` (CRIU then ends the
    /// dump; nothing was locked or checkpointed); `ipc allow` warns. When the resource manager cannot
    /// be asked, the reason is kept for the warning at CHECKPOINT_DEVICES.
    fn check_tree_for_importers(&mut self, node: &Node, pid: HostPid) -> Result<(), EngineError> {
        if !matches!(self.tree_check, TreeCheck::NotAsked) {
            return Ok(());
        }
        let root = self.root.unwrap_or(pid);
        // The tree breadth-first from its root, capped; this process always among them.
        let mut pids: Vec<HostPid> = std::iter::once(root.get())
            .chain(self.seams.targets.children_recursive(root.get()))
            .take(MAX_TREE_PIDS - 1)
            .chain(std::iter::once(pid.get()))
            .filter_map(|p| HostPid::new(p.into()))
            .collect();
        pids.sort();
        pids.dedup();
        let deadline = RM_DEADLINE.min(self.alarm_budget()).max(Duration::from_millis(50));
        // Each pid names the process that has it now: its start time before the question, read again after.
        let started: BTreeMap<HostPid, Option<u64>> =
            pids.iter().map(|p| (*p, self.seams.targets.start_time(p.get()))).collect();
        match node.agent.video_memory(&pids, deadline) {
            Err(e) => {
                debug!("importer check of the tree could not run: {e}");
                self.tree_check = TreeCheck::Unavailable(e.to_string());
            }
            Ok(report) => {
                let mut facts = self.facts_of(node, &report);
                let devices = self.claims.devices(&self.config, &*self.seams.targets).clone();
                let targets = &self.seams.targets;
                let (live, stale) = crate::sharing::split_live_importers(std::mem::take(&mut facts.importers), |p| {
                    let same =
                        started.get(&p).copied().flatten().is_some_and(|t| targets.start_time(p.get()) == Some(t));
                    let holds_gpu = targets
                        .read_maps(p.get())
                        .and_then(|m| targets.nvidia_minors(p.get(), &m))
                        .is_ok_and(|minors| !minors.is_empty());
                    // A child forked after cuInit has no context to import with: the memory the resource manager
                    // shows under its number is a dead importer's, whose number it now has.
                    let own_context = targets.holds_only_parents_nvidia_files(p.get(), &devices) != Some(true);
                    same && holds_gpu && own_context
                });
                facts.importers = live;
                if !stale.is_empty() {
                    warn!("{}", crate::sharing::stale_importers_line(&stale));
                }
                info!(
                    "importer check before the first lock: the kernel driver's resource manager was asked about {} \
                     process(es) of the tree of pid {root} ({:.1} ms): {}",
                    facts.asked,
                    facts.seconds * 1e3,
                    if facts.importers.is_empty() {
                        "no imported device memory".to_string()
                    } else {
                        format!("{} importer(s)", crate::sharing::importer_pids(&facts.importers).len())
                    }
                );
                if !facts.importers.is_empty() {
                    match self.config.ipc {
                        IpcImporters::Refuse => return Err(EngineError::IpcImporters(facts.importers)),
                        IpcImporters::Allow => warn!("{}", crate::sharing::importers_allowed_warning(&facts.importers)),
                    }
                }
                self.tree_check = TreeCheck::Asked(facts);
            }
        }
        Ok(())
    }

    /// The tree before the first lock, once, at the first CUDA process: what CRIU cannot dump (an io_uring), then
    /// the claims file's one bound over what the tree holds of the NVIDIA nodes: every process of the tree that holds a node is counted (the CUDA processes too, which
    /// claim nothing: the check errs on the side of refusing, as `criu-cuda-migrate job` does). The processes
    /// still run: CHECKPOINT_DEVICES reads them again, and each claim is checked against the same bound.
    fn check_tree_before_lock(&mut self, pid: HostPid) -> Result<(), EngineError> {
        if self.tree_checked_before_lock {
            return Ok(());
        }
        self.tree_checked_before_lock = true;
        let pids = self.tree_pids(pid);
        let devices = self.claims.devices(&self.config, &*self.seams.targets).clone();
        // What CRIU cannot dump at all fails the dump in CRIU after the checkpoint (an io_uring's rings: "Unknown
        // shit 600 (anon_inode:[io_uring])"): refused now, named, nothing locked. Other anonymous inodes are left to
        // CRIU, whose plugins may take them (`criu-cuda-migrate job` names them).
        for &p in &pids {
            let held: Vec<_> = self.seams.targets.undumpable(p).into_iter().filter(|u| u.is_io_uring()).collect();
            if !held.is_empty() {
                let comm = self.seams.targets.device_holdings(p, &devices).map(|(c, _)| c).unwrap_or_default();
                return Err(EngineError::CriuCannotDump(ccm_identity::criu_support::line(p, &comm, &held)));
            }
        }
        if devices.is_empty() {
            return Ok(());
        }
        let t0 = Instant::now();
        let mut read = read_holdings(&*self.seams.targets, &devices, &pids);
        let held: Vec<(u32, String, ccm_process::claims::Holdings)> =
            pids.iter().filter_map(|&p| read.take(p).and_then(Result::ok).map(|(c, h)| (p, c, h))).collect();
        let tally = crate::claims::check_tree_bounds(held.iter().map(|(p, c, h)| (*p, c.as_str(), h)))
            .map_err(EngineError::Claim)?;
        if tally.holders > 0 {
            info!(
                "device claims before the first lock: {} process(es) of the tree hold NVIDIA nodes, at most {} KiB of \
                 claims (the bound is {} MiB), read in {:.1} ms",
                tally.holders,
                tally.bytes.div_ceil(1024),
                ccm_identity::claims::MAX_CLAIMS_BYTES >> 20,
                t0.elapsed().as_secs_f64() * 1e3
            );
        }
        Ok(())
    }

    /// The dump's tree, breadth-first from its root (the first pid of PAUSE_DEVICES, else `pid`), each pid once,
    /// capped.
    fn tree_pids(&self, pid: HostPid) -> Vec<u32> {
        let root = self.root.unwrap_or(pid).get();
        let mut seen = std::collections::BTreeSet::new();
        std::iter::once(root)
            .chain(self.seams.targets.children_recursive(root))
            .take(MAX_TREE_PIDS)
            .filter(|p| seen.insert(*p))
            .collect()
    }

    /// The importers of a resource manager report, their GPUs named from the kernel driver's list, the MPS
    /// clients among them named as such (the node's MPS servers asked about too, only when there is an importer).
    fn facts_of(&self, node: &Node, report: &ccm_driver::rm::PidMemoryReport) -> SharingFacts {
        let has_importer = report.gpus.iter().any(|g| g.pids.iter().any(|p| p.memory.shared_duped > 0));
        // The GPU list costs a read of /proc only when a line will name a GPU.
        let gpus = if has_importer { self.seams.targets.kernel_gpus().unwrap_or_default() } else { Vec::new() };
        let mut facts = importers_in(report, |pci| gpus.iter().find(|g| g.pci == pci).map(|g| g.uuid));
        if has_importer {
            let servers: Vec<HostPid> =
                self.seams.targets.mps_servers().into_iter().filter_map(|p| HostPid::new(p.into())).collect();
            if !servers.is_empty() {
                match node.agent.video_memory(&servers, RM_DEADLINE) {
                    Ok(r) => crate::sharing::mark_mps_clients(&mut facts.importers, &r),
                    Err(e) => debug!("the MPS servers' memory could not be asked ({e}); importers named as such"),
                }
            }
        }
        facts
    }

    /// A process of a frozen cgroup (containerd pauses a task before its checkpoint) cannot answer
    /// the driver: thaws it for the dump (frozen again at exit(DUMP)). The path, when this thawed it.
    fn thaw_for_driver(&mut self, pid: HostPid) -> Result<Option<String>, EngineError> {
        let Some(path) = self.seams.targets.frozen_cgroup_of(pid.get()) else { return Ok(None) };
        if self.thawed.iter().any(|t| t.path() == path) {
            return Ok(None);
        }
        match self.seams.targets.thaw(&path, THAW_DEADLINE) {
            Ok(t) => {
                self.thawed.push(t);
                Ok(Some(path))
            }
            Err(why) => Err(EngineError::FrozenCgroup { pid, path, why }),
        }
    }

    /// The driver's restore thread and state of `pid`. The queries run under CRIU's alarm too:
    /// they must answer before it fires.
    fn query(&self, api: &dyn DriverAgent, pid: HostPid) -> Result<Query, EngineError> {
        let restore_tid = match api.restore_thread_id_within(pid, self.alarm_budget()) {
            Ok(t) => t,
            Err(e) if e.is_lost() => return Err(EngineError::Driver { pid, source: e }),
            Err(e) => return Ok(Query::NotCuda(e)),
        };
        match api.state_within(pid, self.alarm_budget()) {
            Ok(initial) => Ok(Query::Cuda { restore_tid, initial }),
            Err(e) => Err(EngineError::Driver { pid, source: e }),
        }
    }

    /// Locks a RUNNING process. PAUSE_DEVICES runs under CRIU's own alarm (--timeout, from before
    /// init): the lock must end before it, or CRIU aborts the dump (a BUG at cr-dump.c) with the
    /// driver agent's work unfinished and nobody left to put the process back.
    fn lock(&self, api: &dyn DriverAgent, t: &mut Tracked) -> LockOutcome {
        let pid = t.pid;
        let started = Instant::now();
        let budget = self.alarm_end.saturating_duration_since(started).saturating_sub(ALARM_GUARD);
        if budget < MIN_LOCK_BUDGET {
            return LockOutcome::NoTime { left: budget };
        }
        let driver_wait = budget.saturating_sub(ALARM_GUARD).max(Duration::from_millis(100));
        let timeout_ms = u32::try_from(driver_wait.as_millis()).unwrap_or(u32::MAX);
        let r = timed(|| api.lock(pid, timeout_ms, budget));
        info!("pid {pid}: cuCheckpointProcessLock (timeout {timeout_ms} ms) {:.3} s", r.elapsed.as_secs_f64());
        match r.value {
            Ok(()) => {
                t.locked_by_us = true;
                LockOutcome::Locked
            }
            Err(error) if error.is_lost() => {
                // The driver may still take the lock within its timeout: exit(DUMP) waits for that
                // and puts the process back with a fresh agent.
                t.settles_by = Some((started + driver_wait, ProcessState::Locked));
                LockOutcome::Failed { error, unlocked: None }
            }
            Err(error) => {
                // A lock that timed out may still have taken effect: never leave it LOCKED.
                let unlocked = matches!(api.state(pid), Ok(ProcessState::Locked)).then(|| api.unlock(pid));
                LockOutcome::Failed { error, unlocked }
            }
        }
    }

    /// CHECKPOINT_DEVICES: every task is ptrace-stopped. The first call checkpoints all tracked
    /// processes at once; later calls report the stored result.
    pub fn checkpoint_devices(&mut self, pid: i32, host: &dyn CriuHost) -> HookOutcome {
        let Some(pid) = HostPid::new(pid.into()) else { return HookOutcome::NotMine };
        if self.holdings.is_none() {
            self.first_checkpoint_hook(pid, host);
        }
        if !self.tracked.contains_key(&pid) {
            return self.claim_holder(pid, host);
        }
        if !self.batch_done {
            self.batch_done = true;
            self.checkpoint_all(host);
        }
        match self.tracked.get(&pid).and_then(|t| t.checkpoint_result.clone()) {
            Some(Ok(())) | None => HookOutcome::Done,
            Some(Err(source)) => HookOutcome::Failed(EngineError::Process { pid, source }),
        }
    }

    /// The first CHECKPOINT_DEVICES (every task is seized now: no mapping or descriptor changes until the dump
    /// ends): what every other process of the tree that is no CUDA process holds of the NVIDIA nodes is read
    /// beside the CUDA processes' checkpoint (hundreds of ms), in a few threads, so that each one's own hook only
    /// records it (a DataLoader worker's maps and descriptors took 1-2.5 ms on the GPU machines, read in its hook).
    /// Every thread is joined before the hook returns: CRIU's process stays single-threaded between hooks.
    fn first_checkpoint_hook(&mut self, pid: HostPid, host: &dyn CriuHost) {
        let devices = self.claims.devices(&self.config, &*self.seams.targets).clone();
        let pids: Vec<u32> = if devices.is_empty() {
            Vec::new()
        } else {
            let mut pids = self.tree_pids(pid);
            pids.retain(|&p| p != pid.get() && HostPid::new(p.into()).is_none_or(|h| !self.tracked.contains_key(&h)));
            pids
        };
        let targets = self.seams.targets.clone();
        let run_batch = self.tracked.contains_key(&pid) && !self.batch_done;
        let t0 = Instant::now();
        let read = std::thread::scope(|s| {
            let reader = s.spawn(|| read_holdings(&*targets, &devices, &pids));
            if run_batch {
                self.batch_done = true;
                self.checkpoint_all(host);
            }
            reader.join()
        });
        match read {
            Ok(read) => {
                debug!(
                    "holdings of {} other process(es) of the tree read in {:.1} ms{}",
                    read.len(),
                    read.elapsed_ms(),
                    if run_batch { ", beside the checkpoint" } else { "" }
                );
                self.holdings = Some(read);
            }
            Err(_) => {
                warn!(
                    "reading the tree's holdings panicked after {:.1} ms; each process is read in its own hook",
                    t0.elapsed().as_secs_f64() * 1e3
                );
                self.holdings = Some(ReadHoldings::default());
            }
        }
    }

    /// CHECKPOINT_DEVICES of a process that is no CUDA process: what it holds of the NVIDIA nodes (a child
    /// forked after its parent's cuInit inherits its descriptors and mappings) is claimed for CRIU, which
    /// cannot dump them. `Done` (with its timing line) when it held any, else `NotMine`.
    fn claim_holder(&mut self, pid: HostPid, host: &dyn CriuHost) -> HookOutcome {
        let ns_pid = self.seams.targets.ns_pid(pid.get()).unwrap_or(pid.get());
        let mut claims = std::mem::take(&mut self.claims);
        let targets = self.seams.targets.clone();
        let config = self.config.clone();
        let read = self.holdings.as_mut().and_then(|h| h.take(pid.get()));
        let r = claims.record_holder(pid, ns_pid, read, &config, &*targets, || self.dump_node_gpus(), host);
        self.claims = claims;
        match r {
            Ok(Some(line)) => {
                if !self.inventory_added {
                    self.inventory_added = host.add_inventory_plugin(PLUGIN_NAME);
                }
                info!("{line}");
                HookOutcome::Done
            }
            Ok(None) => HookOutcome::NotMine,
            Err(e) => HookOutcome::Failed(EngineError::Claim(e)),
        }
    }

    /// The dump node's GPUs with their minors: the kernel driver's list (read ahead with the tree's holdings, or
    /// now), else NVML's through the agent.
    fn dump_node_gpus(&mut self) -> Vec<ccm_identity::GpuIdentity> {
        if let Some(g) = self.holdings.as_mut().and_then(|h| h.kernel_gpus.take()) {
            return g;
        }
        match self.seams.targets.kernel_gpus() {
            Ok(g) if !g.is_empty() => g,
            _ => self.node().map(|n| n.gpus().to_vec()).unwrap_or_default(),
        }
    }

    /// HANDLE_DEVICE_VMA: a device mapping CRIU cannot dump.
    /// `parsed`: the task whose mappings CRIU walks now, when it can be told (`ccm_process::criu_self`).
    pub fn handle_device_vma(&mut self, number: ccm_identity::claims::DevNumber, parsed: Option<u32>) -> Claim {
        self.claims.device_vma(number, parsed, &self.config, &*self.seams.targets)
    }

    /// DUMP_EXT_FILE: an open file CRIU cannot dump.
    pub fn dump_ext_file(
        &mut self,
        id: u32,
        number: ccm_identity::claims::DevNumber,
        flags: i32,
        host: &dyn CriuHost,
    ) -> Claim {
        self.claims.ext_file(id, number, flags, &self.config, &*self.seams.targets, host)
    }

    fn checkpoint_all(&mut self, host: &dyn CriuHost) {
        let t0 = Instant::now();
        let Some(node) = self.node.clone() else { return };
        let todo: Vec<(HostPid, HostTid)> = self
            .tracked
            .values()
            .filter(|t| t.initial != ProcessState::Checkpointed && t.checkpoint_result.is_none())
            .map(|t| (t.pid, t.restore_tid))
            .collect();
        if self.refuse_for_sharing(&node) {
            return;
        }
        // Written through CRIU's own descriptor of the image directory: it may be in another mount
        // namespace than any path we could name, and a path could be swapped under us.
        let dir =
            host.image_dir().map(|fd| Dir::from_owned(fd, PathBuf::from("CRIU's image directory")).map_err(Arc::new));
        let storage_files = match dir.as_ref() {
            Some(Ok(dir)) => self.storage_files(&node, dir, &todo),
            _ => BTreeMap::new(),
        };
        let started = Instant::now();
        let (mut results, memory) = checkpoint_batch(&node, &*self.seams.targets, &self.config, &todo, &storage_files);
        // A page file made for the driver agent's copy that received none goes before the staging offload, which
        // may write the same name.
        let mut storage_files = storage_files;
        for (&(pid, _), r) in todo.iter().zip(&results) {
            if !matches!(r, Ok((Timed { value: Ok(Some(_)), .. }, ..))) {
                if let (Some(f), Some(Ok(dir))) = (storage_files.remove(&pid), dir.as_ref()) {
                    let _ = dir.remove(&f.name);
                }
            }
        }
        // The driver's part alone (the staging write below is timed on its own line; the batch's line has both).
        info!(
            "driver checkpoint of {} CUDA process(es) took {:.3} s (parallel)",
            todo.len(),
            started.elapsed().as_secs_f64()
        );
        crate::restore::log_anon_backing(
            &*self.seams.targets,
            todo.iter().map(|(pid, _)| *pid),
            "after the driver's checkpoint",
        );
        let (mut staged, staging_failed) = match dir.as_ref() {
            Some(Ok(dir)) => self.offload_staging(dir, &todo, &mut results),
            _ => Default::default(),
        };
        for (&(pid, _), r) in todo.iter().zip(results) {
            let Some(t) = self.tracked.get_mut(&pid) else { continue };
            t.device_bytes = memory.get(&pid).cloned().flatten().map(|u| u.iter().map(|x| x.bytes).sum::<u64>());
            t.staged = staged.remove(&pid);
            let recorded = record_checkpoint(t, r, started, dir.as_ref(), storage_files.get(&pid));
            t.checkpoint_result = Some(match staging_failed.get(&pid) {
                Some(f) => Err(f.clone()),
                None => recorded,
            });
        }
        info!("checkpoint of {} CUDA process(es) took {:.3} s (parallel)", todo.len(), t0.elapsed().as_secs_f64());
    }

    /// Where the driver agent copies each process's device memory when the driver offers custom storage (CUDA
    /// 13.4) and the staging setting is `plugin`: a fresh, empty page file per process, already under its final name
    /// (the pid in the process's namespace, as its identity image), with its path for the agent. Empty where the
    /// driver stages the device memory in the processes.
    fn storage_files(&self, node: &Node, dir: &Dir, todo: &[(HostPid, HostTid)]) -> BTreeMap<HostPid, StorageFile> {
        let mut out = BTreeMap::new();
        if !node.custom_storage || self.config.staging == crate::Staging::Criu {
            return out;
        }
        for &(pid, _) in todo {
            // Named after the pid in the process's own namespace (its identity image's), under which the driver agent
            // knows it from the start: should CRIU go away, the agent puts the process back from this path.
            let ns_pid = self.seams.targets.ns_pid(pid.get()).unwrap_or(pid.get());
            let name = ccm_identity::staging::page_file_name(ns_pid);
            let made = dir.create_fresh(&name, 0o600, false).and_then(|(_, tmp, _)| {
                dir.rename_into_place(&tmp, &name).inspect_err(|_| {
                    let _ = dir.remove(&tmp);
                })
            });
            match made {
                Ok(()) => {
                    let path = crate::staging::page_file_path(dir, &name);
                    out.insert(pid, StorageFile { name, path });
                }
                Err(e) => warn!(
                    "pid {pid}: its page file cannot be created ({e}); the driver stages its device memory in the \
                     process instead of the driver's custom storage"
                ),
            }
        }
        info!(
            "the driver offers custom storage: the driver agent copies the device memory of {} process(es) into \
             their page files",
            out.len()
        );
        out
    }

    /// The staging offload (`crate::staging`) of every process whose checkpoint and identity succeeded; each one's
    /// table goes into its image before the image is written.
    fn offload_staging(
        &self,
        dir: &Dir,
        todo: &[(HostPid, HostTid)],
        results: &mut [Result<CheckpointWork, BatchError>],
    ) -> (BTreeMap<HostPid, crate::staging::Staged>, BTreeMap<HostPid, ProcessFailure>) {
        let procs: Vec<crate::staging::Checkpointed> = todo
            .iter()
            .zip(results.iter())
            .filter_map(|(&(pid, _), r)| match r {
                Ok((Timed { value: Ok(None), .. }, Ok(Ok(img)), Some(before))) => {
                    Some(crate::staging::Checkpointed { pid, image_pid: img.pid, before: before.clone() })
                }
                _ => None,
            })
            .collect();
        let Some(node) = self.node.as_ref() else { return Default::default() };
        let (staged, failed) = crate::staging::offload(&*self.seams.targets, &*node.agent, &self.config, dir, &procs);
        for (&(pid, _), r) in todo.iter().zip(results.iter_mut()) {
            if let (Some(s), Ok((_, Ok(Ok(img)), _))) = (staged.get(&pid), r) {
                img.staging = Some(s.table.clone());
            }
        }
        (staged, failed)
    }

    /// The last word on sharing, while every process is only locked (an unlock undoes that; a checkpoint of an
    /// importer cannot be undone): `multi-process refuse` refuses any dump of several CUDA processes; then the
    /// resource manager is asked again about the locked processes (a locked process makes no CUDA call, so nothing
    /// they import can change before the checkpoint: this closes the window between the tree's check and the
    /// last lock). An importer refuses the dump under `ipc refuse`; a check that cannot run leaves the warning
    /// of a dump of several processes, naming why. Whether the dump is refused.
    fn refuse_for_sharing(&mut self, node: &Node) -> bool {
        let cuda_pids: Vec<HostPid> = self.tracked.keys().copied().collect();
        // Refused whatever the resource manager would say: it is not asked.
        let refused_anyway = cuda_pids.len() > 1 && self.config.multi_process == MultiProcess::Refuse;
        let checked = match &self.tree_check {
            _ if refused_anyway => Err("not asked (multi-process refuse)".to_string()),
            // The tree's check could not run: asking again would meet the same (and might wait as long).
            TreeCheck::Unavailable(why) => Err(why.clone()),
            _ => node
                .agent
                .video_memory(&cuda_pids, RM_DEADLINE)
                .map(|r| self.facts_of(node, &r))
                .map_err(|e| e.to_string()),
        };
        let verdict = crate::sharing::verdict(
            &cuda_pids,
            checked.as_ref().map_err(String::as_str),
            self.config.ipc,
            self.config.multi_process,
        );
        match verdict {
            SharingVerdict::Importers(importers) => {
                self.refuse_all(|| ProcessFailure::IpcImportersRefused(importers.clone()));
                true
            }
            SharingVerdict::SeveralProcesses(pids) => {
                self.refuse_all(|| ProcessFailure::SeveralProcessesRefused(pids.clone()));
                true
            }
            SharingVerdict::Unchecked(pids, why) => {
                self.refuse_all(|| ProcessFailure::UncheckedRefused(pids.clone(), why.clone()));
                true
            }
            SharingVerdict::Proceed { info, warning } => {
                if let Some(i) = info {
                    info!("{i}");
                }
                // `ipc allow` said so at the tree's check already when it saw the same importers.
                let said = matches!((&self.tree_check, &checked), (TreeCheck::Asked(t), Ok(f)) if !t.importers.is_empty() && t.importers == f.importers);
                if let Some(w) = warning.filter(|_| !said) {
                    warn!("{w}");
                }
                false
            }
        }
    }

    /// Every tracked process fails its CHECKPOINT_DEVICES with `why` (nothing is checkpointed).
    fn refuse_all(&mut self, why: impl Fn() -> ProcessFailure) {
        for t in self.tracked.values_mut() {
            t.checkpoint_result = Some(Err(why()));
        }
    }

    /// `exit(DUMP, ret)`: on failure or with `--leave-running`, put every process back as found.
    /// When the driver agent was lost (killed, stopped past a deadline), a fresh agent does it:
    /// CRIU's process is single-threaded here, so it can fork one.
    pub fn finish(&mut self, ret: i32, host: &dyn CriuHost) {
        self.put_back(ret, host);
        // Frozen again only now: the put-back above needs the processes' threads to run.
        for t in self.thawed.drain(..) {
            match t.refreeze() {
                Ok(()) => info!("cgroup {} frozen again, as the dump found it", t.path()),
                Err(e) => error!(
                    "{e}; the container runs on although its runtime had paused it: pause it again (ctr task pause)"
                ),
            }
        }
    }

    /// Why the end of the dump puts the processes back, or `None` when they stay checkpointed.
    fn rollback_reason(&self, ret: i32) -> Option<&'static str> {
        if ret == 0 && !self.config.leave_running.restores_devices() {
            return None;
        }
        Some(match self.config.leave_running {
            _ if ret != 0 => "the dump failed",
            LeaveRunning::Unknown => {
                "CRIU runs over RPC, which hides --leave-running from plugins, so the processes may run on \
                 (set CRIU_CUDA_MIGRATE_LEAVE_RUNNING=0 in the runtime's environment to skip this for final dumps)"
            }
            _ => "--leave-running",
        })
    }

    fn put_back(&mut self, ret: i32, host: &dyn CriuHost) {
        if self.tracked.is_empty() {
            return;
        }
        let Some(why) = self.rollback_reason(ret) else {
            info!("dump done; {} CUDA process(es) stay checkpointed for CRIU to end them", self.tracked.len());
            // CRIU resumes them instead when its post-dump action script fails, which its exit hook is not told: the
            // agent stays until CRIU is gone and puts back any it finds running.
            if let Some(agent) = self.node.as_ref().map(|n| &n.agent).filter(|a| a.lost().is_none()) {
                if let Err(e) = agent.hand_over() {
                    warn!(
                        "the driver agent cannot watch the dumped processes after CRIU ({e}): should CRIU resume them \
                         (a failed post-dump action script), run `criu-cuda-migrate recover --pid PID` for each"
                    );
                }
            }
            return;
        };
        let todo: Vec<&Tracked> = self
            .tracked
            .values()
            .filter(|t| t.locked_by_us || t.checkpointed_by_us || t.settles_by.is_some())
            .collect();
        info!("rolling back {} CUDA process(es): {why}", todo.len());
        let todo = self.fill_back_staging(todo);
        let Some(node) = self.node.as_ref() else { return };
        let fresh;
        let api: &dyn DriverAgent = match node.agent.lost() {
            None => &*node.agent,
            Some(_) => {
                info!("the driver agent was lost: starting a fresh one to put the processes back");
                match self.seams.agents.start(host, &self.config, WarmUp::Dump).and_then(Node::load) {
                    Ok(n) => {
                        n.agent.exit_without_waiting();
                        fresh = n;
                        &*fresh.agent
                    }
                    Err(e) => {
                        for t in &todo {
                            error!(
                                "pid {} may be left LOCKED or CHECKPOINTED: the driver agent was lost and a fresh one cannot start ({e}); run `{}`",
                                t.pid,
                                ccm_agent::storage::recover_command(t.pid, t.stored.as_ref().map(|s| s.page_file.as_str()))
                            );
                        }
                        return;
                    }
                }
            }
        };
        if todo.iter().any(|t| t.settles_by.is_some()) {
            if let Err(e) = api.cuinit() {
                warn!("the fresh driver agent's cuInit failed ({e}); putting the processes back anyway");
            }
        }
        let config = &self.config;
        let cuda_processes = self.tracked.len();
        // The tasks may still be ptrace-stopped by CRIU; the driver needs their restore threads
        // to run for a restore and for an unlock alike.
        let results = with_restore_threads_running(
            &*self.seams.targets,
            &todo,
            |t| t.restore_tid.get(),
            OnResumeError::WorkAnyway,
            |t| rollback_one(api, t, config, cuda_processes),
        );
        for (t, r) in todo.iter().zip(results) {
            if let Err(e) = r {
                error!(
                    "pid {}: rollback failed ({e}); its CUDA state is unknown: run `{}`",
                    t.pid,
                    ccm_agent::storage::recover_command(t.pid, t.stored.as_ref().map(|s| s.page_file.as_str()))
                );
            }
        }
    }
}

impl DumpSession {
    /// Before a put-back: the staging pages released at dump are filled back from the page files (the driver's
    /// restore reads them). A process whose pages cannot be filled back is not restored by the driver (it would
    /// run on with other device data): it stays CHECKPOINTED, with an ERROR line naming it. The others go on.
    fn fill_back_staging<'a>(&self, todo: Vec<&'a Tracked>) -> Vec<&'a Tracked> {
        let jobs: Vec<(HostPid, &ccm_identity::staging::StagingTable, &std::fs::File)> = todo
            .iter()
            .filter_map(|t| t.staged.as_ref().filter(|s| s.released).map(|s| (t.pid, &s.table, &*s.file)))
            .collect();
        if jobs.is_empty() {
            return todo;
        }
        match crate::staging::fill(&*self.seams.targets, &self.config, &jobs) {
            Ok(_) => todo,
            Err(e) => {
                for (pid, _, _) in &jobs {
                    error!(
                        "pid {pid} stays CHECKPOINTED: its staging pages cannot be filled back for the put-back ({e}); \
                         its device data is in its page file in the image directory: restore it from these images \
                         (criu restore), or kill it"
                    );
                }
                let unfilled: Vec<HostPid> = jobs.iter().map(|j| j.0).collect();
                todo.into_iter().filter(|t| !unfilled.contains(&t.pid)).collect()
            }
        }
    }
}

/// What one process's work in the checkpoint batch gave: the driver's checkpoint and its identity.
/// The third part: its mappings before the checkpoint, for the staging offload.
type CheckpointWork = (
    Timed<Result<Option<ccm_identity::staging::DriverStorage>, AgentError>>,
    Result<Result<IdentityImage, ccm_process::ProcessError>, ProcessFailure>,
    Option<Vec<ccm_identity::staging::MapView>>,
);

/// Device memory per GPU of each process, `None` where NVML could not tell.
type MemoryByPid = BTreeMap<HostPid, Option<Vec<DeviceMemoryUse>>>;

/// The parallel checkpoint of `todo`, each process's identity scan beside its checkpoint, and
/// the device-memory pass beside them all.
fn checkpoint_batch(
    node: &Node,
    targets: &dyn Targets,
    config: &Config,
    todo: &[(HostPid, HostTid)],
    storage_files: &BTreeMap<HostPid, StorageFile>,
) -> (Vec<Result<CheckpointWork, BatchError>>, MemoryByPid) {
    // The identity scan of each process runs while its checkpoint does: the words it looks for
    // sit in libcuda's objects (heap and small mappings), which exist before the checkpoint and
    // keep their place through it, and the scan's list of mappings is read before the driver
    // adds the host copy of the device memory. So the scan (20-40 ms) is off the critical path,
    // under the checkpoint (hundreds of ms).
    let api = &*node.agent;
    // What each process holds on each GPU, for the restore's free-memory check: one NVML pass for
    // all. The checkpoints wait for it a little ([`MEMORY_GRACE`]: when NVML has started, the pass
    // takes a millisecond); if NVML's own start (about 20 ms) is not over by then, they begin beside
    // it. The driver keeps a process's device memory until its checkpoint ends (hundreds of ms at
    // the least), so NVML still sees it then; a process it no longer lists is recorded as unknown,
    // which the restore does not check. Without the wait a short checkpoint can end first (the test
    // double's 40 ms ones did, and recorded no memory). The wait ends as soon as the pass does; its
    // bound (250 ms) only matters on a loaded node or with a stalled NVML, where the 5 ms it once was
    // proved too short (the double's `memory` case recorded nothing on a machine also running builds).
    let pids: Vec<HostPid> = todo.iter().map(|t| t.0).collect();
    let memory: Waitable<MemoryByPid> = Waitable::default();
    let memory = &memory;
    let results = std::thread::scope(|outer| {
        outer.spawn(|| {
            let m = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| device_memory_by_pid(node, &pids)))
                .unwrap_or_else(|_| pids.iter().map(|p| (*p, None)).collect());
            memory.set(m)
        });
        if !memory.wait_for(MEMORY_GRACE) {
            debug!(
                "NVML has not answered within {} ms; the checkpoints start beside its pass",
                MEMORY_GRACE.as_millis()
            );
        }
        with_restore_threads_running(
            targets,
            todo,
            |&(_, tid)| tid.get(),
            OnResumeError::Skip,
            |&(pid, _)| {
                std::thread::scope(|s| {
                    // What the driver's checkpoint changes is read BEFORE it starts (about a millisecond): the
                    // GPU nodes the process holds (the driver closes them) and its mappings (the driver adds
                    // the device memory's copy). The scan of those mappings then runs beside the checkpoint:
                    // libcuda's PCI words stay as they are through a checkpoint (that they outlive it is the
                    // bug this plugin fixes). The device memory is added when the NVML pass has it.
                    let before = BeforeCheckpoint::read(targets, pid);
                    let views = before.as_ref().ok().map(BeforeCheckpoint::map_views);
                    let scan = s.spawn(move || {
                        collect_identity(pid, node, targets, before?, || memory.wait().get(&pid).cloned().flatten())
                    });
                    // The device memory is not known yet: the deadline for an unknown amount.
                    let checkpoint = timed(|| match storage_files.get(&pid) {
                        Some(f) => checkpoint_to_storage_or_staged(api, pid, f, config),
                        None => api.checkpoint(pid, config.call_deadline(None)).map(|()| None),
                    });
                    let facts = scan.join().map_err(|_| ProcessFailure::Batch(BatchError::Panicked));
                    (checkpoint, facts, views)
                })
            },
        )
    });
    (results, memory.wait())
}

/// The checkpoint of `pid` to the driver's custom storage, into `f`; where that fails and the driver still has the
/// process LOCKED (the custom storage could not be set up, or the driver refused it before taking the process), the
/// driver's own checkpoint, which stages the device memory in the process, one line saying why.
fn checkpoint_to_storage_or_staged(
    api: &dyn DriverAgent,
    pid: HostPid,
    f: &StorageFile,
    config: &Config,
) -> Result<Option<ccm_identity::staging::DriverStorage>, AgentError> {
    let e = match api.checkpoint_to_storage(pid, &f.path, config.call_deadline(None)) {
        Ok(d) => return Ok(Some(d)),
        Err(e) => e,
    };
    if e.is_lost() || api.state(pid).ok() != Some(ProcessState::Locked) {
        return Err(e);
    }
    warn!(
        "pid {pid}: the checkpoint to the driver's custom storage failed before the driver took the process ({e}); \
         the driver's own checkpoint instead, which stages its device memory in the process"
    );
    api.checkpoint(pid, config.call_deadline(None)).map(|()| None)
}

/// One process's checkpoint result: its image written, or why not. A checkpoint that lost its
/// agent is given the time the driver may take to finish it by itself.
fn record_checkpoint(
    t: &mut Tracked,
    r: Result<CheckpointWork, BatchError>,
    started: Instant,
    dir: Option<&Result<Dir, Arc<ccm_process::dir::FileError>>>,
    storage_file: Option<&StorageFile>,
) -> Result<(), ProcessFailure> {
    let pid = t.pid;
    match r {
        Err(e) => Err(ProcessFailure::Batch(e)),
        Ok((Timed { value: Err(e), .. }, _, _)) => {
            if e.is_lost() {
                // The driver may finish this checkpoint by itself: give it the time the copy takes.
                t.settles_by =
                    Some((started.max(Instant::now()) + settle_time(t.device_bytes), ProcessState::Checkpointed));
            }
            if e.cuda_code() == Some(CudaCode::NotSupported) {
                Err(ProcessFailure::Unsupported(e))
            } else {
                Err(ProcessFailure::Driver(e))
            }
        }
        Ok((Timed { value: Ok(storage), elapsed }, facts, _)) => {
            t.checkpointed_by_us = true;
            match &storage {
                None => info!("pid {pid}: cuCheckpointProcessCheckpoint {:.3} s", elapsed.as_secs_f64()),
                Some(d) => info!(
                    "pid {pid}: cuCheckpointProcessCheckpoint to custom storage {:.3} s: {} region(s), {} MiB of \
                     device memory, {} chunk(s) all zero, {} MiB written ({:.2} GB/s with the copy)",
                    elapsed.as_secs_f64(),
                    d.regions.len(),
                    d.device_bytes() >> 20,
                    d.table.holes(),
                    d.table.file_bytes >> 20,
                    d.device_bytes() as f64 / elapsed.as_secs_f64().max(1e-9) / 1e9
                ),
            }
            // The put-back of a process checkpointed to custom storage reads its page file.
            if let (Some(storage), Some(f)) = (storage.clone(), storage_file) {
                t.stored = Some(Stored { page_file: f.path.clone(), storage });
            }
            match (facts, dir) {
                (Ok(Ok(mut img)), Some(Ok(dir))) => {
                    if let (Some(storage), Some(f)) = (storage, storage_file) {
                        if f.name != ccm_identity::staging::page_file_name(img.pid) {
                            return Err(ProcessFailure::StagingMismatch(format!(
                                "its page file {} does not carry the pid {} of its identity image (its namespace \
                                 pid changed during the dump?)",
                                f.name, img.pid
                            )));
                        }
                        img.driver_storage = Some(storage);
                    }
                    write_image(dir, &img)
                }
                (Ok(Err(e)), _) => Err(ProcessFailure::Identity(Arc::new(e))),
                (Err(f), _) => Err(f),
                (_, Some(Err(e))) => Err(ProcessFailure::ImageWrite(e.clone())),
                (_, None) => Err(ProcessFailure::NoImageDir),
            }
        }
    }
}

/// A value one thread sets and others wait for (the dump's device-memory pass, beside the checkpoints).
struct Waitable<T> {
    value: std::sync::Mutex<Option<T>>,
    set: std::sync::Condvar,
}

impl<T> Default for Waitable<T> {
    fn default() -> Self {
        Waitable { value: std::sync::Mutex::new(None), set: std::sync::Condvar::new() }
    }
}

/// How long the dump's checkpoints wait for NVML's device-memory pass before they start beside it.
const MEMORY_GRACE: Duration = Duration::from_millis(250);

impl<T> Waitable<T> {
    /// Whether the value is set within `d`.
    fn wait_for(&self, d: Duration) -> bool {
        let g = self.value.lock().unwrap_or_else(|p| p.into_inner());
        let (g, _) = self.set.wait_timeout_while(g, d, |v| v.is_none()).unwrap_or_else(|p| p.into_inner());
        g.is_some()
    }

    fn set(&self, v: T) {
        *self.value.lock().unwrap_or_else(|p| p.into_inner()) = Some(v);
        self.set.notify_all();
    }

    /// Waits for the value (its setter always sets it: the NVML calls behind it have their deadlines).
    fn wait(&self) -> T
    where
        T: Clone,
    {
        let mut g = self.value.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(v) = g.as_ref() {
                return v.clone();
            }
            g = self.set.wait(g).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// How long a checkpoint the driver may still be finishing by itself is given (after the agent
/// that asked for it was lost): its copy runs at about 2 GB/s, so 1 s per GiB is twice that.
fn settle_time(device_bytes: Option<u64>) -> Duration {
    let gib = device_bytes.unwrap_or(80 << 30).div_ceil(1 << 30);
    Duration::from_secs(2 + gib.min(3600))
}

/// The state the driver reports for `pid`, once it settled: while a call that was in flight when
/// the agent was lost may still complete (`settles_by`), it is read again until it is that call's
/// outcome or the time is up.
fn settled_state(api: &dyn DriverAgent, t: &Tracked) -> Result<ProcessState, AgentError> {
    let mut state = api.state(t.pid)?;
    if let Some((until, outcome)) = t.settles_by {
        while state != outcome && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(50));
            state = api.state(t.pid)?;
        }
    }
    Ok(state)
}

/// What this dump made of a process whose state the driver cannot tell.
fn assumed_state(t: &Tracked) -> ProcessState {
    if t.checkpointed_by_us {
        ProcessState::Checkpointed
    } else if t.locked_by_us || t.settles_by.is_some() {
        ProcessState::Locked
    } else {
        ProcessState::Running
    }
}

/// Puts one process back as the dump found it, from the state the driver reports, with an ERROR
/// line naming the fix for anything left LOCKED or CHECKPOINTED.
fn rollback_one(api: &dyn DriverAgent, t: &Tracked, config: &Config, cuda_processes: usize) {
    let pid = t.pid;
    let state = match settled_state(api, t) {
        Ok(s) => s,
        Err(e) => {
            // Without the driver's word, what this dump did: the assumption is named as one.
            let assumed = assumed_state(t);
            warn!(
                "pid {pid}: its CUDA state cannot be read ({e}); putting it back as {assumed}, what this dump made it"
            );
            assumed
        }
    };
    if state == t.initial {
        if state != ProcessState::Running {
            info!("pid {pid}: CUDA state {state}, as the dump found it; left as it is");
        }
        return;
    }
    info!("pid {pid}: rolling back from CUDA state {state}");
    let deadline = config.call_deadline(t.device_bytes);
    if matches!(state, ProcessState::Checkpointing | ProcessState::Restoring) {
        // A custom-storage operation left open (its copy failed): the driver has no way to abort it.
        let why = match &t.checkpoint_result {
            Some(Err(e)) => e.to_string(),
            _ => "its operation was not completed".to_string(),
        };
        error!(
            "pid {pid} is left {state}: the driver's custom-storage operation on it could not be completed ({why}), \
             and the driver offers no way to abort one: end the process and restart its job"
        );
        return;
    }
    let recover = ccm_agent::storage::recover_command(pid, t.stored.as_ref().map(|s| s.page_file.as_str()));
    let from_storage = t.stored.as_ref().map(|s| crate::driver_agent::FromStorage {
        agent: api,
        page_file: &s.page_file,
        storage: &s.storage,
    });
    if t.initial == ProcessState::Locked && state == ProcessState::Checkpointed {
        // Found LOCKED by someone else: its device memory goes back, the lock stays theirs.
        let restored = match &from_storage {
            Some(f) => f.agent.restore_from_storage(pid, &[], f.page_file, f.storage, deadline),
            None => api.restore(pid, &[], deadline),
        };
        match restored {
            Ok(()) => info!("pid {pid}: rolled back: restored, LOCKED as the dump found it"),
            Err(e) => error!("pid {pid} is left CHECKPOINTED: restore failed ({e}); run `{recover}`"),
        }
        return;
    }
    let steps = match &from_storage {
        Some(f) => put_back(f, pid, state, deadline, |_| {}),
        None => put_back(api, pid, state, deadline, |_| {}),
    };
    for step in steps {
        match (step.step, &step.error) {
            (Step::Restore, None) => {
                info!("pid {pid}: rolled back: cuCheckpointProcessRestore {:.3} s", step.elapsed.as_secs_f64())
            }
            (Step::Unlock, None) => info!("pid {pid}: rolled back: unlocked, RUNNING again"),
            (s, Some(e)) => {
                let now = api.state(pid).map(|x| x.to_string()).unwrap_or_else(|_| s.left_in().to_string());
                let advice = crate::sharing::restore_advice(crate::sharing::code_named_in(e), false, cuda_processes);
                if s == Step::Restore && !advice.recoverable {
                    // An IPC importer: `recover` would only get CUDA_ERROR_OPERATING_SYSTEM (measured).
                    error!(
                        "pid {pid} is left {now}: {} failed ({e}){}; `criu-cuda-migrate recover` cannot bring it back either: end it and restart its job",
                        s.name(),
                        advice.cause
                    )
                } else {
                    error!("pid {pid} is left {now}: {} failed ({e}); run `{recover}`", s.name())
                }
            }
        }
    }
}
