//! `criu-cuda-migrate node --check` on a fake node: a root directory (the hidden `--root`) with
//! CRIU's, containerd's and CRI-O's files and stand-in commands, and the driver from the test
//! doubles of libcuda and NVML (crates/sim). A node right in everything reports ready (exit 0);
//! each wrong setting is found (a FAIL line naming it, exit 1).
//!
//! The doubles are cdylibs of other packages, which `cargo test -p ccm-cli` does not build: the
//! first test builds them (`cargo build -p cuda-test-double -p nvml-test-double`). If that fails,
//! the tests say so and pass, unless `CCM_REQUIRE_TEST_DOUBLES=1` (CI).

// Test code: a failed unwrap or expect names its line (the workspace lints keep them out of product code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const G0: &str = "GPU-5e110000-aabb-ccdd-0001-020304050600";
const G1: &str = "GPU-5e110001-aabb-ccdd-0001-020304050601";
const PLUGIN_DIR: &str = "usr/lib/criu-cuda-migrate/plugins";

fn cli() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_criu-cuda-migrate"))
}

/// The doubles' folder (where cargo puts this package's binary), built when missing.
fn doubles() -> Option<PathBuf> {
    let dir = cli().parent().map(Path::to_path_buf).unwrap_or_default();
    let needed = ["libcuda_test_double.so", "libnvml_test_double.so"];
    if needed.iter().any(|n| !dir.join(n).exists()) {
        let status = Command::new(env!("CARGO"))
            .args(["build", "-p", "cuda-test-double", "-p", "nvml-test-double"])
            .args(dir.file_name().filter(|n| *n == "release").map(|_| "--release"))
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status();
        if !status.is_ok_and(|s| s.success()) {
            eprintln!("building the test doubles failed");
        }
    }
    let missing: Vec<_> = needed.iter().filter(|n| !dir.join(n).exists()).collect();
    if !missing.is_empty() {
        let msg = format!("test doubles {missing:?} not built in {}", dir.display());
        assert!(std::env::var("CCM_REQUIRE_TEST_DOUBLES").as_deref() != Ok("1"), "{msg}");
        eprintln!("SKIPPED: {msg}");
        return None;
    }
    Some(dir)
}

/// A fake node: its root, the simulated GPUs' files, the doubles.
struct Node {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    sim: PathBuf,
    doubles: PathBuf,
    libcuda: PathBuf,
    libnvml: PathBuf,
}

const CDI: &str = "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: \"0\"\n  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia0\n- name: \"1\"\n  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia1\ncontainerEdits:\n  deviceNodes:\n  - path: /dev/nvidiactl\n";

impl Node {
    /// A node right in everything: the package's plugin and its libdir line in default.conf, runc,
    /// CRIU 4.1.1 whose check passes, iptables, nvidia-smi with persistence on, containerd 2.2
    /// with restore through CRI on, a CDI spec of both simulated GPUs.
    fn good() -> Option<Node> {
        let doubles = doubles()?;
        let tmp = tempfile::tempdir().expect("temporary directory");
        let root = tmp.path().join("root");
        let sim = tmp.path().join("sim");
        std::fs::create_dir_all(sim.join("state")).unwrap();
        let gpu = |uuid: &str, bus: u32, minor: u32| {
            format!(
                r#"{{"uuid":"{uuid}","pci_bus_id":"0000:{bus:02x}:00.0","pci_device_id":"0x233510de","pci_subsystem_id":"0x18bf10de","minor":{minor}}}"#
            )
        };
        std::fs::write(
            sim.join("gpus.json"),
            format!(
                r#"{{"driver_version":"580.159.04","cuda_driver_version":13000,"gpus":[{},{}]}}"#,
                gpu(G0, 6, 0),
                gpu(G1, 7, 1)
            ),
        )
        .unwrap();
        let n = Node {
            libcuda: doubles.join("libcuda_test_double.so"),
            libnvml: doubles.join("libnvml_test_double.so"),
            _tmp: tmp,
            root,
            sim,
            doubles,
        };
        n.write("etc/criu/default.conf", "# criu-cuda-migrate\nlibdir /usr/lib/criu-cuda-migrate/plugins\n");
        n.write(&format!("{PLUGIN_DIR}/criu_cuda_migrate.so"), "not really ELF");
        std::fs::create_dir_all(n.root.join("usr/lib/criu")).unwrap();
        n.command(
            "usr/sbin/criu",
            "case \"$1\" in --version) echo 'Version: 4.1.1';; check) echo 'Looks good.';; esac",
        );
        n.command("usr/sbin/runc", "echo 'runc version 1.1.15'");
        n.command("usr/sbin/iptables-restore", "exit 0");
        n.command("usr/sbin/ip6tables-restore", "exit 0");
        n.command("usr/bin/nvidia-smi", &format!("echo '{G0}, Enabled'; echo '{G1}, Enabled'"));
        n.command("usr/bin/containerd", "echo 'containerd github.com/containerd/containerd/v2 v2.2.0 1c4457e'");
        n.write(
            "etc/containerd/config.toml",
            "version = 3\n[plugins.'io.containerd.cri.v1.runtime']\n  enable_experimental_restore_via_create = true\n",
        );
        n.write("etc/cdi/nvidia.yaml", CDI);
        Some(n)
    }

    fn write(&self, rel: &str, text: &str) {
        let p = self.root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        let _ = std::fs::remove_file(&p);
        std::fs::write(&p, text).unwrap();
    }

    fn remove(&self, rel: &str) {
        std::fs::remove_file(self.root.join(rel)).unwrap();
    }

    /// A stand-in command: a shell script.
    fn command(&self, rel: &str, body: &str) {
        self.write(rel, &format!("#!/bin/sh\n{body}\n"));
        std::fs::set_permissions(self.root.join(rel), std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    fn check(&self, json: bool) -> Output {
        let mut c = Command::new(cli());
        c.args(["node", "--check", "--root"]).arg(&self.root);
        if json {
            c.arg("--json");
        }
        c.env("CCM_SIM_CONFIG", self.sim.join("gpus.json"))
            .env("CCM_SIM_STATE_DIR", self.sim.join("state"))
            .env("CRIU_CUDA_MIGRATE_LIBCUDA", &self.libcuda)
            .env("CRIU_CUDA_MIGRATE_LIBNVML", &self.libnvml)
            .env_remove("CCM_SIM_VISIBLE")
            .env_remove("LD_LIBRARY_PATH")
            .output()
            .expect("run criu-cuda-migrate")
    }

    /// The check's text output; asserts its exit code.
    fn text(&self, code: i32) -> String {
        let out = self.check(false);
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert_eq!(out.status.code(), Some(code), "node --check:\n{text}");
        text
    }

    /// Asserts the node is not ready, with a FAIL line of `check` that holds `needle`.
    fn assert_fails(&self, check: &str, needle: &str) {
        let text = self.text(1);
        let hit = text.lines().any(|l| l.starts_with("FAIL") && l.split_whitespace().nth(1) == Some(check));
        assert!(hit, "no FAIL line of {check}:\n{text}");
        assert!(text.contains(needle), "lacks {needle:?}:\n{text}");
        assert!(text.contains("node NOT ready"), "{text}");
    }
}

#[test]
fn a_good_fake_node_is_ready() {
    let Some(n) = Node::good() else { return };
    let text = n.text(0);
    assert!(text.contains("node ready for GPU checkpoint/restore"), "{text}");
    assert!(!text.contains("FAIL"), "{text}");
    for needle in [
        "libdir /usr/lib/criu-cuda-migrate/plugins (/etc/criu/default.conf) holds the plugin",
        "CRIU 4.1.1",
        "Looks good.",
        "NVIDIA driver 580.159.04",
        G0,
        "cuCheckpointProcess",
        "persistence mode on for all 2 GPU(s)",
        "enable_experimental_restore_via_create = true",
        "iptables-restore and ip6tables-restore are installed",
        "/etc/cdi/nvidia.yaml name every GPU",
    ] {
        assert!(text.contains(needle), "lacks {needle:?}:\n{text}");
    }
    // JSON: one document, every line with its verdict.
    let out = n.check(true);
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    assert_eq!(v["ready"], true, "{v}");
    let checks = v["checks"].as_array().expect("checks");
    assert!(checks.iter().all(|c| c["verdict"] == "ok"), "{v:#}");
    assert!(checks.iter().any(|c| c["check"] == "libdir:runc"), "runc is installed: its libdir is checked: {v:#}");
}

#[test]
fn each_wrong_criu_setting_is_found() {
    let Some(n) = Node::good() else { return };
    // No libdir line: CRIU looks in its default directory, which lacks the plugin.
    n.write("etc/criu/default.conf", "# nothing\n");
    n.assert_fails("libdir:criu", "no libdir line");
    // runc's own file sends its CRIU elsewhere.
    n.write("etc/criu/default.conf", "libdir /usr/lib/criu-cuda-migrate/plugins\n");
    n.write("etc/criu/runc.conf", "libdir /opt/missing\n");
    n.assert_fails("libdir:runc", "/opt/missing (/etc/criu/runc.conf) does not exist");
    n.remove("etc/criu/runc.conf");
    // The plugin copied next to CRIU's own cuda_plugin.so.
    n.write("etc/criu/default.conf", "libdir=/usr/lib/criu\n");
    n.write("usr/lib/criu/cuda_plugin.so", "");
    n.write("usr/lib/criu/criu_cuda_migrate.so", "");
    n.assert_fails("libdir:criu", "cuda_plugin.so");
    n.write("etc/criu/default.conf", "libdir /usr/lib/criu-cuda-migrate/plugins\n");
    // CRIU too old, its check failing, CRIU missing.
    n.command("usr/sbin/criu", "case \"$1\" in --version) echo 'Version: 3.17.1';; check) echo 'Looks good.';; esac");
    n.assert_fails("criu-version", "3.17.1, older than 4.0");
    n.command("usr/sbin/criu", "case \"$1\" in --version) echo 'Version: 4.2.1';; check) echo 'Error (cr-check.c:1): no ptrace' >&2; exit 1;; esac");
    n.assert_fails("criu-check", "no ptrace");
    n.remove("usr/sbin/criu");
    n.assert_fails("criu-version", "criu is not installed");
}

#[test]
fn each_wrong_runtime_setting_is_found() {
    let Some(n) = Node::good() else { return };
    // containerd 2.2 without restore through CRI.
    n.write("etc/containerd/config.toml", "version = 3\n[plugins.'io.containerd.cri.v1.runtime']\n");
    n.assert_fails("containerd", "enable_experimental_restore_via_create");
    n.remove("etc/containerd/config.toml");
    n.assert_fails("containerd", "no /etc/containerd/config.toml");
    n.remove("usr/bin/containerd");
    // CRI-O that only checkpoints.
    n.command("usr/bin/crio", "echo 'crio version 1.34.1'");
    n.write("etc/crio/crio.conf", "[crio.checkpoint_restore]\ncontainer_level_enabled = \"checkpoint_restore\"\n");
    n.write(
        "etc/crio/crio.conf.d/10-off.conf",
        "[crio.checkpoint_restore]\ncontainer_level_enabled = \"checkpoint_only\"\n",
    );
    n.assert_fails("cri-o", "10-off.conf");
    n.remove("etc/crio/crio.conf.d/10-off.conf");
    assert!(n.text(0).contains("container_level_enabled = \"checkpoint_restore\""));
    // No iptables for CRIU's network lock.
    n.remove("usr/sbin/iptables-restore");
    n.assert_fails("network-lock", "read unixpacket @->@: EOF");
}

#[test]
fn each_wrong_driver_fact_is_found() {
    let Some(mut n) = Node::good() else { return };
    // A CDI spec that misses GPU 1.
    n.write("etc/cdi/nvidia.yaml", &CDI.replace("/dev/nvidia1", "/dev/nvidia-uvm"));
    n.assert_fails("cdi", &format!("{G1} (/dev/nvidia1)"));
    n.write("etc/cdi/nvidia.yaml", CDI);
    // Persistence mode off: a warning, still ready.
    n.command("usr/bin/nvidia-smi", &format!("echo '{G0}, Disabled'; echo '{G1}, Enabled'"));
    let text = n.text(0);
    assert!(text.lines().any(|l| l.starts_with("WARN") && l.contains("persistence mode off on")), "{text}");
    // A libcuda without the checkpoint API (the NVML double stands in for an old libcuda).
    n.libcuda = n.doubles.join("libnvml_test_double.so");
    n.assert_fails("checkpoint-api", "cuCheckpointProcess");
    // No NVML at all.
    n.libnvml = n.sim.join("nonexistent/libnvidia-ml.so.1");
    n.assert_fails("driver", "NVML");
}

#[test]
fn hostile_files_are_refused_unread_and_output_escaped() {
    let Some(n) = Node::good() else { return };
    // default.conf a link to a file elsewhere: not followed, said so; CRIU's default then applies.
    let elsewhere = n.sim.join("conf");
    std::fs::write(&elsewhere, "libdir /usr/lib/criu-cuda-migrate/plugins\n").unwrap();
    n.remove("etc/criu/default.conf");
    std::os::unix::fs::symlink(&elsewhere, n.root.join("etc/criu/default.conf")).unwrap();
    let text = n.text(1);
    assert!(text.contains("symbolic link"), "{text}");
    n.remove("etc/criu/default.conf");
    n.write("etc/criu/default.conf", "libdir /usr/lib/criu-cuda-migrate/plugins\n");
    // A FIFO among the CDI specs (a read would block), a huge config file.
    let fifo = n.root.join("etc/cdi/fifo.yaml");
    assert!(Command::new("mkfifo").arg(&fifo).status().is_ok_and(|s| s.success()));
    n.write("etc/containerd/config.toml", &"#".repeat(2 << 20));
    // Escape sequences in a command's output.
    n.command("usr/sbin/criu", "case \"$1\" in --version) printf 'Version: 4.1.1\\033[2J\\r\\n';; check) printf '\\033]0;owned\\007Looks good.\\n';; esac");
    let started = std::time::Instant::now();
    let out = n.check(false);
    assert!(started.elapsed() < std::time::Duration::from_secs(15), "took {:?}", started.elapsed());
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(!text.contains('\u{1b}') && !text.contains('\u{7}') && !text.contains('\r'), "{text:?}");
    assert!(text.contains("fifo.yaml not read"), "{text}");
    assert!(text.contains("config.toml not read"), "{text}");
}

/// The check runs the commands it finds, as root: one that another user could change (group- or world-writable,
/// or in such a directory) is not run, is named on stderr, and counts as absent.
#[test]
fn a_command_others_can_change_is_not_run() {
    use std::os::unix::fs::PermissionsExt;
    let Some(n) = Node::good() else { return };
    let marker = n.sim.join("ran");
    n.command("usr/sbin/criu", &format!("touch {}; echo 'Version: 4.1.1'", marker.display()));
    std::fs::set_permissions(n.root.join("usr/sbin/criu"), std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = n.check(false);
    let (text, err) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!marker.exists(), "a world-writable criu was run: {text}");
    assert!(text.contains("criu is not installed"), "{text}");
    assert!(err.contains("usr/sbin/criu: not run") && err.contains("other users"), "{err}");
    // The same file, writable by its owner only, in a directory others can write (no sticky bit): not run either.
    std::fs::set_permissions(n.root.join("usr/sbin/criu"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(n.root.join("usr/sbin"), std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = n.check(false);
    assert!(!marker.exists(), "criu in a world-writable directory was run");
    assert!(String::from_utf8_lossy(&out.stderr).contains("not run"), "{}", String::from_utf8_lossy(&out.stderr));
}

/// A search directory through `/proc/PID/root` (issue 35 item 6): the check walked the link by its text (`/`),
/// vouched for the host's file and then ran, by name, the one in PID's mount namespace. Here the stand-in root is
/// named through such a link, and PID's namespace has another `criu` over the host's: the check must run neither
/// (a path through a /proc link is refused, named on stderr), and the namespace's file never runs.
#[test]
fn a_command_reached_through_a_proc_link_is_not_run() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("SKIPPED: a mount namespace of its own needs root");
        return;
    }
    let Some(n) = Node::good() else { return };
    let marker = n.sim.join("namespace-criu-ran");
    // The namespace's criu: a tmpfs over usr/sbin, only in the namespace, with a criu that leaves a marker.
    let sbin = n.root.join("usr/sbin");
    let script = format!(
        "mount -t tmpfs -o mode=0755 none '{sbin}' && printf '#!/bin/sh\\ntouch {marker}\\necho Version: 9.9.9\\n' > \
         '{sbin}/criu' && chmod 0755 '{sbin}/criu' && echo READY && exec sleep 120",
        sbin = sbin.display(),
        marker = marker.display()
    );
    let mut ns = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("unshare");
    let mut ready = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(ns.stdout.take().unwrap()), &mut ready).unwrap();
    assert_eq!(ready.trim(), "READY", "the namespace was not set up");
    let via = PathBuf::from(format!("/proc/{}/root{}", ns.id(), n.root.display()));
    let out = Command::new(cli())
        .args(["node", "--check", "--root"])
        .arg(&via)
        .env("CCM_SIM_CONFIG", n.sim.join("gpus.json"))
        .env("CCM_SIM_STATE_DIR", n.sim.join("state"))
        .env("CRIU_CUDA_MIGRATE_LIBCUDA", &n.libcuda)
        .env("CRIU_CUDA_MIGRATE_LIBNVML", &n.libnvml)
        .env_remove("CCM_SIM_VISIBLE")
        .output()
        .expect("run criu-cuda-migrate");
    let _ = ns.kill();
    let _ = ns.wait();
    let (text, err) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!marker.exists(), "the other namespace's criu was run after the host's was checked:\n{text}");
    assert!(!text.contains("9.9.9"), "{text}");
    assert!(text.contains("criu is not installed"), "{text}");
    assert!(err.contains("usr/sbin/criu: not run") && err.contains("a link in /proc"), "{err}");
}

/// Whether `pid` is a live process (not gone, not a zombie waiting for its reaper).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').map(|(_, rest)| !rest.trim_start().starts_with('Z')))
        .unwrap_or(false)
}

/// The pid a stand-in command wrote into `file` (waits for it a little: the command runs in the background).
fn pid_in(file: &Path) -> u32 {
    for _ in 0..100 {
        if let Some(pid) = std::fs::read_to_string(file).ok().and_then(|t| t.trim().parse().ok()) {
            return pid;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    panic!("no pid in {}", file.display());
}

impl Node {
    /// The check with its hidden `--deadline` and extra environment; its text output and how long it took.
    fn check_with(&self, deadline: u64, env: &[(&str, &str)]) -> (Output, std::time::Duration) {
        let mut c = Command::new(cli());
        c.args(["node", "--check", "--deadline", &deadline.to_string(), "--root"])
            .arg(&self.root)
            .env("CCM_SIM_CONFIG", self.sim.join("gpus.json"))
            .env("CCM_SIM_STATE_DIR", self.sim.join("state"))
            .env("CRIU_CUDA_MIGRATE_LIBCUDA", &self.libcuda)
            .env("CRIU_CUDA_MIGRATE_LIBNVML", &self.libnvml)
            .env_remove("CCM_SIM_VISIBLE")
            .env_remove("CCM_SIM_FAULTS")
            .env_remove("LD_LIBRARY_PATH");
        for (k, v) in env {
            c.env(k, v);
        }
        // Waited for at most a minute: a check that hangs fails the test instead of holding it.
        let t0 = std::time::Instant::now();
        let mut child = c
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run criu-cuda-migrate");
        while child.try_wait().expect("wait").is_none() {
            if t0.elapsed() > std::time::Duration::from_secs(60) {
                let _ = child.kill();
                let _ = child.wait();
                panic!("node --check --deadline {deadline} still ran after 60 s");
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let out = child.wait_with_output().expect("output");
        (out, t0.elapsed())
    }
}

/// An NVML whose init never returns (the double's `nvml-init-hang`): before, `node --check` waited without end
/// (past 90 s) because it called NVML on its own thread. Now the driver's calls run on threads of their own, and the
/// check ends at its deadline with a FAIL line naming what did not answer; libcuda, asked on its own thread, still
/// answers.
#[test]
fn a_driver_that_never_answers_ends_at_the_deadline() {
    let Some(n) = Node::good() else { return };
    let (out, took) = n.check_with(2, &[("CCM_SIM_FAULTS", "nvml-init-hang")]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(took < std::time::Duration::from_secs(15), "took {took:?}:\n{text}");
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.lines().any(|l| l.starts_with("FAIL") && l.contains("driver") && l.contains("did not answer within 2 s")),
        "{text}"
    );
    assert!(text.lines().any(|l| l.starts_with("ok") && l.contains("checkpoint-api")), "{text}");
}

/// A command that outlives its deadline and has a child that ignores the end of its parent (SIGTERM and SIGHUP
/// ignored, in the background), and one that exits at once but leaves a child holding its output: before, the check
/// killed only the command itself, and both children ran on, reparented. Now each command runs in a process group
/// of its own and the whole group is killed, at the deadline or once the command exited.
#[test]
fn a_commands_children_end_with_it() {
    let Some(n) = Node::good() else { return };
    let (stuck, lingering) = (n.sim.join("stuck-child.pid"), n.sim.join("lingering-child.pid"));
    n.command(
        "usr/sbin/criu",
        &format!(
            "case \"$1\" in\n--version) sh -c 'trap \"\" TERM HUP INT; exec sleep 300' & echo $! > {stuck}; sleep 300;;\n\
             check) echo 'Looks good.'; sleep 300 & echo $! > {lingering};;\nesac",
            stuck = stuck.display(),
            lingering = lingering.display()
        ),
    );
    // criu --version hangs: `criu check` is still run (its version unknown is no "not installed").
    let (out, took) = n.check_with(2, &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    let (stuck_pid, lingering_pid) = (pid_in(&stuck), pid_in(&lingering));
    let survivors: Vec<u32> = [stuck_pid, lingering_pid].into_iter().filter(|p| alive(*p)).collect();
    for p in &survivors {
        let _ = Command::new("kill").args(["-KILL", &p.to_string()]).status();
    }
    assert!(survivors.is_empty(), "children of the check's commands outlived it: {survivors:?}\n{text}");
    assert!(text.contains("killed after 2 s"), "{text}");
    assert!(took < std::time::Duration::from_secs(15), "took {took:?}");
}

/// The labels of a feature file as NFD's `local` source reads them: `name=value` lines, `#` lines skipped.
fn nfd_labels(text: &str) -> Vec<(String, String)> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (k, v) = l.split_once('=').unwrap_or((l, "true"));
            (k.to_string(), v.to_string())
        })
        .collect()
}

/// A Kubernetes qualified label name with a prefix (what nfd-master's validation requires): a DNS subdomain of at
/// most 253 characters, `/`, a name of at most 63 characters of alphanumerics, `-`, `_`, `.` that starts and ends
/// alphanumeric.
fn qualified_label_name(k: &str) -> bool {
    let Some((prefix, name)) = k.split_once('/') else { return false };
    let alnum_ends = |s: &str| {
        s.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
            && s.chars().last().is_some_and(|c| c.is_ascii_alphanumeric())
    };
    let dns = prefix.len() <= 253
        && prefix.split('.').all(|p| {
            !p.is_empty()
                && p.len() <= 63
                && alnum_ends(p)
                && p.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        });
    dns && !name.is_empty()
        && name.len() <= 63
        && alnum_ends(name)
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// `node --check --nfd-dir DIR` (issue 36 part 5): the verdict as NFD's feature file, written whole under a
/// temporary dot-name and renamed, no link followed: on a ready node and on one that is not, over a link planted at
/// the file's name (replaced, its target untouched), and refused when the directory is a link or missing.
#[test]
fn the_verdict_is_written_as_an_nfd_feature_file() {
    let Some(n) = Node::good() else { return };
    let features = n.sim.join("features.d");
    std::fs::create_dir(&features).unwrap();
    let run = |dir: &Path| {
        Command::new(cli())
            .args(["node", "--check", "--root"])
            .arg(&n.root)
            .arg("--nfd-dir")
            .arg(dir)
            .env("CCM_SIM_CONFIG", n.sim.join("gpus.json"))
            .env("CCM_SIM_STATE_DIR", n.sim.join("state"))
            .env("CRIU_CUDA_MIGRATE_LIBCUDA", &n.libcuda)
            .env("CRIU_CUDA_MIGRATE_LIBNVML", &n.libnvml)
            .env_remove("CCM_SIM_VISIBLE")
            .env_remove("CCM_SIM_FAULTS")
            .output()
            .expect("run criu-cuda-migrate")
    };
    let file = features.join("criu-cuda-migrate");
    // A link planted at the name: replaced by the new file, never written through.
    let victim = n.sim.join("victim");
    std::fs::write(&victim, "keep").unwrap();
    std::os::unix::fs::symlink(&victim, &file).unwrap();
    let out = run(&features);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains(&format!("NFD feature file {} written", file.display())), "{stdout}");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep", "written through the planted link");
    assert!(!std::fs::symlink_metadata(&file).unwrap().file_type().is_symlink());
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.len() < 65536, "NFD ignores a file over 64 KiB");
    let labels = nfd_labels(&text);
    let p = "criu-cuda-migrate.feature.node.kubernetes.io/";
    assert_eq!(
        labels,
        [
            (format!("{p}ready"), "true".to_string()),
            (format!("{p}driver-branch"), "580".to_string()),
            (format!("{p}criu-version"), "4.1.1".to_string()),
            (format!("{p}cri-restore"), "on".to_string()),
        ],
        "{text}"
    );
    assert!(labels.iter().all(|(k, _)| qualified_label_name(k)), "{labels:?}");
    let names: Vec<String> =
        std::fs::read_dir(&features).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    assert_eq!(names, ["criu-cuda-migrate"], "no temporary file left behind");
    // Not ready (restore through CRI off in containerd 2.2): the labels say so, exit 1; JSON names the file.
    n.write("etc/containerd/config.toml", "version = 3\n");
    let out = run(&features);
    assert_eq!(out.status.code(), Some(1));
    let labels = nfd_labels(&std::fs::read_to_string(&file).unwrap());
    assert!(labels.contains(&(format!("{p}ready"), "false".into())), "{labels:?}");
    assert!(labels.contains(&(format!("{p}cri-restore"), "off".into())), "{labels:?}");
    // The directory through a link, or missing: refused (exit 2), nothing written there.
    let link = n.sim.join("features-link");
    std::os::unix::fs::symlink(&features, &link).unwrap();
    std::fs::remove_file(&file).unwrap();
    let out = run(&link);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--nfd-dir") && err.contains("symbolic link"), "{err}");
    assert!(!file.exists(), "written through a directory link");
    let out = run(&n.sim.join("missing"));
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("does not exist"));
}
