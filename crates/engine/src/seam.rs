//! The engine's two seams, youki style: what it does to target processes ([`Targets`], here) and the
//! driver agent's calls ([`DriverAgent`], started through [`AgentStarter`]: `crate::driver_agent`,
//! below the node that holds one, re-exported here). Each is a trait with the real implementation
//! beside it (wrapping `ccm_process` and `ccm_agent`) and a scripted fake in the tests
//! (`crate::fake`), so that every rule of the dump and restore sessions (rollback, put-back, strict
//! kill, batch) is tested without root, a GPU or CRIU.
//!
//! The real implementations add nothing: each method is the one `ccm_process` or agent call the
//! sessions made before, so behaviour and log lines stay as they were.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use ccm_driver::procfs::ProcfsError;
use ccm_identity::claims::NvidiaDevices;
use ccm_identity::image::ProcessEnv;
use ccm_identity::{GpuIdentity, GpuUuid, HostPid, PciSignature};
use ccm_process::cgroup::CgroupError;
use ccm_process::claims::Holdings;
use ccm_process::container::{ForeignDev, NodeEditError, RuntimeSpec};
use ccm_process::dir::FileError;
use ccm_process::mem::ScanReport;
use ccm_process::pid_use::PidHolder;
use ccm_process::remote_syscall::RemoteSyscallError;
use ccm_process::staging_pages::{CopyOptions, FillJob, StagingIoError, WriteJob, Written};
use ccm_process::{Mapping, ProcessError, PtraceError, ScanScope};

pub use crate::driver_agent::{AgentStarter, DriverAgent, RealAgents};
use crate::node::Node;
use crate::preflight::ProcessPlan;
use crate::reconcile::ReconcileSummary;

/// Everything the sessions do to the processes CRIU hands them, and to the node's `/proc`:
/// the tree, maps, environment, memory, ptrace, cgroups and a container's `/dev`. Pids are the
/// plain numbers of CRIU's namespace (`HostPid::get()`).
pub trait Targets: Send + Sync {
    /// Whether `pid` maps a file whose name holds `fragment` (libcuda, CRIU's own CUDA plugin).
    fn maps_library(&self, pid: u32, fragment: &str) -> Result<bool, ProcessError>;
    /// The pid `pid` has in its own pid namespace.
    fn ns_pid(&self, pid: u32) -> Option<u32>;
    /// Every descendant of `pid`.
    fn children_recursive(&self, pid: u32) -> Vec<u32>;
    /// Kills `pid` and its tree.
    fn kill(&self, pid: u32) -> Result<(), ProcessError>;
    /// The environment variables that decide a process's CUDA ordinals.
    fn process_env(&self, pid: u32) -> Result<ProcessEnv, ProcessError>;
    fn read_maps(&self, pid: u32) -> Result<Vec<Mapping>, ProcessError>;
    /// Minors of the `/dev/nvidiaN` the process holds open or mapped.
    fn nvidia_minors(&self, pid: u32, maps: &[Mapping]) -> Result<BTreeSet<u32>, ProcessError>;
    /// The identity scan of the process's memory.
    fn scan_identity(
        &self,
        pid: u32,
        maps: &[Mapping],
        wanted: &[(GpuUuid, PciSignature)],
        props: &[GpuIdentity],
        scope: ScanScope,
    ) -> Result<ScanReport, ProcessError>;
    /// Rewrites and validates a restored process's PCI identity (`crate::reconcile`).
    fn reconcile(&self, pid: HostPid, plan: &ProcessPlan, node: &Node) -> ReconcileSummary;
    /// Lets a CRIU-stopped task's restore thread run (ptrace, on the hook's thread only).
    fn resume_restore_thread(&self, tid: u32) -> Result<Box<dyn RunningThread>, PtraceError>;
    /// The frozen cgroup `pid` is in, if any.
    fn frozen_cgroup_of(&self, pid: u32) -> Option<String>;
    fn thaw(&self, path: &str, deadline: Duration) -> Result<Box<dyn ThawedCgroup>, CgroupError>;
    fn mount_namespace(&self, pid: u32) -> Result<u64, ProcessError>;
    /// The restored task's `/dev`.
    fn container_dev(&self, pid: u32) -> Result<DevView, ProcessError>;
    /// CRIU's own mounts (its mount namespace's mountinfo).
    fn own_mounts(&self) -> Result<Vec<ccm_process::mountinfo::MountEntry>, ProcessError>;
    /// How `pid`'s anonymous memory is backed (transparent huge pages or not), for the log.
    fn anon_rollup(&self, pid: u32) -> Option<ccm_process::maps::AnonRollup>;
    /// The OCI spec of the runtime that runs this CRIU.
    fn restoring_runtime_spec(&self) -> Result<Option<RuntimeSpec>, FileError>;
    /// This node's hostname (recorded in the identity image).
    fn hostname(&self) -> String;
    /// The GPUs as the kernel driver lists them in `/proc/driver/nvidia/gpus`.
    fn kernel_gpus(&self) -> Result<Vec<GpuIdentity>, ProcfsError>;
    /// When `pid` started (it names the process, not its number).
    fn start_time(&self, pid: u32) -> Option<u64>;
    /// The node's MPS server processes (`crate::sharing::MPS_SERVER_EXE`).
    fn mps_servers(&self) -> Vec<u32>;
    /// The NVIDIA driver's device numbers on this node (`/proc/devices`; empty without the driver).
    fn nvidia_devices(&self) -> NvidiaDevices;
    /// The NVIDIA nodes `pid` maps and holds open, and its name.
    fn device_holdings(&self, pid: u32, devices: &NvidiaDevices) -> Result<(String, Holdings), ProcessError>;
    /// What `pid` holds that CRIU cannot dump (an io_uring, ...: `ccm_identity::criu_support`).
    fn undumpable(&self, pid: u32) -> Vec<ccm_identity::criu_support::Undumpable>;
    /// Whether `pid`'s NVIDIA descriptors are all its parent's open files (a child forked after cuInit, without a
    /// context of its own); `None` when the kernel cannot tell.
    fn holds_only_parents_nvidia_files(&self, pid: u32, devices: &NvidiaDevices) -> Option<bool>;
    /// What keeps each of `pids` taken in CRIU's pid namespace (a task, a zombie, a process group or session);
    /// the free ones left out (`ccm_process::pid_use`).
    fn pid_holders(&self, pids: &[u32]) -> Result<BTreeMap<u32, PidHolder>, ProcessError>;
    /// Copies staging regions of processes into their page files (`ccm_process::staging_pages`).
    fn write_staging(&self, jobs: &[WriteJob<'_>], opts: CopyOptions) -> Result<Vec<Written>, StagingIoError>;
    /// Fills staging regions back from page files.
    fn fill_staging(&self, jobs: &[FillJob<'_>], opts: CopyOptions) -> Result<u64, StagingIoError>;
    /// `madvise(MADV_DONTNEED)` of `ranges` run inside the stopped task `pid` (on the hook's thread only).
    fn release_pages(&self, pid: u32, maps: &[Mapping], ranges: &[(u64, u64)]) -> Result<(), RemoteSyscallError>;
}

/// A restore thread let run; [`RunningThread::stop`] stops it again.
pub trait RunningThread {
    fn tid(&self) -> u32;
    fn stop(self: Box<Self>) -> Result<(), PtraceError>;
}

/// A cgroup the dump thawed, frozen again at its end.
pub trait ThawedCgroup: Send + std::fmt::Debug {
    fn path(&self) -> &str;
    fn refreeze(&self) -> Result<(), CgroupError>;
}

/// A restored task's `/dev`, as the container fix sees it.
pub enum DevView {
    /// CRIU's own mount namespace: the host's `/dev`.
    HostNamespace,
    /// The container's own tmpfs, which the plugin may edit.
    Own(Box<dyn OwnDev>),
    /// Something the plugin must not edit.
    Foreign { why: ForeignDev, gpu_minors: Vec<u32> },
}

/// A container's own `/dev`.
pub trait OwnDev {
    fn gpu_minors(&self) -> &[u32];
    /// Entries named `nvidiaN` that are not NVIDIA character devices.
    fn impostors(&self) -> &[(String, &'static str)];
    fn create_gpu_node(&self, minor: u32) -> Result<(), NodeEditError>;
    fn remove_gpu_node(&self, minor: u32) -> Result<(), NodeEditError>;
}

/// The seams a session works through.
#[derive(Clone)]
pub struct Seams {
    pub targets: Arc<dyn Targets>,
    pub agents: Arc<dyn AgentStarter>,
}

impl Seams {
    /// The real processes and the real driver agent.
    pub fn real() -> Seams {
        Seams { targets: Arc::new(RealTargets), agents: Arc::new(RealAgents) }
    }
}

/// [`Targets`] through `ccm_process`.
#[derive(Debug, Default)]
pub struct RealTargets;

impl Targets for RealTargets {
    fn maps_library(&self, pid: u32, fragment: &str) -> Result<bool, ProcessError> {
        ccm_process::devices::maps_library(pid, fragment)
    }
    fn ns_pid(&self, pid: u32) -> Option<u32> {
        ccm_process::tree::ns_pid(pid).ok()
    }
    fn children_recursive(&self, pid: u32) -> Vec<u32> {
        ccm_process::tree::children_recursive(pid)
    }
    fn kill(&self, pid: u32) -> Result<(), ProcessError> {
        ccm_process::tree::kill(pid)
    }
    fn process_env(&self, pid: u32) -> Result<ProcessEnv, ProcessError> {
        let b = ccm_process::environ::read_environ_block(pid)?;
        Ok(ProcessEnv {
            cuda_visible_devices: ccm_process::environ::env_var(&b, "CUDA_VISIBLE_DEVICES"),
            cuda_device_order: ccm_process::environ::env_var(&b, "CUDA_DEVICE_ORDER"),
            nvidia_visible_devices: ccm_process::environ::env_var(&b, "NVIDIA_VISIBLE_DEVICES"),
        })
    }
    fn read_maps(&self, pid: u32) -> Result<Vec<Mapping>, ProcessError> {
        ccm_process::read_maps(pid)
    }
    fn nvidia_minors(&self, pid: u32, maps: &[Mapping]) -> Result<BTreeSet<u32>, ProcessError> {
        ccm_process::devices::nvidia_minors_in_use_with(pid, maps)
    }
    fn scan_identity(
        &self,
        pid: u32,
        maps: &[Mapping],
        wanted: &[(GpuUuid, PciSignature)],
        props: &[GpuIdentity],
        scope: ScanScope,
    ) -> Result<ScanReport, ProcessError> {
        ccm_process::scan_identity_over(pid, maps, wanted, props, scope)
    }
    fn reconcile(&self, pid: HostPid, plan: &ProcessPlan, node: &Node) -> ReconcileSummary {
        crate::reconcile::reconcile(pid, plan, node)
    }
    fn resume_restore_thread(&self, tid: u32) -> Result<Box<dyn RunningThread>, PtraceError> {
        Ok(Box::new(ccm_process::ptrace::resume_restore_thread(tid)?))
    }
    fn frozen_cgroup_of(&self, pid: u32) -> Option<String> {
        ccm_process::cgroup::frozen_cgroup_of(pid)
    }
    fn thaw(&self, path: &str, deadline: Duration) -> Result<Box<dyn ThawedCgroup>, CgroupError> {
        Ok(Box::new(ccm_process::cgroup::thaw(path, deadline)?))
    }
    fn mount_namespace(&self, pid: u32) -> Result<u64, ProcessError> {
        ccm_process::container::mount_namespace(pid)
    }
    fn container_dev(&self, pid: u32) -> Result<DevView, ProcessError> {
        use ccm_process::container::DevView as V;
        Ok(match ccm_process::container::container_dev(pid)? {
            V::HostNamespace => DevView::HostNamespace,
            V::Own(d) => DevView::Own(Box::new(d)),
            V::Foreign { why, gpu_minors } => DevView::Foreign { why, gpu_minors },
        })
    }
    fn own_mounts(&self) -> Result<Vec<ccm_process::mountinfo::MountEntry>, ProcessError> {
        ccm_process::container::own_mounts()
    }
    fn anon_rollup(&self, pid: u32) -> Option<ccm_process::maps::AnonRollup> {
        ccm_process::maps::anon_rollup(pid).ok()
    }
    fn restoring_runtime_spec(&self) -> Result<Option<RuntimeSpec>, FileError> {
        ccm_process::container::restoring_runtime_spec()
    }
    fn undumpable(&self, pid: u32) -> Vec<ccm_identity::criu_support::Undumpable> {
        ccm_process::read_maps(pid).and_then(|maps| ccm_process::undumpable::undumpable(pid, &maps)).unwrap_or_default()
    }
    fn holds_only_parents_nvidia_files(&self, pid: u32, devices: &NvidiaDevices) -> Option<bool> {
        ccm_process::forked::holds_only_parents_nvidia_files(pid, devices)
    }
    fn hostname(&self) -> String {
        std::fs::read_to_string("/proc/sys/kernel/hostname").map(|s| s.trim().to_string()).unwrap_or_default()
    }
    fn kernel_gpus(&self) -> Result<Vec<GpuIdentity>, ProcfsError> {
        ccm_driver::procfs::gpus()
    }
    fn nvidia_devices(&self) -> NvidiaDevices {
        ccm_process::claims::nvidia_devices().unwrap_or_default()
    }
    fn start_time(&self, pid: u32) -> Option<u64> {
        ccm_process::tree::start_time(pid)
    }
    fn mps_servers(&self) -> Vec<u32> {
        ccm_process::tree::processes_running(crate::sharing::MPS_SERVER_EXE, 64)
    }
    fn device_holdings(&self, pid: u32, devices: &NvidiaDevices) -> Result<(String, Holdings), ProcessError> {
        let maps = ccm_process::read_maps(pid)?;
        let held = ccm_process::claims::holdings(pid, &maps, devices)?;
        Ok((ccm_process::claims::comm(pid), held))
    }
    fn pid_holders(&self, pids: &[u32]) -> Result<BTreeMap<u32, PidHolder>, ProcessError> {
        use ccm_process::pid_use::PidUse;
        Ok(ccm_process::pid_use::pid_uses(pids)?
            .into_iter()
            .filter_map(|(p, u)| match u {
                PidUse::TakenBy(h) => Some((p, h)),
                PidUse::Free => None,
            })
            .collect())
    }
    fn write_staging(&self, jobs: &[WriteJob<'_>], opts: CopyOptions) -> Result<Vec<Written>, StagingIoError> {
        ccm_process::staging_pages::write_page_files(jobs, opts)
    }
    fn fill_staging(&self, jobs: &[FillJob<'_>], opts: CopyOptions) -> Result<u64, StagingIoError> {
        ccm_process::staging_pages::fill_from_page_files(jobs, opts)
    }
    fn release_pages(&self, pid: u32, maps: &[Mapping], ranges: &[(u64, u64)]) -> Result<(), RemoteSyscallError> {
        ccm_process::remote_syscall::madvise_dontneed(pid, maps, ranges)
    }
}

impl RunningThread for ccm_process::RunningRestoreThread {
    fn tid(&self) -> u32 {
        ccm_process::RunningRestoreThread::tid(self)
    }
    fn stop(self: Box<Self>) -> Result<(), PtraceError> {
        ccm_process::RunningRestoreThread::stop(*self)
    }
}

impl ThawedCgroup for ccm_process::cgroup::Thawed {
    fn path(&self) -> &str {
        &self.path
    }
    fn refreeze(&self) -> Result<(), CgroupError> {
        ccm_process::cgroup::Thawed::refreeze(self)
    }
}

impl OwnDev for ccm_process::container::ContainerDev {
    fn gpu_minors(&self) -> &[u32] {
        &self.gpu_minors
    }
    fn impostors(&self) -> &[(String, &'static str)] {
        &self.impostors
    }
    fn create_gpu_node(&self, minor: u32) -> Result<(), NodeEditError> {
        ccm_process::container::create_gpu_node(self, minor)
    }
    fn remove_gpu_node(&self, minor: u32) -> Result<(), NodeEditError> {
        ccm_process::container::remove_gpu_node(self, minor)
    }
}
