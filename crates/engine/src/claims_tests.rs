//! Forked processes' NVIDIA nodes through the scripted seams: what the dump claims and writes, what it
//! refuses, and what the restore plans from the file (no root, GPU or CRIU).

use ccm_driver::checkpoint::ProcessState::Running;
use ccm_identity::claims::{
    ClaimedFd, ClaimedMapping, DevNumber, DevType, DeviceClaims, NvidiaDevices, NvidiaNode, CLAIMS_FILE_NAME,
};
use ccm_process::claims::Holdings;

use crate::claims::{Claim, ClaimError, RestoreClaims};
use crate::dump::DumpSession;
use crate::fake::*;
use crate::{EngineError, HookOutcome};

fn devices() -> NvidiaDevices {
    NvidiaDevices::from_proc_devices("Character devices:\n195 nvidia\n238 nvidia-uvm\n241 nvidia-caps\n")
}

fn chr(major: u32, minor: u32) -> DevNumber {
    DevNumber { kind: DevType::Char, major, minor }
}

/// What a DataLoader worker holds (GPU-FACTS, measured on an H100): one GPU mapping, nvidiactl mappings, the
/// parent's descriptors; no nvidia-uvm mapping (VM_DONTCOPY).
fn worker() -> Holdings {
    Holdings {
        mappings: vec![
            ClaimedMapping {
                start: 0x2_0060_0000,
                end: 0x2_0080_0000,
                perms: "rw-s".into(),
                offset: 0,
                node: NvidiaNode::Gpu(1),
            },
            ClaimedMapping {
                start: 0x7f00_0000_0000,
                end: 0x7f00_0000_4000,
                perms: "rw-s".into(),
                offset: 0,
                node: NvidiaNode::Control,
            },
        ],
        fds: vec![
            ClaimedFd { fd: 4, node: NvidiaNode::Cap(1) },
            ClaimedFd { fd: 5, node: NvidiaNode::Uvm },
            ClaimedFd { fd: 6, node: NvidiaNode::Control },
            ClaimedFd { fd: 7, node: NvidiaNode::Gpu(1) },
        ],
        unclaimed: Vec::new(),
        creds: None,
    }
}

struct Dump {
    session: DumpSession,
    targets: FakeTargets,
    criu: FakeCriu,
    agent: FakeAgent,
}

/// A CUDA parent 9100 on GPU 1 and a worker 9101 forked from it.
fn dump(name: &str, worker_holds: Holdings) -> Dump {
    capture_log();
    let agent = FakeAgent::new(vec![gpu(0), gpu(1)]);
    let targets = FakeTargets::default();
    agent.cuda(9100, Running);
    targets.cuda(9100).cuda(9101);
    targets.script().minors.insert(9100, [1].into());
    targets.script().devices = devices();
    targets.script().holdings.insert(9101, worker_holds);
    targets.script().ns_pids.insert(9101, 12);
    let (seams, _) = seams(&targets, vec![Ok(agent.clone()), Ok(agent.fresh())]);
    let criu = FakeCriu::new(name);
    let session = DumpSession::init_with(config(&[]), &criu, seams).unwrap();
    Dump { session, targets, criu, agent }
}

impl Dump {
    fn claims(&self) -> DeviceClaims {
        DeviceClaims::decode(&std::fs::read(self.criu.path().join(CLAIMS_FILE_NAME)).unwrap()).unwrap()
    }
}

#[test]
fn a_forked_worker_is_recorded_claimed_and_written_while_its_parent_is_checkpointed() {
    let mut d = dump("claims-worker", worker());
    assert!(matches!(d.session.pause_devices(9100, &d.criu), HookOutcome::Done));
    // The worker maps libcuda but the driver has no restore thread for it: left to CRIU at PAUSE_DEVICES.
    assert!(matches!(d.session.pause_devices(9101, &d.criu), HookOutcome::NotMine));
    assert!(matches!(d.session.checkpoint_devices(9100, &d.criu), HookOutcome::Done));
    // At its CHECKPOINT_DEVICES what it holds is recorded (and the hook reports work done).
    assert!(matches!(d.session.checkpoint_devices(9101, &d.criu), HookOutcome::Done));
    assert!(seen(&["pid 9101 (proc9101) is no CUDA process but holds 4 NVIDIA descriptor(s) and 2 device mapping(s)"]));
    let c = d.claims();
    assert_eq!(c.holders.len(), 1);
    assert_eq!((c.holders[0].pid, c.holders[0].host_pid), (12, 9101));
    assert_eq!(c.gpus.get(&1), Some(&gpu(1).uuid));
    // CRIU then asks about the mappings and the files.
    assert!(matches!(d.session.handle_device_vma(chr(195, 1), Some(9101)), Claim::Mine));
    assert!(matches!(d.session.handle_device_vma(chr(195, 255), Some(9101)), Claim::Mine));
    assert!(matches!(d.session.handle_device_vma(chr(1, 1), Some(9101)), Claim::NotMine));
    assert!(matches!(d.session.dump_ext_file(0x21, chr(195, 1), 0o2_000_002, &d.criu), Claim::Mine));
    assert!(matches!(d.session.dump_ext_file(0x22, chr(238, 0), 2, &d.criu), Claim::Mine));
    assert!(matches!(d.session.dump_ext_file(0x24, chr(241, 1), 0, &d.criu), Claim::Mine));
    assert!(matches!(d.session.dump_ext_file(0x23, chr(10, 237), 2, &d.criu), Claim::NotMine));
    let c = d.claims();
    assert_eq!(c.files.len(), 3);
    assert_eq!(c.file(0x24).map(|f| f.node), Some(NvidiaNode::Cap(1)));
    let gpu_file = c.file(0x21).unwrap();
    assert_eq!((gpu_file.node, gpu_file.gpu, gpu_file.flags), (NvidiaNode::Gpu(1), Some(gpu(1).uuid), 0o2_000_002));
    assert!(*d.criu.inventory_added.lock().unwrap());
    d.session.finish(0, &d.criu);
}

#[test]
fn the_trees_holdings_are_read_once_beside_the_checkpoint_and_each_workers_hook_records_its_own() {
    let mut d = dump("claims-read-ahead", worker());
    {
        let mut s = d.targets.script();
        s.children.insert(9100, vec![9101, 9102]);
        s.holdings.insert(9102, worker());
        s.ns_pids.insert(9102, 13);
    }
    assert!(matches!(d.session.pause_devices(9100, &d.criu), HookOutcome::Done));
    assert!(matches!(d.session.pause_devices(9101, &d.criu), HookOutcome::NotMine));
    assert!(matches!(d.session.pause_devices(9102, &d.criu), HookOutcome::NotMine));
    // (The managed-memory check read the CUDA parent's at its PAUSE_DEVICES, then the claims' bound the tree's.)
    let mut paused = std::mem::take(&mut d.targets.script().holdings_read);
    assert_eq!(paused.remove(0), 9100);
    paused.sort_unstable();
    assert_eq!(paused, [9100, 9101, 9102]);
    assert!(seen(&["device claims before the first lock: 2 process(es) of the tree hold NVIDIA nodes"]));
    assert!(matches!(d.session.checkpoint_devices(9100, &d.criu), HookOutcome::Done));
    // Both workers were read in their parent's hook (the CUDA parent itself is not: the driver's checkpoint has it).
    let mut read = d.targets.script().holdings_read.clone();
    read.sort_unstable();
    assert_eq!(read, [9101, 9102]);
    assert!(seen(&["holdings of 2 other process(es) of the tree read in", "beside the checkpoint"]));
    // Each worker's hook records what was read for it, and reads nothing again.
    assert!(matches!(d.session.checkpoint_devices(9101, &d.criu), HookOutcome::Done));
    assert!(matches!(d.session.checkpoint_devices(9102, &d.criu), HookOutcome::Done));
    assert_eq!(d.targets.script().holdings_read.len(), 2);
    let c = d.claims();
    assert_eq!(c.holders.iter().map(|h| (h.pid, h.host_pid)).collect::<Vec<_>>(), [(12, 9101), (13, 9102)]);
    d.session.finish(0, &d.criu);
}

#[test]
fn a_root_that_is_no_cuda_process_reads_its_own_holdings_and_the_rest_of_the_tree_ahead() {
    let mut d = dump("claims-read-ahead-root", worker());
    {
        let mut s = d.targets.script();
        // A container's init 9000 (no CUDA, no NVIDIA node), the CUDA parent 9100 and its worker 9101.
        s.children.insert(9000, vec![9100]);
        s.children.insert(9100, vec![9101]);
    }
    assert!(matches!(d.session.pause_devices(9000, &d.criu), HookOutcome::NotMine));
    assert!(matches!(d.session.pause_devices(9100, &d.criu), HookOutcome::Done));
    let mut paused = std::mem::take(&mut d.targets.script().holdings_read);
    assert_eq!(paused.remove(0), 9100);
    paused.sort_unstable();
    assert_eq!(paused, [9000, 9100, 9101]);
    assert!(matches!(d.session.checkpoint_devices(9000, &d.criu), HookOutcome::NotMine));
    // The root's hook read the worker ahead and itself in its own turn; not the CUDA process.
    assert_eq!(d.targets.script().holdings_read, [9101, 9000]);
    assert!(matches!(d.session.checkpoint_devices(9100, &d.criu), HookOutcome::Done));
    assert!(matches!(d.session.checkpoint_devices(9101, &d.criu), HookOutcome::Done));
    assert_eq!(d.targets.script().holdings_read.len(), 2);
    assert_eq!(d.claims().holders.len(), 1);
    d.session.finish(0, &d.criu);
}

#[test]
fn a_process_without_nvidia_nodes_and_a_node_without_the_driver_are_left_to_criu() {
    let mut d = dump("claims-none", Holdings::default());
    assert!(matches!(d.session.checkpoint_devices(9101, &d.criu), HookOutcome::NotMine));
    assert!(!d.criu.path().join(CLAIMS_FILE_NAME).exists());
    // A mapping of an NVIDIA node that no process was recorded holding is refused, not silently dumped.
    match d.session.handle_device_vma(chr(195, 1), Some(9101)) {
        Claim::Refused(ClaimError::UnknownMapping { node: NvidiaNode::Gpu(1), pid: Some(9101) }) => {}
        other => panic!("{other:?}"),
    }
    let mut d2 = dump("claims-nodriver", worker());
    d2.targets.script().devices = NvidiaDevices::default();
    assert!(matches!(d2.session.checkpoint_devices(9101, &d2.criu), HookOutcome::NotMine));
}

#[test]
fn nodes_the_plugin_does_not_claim_fail_the_dump_naming_the_process_and_unreadable_holdings_are_left_to_criu() {
    let mut holds = worker();
    holds.unclaimed.push(("descriptor 9 of char 242:1".into(), "nvidia-caps-imex-channels".into()));
    let mut d = dump("claims-caps", holds);
    match d.session.checkpoint_devices(9101, &d.criu) {
        HookOutcome::Failed(EngineError::Claim(e @ ClaimError::Unclaimable { .. })) => {
            let t = e.to_string();
            assert!(
                t.contains("pid 9101 (proc9101)") && t.contains("nvidia-caps-imex") && t.contains("'spawn'"),
                "{t}"
            );
        }
        other => panic!("{other:?}"),
    }
    // Holdings that cannot be read leave the process to CRIU (which fails the dump itself if it holds a node), with
    // a warning: an ordinary process of a tree dumped on a GPU node must not fail the dump for the plugin's sake.
    let mut d = dump("claims-unreadable", worker());
    d.targets.script().holdings_fail.insert(9101);
    assert!(matches!(d.session.checkpoint_devices(9101, &d.criu), HookOutcome::NotMine));
    assert!(seen(&["pid 9101: what it holds of the NVIDIA nodes cannot be read"]));
}

fn written_claims() -> DeviceClaims {
    let mut d = dump("claims-plan", worker());
    assert!(matches!(d.session.checkpoint_devices(9101, &d.criu), HookOutcome::Done));
    assert!(matches!(d.session.dump_ext_file(0x21, chr(195, 1), 2, &d.criu), Claim::Mine));
    assert!(matches!(d.session.dump_ext_file(0x22, chr(238, 0), 2, &d.criu), Claim::Mine));
    d.claims()
}

#[test]
fn the_restore_reopens_gpu_nodes_through_the_map_and_refuses_what_the_node_lacks() {
    let claims = written_claims();
    // Another node where the dump's GPU 1 is absent and one GPU (minor 3) is usable: the only choice.
    let mut other = gpu(3);
    other.minor = 3;
    let here = NvidiaDevices::from_proc_devices("Character devices:\n195 nvidia\n511 nvidia-uvm\n");
    let planned =
        RestoreClaims::plan(claims.clone(), &here, &[], std::slice::from_ref(&other), &[other.uuid], &config(&[]))
            .unwrap();
    let text = planned.describe();
    assert!(text.contains("file 0x21: reopened as /dev/nvidia3 (char 195:3)"), "{text}");
    assert!(text.contains("file 0x22: reopened as /dev/nvidia-uvm (char 511:0)"), "{text}");
    // Its GPU descriptor moves (nvidia1 -> nvidia3): the restored /dev may lack the node, so CRIU's mounts are read.
    assert!(planned.moves_a_gpu_node());
    let mut same = gpu(1);
    same.minor = 1;
    let unmoved = RestoreClaims::plan(claims.clone(), &here, &[], &[same.clone()], &[same.uuid], &config(&[])).unwrap();
    assert!(!unmoved.moves_a_gpu_node(), "{}", unmoved.describe());
    // The worker's mapping gets a placeholder as large as its largest mapping; another address is not ours.
    let fd = planned.placeholder(12, 0x2_0060_0000).unwrap().unwrap();
    assert_eq!(std::fs::File::from(fd).metadata().unwrap().len(), 0x20_0000);
    assert!(planned.placeholder(12, 0x1000).is_none());
    assert!(planned.placeholder(13, 0x2_0060_0000).is_none());
    // Two usable GPUs and the dump's not among them: which one is the user's to say.
    let e =
        RestoreClaims::plan(claims.clone(), &here, &[], &[gpu(3), gpu(4)], &[gpu(3).uuid, gpu(4).uuid], &config(&[]))
            .unwrap_err();
    assert!(e.to_string().contains("CRIU_CUDA_MIGRATE_DEVICE_MAP"), "{e}");
    // A node whose driver has no nvidia-uvm: refused before anything is restored, naming it.
    let no_uvm = NvidiaDevices::from_proc_devices("Character devices:\n195 nvidia\n");
    let e = RestoreClaims::plan(claims, &no_uvm, &[], &[gpu(1)], &[gpu(1).uuid], &config(&[])).unwrap_err();
    let t = e.to_string();
    assert!(t.contains("/dev/nvidia-uvm") && t.contains("images are unchanged"), "{t}");
}

/// C4 (review of issue 46): a mapping is claimed for the process CRIU is parsing, when that process was recorded
/// holding the node, not because any process of the tree maps the same node.
#[test]
fn a_mapping_is_claimed_only_for_the_process_recorded_holding_it() {
    let mut d = dump("claims-per-process", worker());
    assert!(matches!(d.session.pause_devices(9100, &d.criu), HookOutcome::Done));
    assert!(matches!(d.session.checkpoint_devices(9100, &d.criu), HookOutcome::Done));
    assert!(matches!(d.session.checkpoint_devices(9101, &d.criu), HookOutcome::Done));
    assert!(matches!(d.session.handle_device_vma(chr(195, 1), Some(9101)), Claim::Mine));
    // Another process of the tree mapping the same node, whose holdings were not recorded: refused, naming it.
    match d.session.handle_device_vma(chr(195, 1), Some(9100)) {
        Claim::Refused(e @ ClaimError::UnknownMapping { node: NvidiaNode::Gpu(1), pid: Some(9100) }) => {
            assert!(e.to_string().contains("in pid 9100"), "{e}");
        }
        other => panic!("{other:?}"),
    }
    // The worker's own mapping of a node it was not recorded mapping: refused too.
    assert!(matches!(d.session.handle_device_vma(chr(195, 0), Some(9101)), Claim::Refused(_)));
    // When CRIU's task cannot be told, a recorded holder of the node will do.
    assert!(matches!(d.session.handle_device_vma(chr(195, 1), None), Claim::Mine));
    d.session.finish(0, &d.criu);
}

/// C2 (review of issue 46): each claim appends its own line (the file grows by that line, the bytes before it
/// untouched), and a file asked about twice is rewritten whole, once.
#[test]
fn each_claim_appends_its_own_line_and_a_repeated_file_rewrites_the_file() {
    let mut d = dump("claims-append", worker());
    assert!(matches!(d.session.pause_devices(9100, &d.criu), HookOutcome::Done));
    assert!(matches!(d.session.checkpoint_devices(9100, &d.criu), HookOutcome::Done));
    assert!(matches!(d.session.checkpoint_devices(9101, &d.criu), HookOutcome::Done));
    let path = d.criu.path().join(CLAIMS_FILE_NAME);
    let mut before = std::fs::read(&path).unwrap();
    for id in 0x100..0x140u32 {
        assert!(matches!(d.session.dump_ext_file(id, chr(195, 255), 2, &d.criu), Claim::Mine));
        let after = std::fs::read(&path).unwrap();
        let line = ccm_identity::claims::file_line(&ccm_identity::claims::ClaimedFile {
            id,
            node: NvidiaNode::Control,
            gpu: None,
            flags: 2,
        });
        assert!(after.starts_with(&before), "claim {id:#x} rewrote earlier bytes");
        assert_eq!(after.len(), before.len() + line.len());
        before = after;
    }
    assert!(matches!(d.session.dump_ext_file(0x100, chr(195, 255), 0o4002, &d.criu), Claim::Mine));
    let c = d.claims();
    assert_eq!(c.files.len(), 0x40);
    assert_eq!(c.file(0x100).map(|f| f.flags), Some(0o4002));
    d.session.finish(0, &d.criu);
}

/// C1 (review of issue 46): a tree whose holdings the claims file could not record (the restore would refuse the
/// file) is refused at the first CUDA process's PAUSE_DEVICES, before any lock, naming the process and the bound.
#[test]
fn a_tree_over_the_claims_bound_is_refused_before_any_lock() {
    let mut holds = worker();
    holds.fds = (0..=u32::try_from(ccm_identity::claims::MAX_FDS_PER_HOLDER).unwrap())
        .map(|fd| ClaimedFd { fd, node: NvidiaNode::Control })
        .collect();
    let mut d = dump("claims-over-bound", holds);
    d.targets.script().children.insert(9100, vec![9101]);
    match d.session.pause_devices(9100, &d.criu) {
        HookOutcome::Failed(EngineError::Claim(e @ ClaimError::OverBound { pid: 9101, .. })) => {
            let text = e.to_string();
            assert!(text.contains("descriptors of one process") && text.contains("spawn"), "{text}");
        }
        other => panic!("{other:?}"),
    }
    let agent_calls = d.agent.calls();
    assert!(!agent_calls.iter().any(|c| c.starts_with("lock")), "{agent_calls:?}");
    d.session.finish(1, &d.criu);
}

/// C3 (review of issue 46): the workers' GPU descriptors obey the GPUs this restore may use. The seed's node: 8
/// GPUs, 4 usable; a worker's GPU that is on the node but not usable is never opened (it may be another tenant's):
/// refused, naming it; the explicit device map pairs it; a usable dump GPU stays itself.
#[test]
fn the_workers_gpu_descriptors_open_only_usable_gpus() {
    let claims = written_claims();
    let here = NvidiaDevices::from_proc_devices("Character devices:\n195 nvidia\n238 nvidia-uvm\n");
    let node: Vec<_> = (0..8).map(gpu).collect();
    let usable: Vec<_> = (4..8).map(|i| gpu(i).uuid).collect();
    // The dump's GPU 1 is on this node, but only GPUs 4-7 are usable: not opened.
    let e = RestoreClaims::plan(claims.clone(), &here, &[], &node, &usable, &config(&[])).unwrap_err();
    let t = e.to_string();
    assert!(t.contains(&gpu(1).uuid.to_string()) && t.contains("CRIU_CUDA_MIGRATE_DEVICE_MAP"), "{t}");
    // The explicit map (GPU 1 to `to`), planned on this node.
    let with_map = |to: u32| {
        let map = format!("{}={}", gpu(1).uuid, gpu(to).uuid);
        RestoreClaims::plan(
            claims.clone(),
            &here,
            &[],
            &node,
            &usable,
            &config(&[("CRIU_CUDA_MIGRATE_DEVICE_MAP", &map)]),
        )
    };
    // It pairs GPU 1 with a usable GPU: that one.
    let planned = with_map(5).unwrap();
    assert!(planned.describe().contains("reopened as /dev/nvidia5"), "{}", planned.describe());
    // ... but never with one outside the usable set.
    let e = with_map(2).unwrap_err();
    assert!(e.to_string().contains("may not use"), "{e}");
    // GPU 1 usable: it stays itself.
    let planned = RestoreClaims::plan(claims, &here, &[], &node, &[gpu(1).uuid, gpu(5).uuid], &config(&[])).unwrap();
    assert!(planned.describe().contains("reopened as /dev/nvidia1"), "{}", planned.describe());
}
