//! The container runtimes of the user guide, end to end, with the Debian package installed as a user installs it
//! and CRIU configured through its files only (docs/USER-GUIDE.md sections 5.2 and 5.3):
//!
//! - Podman with runc (libdir in `/etc/criu/runc.conf`): `checkpoint --leave-running --export`, `checkpoint
//!   --export`, `restore --import`; the container comes back with its memory, and the plugin's settings given to
//!   conmon through a `CONTAINERS_CONF_OVERRIDE` file reach the plugin inside CRIU;
//! - Podman with crun (libdir in `/etc/criu/crun.conf` with crun 1.28 and libcriu 4.2, else in
//!   `/etc/criu/default.conf`): `checkpoint --export`, and `restore --import` where the host allows it (with crun 1.21
//!   not on a hybrid cgroup v1 host: tests/container/podman-flow.sh says why);
//! - containerd with its runc shim (libdir in `runc.conf`, settings in containerd's environment as the guide's
//!   systemd drop-in gives them): `ctr task checkpoint`, `ctr containers checkpoint --task`, `ctr containers
//!   restore --live`;
//! - containerd 2.1 (forky root only) through CRI, as the kubelet drives it: `CheckpointContainer` into an archive
//!   (the container keeps running), then a new container created from that archive and started (containerd's
//!   restore); the plugin from `runc.conf`, its settings from containerd's environment.
//!
//! The containers are busybox shells (no GPU): the plugin must load, say what it was told, leave every process
//! to CRIU, and stay out of the way. The flows are shell scripts in tests/container/, run inside a copy of the
//! runtimes root (`tests/criu-root.sh prepare-runtimes`); each step leaves its status and output in a scratch
//! directory, which this test reads. Needs root like every real-CRIU test (skips loudly without it, fails under CI).
//!
//! Every flow runs on the root `CCM_CRIU_SUITE` names (trixie: Podman 5.4, runc 1.1, crun 1.21, containerd 1.7;
//! forky: Podman 5.8, runc 1.3, crun 1.28, containerd 2.1); tests/run-all.sh runs both.
//!
//! Podman with runc and a network namespace of the container's own (`--network none`) holding an established TCP
//! connection on 127.0.0.1 (tests/container/podman-tcp-flow.sh): `--tcp-established` checkpoint and restore, which
//! needs the package's CRIU action script (runc restores that namespace with its loopback down).
//!
//! A CUDA container, on the test doubles (tests/container/runc-cuda-flow.sh): plain runc with the packaged plugin
//! (libdir in `runc.conf`), the sample workload in its own pid namespace; `runc checkpoint` and `runc restore` bring
//! it back with its device data and an agreeing identity, on the same simulated GPU and, with
//! `CRIU_CUDA_MIGRATE_DEVICE_MAP` in runc's environment, on the other one.
//!
//! The seed's pod at its real size, on the test doubles (tests/container/runc-pod-flow.sh, issue 36): two simulated
//! 8-GPU nodes of one PCI layout, a runc container of 4 ranks given 4 GPUs, moved from node A to node B and back with
//! no setting, NCCL's init check on every ordinal of every rank; reconciliation off shows the seed's Not Found; too
//! few GPUs given is refused before CRIU restores anything.
//!
//! CDI GPUs on the test doubles (issue 25), with a CDI spec of the doubles' two GPUs in `/etc/cdi`:
//! - Podman `--device nvidia.com/gpu=0` (tests/container/podman-cdi-flow.sh, runc and crun): `--leave-running`,
//!   export, a restore refused by the preflight with the archive intact, `restore --import` (Podman reuses the
//!   checkpoint's spec: the node's CDI spec is not read again), and the move onto the other GPU through the usable
//!   set;
//! - Podman `--device nvidia.com/gpu=0` with a torchrun-like tree (tests/container/podman-cdi-tree-flow.sh, issue 46):
//!   an agent with 2 CUDA ranks, each with 4 workers forked after cuInit holding the GPU's nodes (the doubles'
//!   loop-device stand-ins, opened and mapped), exported and restored on the same GPU with every worker's nodes
//!   reopened; restored with the usable set naming the other GPU, the plugin plans the workers onto its node, and
//!   Podman's reuse of the checkpoint's spec (`/dev` and devices cgroup) makes that restore fail cleanly, after which
//!   the archive restores again;
//! - containerd 2.1 CRI with `CDI_devices` (tests/container/cri-cdi-flow.sh): the restored container's spec is built
//!   from the new request, whose CDI device is the other GPU, and the plugin moves the process there by itself;
//! - the same with the torchrun-like tree (tests/container/cri-cdi-tree-flow.sh, issue 46): CheckpointContainer of
//!   the whole tree, restored onto the other GPU with every worker's GPU descriptor reopened on its node, which the
//!   plugin adds to the restored `/dev` (CRIU's copy of the dumped one) when CRIU asks for the descriptor.

// Test code: a failed unwrap or expect names its line (the workspace lints keep them out of product code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use support::package::{deb, describe_output, RootCopy, RootKind};
use support::{criu_root_or_skip, init_line, loud, repo_root, CriuRoot, LOG_PREFIX};

/// One flow at a time: each copies the runtimes root and runs CRIU on this machine's two cores.
static ONE_FLOW: Mutex<()> = Mutex::new(());

struct Scratch {
    dir: tempfile::TempDir,
}

impl Scratch {
    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn read(&self, name: &str) -> String {
        fs::read_to_string(self.path().join(name)).unwrap_or_default()
    }

    fn rc(&self, step: &str) -> Option<i32> {
        self.read(&format!("{step}.rc")).trim().parse().ok()
    }

    /// A step's status, and its output when it failed, with the error lines of every CRIU log the flow left
    /// (a runtime's "criu failed" says nothing of why).
    fn assert_step(&self, step: &str, what: &str) {
        if self.rc(step) == Some(0) {
            return;
        }
        panic!(
            "{what} ({step}) failed ({:?}):\n--- stdout ---\n{}\n--- stderr ---\n{}\n--- flow ---\n{}\n--- CRIU's errors ---\n{}",
            self.rc(step),
            self.read(&format!("{step}.out")),
            self.read(&format!("{step}.err")),
            self.read("flow.log"),
            self.criu_errors()
        );
    }

    /// `Error` and plugin lines of the CRIU logs (`*.log` named dump or restore) under the scratch directory.
    fn criu_errors(&self) -> String {
        let mut out = String::new();
        let mut dirs = vec![self.path().to_path_buf()];
        while let Some(d) = dirs.pop() {
            let Ok(entries) = fs::read_dir(&d) else { continue };
            for e in entries.flatten() {
                let (p, Ok(t)) = (e.path(), e.file_type()) else { continue };
                if t.is_dir() {
                    dirs.push(p);
                } else if t.is_file()
                    && p.file_name().is_some_and(|n| {
                        n.to_string_lossy().ends_with("restore.log") || n.to_string_lossy().ends_with("dump.log")
                    })
                {
                    let text = fs::read_to_string(&p).unwrap_or_default();
                    let lines: Vec<&str> =
                        text.lines().filter(|l| l.contains("Error") || l.contains(LOG_PREFIX)).collect();
                    let tail = &lines[lines.len().saturating_sub(15)..];
                    out.push_str(&format!("{}:\n{}\n", p.display(), tail.join("\n")));
                }
            }
        }
        out
    }

    /// The plugin's `settings:` line of a CRIU log the runtime left.
    fn settings(&self, log: &str) -> String {
        let text = self.read(log);
        assert!(!text.is_empty(), "{log} was not found where the runtime keeps CRIU's logs");
        assert!(
            text.contains(&init_line(if log.contains("restore") { "restore" } else { "dump" })),
            "{log}: plugin not loaded:\n{text}"
        );
        text.lines()
            .find_map(|l| l.split_once(&format!("{LOG_PREFIX}settings: ")).map(|(_, s)| s.to_string()))
            .unwrap_or_else(|| panic!("{log} has no `settings:` line of the plugin:\n{text}"))
    }

    /// `TOKEN COUNTER` lines the container loops write; the same token proves the same memory.
    fn counter(&self, name: &str) -> (String, u64) {
        let line = self.read(name);
        let (token, count) =
            line.trim().split_once(' ').unwrap_or_else(|| panic!("{name} holds no `TOKEN COUNTER` line: {line:?}"));
        (token.to_string(), count.parse().unwrap_or_else(|_| panic!("{name}: bad counter in {line:?}")))
    }

    /// The container came back with its memory: the token of the checkpoint and a larger counter (a restarted
    /// loop would have a new token).
    fn assert_continues(&self, checkpointed: &str, after: &str, runtime: &str) {
        let (token_before, count_before) = self.counter(checkpointed);
        let (token_after, count_after) = self.counter(after);
        assert_eq!(
            token_after, token_before,
            "{runtime}: the restored container runs a new loop (token {token_after}, was {token_before}): restarted, not restored"
        );
        assert!(
            count_after > count_before,
            "{runtime}: the restored counter {count_after} did not go on from {count_before}"
        );
    }
}

/// What checkpointctl (Debian's 1.3, forky's runtimes root) and criu-cuda-migrate told of one checkpoint archive
/// (`archive_tools` of tests/container/common.sh): both read it without error and checkpointctl names the
/// container. A root without checkpointctl (trixie's runtimes root) says so loudly; the forky root must have it.
fn assert_archive_tools(scratch: &Scratch, prefix: &str, container: &str, suite: &str) {
    scratch.assert_step(&format!("{prefix}-ccm-inspect"), "criu-cuda-migrate inspect of the archive");
    scratch.assert_step(&format!("{prefix}-ccm-inspect-json"), "criu-cuda-migrate --json inspect of the archive");
    let json = scratch.read(&format!("{prefix}-ccm-inspect-json.out"));
    assert!(
        json.contains("\"has_inventory\": true")
            && json.contains("\"needs\"")
            && json.contains("\"criu_version_matters\": false"),
        "criu-cuda-migrate --json inspect of the {prefix} archive: {json}"
    );
    if scratch.path().join(format!("{prefix}-checkpointctl.absent")).exists() {
        assert_ne!(suite, "forky", "the forky runtimes root lacks checkpointctl (tests/criu-root.sh CRI_PACKAGES)");
        loud(&format!("NOTE: no checkpointctl in the {suite} runtimes root: the {prefix} archive was read by criu-cuda-migrate only"));
        return;
    }
    for cmd in ["show", "inspect"] {
        let step = format!("{prefix}-checkpointctl-{cmd}");
        scratch.assert_step(&step, &format!("checkpointctl {cmd} of the {prefix} archive"));
        let out = scratch.read(&format!("{step}.out"));
        assert!(out.contains(container), "checkpointctl {cmd} does not name the container {container}: {out}");
    }
}

/// The forky root for a CRI test, or `None` after a loud skip: trixie's containerd 1.7 has no CRI
/// CheckpointContainer (containerd 2.0+), and tests/run-all.sh's forky pass runs the test on containerd 2.1.
fn cri_root_or_skip(test: &str) -> Option<CriuRoot> {
    let root = criu_root_or_skip(test)?;
    if root.suite != "forky" {
        loud(&format!(
            "SKIPPED {test} on the {} root: its containerd 1.7 has no CRI CheckpointContainer (containerd 2.0+); \
             the forky pass of tests/run-all.sh runs it on containerd 2.1",
            root.suite
        ));
        return None;
    }
    Some(root)
}

#[test]
fn podman_and_containerd_checkpoint_and_restore_containers_with_the_packaged_plugin() {
    let test = "podman_and_containerd_checkpoint_and_restore_containers_with_the_packaged_plugin";
    let _one = ONE_FLOW.lock().unwrap_or_else(|p| p.into_inner());
    let Some(root) = criu_root_or_skip(test) else {
        return;
    };
    let deb = deb();
    let copy = RootCopy::of(&root, RootKind::Runtimes);
    let scratch =
        Scratch { dir: tempfile::Builder::new().prefix("ccm-runtime-test-").tempdir().expect("scratch directory") };
    fs::copy(deb, scratch.path().join("package.deb")).expect("copy of the package");
    let s = scratch.path().to_str().expect("UTF-8 scratch path");
    let flow = |name: &str| repo_root().join("tests/container").join(name).to_str().expect("UTF-8 path").to_string();
    let script = format!("bash {} {s}; bash {} {s}", flow("podman-flow.sh"), flow("containerd-flow.sh"));
    let copy_path = copy.path();
    let runner = root.run(
        &[scratch.path()],
        &["bash", "-c", &script],
        &[("CCM_TRIXIE_ROOT", copy_path.to_str().expect("UTF-8 root path"))],
    );
    assert!(runner.status.success(), "the runtime flows failed to run: {}", describe_output(&runner));

    scratch.assert_step("install", "dpkg -i of the package");
    scratch.assert_step("image", "podman import of the busybox image");
    let hybrid = scratch.read("hybrid").trim() == "1";
    let adjustments = scratch.read("host-adjustments.txt");
    assert_eq!(
        hybrid,
        !adjustments.is_empty(),
        "host adjustments must be made on hybrid cgroup hosts only: {adjustments}"
    );

    // Podman + runc, the plugin from /etc/criu/runc.conf alone.
    assert!(
        scratch.read("runc.conf").lines().next().is_some_and(|l| l.starts_with("libdir ")),
        "runc.conf lacks libdir"
    );
    scratch.assert_step("runc-run", "podman run --runtime runc");
    scratch.assert_step("runc-checkpoint-leave-running", "podman container checkpoint --leave-running --export (runc)");
    assert_eq!(
        scratch.read("runc-after-leave-running.state").trim(),
        "running",
        "--leave-running stopped the container"
    );
    scratch.assert_continues("runc-before.count", "runc-after-leave-running.count", "podman/runc --leave-running");
    let leave_running = scratch.settings("runc-leave-running-dump.log");
    // podman runs runc with an environment of its own: neither podman's environment (CRIU_CUDA_MIGRATE_MODE was
    // set there) nor conmon_env_vars reach a checkpoint, so the plugin cannot know --leave-running and plays safe.
    assert!(
        leave_running.contains("mode strict") && leave_running.contains("leave-running unknown"),
        "a podman checkpoint's CRIU got settings from somewhere (the user guide says none arrive): {leave_running}"
    );
    scratch.assert_step("runc-checkpoint", "podman container checkpoint --export (runc)");
    assert_eq!(scratch.read("runc-after-checkpoint.state").trim(), "exited", "checkpoint --export left it running");
    scratch.settings("runc-dump.log");
    assert_archive_tools(&scratch, "runc", "ccm-runc", &root.suite);
    scratch.assert_step("runc-rm", "podman rm after the checkpoint");
    scratch.assert_step("runc-restore", "podman container restore --import (runc)");
    assert_eq!(scratch.read("runc-after-restore.state").trim(), "running", "the restored container does not run");
    scratch.assert_continues("runc-checkpointed-count", "runc-after-restore.count", "podman/runc restore --import");
    let restore = scratch.settings("runc-restore.log");
    assert!(
        restore
            .contains("device map GPU-aaaaaaaa-0000-0000-0000-000000000000=GPU-bbbbbbbb-0000-0000-0000-000000000000")
            && restore.contains("mode permissive"),
        "the CONTAINERS_CONF_OVERRIDE file's conmon_env_vars did not reach the plugin at restore: {restore}"
    );
    let restore_log = scratch.read("runc-restore.log");
    assert!(restore_log.contains("no identity images: no CUDA process to restore"), "{restore_log}");
    assert!(
        !restore_log.contains(&format!("{LOG_PREFIX}Error")),
        "the plugin logged an error in a plain container's restore"
    );

    // Podman + crun, the plugin from /etc/criu/crun.conf (crun >= 1.26 with libcriu >= 4.2: forky) or
    // /etc/criu/default.conf (crun 1.21 with libcriu 4.1: trixie).
    let crun_conf = scratch.read("crun-conf");
    let with_crun_conf = crun_conf.starts_with("1 ");
    let conf_file = if with_crun_conf { "crun.conf" } else { "default.conf" };
    assert!(
        scratch.read(conf_file).lines().next().is_some_and(|l| l.starts_with("libdir ")),
        "{conf_file} lacks libdir ({crun_conf})"
    );
    if root.suite == "forky" {
        assert!(with_crun_conf, "forky's crun and libcriu must take crun.conf: {crun_conf}");
    }
    scratch.assert_step("crun-run", "podman run --runtime crun");
    scratch.assert_step("crun-checkpoint", "podman container checkpoint --export (crun)");
    scratch.settings("crun-dump.log");
    let crun_dump = scratch.read("crun-dump.log");
    assert!(crun_dump.contains("is not a CUDA process; leaving it to CRIU"), "{crun_dump}");
    if hybrid && !with_crun_conf {
        let why = scratch.read("crun-restore.skipped");
        assert!(why.contains("hybrid"), "on a hybrid host the crun restore must be skipped with a reason: {why:?}");
        loud(&format!("NOTE: podman/crun restore --import not run on this hybrid cgroup v1 host: {why}"));
    } else {
        scratch.assert_step("crun-restore", "podman container restore --import (crun)");
        scratch.assert_continues("crun-checkpointed-count", "crun-after-restore.count", "podman/crun restore --import");
        scratch.settings("crun-restore.log");
    }

    // containerd + runc shim, the plugin from runc.conf, its settings from containerd's environment.
    scratch.assert_step("ctrd-version", "containerd start");
    scratch.assert_step("ctrd-image", "ctr images import");
    scratch.assert_step("ctrd-run", "ctr run");
    scratch.assert_step("ctrd-checkpoint-workpath", "ctr task checkpoint --image-path --work-path");
    scratch.assert_continues(
        "ctrd-before.count",
        "ctrd-after-checkpoint.count",
        "containerd checkpoint (task keeps running)",
    );
    let ctrd_dump = scratch.settings("ctrd-dump.log");
    assert!(
        ctrd_dump.contains("usable GPUs 0") && ctrd_dump.contains("mode permissive"),
        "containerd's service environment did not reach the plugin at dump: {ctrd_dump}"
    );
    scratch.assert_step("ctrd-checkpoint", "ctr containers checkpoint --task");
    scratch.assert_step("ctrd-restore", "ctr containers restore --live");
    scratch.assert_continues("ctrd-checkpointed.count", "ctrd-after-restore.count", "containerd restore --live");
    let ctrd_restore = scratch.settings("ctrd-restore.log");
    assert!(
        ctrd_restore.contains("usable GPUs 0") && ctrd_restore.contains("mode permissive"),
        "containerd's service environment did not reach the plugin at restore: {ctrd_restore}"
    );
}

/// The kubelet's checkpoint (`POST /checkpoint/{ns}/{pod}/{container}`) is CRI `CheckpointContainer`; Kubernetes
/// users restore by creating a container from the checkpoint archive. Both through CRI against containerd 2.1
/// (forky) with the packaged plugin loaded from `runc.conf` (tests/container/cri-flow.sh, its CRI client
/// tests/container/cri_client.py). containerd 1.7 (trixie) has no CRI checkpoint: there it is skipped loudly, and
/// tests/run-all.sh's forky pass runs it.
#[test]
fn containerd_cri_checkpoint_container_and_restore_through_cri_with_the_packaged_plugin() {
    let test = "containerd_cri_checkpoint_container_and_restore_through_cri_with_the_packaged_plugin";
    let _one = ONE_FLOW.lock().unwrap_or_else(|p| p.into_inner());
    let Some(root) = cri_root_or_skip(test) else {
        return;
    };
    let deb = deb();
    let copy = RootCopy::of(&root, RootKind::Runtimes);
    let scratch =
        Scratch { dir: tempfile::Builder::new().prefix("ccm-cri-test-").tempdir().expect("scratch directory") };
    fs::copy(deb, scratch.path().join("package.deb")).expect("copy of the package");
    let s = scratch.path().to_str().expect("UTF-8 scratch path");
    let flow = repo_root().join("tests/container/cri-flow.sh");
    let copy_path = copy.path();
    let runner = root.run(
        &[scratch.path()],
        &["bash", flow.to_str().expect("UTF-8 path"), s],
        &[("CCM_TRIXIE_ROOT", copy_path.to_str().expect("UTF-8 root path"))],
    );
    assert!(runner.status.success(), "the CRI flow failed to run: {}", describe_output(&runner));

    scratch.assert_step("cri-install", "dpkg -i of the package");
    assert!(
        scratch.read("cri-runc.conf").lines().next().is_some_and(|l| l.starts_with("libdir ")),
        "runc.conf lacks libdir"
    );
    for (step, what) in [
        ("cri-version", "containerd 2.1 with CRI: Version"),
        ("cri-image", "ctr images import (busybox)"),
        ("cri-pause-image", "ctr images import (the sandbox image)"),
        ("cri-tag", "ctr images tag (registry name)"),
        ("cri-push", "ctr images push to the loopback registry"),
        ("cri-pull", "CRI PullImage"),
        ("cri-runp", "CRI RunPodSandbox"),
        ("cri-create", "CRI CreateContainer"),
        ("cri-start", "CRI StartContainer"),
        ("cri-checkpoint", "CRI CheckpointContainer (the kubelet's checkpoint)"),
    ] {
        scratch.assert_step(step, what);
    }
    // The kubelet's checkpoint leaves the container running.
    assert_eq!(
        scratch.read("cri-after-checkpoint.state").trim(),
        "CONTAINER_RUNNING",
        "CheckpointContainer stopped it"
    );
    scratch.assert_continues("cri-before.count", "cri-after-checkpoint.count", "CRI CheckpointContainer");
    let archive = scratch.read("cri-archive.list");
    for entry in ["checkpoint/inventory.img", "checkpoint/pstree.img", "config.dump", "spec.dump", "dump.log"] {
        assert!(archive.lines().any(|l| l.trim_start_matches("./") == entry), "the archive lacks {entry}: {archive}");
    }
    let dump = scratch.settings("cri-dump.log");
    assert!(
        dump.contains("usable GPUs 0") && dump.contains("mode permissive") && dump.contains("leave-running unknown"),
        "containerd's service environment did not reach the plugin in CheckpointContainer's CRIU: {dump}"
    );
    assert!(scratch.read("cri-dump.log").contains("is not a CUDA process; leaving it to CRIU"));

    // The restore Kubernetes users do: CreateContainer from the archive, StartContainer restores it.
    scratch.assert_step("cri-stop", "CRI StopContainer");
    scratch.assert_step("cri-rm", "CRI RemoveContainer");
    scratch.assert_step("cri-restore-create", "CRI CreateContainer with the checkpoint archive as the image");
    scratch.assert_step("cri-restore-start", "CRI StartContainer of the container created from the checkpoint");
    assert_eq!(scratch.read("cri-after-restore.state").trim(), "CONTAINER_RUNNING", "the restored container");
    scratch.assert_continues("cri-checkpointed.count", "cri-after-restore.count", "CRI restore from the archive");
    let restore = scratch.settings("cri-restore.log");
    assert!(
        restore.contains("usable GPUs 0") && restore.contains("mode permissive"),
        "containerd's service environment did not reach the plugin at the CRI restore: {restore}"
    );
    // checkpointctl and criu-cuda-migrate read the CheckpointContainer archive.
    assert_archive_tools(&scratch, "cri", "counter", &root.suite);

    // The restore from a checkpoint image, as the Kubernetes documentation builds it (buildah) and containerd 2.1
    // recognizes it (the annotation org.criu.checkpoint.container.name on its manifest).
    for (step, what) in [
        ("cri-image-from", "buildah from scratch"),
        ("cri-image-add", "buildah add of the checkpoint archive"),
        ("cri-image-config", "buildah config --annotation (the checkpoint name for CRI-O and containerd)"),
        ("cri-image-commit", "buildah commit of the checkpoint image"),
        ("cri-image-layout", "buildah push to an OCI layout directory"),
        ("cri-image-oci-archive", "buildah push to an oci-archive"),
        ("cri-image-ccm-inspect", "criu-cuda-migrate inspect of the OCI layout"),
        ("cri-image-ccm-inspect-json", "criu-cuda-migrate --json inspect of the oci-archive"),
        ("cri-image-ccm-preflight-json", "criu-cuda-migrate --json preflight of the OCI layout"),
        ("cri-image-push", "buildah push to the loopback registry"),
        ("cri-image-pull", "CRI PullImage of the checkpoint image"),
    ] {
        scratch.assert_step(step, what);
    }
    let inspect = scratch.read("cri-image-ccm-inspect.out");
    for needle in [
        "checkpoint image (OCI image layout",
        "every digest verified",
        "containerd 2.x restores from it (annotation org.criu.checkpoint.container.name)",
        "(its layer): checkpoint archive",
        "dumped by CRIU 4.2",
    ] {
        assert!(
            inspect.contains(needle),
            "criu-cuda-migrate inspect of the checkpoint image lacks {needle:?}: {inspect}"
        );
    }
    let json = scratch.read("cri-image-ccm-inspect-json.out");
    for needle in ["\"format\": \"oci-archive\"", "\"checkpoint_name_containerd\": \"counter\"", "\"gpu_count\": 0"] {
        assert!(json.contains(needle), "criu-cuda-migrate --json inspect of the oci-archive lacks {needle}: {json}");
    }
    let preflight = scratch.read("cri-image-ccm-preflight-json.out");
    assert!(preflight.contains("\"ok\":true") && preflight.contains("\"needs\""), "preflight --json: {preflight}");
    scratch.assert_step("cri-image-restore-create", "CRI CreateContainer with the checkpoint image");
    scratch.assert_step("cri-image-restore-start", "CRI StartContainer of the container created from the image");
    assert_eq!(scratch.read("cri-after-image-restore.state").trim(), "CONTAINER_RUNNING", "restored from the image");
    scratch.assert_continues("cri-checkpointed.count", "cri-after-image-restore.count", "CRI restore from the image");
    let restore = scratch.settings("cri-image-restore.log");
    assert!(restore.contains("usable GPUs 0"), "the plugin at the restore from the image: {restore}");
    // With CRI-O's annotation only (the Kubernetes documentation's buildah line), containerd 2.1 takes the image for
    // an ordinary one, as criu-cuda-migrate inspect says: no checkpoint found, and CreateContainer of an image with
    // no command fails.
    for (step, what) in [
        ("cri-crio-image-from", "buildah from scratch (CRI-O's annotation only)"),
        ("cri-crio-image-add", "buildah add of the checkpoint archive (CRI-O's annotation only)"),
        ("cri-crio-image-config", "buildah config with CRI-O's annotation only"),
        ("cri-crio-image-commit", "buildah commit (CRI-O's annotation only)"),
        ("cri-crio-image-layout", "buildah push to an OCI layout (CRI-O's annotation only)"),
        ("cri-crio-image-ccm-inspect", "criu-cuda-migrate inspect of the image with CRI-O's annotation only"),
        ("cri-crio-image-push", "buildah push to the loopback registry (CRI-O's annotation only)"),
        ("cri-crio-image-pull", "CRI PullImage (CRI-O's annotation only)"),
    ] {
        scratch.assert_step(step, what);
    }
    let inspect = scratch.read("cri-crio-image-ccm-inspect.out");
    assert!(
        inspect.contains("containerd 2.x takes it for a plain image, not a checkpoint"),
        "criu-cuda-migrate inspect of the image with CRI-O's annotation only: {inspect}"
    );
    let found = scratch.read("cri-found-checkpoint.txt");
    assert!(
        found.contains("/ccm-checkpoint:1") && !found.contains("ccm-checkpoint-crio"),
        "containerd's checkpoint detection: {found}"
    );
    assert_ne!(
        scratch.rc("cri-crio-image-create"),
        Some(0),
        "containerd created a container from the CRI-O-only image"
    );
    let err = scratch.read("cri-crio-image-create.err");
    assert!(err.contains("no command specified"), "CreateContainer of the CRI-O-only image: {err}");

    let adjustments = scratch.read("cri-host-adjustments.txt");
    if !adjustments.is_empty() {
        loud(&format!("NOTE: CRI flow host adjustment: {}", adjustments.trim()));
    }
}

/// The simulated stack of this build (the libcuda and NVML test doubles, the sample workload): cargo's target dir
/// of this test binary (`target/<profile>/deps/..`).
fn sim_binaries() -> Vec<PathBuf> {
    let exe = std::env::current_exe().expect("path of the test binary");
    let bin = exe.parent().and_then(Path::parent).expect("target/<profile>/deps/").to_path_buf();
    ["libcuda_test_double.so", "libnvml_test_double.so", "ccm-sample-workload"]
        .iter()
        .map(|f| {
            let path = bin.join(f);
            assert!(
                path.is_file(),
                "{} is missing: run `cargo build --workspace` first (tests/run-all.sh does)",
                path.display()
            );
            path
        })
        .collect()
}

/// A `report<k>.json` of the sample workload, whitespace removed (there is no JSON parser among this crate's
/// dev-dependencies; the report's layout is the workload's own, flat per ordinal).
struct Report {
    name: String,
    compact: String,
}

impl Report {
    fn read(scratch: &Scratch, name: &str) -> Report {
        let text = scratch.read(name);
        assert!(!text.is_empty(), "{name} is missing:\n--- flow ---\n{}", scratch.read("flow.log"));
        Report { name: name.to_string(), compact: text.split_whitespace().collect() }
    }

    fn flag(&self, key: &str) -> bool {
        self.compact.contains(&format!("\"{key}\":true"))
    }

    /// The UUID CUDA answered for ordinal 0.
    fn ordinal0_uuid(&self) -> String {
        let at = self.compact.find("\"ordinal\":0,").unwrap_or_else(|| panic!("{}: no ordinal 0", self.name));
        let rest = &self.compact[at..];
        let object = &rest[..rest.find('}').unwrap_or(rest.len())];
        object
            .split_once("\"uuid\":\"")
            .and_then(|(_, u)| u.split_once('"'))
            .map(|(u, _)| u.to_string())
            .unwrap_or_else(|| panic!("{}: ordinal 0 has no uuid: {object}", self.name))
    }

    /// The object of ordinal `k` (flat: its only nested value is a list of strings).
    fn ordinal(&self, k: usize) -> &str {
        let at = self
            .compact
            .find(&format!("{{\"ordinal\":{k},"))
            .unwrap_or_else(|| panic!("{}: no ordinal {k}: {}", self.name, self.compact));
        let rest = &self.compact[at..];
        &rest[..rest.find('}').map_or(rest.len(), |e| e + 1)]
    }

    /// The string `key` of ordinal `k` (`null` reads as empty).
    fn ordinal_text(&self, k: usize, key: &str) -> String {
        let object = self.ordinal(k);
        object
            .split_once(&format!("\"{key}\":\""))
            .and_then(|(_, v)| v.split_once('"'))
            .map(|(v, _)| v.to_string())
            .unwrap_or_default()
    }

    /// Identity agrees (CUDA, its PCI attributes and NVML name the same GPU) and the device data is intact.
    fn assert_sound(&self, case: &str) {
        assert!(
            self.flag("all_agree") && self.flag("all_consistent") && self.flag("all_data_ok"),
            "{case}: {} reports a disagreeing identity or damaged data: {}",
            self.name,
            self.compact
        );
    }
}

/// `before host_pid=N key=K`, `after host_pid=N key=K`, `index proc-K -> reg-ID` lines of `NAME-keys.txt`.
fn key_line<'a>(keys: &'a str, tag: &str) -> (&'a str, &'a str) {
    let line = keys.lines().find(|l| l.starts_with(tag)).unwrap_or_else(|| panic!("no `{tag}` line in {keys:?}"));
    let field = |f: &str| {
        line.split_whitespace().find_map(|w| w.strip_prefix(f)).unwrap_or_else(|| panic!("no {f} in {line:?}"))
    };
    (field("host_pid="), field("key="))
}

#[test]
fn runc_checkpoints_and_restores_a_cuda_container_on_the_test_doubles() {
    let test = "runc_checkpoints_and_restores_a_cuda_container_on_the_test_doubles";
    let _one = ONE_FLOW.lock().unwrap_or_else(|p| p.into_inner());
    let Some(root) = criu_root_or_skip(test) else {
        return;
    };
    let binaries = sim_binaries();
    let deb = deb();
    let copy = RootCopy::of(&root, RootKind::Runtimes);
    let scratch =
        Scratch { dir: tempfile::Builder::new().prefix("ccm-runc-cuda-test-").tempdir().expect("scratch directory") };
    fs::copy(deb, scratch.path().join("package.deb")).expect("copy of the package");
    let sim_bin = scratch.path().join("sim-bin");
    fs::create_dir(&sim_bin).expect("sim-bin directory");
    for b in &binaries {
        fs::copy(b, sim_bin.join(b.file_name().expect("file name"))).expect("copy of a test double");
    }
    let s = scratch.path().to_str().expect("UTF-8 scratch path");
    let flow = repo_root().join("tests/container/runc-cuda-flow.sh");
    let copy_path = copy.path();
    let runner = root.run(
        &[scratch.path()],
        &["bash", flow.to_str().expect("UTF-8 path"), s],
        &[("CCM_TRIXIE_ROOT", copy_path.to_str().expect("UTF-8 root path"))],
    );
    assert!(runner.status.success(), "the runc CUDA flow failed to run: {}", describe_output(&runner));

    scratch.assert_step("install", "dpkg -i of the package");
    // The plugin from /etc/criu/runc.conf alone (plus, on a hybrid cgroup v1 host, what podman-flow.sh adds too).
    let hybrid = scratch.read("hybrid").trim() == "1";
    let conf = scratch.read("runc.conf");
    let mut lines = conf.lines();
    assert!(lines.next().is_some_and(|l| l.starts_with("libdir ")), "runc.conf lacks libdir: {conf:?}");
    let rest: Vec<&str> = lines.collect();
    assert_eq!(rest, if hybrid { vec!["manage-cgroups=ignore"] } else { vec![] }, "runc.conf: {conf:?}");
    let gpus = scratch.read("gpus.txt");
    let (g0, g1) = gpus.trim().split_once(' ').expect("gpus.txt names the two simulated GPUs");

    for (case, restored_on) in [("same", g0), ("move", g1), ("given", g1)] {
        let fail_context = || {
            format!(
                "\n--- {case}-restore.err (the container's output after the restore) ---\n{}\n--- {case}-restore.log (plugin lines) ---\n{}",
                scratch.read(&format!("{case}-restore.err")),
                scratch
                    .read(&format!("{case}-restore.log"))
                    .lines()
                    .filter(|l| l.contains(LOG_PREFIX) || l.contains("Error"))
                    .collect::<Vec<_>>()
                    .join("\n")
            )
        };
        scratch.assert_step(&format!("{case}-run"), "runc run of the CUDA container");
        assert_eq!(
            scratch.rc(&format!("{case}-ready")),
            Some(0),
            "{case}: the workload did not get ready: {}",
            scratch.read(&format!("{case}-run.err"))
        );
        assert_eq!(scratch.rc(&format!("{case}-round1")), Some(0), "{case}: no report 1");
        let before = Report::read(&scratch, &format!("{case}-report1.json"));
        before.assert_sound(case);
        assert_eq!(before.ordinal0_uuid(), g0, "{case}: the container started on the wrong GPU");

        scratch.assert_step(&format!("{case}-checkpoint"), "runc checkpoint of the CUDA container");
        let dump = scratch.read(&format!("{case}-dump.log"));
        assert!(dump.contains(&init_line("dump")), "{case}: plugin not loaded at dump:\n{dump}");
        assert!(
            dump.contains("cuCheckpointProcessCheckpoint"),
            "{case}: the dump did not checkpoint the workload:\n{dump}"
        );
        let images = scratch.read(&format!("{case}-images.txt"));
        assert!(images.lines().any(|l| l.starts_with("cuda-migrate-")), "{case}: no identity image in {images:?}");

        assert_eq!(scratch.rc(&format!("{case}-restore")), Some(0), "{case}: runc restore failed{}", fail_context());
        let restore = scratch.settings(&format!("{case}-restore.log"));
        if case == "move" {
            assert!(
                restore.contains(&format!("device map {g0}={g1}")),
                "{case}: runc's environment did not reach the plugin: {restore}"
            );
        }
        let restore_log = scratch.read(&format!("{case}-restore.log"));
        if case == "given" {
            // No map, no usable-GPU setting: the GPUs the restoring runtime's spec gives the container.
            assert!(
                restore.contains("device map automatic, usable GPUs all"),
                "{case}: the plugin was given a setting: {restore}"
            );
            assert!(
                restore_log.contains(&format!("usable GPUs: [{g1}], what the restoring runtime's spec"))
                    && restore_log.contains("linux.devices /dev/nvidia1 (minor 1)"),
                "{case}: the usable set did not come from the restore bundle's spec{}",
                fail_context()
            );
            // CRIU restored the dumped /dev (nvidia0); the plugin gave it the new GPU's node instead.
            assert!(
                restore_log.contains("container /dev: created /dev/nvidia1")
                    && restore_log.contains("container /dev: removed /dev/nvidia0"),
                "{case}: the restored /dev was not fixed{}",
                fail_context()
            );
            let dev = scratch.read(&format!("{case}-dev.txt"));
            let names: Vec<&str> = dev.split_whitespace().collect();
            assert!(
                names.contains(&"nvidia1") && !names.contains(&"nvidia0"),
                "{case}: the restored container's /dev: {dev}"
            );
        }
        assert!(
            restore_log.contains("cuCheckpointProcessUnlock") && restore_log.contains("RUNNING"),
            "{case}: the plugin did not restore and unlock the workload{}",
            fail_context()
        );
        assert_eq!(
            scratch.rc(&format!("{case}-round2")),
            Some(0),
            "{case}: no report after the restore{}",
            fail_context()
        );
        let after = Report::read(&scratch, &format!("{case}-report2.json"));
        after.assert_sound(case);
        assert_eq!(after.ordinal0_uuid(), restored_on, "{case}: ordinal 0 after the restore{}", fail_context());

        // The restored container: a new host pid, the same namespace pid 1, found by the doubles through its key.
        let keys = scratch.read(&format!("{case}-keys.txt"));
        let (pid_before, key_before) = key_line(&keys, "before ");
        let (pid_after, key_after) = key_line(&keys, "after ");
        assert!(key_before.ends_with("-1") && key_after.ends_with("-1"), "{case}: not pid 1 of its namespace: {keys}");
        assert_ne!(pid_before, pid_after, "{case}: the restored container kept its host pid: {keys}");
        if key_before == key_after {
            loud(&format!(
                "NOTE: {case}: the restored container's pid namespace reused the inode of the dumped one ({key_after})"
            ));
        }
        assert!(
            keys.contains(&format!("index proc-{key_after} -> reg-")),
            "{case}: not indexed under {key_after}: {keys}"
        );

        // Round 3 ends the workload normally: its registration goes with it.
        assert_eq!(scratch.rc(&format!("{case}-round3")), Some(0), "{case}: no report 3");
        let left = scratch.read(&format!("{case}-left.txt"));
        assert!(
            !left.lines().any(|l| l.ends_with(key_after) || l.ends_with(key_before)),
            "{case}: the workload's registration outlived it: {left}"
        );
    }
    // Hostile /dev layouts, each moved from G0 to G1 by the restore bundle: nothing on the host side changes, and
    // the restore log says what was left alone and why.
    let mut ran = Vec::new();
    for (h, said) in [
        ("hostbind", "its /dev is a file system that the host also has mounted"),
        ("devlink", "its /dev is a symbolic link"),
        ("plaindev", "its /dev is no mount of its own"),
        ("nodelink", "container /dev/nvidia0 is a symbolic link, not a GPU node: left alone"),
    ] {
        let case = format!("hostile-{h}");
        let log = scratch.read(&format!("{case}-restore.log"));
        let plugin_lines =
            || log.lines().filter(|l| l.contains(LOG_PREFIX) || l.contains("Error")).collect::<Vec<_>>().join("\n");
        // The first step that failed, the only one to report: the flow stops there (no checkpoint after a failed run).
        let failed = [
            ("run", "runc run of a container with this /dev fails, so there is nothing to checkpoint"),
            ("checkpoint", "runc checkpoint of a container with this /dev fails before the plugin has any say"),
        ]
        .into_iter()
        .find(|(step, _)| scratch.rc(&format!("{case}-{step}")) != Some(0));
        if let Some((step, what)) = failed {
            let criu_log = if step == "checkpoint" { scratch.read(&format!("{case}-dump.log")) } else { String::new() };
            let why = step_failure(&scratch.read(&format!("{case}-{step}.err")), &criu_log);
            loud(&format!("SKIPPED {case}: {what}: {why}"));
            continue;
        }
        let before = scratch.read(&format!("{h}-sentinel-before.txt"));
        let after = scratch.read(&format!("{case}-sentinel-after.txt"));
        assert!(!before.is_empty(), "{case}: no sentinel was made");
        assert_eq!(scratch.rc(&format!("{case}-restore")), Some(0), "{case}: runc restore failed:\n{}", plugin_lines());
        assert_eq!(before, after, "{case}: a host-side file changed:\n{}", plugin_lines());
        assert!(log.contains(said), "{case}: the restore log does not say {said:?}:\n{}", plugin_lines());
        if h == "nodelink" {
            // The new node comes from the host node or the defaults, never from the link's target (4751 1234:4321).
            let node = scratch.read(&format!("{case}-node1.txt"));
            assert!(log.contains("container /dev: created /dev/nvidia1"), "{case}:\n{}", plugin_lines());
            assert!(
                node.contains("character special file") && !node.contains("4751") && !node.contains("1234:4321"),
                "{case}: {node}"
            );
        } else {
            assert!(log.contains("left unchanged. The container sees"), "{case}:\n{}", plugin_lines());
            assert!(!log.contains("container /dev: created"), "{case}: a foreign /dev was edited:\n{}", plugin_lines());
        }
        ran.push(h);
    }
    assert!(
        ran.contains(&"nodelink") && ran.contains(&"plaindev"),
        "the hostile /dev cases that runc can run did not run: {ran:?}"
    );
}

/// A scratch directory holding the package and the simulated stack of this build (`sim-bin/`), for the CUDA flows on
/// the test doubles.
fn scratch_with_sim(prefix: &str) -> Scratch {
    let binaries = sim_binaries();
    let deb = deb();
    let scratch = Scratch { dir: tempfile::Builder::new().prefix(prefix).tempdir().expect("scratch directory") };
    fs::copy(deb, scratch.path().join("package.deb")).expect("copy of the package");
    let sim_bin = scratch.path().join("sim-bin");
    fs::create_dir(&sim_bin).expect("sim-bin directory");
    for b in &binaries {
        fs::copy(b, sim_bin.join(b.file_name().expect("file name"))).expect("copy of a test double");
    }
    scratch
}

/// Why a runc step failed, in the words of whoever refused: CRIU's first error line in its log (runc's own message
/// only points at that log), else runc's last line that says anything (its `msg="..."` where it logs one).
fn step_failure(runc_err: &str, criu_log: &str) -> String {
    let said = |l: &&str| !l.trim().is_empty();
    let criu = criu_log.lines().find(|l| l.contains("Error (")).map(|l| format!("CRIU: {}", l.trim()));
    let runc = runc_err.lines().rfind(said).map(|l| {
        let msg = l.split_once("msg=\"").map_or(l, |(_, m)| m.strip_suffix('"').unwrap_or(m));
        format!("runc: {}", msg.trim())
    });
    match (criu, runc) {
        (Some(c), Some(r)) => format!("{c} ({r})"),
        (Some(one), None) | (None, Some(one)) => one,
        (None, None) => "runc printed nothing and CRIU logged no error".to_string(),
    }
}

/// The plugin's and CRIU's lines of a log, for failure messages.
fn plugin_lines(text: &str) -> String {
    text.lines().filter(|l| l.contains(LOG_PREFIX) || l.contains("Error")).collect::<Vec<_>>().join("\n")
}

/// Podman with a CDI GPU on the test doubles (tests/container/podman-cdi-flow.sh, issue 25): `podman run --device
/// nvidia.com/gpu=0` of the sample workload, `checkpoint --leave-running --export`, `checkpoint --export`, a restore
/// the plugin's preflight refuses (archive byte-identical, no workload left), `restore --import` onto the GPU the
/// restored spec gives, a restore after the node's CDI spec changed (Podman keeps the checkpoint's spec: the plugin
/// follows what the restored spec says), and the move onto the other GPU through the usable set given to conmon, with
/// the restored `/dev` fixed. With runc (runc.conf) on both suites, and with crun (crun.conf on forky; on trixie
/// default.conf, and on a hybrid cgroup v1 host only the checkpoints, skipped loudly as in the busybox flow).
#[test]
fn podman_with_a_cdi_gpu_checkpoints_and_restores_a_cuda_container_on_the_test_doubles() {
    let test = "podman_with_a_cdi_gpu_checkpoints_and_restores_a_cuda_container_on_the_test_doubles";
    let _one = ONE_FLOW.lock().unwrap_or_else(|p| p.into_inner());
    let Some(root) = criu_root_or_skip(test) else {
        return;
    };
    let copy = RootCopy::of(&root, RootKind::Runtimes);
    let scratch = scratch_with_sim("ccm-podman-cdi-test-");
    let s = scratch.path().to_str().expect("UTF-8 scratch path");
    let flow = repo_root().join("tests/container/podman-cdi-flow.sh");
    let flow = flow.to_str().expect("UTF-8 path");
    let script = format!("bash {flow} {s} runc; bash {flow} {s} crun");
    let copy_path = copy.path();
    let runner = root.run(
        &[scratch.path()],
        &["bash", "-c", &script],
        &[("CCM_TRIXIE_ROOT", copy_path.to_str().expect("UTF-8 root path"))],
    );
    assert!(runner.status.success(), "the Podman CDI flows failed to run: {}", describe_output(&runner));

    for rt in ["runc", "crun"] {
        let p = format!("pcdi-{rt}");
        let f = |name: &str| format!("{p}-{name}");
        let gpus = scratch.read(&f("gpus.txt"));
        let (g0, g1) = gpus.trim().split_once(' ').expect("gpus.txt names the two simulated GPUs");
        scratch.assert_step(&f("install"), "dpkg -i of the package");
        scratch.assert_step(&f("image"), "podman import of the CUDA image");

        // The plugin from the file this runtime's CRIU reads.
        let conf_name = scratch.read(&f("conf-name")).trim().to_string();
        let expected_conf = match (rt, root.suite.as_str()) {
            ("runc", _) => "runc.conf",
            ("crun", "forky") => "crun.conf",
            _ => "default.conf",
        };
        assert_eq!(conf_name, expected_conf, "{rt}: the libdir line went into the wrong file");
        assert!(
            scratch.read(&f("criu.conf")).lines().next().is_some_and(|l| l.starts_with("libdir ")),
            "{rt}: {conf_name} lacks libdir"
        );

        // CDI gave the container G0's node, so the doubles showed it G0.
        scratch.assert_step(&f("run"), &format!("podman run --device nvidia.com/gpu=0 (runtime {rt})"));
        assert_eq!(
            scratch.rc(&f("ready")),
            Some(0),
            "{rt}: the workload did not get ready: {}",
            scratch.read(&f("ready.err"))
        );
        assert_eq!(
            scratch.read(&f("run-spec-nodes.txt")).trim(),
            "/dev/nvidia0",
            "{rt}: CDI did not put /dev/nvidia0 into the container's linux.devices"
        );
        assert_eq!(scratch.rc(&f("round1")), Some(0), "{rt}: no report 1");
        let r1 = Report::read(&scratch, &f("report1.json"));
        r1.assert_sound(rt);
        assert_eq!(r1.ordinal0_uuid(), g0, "{rt}: the container started on the wrong GPU");

        // --leave-running: the container runs on, the plugin rolled its CUDA state back.
        scratch
            .assert_step(&f("lr-checkpoint"), &format!("podman container checkpoint --leave-running --export ({rt})"));
        assert_eq!(scratch.read(&f("lr-after-checkpoint.state")).trim(), "running", "{rt}: --leave-running stopped it");
        for case in ["lr", "export"] {
            let dump = scratch.read(&f(&format!("{case}-dump.log")));
            assert!(dump.contains(&init_line("dump")), "{rt} {case}: plugin not loaded at dump:\n{dump}");
            assert!(
                dump.contains("cuCheckpointProcessCheckpoint"),
                "{rt} {case}: the dump did not checkpoint the workload:\n{}",
                plugin_lines(&dump)
            );
            let list = scratch.read(&f(&format!("{case}-archive.list")));
            assert!(
                list.lines().any(|l| l.trim_start_matches("./").starts_with("checkpoint/cuda-migrate-")),
                "{rt} {case}: the exported archive holds no identity image: {list}"
            );
        }
        assert_eq!(scratch.rc(&f("round2")), Some(0), "{rt}: no report after --leave-running");
        let r2 = Report::read(&scratch, &f("report2.json"));
        r2.assert_sound(&format!("{rt} after --leave-running"));
        assert_eq!(r2.ordinal0_uuid(), g0, "{rt}: after --leave-running");
        scratch.assert_step(&f("export-checkpoint"), &format!("podman container checkpoint --export ({rt})"));
        assert_eq!(
            scratch.read(&f("export-after-checkpoint.state")).trim(),
            "exited",
            "{rt}: --export left it running"
        );
        scratch.assert_step(&f("export-rm"), "podman rm after the checkpoint");
        // checkpointctl and criu-cuda-migrate read the export with its identity image; ours names the GPU.
        assert_archive_tools(&scratch, &f("a1"), "ccm-cdi", &root.suite);
        let inspect = scratch.read(&f("a1-ccm-inspect.out"));
        assert!(
            inspect.contains("cuda:0") && inspect.contains(g0),
            "{rt}: criu-cuda-migrate inspect of the export: {inspect}"
        );

        let skipped = scratch.read(&f("restore.skipped"));
        if !skipped.is_empty() {
            assert!(
                rt == "crun" && conf_name == "default.conf" && scratch.read(&f("hybrid")).trim() == "1",
                "{rt}: restores skipped where they must run: {skipped}"
            );
            loud(&format!("SKIPPED {test}: podman/{rt} restore --import of the CDI container: {skipped}"));
            continue;
        }

        // Refused by the preflight: a usable set naming no GPU of this node. The archive is unchanged.
        assert_ne!(scratch.rc(&f("refused-restore")), Some(0), "{rt}: a restore onto an absent GPU passed");
        let refused = scratch.read(&f("refused-restore.log"));
        assert!(
            refused.contains("restore refused before anything was restored")
                && refused.contains("GPU-00000000-0000-0000-0000-00000000dead"),
            "{rt}: the refused restore's log does not name the refusal:\n{}",
            plugin_lines(&refused)
        );
        assert_eq!(
            scratch.read(&f("a1.sum-before")),
            scratch.read(&f("a1.sum-after")),
            "{rt}: the refused restore changed the archive"
        );
        assert_eq!(scratch.read(&f("refused-procs.txt")).trim(), "", "{rt}: a workload outlived the refused restore");

        // The restores. `given`: the GPU node the restored spec's linux.devices names, and the GPU that is.
        let spec_gpu = |case: &str| -> &str {
            match scratch.read(&f(&format!("{case}-spec-nodes.txt"))).trim() {
                "/dev/nvidia0" => g0,
                "/dev/nvidia1" => g1,
                other => panic!("{rt} {case}: the restored spec names GPU nodes {other:?}"),
            }
        };
        for (case, k) in [("same", 3), ("respec", 4), ("usable", 5)] {
            let log = scratch.read(&f(&format!("{case}-restore.log")));
            assert_eq!(
                scratch.rc(&f(&format!("{case}-restore"))),
                Some(0),
                "{rt} {case}: podman container restore --import failed:\n{}\n{}",
                scratch.read(&f(&format!("{case}-restore.err"))),
                plugin_lines(&log)
            );
            let settings = scratch.settings(&f(&format!("{case}-restore.log")));
            assert!(
                log.contains("cuCheckpointProcessUnlock") && log.contains("RUNNING"),
                "{rt} {case}: the plugin did not restore and unlock the workload:\n{}",
                plugin_lines(&log)
            );
            assert_eq!(scratch.rc(&f(&format!("round{k}"))), Some(0), "{rt} {case}: no report after the restore");
            let report = Report::read(&scratch, &f(&format!("report{k}.json")));
            report.assert_sound(&format!("{rt} {case}"));
            let on = report.ordinal0_uuid();
            let given = spec_gpu(case);
            if case == "usable" {
                assert!(
                    settings.contains(&format!("usable GPUs {g1}")),
                    "{rt} usable: conmon_env_vars did not reach the plugin: {settings}"
                );
                assert_eq!(on, g1, "{rt} usable: not moved onto the usable GPU:\n{}", plugin_lines(&log));
                let dev = scratch.read(&f("usable-dev.txt"));
                let names: Vec<&str> = dev.split_whitespace().collect();
                assert!(
                    names.contains(&"nvidia1") && !names.contains(&"nvidia0"),
                    "{rt} usable: the restored container's /dev: {dev}\n{}",
                    plugin_lines(&log)
                );
                if given == g0 {
                    assert!(
                        log.contains("container /dev: created /dev/nvidia1")
                            && log.contains("container /dev: removed /dev/nvidia0"),
                        "{rt} usable: the restored /dev was not fixed:\n{}",
                        plugin_lines(&log)
                    );
                }
                continue;
            }
            assert!(
                settings.contains("device map automatic, usable GPUs all"),
                "{rt} {case}: the plugin was given a setting: {settings}"
            );
            let from_spec = format!("usable GPUs: [{given}], what the restoring runtime's spec");
            if log.contains(&from_spec) {
                assert!(
                    log.contains("(linux.devices /dev/nvidia"),
                    "{rt} {case}: the usable set's source: {}",
                    plugin_lines(&log)
                );
            } else {
                panic!(
                    "{rt} {case}: the usable set did not come from the restoring runtime's spec:\n{}",
                    plugin_lines(&log)
                );
            }
            assert_eq!(
                on,
                given,
                "{rt} {case}: restored onto another GPU than its spec gives:\n{}",
                plugin_lines(&log)
            );
            if case == "respec" {
                // Another node whose CDI spec makes nvidia.com/gpu=0 another GPU: what did Podman's restore do?
                loud(&format!(
                    "NOTE: podman ({} root) restore --import after the node's CDI spec changed: the restored spec names \
                     {} ({}), and the workload came back on {on}",
                    root.suite,
                    scratch.read(&f("respec-spec-nodes.txt")).trim(),
                    if given == g0 {
                        "the checkpoint's spec.dump, CDI not resolved again"
                    } else {
                        "CDI resolved again on the restoring node"
                    }
                ));
            }
        }
        assert_eq!(scratch.rc(&f("round6")), Some(0), "{rt}: no last report");
        assert_eq!(scratch.read(&f("final.state")).trim(), "exited 0", "{rt}: the workload did not end normally");
    }
}

/// One line of `FLOW-CASE-tree.txt` (`tree_holdings` of tests/container/common.sh): a rank (`rank R
/// pid=NS host=PID comm=C workers=N`) or one of its workers (`worker R pid=NS host=PID fds=A,B maps=C`), pids as the
/// container's pid namespace numbers them.
struct TreeLine {
    kind: String,
    rank: String,
    fields: Vec<(String, String)>,
}

impl TreeLine {
    fn field(&self, key: &str) -> &str {
        self.fields.iter().find(|(k, _)| k == key).map_or("", |(_, v)| v.as_str())
    }

    /// A comma-separated field as a list (empty: none).
    fn list(&self, key: &str) -> Vec<&str> {
        self.field(key).split(',').filter(|s| !s.is_empty()).collect()
    }
}

/// The container's tree after `case` of the flow whose files start with `flow`, checked: the flow's `ranks` ranks (each known by its control directory, the
/// sample workload, `workers` workers) and every worker holding exactly `/dev/nvidiactl` and `gpu_node` open and
/// mapping exactly `mapping`. Returns the workers' pids.
fn assert_tree(
    scratch: &Scratch,
    flow: &str,
    case: &str,
    ranks: usize,
    workers: usize,
    gpu_node: &str,
    mapping: &str,
) -> Vec<String> {
    let name = format!("{flow}-{case}-tree.txt");
    let text = scratch.read(&name);
    let lines: Vec<TreeLine> = text
        .lines()
        .filter(|l| l.starts_with("rank ") || l.starts_with("worker "))
        .map(|l| {
            let mut words = l.split_whitespace();
            let kind = words.next().unwrap_or_default().to_string();
            let rank = words.next().unwrap_or_default().to_string();
            let fields = words.filter_map(|w| w.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect();
            TreeLine { kind, rank, fields }
        })
        .collect();
    let rank_lines: Vec<&TreeLine> = lines.iter().filter(|l| l.kind == "rank").collect();
    let mut seen: Vec<&str> = rank_lines.iter().map(|l| l.rank.as_str()).collect();
    seen.sort_unstable();
    let expected: Vec<String> = (0..ranks).map(|r| r.to_string()).collect();
    assert_eq!(seen, expected, "{case}: the container's ranks are not the agent's {ranks}:\n{text}");
    for r in &rank_lines {
        assert_eq!(r.field("comm"), "ccm-sample-work", "{case}: rank {} is not the sample workload:\n{text}", r.rank);
        assert_eq!(r.field("workers"), workers.to_string(), "{case}: rank {}'s workers:\n{text}", r.rank);
    }
    let worker_lines: Vec<&TreeLine> = lines.iter().filter(|l| l.kind == "worker").collect();
    assert_eq!(worker_lines.len(), ranks * workers, "{case}: the workers of the tree:\n{text}");
    let mut want_fds = vec![gpu_node, "/dev/nvidiactl"];
    want_fds.sort_unstable();
    for w in &worker_lines {
        assert_eq!(
            w.list("fds"),
            want_fds,
            "{case}: worker {} of rank {} holds other NVIDIA descriptors:\n{text}",
            w.field("pid"),
            w.rank
        );
        assert_eq!(
            w.list("maps"),
            vec![mapping],
            "{case}: worker {} of rank {} maps other NVIDIA nodes:\n{text}",
            w.field("pid"),
            w.rank
        );
    }
    let mut pids: Vec<String> = worker_lines.iter().map(|w| w.field("pid").to_string()).collect();
    pids.sort();
    pids
}

/// The plugin's claims lines of a CRIU log name every worker of `pids` (their pids in the container) with the two
/// descriptors and the mapping each holds.
fn assert_claims_name(log: &str, pids: &[String], what: &str) {
    for pid in pids {
        assert!(
            log.contains(&format!(
                "pid {pid} (ccm-sample-work): 2 GPU descriptor(s), 1 device mapping(s) inherited, no CUDA context: handled"
            )),
            "{what}: the plugin's claims do not name worker {pid}:\n{}",
            plugin_lines(log)
        );
    }
}

/// Podman with a CDI GPU and a torchrun-like tree on the test doubles (tests/container/podman-cdi-tree-flow.sh, issue
/// 46): a container given one GPU of the doubles' two (`--device nvidia.com/gpu=0`; the NVIDIA nodes are the doubles'
/// loop-device stand-ins, which a process can hold open and map) runs an agent (busybox sh) with 2 CUDA ranks, each
/// with 4 workers forked after cuInit that hold `/dev/nvidiactl` and `/dev/nvidia0` open and map `/dev/nvidia0`.
/// `checkpoint --export` of the whole tree (the plugin claims every worker; `criu-cuda-migrate inspect` of the archive
/// names them), `restore --import` on the same node: the ranks go on on G0 with sound data, every worker holds
/// `/dev/nvidia0` and `/dev/nvidiactl` again (read from the host in `/proc/PID/fd`) with an inert placeholder where it
/// mapped the GPU, the restore log's claims name every worker. Then the same archive with
/// `CRIU_CUDA_MIGRATE_USABLE_GPUS` naming G1 (conmon_env_vars): the plugin plans every worker's GPU descriptor onto
/// `/dev/nvidia1` and none onto `/dev/nvidia0`; Podman cannot carry the move out (its restore reuses the checkpoint's
/// spec, whose devices cgroup denies `/dev/nvidia1`: the plugin refuses the restore at init, naming it), which must
/// fail for that reason only, with the archive intact and nothing left running, after
/// which the archive restores again on G0 (were the move to pass, the test checks the workers on `/dev/nvidia1` and
/// the ranks on G1 instead). At the end every worker exits 7 when told, and the container ends with its ranks. runc
/// (runc.conf), on both suites.
#[test]
fn podman_with_a_cdi_gpu_checkpoints_and_restores_a_rank_tree_with_forked_workers_on_the_test_doubles() {
    let test = "podman_with_a_cdi_gpu_checkpoints_and_restores_a_rank_tree_with_forked_workers_on_the_test_doubles";
    let _one = ONE_FLOW.lock().unwrap_or_else(|p| p.into_inner());
    let Some(root) = criu_root_or_skip(test) else {
        return;
    };
    let (ranks, workers) = (2, 4);
    let copy = RootCopy::of(&root, RootKind::Runtimes);
    let scratch = scratch_with_sim("ccm-podman-tree-test-");
    let s = scratch.path().to_str().expect("UTF-8 scratch path");
    let flow = repo_root().join("tests/container/podman-cdi-tree-flow.sh");
    let copy_path = copy.path();
    let runner = root.run(
        &[scratch.path()],
        &["bash", flow.to_str().expect("UTF-8 path"), s, &ranks.to_string(), &workers.to_string()],
        &[("CCM_TRIXIE_ROOT", copy_path.to_str().expect("UTF-8 root path"))],
    );
    assert!(runner.status.success(), "the Podman CDI tree flow failed to run: {}", describe_output(&runner));
    let f = |name: &str| format!("ptree-{name}");
    let gpus = scratch.read(&f("gpus.txt"));
    let (g0, g1) = gpus.trim().split_once(' ').expect("ptree-gpus.txt names the two simulated GPUs");
    assert_eq!(scratch.read(&f("setup.err")), "", "the flow's setup");
    scratch.assert_step(&f("install"), "dpkg -i of the package");
    scratch.assert_step(&f("image"), "podman import of the CUDA image with the agent");
    assert_eq!(scratch.read(&f("conf-name")).trim(), "runc.conf", "the libdir line went into the wrong file");
    let stand_ins = scratch.read(&f("stand-ins.txt"));
    assert!(
        stand_ins.contains("=nvidia0") && stand_ins.contains("=nvidia1") && stand_ins.contains("=nvidiactl"),
        "the stand-in nodes: {stand_ins}"
    );
    let rank_report = |case: &str, r: usize, k: u32| Report::read(&scratch, &f(&format!("{case}-w{r}-report{k}.json")));

    // The tree as started: CDI gave the container G0's node, each rank runs on G0, each worker holds its nodes.
    scratch.assert_step(&f("run"), "podman run --device nvidia.com/gpu=0 of the agent");
    assert_eq!(scratch.rc(&f("ready")), Some(0), "the ranks did not get ready: {}", scratch.read(&f("ready.err")));
    assert_eq!(
        scratch.read(&f("run-spec-nodes.txt")).trim(),
        "/dev/nvidia0",
        "CDI did not put /dev/nvidia0 into the container's linux.devices"
    );
    let pids = assert_tree(&scratch, "ptree", "run", ranks, workers, "/dev/nvidia0", "/dev/nvidia0");
    assert_eq!(scratch.rc(&f("run-round1")), Some(0), "the ranks' round 1");
    for r in 0..ranks {
        let report = rank_report("run", r, 1);
        report.assert_sound(&format!("rank {r} at the start"));
        assert_eq!(report.ordinal0_uuid(), g0, "rank {r} started on the wrong GPU");
    }

    // The export: both ranks checkpointed, every worker claimed; the archive's claims name them.
    scratch.assert_step(&f("export-checkpoint"), "podman container checkpoint --export of the tree");
    let dump = scratch.read(&f("export-dump.log"));
    assert!(dump.contains(&init_line("dump")), "plugin not loaded at dump:\n{dump}");
    assert!(
        dump.matches("cuCheckpointProcessCheckpoint").count() >= ranks,
        "the dump did not checkpoint both ranks:\n{}",
        plugin_lines(&dump)
    );
    assert!(
        dump.contains(&format!(
            "device claims before the first lock: {} process(es) of the tree hold NVIDIA nodes",
            ranks * workers
        )),
        "the dump did not count the workers before the lock:\n{}",
        plugin_lines(&dump)
    );
    assert_eq!(
        dump.matches("is no CUDA process but holds 2 NVIDIA descriptor(s) and 1 device mapping(s)").count(),
        ranks * workers,
        "the dump did not claim every worker:\n{}",
        plugin_lines(&dump)
    );
    scratch.assert_step(&f("export-rm"), "podman rm after the checkpoint");
    scratch.assert_step(&f("a1-inspect"), "criu-cuda-migrate inspect of the export");
    let inspect = scratch.read(&f("a1-inspect.out"));
    assert!(
        inspect.contains(&format!("{} process(es) without a CUDA context holding NVIDIA nodes", ranks * workers)),
        "criu-cuda-migrate inspect of the export: {inspect}"
    );
    assert_claims_name(&inspect, &pids, "criu-cuda-migrate inspect of the export");

    // The same node: every rank goes on on G0, every worker holds its nodes again (the mapping a placeholder).
    let same_log = scratch.read(&f("same-restore.log"));
    assert_eq!(
        scratch.rc(&f("same-restore")),
        Some(0),
        "podman container restore --import of the tree failed:\n{}\n{}",
        scratch.read(&f("same-restore.err")),
        plugin_lines(&same_log)
    );
    assert_claims_name(&same_log, &pids, "the same-node restore");
    assert!(
        same_log.matches("cuCheckpointProcessUnlock").count() >= ranks,
        "the plugin did not restore and unlock both ranks:\n{}",
        plugin_lines(&same_log)
    );
    let placeholder = "/memfd:criu-cuda-migrate-placeholder";
    let same_pids = assert_tree(&scratch, "ptree", "same", ranks, workers, "/dev/nvidia0", placeholder);
    assert_eq!(same_pids, pids, "the restored workers are not the checkpointed ones");
    assert_eq!(scratch.rc(&f("same-round2")), Some(0), "the ranks' round 2 after the same-node restore");
    for r in 0..ranks {
        let report = rank_report("same", r, 2);
        report.assert_sound(&format!("rank {r} after the same-node restore"));
        assert_eq!(report.ordinal0_uuid(), g0, "rank {r} after the same-node restore");
    }
    scratch.assert_step(&f("same-rm"), "podman rm --force of the restored tree");

    // The usable set names G1: the plugin plans every worker's GPU descriptor onto /dev/nvidia1, none onto nvidia0.
    let usable_log = scratch.read(&f("usable-restore.log"));
    let settings = usable_log
        .lines()
        .find_map(|l| l.split_once(&format!("{LOG_PREFIX}settings: ")).map(|(_, s)| s.to_string()))
        .unwrap_or_else(|| panic!("the usable restore's log has no settings line:\n{usable_log}"));
    assert!(settings.contains(&format!("usable GPUs {g1}")), "conmon_env_vars did not reach the plugin: {settings}");
    assert_claims_name(&usable_log, &pids, "the restore onto G1");
    assert_eq!(
        usable_log.matches(": reopened as /dev/nvidia1 (block ").count(),
        ranks * workers,
        "the plugin did not plan every worker's GPU descriptor onto /dev/nvidia1:\n{}",
        plugin_lines(&usable_log)
    );
    assert!(
        !usable_log.contains("reopened as /dev/nvidia0"),
        "a descriptor was planned onto the GPU that is not usable:\n{}",
        plugin_lines(&usable_log)
    );
    let last = scratch.read(&f("last-case")).trim().to_string();
    let on = if scratch.rc(&f("usable-restore")) == Some(0) {
        // The move went through: every worker holds the usable GPU's node only, every rank runs on G1.
        assert_eq!(last, "usable");
        assert_tree(&scratch, "ptree", "usable", ranks, workers, "/dev/nvidia1", placeholder);
        loud(&format!("NOTE: podman ({} root) moved the tree onto G1 with its workers' nodes", root.suite));
        g1
    } else {
        // Podman's restore --import reuses the checkpoint's spec, whose devices cgroup denies /dev/nvidia1: the
        // plugin refuses the restore at init, naming it (were the spec not read, the reopen would fail on it).
        let missing = "/dev/nvidia1 is not in the restored task's /dev";
        let denied = "/dev/nvidia1: Operation not permitted";
        // Refused before anything is restored: the checkpoint's spec (Podman keeps it) denies G1's node.
        let refused = "does not let the container open /dev/nvidia1";
        assert!(
            usable_log.contains(refused) || usable_log.contains(missing) || usable_log.contains(denied),
            "the restore onto G1 failed, but not on the workers' /dev/nvidia1 as known:\n{}\n{}",
            scratch.read(&f("usable-restore.err")),
            plugin_lines(&usable_log)
        );
        assert!(
            !usable_log.contains("cuCheckpointProcessRestore"),
            "the failed restore reached the driver's restore:\n{}",
            plugin_lines(&usable_log)
        );
        if usable_log.contains(refused) {
            // The archive's preflight with the same usable set said so first (a note: a CRI restore builds a new
            // spec), naming the same node.
            let preflight = scratch.read(&f("usable-preflight.out"));
            assert!(
                preflight.contains("note: Podman's `restore --import` keeps the dumped container's spec (spec.dump)")
                    && preflight.contains("does not let the container open /dev/nvidia1 (block 7:")
                    && preflight.contains(g1),
                "the archive's preflight did not say what Podman's restore --import would be refused:\n{preflight}\n{}",
                scratch.read(&f("usable-preflight.err"))
            );
        }
        assert_eq!(
            scratch.read(&f("a1.sum-before")),
            scratch.read(&f("a1.sum-after")),
            "the failed restore changed the archive"
        );
        assert_eq!(scratch.read(&f("usable-procs.txt")).trim(), "", "a process outlived the failed restore");
        loud(&format!(
            "NOTE: podman ({} root) restore --import of a tree whose forked workers hold GPU nodes cannot move it onto \
             another GPU: {}; the plugin planned the workers onto /dev/nvidia1, and the archive restored again on G0",
            root.suite,
            if usable_log.contains(refused) {
                "the plugin refused it before CRIU restored anything: the checkpoint's spec (its devices cgroup) denies \
                 /dev/nvidia1"
            } else if usable_log.contains(missing) {
                "the restored /dev (the checkpoint's) has no /dev/nvidia1 when CRIU reopens the workers' descriptors"
            } else {
                "the checkpoint's devices cgroup denies /dev/nvidia1"
            }
        ));
        assert_eq!(last, "retry");
        let retry_log = scratch.read(&f("retry-restore.log"));
        assert_eq!(
            scratch.rc(&f("retry-restore")),
            Some(0),
            "the archive did not restore again after the failed move:\n{}\n{}",
            scratch.read(&f("retry-restore.err")),
            plugin_lines(&retry_log)
        );
        assert_claims_name(&retry_log, &pids, "the restore after the failed move");
        assert_tree(&scratch, "ptree", "retry", ranks, workers, "/dev/nvidia0", placeholder);
        g0
    };

    // The end: round 2 on the last restore's GPU, every worker exits 7 when told, the container ends with its ranks.
    assert_eq!(scratch.rc(&f(&format!("{last}-round2"))), Some(0), "the ranks' round 2 after the {last} restore");
    assert_eq!(scratch.rc(&f(&format!("{last}-round3"))), Some(0), "the ranks' last round");
    for r in 0..ranks {
        let report = rank_report(&last, r, 2);
        report.assert_sound(&format!("rank {r} after the {last} restore"));
        assert_eq!(report.ordinal0_uuid(), on, "rank {r} after the {last} restore");
        let end = rank_report(&last, r, 3);
        assert!(
            end.compact.contains("\"forked_child\":{\"pid\":") && end.compact.contains("\"exit_code\":7}"),
            "rank {r}'s workers did not all exit 7 after the restore: {}",
            end.compact
        );
    }
    assert_eq!(scratch.read(&f("final.state")).trim(), "exited 0", "the agent did not end with its ranks");
}

/// containerd 2.1's CRI with a CDI GPU on the test doubles (tests/container/cri-cdi-flow.sh, issue 25):
/// CreateContainer with `CDI_devices: [nvidia.com/gpu=0]`, CheckpointContainer (keeps running), then the restore
/// Kubernetes users do, a new container created from the archive with `CDI_devices: [nvidia.com/gpu=1]`: containerd
/// builds its spec from the new request, the plugin reads it (no usable-GPU setting anywhere), moves the process onto
/// G1 and fixes the restored `/dev`. containerd 1.7 (trixie) has no CRI checkpoint: skipped loudly there.
#[test]
fn containerd_cri_with_a_cdi_gpu_restores_a_cuda_container_onto_the_gpu_its_new_spec_gives_on_the_test_doubles() {
    let test =
        "containerd_cri_with_a_cdi_gpu_restores_a_cuda_container_onto_the_gpu_its_new_spec_gives_on_the_test_doubles";
    let _one = ONE_FLOW.lock().unwrap_or_else(|p| p.into_inner());
    let Some(root) = cri_root_or_skip(test) else {
        return;
    };
    let copy = RootCopy::of(&root, RootKind::Runtimes);
    let scratch = scratch_with_sim("ccm-cri-cdi-test-");
    let s = scratch.path().to_str().expect("UTF-8 scratch path");
    let flow = repo_root().join("tests/container/cri-cdi-flow.sh");
    let copy_path = copy.path();
    let runner = root.run(
        &[scratch.path()],
        &["bash", flow.to_str().expect("UTF-8 path"), s],
        &[("CCM_TRIXIE_ROOT", copy_path.to_str().expect("UTF-8 root path"))],
    );
    assert!(runner.status.success(), "the CRI CDI flow failed to run: {}", describe_output(&runner));
    let gpus = scratch.read("ccdi-gpus.txt");
    let (g0, g1) = gpus.trim().split_once(' ').expect("ccdi-gpus.txt names the two simulated GPUs");
    for (step, what) in [
        ("ccdi-version", "containerd 2.1 with CRI: Version"),
        ("ccdi-image", "ctr images import (the CUDA image)"),
        ("ccdi-pause-image", "ctr images import (the sandbox image)"),
        ("ccdi-tag", "ctr images tag (registry name)"),
        ("ccdi-push", "ctr images push to the loopback registry"),
        ("ccdi-pull", "CRI PullImage"),
        ("ccdi-runp", "CRI RunPodSandbox"),
        ("ccdi-create", "CRI CreateContainer with CDI_devices nvidia.com/gpu=0"),
        ("ccdi-start", "CRI StartContainer"),
    ] {
        scratch.assert_step(step, what);
    }
    assert_eq!(scratch.rc("ccdi-ready"), Some(0), "the workload did not get ready: {}", scratch.read("ccdi-ready.err"));
    assert_eq!(
        scratch.read("ccdi-run-spec-nodes.txt").trim(),
        "/dev/nvidia0",
        "containerd's CDI did not put /dev/nvidia0 into the container's linux.devices"
    );
    assert_eq!(scratch.rc("ccdi-run-round1"), Some(0), "no report 1");
    let r1 = Report::read(&scratch, "ccdi-run-report1.json");
    r1.assert_sound("CRI before the checkpoint");
    assert_eq!(r1.ordinal0_uuid(), g0, "the container started on the wrong GPU");

    // The kubelet's checkpoint: the container runs on.
    scratch.assert_step("ccdi-checkpoint", "CRI CheckpointContainer of the CUDA container");
    // checkpointctl and criu-cuda-migrate read the archive with its identity image; ours names the GPU.
    assert_archive_tools(&scratch, "ccdi", "cuda", &root.suite);
    let inspect = scratch.read("ccdi-ccm-inspect.out");
    assert!(
        inspect.contains("cuda:0") && inspect.contains(g0),
        "criu-cuda-migrate inspect of the CRI archive: {inspect}"
    );
    assert_eq!(
        scratch.read("ccdi-after-checkpoint.state").trim(),
        "CONTAINER_RUNNING",
        "CheckpointContainer stopped it"
    );
    let dump = scratch.read("ccdi-dump.log");
    assert!(dump.contains(&init_line("dump")), "plugin not loaded at CheckpointContainer's dump:\n{dump}");
    assert!(
        dump.contains("cuCheckpointProcessCheckpoint") && dump.contains("rolling back"),
        "CheckpointContainer's dump did not checkpoint the workload and roll it back:\n{}",
        plugin_lines(&dump)
    );
    let list = scratch.read("ccdi-archive.list");
    assert!(
        list.lines().any(|l| l.trim_start_matches("./").starts_with("checkpoint/cuda-migrate-")),
        "the checkpoint archive holds no identity image: {list}"
    );
    assert_eq!(scratch.rc("ccdi-run-round2"), Some(0), "no report after CheckpointContainer");
    let r2 = Report::read(&scratch, "ccdi-run-report2.json");
    r2.assert_sound("CRI after CheckpointContainer");
    assert_eq!(r2.ordinal0_uuid(), g0, "after CheckpointContainer");

    // The restore from the archive, given G1 through CDI.
    scratch.assert_step("ccdi-stop", "CRI StopContainer");
    scratch.assert_step("ccdi-rm", "CRI RemoveContainer");
    scratch
        .assert_step("ccdi-restore-create", "CRI CreateContainer from the archive with CDI_devices nvidia.com/gpu=1");
    let log = scratch.read("ccdi-restore.log");
    assert_eq!(
        scratch.rc("ccdi-restore-start"),
        Some(0),
        "CRI StartContainer (the restore) failed: {}\n{}",
        scratch.read("ccdi-restore-start.err"),
        plugin_lines(&log)
    );
    assert_eq!(
        scratch.read("ccdi-restore-spec-nodes.txt").trim(),
        "/dev/nvidia1",
        "containerd did not build the restored spec from the new request's CDI device"
    );
    let settings = scratch.settings("ccdi-restore.log");
    assert!(settings.contains("device map automatic, usable GPUs all"), "the plugin was given a setting: {settings}");
    assert!(
        log.contains(&format!("usable GPUs: [{g1}], what the restoring runtime's spec"))
            && log.contains("linux.devices /dev/nvidia1 (minor 1)"),
        "the usable set did not come from the restored container's spec:\n{}",
        plugin_lines(&log)
    );
    assert!(
        log.contains("container /dev: created /dev/nvidia1") && log.contains("container /dev: removed /dev/nvidia0"),
        "the restored /dev was not fixed:\n{}",
        plugin_lines(&log)
    );
    let dev = scratch.read("ccdi-restore-dev.txt");
    let names: Vec<&str> = dev.split_whitespace().collect();
    assert!(names.contains(&"nvidia1") && !names.contains(&"nvidia0"), "the restored container's /dev: {dev}");
    assert_eq!(scratch.read("ccdi-after-restore.state").trim(), "CONTAINER_RUNNING", "the restored container");
    for k in [2, 3] {
        assert_eq!(scratch.rc(&format!("ccdi-restored-round{k}")), Some(0), "no report {k} of the restored container");
        let r = Report::read(&scratch, &format!("ccdi-restored-report{k}.json"));
        r.assert_sound("CRI restore onto G1");
        assert_eq!(r.ordinal0_uuid(), g1, "CRI restore: ordinal 0 after the restore:\n{}", plugin_lines(&log));
    }
    let adjustments = scratch.read("ccdi-host-adjustments.txt");
    if !adjustments.is_empty() {
        loud(&format!("NOTE: CRI CDI flow host adjustment: {}", adjustments.trim()));
    }
}

/// containerd 2.1's CRI with a CDI GPU and a torchrun-like tree on the test doubles (tests/container/cri-cdi-tree-flow.sh,
/// issue 46): an agent with 2 CUDA ranks, each with 2 workers forked after cuInit that hold `/dev/nvidiactl` and
/// `/dev/nvidia0` open and map `/dev/nvidia0` (the doubles' loop-device stand-ins), in a container given G0 through
/// `CDI_devices`. CheckpointContainer of the whole tree (it runs on: the ranks rolled back, every worker claimed),
/// then a new container from the archive given G1 through `CDI_devices`: containerd's new spec gives G1's node, the
/// restored `/dev` (CRIU's copy of the dumped one) lacks it when CRIU reopens the workers' descriptors, and the plugin
/// adds it there (once, whichever worker comes first) with the held node's mode: every worker holds `/dev/nvidia1`
/// and `/dev/nvidiactl` again with a placeholder where it mapped the GPU, none holds `/dev/nvidia0`, the ranks go on
/// on G1 with sound data, and every worker exits 7 when told. Forky only (containerd 2.1).
#[test]
fn containerd_cri_with_a_cdi_gpu_moves_a_rank_tree_with_forked_workers_onto_the_gpu_its_new_spec_gives() {
    let test = "containerd_cri_with_a_cdi_gpu_moves_a_rank_tree_with_forked_workers_onto_the_gpu_its_new_spec_gives";
    let _one = ONE_FLOW.lock().unwrap_or_else(|p| p.into_inner());
    let Some(root) = cri_root_or_skip(test) else {
        return;
    };
    let (ranks, workers) = (2, 2);
    let copy = RootCopy::of(&root, RootKind::Runtimes);
    let scratch = scratch_with_sim("ccm-cri-tree-test-");
    let s = scratch.path().to_str().expect("UTF-8 scratch path");
    let flow = repo_root().join("tests/container/cri-cdi-tree-flow.sh");
    let copy_path = copy.path();
    let runner = root.run(
        &[scratch.path()],
        &["bash", flow.to_str().expect("UTF-8 path"), s, &ranks.to_string(), &workers.to_string()],
        &[("CCM_TRIXIE_ROOT", copy_path.to_str().expect("UTF-8 root path"))],
    );
    assert!(runner.status.success(), "the CRI CDI tree flow failed to run: {}", describe_output(&runner));
    let f = |name: &str| format!("ctree-{name}");
    let gpus = scratch.read(&f("gpus.txt"));
    let (g0, g1) = gpus.trim().split_once(' ').expect("ctree-gpus.txt names the two simulated GPUs");
    assert_eq!(scratch.read(&f("setup.err")), "", "the flow's setup");
    for (step, what) in [
        ("version", "containerd 2.1 with CRI: Version"),
        ("image", "ctr images import (the tree's image)"),
        ("pause-image", "ctr images import (the sandbox image)"),
        ("tag", "ctr images tag (registry name)"),
        ("push", "ctr images push to the loopback registry"),
        ("pull", "CRI PullImage"),
        ("runp", "CRI RunPodSandbox"),
        ("create", "CRI CreateContainer of the agent with CDI_devices nvidia.com/gpu=0"),
        ("start", "CRI StartContainer"),
    ] {
        scratch.assert_step(&f(step), what);
    }
    let rank_report = |case: &str, r: usize, k: u32| Report::read(&scratch, &f(&format!("{case}-w{r}-report{k}.json")));
    assert_eq!(scratch.rc(&f("ready")), Some(0), "the ranks did not get ready: {}", scratch.read(&f("ready.err")));
    assert_eq!(scratch.read(&f("run-spec-nodes.txt")).trim(), "/dev/nvidia0", "CDI did not give /dev/nvidia0");
    let pids = assert_tree(&scratch, "ctree", "run", ranks, workers, "/dev/nvidia0", "/dev/nvidia0");
    assert_eq!(scratch.rc(&f("run-round1")), Some(0), "the ranks' round 1");
    for r in 0..ranks {
        let report = rank_report("run", r, 1);
        report.assert_sound(&format!("rank {r} at the start"));
        assert_eq!(report.ordinal0_uuid(), g0, "rank {r} started on the wrong GPU");
    }

    // The kubelet's checkpoint of the whole tree: both ranks checkpointed and rolled back, every worker claimed.
    scratch.assert_step(&f("checkpoint"), "CRI CheckpointContainer of the tree");
    assert_eq!(
        scratch.read(&f("after-checkpoint.state")).trim(),
        "CONTAINER_RUNNING",
        "CheckpointContainer stopped it"
    );
    let dump = scratch.read(&f("dump.log"));
    assert!(dump.contains(&init_line("dump")), "plugin not loaded at CheckpointContainer's dump:\n{dump}");
    assert_eq!(
        dump.matches("is no CUDA process but holds 2 NVIDIA descriptor(s) and 1 device mapping(s)").count(),
        ranks * workers,
        "the dump did not claim every worker:\n{}",
        plugin_lines(&dump)
    );
    scratch.assert_step(&f("inspect"), "criu-cuda-migrate inspect of the CRI archive");
    assert_claims_name(&scratch.read(&f("inspect.out")), &pids, "criu-cuda-migrate inspect of the CRI archive");
    assert_eq!(scratch.rc(&f("run-round2")), Some(0), "the ranks' round 2 after CheckpointContainer");
    for r in 0..ranks {
        rank_report("run", r, 2).assert_sound(&format!("rank {r} after CheckpointContainer"));
    }

    // The restore from the archive, given G1 through CDI: the workers' descriptors reopened on G1's node, which the
    // plugin added to the restored /dev when CRIU asked for the first of them.
    scratch.assert_step(&f("stop"), "CRI StopContainer");
    scratch.assert_step(&f("rm"), "CRI RemoveContainer");
    scratch.assert_step(&f("restore-create"), "CRI CreateContainer from the archive with CDI_devices nvidia.com/gpu=1");
    let log = scratch.read(&f("restore.log"));
    assert_eq!(
        scratch.rc(&f("restore-start")),
        Some(0),
        "CRI StartContainer (the restore of the tree onto G1) failed: {}\n{}",
        scratch.read(&f("restore-start.err")),
        plugin_lines(&log)
    );
    assert_eq!(scratch.read(&f("restore-spec-nodes.txt")).trim(), "/dev/nvidia1", "the restored spec's CDI device");
    assert_claims_name(&log, &pids, "the restore onto G1");
    assert_eq!(
        log.matches(": reopened as /dev/nvidia1 (block ").count(),
        ranks * workers,
        "the plugin did not plan every worker's GPU descriptor onto G1's node:\n{}",
        plugin_lines(&log)
    );
    assert!(
        log.contains("to the restored container's /dev for file")
            && log.contains("CRIU's copy of the dumped /dev lacks the node of the GPU it moved to"),
        "the plugin did not add /dev/nvidia1 at the workers' reopen:\n{}",
        plugin_lines(&log)
    );
    assert!(
        log.matches("cuCheckpointProcessUnlock").count() >= ranks,
        "the plugin did not restore and unlock both ranks:\n{}",
        plugin_lines(&log)
    );
    assert_eq!(scratch.read(&f("after-restore.state")).trim(), "CONTAINER_RUNNING", "the restored container");
    let dev = scratch.read(&f("restore-dev.txt"));
    assert!(dev.split_whitespace().any(|n| n == "nvidia1"), "the restored container's /dev: {dev}");
    let placeholder = "/memfd:criu-cuda-migrate-placeholder";
    let restored = assert_tree(&scratch, "ctree", "restored", ranks, workers, "/dev/nvidia1", placeholder);
    assert_eq!(restored, pids, "the restored workers are not the checkpointed ones");
    for k in [2, 3] {
        assert_eq!(scratch.rc(&f(&format!("restored-round{k}"))), Some(0), "the ranks' round {k} after the restore");
    }
    for r in 0..ranks {
        let report = rank_report("restored", r, 2);
        report.assert_sound(&format!("rank {r} after the restore onto G1"));
        assert_eq!(report.ordinal0_uuid(), g1, "rank {r} after the restore:\n{}", plugin_lines(&log));
        let end = rank_report("restored", r, 3);
        assert!(
            end.compact.contains("\"forked_child\":{\"pid\":") && end.compact.contains("\"exit_code\":7}"),
            "rank {r}'s workers did not all exit 7 after the restore: {}",
            end.compact
        );
    }
    let dev_lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(LOG_PREFIX) && (l.contains("restored container's /dev") || l.contains("container /dev")))
        .collect();
    loud(&format!("NOTE: CRI tree moved onto G1; the plugin's /dev lines:\n{}", dev_lines.join("\n")));
    let adjustments = scratch.read(&f("host-adjustments.txt"));
    if !adjustments.is_empty() {
        loud(&format!("NOTE: CRI CDI tree flow host adjustment: {}", adjustments.trim()));
    }
}

/// Podman with runc, a container with its own network namespace (`--network none`) holding an established TCP
/// connection on 127.0.0.1 (tests/container/podman-tcp-flow.sh): `checkpoint --tcp-established --export`, then
/// `restore --import --tcp-established` twice. With only the libdir line in runc.conf, CRIU's TCP repair finds the
/// restored namespace's loopback down (runc dumps the namespace empty); with the package's action script added, the
/// restore succeeds and the connection carries on.
#[test]
fn podman_runc_restores_established_loopback_tcp_with_the_packaged_action_script() {
    let test = "podman_runc_restores_established_loopback_tcp_with_the_packaged_action_script";
    let _one = ONE_FLOW.lock().unwrap_or_else(|p| p.into_inner());
    let Some(root) = criu_root_or_skip(test) else {
        return;
    };
    let copy = RootCopy::of(&root, RootKind::Runtimes);
    let scratch = Scratch { dir: tempfile::Builder::new().prefix("ccm-podman-tcp-test-").tempdir().expect("scratch") };
    fs::copy(deb(), scratch.path().join("package.deb")).expect("copy of the package");
    let exe = std::env::current_exe().expect("path of the test binary");
    let bin = exe.parent().and_then(Path::parent).expect("target/<profile>/deps/").join("ccm-tcp-pair");
    assert!(bin.is_file(), "{} is missing: run `cargo build --workspace` first", bin.display());
    fs::create_dir(scratch.path().join("tcp-bin")).expect("tcp-bin");
    fs::copy(&bin, scratch.path().join("tcp-bin/ccm-tcp-pair")).expect("copy of ccm-tcp-pair");
    let s = scratch.path().to_str().expect("UTF-8 scratch path");
    let flow = repo_root().join("tests/container/podman-tcp-flow.sh");
    let script = format!("bash {} {s}", flow.to_str().expect("UTF-8 path"));
    let runner = root.run(
        &[scratch.path()],
        &["bash", "-c", &script],
        &[("CCM_TRIXIE_ROOT", copy.path().to_str().expect("UTF-8 root path"))],
    );
    assert!(runner.status.success(), "the Podman TCP flow failed to run: {}", describe_output(&runner));

    scratch.assert_step("ptcp-install", "dpkg -i of the package");
    scratch.assert_step("ptcp-image", "podman import of the TCP image");
    scratch.assert_step("ptcp-run", "podman run --network none of ccm-tcp-pair");
    assert_eq!(scratch.rc("ptcp-ready"), Some(0), "the TCP pair never counted: {}", scratch.read("ptcp-run-logs.txt"));
    let dump = scratch.read("ptcp-dump.log");
    if scratch.rc("ptcp-checkpoint") != Some(0) && dump.contains("Can't get 1:16 opt") {
        // Kernels since 6.16 refuse SO_PASSCRED's getsockopt on TCP sockets; CRIU fixed its dump after 4.1.1
        // (checkpoint-restore/criu #2705, #2718). The same dump on CRIU 4.2.1 passes (the forky pass).
        loud(&format!(
            "SKIPPED {test} on the {} root: its CRIU cannot dump a TCP socket on this kernel ({}): Error \
             (criu/sockets.c): Can't get 1:16 opt (SO_PASSCRED), fixed in CRIU 4.2; the forky pass runs it",
            root.suite,
            std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim()
        ));
        return;
    }
    scratch.assert_step("ptcp-checkpoint", "podman container checkpoint --tcp-established --export");
    assert!(dump.contains("TCP_ESTABLISHED"), "CRIU dumped no established TCP connection:\n{}", plugin_lines(&dump));

    // Without the action script: runc's restored namespace has lo down.
    let plain = scratch.read("ptcp-plain-restore.log");
    if scratch.rc("ptcp-plain") == Some(0) {
        loud(&format!(
            "NOTE: podman/runc ({} root) restored loopback TCP without the action script: this runc restores the \
             loopback of the namespace it made",
            root.suite
        ));
    } else {
        assert!(
            plain.contains("Network is unreachable"),
            "the restore without the action script failed, but not in CRIU's TCP repair as known:\n{}\n{}",
            plugin_lines(&plain),
            scratch.read("ptcp-plain.err")
        );
    }

    // With it: restored, and the numbers go on over the restored connection.
    assert!(scratch.read("ptcp-script-runc.conf").contains("action-script /usr/lib/criu-cuda-migrate/action-script"));
    assert_eq!(
        scratch.rc("ptcp-script"),
        Some(0),
        "restore --import --tcp-established with the action script failed:\n{}\n{}",
        scratch.criu_errors(),
        scratch.read("ptcp-script.err")
    );
    assert_eq!(
        scratch.rc("ptcp-script-continues"),
        Some(0),
        "the restored TCP pair did not go on past {} (now {}): {}",
        scratch.read("ptcp-at-checkpoint.txt").trim(),
        scratch.read("ptcp-script-after.txt").trim(),
        scratch.read("ptcp-script.state")
    );
    assert_eq!(scratch.read("ptcp-script.state").trim(), "running");
}

/// `NODE INDEX UUID BUS` lines of `rpod-gpus.txt`: the GPU at `index` (bus order) of node `node` (a or b).
fn pod_gpu(gpus: &str, node: &str, index: usize) -> (String, String) {
    gpus.lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 4 && f[0] == node && f[1] == index.to_string()).then(|| (f[2].to_string(), f[3].to_string()))
        })
        .unwrap_or_else(|| panic!("rpod-gpus.txt names no GPU {index} of node {node}: {gpus}"))
}

/// Every rank's report `k` of pod case `case`: four ordinals, ordinal `o` on GPU `on[o]` of `node` by
/// `cuDeviceGetUuid` and by `cuDeviceGetPCIBusId`, NVML's GPU at that bus id the same (NCCL's init check), the
/// rank's data on `cuda:<local_rank>` intact.
fn assert_pod_sound(scratch: &Scratch, case: &str, k: u32, node: &str, on: &[usize], context: &dyn Fn() -> String) {
    let gpus = scratch.read("rpod-gpus.txt");
    for rank in 0..4 {
        let report = Report::read(scratch, &format!("{case}-rank{rank}-report{k}.json"));
        let what = format!("{case} round {k}, rank {rank}");
        assert!(report.compact.contains("\"device_count\":4,"), "{what}: not 4 GPUs: {}{}", report.compact, context());
        assert!(
            report.flag("all_agree") && report.flag("all_consistent") && report.flag("all_data_ok"),
            "{what}: a disagreeing identity or damaged data: {}{}",
            report.compact,
            context()
        );
        for (ordinal, &index) in on.iter().enumerate() {
            let (uuid, bus) = pod_gpu(&gpus, node, index);
            assert_eq!(report.ordinal_text(ordinal, "uuid"), uuid, "{what}: cuda:{ordinal}'s UUID{}", context());
            assert_eq!(
                report.ordinal_text(ordinal, "cuda_bus_id"),
                bus,
                "{what}: cuda:{ordinal}'s bus id{}",
                context()
            );
            assert_eq!(
                report.ordinal_text(ordinal, "nvml_uuid_by_bus"),
                uuid,
                "{what}: NVML at cuda:{ordinal}'s bus id"
            );
        }
        assert!(
            report.ordinal(rank).contains("\"holds_data\":true"),
            "{what}: the rank holds no data on cuda:{rank}: {}",
            report.compact
        );
    }
}

/// The restore of a pod case onto `on` of `node`: no setting, the usable set from the restoring spec (`source`
/// names its form), the automatic map, one parallel restore of the 4 ranks, each reconciled and validated, the
/// restored `/dev` holding the new GPUs' nodes only.
fn assert_pod_restored(scratch: &Scratch, case: &str, tag: &str, node: &str, on: &[usize], source: &str) {
    let log = scratch.read(&format!("{case}-{tag}.log"));
    let context = || format!("\n--- {case}-{tag}.log (plugin lines) ---\n{}", plugin_lines(&log));
    assert_eq!(
        scratch.rc(&format!("{case}-{tag}")),
        Some(0),
        "{case}: runc restore ({tag}) failed: {}{}",
        scratch.read(&format!("{case}-{tag}.err")),
        context()
    );
    let settings = scratch.settings(&format!("{case}-{tag}.log"));
    assert!(
        settings.contains("device map automatic, usable GPUs all"),
        "{case}: the plugin was given a setting: {settings}"
    );
    let gpus = scratch.read("rpod-gpus.txt");
    let given: Vec<String> = on.iter().map(|&i| pod_gpu(&gpus, node, i).0).collect();
    assert!(
        log.contains(&format!("usable GPUs: [{}], what the restoring runtime's spec", given.join(", ")))
            && log.contains(source),
        "{case} {tag}: the usable set did not come from the restoring spec ({source}){}",
        context()
    );
    assert!(
        log.contains("restore of 4 CUDA process(es) took"),
        "{case} {tag}: not one restore of the 4 ranks{}",
        context()
    );
    let reconciled = log.lines().filter(|l| l.contains("identity reconciliation: ")).count();
    let off = log.contains("reconciliation is off");
    assert!(off || reconciled == 4, "{case} {tag}: {reconciled} reconciliations, not 4{}", context());
    assert!(!log.contains("inconsistent after restore"), "{case} {tag}: an identity check failed{}", context());
    let dev = scratch.read(&format!("{case}-{tag}-dev.txt"));
    let mut nodes: Vec<&str> =
        dev.split_whitespace().filter(|n| n.strip_prefix("nvidia").is_some_and(|m| m.parse::<u32>().is_ok())).collect();
    nodes.sort_unstable();
    let wanted: Vec<String> = on.iter().map(|i| format!("nvidia{i}")).collect();
    assert_eq!(nodes, wanted, "{case} {tag}: the restored container's /dev{}", context());
}

/// The registrations left after a pod case's ranks exited: none of the container's (the plugin's driver agents, in
/// the host's pid namespace, are killed rather than exit and may stay).
fn assert_pod_left_nothing(scratch: &Scratch, case: &str) {
    let ns = scratch.read(&format!("{case}-pidns.txt"));
    let ns = ns.trim();
    assert!(ns.parse::<u64>().is_ok(), "{case}: no pid namespace of the restored container recorded: {ns:?}");
    let left = scratch.read(&format!("{case}-left.txt"));
    assert!(
        !left.lines().any(|l| l.split_whitespace().nth(1).is_some_and(|k| k.starts_with(&format!("{ns}-")))),
        "{case}: the ranks' registrations outlived them: {left}"
    );
}

/// The problem this project exists for at its real size (issue 36; tests/container/runc-pod-flow.sh): two
/// simulated 8-GPU nodes with the seed's PCI layout (bus ids 03/13/63/73/83/93/E3/F3 on both, other UUIDs on
/// each, selected by the doubles' GPU set file between dump and restore), a runc container of a launcher and 4 rank
/// processes that each see the container's 4 GPUs and hold data on `cuda:<local_rank>`, under real CRIU with the
/// packaged plugin:
/// - `seed`: given A's 03/13/63/73 by its spec's device nodes (what CDI writes), dumped on A; a restore on B into a
///   container given only 63/83/E3 is refused before CRIU restores anything, naming the dump GPU without a place
///   (73), the images unchanged; restored on B into one given 63/83/E3/F3 with no setting: the automatic map from
///   the spec (03→63, 13→83, 63→E3, 73→F3), one parallel restore of the 4 ranks, every rank's bus ids rewritten
///   and validated, NCCL's init check (`cuDeviceGetPCIBusId` → `nvmlDeviceGetHandleByPciBusId` → its UUID =
///   `cuDeviceGetUuid`) passing on every ordinal of every rank, the data intact; then back to A onto 83/93/E3/F3;
/// - `noreconcile`: the same move with `CRIU_CUDA_MIGRATE_RECONCILE=off`: the seed's failure, NVML Not Found at
///   the stale bus id, so the check above can fail;
/// - `legacy`: the move with the GPUs given by `NVIDIA_VISIBLE_DEVICES` UUIDs (the NVIDIA device plugin's form for
///   the legacy hook) instead of device nodes.
#[test]
fn a_four_rank_pod_moves_between_eight_gpu_nodes_of_the_seeds_layout_on_the_test_doubles() {
    let test = "a_four_rank_pod_moves_between_eight_gpu_nodes_of_the_seeds_layout_on_the_test_doubles";
    let _one = ONE_FLOW.lock().unwrap_or_else(|p| p.into_inner());
    let Some(root) = criu_root_or_skip(test) else {
        return;
    };
    let copy = RootCopy::of(&root, RootKind::Runtimes);
    let scratch = scratch_with_sim("ccm-pod-test-");
    let s = scratch.path().to_str().expect("UTF-8 scratch path");
    let flow = repo_root().join("tests/container/runc-pod-flow.sh");
    let runner = root.run(
        &[scratch.path()],
        &["bash", flow.to_str().expect("UTF-8 path"), s],
        &[("CCM_TRIXIE_ROOT", copy.path().to_str().expect("UTF-8 root path"))],
    );
    assert!(runner.status.success(), "the pod flow failed to run: {}", describe_output(&runner));
    scratch.assert_step("install", "dpkg -i of the package");
    let gpus = scratch.read("rpod-gpus.txt");
    let none = || String::new();

    // seed: A (03/13/63/73), refused on B with three GPUs, B (63/83/E3/F3), back to A (83/93/E3/F3).
    scratch.assert_step("seed-run", "runc run of the pod on node A");
    assert_eq!(
        scratch.rc("seed-ready"),
        Some(0),
        "seed: the ranks did not get ready: {}",
        scratch.read("seed-run.err")
    );
    assert_eq!(scratch.rc("seed-round1"), Some(0), "seed: no report 1: {}", scratch.read("seed-run.err"));
    assert_pod_sound(&scratch, "seed", 1, "a", &[0, 1, 2, 3], &none);
    scratch.assert_step("seed-checkpoint1", "runc checkpoint of the pod on node A");
    let images = scratch.read("seed-images1.txt");
    assert_eq!(
        images.lines().filter(|l| ccm_identity::image::is_image_file_name(l.trim()).is_some()).count(),
        4,
        "seed: not one identity image per rank: {images}"
    );
    let refused = scratch.read("seed-refused.log");
    assert_ne!(scratch.rc("seed-refused"), Some(0), "seed: a restore into a container given 3 GPUs was not refused");
    let (missing, missing_bus) = pod_gpu(&gpus, "a", 3);
    assert!(
        refused.lines().any(|l| l.contains(LOG_PREFIX) && l.contains(&missing) && l.contains(&missing_bus)),
        "seed: the refusal does not name the dump GPU without a place ({missing}, {missing_bus}):\n{}",
        plugin_lines(&refused)
    );
    assert!(
        !refused.contains("Forking task"),
        "seed: CRIU restored tasks before the refusal:\n{}",
        plugin_lines(&refused)
    );
    let before = scratch.read("seed-images-before.sum");
    assert!(before.contains("cuda-migrate-"), "seed: no checksums of the images: {before}");
    assert_eq!(scratch.read("seed-images-after.sum"), before, "seed: the refused restore changed the images");
    assert_pod_restored(&scratch, "seed", "restore1", "b", &[2, 4, 6, 7], "linux.devices /dev/nvidia2 (minor 2)");
    let log = scratch.read("seed-restore1.log");
    let context = || format!("\n--- seed-restore1.log ---\n{}", plugin_lines(&log));
    assert_eq!(scratch.rc("seed-round2"), Some(0), "seed: no report after the restore on B{}", context());
    assert_pod_sound(&scratch, "seed", 2, "b", &[2, 4, 6, 7], &context);
    scratch.assert_step("seed-checkpoint2", "runc checkpoint of the pod on node B");
    assert_pod_restored(&scratch, "seed", "restore2", "a", &[4, 5, 6, 7], "linux.devices /dev/nvidia4 (minor 4)");
    let log2 = scratch.read("seed-restore2.log");
    let context2 = || format!("\n--- seed-restore2.log ---\n{}", plugin_lines(&log2));
    assert_eq!(scratch.rc("seed-round3"), Some(0), "seed: no report after the restore back on A{}", context2());
    assert_pod_sound(&scratch, "seed", 3, "a", &[4, 5, 6, 7], &context2);
    assert_pod_left_nothing(&scratch, "seed");

    // noreconcile: the seed's failure, NVML Not Found at the stale bus id of cuda:0 (03 is not in the container).
    scratch.assert_step("noreconcile-checkpoint1", "runc checkpoint of the pod on node A");
    assert_pod_restored(&scratch, "noreconcile", "restore1", "b", &[2, 4, 6, 7], "linux.devices");
    let log = scratch.read("noreconcile-restore1.log");
    assert!(log.contains("reconciliation is off"), "noreconcile: {}", plugin_lines(&log));
    assert_eq!(scratch.rc("noreconcile-round2"), Some(0), "noreconcile: no report after the restore");
    for rank in 0..4 {
        let r = Report::read(&scratch, &format!("noreconcile-rank{rank}-report2.json"));
        assert!(!r.flag("all_agree") && r.flag("all_data_ok"), "noreconcile rank {rank}: {}", r.compact);
        assert_eq!(r.ordinal_text(0, "uuid"), pod_gpu(&gpus, "b", 2).0, "noreconcile rank {rank}: {}", r.compact);
        assert_eq!(
            r.ordinal_text(0, "cuda_bus_id"),
            pod_gpu(&gpus, "a", 0).1,
            "noreconcile rank {rank}: {}",
            r.compact
        );
        assert_eq!(
            r.ordinal_text(0, "nvml_uuid_by_bus"),
            "NVMLerror:NotFound", /* "NVML error: Not Found", whitespace removed */
            "noreconcile rank {rank}: {}",
            r.compact
        );
    }
    // The check that passes the seed's move above fails on these reports: it can tell.
    let check = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        assert_pod_sound(&scratch, "noreconcile", 2, "b", &[2, 4, 6, 7], &none)
    }));
    assert!(check.is_err(), "noreconcile: the NCCL-init check passed the seed's failure");
    assert_pod_left_nothing(&scratch, "noreconcile");

    // legacy: NVIDIA_VISIBLE_DEVICES instead of device nodes.
    let config = scratch.read("legacy-run-config.json");
    assert!(
        config.contains("NVIDIA_VISIBLE_DEVICES=") && !config.contains("\"path\": \"/dev/nvidia0\""),
        "legacy: the pod was given device nodes in its spec: {config}"
    );
    assert_eq!(scratch.rc("legacy-round1"), Some(0), "legacy: no report 1: {}", scratch.read("legacy-run.err"));
    assert_pod_sound(&scratch, "legacy", 1, "a", &[0, 1, 2, 3], &none);
    scratch.assert_step("legacy-checkpoint1", "runc checkpoint of the legacy-hook pod");
    assert_pod_restored(&scratch, "legacy", "restore1", "b", &[2, 4, 6, 7], "NVIDIA_VISIBLE_DEVICES");
    let log = scratch.read("legacy-restore1.log");
    let context = || format!("\n--- legacy-restore1.log ---\n{}", plugin_lines(&log));
    assert_eq!(scratch.rc("legacy-round2"), Some(0), "legacy: no report after the restore{}", context());
    assert_pod_sound(&scratch, "legacy", 2, "b", &[2, 4, 6, 7], &context);
    assert_pod_left_nothing(&scratch, "legacy");
}
