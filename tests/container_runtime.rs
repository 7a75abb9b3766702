//! The container runtimes of the user guide, end to end, with the Debian package installed as a user installs it
//! and CRIU configured through its files only (docs/USER-GUIDE.md sections 5.2 and 5.3):
//!
//! - Podman 5.4 with runc (libdir in `/etc/criu/runc.conf`): `checkpoint --leave-running --export`, `checkpoint
//!   --export`, `restore --import`; the container comes back with its memory, and the plugin's settings given to
//!   conmon through a `CONTAINERS_CONF_OVERRIDE` file reach the plugin inside CRIU;
//! - Podman with crun (libdir in `/etc/criu/default.conf`): `checkpoint --export`, and `restore --import` where the
//!   host allows it (not on a hybrid cgroup v1 host: tests/container/podman-flow.sh says why);
//! - containerd 1.7 with its runc shim (libdir in `runc.conf`, settings in containerd's environment as the guide's
//!   systemd drop-in gives them): `ctr task checkpoint`, `ctr containers checkpoint --task`, `ctr containers
//!   restore --live`.
//!
//! The containers are busybox shells (no GPU): the plugin must load, say what it was told, leave every process
//! to CRIU, and stay out of the way. The flows are shell scripts in tests/container/, run inside a copy of the
//! runtimes root (`tests/criu-root.sh prepare-runtimes`); each step leaves its status and output in a scratch
//! directory, which this test reads. Needs root like every real-CRIU test (skips loudly without it, fails under CI).

mod support;

use std::fs;
use std::path::Path;

use support::package::{deb, describe_output, RootCopy, RootKind};
use support::{criu_root_or_skip, init_line, repo_root, LOG_PREFIX};

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

    /// A step's status, and its output when it failed.
    fn assert_step(&self, step: &str, what: &str) {
        assert_eq!(
            self.rc(step),
            Some(0),
            "{what} ({step}) failed:\n--- stdout ---\n{}\n--- stderr ---\n{}\n--- flow ---\n{}",
            self.read(&format!("{step}.out")),
            self.read(&format!("{step}.err")),
            self.read("flow.log")
        );
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

#[test]
fn podman_and_containerd_checkpoint_and_restore_containers_with_the_packaged_plugin() {
    let test = "podman_and_containerd_checkpoint_and_restore_containers_with_the_packaged_plugin";
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

    // Podman + crun, the plugin from /etc/criu/default.conf.
    scratch.assert_step("crun-run", "podman run --runtime crun");
    scratch.assert_step("crun-checkpoint", "podman container checkpoint --export (crun)");
    scratch.settings("crun-dump.log");
    let crun_dump = scratch.read("crun-dump.log");
    assert!(crun_dump.contains("is not a CUDA process; leaving it to CRIU"), "{crun_dump}");
    if hybrid {
        let why = scratch.read("crun-restore.skipped");
        assert!(why.contains("hybrid"), "on a hybrid host the crun restore must be skipped with a reason: {why:?}");
        eprintln!("NOTE: podman/crun restore --import not run on this hybrid cgroup v1 host: {why}");
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
