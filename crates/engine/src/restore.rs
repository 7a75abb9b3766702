//! The restore side: preflight at `init(RESTORE)`, then at the first RESUME_DEVICES_LATE the
//! driver restore of every CUDA process of the tree in parallel, reconciliation and validation
//! of its GPU identity, and unlock.

use std::collections::BTreeMap;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use ccm_driver::checkpoint::{timed, ProcessState};
use ccm_identity::{GpuIdentity, GpuUuid, HostPid, HostTid, NsPid};
use ccm_process::container::ForeignDev;
use ccm_process::dir::Dir;
use ccm_settings::spec::GivenGpus;
use log::{debug, error, info, warn};

use crate::batch::{with_restore_threads_running, BatchError, OnResumeError};
use crate::claims::RestoreClaims;
use crate::host::CriuHost;
use crate::node::Node;
use crate::preflight::{self, ProcessPlan};
use crate::reconcile::ReconcileSummary;
use crate::seam::{DevView, Seams, Targets};
use crate::{Config, EngineError, HookOutcome, ProcessFailure, Strictness, PLUGIN_NAME};

pub struct RestoreSession {
    config: Config,
    seams: Seams,
    node: Option<Node>,
    plans: Vec<ProcessPlan>,
    image_dir: Option<Dir>,
    /// Host pid → result of its restore.
    results: BTreeMap<HostPid, Result<(), ProcessFailure>>,
    /// What the dump claimed of forked processes' NVIDIA nodes, and what each descriptor opens here.
    claims: Option<RestoreClaims>,
}

/// One process's work in the parallel restore.
struct Job<'a> {
    pid: HostPid,
    plan: Option<&'a ProcessPlan>,
    /// How many CUDA processes the restore holds (a failed restore's advice depends on it).
    cuda_processes: usize,
    /// The page file the driver agent fills the device memory from, for an image with a driver storage table
    /// (absolute, in CRIU's mount namespace).
    storage_file: Option<String>,
}

impl RestoreSession {
    /// `init(RESTORE)`: read the images and check this node before CRIU restores anything. An
    /// error here makes CRIU abort the restore with our message; nothing has been touched.
    pub fn init(config: Config, host: &dyn CriuHost) -> Result<RestoreSession, EngineError> {
        RestoreSession::init_with(config, host, Seams::real())
    }

    /// [`RestoreSession::init`] through the given seams.
    pub fn init_with(config: Config, host: &dyn CriuHost, seams: Seams) -> Result<RestoreSession, EngineError> {
        RestoreSession::init_waiting(config, host, seams, crate::pid_wait::PID_WAIT)
    }

    /// [`RestoreSession::init_with`], then a wait of at most `pid_wait` until CRIU can fork the checkpoint's
    /// tasks with their pids (`crate::pid_wait`).
    pub(crate) fn init_waiting(
        config: Config,
        host: &dyn CriuHost,
        seams: Seams,
        pid_wait: Duration,
    ) -> Result<RestoreSession, EngineError> {
        let s = RestoreSession::init_checked(config, host, seams)?;
        s.wait_for_checkpoint_pids(pid_wait);
        Ok(s)
    }

    /// Waits until the checkpoint's pid numbers are free, when the dump shared CRIU's pid namespace (the
    /// plugin's records say) and CRIU's `pstree.img` can be read; never fails.
    fn wait_for_checkpoint_pids(&self, wait: Duration) {
        let Some(dir) = &self.image_dir else { return };
        let records: Vec<(u32, u32)> = self
            .plans
            .iter()
            .map(|p| (p.image.pid, p.image.host_pid))
            .chain(self.claims.iter().flat_map(|c| c.claims.holders.iter().map(|h| (h.pid, h.host_pid))))
            .collect();
        if let Some(pids) = crate::pid_wait::checkpoint_pids(dir, &records) {
            crate::pid_wait::wait_until_free(&*self.seams.targets, &pids, wait, crate::pid_wait::PID_POLL);
        }
    }

    /// The checks of `init(RESTORE)`, before any wait.
    fn init_checked(config: Config, host: &dyn CriuHost, seams: Seams) -> Result<RestoreSession, EngineError> {
        let image_dir = open_image_dir(host)?;
        // Our inventory entry (if the dump added one) must be claimed, or CRIU reports us missing.
        let in_inventory = host.check_and_remove_inventory_plugin(PLUGIN_NAME);
        let images = match &image_dir {
            Some(d) => preflight::read_images(d)?,
            None => Vec::new(),
        };
        let claims = match &image_dir {
            Some(d) => crate::claims::read_claims(d)?,
            None => None,
        };
        let mut s = RestoreSession {
            config,
            seams,
            node: None,
            plans: Vec::new(),
            image_dir,
            results: BTreeMap::new(),
            claims: None,
        };
        if images.is_empty() {
            if let Some(c) = claims {
                // Forked processes of a tree without a CUDA process: their GPU nodes by the kernel driver's list,
                // within the same usable set (the setting, else the restoring runtime's spec) and explicit device
                // map as a CUDA process's.
                let gpus = s.seams.targets.kernel_gpus().unwrap_or_default();
                let source = preflight::usable_source(&s.config, || {
                    given_by_restoring_runtime(&*s.seams.targets, &s.config, &gpus).map(|g| g.map(|(_, g)| g))
                })?;
                let usable = source.gpus_of(&gpus)?;
                let devices = crate::claims::node_devices(&s.config, &*s.seams.targets);
                let planned = RestoreClaims::plan(c, &devices, &[], &gpus, &usable, &s.config)?;
                crate::claims::log_plan(&planned);
                let targets = planned.gpu_targets(&gpus);
                refuse_nodes_the_runtime_denies(&*s.seams.targets, &devices, &targets, "its forked processes")?;
                s.claims = Some(with_host_mounts(&*s.seams.targets, planned));
                return Ok(s);
            }
            if in_inventory == Some(true) {
                // The dump checkpointed CUDA processes with this plugin, but their identity images are
                // gone: restoring would leave them CHECKPOINTED with no way to map their GPUs.
                return Err(EngineError::ImagesMissing {
                    dir: s
                        .image_dir
                        .as_ref()
                        .map(|d| d.shown().display().to_string())
                        .unwrap_or_else(|| "the image directory".into()),
                });
            }
            debug!("no identity images: no CUDA process to restore (inventory entry: {in_inventory:?})");
            return Ok(s);
        }
        if let Some(e) = crate::conflicting_plugin_in(&*s.seams.targets) {
            return Err(e);
        }
        let t0 = Instant::now();
        let processes = images.len();
        let cannot = |e: EngineError| EngineError::CannotRestore { processes, source: Box::new(e) };
        let agent = s.seams.agents.start(host, &s.config, ccm_agent::WarmUp::Restore).map_err(cannot)?;
        let node =
            Node::load_for_restore(agent, s.config.memory_check, || s.seams.targets.kernel_gpus()).map_err(cannot)?;
        // Without an explicit usable set, the GPUs the restoring runtime gives the container. A spec that
        // is there but cannot be read refuses the restore: "all GPUs" could be another tenant's.
        let usable = preflight::usable_source(&s.config, || {
            let given = given_by_restoring_runtime(&*s.seams.targets, &s.config, node.gpus())?;
            if let Some((path, g)) = &given {
                info!(
                    "usable GPUs: [{}], what the restoring runtime's spec {} gives the container ({})",
                    g.uuids.iter().map(|u| u.to_string()).collect::<Vec<_>>().join(", "),
                    path.display(),
                    g.source
                );
            }
            Ok::<_, EngineError>(given.map(|(_, g)| g))
        })?;
        let verdict = preflight::run(&node, images, &s.config, &usable)?;
        log_memory_verdict(&verdict.memory);
        s.plans = verdict.plans;
        for p in &s.plans {
            info!(
                "preflight: pid {} (dumped on {} with driver {}): device map\n{}",
                p.image.pid,
                p.image.hostname,
                p.image.driver_version,
                p.map.render_table(&p.image, node.gpus())
            );
        }
        let devices = crate::claims::node_devices(&s.config, &*s.seams.targets);
        if let Some(c) = claims {
            // The workers' descriptors obey the GPUs the CUDA processes were given, not every GPU of the node.
            let usable = usable.gpus_of(node.gpus())?;
            let planned = RestoreClaims::plan(c, &devices, &s.plans, node.gpus(), &usable, &s.config)?;
            crate::claims::log_plan(&planned);
            let targets = planned.gpu_targets(node.gpus());
            refuse_nodes_the_runtime_denies(&*s.seams.targets, &devices, &targets, "its forked processes")?;
            s.claims = Some(with_host_mounts(&*s.seams.targets, planned));
        }
        // The CUDA processes' new GPUs too: their restore opens those nodes in the container's cgroup.
        let cuda_targets = cuda_gpu_targets(&s.plans, node.gpus());
        refuse_nodes_the_runtime_denies(&*s.seams.targets, &devices, &cuda_targets, "its CUDA processes")?;
        info!("preflight passed for {} CUDA process(es) in {:.3} s", s.plans.len(), t0.elapsed().as_secs_f64());
        s.node = Some(node);
        Ok(s)
    }

    /// RESTORE_EXT_FILE, called by CRIU in the restored task: the claimed open file `id` opened anew on this
    /// node (`None`: not a file this dump claimed).
    pub fn restore_ext_file(&self, id: u32) -> Option<Result<std::os::fd::OwnedFd, EngineError>> {
        let c = self.claims.as_ref()?;
        // CRIU calls this in the restored task: its pid here is its own namespace's, the holder's recorded pid.
        Some(c.reopen(id, std::process::id())?.map_err(|e| {
            EngineError::Claim(crate::claims::ClaimError::Reopen {
                id,
                pid: std::process::id(),
                why: std::sync::Arc::new(e),
            })
        }))
    }

    /// UPDATE_VMA_MAP, called by CRIU in the restored task `ns_pid`: the placeholder of its claimed device
    /// mapping at `addr` (`None`: not a mapping this dump claimed).
    pub fn update_vma_map(&self, ns_pid: u32, addr: u64) -> Option<Result<std::os::fd::OwnedFd, EngineError>> {
        let c = self.claims.as_ref()?;
        Some(
            c.placeholder(ns_pid, addr)?.map_err(|errno| {
                EngineError::Claim(crate::claims::ClaimError::Placeholder { pid: ns_pid, addr, errno })
            }),
        )
    }

    /// RESUME_DEVICES_LATE: every task is restored and ptrace-stopped. The first call handles the
    /// whole tree below `pid` at once, whatever `pid` is (a non-CUDA root, the torchrun shape):
    /// the second value says whether this call did that work, so that its time is logged.
    pub fn resume_devices_late(&mut self, pid: i32) -> (HookOutcome, bool) {
        let Some(pid) = HostPid::new(pid.into()) else { return (HookOutcome::NotMine, false) };
        if self.node.is_none() {
            return (HookOutcome::NotMine, false);
        }
        let mut worked = false;
        if !self.results.contains_key(&pid) {
            let mut tree = vec![pid];
            for c in self.seams.targets.children_recursive(pid.get()).into_iter().filter_map(|c| HostPid::new(c.into()))
            {
                if !tree.contains(&c) {
                    tree.push(c);
                }
            }
            tree.retain(|p| !self.results.contains_key(p));
            worked = self.restore_batch(&tree);
        }
        let outcome = match self.results.get(&pid) {
            None => HookOutcome::NotMine,
            Some(Ok(())) => HookOutcome::Done,
            Some(Err(source)) => HookOutcome::Failed(EngineError::Process { pid, source: source.clone() }),
        };
        (outcome, worked)
    }

    fn plan_for(&self, host_pid: HostPid) -> Option<&ProcessPlan> {
        let ns = ns_pid_of(&*self.seams.targets, host_pid);
        self.plans.iter().find(|p| NsPid(p.image.pid) == ns)
    }

    /// Restores every CUDA process of `pids`; whether there was any.
    fn restore_batch(&mut self, pids: &[HostPid]) -> bool {
        let Some(node) = self.node.as_ref() else { return false };
        let api = &*node.agent;
        let targets = &*self.seams.targets;
        let t0 = Instant::now();
        if let Err(e) = node.cuinit() {
            for &pid in pids {
                if self.plan_for(pid).is_some() {
                    error!("pid {pid} is left CHECKPOINTED: cuInit failed in CRIU ({e}); fix the driver and run `criu-cuda-migrate recover --pid {pid}`");
                }
            }
            return true;
        }
        let jobs = self.cuda_jobs(api, pids);
        if jobs.is_empty() {
            return false;
        }
        debug!(
            "{} CUDA process(es) and their restore threads found in {:.4} s",
            jobs.len(),
            t0.elapsed().as_secs_f64()
        );
        fix_container_devices(targets, &jobs, node);
        // The staging pages the dump wrote to page files go back into the tasks before the driver's restore reads
        // them; a process whose pages cannot is not restored by the driver (it must not run: its tree is killed).
        let unfilled = self.fill_staging(&jobs);
        let (jobs, refused): (Vec<_>, Vec<_>) = jobs.into_iter().partition(|(j, _)| !unfilled.contains_key(&j.pid));
        log_anon_backing(targets, jobs.iter().map(|(j, _)| j.pid), "before the driver's restore");
        // Restore threads run; everything else of each task stays stopped until CRIU resumes it.
        let config = &self.config;
        let driver_t0 = Instant::now();
        let outcomes = with_restore_threads_running(
            targets,
            &jobs,
            |(_, tid)| tid.get(),
            OnResumeError::Skip,
            |(job, _)| restore_one(job, node, config, targets),
        );
        // The driver's part with the identity work (the staging fill above is timed on its own line).
        info!(
            "driver restore of {} CUDA process(es) took {:.3} s (parallel)",
            jobs.len(),
            driver_t0.elapsed().as_secs_f64()
        );
        let reports_t0 = Instant::now();
        let mut kill = Vec::new();
        let mut new_results = Vec::new();
        for ((job, _), outcome) in jobs.iter().zip(outcomes) {
            let pid = job.pid;
            let o = outcome.unwrap_or_else(|e| {
                match &e {
                    BatchError::Panicked => error!("pid {pid}: internal error (the restore worker panicked); its CUDA state is unknown: run `criu-cuda-migrate recover --pid {pid}`"),
                    BatchError::Resume { .. } => error!("pid {pid} is left CHECKPOINTED: {e}; run `criu-cuda-migrate recover --pid {pid}`"),
                }
                RestoreOutcome { ended: Ended::Failed(e.into()), report: String::new() }
            });
            if matches!(o.ended, Ended::Doomed(_)) {
                kill.push(pid);
            }
            let result = o.result();
            if let Some(plan) = job.plan {
                self.write_report(pid, plan, &result, &o.report);
            }
            new_results.push((pid, result));
        }
        for (job, _) in &refused {
            let failure = unfilled.get(&job.pid).cloned().unwrap_or(ProcessFailure::NoImageDir);
            error!("pid {}: {failure}; the restored tree is killed (the images are as they were)", job.pid);
            kill.push(job.pid);
            new_results.push((job.pid, Err(failure)));
        }
        let job_count = jobs.len() + refused.len();
        debug!("restore reports of {job_count} process(es) written in {:.4} s", reports_t0.elapsed().as_secs_f64());
        drop(jobs);
        drop(refused);
        self.results.extend(new_results);
        if !kill.is_empty() {
            self.kill_tree(pids, &kill);
        }
        info!("restore of {job_count} CUDA process(es) took {:.3} s (parallel)", t0.elapsed().as_secs_f64());
        true
    }

    /// Fills the staging pages of every job whose image has a staging table: the restored task's mappings checked
    /// against the table, then every chunk read from the page file, checked and written (one pool of workers for
    /// all). The processes that cannot take their pages, and why.
    fn fill_staging(&self, jobs: &[(Job<'_>, HostTid)]) -> BTreeMap<HostPid, ProcessFailure> {
        let targets = &*self.seams.targets;
        let mut failed = BTreeMap::new();
        let mut files = Vec::new();
        for (job, _) in jobs {
            if job.plan.is_none() {
                // Its image is gone, and with it the table of a page file it may have: its device data cannot be
                // put back, and the driver's restore would give it other bytes.
                let name = ccm_identity::staging::page_file_name(ns_pid_of(targets, job.pid).0);
                if self.image_dir.as_ref().is_some_and(|d| d.file_size(&name).is_ok()) {
                    failed.insert(
                        job.pid,
                        ProcessFailure::StagingMismatch(format!(
                            "its staging pages are in {name}, but their table was in its identity image, which is \
                             missing: restore from a complete checkpoint"
                        )),
                    );
                }
                continue;
            }
            let Some(table) = job.plan.and_then(|p| p.image.staging.as_ref()) else { continue };
            let Some(image_pid) = job.plan.map(|p| p.image.pid) else { continue };
            let checked = targets
                .read_maps(job.pid.get())
                .map_err(|e| format!("its mappings cannot be read: {e}"))
                .and_then(|maps| {
                    ccm_identity::staging::check_restored(table, &crate::staging::map_views(&maps))
                        .map_err(|e| e.to_string())
                })
                .and_then(|()| {
                    let dir = self.image_dir.as_ref().ok_or_else(|| "CRIU gave no image directory".to_string())?;
                    dir.open_file(&ccm_identity::staging::page_file_name(image_pid)).map_err(|e| e.to_string())
                });
            match checked {
                Ok((file, _)) => files.push((job.pid, table, file)),
                Err(why) => {
                    failed.insert(job.pid, ProcessFailure::StagingMismatch(why));
                }
            }
        }
        if files.is_empty() {
            return failed;
        }
        let jobs: Vec<(HostPid, &ccm_identity::staging::StagingTable, &std::fs::File)> =
            files.iter().map(|(p, t, f)| (*p, *t, f)).collect();
        if let Err(e) = crate::staging::fill(targets, &self.config, &jobs) {
            let e = std::sync::Arc::new(e);
            for (pid, _, _) in &jobs {
                failed.insert(*pid, ProcessFailure::StagingFill(e.clone()));
            }
        }
        failed
    }

    /// The CUDA processes of `pids` and their restore threads. Only the restore thread id is asked
    /// here: the driver answers it from outside, while a state query needs the (still stopped)
    /// restore thread and would hang. The state is read by the worker once that thread runs.
    fn cuda_jobs(&self, api: &dyn crate::seam::DriverAgent, pids: &[HostPid]) -> Vec<(Job<'_>, HostTid)> {
        let targets = &*self.seams.targets;
        let mut jobs: Vec<(Job<'_>, HostTid)> = Vec::new();
        // Each pid's plan looked up once (its namespace pid is a /proc read).
        let planned: Vec<(HostPid, Option<&ProcessPlan>)> = pids.iter().map(|&p| (p, self.plan_for(p))).collect();
        let cuda_processes = self.plans.len().max(planned.iter().filter(|(_, p)| p.is_some()).count());
        for (pid, plan) in planned {
            if plan.is_none() && !targets.maps_library(pid.get(), crate::LIBCUDA_FILE).unwrap_or(false) {
                debug!("pid {pid} is not a CUDA process; leaving it to CRIU (-ENOTSUP)");
                continue;
            }
            let tid = match api.restore_thread_id(pid) {
                Ok(t) => t,
                Err(e) => {
                    if plan.is_some() {
                        error!("pid {pid}: has an identity image but no CUDA restore thread ({e}); it cannot use its GPUs. Restore again from the same images.");
                    }
                    continue;
                }
            };
            let storage_file = plan.filter(|p| p.image.driver_storage.is_some()).and_then(|p| {
                let dir = self.image_dir.as_ref()?;
                Some(crate::staging::page_file_path(dir, &ccm_identity::staging::page_file_name(p.image.pid)))
            });
            jobs.push((Job { pid, plan, cuda_processes, storage_file }, tid));
        }
        jobs
    }

    /// Strict mode: a process whose GPU identity is wrong must not run. Kills the whole restored
    /// tree so no half of a job resumes; the images are intact for a retry.
    fn kill_tree(&self, pids: &[HostPid], kill: &[HostPid]) {
        for &pid in pids {
            if let Err(e) = self.seams.targets.kill(pid.get()) {
                error!("pid {pid}: cannot kill it after a failed reconciliation: {e}");
            }
        }
        error!(
            "killed the restored tree ({} process(es)) because pid(s) {:?} failed their driver restore or identity reconciliation (strict mode), or lost their driver agent; images are untouched: fix the cause above and restore again (a failed identity check can be let through with CRIU_CUDA_MIGRATE_MODE=permissive)",
            pids.len(),
            kill
        );
    }

    /// Leaves `cuda-migrate-restore-<pid>.txt` next to the images (best effort; the images
    /// themselves are never written): the map used and what reconciliation did.
    fn write_report(
        &self,
        host_pid: HostPid,
        plan: &ProcessPlan,
        result: &Result<(), ProcessFailure>,
        reconcile: &str,
    ) {
        let Some(dir) = &self.image_dir else { return };
        let Some(node) = &self.node else { return };
        let name = ccm_identity::image::report_file_name(plan.image.pid);
        let text = format!(
            "restored pid {} (host pid {host_pid}) at unix time {}\nresult: {}\ndevice map:\n{}\n{}",
            plan.image.pid,
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
            match result {
                Ok(()) => "ok".to_string(),
                Err(e) => format!("FAILED: {e}"),
            },
            plan.map.render_table(&plan.image, node.gpus()),
            reconcile
        );
        if let Err(e) = write_report_file(dir, &name, &text) {
            warn!("cannot write {name} next to the images ({e}); the same report is in this log");
        }
    }

    /// `exit(RESTORE, ret)`.
    pub fn finish(&mut self, ret: i32) {
        if self.plans.is_empty() {
            return;
        }
        // Each handed-over process's namespace pid read once (a /proc read each), not once per image.
        let handed: Vec<NsPid> = self.results.keys().map(|h| ns_pid_of(&*self.seams.targets, *h)).collect();
        let missing: Vec<NsPid> =
            self.plans.iter().map(|p| NsPid(p.image.pid)).filter(|ns| !handed.contains(ns)).collect();
        if ret == 0 && !missing.is_empty() {
            warn!("restore finished but CUDA process(es) {missing:?} of the images were never handed to the plugin");
        }
    }
}

/// CRIU's image directory, read through CRIU's own descriptor and named as the user knows it.
fn open_image_dir(host: &dyn CriuHost) -> Result<Option<Dir>, EngineError> {
    let Some(fd) = host.image_dir() else { return Ok(None) };
    let shown = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .unwrap_or_else(|_| PathBuf::from("CRIU's image directory"));
    Ok(Some(Dir::from_owned(fd, shown).map_err(preflight::ImageFileError::from)?))
}

/// The GPUs (minor, UUID) the CUDA processes of `plans` are restored onto, each once.
pub fn cuda_gpu_targets(plans: &[crate::preflight::ProcessPlan], gpus: &[GpuIdentity]) -> Vec<(u32, String)> {
    let mut targets: Vec<(u32, String)> = plans
        .iter()
        .flat_map(|p| p.map.pairs.iter())
        .filter_map(|pair| gpus.iter().find(|g| g.uuid == pair.new).map(|g| (g.minor, g.uuid.to_string())))
        .collect();
    targets.sort();
    targets.dedup();
    targets
}

/// A GPU's node that a spec's devices cgroup rules deny the container: `node` as `/dev/nvidia1 (char 195:1)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeniedNode {
    pub node: String,
    pub gpu: String,
}

/// The first of `gpus` (minor, GPU) whose node `spec_json` denies the container, by the rules
/// [`ccm_settings::spec::spec_allows_device`] judges; `None` when the spec allows them all or says nothing.
pub fn node_the_spec_denies(
    spec_json: &str,
    devices: &ccm_identity::claims::NvidiaDevices,
    gpus: &[(u32, String)],
) -> Option<DeniedNode> {
    gpus.iter().find_map(|(minor, gpu)| {
        let node = ccm_identity::claims::NvidiaNode::Gpu(*minor);
        let number = devices.number_of(node)?;
        (ccm_settings::spec::spec_allows_device(spec_json, number) == Some(false))
            .then(|| DeniedNode { node: format!("{node} ({number})"), gpu: gpu.clone() })
    })
}

/// Refuses, before CRIU restores anything, a restore that puts processes on a GPU whose node the restoring runtime's
/// devices cgroup denies the container (`targets`: minor and GPU): the restore would fail in the middle otherwise
/// (the forked workers' reopen, the driver's own opens). Podman's `restore --import` keeps the checkpoint's spec, and
/// with it the checkpoint's devices, whatever GPUs the usable set names. Only a spec that gives GPU nodes and device
/// rules is judged ([`ccm_settings::spec::spec_allows_device`]).
fn refuse_nodes_the_runtime_denies(
    targets: &dyn Targets,
    devices: &ccm_identity::claims::NvidiaDevices,
    gpus: &[(u32, String)],
    who: &str,
) -> Result<(), EngineError> {
    if gpus.is_empty() {
        return Ok(());
    }
    // An unreadable spec was refused already where the usable set was read.
    let Ok(Some(spec)) = targets.restoring_runtime_spec() else { return Ok(()) };
    match node_the_spec_denies(&spec.text, devices, gpus) {
        Some(DeniedNode { node, gpu }) => Err(EngineError::NodeDenied {
            spec: format!("({}) spec {}", spec.runtime, spec.path.display()),
            node,
            gpu,
            who: who.to_string(),
        }),
        None => Ok(()),
    }
}

/// The claims with CRIU's own mounts when a descriptor moves to another GPU's node, read here in CRIU's process:
/// the restored tasks that reopen the descriptors cannot tell them (their `/proc` is not theirs yet).
fn with_host_mounts(targets: &dyn Targets, mut planned: RestoreClaims) -> RestoreClaims {
    if planned.moves_a_gpu_node() {
        match targets.own_mounts() {
            Ok(m) => planned.set_host_mounts(m),
            Err(e) => warn!(
                "cannot read CRIU's own mounts ({e}): a restored container's /dev that lacks a moved GPU's node does \
                 not get it before CRIU reopens the forked processes' descriptors"
            ),
        }
    }
    planned
}

/// At debug level (CRIU's `-v4`), how each process's anonymous memory is backed, the staging pages among it:
/// transparent huge pages or 4 KiB pages, which the driver pins for its copy (the kernel walks the page tables to
/// answer, so only when asked for).
pub(crate) fn log_anon_backing(targets: &dyn Targets, pids: impl Iterator<Item = HostPid>, when: &str) {
    if !log::log_enabled!(log::Level::Debug) {
        return;
    }
    for pid in pids {
        if let Some(r) = targets.anon_rollup(pid.get()) {
            debug!(
                "pid {pid}: {when}: {} MiB of anonymous memory, {} MiB of it in transparent huge pages",
                r.anon_kib >> 10,
                r.huge_kib >> 10
            );
        }
    }
}

/// The preflight's free-memory verdict, in the log.
fn log_memory_verdict(memory: &preflight::MemoryVerdict) {
    match memory {
        preflight::MemoryVerdict::Off => {
            info!("preflight: the free-memory check is off ({}=off)", ccm_settings::MEMORY_CHECK.env)
        }
        preflight::MemoryVerdict::Unreadable(e) => {
            warn!("cannot read the GPUs' free memory ({e}); the restore goes on without the memory check")
        }
        preflight::MemoryVerdict::Checked { targets, unknown } => {
            if !unknown.is_empty() {
                warn!("the dump recorded no device memory for pid(s) {unknown:?} (NVML could not tell, or an older image); their share is not checked");
            }
            if !targets.is_empty() {
                info!("preflight: device memory: {}", preflight::render_memory(targets));
            }
        }
    }
}

/// The pid `host_pid` has in its own pid namespace, which its identity image records (itself when
/// `/proc` cannot tell: a process in CRIU's own namespace).
fn ns_pid_of(targets: &dyn Targets, host_pid: HostPid) -> NsPid {
    NsPid(targets.ns_pid(host_pid.get()).unwrap_or(host_pid.get()))
}

/// Gives each restored container's `/dev` the nodes of its new GPUs and drops those of the GPUs
/// it left, before the driver's restore opens them. CRIU restores the DUMPED container's `/dev`
/// (a tmpfs), so after a move onto GPUs of other minors it holds the old node names while the
/// runtime's devices cgroup allows only the new ones. Once per mount namespace; a process on the
/// host's `/dev` is never touched.
fn fix_container_devices(targets: &dyn Targets, jobs: &[(Job<'_>, HostTid)], node: &Node) {
    let mut done: Vec<u64> = Vec::new();
    for (job, _) in jobs {
        let Some(plan) = job.plan else { continue };
        let moves: Vec<(u32, u32)> = plan
            .map
            .pairs
            .iter()
            .filter_map(|p| Some((plan.image.gpu(&p.old)?.minor, node.gpu(&p.new)?.minor)))
            .collect();
        let Ok(ns) = targets.mount_namespace(job.pid.get()) else { continue };
        if done.contains(&ns) {
            continue;
        }
        done.push(ns);
        let unmoved = moves.iter().all(|(o, n)| o == n);
        let dev = match targets.container_dev(job.pid.get()) {
            Ok(DevView::Own(d)) if unmoved => {
                info!("pid {}: container /dev: its own tmpfs, GPU nodes {:?}; the GPUs keep their minors, nothing to change", job.pid, d.gpu_minors());
                continue;
            }
            Ok(DevView::Own(d)) => d,
            Ok(DevView::HostNamespace) => continue,
            Ok(DevView::Foreign { why, .. }) if unmoved => {
                info!("pid {}: {why}; the GPUs keep their minors, so it needs no change", job.pid);
                continue;
            }
            Ok(DevView::Foreign { why, gpu_minors }) => {
                warn_foreign_dev(job.pid, &why, &gpu_minors, &moves);
                continue;
            }
            Err(e) => {
                warn!(
                    "pid {}: cannot read its container's /dev ({e}); its GPU device nodes are left as restored",
                    job.pid
                );
                continue;
            }
        };
        for (name, kind) in dev.impostors() {
            warn!(
                "pid {}: container /dev/{} is {kind}, not a GPU node: left alone",
                job.pid,
                ccm_identity::text::escaped(name)
            );
        }
        for edit in ccm_settings::spec::plan_node_edits(&moves, dev.gpu_minors()) {
            let (what, minor, r) = match edit {
                ccm_settings::spec::NodeEdit::Create { minor } => ("created", minor, dev.create_gpu_node(minor)),
                ccm_settings::spec::NodeEdit::Remove { minor } => ("removed", minor, dev.remove_gpu_node(minor)),
            };
            match r {
                Ok(()) => info!(
                    "pid {}: container /dev: {what} {} (GPU minors {:?} -> {:?})",
                    job.pid,
                    ccm_process::container::shown(minor),
                    moves.iter().map(|m| m.0).collect::<Vec<_>>(),
                    moves.iter().map(|m| m.1).collect::<Vec<_>>()
                ),
                Err(e) => warn!(
                    "pid {}: container /dev: {what} {} failed: {e}; the driver's restore may not find its GPU",
                    job.pid,
                    ccm_process::container::shown(minor)
                ),
            }
        }
    }
}

/// The one line for a container whose `/dev` the plugin must not edit: what it is, what the
/// container sees, and what to do.
fn warn_foreign_dev(pid: HostPid, why: &ForeignDev, shows: &[u32], moves: &[(u32, u32)]) {
    let nodes = |m: &mut dyn Iterator<Item = u32>| m.map(ccm_process::container::shown).collect::<Vec<_>>().join(", ");
    let sees = if shows.is_empty() {
        "no GPU node it can be seen to hold".to_string()
    } else {
        nodes(&mut shows.iter().copied())
    };
    warn!(
        "pid {pid}: {why}: left unchanged. The container sees {sees}, while it now runs on {} (moved from {}); give \
         the container its GPUs through its runtime (CDI, --device, the device plugin) rather than the host's /dev, or \
         restore it onto the same GPUs",
        nodes(&mut moves.iter().map(|m| m.1)),
        nodes(&mut moves.iter().map(|m| m.0)),
    );
}

/// The GPUs the runtime that runs this CRIU (runc, crun, youki) gives the container in its
/// spec. `Ok(None)`: no such runtime, no spec, or a spec that says nothing about GPUs. The test doubles' stand-in
/// nodes the configuration names count as the GPU nodes they stand for.
fn given_by_restoring_runtime(
    targets: &dyn Targets,
    config: &Config,
    node_gpus: &[GpuIdentity],
) -> Result<Option<(PathBuf, GivenGpus)>, EngineError> {
    let spec = targets.restoring_runtime_spec().map_err(EngineError::SpecFile)?;
    let Some(spec) = spec else { return Ok(None) };
    let stand_ins = crate::claims::with_stand_ins(config, Default::default()).stand_ins;
    match ccm_settings::spec::gpus_given_by_spec_with_stand_ins(&spec.text, node_gpus, &stand_ins) {
        Ok(g) => Ok(g.map(|g| (spec.path, g))),
        Err(source) => Err(EngineError::Spec {
            runtime: spec.runtime,
            path: spec.path.display().to_string(),
            source: Box::new(source),
        }),
    }
}

/// How the restore of one process ended.
#[derive(Debug)]
enum Ended {
    /// Unlocked: RUNNING (with a permissive-mode identity warning, if any).
    Resumed,
    /// Left as CRIU restored it (not CHECKPOINTED: nothing for the driver to do).
    AsFound,
    /// Failed, the process left as the ERROR line says (CHECKPOINTED or LOCKED, for `recover`).
    Failed(ProcessFailure),
    /// Failed so that it must not run: the whole restored tree is killed (strict mode, or an
    /// agent lost mid-call); the images stay for another restore.
    Doomed(ProcessFailure),
}

/// What the restore of one process did.
struct RestoreOutcome {
    ended: Ended,
    /// The reconciliation report for `cuda-migrate-restore-<pid>.txt`.
    report: String,
}

impl RestoreOutcome {
    fn result(&self) -> Result<(), ProcessFailure> {
        match &self.ended {
            Ended::Resumed | Ended::AsFound => Ok(()),
            Ended::Failed(f) | Ended::Doomed(f) => Err(f.clone()),
        }
    }
}

/// Driver restore, reconciliation, unlock for one process.
fn restore_one(job: &Job<'_>, node: &Node, config: &Config, targets: &dyn Targets) -> RestoreOutcome {
    let mut report = String::new();
    let ended = restore_one_steps(job, node, config, targets, &mut report);
    RestoreOutcome { ended, report }
}

fn restore_one_steps(job: &Job<'_>, node: &Node, config: &Config, targets: &dyn Targets, report: &mut String) -> Ended {
    let pid = job.pid;
    let api = &*node.agent;
    match api.state(pid) {
        Ok(ProcessState::Checkpointed) => {}
        Ok(other) => {
            if job.plan.is_some() {
                warn!(
                    "pid {pid}: CUDA state {other} after CRIU's restore (expected CHECKPOINTED); leaving it as it is"
                );
            }
            return Ended::AsFound;
        }
        Err(e) => {
            error!("pid {pid}: cannot read its CUDA state ({e}); run `criu-cuda-migrate recover --pid {pid}`");
            return Ended::Failed(ProcessFailure::State(e));
        }
    }
    if job.plan.is_none() {
        // Its image is gone (a hostile checkpoint image's whiteout deletes one at unpack): no device map, no
        // reconciliation, no validation. Strict mode does not let such a process run.
        let image = ccm_identity::image::IdentityImage::file_name(ns_pid_of(targets, pid).0);
        match config.strictness {
            Strictness::Strict => {
                error!("pid {pid}: CHECKPOINTED CUDA process without identity image ({image} is not in the image directory): its GPUs cannot be mapped nor its identity checked, so strict mode kills the restored tree. Restore from a complete checkpoint (criu-cuda-migrate preflight names each process's image), or set CRIU_CUDA_MIGRATE_MODE=permissive to restore it onto the same GPUs unchecked");
                return Ended::Doomed(ProcessFailure::NoIdentityImage { image });
            }
            Strictness::Permissive => warn!("pid {pid}: CHECKPOINTED CUDA process without identity image ({image}); restoring it onto the same GPUs, unchecked (permissive mode)"),
        }
    }
    let pairs: Vec<(GpuUuid, GpuUuid)> = match job.plan {
        Some(p) if !p.map.is_identity() => p.map.driver_pairs(),
        _ => Vec::new(),
    };
    info!("pid {pid}: driver restore started ({} pair(s))", pairs.len());
    let device_bytes = job.plan.and_then(|p| p.image.device_memory.as_ref()).map(|u| u.iter().map(|x| x.bytes).sum());
    let storage = job.plan.and_then(|p| p.image.driver_storage.as_ref());
    let r = timed(|| match (storage, job.storage_file.as_deref()) {
        (Some(storage), Some(file)) => {
            api.restore_from_storage(pid, &pairs, file, storage, config.call_deadline(Some(storage.device_bytes())))
        }
        (Some(_), None) => Err(ccm_agent::AgentError::Agent(
            "its device memory is in its page file (the driver's custom storage), and CRIU gave no image directory to \
             read it from"
                .to_string(),
        )),
        (None, _) => api.restore(pid, &pairs, config.call_deadline(device_bytes)),
    });
    if let Err(e) = r.value {
        if e.is_lost() {
            // Whatever the driver did to it, CRIU's restore cannot finish it: it must not run.
            error!("pid {pid}: {e}, during the driver's restore; its CUDA state is unknown, so the restored tree is killed. The images are intact: restore again");
            return Ended::Doomed(ProcessFailure::Driver(e));
        }
        let advice = crate::sharing::restore_advice(e.cuda_code(), !pairs.is_empty(), job.cuda_processes);
        let cause = advice.cause;
        return match config.strictness {
            // A process whose device state could not come back must not run half-restored:
            // the whole restored tree goes, and the images stay for the retry.
            Strictness::Strict => {
                error!("pid {pid}: the driver's restore failed after {:.3} s: {e}{cause}; strict mode kills the restored tree. The images are intact: {}", r.elapsed.as_secs_f64(), advice.fix);
                Ended::Doomed(ProcessFailure::Driver(e))
            }
            Strictness::Permissive if !advice.recoverable => {
                error!("pid {pid} is left CHECKPOINTED: {e}{cause}; `criu-cuda-migrate recover` cannot bring it back either: kill it; {}", advice.fix);
                Ended::Failed(ProcessFailure::Driver(e))
            }
            Strictness::Permissive => {
                error!("pid {pid} is left CHECKPOINTED: {e}{cause}; fix the cause and run `criu-cuda-migrate recover --pid {pid}`, or kill it and restore again from the same images");
                Ended::Failed(ProcessFailure::Driver(e))
            }
        };
    }
    info!(
        "pid {pid}: cuCheckpointProcessRestore{} with {} pair(s) {:.3} s",
        if storage.is_some() { " from custom storage (its page file)" } else { "" },
        pairs.len(),
        r.elapsed.as_secs_f64()
    );
    if let Some(plan) = job.plan.filter(|p| !p.map.changed().is_empty()) {
        if config.reconcile {
            let s: ReconcileSummary = targets.reconcile(pid, plan, node);
            report.push_str(&format!("reconciliation: {s}\n"));
            info!("pid {pid}: identity reconciliation: {s}");
            if !s.failures.is_empty() {
                let failure = ProcessFailure::Inconsistent(s.failures);
                match config.strictness {
                    Strictness::Strict => {
                        error!("pid {pid}: {failure}");
                        return Ended::Doomed(failure);
                    }
                    Strictness::Permissive => {
                        let ProcessFailure::Inconsistent(all) = &failure else { unreachable!("made just above") };
                        error!(
                            "pid {pid}: GPU identity is inconsistent after restore (permissive mode: it resumes anyway): {}",
                            all.iter().map(|f| f.to_string()).collect::<Vec<_>>().join("; ")
                        )
                    }
                }
            }
        } else {
            warn!("pid {pid}: reconciliation is off (CRIU_CUDA_MIGRATE_RECONCILE=off): its CUDA bus ids still name the dump node's GPUs");
        }
    }
    let u = timed(|| api.unlock(pid));
    if let Err(e) = u.value {
        if e.is_lost() {
            error!(
                "pid {pid}: {e}, during its unlock; the restored tree is killed. The images are intact: restore again"
            );
            return Ended::Doomed(ProcessFailure::Driver(e));
        }
        error!("pid {pid} is left LOCKED: {e}; run `criu-cuda-migrate recover --pid {pid}`");
        return Ended::Failed(ProcessFailure::Driver(e));
    }
    info!("pid {pid}: cuCheckpointProcessUnlock {:.3} s; RUNNING", u.elapsed.as_secs_f64());
    Ended::Resumed
}

/// The restore report's mode: its owner's only, as the identity image's (0600). The report names
/// the node's GPUs, the map and what was rewritten in the process; the image directory may be
/// readable by others (before: 0644 whatever the umask).
pub const REPORT_MODE: u32 = 0o600;

/// Writes a restore report: a fresh file renamed into place (a link planted under that name is
/// replaced, never followed), mode [`REPORT_MODE`].
fn write_report_file(dir: &Dir, name: &str, text: &str) -> Result<(), ccm_process::dir::FileError> {
    dir.write_file(name, text.as_bytes(), REPORT_MODE)
}

#[cfg(test)]
mod report_tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_restore_report_is_its_owners_only() {
        let path = std::env::temp_dir().join(format!("ccm-report-mode-{}", std::process::id()));
        std::fs::create_dir_all(&path).unwrap();
        let dir = Dir::open(&path).unwrap();
        let name = ccm_identity::image::report_file_name(7);
        write_report_file(&dir, &name, "restored pid 7\n").unwrap();
        let mode = std::fs::metadata(path.join(&name)).unwrap().permissions().mode() & 0o7777;
        std::fs::remove_dir_all(&path).unwrap();
        assert_eq!(mode, 0o600, "the report is {mode:o}");
    }
}
