//! The dump session's rules, every branch, through the scripted seams (`crate::fake`): no root,
//! GPU or CRIU. Each test uses pids of its own, by which it finds its log lines.

use std::time::Duration;

use ccm_driver::abi::CudaCode;
use ccm_driver::checkpoint::ProcessState::{self, Checkpointed, Locked, Running};
use ccm_identity::image::{IdentityImage, PciSite};

use crate::dump::{DumpSession, NoDumpDriver};
use crate::fake::*;
use crate::{Config, EngineError, HookOutcome, ProcessFailure};

/// A dump of `pids` (all CUDA processes, RUNNING) on a node of two GPUs.
struct Dump {
    session: DumpSession,
    agent: FakeAgent,
    targets: FakeTargets,
    criu: FakeCriu,
    starter: FakeStarter,
}

fn dump_with(name: &str, config: Config, pids: &[u32], more_agents: usize) -> Dump {
    capture_log();
    let agent = FakeAgent::new(vec![gpu(0), gpu(1)]);
    let targets = FakeTargets::default();
    for &p in pids {
        agent.cuda(p, Running);
        targets.cuda(p);
        targets.script().minors.insert(p, [0].into());
        agent.script().device_bytes.insert(p, 3 << 30);
    }
    let mut agents = vec![Ok(agent.clone())];
    agents.extend((0..more_agents).map(|_| Ok(agent.fresh())));
    let (seams, starter) = seams(&targets, agents);
    let criu = FakeCriu::new(name);
    let session = DumpSession::init_with(config, &criu, seams).unwrap();
    Dump { session, agent, targets, criu, starter }
}

fn dump(name: &str, pids: &[u32]) -> Dump {
    dump_with(name, config(&[]), pids, 1)
}

impl Dump {
    fn pause(&mut self, pid: u32) -> HookOutcome {
        self.session.pause_devices(i32::try_from(pid).unwrap(), &self.criu)
    }
    fn checkpoint(&mut self, pid: u32) -> HookOutcome {
        self.session.checkpoint_devices(i32::try_from(pid).unwrap(), &self.criu)
    }
    fn finish(&mut self, ret: i32) {
        self.session.finish(ret, &self.criu)
    }
    fn image(&self, pid: u32) -> Option<IdentityImage> {
        let bytes = std::fs::read(self.criu.path().join(IdentityImage::file_name(pid))).ok()?;
        Some(IdentityImage::decode(&bytes).unwrap())
    }
    fn states(&self, pids: &[u32]) -> Vec<ProcessState> {
        pids.iter().map(|p| self.agent.state_of(*p)).collect()
    }
}

fn done(o: &HookOutcome) -> bool {
    matches!(o, HookOutcome::Done)
}

fn not_mine(o: &HookOutcome) -> bool {
    matches!(o, HookOutcome::NotMine)
}

fn failure(o: HookOutcome) -> EngineError {
    match o {
        HookOutcome::Failed(e) => e,
        other => panic!("expected a failure, got {other:?}"),
    }
}

fn process_failure(o: HookOutcome) -> ProcessFailure {
    match failure(o) {
        EngineError::Process { source, .. } => source,
        other => panic!("expected a process failure, got {other}"),
    }
}

// ----- init ------------------------------------------------------------------------------------

#[test]
fn init_without_an_agent_leaves_cuda_processes_to_criu() {
    capture_log();
    let (seams, _) = seams(&FakeTargets::default(), vec![Err("fork failed 9101".into())]);
    let r = DumpSession::init_with(config(&[]), &FakeCriu::without_dir(), seams);
    assert!(matches!(r, Err(NoDumpDriver::Agent(_))));
    assert_eq!(logged(&["fork failed 9101", "CUDA processes cannot be checkpointed in this run"]).len(), 1);
}

#[test]
fn init_without_libcuda_is_disabled() {
    capture_log();
    let agent = FakeAgent::new(vec![]);
    agent.script().driver_error = Some(ccm_agent::AgentError::NoDriver("no libcuda 9102".into()));
    let (seams, _) = seams(&FakeTargets::default(), vec![Ok(agent)]);
    let r = DumpSession::init_with(config(&[]), &FakeCriu::without_dir(), seams);
    assert!(matches!(r, Err(NoDumpDriver::Driver(_))));
    assert_eq!(logged(&["WARN disabled: no libcuda 9102"]).len(), 1);
}

#[test]
fn init_lets_the_agent_end_by_itself() {
    let d = dump("init", &[]);
    assert!(d.agent.script().exit_without_waiting);
    assert_eq!(*d.starter.started.lock().unwrap(), vec![ccm_agent::WarmUp::Dump]);
}

// ----- PAUSE_DEVICES ---------------------------------------------------------------------------

#[test]
fn a_process_without_libcuda_or_unreadable_maps_is_not_ours_and_no_driver_call_is_made() {
    let mut d = dump("plain", &[]);
    d.targets.script().maps_unreadable.insert(1102);
    assert!(not_mine(&d.pause(1101)));
    assert!(not_mine(&d.pause(1102)));
    assert!(not_mine(&d.pause(0)));
    assert!(not_mine(&d.session.pause_devices(-5, &d.criu)));
    assert_eq!(d.agent.calls(), vec!["driver"], "only init's driver() call");
    assert_eq!(logged(&["pid 1102: cannot read its mappings"]).len(), 1);
}

#[test]
fn criu_s_own_cuda_plugin_fails_the_dump() {
    let mut d = dump("conflict", &[1201]);
    d.targets.script().criu_cuda_plugin = true;
    assert!(matches!(failure(d.pause(1201)), EngineError::ConflictingPlugin));
}

#[test]
fn a_node_that_cannot_load_leaves_the_process_to_criu() {
    let mut d = dump("noload", &[1301]);
    d.agent.script().driver_error = Some(ccm_agent::AgentError::NoDriver("gone 1301".into()));
    assert!(not_mine(&d.pause(1301)));
    // Not tried again.
    assert!(not_mine(&d.pause(1301)));
    assert_eq!(logged(&["disabled: no usable NVIDIA driver: gone 1301"]).len(), 1);
}

#[test]
fn cuinit_failure_fails_the_hook() {
    let mut d = dump("cuinit", &[1401]);
    d.agent.script().cuinit_error = Some(cuda_error("cuInit", CudaCode::Unknown));
    assert!(matches!(failure(d.pause(1401)), EngineError::Driver { .. }));
    assert_eq!(d.agent.state_of(1401), Running);
}

#[test]
fn libcuda_without_a_restore_thread_is_not_a_cuda_process() {
    let mut d = dump("notcuda", &[]);
    d.targets.cuda(1501);
    assert!(not_mine(&d.pause(1501)));
    assert_eq!(logged(&["pid 1501 maps libcuda but has no CUDA restore thread"]).len(), 1);
    d.finish(0);
}

#[test]
fn the_agent_lost_or_failing_at_each_query_fails_the_hook() {
    for (call, e) in
        [("restore_thread_id", lost(false)), ("state", lost(true)), ("state", cuda_error("s", CudaCode::Unknown))]
    {
        let mut d = dump("query", &[1601]);
        d.agent.fail(call, 1601, e);
        assert!(matches!(failure(d.pause(1601)), EngineError::Driver { .. }), "{call}");
        assert_eq!(d.agent.state_of(1601), Running);
        // Nothing of it was tracked: nothing to put back.
        d.finish(1);
        assert!(!d.agent.called("unlock 1601"));
    }
}

#[test]
fn a_running_process_is_locked_once_and_the_inventory_entry_added() {
    let mut d = dump("lock", &[1701]);
    assert!(done(&d.pause(1701)));
    assert_eq!(d.agent.state_of(1701), Locked);
    assert!(*d.criu.inventory_added.lock().unwrap());
    assert!(not_mine(&d.pause(1701)), "a second PAUSE_DEVICES of the same pid");
    assert_eq!(logged(&["pid 1701: CUDA process, restore thread 11701, initial state"]).len(), 1);
    assert_eq!(logged(&["pid 1701: cuCheckpointProcessLock (timeout"]).len(), 1);
}

#[test]
fn a_failed_lock_that_did_not_take_is_left_running() {
    let mut d = dump("lockfail", &[1801]);
    d.agent.fail("lock", 1801, cuda_error("cuCheckpointProcessLock", CudaCode::Unknown));
    assert!(matches!(failure(d.pause(1801)), EngineError::Driver { .. }));
    assert_eq!(d.agent.state_of(1801), Running);
    assert!(!d.agent.called("unlock 1801"));
    d.finish(1);
    assert_eq!(d.agent.state_of(1801), Running);
}

#[test]
fn a_failed_lock_that_took_anyway_is_unlocked_again() {
    let mut d = dump("locktook", &[1811]);
    d.agent.fail("lock", 1811, cuda_error("cuCheckpointProcessLock", CudaCode::Unknown));
    d.agent.script().takes_effect.insert(("lock", 1811));
    assert!(matches!(failure(d.pause(1811)), EngineError::Driver { .. }));
    assert_eq!(d.agent.state_of(1811), Running);
    assert_eq!(logged(&["WARN pid 1811: lock failed, unlocked it again"]).len(), 1);
}

#[test]
fn a_failed_lock_whose_unlock_fails_names_recover() {
    let mut d = dump("lockstuck", &[1821]);
    d.agent.fail("lock", 1821, cuda_error("cuCheckpointProcessLock", CudaCode::Unknown));
    d.agent.fail("unlock", 1821, cuda_error("cuCheckpointProcessUnlock", CudaCode::Unknown));
    d.agent.script().takes_effect.insert(("lock", 1821));
    assert!(matches!(failure(d.pause(1821)), EngineError::Driver { .. }));
    assert_eq!(d.agent.state_of(1821), Locked);
    assert_eq!(logged(&["ERROR pid 1821 is left LOCKED after a failed lock", "recover --pid 1821"]).len(), 1);
}

#[test]
fn an_agent_lost_at_the_lock_is_put_back_by_a_fresh_agent_at_exit() {
    for stalled in [false, true] {
        let pid = if stalled { 1832 } else { 1831 };
        let mut d = dump("locklost", &[pid]);
        d.agent.fail("lock", pid, lost(stalled));
        // The driver took the lock within its timeout after the agent was lost.
        d.agent.script().takes_effect.insert(("lock", pid));
        assert!(matches!(failure(d.pause(pid)), EngineError::Driver { .. }));
        assert!(d.agent.is_lost());
        d.finish(1);
        assert_eq!(d.starter.started.lock().unwrap().len(), 2, "a fresh agent");
        assert_eq!(d.agent.state_of(pid), Running);
        assert!(seen(&["the driver agent was lost: starting a fresh one to put the processes back"]));
        assert_eq!(logged(&[&format!("pid {pid}: rolled back: unlocked, RUNNING again")]).len(), 1);
    }
}

#[test]
fn too_little_of_criu_s_timeout_left_refuses_to_lock() {
    let mut c = config(&[]);
    c.lock_timeout = Duration::from_millis(200);
    let mut d = dump_with("notime", c, &[1901], 1);
    match failure(d.pause(1901)) {
        EngineError::NoTimeToLock { timeout_s, .. } => assert_eq!(timeout_s, 0),
        other => panic!("{other}"),
    }
    assert!(!d.agent.called("lock 1901"));
    assert_eq!(d.agent.state_of(1901), Running);
}

#[test]
fn a_process_found_locked_is_left_as_found() {
    let mut d = dump("found", &[2001]);
    d.agent.cuda(2001, Locked);
    assert!(done(&d.pause(2001)));
    assert!(!d.agent.called("lock 2001"));
    assert_eq!(logged(&["pid 2001 is already LOCKED"]).len(), 1);
    d.finish(1);
    assert_eq!(d.agent.state_of(2001), Locked);
    assert!(!d.agent.called("state 2001") || d.agent.calls().iter().filter(|c| *c == "state 2001").count() == 1);
}

#[test]
fn a_frozen_cgroup_is_thawed_once_and_frozen_again_at_exit() {
    let mut d = dump("frozen", &[2101, 2102]);
    d.targets.script().frozen.insert(2101, "/sys/fs/cgroup/pod-2101".into());
    d.targets.script().frozen.insert(2102, "/sys/fs/cgroup/pod-2101".into());
    assert!(done(&d.pause(2101)));
    assert!(done(&d.pause(2102)));
    d.finish(1);
    assert_eq!(
        d.targets.script().cgroup_events,
        vec!["thaw /sys/fs/cgroup/pod-2101", "refreeze /sys/fs/cgroup/pod-2101"]
    );
    assert_eq!(logged(&["pid 2101: its cgroup /sys/fs/cgroup/pod-2101 was frozen"]).len(), 1);
    assert_eq!(logged(&["cgroup /sys/fs/cgroup/pod-2101 frozen again, as the dump found it"]).len(), 1);
}

#[test]
fn a_cgroup_that_cannot_be_thawed_fails_the_hook_and_one_not_refrozen_is_said() {
    let mut d = dump("thawfail", &[2111]);
    d.targets.script().frozen.insert(2111, "/sys/fs/cgroup/pod-2111".into());
    d.targets.script().thaw_fails = true;
    assert!(matches!(failure(d.pause(2111)), EngineError::FrozenCgroup { .. }));

    let mut d = dump("refreezefail", &[2112]);
    d.targets.script().frozen.insert(2112, "/sys/fs/cgroup/pod-2112".into());
    d.targets.script().refreeze_fails = true;
    assert!(done(&d.pause(2112)));
    d.finish(1);
    assert_eq!(logged(&["cannot freeze cgroup /sys/fs/cgroup/pod-2112 again", "pause it again"]).len(), 1);
}

// ----- CHECKPOINT_DEVICES ----------------------------------------------------------------------

fn site(gpu_index: u32, addr: u64) -> PciSite {
    PciSite {
        gpu: gpu(gpu_index).uuid,
        addr,
        mapping_start: 0x1000,
        mapping_end: 0x81000,
        mapping_name: "[heap]".into(),
        words: gpu(gpu_index).signature(),
    }
}

#[test]
fn a_final_dump_checkpoints_writes_the_image_and_leaves_the_process_checkpointed() {
    let mut d = dump_with("final", config(&[("CRIU_CUDA_MIGRATE_LEAVE_RUNNING", "0")]), &[2201], 1);
    d.targets.script().sites.insert(2201, Some(vec![site(0, 0x2000)]));
    d.targets.script().narrow_finds.insert(2201);
    d.targets.script().ns_pids.insert(2201, 7);
    assert!(done(&d.pause(2201)));
    assert!(done(&d.checkpoint(2201)));
    assert!(done(&d.checkpoint(2201)), "later calls report the stored result");
    assert!(not_mine(&d.checkpoint(2299)), "an untracked pid");
    assert_eq!(d.agent.state_of(2201), Checkpointed);
    let img = d.image(7).expect("the image is named by the namespace pid");
    assert_eq!(img.host_pid, 2201);
    assert_eq!(img.used, vec![gpu(0).uuid]);
    assert_eq!(img.enumerated, vec![gpu(0).uuid]);
    assert_eq!(img.hostname, "node-a");
    assert_eq!(img.device_memory.as_ref().map(|u| u[0].bytes), Some(3 << 30));
    d.finish(0);
    assert_eq!(d.agent.state_of(2201), Checkpointed);
    assert!(seen(&["dump done; 1 CUDA process(es) stay checkpointed for CRIU to end them"]));
    assert_eq!(d.targets.script().ptrace, vec!["resume 12201", "stop 12201"]);
}

#[test]
fn leave_running_and_criu_over_rpc_put_every_process_back() {
    for (value, why) in [("1", "--leave-running"), ("", "CRIU runs over RPC")] {
        let pid = if value.is_empty() { 2302 } else { 2301 };
        let env: Vec<(&str, &str)> =
            if value.is_empty() { vec![] } else { vec![("CRIU_CUDA_MIGRATE_LEAVE_RUNNING", value)] };
        let mut c = config(&env);
        if value.is_empty() {
            c.leave_running = crate::LeaveRunning::Unknown;
        }
        let mut d = dump_with("leave", c, &[pid], 1);
        assert!(done(&d.pause(pid)));
        assert!(done(&d.checkpoint(pid)));
        d.finish(0);
        assert_eq!(d.agent.state_of(pid), Running, "{why}");
        assert!(seen(&["rolling back 1 CUDA process(es): ", why]));
        assert_eq!(logged(&[&format!("pid {pid}: rolled back: cuCheckpointProcessRestore")]).len(), 1);
    }
}

/// Issue 47, item 6: where the driver offers custom storage and the staging setting is `plugin`, the driver agent
/// checkpoints into the page file and the put-back restores from it; `staging criu` keeps the driver's own staging.
#[test]
fn custom_storage_is_used_where_offered_unless_staging_is_criu_and_the_put_back_reads_the_page_file() {
    for (pid, staging, calls) in
        [(2311, "plugin", ["checkpoint_to_storage", "restore_from_storage"]), (2312, "criu", ["checkpoint", "restore"])]
    {
        let c = config(&[("CRIU_CUDA_MIGRATE_LEAVE_RUNNING", "1"), ("CRIU_CUDA_MIGRATE_STAGING", staging)]);
        let mut d = dump_with("custom", c, &[pid], 1);
        d.agent.script().custom_storage = true;
        assert!(done(&d.pause(pid)));
        assert!(done(&d.checkpoint(pid)));
        d.finish(0);
        assert_eq!(d.agent.state_of(pid), Running, "{staging}");
        let made: Vec<String> =
            d.agent.script().calls.iter().filter(|c| c.ends_with(&pid.to_string())).cloned().collect();
        for call in calls {
            assert!(made.contains(&format!("{call} {pid}")), "{staging}: {made:?}");
        }
        let page_file = d.criu.path().join(ccm_identity::staging::page_file_name(pid));
        assert_eq!(page_file.exists(), staging == "plugin", "{staging}");
        if staging == "plugin" {
            assert!(d.image(pid).unwrap().driver_storage.is_some());
        }
    }
}

/// A checkpoint to custom storage the driver refuses before it takes the process (still LOCKED): the driver's own
/// checkpoint instead, one line saying why; no driver storage table, no page file of the agent's left.
#[test]
fn custom_storage_refused_before_the_driver_took_the_process_falls_back_to_the_staged_checkpoint() {
    let pid = 2321;
    let mut d = dump_with("custom-fallback", config(&[]), &[pid], 1);
    d.agent.script().custom_storage = true;
    d.agent.fail("checkpoint_to_storage", pid, cuda_error("cuCheckpointProcessCheckpoint", CudaCode::InvalidValue));
    assert!(done(&d.pause(pid)));
    assert!(done(&d.checkpoint(pid)));
    assert_eq!(d.agent.state_of(pid), Checkpointed);
    assert!(seen(&[&format!(
        "pid {pid}: the checkpoint to the driver's custom storage failed before the driver took"
    )]));
    assert!(d.agent.script().calls.contains(&format!("checkpoint {pid}")));
    assert!(d.image(pid).unwrap().driver_storage.is_none());
    assert!(!d.criu.path().join(ccm_identity::staging::page_file_name(pid)).exists());
    d.finish(0);
}

#[test]
fn a_checkpoint_failing_mid_batch_fails_that_process_and_the_rollback_puts_all_back() {
    let pids = [2401, 2402, 2403];
    let mut d = dump("midbatch", &pids);
    d.agent.fail("checkpoint", 2402, cuda_error("cuCheckpointProcessCheckpoint", CudaCode::Unknown));
    for p in pids {
        assert!(done(&d.pause(p)));
    }
    assert!(done(&d.checkpoint(2401)));
    assert!(matches!(process_failure(d.checkpoint(2402)), ProcessFailure::Driver(_)));
    assert!(done(&d.checkpoint(2403)));
    assert_eq!(d.states(&pids), vec![Checkpointed, Locked, Checkpointed]);
    assert!(d.image(2401).is_some() && d.image(2402).is_none() && d.image(2403).is_some());
    d.finish(1);
    assert_eq!(d.states(&pids), vec![Running; 3]);
    assert_eq!(logged(&["rolling back 3 CUDA process(es): the dump failed"]).len(), 1);
    // The resource manager cleared the tree: no warning about sharing, one line that says so.
    assert!(logged(&["this dump holds 3 CUDA processes"]).is_empty());
    assert_eq!(logged(&["reports no device memory imported", "pids 2401, 2402, 2403"]).len(), 1);
}

/// The measured shape of a process with 64 MiB of managed memory: the driver's own 2 MiB region low down, and the
/// allocation's mapping up where mmaps go.
fn managed_holdings() -> ccm_process::claims::Holdings {
    let uvm = |start: u64, len: u64| ccm_identity::claims::ClaimedMapping {
        start,
        end: start + len,
        perms: "rw-s".into(),
        offset: start,
        node: ccm_identity::claims::NvidiaNode::Uvm,
    };
    ccm_process::claims::Holdings {
        mappings: vec![uvm(0x2_04a0_0000, 2 << 20), uvm(0x7f33_8800_0000, 64 << 20)],
        ..Default::default()
    }
}

#[test]
fn managed_memory_is_refused_before_the_lock() {
    let mut d = dump("managed", &[2551]);
    d.targets.script().holdings.insert(2551, managed_holdings());
    let e = failure(d.pause(2551));
    assert!(matches!(e, EngineError::ManagedMemoryRefused { .. }), "{e}");
    let text = e.to_string();
    for part in [
        "refused before any lock",
        "pid 2551 (proc2551) maps 64 MiB of CUDA managed memory",
        "1 /dev/nvidia-uvm mapping(s)",
        "at 0x7f3388000000",
        "CRIU_CUDA_MIGRATE_MANAGED=try",
    ] {
        assert!(text.contains(part), "{part}: {text}");
    }
    assert!(!d.agent.called("lock 2551"));
    assert_eq!(d.agent.state_of(2551), Running);
    d.finish(1);
}

#[test]
fn managed_memory_try_and_the_driver_region_alone_lock() {
    // Only the driver's own region: no managed memory.
    let mut d = dump("managed-none", &[2552]);
    let mut own = managed_holdings();
    own.mappings.truncate(1);
    d.targets.script().holdings.insert(2552, own);
    assert!(done(&d.pause(2552)));
    assert!(d.agent.called("lock 2552"));
    // `try`: locked; the driver decides.
    let mut d = dump_with("managed-try", config(&[("CRIU_CUDA_MIGRATE_MANAGED", "try")]), &[2553], 1);
    d.targets.script().holdings.insert(2553, managed_holdings());
    assert!(done(&d.pause(2553)));
    assert!(d.agent.called("lock 2553"));
    // Mappings that cannot be read: left to the driver.
    let mut d = dump("managed-unread", &[2554]);
    d.targets.script().holdings_fail.insert(2554);
    assert!(done(&d.pause(2554)));
}

#[test]
fn not_supported_at_checkpoint_names_managed_memory_mps_and_mig() {
    let mut d = dump("unsupported", &[2501]);
    d.agent.fail("checkpoint", 2501, cuda_error("cuCheckpointProcessCheckpoint", CudaCode::NotSupported));
    assert!(done(&d.pause(2501)));
    let f = process_failure(d.checkpoint(2501));
    assert!(matches!(f, ProcessFailure::Unsupported(_)));
    assert!(f.to_string().contains("managed (UVM) memory"), "{f}");
    d.finish(1);
    assert_eq!(d.agent.state_of(2501), Running);
}

#[test]
fn an_agent_lost_at_the_checkpoint_is_put_back_by_a_fresh_agent() {
    for stalled in [false, true] {
        let pid = if stalled { 2602 } else { 2601 };
        let mut d = dump("cplost", &[pid]);
        d.agent.fail("checkpoint", pid, lost(stalled));
        // The driver finishes the checkpoint by itself.
        d.agent.script().takes_effect.insert(("checkpoint", pid));
        assert!(done(&d.pause(pid)));
        assert!(matches!(process_failure(d.checkpoint(pid)), ProcessFailure::Driver(e) if e.is_lost()));
        d.finish(1);
        assert_eq!(d.agent.state_of(pid), Running);
        assert!(d.agent.called("cuinit"), "the fresh agent's cuInit before a put-back of a settling process");
        assert_eq!(logged(&[&format!("pid {pid}: rolling back from CUDA state CHECKPOINTED")]).len(), 1);
    }
}

#[test]
fn a_fresh_agent_that_cannot_start_leaves_each_process_named_for_recover() {
    let mut d = dump_with("nofresh", config(&[]), &[2701], 0);
    d.agent.fail("checkpoint", 2701, lost(false));
    assert!(done(&d.pause(2701)));
    assert!(failure(d.checkpoint(2701)).to_string().contains("pid 2701"));
    d.finish(1);
    assert_eq!(d.agent.state_of(2701), Locked);
    assert_eq!(logged(&["pid 2701 may be left LOCKED or CHECKPOINTED", "recover --pid 2701"]).len(), 1);
}

#[test]
fn the_agent_lost_at_the_put_back_leaves_the_process_named() {
    let mut d = dump_with("pblost", config(&[]), &[2711], 0);
    d.agent.fail("checkpoint", 2711, cuda_error("cuCheckpointProcessCheckpoint", CudaCode::Unknown));
    d.agent.fail("unlock", 2711, lost(true));
    assert!(done(&d.pause(2711)));
    assert!(matches!(d.checkpoint(2711), HookOutcome::Failed(_)));
    d.finish(1);
    assert_eq!(d.agent.state_of(2711), Locked);
    assert_eq!(logged(&["pid 2711 is left LOCKED: unlock failed", "recover --pid 2711"]).len(), 1);
}

#[test]
fn a_put_back_whose_restore_fails_like_an_ipc_importer_says_recover_cannot_help() {
    let mut d = dump("ipc", &[2801, 2802]);
    d.agent.fail("restore", 2801, cuda_error("cuCheckpointProcessRestore", CudaCode::InvalidValue));
    d.agent.fail("restore", 2802, cuda_error("cuCheckpointProcessRestore", CudaCode::OutOfMemory));
    assert!(done(&d.pause(2801)));
    assert!(done(&d.pause(2802)));
    assert!(done(&d.checkpoint(2801)));
    d.finish(1);
    assert_eq!(d.states(&[2801, 2802]), vec![Checkpointed, Checkpointed]);
    assert_eq!(logged(&["pid 2801 is left CHECKPOINTED", "cannot bring it back either"]).len(), 1);
    assert_eq!(logged(&["pid 2802 is left CHECKPOINTED", "recover --pid 2802"]).len(), 1);
}

#[test]
fn an_unreadable_state_at_rollback_is_assumed_as_this_dump_made_it() {
    let mut d = dump("assumed", &[2901]);
    assert!(done(&d.pause(2901)));
    assert!(done(&d.checkpoint(2901)));
    d.agent.script().state_fails.insert(2901);
    d.finish(1);
    assert_eq!(d.agent.state_of(2901), Running);
    assert_eq!(logged(&["pid 2901: its CUDA state cannot be read", "putting it back as CHECKPOINTED"]).len(), 1);
}

#[test]
fn a_process_found_locked_and_checkpointed_by_us_gets_its_memory_back_and_keeps_the_lock() {
    let mut d = dump("foundlocked", &[3001]);
    d.agent.cuda(3001, Locked);
    assert!(done(&d.pause(3001)));
    assert!(done(&d.checkpoint(3001)));
    assert_eq!(d.agent.state_of(3001), Checkpointed);
    d.finish(1);
    assert_eq!(d.agent.state_of(3001), Locked);
    assert_eq!(logged(&["pid 3001: rolled back: restored, LOCKED as the dump found it"]).len(), 1);

    let mut d = dump("foundlocked2", &[3002]);
    d.agent.cuda(3002, Locked);
    d.agent.fail("restore", 3002, cuda_error("cuCheckpointProcessRestore", CudaCode::Unknown));
    assert!(done(&d.pause(3002)));
    assert!(done(&d.checkpoint(3002)));
    d.finish(1);
    assert_eq!(logged(&["pid 3002 is left CHECKPOINTED: restore failed"]).len(), 1);
}

#[test]
fn a_process_found_checkpointed_is_not_checkpointed_again() {
    let mut d = dump("foundcp", &[3101]);
    d.agent.cuda(3101, Checkpointed);
    assert!(done(&d.pause(3101)));
    assert!(done(&d.checkpoint(3101)));
    assert!(!d.agent.called("checkpoint 3101"));
    d.finish(1);
    assert_eq!(d.agent.state_of(3101), Checkpointed);
}

#[test]
fn several_processes_are_refused_before_any_checkpoint_when_told() {
    let mut d = dump_with("refuse", config(&[("CRIU_CUDA_MIGRATE_MULTI_PROCESS", "refuse")]), &[3201, 3202], 1);
    assert!(done(&d.pause(3201)));
    assert!(done(&d.pause(3202)));
    let f = process_failure(d.checkpoint(3201));
    assert!(matches!(f, ProcessFailure::SeveralProcessesRefused(_)));
    assert!(f.to_string().contains("pids 3201, 3202"), "{f}");
    assert!(matches!(process_failure(d.checkpoint(3202)), ProcessFailure::SeveralProcessesRefused(_)));
    assert!(!d.agent.called("checkpoint 3201") && !d.agent.called("checkpoint 3202"));
    d.finish(1);
    assert_eq!(d.states(&[3201, 3202]), vec![Running, Running]);
}

#[test]
fn an_identity_that_cannot_be_read_fails_the_process() {
    let mut d = dump("identity", &[3301, 3302]);
    d.targets.script().read_maps_fails.insert(3301);
    d.targets.script().sites.insert(3302, None);
    assert!(done(&d.pause(3301)));
    assert!(done(&d.pause(3302)));
    for p in [3301, 3302] {
        let f = process_failure(d.checkpoint(p));
        assert!(matches!(f, ProcessFailure::Identity(_)), "{f}");
        assert!(f.to_string().starts_with("cannot record its GPU identity"), "{f}");
    }
    // Checkpointed all the same: the rollback restores them.
    d.finish(1);
    assert_eq!(d.states(&[3301, 3302]), vec![Running, Running]);
}

#[test]
fn without_an_image_directory_the_process_fails() {
    capture_log();
    let agent = FakeAgent::new(vec![gpu(0)]);
    agent.cuda(3401, Running);
    let targets = FakeTargets::default();
    targets.cuda(3401);
    let (seams, _) = seams(&targets, vec![Ok(agent.clone())]);
    let criu = FakeCriu::without_dir();
    let mut s = DumpSession::init_with(config(&[]), &criu, seams).unwrap();
    assert!(done(&s.pause_devices(3401, &criu)));
    assert!(matches!(process_failure(s.checkpoint_devices(3401, &criu)), ProcessFailure::NoImageDir));
}

#[test]
fn a_restore_thread_that_cannot_be_resumed_fails_its_process_only() {
    let mut d = dump("resume", &[3501, 3502]);
    d.targets.script().resume_fails.insert(13501);
    d.targets.script().stop_fails.insert(13502);
    assert!(done(&d.pause(3501)));
    assert!(done(&d.pause(3502)));
    assert!(matches!(
        process_failure(d.checkpoint(3501)),
        ProcessFailure::Batch(crate::batch::BatchError::Resume { .. })
    ));
    assert!(done(&d.checkpoint(3502)));
    assert_eq!(d.states(&[3501, 3502]), vec![Locked, Checkpointed]);
    assert_eq!(logged(&["cannot stop restore thread 13502 again"]).len(), 1);
    // The rollback works on a thread it cannot resume anyway (CRIU may have let it go).
    d.finish(1);
    assert_eq!(d.states(&[3501, 3502]), vec![Running, Running]);
}

#[test]
fn the_identity_records_the_cuda_view_the_full_scan_and_unknown_memory() {
    let mut d = dump("view", &[3601, 3602]);
    {
        let mut t = d.targets.script();
        t.minors.insert(3601, [0, 1].into());
        t.env.insert(
            3601,
            ccm_identity::image::ProcessEnv { cuda_visible_devices: Some("1,0".into()), ..Default::default() },
        );
        // Found only by the full scan.
        t.sites.insert(3601, Some(vec![site(0, 0x2000), site(1, 0x3000)]));
        t.env_unreadable.insert(3602);
    }
    d.agent.script().device_memory_error = Some(ccm_agent::AgentError::Nvml("scripted 3601".into()));
    assert!(done(&d.pause(3601)));
    assert!(done(&d.pause(3602)));
    assert!(done(&d.checkpoint(3601)));
    let img = d.image(3601).unwrap();
    assert_eq!(img.used, vec![gpu(1).uuid, gpu(0).uuid], "CUDA_VISIBLE_DEVICES order");
    assert_eq!(img.sites.len(), 2);
    assert_eq!(img.device_memory, None);
    assert_eq!(d.targets.script().scans.iter().filter(|(p, _)| *p == 3601).count(), 2, "narrow, then full");
    // Nothing found anywhere: every GPU assumed enumerated.
    let img = d.image(3602).unwrap();
    assert_eq!(img.enumerated, vec![gpu(0).uuid, gpu(1).uuid]);
    assert_eq!(logged(&["pid 3602: cannot read its environment"]).len(), 1);
    assert_eq!(logged(&["pid 3602: found no PCI identity words of any GPU"]).len(), 1);
    assert_eq!(logged(&["cannot read the device memory of the CUDA processes", "scripted 3601"]).len(), 1);
}

#[test]
fn without_nvml_the_image_records_no_gpu_identity() {
    let mut d = dump("nonvml", &[3701]);
    d.agent.script().node_error = Some(ccm_agent::AgentError::Nvml("scripted 3701".into()));
    assert!(done(&d.pause(3701)));
    assert!(done(&d.checkpoint(3701)));
    assert!(d.image(3701).unwrap().node_gpus.is_empty());
    assert_eq!(logged(&["pid 3701: NVML is unavailable, so its image records no GPU identity"]).len(), 1);
}

// ----- CUDA IPC importers (the kernel driver's resource manager) -------------------------------

/// A tree: root `pids[0]` with the others as its children.
fn tree(d: &Dump, pids: &[u32]) {
    d.targets.script().children.insert(pids[0], pids[1..].to_vec());
}

#[test]
fn a_tree_holding_an_importer_is_refused_before_the_first_lock_and_every_process_runs_on() {
    let pids = [3601, 3602, 3603];
    let mut d = dump("ipc-refuse", &pids);
    tree(&d, &pids);
    d.targets.script().kernel_gpus = Some(vec![gpu(0), gpu(1)]);
    d.agent.script().imported.insert(3603, 64 << 20);
    let e = failure(d.pause(3601));
    assert!(matches!(e, EngineError::IpcImporters(_)), "{e}");
    let text = e.to_string();
    for needle in [
        "refused before any checkpoint",
        "pid 3603 has 64 MiB",
        "GPU 0000:00:00.0",
        "GPU-00000000-",
        "CRIU_CUDA_MIGRATE_IPC=allow",
    ] {
        assert!(text.contains(needle), "{needle}: {text}");
    }
    // The whole tree was asked about, before anything was locked.
    assert_eq!(d.agent.script().rm_queries, vec![vec![3601, 3602, 3603]]);
    assert!(!d.agent.calls().iter().any(|c| c.starts_with("lock") || c.starts_with("checkpoint")));
    d.finish(1);
    assert_eq!(d.states(&pids), vec![Running; 3]);
    assert!(d.image(3601).is_none());
}

/// The resource manager keeps a dead process's memory under its pid number while a descriptor another process
/// inherited keeps its client alive: a number reused by another process (another start time), or a process that
/// holds no GPU node, is not refused as an importer; the warning says why (issue 41 part 4).
#[test]
fn importers_are_live_processes_holding_a_gpu_node_not_pid_numbers() {
    let pids = [3661, 3662, 3663];
    let mut d = dump("ipc-stale", &pids);
    tree(&d, &pids);
    // 3662: reported as an importer, but its number was taken by another process during the question.
    d.agent.script().imported.insert(3662, 64 << 20);
    d.targets.script().start_times.insert(3662, [100, 200].into());
    // 3663: reported as an importer, but holds no GPU node (a non-CUDA process, or a dead one's number).
    d.agent.script().imported.insert(3663, 4 << 20);
    d.targets.script().minors.insert(3663, Default::default());
    for p in pids {
        assert!(done(&d.pause(p)), "pid {p}");
    }
    assert_eq!(logged(&["not counted as importers", "pid 3662 has 64 MiB", "pid 3663 has 4 MiB", "reused"]).len(), 1);
    d.finish(1);
}

/// P1b (review of issue 46): a dead importer's pid number, now a victim's DataLoader worker that holds a GPU node
/// (its parent's descriptors, no context of its own), is not counted as an importer: the victim's tree dumps.
#[test]
fn a_forked_worker_under_a_dead_importers_number_is_not_an_importer() {
    let pids = [3671, 3672];
    let mut d = dump("ipc-forked-number", &pids);
    tree(&d, &pids);
    d.agent.script().imported.insert(3672, 64 << 20);
    d.targets.script().forked.insert(3672);
    for p in pids {
        assert!(done(&d.pause(p)), "pid {p}");
    }
    assert_eq!(logged(&["not counted as importers", "pid 3672 has 64 MiB"]).len(), 1);
    d.finish(1);
}

/// Issue 46: a tree holding an io_uring (torchrun's elastic agent) is refused at the first CUDA process's
/// PAUSE_DEVICES, naming the process and the way out, before any lock (CRIU would fail it after the checkpoint).
#[test]
fn a_tree_holding_an_io_uring_is_refused_before_any_lock_naming_the_way_out() {
    let pids = [3681, 3682];
    let mut d = dump("io-uring", &pids);
    tree(&d, &pids);
    d.targets.script().undumpable.insert(
        3681,
        vec![ccm_identity::criu_support::undumpable_mapping(0x7f00_0000_0000, "anon_inode:[io_uring]").unwrap()],
    );
    let e = failure(d.pause(3681));
    let text = e.to_string();
    assert!(matches!(e, EngineError::CriuCannotDump(_)), "{text}");
    for needle in ["pid 3681", "anon_inode:[io_uring]", "Refused before any lock", "torchrun"] {
        assert!(text.contains(needle), "{needle}: {text}");
    }
    assert!(!d.agent.calls().iter().any(|c| c.starts_with("lock") || c.starts_with("checkpoint")));
    d.finish(1);
    assert_eq!(d.states(&pids), vec![Running; 2]);
}

#[test]
fn a_single_process_importing_from_outside_the_tree_is_refused_too() {
    let mut d = dump("ipc-alone", &[3611]);
    d.agent.script().imported.insert(3611, 4 << 20);
    assert!(matches!(failure(d.pause(3611)), EngineError::IpcImporters(_)));
    d.finish(1);
    assert_eq!(d.states(&[3611]), vec![Running]);
}

#[test]
fn a_tree_the_resource_manager_clears_dumps_without_a_warning() {
    let pids = [3621, 3622];
    let mut d = dump("ipc-clear", &pids);
    tree(&d, &pids);
    for p in pids {
        assert!(done(&d.pause(p)));
    }
    let calls = d.agent.calls();
    let first_rm = calls.iter().position(|c| c == "video_memory").unwrap();
    let first_lock = calls.iter().position(|c| c.starts_with("lock")).unwrap();
    assert!(first_rm < first_lock, "{calls:?}");
    for p in pids {
        assert!(done(&d.checkpoint(p)));
    }
    // Asked once for the tree before the first lock, once more for the locked processes before the checkpoint.
    assert_eq!(d.agent.script().rm_queries, vec![vec![3621, 3622], vec![3621, 3622]]);
    assert_eq!(d.states(&pids), vec![Checkpointed; 2]);
    assert!(logged(&["this dump holds 2 CUDA processes (pids 3621, 3622)"]).is_empty());
    assert_eq!(logged(&["reports no device memory imported", "pids 3621, 3622"]).len(), 1);
    assert_eq!(
        logged(&[
            "importer check before the first lock",
            "2 process(es) of the tree of pid 3621",
            "no imported device memory"
        ])
        .len(),
        1
    );
}

#[test]
fn an_import_between_the_tree_check_and_the_checkpoint_is_caught_while_all_are_only_locked() {
    let pids = [3631, 3632];
    let mut d = dump("ipc-late", &pids);
    tree(&d, &pids);
    assert!(done(&d.pause(3631)));
    // 3632 imports before CRIU reaches it (it was not locked yet when the tree was asked about).
    d.agent.script().imported.insert(3632, 256 << 20);
    assert!(done(&d.pause(3632)));
    for p in pids {
        let f = process_failure(d.checkpoint(p));
        assert!(matches!(f, ProcessFailure::IpcImportersRefused(_)), "{f}");
        assert!(f.to_string().contains("pid 3632 has 256 MiB"), "{f}");
    }
    assert!(!d.agent.calls().iter().any(|c| c.starts_with("checkpoint")));
    // The same for a leave-running dump and a failed one: only locks to undo.
    d.finish(1);
    assert_eq!(d.states(&pids), vec![Running; 2]);
}

/// A tree of `pids` whose resource manager cannot be asked, every process paused (locked).
fn paused_without_rm(d: Dump, pids: &[u32]) -> Dump {
    tree(&d, pids);
    d.agent.script().rm_error =
        Some(ccm_agent::AgentError::Rm("/dev/nvidiactl cannot be opened (No such file or directory)".into()));
    let mut d = d;
    for &p in pids {
        assert!(done(&d.pause(p)));
    }
    d
}

#[test]
fn when_the_resource_manager_cannot_be_asked_several_processes_are_refused_by_default_and_all_run_on() {
    let pids = [3651, 3652];
    let mut d = paused_without_rm(dump("ipc-unavailable-check", &pids), &pids);
    for p in pids {
        let f = process_failure(d.checkpoint(p));
        assert!(matches!(f, ProcessFailure::UncheckedRefused(..)), "{f}");
        assert!(f.to_string().contains("/dev/nvidiactl cannot be opened") && f.to_string().contains("=warn"), "{f}");
    }
    assert!(!d.agent.calls().iter().any(|c| c.starts_with("checkpoint")));
    d.finish(1);
    assert_eq!(d.states(&pids), vec![Running; 2]);
}

#[test]
fn when_the_resource_manager_cannot_be_asked_the_dump_goes_on_with_the_warning_and_why() {
    let pids = [3641, 3642];
    let warn = config(&[("CRIU_CUDA_MIGRATE_MULTI_PROCESS", "warn")]);
    let mut d = paused_without_rm(dump_with("ipc-unavailable", warn, &pids, 1), &pids);
    for p in pids {
        assert!(done(&d.checkpoint(p)));
    }
    assert_eq!(d.states(&pids), vec![Checkpointed; 2]);
    // Not asked again after it failed once.
    assert_eq!(d.agent.script().rm_queries.len(), 1);
    let w = logged(&[
        "this dump holds 2 CUDA processes (pids 3641, 3642)",
        "the importer check could not run (the resource manager: /dev/nvidiactl cannot be opened",
    ]);
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(w[0].contains("cudaIpcOpenMemHandle") && w[0].contains("unchecked"), "{}", w[0]);
}

#[test]
fn ipc_allow_dumps_an_importer_with_a_warning_that_its_restore_will_fail() {
    let pids = [3651, 3652];
    let mut d = dump_with("ipc-allow", config(&[("CRIU_CUDA_MIGRATE_IPC", "allow")]), &pids, 1);
    tree(&d, &pids);
    d.agent.script().imported.insert(3652, 64 << 20);
    for p in pids {
        assert!(done(&d.pause(p)));
    }
    for p in pids {
        assert!(done(&d.checkpoint(p)));
    }
    assert_eq!(d.states(&pids), vec![Checkpointed; 2]);
    // Warned once, although both checks saw it.
    assert_eq!(logged(&["CRIU_CUDA_MIGRATE_IPC=allow: dumping although pid 3652 has 64 MiB"]).len(), 1);
}

#[test]
fn multi_process_refuse_still_refuses_a_tree_the_resource_manager_clears() {
    let pids = [3661, 3662];
    let mut d = dump_with("ipc-multi", config(&[("CRIU_CUDA_MIGRATE_MULTI_PROCESS", "refuse")]), &pids, 1);
    tree(&d, &pids);
    for p in pids {
        assert!(done(&d.pause(p)));
    }
    assert!(matches!(process_failure(d.checkpoint(3661)), ProcessFailure::SeveralProcessesRefused(_)));
    d.finish(1);
    assert_eq!(d.states(&pids), vec![Running; 2]);
}
