//! The restore session's rules, every branch, through the scripted seams (`crate::fake`): no
//! root, GPU or CRIU. Each test uses pids of its own, by which it finds its log lines.

use ccm_driver::abi::CudaCode;
use ccm_driver::checkpoint::ProcessState::{Checkpointed, Locked, Running};
use ccm_identity::image::{IdentityImage, ProcessEnv};
use ccm_identity::memory::DeviceMemoryUse;
use ccm_identity::GpuIdentity;
use ccm_process::container::{ForeignDev, RuntimeSpec};

use crate::fake::*;
use crate::reconcile::ReconcileFailure;
use crate::restore::RestoreSession;
use crate::{Config, EngineError, HookOutcome, ProcessFailure};

/// The image of namespace pid `ns`, dumped on GPUs 0 and 1 using GPU 0.
fn image(ns: u32, device_bytes: u64) -> IdentityImage {
    IdentityImage {
        staging: None,
        driver_storage: None,
        pid: ns,
        host_pid: ns,
        dumped_at_unix: 0,
        hostname: "node-a".into(),
        driver_version: "580.159.04".into(),
        cuda_driver_version: 13000,
        node_gpus: vec![gpu(0), gpu(1)],
        enumerated: vec![gpu(0).uuid, gpu(1).uuid],
        used: vec![gpu(0).uuid],
        env: ProcessEnv::default(),
        sites: Vec::new(),
        prop_sites: Vec::new(),
        device_memory: Some(vec![DeviceMemoryUse { gpu: gpu(0).uuid, bytes: device_bytes }]),
    }
}

/// A restore of the host pids `pids` (namespace pid = host pid - 1000) from their images, on a
/// node of `node_gpus`.
struct Restore {
    session: RestoreSession,
    agent: FakeAgent,
    targets: FakeTargets,
    criu: FakeCriu,
}

struct Setup {
    name: &'static str,
    config: Config,
    node_gpus: Vec<GpuIdentity>,
    pids: Vec<u32>,
    device_bytes: u64,
}

impl Setup {
    fn new(name: &'static str, pids: &[u32]) -> Setup {
        Setup { name, config: config(&[]), node_gpus: vec![gpu(0), gpu(1)], pids: pids.to_vec(), device_bytes: 1 << 30 }
    }
    fn moved(mut self) -> Setup {
        self.node_gpus = vec![gpu(2), gpu(3)];
        self
    }
    fn config(mut self, env: &[(&str, &str)]) -> Setup {
        self.config = config(env);
        self
    }
    /// The agent, targets and CRIU of this setup, the images written.
    fn parts(&self) -> (FakeAgent, FakeTargets, FakeCriu) {
        capture_log();
        let agent = FakeAgent::new(self.node_gpus.clone());
        let targets = FakeTargets::default();
        let criu = FakeCriu::new(self.name);
        for &p in &self.pids {
            agent.cuda(p, Checkpointed);
            targets.cuda(p);
            targets.script().ns_pids.insert(p, p - 1000);
            let bytes = image(p - 1000, self.device_bytes).try_encode().unwrap();
            std::fs::write(criu.path().join(IdentityImage::file_name(p - 1000)), bytes).unwrap();
        }
        (agent, targets, criu)
    }
    fn init(self) -> Result<Restore, EngineError> {
        let (agent, targets, criu) = self.parts();
        self.init_with(agent, targets, criu)
    }
    fn init_with(self, agent: FakeAgent, targets: FakeTargets, criu: FakeCriu) -> Result<Restore, EngineError> {
        let (seams, _) = seams(&targets, vec![Ok(agent.clone())]);
        let session = RestoreSession::init_with(self.config, &criu, seams)?;
        Ok(Restore { session, agent, targets, criu })
    }
    fn ready(self) -> Restore {
        self.init().unwrap_or_else(|e| panic!("refused: {e}"))
    }
}

impl Restore {
    fn resume(&mut self, pid: u32) -> (HookOutcome, bool) {
        self.session.resume_devices_late(i32::try_from(pid).unwrap())
    }
    fn report(&self, ns: u32) -> Option<String> {
        std::fs::read_to_string(self.criu.path().join(ccm_identity::image::report_file_name(ns))).ok()
    }
    fn killed(&self) -> Vec<u32> {
        self.targets.script().killed.clone()
    }
}

fn refused(r: Result<Restore, EngineError>) -> EngineError {
    match r {
        Ok(_) => panic!("the restore was not refused"),
        Err(e) => e,
    }
}

fn failed(o: HookOutcome) -> ProcessFailure {
    match o {
        HookOutcome::Failed(EngineError::Process { source, .. }) => source,
        other => panic!("expected a process failure, got {other:?}"),
    }
}

// ----- init(RESTORE): what is refused before CRIU restores anything ------------------------------

#[test]
fn without_images_there_is_nothing_to_restore() {
    capture_log();
    let (seams, starter) = seams(&FakeTargets::default(), vec![]);
    let criu = FakeCriu::new("noimages");
    let mut s = RestoreSession::init_with(config(&[]), &criu, seams.clone()).unwrap();
    assert!(matches!(s.resume_devices_late(5001), (HookOutcome::NotMine, false)));
    s.finish(0);
    let mut s = RestoreSession::init_with(config(&[]), &FakeCriu::without_dir(), seams).unwrap();
    assert!(matches!(s.resume_devices_late(0), (HookOutcome::NotMine, false)));
    assert!(starter.started.lock().unwrap().is_empty(), "no agent without images");
}

#[test]
fn images_missing_though_the_inventory_names_the_plugin_are_refused() {
    capture_log();
    let (seams, _) = seams(&FakeTargets::default(), vec![]);
    let mut criu = FakeCriu::new("missing");
    criu.in_inventory = Some(true);
    let e = RestoreSession::init_with(config(&[]), &criu, seams).err().unwrap();
    assert!(matches!(e, EngineError::ImagesMissing { .. }), "{e}");
}

#[test]
fn criu_s_own_cuda_plugin_is_refused() {
    let s = Setup::new("rconflict", &[5101]);
    let (agent, targets, criu) = s.parts();
    targets.script().criu_cuda_plugin = true;
    assert!(matches!(refused(s.init_with(agent, targets, criu)), EngineError::ConflictingPlugin));
}

#[test]
fn no_agent_or_no_driver_cannot_restore() {
    let s = Setup::new("ragent", &[5201]);
    let (_, targets, criu) = s.parts();
    let (seams, _) = seams(&targets, vec![Err("fork 5201".into())]);
    let e = RestoreSession::init_with(s.config.clone(), &criu, seams).err().unwrap();
    assert!(matches!(e, EngineError::CannotRestore { processes: 1, .. }), "{e}");

    let s = Setup::new("rdriver", &[5202]);
    let (agent, targets, criu) = s.parts();
    agent.script().driver_error = Some(ccm_agent::AgentError::NoDriver("no libcuda".into()));
    let e = refused(s.init_with(agent, targets, criu));
    assert!(e.to_string().contains("cannot restore them: no usable NVIDIA driver"), "{e}");
}

#[test]
fn a_node_without_gpus_is_refused() {
    let mut s = Setup::new("rnogpu", &[5301]);
    s.node_gpus = Vec::new();
    let e = refused(s.init());
    assert!(matches!(e, EngineError::Preflight(_)), "{e}");
}

#[test]
fn a_device_map_naming_a_gpu_of_neither_node_is_refused() {
    let map = format!("{}={}", gpu(0).uuid, gpu(9).uuid);
    let e = refused(Setup::new("rmap", &[5401]).config(&[("CRIU_CUDA_MIGRATE_DEVICE_MAP", &map)]).init());
    assert!(matches!(e, EngineError::Preflight(_)), "{e}");
}

#[test]
fn too_little_free_memory_is_refused_unless_the_check_is_off() {
    let mut s = Setup::new("rmem", &[5501]);
    s.device_bytes = 200 << 30;
    let e = refused(s.init());
    assert!(matches!(e, EngineError::Preflight(crate::preflight::PreflightError::Memory(_))), "{e}");

    let mut s = Setup::new("rmemoff", &[5502]).config(&[("CRIU_CUDA_MIGRATE_MEMORY_CHECK", "off")]);
    s.device_bytes = 200 << 30;
    let _ = s.ready();
    assert!(seen(&["preflight: the free-memory check is off"]));
}

#[test]
fn unreadable_free_memory_lets_the_restore_go_on() {
    let s = Setup::new("rmemerr", &[5511]);
    let (agent, targets, criu) = s.parts();
    agent.script().device_memory_error = Some(ccm_agent::AgentError::Nvml("scripted 5511".into()));
    let _ = s.init_with(agent, targets, criu).unwrap();
    assert!(seen(&["cannot read the GPUs' free memory", "scripted 5511", "without the memory check"]));
}

fn spec(text: &str) -> RuntimeSpec {
    RuntimeSpec { path: "/run/bundle-x/config.json".into(), runtime: "runc".into(), text: text.into() }
}

#[test]
fn the_restoring_runtime_s_spec_decides_the_usable_gpus() {
    // Unreadable: refused.
    let s = Setup::new("rspecfile", &[5601]);
    let (agent, targets, criu) = s.parts();
    targets.script().spec = Some(Err("scripted".into()));
    assert!(matches!(refused(s.init_with(agent, targets, criu)), EngineError::SpecFile(_)));
    // Malformed: refused.
    let s = Setup::new("rspecbad", &[5602]);
    let (agent, targets, criu) = s.parts();
    targets.script().spec = Some(Ok(spec("{not json")));
    assert!(matches!(refused(s.init_with(agent, targets, criu)), EngineError::Spec { .. }));
    // Giving GPU 1 only: the process moves there.
    let s = Setup::new("rspecgpu", &[5603]);
    let (agent, targets, criu) = s.parts();
    targets.script().spec = Some(Ok(spec(
        r#"{"ociVersion":"1.0.2","linux":{"devices":[{"path":"/dev/nvidia1","type":"c","major":195,"minor":1}]}}"#,
    )));
    let mut r = s.init_with(agent, targets, criu).unwrap();
    assert!(matches!(r.resume(5603), (HookOutcome::Done, true)));
    assert_eq!(r.agent.script().restore_pairs[&5603][0], (gpu(0).uuid, gpu(1).uuid), "the used GPU onto the given one");
    assert_eq!(r.targets.script().reconciled, vec![5603]);
    assert!(seen(&["usable GPUs: [", "what the restoring runtime's spec /run/bundle-x/config.json gives"]));
}

/// The one rule the plugin and `criu-cuda-migrate preflight --bundle` apply: the first target GPU whose node the spec's
/// devices cgroup denies, named with its number; nothing when every node is allowed or the node's number is unknown.
#[test]
fn the_first_gpu_node_a_spec_denies_is_named_with_its_number() {
    use crate::restore::{node_the_spec_denies, DeniedNode};
    let spec = r#"{"ociVersion":"1.2.0","linux":{"devices":[{"path":"/dev/nvidia0","type":"c","major":195,"minor":0}],
        "resources":{"devices":[{"allow":false,"access":"rwm"},{"allow":true,"type":"c","major":195,"minor":0,"access":"rwm"}]}}}"#;
    let devices = ccm_identity::claims::NvidiaDevices::from_proc_devices("Character devices:\n195 nvidia\n");
    assert_eq!(node_the_spec_denies(spec, &devices, &[(0, "G0".into())]), None);
    assert_eq!(
        node_the_spec_denies(spec, &devices, &[(0, "G0".into()), (1, "G1".into()), (2, "G2".into())]),
        Some(DeniedNode { node: "/dev/nvidia1 (char 195:1)".into(), gpu: "G1".into() })
    );
    let unknown = ccm_identity::claims::NvidiaDevices::default();
    assert_eq!(node_the_spec_denies(spec, &unknown, &[(1, "G1".into())]), None, "no number: nothing to judge");
    assert_eq!(node_the_spec_denies("not json", &devices, &[(1, "G1".into())]), None);
}

/// A usable set naming a GPU whose node the restoring runtime's devices cgroup denies (Podman's `restore --import`
/// keeps the checkpoint's spec): refused before anything is restored, naming the node, the GPU and the way out.
#[test]
fn a_gpu_whose_node_the_runtimes_devices_cgroup_denies_refuses_the_restore() {
    let spec_giving_gpu0 = r#"{"ociVersion":"1.2.0","linux":{"devices":[{"path":"/dev/nvidia0","type":"c","major":195,"minor":0}],
        "resources":{"devices":[{"allow":false,"access":"rwm"},{"allow":true,"type":"c","major":195,"minor":0,"access":"rwm"}]}}}"#;
    let s = Setup::new("rdenied", &[5604]).config(&[("CRIU_CUDA_MIGRATE_USABLE_GPUS", &gpu(1).uuid.to_string())]);
    let (agent, targets, criu) = s.parts();
    targets.script().spec = Some(Ok(spec(spec_giving_gpu0)));
    targets.script().devices =
        ccm_identity::claims::NvidiaDevices::from_proc_devices("Character devices:\n195 nvidia\n");
    let e = refused(s.init_with(agent, targets, criu));
    let text = e.to_string();
    assert!(matches!(e, EngineError::NodeDenied { .. }), "{text}");
    assert!(
        text.contains("does not let the container open /dev/nvidia1 (char 195:1)")
            && text.contains(&gpu(1).uuid.to_string())
            && text.contains("its CUDA processes")
            && text.contains("the images are unchanged"),
        "{text}"
    );
    // A spec whose cgroup allows both GPUs' nodes (the process enumerated both): no refusal.
    let both = spec_giving_gpu0.replace(r#""minor":0,"access""#, r#""minor":-1,"access""#);
    let s = Setup::new("rallowed", &[5605]).config(&[("CRIU_CUDA_MIGRATE_USABLE_GPUS", &gpu(1).uuid.to_string())]);
    let (agent, targets, criu) = s.parts();
    targets.script().spec = Some(Ok(spec(&both)));
    targets.script().devices =
        ccm_identity::claims::NvidiaDevices::from_proc_devices("Character devices:\n195 nvidia\n");
    let mut r = s.init_with(agent, targets, criu).unwrap();
    assert!(matches!(r.resume(5605), (HookOutcome::Done, true)));
}

#[test]
fn the_kernel_driver_s_gpu_list_is_used_with_or_without_nvml_memory() {
    for (pid, check) in [(5701, "on"), (5702, "off")] {
        let s = Setup::new("rkernel", &[pid]).config(&[("CRIU_CUDA_MIGRATE_MEMORY_CHECK", check)]);
        let (agent, targets, criu) = s.parts();
        targets.script().kernel_gpus = Some(vec![gpu(0), gpu(1)]);
        let mut r = s.init_with(agent, targets, criu).unwrap();
        assert!(matches!(r.resume(pid), (HookOutcome::Done, true)));
    }
    assert!(seen(&["GPUs from /proc/driver/nvidia/gpus with NVML's memory"]));
    assert!(seen(&["GPUs from /proc/driver/nvidia/gpus (", "NVML not waited for"]));
}

#[test]
fn the_resource_manager_s_free_memory_spares_the_preflight_nvml_s_start() {
    // It answers for both GPUs: the check uses it, NVML's memory is never asked for at init.
    let mut s = Setup::new("rrmfree", &[5711]);
    s.device_bytes = 8 << 30;
    let (agent, targets, criu) = s.parts();
    targets.script().kernel_gpus = Some(vec![gpu(0), gpu(1)]);
    agent.script().rm_free = Some([(0, 100 << 30), (1, 100 << 30)].into());
    let mut r = s.init_with(agent, targets, criu).unwrap();
    assert!(r.agent.called("framebuffer"));
    assert!(!r.agent.called("device_memory"), "{:?}", r.agent.calls());
    assert!(matches!(r.resume(5711), (HookOutcome::Done, true)));
    assert!(seen(&["GPUs from /proc/driver/nvidia/gpus with the resource manager's memory", "NVML not waited for"]));
    // Too little free by its account: refused as by NVML's.
    let mut s = Setup::new("rrmfull", &[5712]);
    s.device_bytes = 8 << 30;
    let (agent, targets, criu) = s.parts();
    targets.script().kernel_gpus = Some(vec![gpu(0), gpu(1)]);
    agent.script().rm_free = Some([(0, 4 << 30), (1, 4 << 30)].into());
    let e = refused(s.init_with(agent, targets, criu));
    assert!(matches!(e, EngineError::Preflight(crate::preflight::PreflightError::Memory(_))), "{e}");
    assert!(e.to_string().contains("has 4.0 GiB"), "{e}");
    // It leaves a GPU out: NVML's memory, as before.
    let s = Setup::new("rrmpart", &[5713]);
    let (agent, targets, criu) = s.parts();
    targets.script().kernel_gpus = Some(vec![gpu(0), gpu(1)]);
    agent.script().rm_free = Some([(0, 100 << 30)].into());
    let r = s.init_with(agent, targets, criu).unwrap();
    assert!(r.agent.called("framebuffer") && r.agent.called("device_memory"), "{:?}", r.agent.calls());
}

// ----- RESUME_DEVICES_LATE ---------------------------------------------------------------------

#[test]
fn a_restore_onto_the_same_gpus_unlocks_and_writes_its_report() {
    let mut r = Setup::new("rsame", &[5801]).ready();
    assert!(matches!(r.resume(5801), (HookOutcome::Done, true)));
    assert!(matches!(r.resume(5801), (HookOutcome::Done, false)), "the stored result");
    assert_eq!(r.agent.state_of(5801), Running);
    assert!(r.agent.script().restore_pairs[&5801].is_empty(), "no pairs for an identity map");
    assert!(r.targets.script().reconciled.is_empty());
    let report = r.report(4801).unwrap();
    assert!(report.starts_with("restored pid 4801 (host pid 5801)") && report.contains("result: ok"), "{report}");
    assert!(r.killed().is_empty());
    r.session.finish(0);
    assert_eq!(r.targets.script().ptrace, vec!["resume 15801", "stop 15801"]);
}

#[test]
fn a_moved_restore_gives_the_driver_its_pairs_and_reconciles() {
    let mut r = Setup::new("rmoved", &[5901]).moved().ready();
    assert!(matches!(r.resume(5901), (HookOutcome::Done, true)));
    assert_eq!(r.agent.script().restore_pairs[&5901].len(), 2, "every enumerated GPU paired");
    assert_eq!(r.targets.script().reconciled, vec![5901]);
    assert!(r.report(4901).unwrap().contains("reconciliation: 1 site(s) rewritten"));
    assert_eq!(r.agent.state_of(5901), Running);
}

#[test]
fn reconcile_off_restores_without_rewriting() {
    let mut r = Setup::new("rrecoff", &[5911]).moved().config(&[("CRIU_CUDA_MIGRATE_RECONCILE", "off")]).ready();
    assert!(matches!(r.resume(5911), (HookOutcome::Done, true)));
    assert!(r.targets.script().reconciled.is_empty());
    assert!(seen(&["pid 5911: reconciliation is off"]));
}

fn inconsistent() -> Vec<ReconcileFailure> {
    vec![ReconcileFailure::Mismatch { old: gpu(0).uuid, new: gpu(2).uuid, why: "scripted".into() }]
}

#[test]
fn an_identity_failure_kills_the_tree_in_strict_mode_and_is_let_through_in_permissive_mode() {
    let mut r = Setup::new("ridstrict", &[6001, 6002]).moved().ready();
    r.targets.script().reconcile_failures.insert(6001, inconsistent());
    r.targets.script().children.insert(6001, vec![6002]);
    let (o, worked) = r.resume(6001);
    assert!(worked);
    assert!(matches!(failed(o), ProcessFailure::Inconsistent(_)));
    assert!(matches!(r.resume(6002), (HookOutcome::Done, false)));
    assert_eq!(r.killed(), vec![6001, 6002], "the whole restored tree");
    assert!(r.report(5001).unwrap().contains("result: FAILED: GPU identity is inconsistent after restore"));
    assert!(seen(&["killed the restored tree (2 process(es)) because pid(s) [6001]"]));

    let mut r = Setup::new("ridperm", &[6011]).moved().config(&[("CRIU_CUDA_MIGRATE_MODE", "permissive")]).ready();
    r.targets.script().reconcile_failures.insert(6011, inconsistent());
    assert!(matches!(r.resume(6011), (HookOutcome::Done, true)));
    assert_eq!(r.agent.state_of(6011), Running);
    assert!(r.killed().is_empty());
    assert!(seen(&["pid 6011: GPU identity is inconsistent after restore (permissive mode: it resumes anyway)"]));
}

#[test]
fn a_driver_restore_failure_kills_the_tree_in_strict_mode() {
    let mut r = Setup::new("rdrvstrict", &[6101]).ready();
    r.agent.fail("restore", 6101, cuda_error("cuCheckpointProcessRestore", CudaCode::OutOfMemory));
    assert!(matches!(failed(r.resume(6101).0), ProcessFailure::Driver(_)));
    assert_eq!(r.killed(), vec![6101]);
    assert!(seen(&["pid 6101: the driver's restore failed after", "strict mode kills the restored tree"]));
}

#[test]
fn a_driver_restore_failure_in_permissive_mode_leaves_the_process_for_recover_or_says_it_cannot_help() {
    let mut r = Setup::new("rdrvperm", &[6201]).config(&[("CRIU_CUDA_MIGRATE_MODE", "permissive")]).ready();
    r.agent.fail("restore", 6201, cuda_error("cuCheckpointProcessRestore", CudaCode::OutOfMemory));
    assert!(matches!(failed(r.resume(6201).0), ProcessFailure::Driver(_)));
    assert!(r.killed().is_empty());
    assert_eq!(r.agent.state_of(6201), Checkpointed);
    assert!(seen(&["pid 6201 is left CHECKPOINTED", "recover --pid 6201"]));

    // One of several processes refused like an IPC importer: recover cannot help.
    let mut r = Setup::new("rdrvipc", &[6211, 6212]).config(&[("CRIU_CUDA_MIGRATE_MODE", "permissive")]).ready();
    r.targets.script().children.insert(6211, vec![6212]);
    r.agent.fail("restore", 6212, cuda_error("cuCheckpointProcessRestore", CudaCode::InvalidValue));
    assert!(matches!(r.resume(6211), (HookOutcome::Done, true)));
    assert!(matches!(failed(r.resume(6212).0), ProcessFailure::Driver(_)));
    assert!(seen(&["pid 6212 is left CHECKPOINTED", "cannot bring it back either: kill it"]));
}

#[test]
fn the_agent_lost_at_the_restore_or_the_unlock_kills_the_tree_in_either_mode() {
    for (pid, call, mode) in [(6301, "restore", "strict"), (6302, "unlock", "permissive")] {
        let mut r = Setup::new("rlost", &[pid]).config(&[("CRIU_CUDA_MIGRATE_MODE", mode)]).ready();
        r.agent.fail(call, pid, lost(pid == 6302));
        assert!(matches!(failed(r.resume(pid).0), ProcessFailure::Driver(e) if e.is_lost()));
        assert_eq!(r.killed(), vec![pid], "{call}");
    }
    assert!(seen(&["pid 6301: ", "during the driver's restore; its CUDA state is unknown"]));
    assert!(seen(&["pid 6302: ", "during its unlock; the restored tree is killed"]));
}

#[test]
fn a_failed_unlock_leaves_the_process_locked_for_recover() {
    let mut r = Setup::new("runlock", &[6401]).ready();
    r.agent.fail("unlock", 6401, cuda_error("cuCheckpointProcessUnlock", CudaCode::Unknown));
    assert!(matches!(failed(r.resume(6401).0), ProcessFailure::Driver(_)));
    assert_eq!(r.agent.state_of(6401), Locked);
    assert!(r.killed().is_empty());
    assert!(seen(&["pid 6401 is left LOCKED", "recover --pid 6401"]));
}

#[test]
fn a_process_not_checkpointed_is_left_as_found_and_an_unreadable_state_fails() {
    let mut r = Setup::new("rstate", &[6501, 6502]).ready();
    r.agent.cuda(6501, Running);
    r.agent.script().state_fails.insert(6502);
    r.targets.script().children.insert(6501, vec![6502]);
    assert!(matches!(r.resume(6501), (HookOutcome::Done, true)));
    assert!(matches!(failed(r.resume(6502).0), ProcessFailure::State(_)));
    assert!(!r.agent.called("restore 6501"));
    assert!(seen(&["pid 6501: CUDA state RUNNING after CRIU's restore (expected CHECKPOINTED)"]));
}

#[test]
fn a_non_cuda_root_does_the_whole_tree_s_work() {
    let mut r = Setup::new("rroot", &[6601, 6602]).ready();
    {
        let mut t = r.targets.script();
        // The torchrun shape: a plain launcher above the ranks, and a helper that is no CUDA process.
        t.children.insert(6600, vec![6601, 6603]);
        t.children.insert(6601, vec![6602]);
    }
    let (o, worked) = r.resume(6600);
    assert!(matches!(o, HookOutcome::NotMine) && worked, "the root's call did the work");
    assert_eq!(r.agent.state_of(6601), Running);
    assert_eq!(r.agent.state_of(6602), Running);
    assert!(matches!(r.resume(6601), (HookOutcome::Done, false)));
    assert!(matches!(r.resume(6602), (HookOutcome::Done, false)));
    assert!(matches!(r.resume(6603), (HookOutcome::NotMine, false)), "not a CUDA process");
    assert!(seen(&["pid 6603 is not a CUDA process; leaving it to CRIU"]));
    assert!(seen(&["restore of 2 CUDA process(es) took"]));
    r.session.finish(0);
    assert!(!seen(&["were never handed to the plugin", "4601"]));
}

/// A CUDA process CHECKPOINTED at restore whose identity image is gone (a whiteout in a checkpoint image deletes
/// it at unpack; issue 35): strict mode kills the restored tree before it runs, unmapped and unchecked; permissive
/// mode restores it onto the same GPUs with a warning.
#[test]
fn a_cuda_process_without_an_image_kills_the_tree_in_strict_mode_and_is_restored_in_place_in_permissive_mode() {
    let mut r = Setup::new("rnoimage", &[6701]).ready();
    r.agent.cuda(6702, Checkpointed);
    r.targets.cuda(6702);
    r.targets.script().ns_pids.insert(6702, 5702);
    r.targets.script().children.insert(6701, vec![6702]);
    assert!(matches!(r.resume(6701), (HookOutcome::Done, true)));
    assert!(matches!(
        failed(r.resume(6702).0),
        ProcessFailure::NoIdentityImage { ref image } if image == "cuda-migrate-5702.img"
    ));
    assert_eq!(r.agent.state_of(6702), Checkpointed, "never restored by the driver");
    assert!(!r.agent.called("restore 6702"), "{:?}", r.agent.calls());
    assert_eq!(r.killed(), vec![6701, 6702], "the whole restored tree");
    assert!(seen(&[
        "pid 6702: CHECKPOINTED CUDA process without identity image (cuda-migrate-5702.img is not in the image directory)",
        "strict mode kills the restored tree",
        "CRIU_CUDA_MIGRATE_MODE=permissive",
    ]));
    assert!(seen(&["killed the restored tree (2 process(es)) because pid(s) [6702]"]));

    let mut r = Setup::new("rnoimageperm", &[6711]).config(&[("CRIU_CUDA_MIGRATE_MODE", "permissive")]).ready();
    r.agent.cuda(6712, Checkpointed);
    r.targets.cuda(6712);
    r.targets.script().children.insert(6711, vec![6712]);
    assert!(matches!(r.resume(6711), (HookOutcome::Done, true)));
    assert!(matches!(r.resume(6712), (HookOutcome::Done, false)));
    assert_eq!(r.agent.state_of(6712), Running);
    assert!(r.killed().is_empty());
    assert!(seen(&["pid 6712: CHECKPOINTED CUDA process without identity image (cuda-migrate-6712.img); restoring it onto the same GPUs, unchecked (permissive mode)"]));
}

#[test]
fn an_image_without_a_restore_thread_is_said_and_a_process_never_handed_over_is_warned() {
    let mut r = Setup::new("rnothread", &[6801, 6802]).ready();
    r.agent.script().cuda.remove(&6801);
    r.targets.script().children.insert(6801, vec![]);
    assert!(matches!(r.resume(6801), (HookOutcome::NotMine, false)));
    assert!(seen(&["pid 6801: has an identity image but no CUDA restore thread"]));
    r.session.finish(0);
    assert!(seen(&["restore finished but CUDA process(es) [", "were never handed to the plugin"]));
}

#[test]
fn cuinit_failure_leaves_each_process_named() {
    let mut r = Setup::new("rcuinit", &[6901]).ready();
    r.agent.script().cuinit_error = Some(cuda_error("cuInit", CudaCode::Unknown));
    assert!(matches!(r.resume(6901), (HookOutcome::NotMine, true)));
    assert!(seen(&["pid 6901 is left CHECKPOINTED: cuInit failed in CRIU"]));
}

#[test]
fn a_restore_thread_that_cannot_be_resumed_leaves_the_process_checkpointed() {
    let mut r = Setup::new("rresume", &[7001]).ready();
    r.targets.script().resume_fails.insert(17001);
    assert!(matches!(failed(r.resume(7001).0), ProcessFailure::Batch(_)));
    assert_eq!(r.agent.state_of(7001), Checkpointed);
    assert!(seen(&["pid 7001 is left CHECKPOINTED: cannot resume its restore thread 17001"]));
}

#[test]
fn a_container_s_dev_gets_its_new_gpu_nodes_or_is_left_alone_with_a_reason() {
    let cases = [
        (
            7101,
            FakeDev::Own { minors: vec![0], impostors: vec![("nvidia7".into(), "a regular file")], fail_edits: false },
        ),
        (7102, FakeDev::Own { minors: vec![0], impostors: vec![], fail_edits: true }),
        (7103, FakeDev::Foreign { why: ForeignDev::NotAMount, minors: vec![0] }),
        (7104, FakeDev::Unreadable),
        (7105, FakeDev::Host),
    ];
    for (pid, dev) in cases {
        let mut r = Setup::new("rdev", &[pid]).moved().ready();
        r.targets.script().mount_ns.insert(pid, u64::from(pid));
        r.targets.script().devs.insert(pid, dev);
        assert!(matches!(r.resume(pid), (HookOutcome::Done, true)));
        let edits = r.targets.script().dev_edits.clone();
        match pid {
            7101 | 7102 => assert_eq!(edits, vec!["create 2", "create 3", "remove 0"], "{pid}"),
            _ => assert!(edits.is_empty(), "{pid}"),
        }
    }
    assert!(seen(&["pid 7101: container /dev: created /dev/nvidia2"]));
    assert!(seen(&["pid 7101: container /dev/nvidia7 is a regular file, not a GPU node: left alone"]));
    assert!(seen(&["pid 7102: container /dev: created /dev/nvidia2 failed"]));
    assert!(seen(&["pid 7103: ", "left unchanged. The container sees /dev/nvidia0, while it now runs on"]));
    assert!(seen(&["pid 7104: cannot read its container's /dev"]));
    // Unmoved: nothing to change.
    for (pid, dev) in [
        (7111, FakeDev::Own { minors: vec![0], impostors: vec![], fail_edits: false }),
        (7112, FakeDev::Foreign { why: ForeignDev::NotAMount, minors: vec![] }),
    ] {
        let mut r = Setup::new("rdevsame", &[pid]).ready();
        r.targets.script().mount_ns.insert(pid, u64::from(pid));
        r.targets.script().devs.insert(pid, dev);
        assert!(matches!(r.resume(pid), (HookOutcome::Done, true)));
        assert!(r.targets.script().dev_edits.is_empty());
    }
    assert!(seen(&["pid 7111: container /dev: its own tmpfs, GPU nodes [0]; the GPUs keep their minors"]));
    assert!(seen(&["pid 7112: ", "the GPUs keep their minors, so it needs no change"]));
}

// ----- init(RESTORE): the checkpoint's pid numbers, free before CRIU forks its tasks ----------------------------

use std::time::Duration;

/// CRIU's `pstree.img` of processes `(pid, threads)`, each in a group and a session of its own, threads unpacked
/// (as protobuf-c writes them).
fn pstree(procs: &[(u32, &[u32])]) -> Vec<u8> {
    fn varint(out: &mut Vec<u8>, mut v: u32) {
        while v >= 0x80 {
            out.push(u8::try_from(v & 0x7f).unwrap() | 0x80);
            v >>= 7;
        }
        out.push(u8::try_from(v).unwrap());
    }
    let mut f = Vec::new();
    f.extend(ccm_identity::criu_pstree::IMG_COMMON_MAGIC.to_le_bytes());
    f.extend(ccm_identity::criu_pstree::PSTREE_MAGIC.to_le_bytes());
    for (pid, threads) in procs {
        let mut m = Vec::new();
        for (field, v) in [(1u8, *pid), (2, 1), (3, *pid), (4, *pid)] {
            m.push(field << 3);
            varint(&mut m, v);
        }
        for t in *threads {
            m.push(5 << 3);
            varint(&mut m, *t);
        }
        f.extend(u32::try_from(m.len()).unwrap().to_le_bytes());
        f.extend(m);
    }
    f
}

fn holder(pid: u32, comm: &str, how: ccm_process::pid_use::Holds) -> ccm_process::pid_use::PidHolder {
    ccm_process::pid_use::PidHolder { pid, comm: comm.into(), how }
}

/// The restore of host pid `pid` (its image: namespace pid = host pid at dump = `pid - 1000`) with CRIU's
/// `pstree.img` of `procs` (none: no `pstree.img`), waiting at most `wait`; how long init took.
fn init_waiting(
    name: &'static str,
    pid: u32,
    procs: Option<&[(u32, &[u32])]>,
    taken: &[(u32, ccm_process::pid_use::PidHolder, u32)],
    wait: Duration,
) -> (Result<RestoreSession, EngineError>, FakeTargets, FakeCriu, Duration) {
    let s = Setup::new(name, &[pid]);
    let (agent, targets, criu) = s.parts();
    if let Some(procs) = procs {
        std::fs::write(criu.path().join(ccm_identity::criu_pstree::PSTREE_FILE), pstree(procs)).unwrap();
    }
    for (p, h, checks) in taken {
        targets.script().taken_pids.insert(*p, (h.clone(), *checks));
    }
    let (seams, _) = seams(&targets, vec![Ok(agent)]);
    let t0 = std::time::Instant::now();
    let r = RestoreSession::init_waiting(s.config, &criu, seams, wait);
    (r, targets, criu, t0.elapsed())
}

#[test]
fn checkpoint_pids_that_are_free_are_checked_once_without_a_wait() {
    let (r, targets, _criu, took) =
        init_waiting("rpidfree", 9801, Some(&[(8801, &[8801, 8802]), (8803, &[8803])]), &[], Duration::from_secs(5));
    r.unwrap();
    assert_eq!(targets.script().pid_checks, vec![vec![8801, 8802, 8803]]);
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert!(!seen(&["pid 8801 of the checkpoint"]) && !seen(&["pid 8802 of the checkpoint"]));
}

#[test]
fn a_pid_still_taken_is_waited_for_until_it_is_free() {
    use ccm_process::pid_use::Holds;
    // 8812 (a thread of the dumped process) is the process group of a short-lived process outside the tree for
    // the first three checks.
    let (r, targets, _criu, took) = init_waiting(
        "rpidwait",
        9811,
        Some(&[(8811, &[8811, 8812])]),
        &[(8812, holder(8899, "python3", Holds::ProcessGroup), 3)],
        Duration::from_secs(5),
    );
    r.unwrap();
    let checks = targets.script().pid_checks.clone();
    assert_eq!(checks, vec![vec![8811, 8812], vec![8812], vec![8812], vec![8812]]);
    assert!(took >= crate::pid_wait::PID_POLL * 3, "{took:?}");
    let lines = logged(&["pid 8812 of the checkpoint was still taken (process group of pid 8899 (python3)); waited "]);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].starts_with("INFO") && lines[0].ends_with(" s until it was free"), "{lines:?}");
    assert!(!seen(&["pid 8812 of the checkpoint is still taken"]));
}

#[test]
fn a_pid_never_freed_is_named_with_its_holder_and_the_restore_goes_on() {
    use ccm_process::pid_use::Holds;
    let (r, targets, _criu, took) = init_waiting(
        "rpidheld",
        9821,
        Some(&[(8821, &[8821]), (8822, &[8822])]),
        &[(8822, holder(8898, "bash", Holds::Session), u32::MAX)],
        Duration::from_millis(150),
    );
    let mut s = r.expect("init does not fail: CRIU fails by itself");
    assert!(took >= Duration::from_millis(150) && took < Duration::from_secs(3), "{took:?}");
    assert!(targets.script().pid_checks.len() >= 2);
    let lines = logged(&["pid 8822 of the checkpoint is still taken by session of pid 8898 (bash) after "]);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].starts_with("ERROR"), "{lines:?}");
    assert!(
        lines[0].ends_with(
            "CRIU will fail with \"Can't fork for PID: File exists\": wait until pid 8898 (bash) ends, or end it, \
             then restore again"
        ),
        "{lines:?}"
    );
    assert!(!seen(&["pid 8821 of the checkpoint"]));
    // The session is ready for CRIU's restore as without the wait.
    assert!(matches!(s.resume_devices_late(9821), (HookOutcome::Done, true)));
}

#[test]
fn without_a_readable_pstree_the_pids_are_not_checked() {
    use ccm_process::pid_use::Holds;
    let taken = [(8831, holder(8831, "x", Holds::Process), u32::MAX)];
    let (r, targets, criu, _) = init_waiting("rpidnotree", 9831, None, &taken, Duration::from_secs(5));
    r.unwrap();
    assert!(targets.script().pid_checks.is_empty());
    let tree = criu.path().join("pstree.img").display().to_string();
    assert!(seen(&["DEBUG the checkpoint's pids are not checked: ", &tree, "does not exist"]));

    let s = Setup::new("rpidbadtree", &[9832]);
    let (agent, targets, criu) = s.parts();
    std::fs::write(criu.path().join("pstree.img"), b"not CRIU's").unwrap();
    let (seams, _) = seams(&targets, vec![Ok(agent)]);
    RestoreSession::init_waiting(s.config, &criu, seams, Duration::from_secs(5)).unwrap();
    assert!(targets.script().pid_checks.is_empty());
    assert!(seen(&["DEBUG the checkpoint's pids are not checked: pstree.img starts with 0x"]));
}

#[test]
fn a_dump_in_a_pid_namespace_of_its_own_is_not_checked() {
    use ccm_process::pid_use::Holds;
    let s = Setup::new("rpidns", &[9841]);
    let (agent, targets, criu) = s.parts();
    // Pid 1 of its namespace, 8841 to CRIU: the tree is restored into a new pid namespace.
    let mut own = image(1, 1 << 30);
    own.host_pid = 8841;
    std::fs::remove_file(criu.path().join(IdentityImage::file_name(8841))).unwrap();
    std::fs::write(criu.path().join(IdentityImage::file_name(1)), own.try_encode().unwrap()).unwrap();
    targets.script().ns_pids.insert(9841, 1);
    std::fs::write(criu.path().join("pstree.img"), pstree(&[(1, &[1])])).unwrap();
    targets.script().taken_pids.insert(1, (holder(1, "init", Holds::Process), u32::MAX));
    let (seams, _) = seams(&targets, vec![Ok(agent)]);
    RestoreSession::init_waiting(s.config, &criu, seams, Duration::from_secs(5)).unwrap();
    assert!(targets.script().pid_checks.is_empty());
    assert!(seen(&["the dump ran in a pid namespace of its own (pid 1 there was 8841 to CRIU)"]));
}
