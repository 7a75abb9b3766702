//! Tests of the TEST DOUBLES as separate processes: `ccm-sim-target` runs on the doubles and
//! `ccm-sim-ctl` drives the checkpoint API on it, exactly as the plugin and CRIU would.
//!
//! The doubles are cdylibs of other packages, so these tests build them first with the same cargo.

// Test code: a failed unwrap or expect names its line (the workspace lints keep them out of product code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use ccm_sim_common::{SimConfig, StateDir};

/// cargo's target directory for this profile (where the binaries and the doubles are).
fn bin_dir() -> PathBuf {
    let target = PathBuf::from(env!("CARGO_BIN_EXE_ccm-sim-ctl"));
    target.parent().expect("the binary has a directory").to_path_buf()
}

/// Builds the two doubles once per test run.
fn doubles() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let dir = bin_dir();
        let mut cmd = Command::new(env!("CARGO"));
        cmd.args(["build", "--quiet", "-p", "cuda-test-double", "-p", "nvml-test-double"]);
        if dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        let status = cmd.status().expect("cargo runs");
        assert!(status.success(), "building the test doubles failed");
        dir
    })
}

struct Sim {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    config: SimConfig,
}

impl Sim {
    fn new() -> Sim {
        let dir = doubles();
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().to_path_buf();
        std::fs::create_dir_all(root.join("lib")).unwrap();
        std::fs::create_dir_all(root.join("state")).unwrap();
        std::os::unix::fs::symlink(dir.join("libcuda_test_double.so"), root.join("lib/libcuda.so.1")).unwrap();
        std::os::unix::fs::symlink(dir.join("libnvml_test_double.so"), root.join("lib/libnvidia-ml.so.1")).unwrap();
        let config = SimConfig::two_h200();
        std::fs::write(root.join("gpus.json"), config.to_json()).unwrap();
        Sim { _tmp: tmp, root, config }
    }

    fn state(&self) -> StateDir {
        StateDir::new(self.root.join("state"))
    }

    fn env(&self, cmd: &mut Command) {
        cmd.env("LD_LIBRARY_PATH", self.root.join("lib"))
            .env("CCM_SIM_CONFIG", self.root.join("gpus.json"))
            .env("CCM_SIM_STATE_DIR", self.root.join("state"))
            .env("CCM_SIM_CALL_TIMEOUT_MS", "500")
            .env_remove("CUDA_VISIBLE_DEVICES")
            .env_remove("CCM_SIM_VISIBLE")
            .env_remove("CCM_SIM_FAULTS")
            .env_remove("CRIU_CUDA_MIGRATE_LIBCUDA")
            .env_remove("CRIU_CUDA_MIGRATE_LIBNVML");
    }

    /// Starts a target and waits for its READY line.
    fn target(&self, extra_env: &[(&str, &str)]) -> Target {
        self.target_under(&[], extra_env)
    }

    /// Starts a target as the last argument of `wrapper` (empty: directly) and waits for its READY line.
    fn target_under(&self, wrapper: &[&str], extra_env: &[(&str, &str)]) -> Target {
        let out = self.root.join(format!("target-{}.out", std::process::id()));
        let go = self.root.join("go");
        let target = env!("CARGO_BIN_EXE_ccm-sim-target");
        let mut cmd = match wrapper.split_first() {
            None => Command::new(target),
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(target);
                c
            }
        };
        self.env(&mut cmd);
        cmd.envs(extra_env.iter().copied());
        cmd.arg("--go").arg(&go).stdin(Stdio::null()).stdout(std::fs::File::create(&out).unwrap());
        let child = cmd.spawn().unwrap();
        let t = Target { child, out, go };
        t.wait_for("READY", Duration::from_secs(10));
        t
    }

    /// Runs ccm-sim-ctl; returns (exit code, output).
    fn ctl(&self, pid: u32, args: &[&str]) -> (i32, String) {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ccm-sim-ctl"));
        self.env(&mut cmd);
        let out = cmd.arg(pid.to_string()).args(args).output().unwrap();
        (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn uuid(&self, i: usize) -> String {
        self.config.gpus[i].uuid.to_string()
    }
}

struct Target {
    child: Child,
    out: PathBuf,
    go: PathBuf,
}

impl Target {
    fn pid(&self) -> u32 {
        self.child.id()
    }
    fn output(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }
    fn wait_for(&self, text: &str, limit: Duration) {
        let t0 = Instant::now();
        while !self.output().contains(text) {
            assert!(t0.elapsed() < limit, "no `{text}` from the target; output:\n{}", self.output());
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    fn finish(mut self) -> (i32, String) {
        std::fs::write(&self.go, "").unwrap();
        let status = self.child.wait().unwrap();
        (status.code().unwrap_or(-1), self.output())
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn line<'a>(out: &'a str, prefix: &str) -> &'a str {
    out.lines().find(|l| l.starts_with(prefix)).unwrap_or_else(|| panic!("no line `{prefix}` in:\n{out}"))
}

#[test]
fn remapped_restore_changes_uuids_but_not_the_cached_pci_location() {
    let sim = Sim::new();
    let t = sim.target(&[]);
    let pid = t.pid();
    let (rc, out) = sim.ctl(pid, &["lockckpt"]);
    assert_eq!(rc, 0, "{out}");
    assert!(out.contains("CTL state=2"), "{out}");

    // Checkpointed: no device files, no device-node descriptors.
    let fds: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .map(|p| p.display().to_string())
        .collect();
    assert!(!fds.iter().any(|p| p.contains("/state/")), "{fds:?}");
    assert_eq!(sim.state().used_bytes(&sim.config.gpus[0].uuid), 0);

    // A map that misses a GPU is refused and the process stays CHECKPOINTED.
    let half = format!("{}={}", sim.uuid(0), sim.uuid(1));
    let (rc, out) = sim.ctl(pid, &["restore", &half]);
    assert_eq!(rc, 1);
    assert!(out.contains("-> 1 CUDA_ERROR_INVALID_VALUE") && out.contains("CTL state=2"), "{out}");

    let (rc, out) = sim.ctl(pid, &["restore", "swap"]);
    assert_eq!(rc, 0, "{out}");
    assert!(out.contains("CTL state=1"), "{out}");
    // The device memory now lives on the other GPU.
    assert!(sim.state().used_bytes(&sim.config.gpus[1].uuid) > 0);
    let (rc, out) = sim.ctl(pid, &["unlock"]);
    assert_eq!(rc, 0, "{out}");

    let (rc, out) = t.finish();
    assert_eq!(rc, 0, "{out}");
    assert_eq!(line(&out, "DATA"), "DATA intact");
    let after0 = line(&out, "AFTER ordinal=0");
    assert!(after0.contains(&format!("cuda_uuid={}", sim.uuid(1))), "{after0}");
    assert!(after0.contains("cuda_bus_id=0000:06:00.0 attr_bus_id=0000:06:00.0"), "{after0}");
    assert!(after0.contains(&format!("nvml_uuid_at_bus_id={}", sim.uuid(0))), "{after0}");
}

/// Another node: the GPU set file rewritten between checkpoint and restore (same bus ids, other UUIDs), as a
/// test switches nodes. The driver's restore runs the process on the GPUs the file names then; its cached PCI
/// words stay those of the dump node.
#[test]
fn a_restore_after_the_gpu_set_file_changed_runs_on_the_new_nodes_gpus() {
    let sim = Sim::new();
    let t = sim.target(&[]);
    let pid = t.pid();
    assert_eq!(sim.ctl(pid, &["lockckpt"]).0, 0);
    let mut node_b = sim.config.clone();
    for g in &mut node_b.gpus {
        g.uuid.0[0] = 0xb0;
    }
    std::fs::write(sim.root.join("gpus.json"), node_b.to_json()).unwrap();
    // Without a map the dump node's GPUs are not on this node: refused, still CHECKPOINTED.
    let (rc, out) = sim.ctl(pid, &["restore"]);
    assert_eq!(rc, 1, "{out}");
    assert!(out.contains("-> 1 CUDA_ERROR_INVALID_VALUE") && out.contains("CTL state=2"), "{out}");
    // Node A's GPU 0 onto node B's GPU 1 and back: the other node's UUIDs, the old bus ids.
    let (a0, a1) = (sim.uuid(0), sim.uuid(1));
    let (b0, b1) = (node_b.gpus[0].uuid.to_string(), node_b.gpus[1].uuid.to_string());
    let (rc, out) = sim.ctl(pid, &["restore", &format!("{a0}={b1},{a1}={b0}")]);
    assert_eq!(rc, 0, "{out}");
    assert!(sim.state().used_bytes(&node_b.gpus[1].uuid) > 0, "the device memory is not on node B's GPU 1");
    assert_eq!(sim.ctl(pid, &["unlock"]).0, 0);
    let (rc, out) = t.finish();
    assert_eq!(rc, 0, "{out}");
    assert_eq!(line(&out, "DATA"), "DATA intact");
    let after0 = line(&out, "AFTER ordinal=0");
    assert!(after0.contains(&format!("cuda_uuid={b1}")), "{after0}");
    assert!(after0.contains("cuda_bus_id=0000:06:00.0"), "{after0}");
    // (This target's NVML was started on node A and keeps that enumeration; the workload's reports start NVML
    // afresh each time.)
    assert!(after0.contains("agree=no"), "{after0}");
}

#[test]
fn identity_restore_keeps_everything_consistent() {
    let sim = Sim::new();
    let t = sim.target(&[]);
    assert_eq!(sim.ctl(t.pid(), &["lockckpt"]).0, 0);
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        // The state comes from the process's memory (as after a CRIU restore from an older dump), not from the
        // file it wrote last. (Reading another process's memory needs root where Yama restricts ptrace.)
        let key = ccm_sim_common::pidns::key_of(i32::try_from(t.pid()).unwrap()).unwrap();
        let reg = sim.state().follow(&key).expect("no index entry");
        std::fs::write(reg.state(), "0").unwrap();
        let (_, out) = sim.ctl(t.pid(), &["state"]);
        assert!(out.contains("CTL state=2"), "{out}");
    }
    assert_eq!(sim.ctl(t.pid(), &["restore"]).0, 0);
    assert_eq!(sim.ctl(t.pid(), &["unlock"]).0, 0);
    let (rc, out) = t.finish();
    assert_eq!(rc, 0, "{out}");
    assert_eq!(line(&out, "IDENTITY"), "IDENTITY agree");
}

#[test]
fn invalid_transitions_and_unknown_processes() {
    let sim = Sim::new();
    let t = sim.target(&[]);
    let pid = t.pid();
    let (_, out) = sim.ctl(pid, &["checkpoint"]);
    assert!(out.contains("-> 401 CUDA_ERROR_ILLEGAL_STATE"), "{out}");
    let (_, out) = sim.ctl(pid, &["unlock"]);
    assert!(out.contains("-> 401"), "{out}");
    assert_eq!(sim.ctl(pid, &["lock"]).0, 0);
    let (_, out) = sim.ctl(pid, &["lock"]);
    assert!(out.contains("-> 401"), "{out}");
    let (_, out) = sim.ctl(pid, &["restore", "swap"]);
    assert!(out.contains("cuCheckpointProcessRestore -> 401"), "{out}");
    assert_eq!(sim.ctl(pid, &["unlock"]).0, 0);

    // Our own test process is no CUDA process of the double.
    let t0 = Instant::now();
    let (_, out) = sim.ctl(std::process::id(), &["lock"]);
    assert!(out.contains("-> 500 CUDA_ERROR_NOT_FOUND"), "{out}");
    assert!(t0.elapsed() < Duration::from_secs(2));
    let (_, out) = sim.ctl(std::process::id(), &["tid"]);
    assert!(out.contains("-> 500"), "{out}");
}

#[test]
fn a_stopped_restore_thread_makes_calls_time_out() {
    let sim = Sim::new();
    let t = sim.target(&[]);
    let pid = t.pid();
    let (_, out) = sim.ctl(pid, &["tid"]);
    let tid: i32 = line(&out, "CTL restore_tid=").trim_start_matches("CTL restore_tid=").parse().unwrap();
    // Stop the whole process, as CRIU's seize does; the restore thread cannot answer.
    // SAFETY: signalling our own child.
    assert_eq!(unsafe { libc::kill(i32::try_from(pid).unwrap(), libc::SIGSTOP) }, 0);
    let (rc, out) = sim.ctl(pid, &["lock", "100"]);
    assert_eq!(rc, 1);
    assert!(out.contains("-> 600 CUDA_ERROR_NOT_READY"), "{out}");
    // The restore tid and state are still answered without the thread.
    let (_, out) = sim.ctl(pid, &["tid"]);
    assert!(out.contains(&format!("CTL restore_tid={tid}")), "{out}");
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(i32::try_from(pid).unwrap(), libc::SIGCONT) }, 0);
    // The abandoned request was withdrawn: the process is still RUNNING and can be locked now.
    let (_, out) = sim.ctl(pid, &["state"]);
    assert!(out.contains("CTL state=0"), "{out}");
    assert_eq!(sim.ctl(pid, &["lock"]).0, 0);
    assert_eq!(sim.ctl(pid, &["unlock"]).0, 0);
}

#[test]
fn fault_knobs() {
    let sim = Sim::new();
    let t = sim.target(&[]);
    let pid = t.pid();
    let faults = sim.state().faults();

    std::fs::write(&faults, "lock-timeout\n").unwrap();
    let (_, out) = sim.ctl(pid, &["lock", "50"]);
    assert!(out.contains("-> 600"), "{out}");

    std::fs::write(&faults, "checkpoint-fail\n").unwrap();
    let (_, out) = sim.ctl(pid, &["lockckpt"]);
    assert!(out.contains("cuCheckpointProcessCheckpoint -> 999") && out.contains("CTL state=1"), "{out}");

    std::fs::write(&faults, "").unwrap();
    assert_eq!(sim.ctl(pid, &["checkpoint"]).0, 0);
    std::fs::write(&faults, "restore-fail=304\n").unwrap();
    let (_, out) = sim.ctl(pid, &["restore", "swap"]);
    assert!(out.contains("-> 304") && out.contains("CTL state=2"), "{out}");

    std::fs::write(&faults, "unlock-fail\n").unwrap();
    assert_eq!(sim.ctl(pid, &["restore", "swap"]).0, 0);
    let (_, out) = sim.ctl(pid, &["unlock"]);
    assert!(out.contains("-> 999") && out.contains("CTL state=1"), "{out}");
    std::fs::write(&faults, "").unwrap();
    assert_eq!(sim.ctl(pid, &["unlock"]).0, 0);
    let (rc, out) = t.finish();
    assert_eq!(rc, 0, "{out}");
}

#[test]
fn cuda_visible_devices_limits_ordinals_but_the_map_must_cover_every_gpu() {
    let sim = Sim::new();
    let g1 = sim.uuid(1);
    let t = sim.target(&[("CUDA_VISIBLE_DEVICES", g1.as_str())]);
    let out = t.output();
    assert!(line(&out, "BEFORE ordinal=0").contains(&format!("cuda_uuid={g1}")), "{out}");
    assert!(!out.contains("BEFORE ordinal=1"), "{out}");
    assert_eq!(sim.ctl(t.pid(), &["lockckpt"]).0, 0);
    // Only the visible GPU mapped: refused, like the real driver.
    let (rc, _) = sim.ctl(t.pid(), &["restore", &format!("{g1}={}", sim.uuid(0))]);
    assert_eq!(rc, 1);
    assert_eq!(sim.ctl(t.pid(), &["restore", "swap"]).0, 0);
    assert_eq!(sim.ctl(t.pid(), &["unlock"]).0, 0);
    let (_, out) = t.finish();
    let after = line(&out, "AFTER ordinal=0");
    assert!(
        after.contains(&format!("cuda_uuid={}", sim.uuid(0))) && after.contains("cuda_bus_id=0000:07:00.0"),
        "{after}"
    );
}

#[test]
fn a_container_view_hides_gpus_from_nvml() {
    let sim = Sim::new();
    let g1 = sim.uuid(1);
    let t = sim.target(&[("CCM_SIM_VISIBLE", g1.as_str())]);
    assert_eq!(sim.ctl(t.pid(), &["lockckpt"]).0, 0);
    // The process enumerated only G1, so a one-pair map covers it.
    assert_eq!(sim.ctl(t.pid(), &["restore", &format!("{g1}={}", sim.uuid(0))]).0, 0);
    assert_eq!(sim.ctl(t.pid(), &["unlock"]).0, 0);
    let (_, out) = t.finish();
    let after = line(&out, "AFTER ordinal=0");
    // The stale bus id names G1's bus, which this process's NVML does see (G1 is its view) ...
    assert!(after.contains("cuda_bus_id=0000:07:00.0"), "{after}");
    assert!(after.contains(&format!("nvml_uuid_at_bus_id={g1}")), "{after}");
}

#[test]
fn nvml_through_nvml_wrapper() {
    use nvml_wrapper::Nvml;
    let sim = Sim::new();
    // This test process loads the double itself; its configuration comes from the environment.
    std::env::set_var("CCM_SIM_CONFIG", sim.root.join("gpus.json"));
    std::env::set_var("CCM_SIM_STATE_DIR", sim.root.join("state"));
    std::env::remove_var("CCM_SIM_VISIBLE");
    std::env::remove_var("CCM_SIM_FAULTS");
    let nvml = Nvml::builder().lib_path(sim.root.join("lib/libnvidia-ml.so.1").as_os_str()).init().unwrap();
    assert_eq!(nvml.device_count().unwrap(), 2);
    assert_eq!(nvml.sys_driver_version().unwrap(), "580.159.04");
    let d1 = nvml.device_by_index(1).unwrap();
    assert_eq!(d1.uuid().unwrap(), sim.uuid(1));
    assert_eq!(d1.minor_number().unwrap(), 1);
    assert_eq!(d1.name().unwrap(), "NVIDIA H200");
    assert_eq!(d1.index().unwrap(), 1);
    assert_eq!(d1.memory_info().unwrap().total, 1 << 30);
    let pci = d1.pci_info().unwrap();
    assert_eq!((pci.domain, pci.bus, pci.device), (0, 7, 0));
    assert_eq!(pci.pci_device_id, 0x233510de);
    assert_eq!(pci.pci_sub_system_id, Some(0x18bf10de));
    assert_eq!(pci.bus_id, "00000000:07:00.0");
    for form in ["0000:07:00.0", "00000000:07:00.0", "0000:07:00.0".to_uppercase().as_str()] {
        assert_eq!(nvml.device_by_pci_bus_id(form).unwrap().uuid().unwrap(), sim.uuid(1), "{form}");
    }
    assert_eq!(nvml.device_by_uuid(sim.uuid(0).as_str()).unwrap().index().unwrap(), 0);
    assert!(matches!(nvml.device_by_pci_bus_id("0000:09:00.0"), Err(nvml_wrapper::error::NvmlError::NotFound)));
}

/// A loud skip, straight to the process's stderr (the test harness captures `eprintln!` of passing tests).
fn skip(why: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "\n######## SKIPPED {why} ########\n");
}

/// The first child of `pid` (what `unshare --fork` started), as a pid of our /proc.
fn first_child(pid: u32) -> Option<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok()?.split_whitespace().next()?.parse().ok()
}

/// A target in its own pid namespace (`unshare --pid --fork --mount-proc`, as a container has): driven from
/// here, the host pid namespace, with its host pid; the restore thread id comes back as a host tid.
#[test]
fn a_target_in_its_own_pid_namespace_is_driven_by_its_host_pid() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        skip("a_target_in_its_own_pid_namespace_is_driven_by_its_host_pid: a pid namespace needs root");
        return;
    }
    let sim = Sim::new();
    let t = sim.target_under(&["unshare", "--pid", "--mount-proc", "--kill-child", "--"], &[]);
    let out = t.output();
    assert!(out.contains("READY pid=1"), "the target is not pid 1 of a namespace of its own:\n{out}");
    let host = first_child(t.pid()).expect("unshare has no child");
    let status = std::fs::read_to_string(format!("/proc/{host}/status")).unwrap();
    let nspid =
        status.lines().find(|l| l.starts_with("NSpid:")).unwrap().split_whitespace().skip(1).collect::<Vec<_>>();
    assert_eq!(nspid, [host.to_string(), "1".to_string()], "{status}");

    // The namespace pid means nothing here (our pid 1 is no CUDA process of the double).
    let (_, o) = sim.ctl(1, &["tid"]);
    assert!(o.contains("-> 500"), "{o}");

    let (rc, o) = sim.ctl(host, &["tid"]);
    assert_eq!(rc, 0, "{o}");
    let tid: u32 = line(&o, "CTL restore_tid=").trim_start_matches("CTL restore_tid=").parse().unwrap();
    let tstatus = std::fs::read_to_string(format!("/proc/{host}/task/{tid}/status"))
        .unwrap_or_else(|e| panic!("restore tid {tid} is no host tid of {host}: {e}"));
    assert!(tstatus.contains("Name:\tcuda-restore"), "{tstatus}");
    let ns_tid = tstatus.lines().find(|l| l.starts_with("NSpid:")).unwrap().split_whitespace().last().unwrap();
    assert_ne!(ns_tid, tid.to_string(), "the host and namespace tids should differ: {tstatus}");
    // The registration holds the namespace tid; the answer is the host one.
    let key = ccm_sim_common::pidns::key_of(i32::try_from(host).unwrap()).unwrap();
    assert_eq!(key.ns_pid, 1);
    let reg = sim.state().follow(&key).expect("no index entry for the namespace key");
    assert_eq!(reg.ns_tid().unwrap().to_string(), ns_tid);

    let (rc, o) = sim.ctl(host, &["lockckpt"]);
    assert_eq!(rc, 0, "{o}");
    assert!(o.contains("CTL state=2"), "{o}");
    assert_eq!(sim.state().used_bytes(&sim.config.gpus[0].uuid), 0);
    let (rc, o) = sim.ctl(host, &["restore", "swap"]);
    assert_eq!(rc, 0, "{o}");
    assert!(o.contains("CTL state=1"), "{o}");
    let (rc, o) = sim.ctl(host, &["unlock"]);
    assert_eq!(rc, 0, "{o}");
    assert!(o.contains("CTL state=0"), "{o}");

    let (rc, out) = t.finish();
    assert_eq!(rc, 0, "{out}");
    assert_eq!(line(&out, "DATA"), "DATA intact");
    let after0 = line(&out, "AFTER ordinal=0");
    assert!(after0.contains(&format!("cuda_uuid={}", sim.uuid(1))), "{after0}");
    // Exited normally: the registration and its index entry are gone.
    assert!(sim.state().follow(&key).is_none() && sim.state().registrations().is_empty());
}

#[test]
fn nvml_missing_knob_fails_nvml_init() {
    let sim = Sim::new();
    let t = sim.target(&[("CCM_SIM_FAULTS", "nvml-missing")]);
    let out = t.output();
    assert!(line(&out, "BEFORE ordinal=0").contains("nvml_uuid_at_bus_id=NVML_UNAVAILABLE"), "{out}");
}

/// The driver's custom storage (CUDA 13.4) on the double, through `ccm_driver::custom_storage` as `ccm-sim-ctl`
/// drives it: the device memory of a LOCKED process mapped into the caller, copied to a file, the process
/// CHECKPOINTED with nothing of it in its host memory (a restore from host memory is refused), then restored from
/// the file onto the other GPU and unlocked, its data intact. A 13.0 driver offers no custom storage.
#[test]
fn custom_storage_moves_the_device_memory_through_the_callers_file_onto_the_other_gpu() {
    let sim = Sim::new();
    let mut config = sim.config.clone();
    config.cuda_driver_version = 13040;
    std::fs::write(sim.root.join("gpus.json"), config.to_json()).unwrap();
    let t = sim.target(&[]);
    let pid = t.pid();
    let file = sim.root.join("device-memory.bin");
    let file = file.to_str().unwrap();
    let (rc, out) = sim.ctl(pid, &["lock"]);
    assert_eq!(rc, 0, "{out}");
    let (rc, out) = sim.ctl(pid, &["custom-checkpoint", file]);
    assert_eq!(rc, 0, "{out}");
    assert!(out.contains("CTL custom regions=2") && out.contains("CTL state=2"), "{out}");
    assert_eq!(sim.state().used_bytes(&sim.config.gpus[0].uuid), 0, "the device memory stayed on G0");
    assert!(std::fs::metadata(file).unwrap().len() > 0);
    // Nothing in the process's host memory: the driver cannot restore it from there.
    let (rc, out) = sim.ctl(pid, &["restore"]);
    assert_eq!(rc, 1, "{out}");
    assert!(out.contains("CUDA_ERROR_INVALID_VALUE") && out.contains("CTL state=2"), "{out}");
    let (rc, out) = sim.ctl(pid, &["custom-restore", file, "swap"]);
    assert_eq!(rc, 0, "{out}");
    assert!(out.contains("CTL state=1"), "{out}");
    let (rc, out) = sim.ctl(pid, &["unlock"]);
    assert_eq!(rc, 0, "{out}");
    let (rc, out) = t.finish();
    assert_eq!(rc, 0, "{out}");
    assert_eq!(line(&out, "DATA"), "DATA intact");
    assert!(line(&out, "AFTER ordinal=0").contains(&format!("cuda_uuid={}", sim.uuid(1))), "{out}");

    // CUDA 13.0 (driver 580): no custom storage; the process is left as it was. (A new set of doubles: the first
    // target's `go` file would let a second one in the same directory run to its end at once.)
    let sim = Sim::new();
    let t = sim.target(&[]);
    let (rc, out) = sim.ctl(t.pid(), &["custom-checkpoint", file]);
    assert_eq!(rc, 1, "{out}");
    assert!(out.contains("custom storage: not offered by this driver"), "{out}");
    let (rc, out) = sim.ctl(t.pid(), &["state"]);
    assert!(rc == 0 && out.contains("CTL state=0"), "{out}");
}
