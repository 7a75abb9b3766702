//! `ccm-sample-workload` against the test doubles of libcuda and NVML (crates/sim).
//!
//! The doubles are cdylibs of other packages, which `cargo test -p ccm-workload` does not build:
//! build them first (`cargo build -p cuda-test-double -p nvml-test-double -p ccm-sim-common`).
//! Without them these tests say so on stderr and pass, unless `CCM_REQUIRE_TEST_DOUBLES=1` (CI),
//! which makes a missing double a failure.

// Test code: a failed unwrap or expect names its line (the workspace lints keep them out of product code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const G0: &str = "GPU-11111111-2222-3333-4444-555555555555";
const G1: &str = "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee";

struct Sim {
    _dir: tempfile::TempDir,
    root: PathBuf,
    bin_dir: PathBuf,
}

/// The build folder holding this test's workload binary, where the doubles land too.
fn bin_dir() -> PathBuf {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_ccm-sample-workload"));
    exe.parent().map(Path::to_path_buf).unwrap_or_default()
}

fn sim() -> Option<Sim> {
    let bin_dir = bin_dir();
    let needed = ["libcuda_test_double.so", "libnvml_test_double.so", "ccm-sim-ctl"];
    if needed.iter().any(|n| !bin_dir.join(n).exists()) {
        // A plain `cargo test` builds this package's binary but not the doubles: build them.
        let status = std::process::Command::new(env!("CARGO"))
            .args(["build", "-p", "cuda-test-double", "-p", "nvml-test-double", "-p", "ccm-sim-common"])
            .args(bin_dir.file_name().filter(|n| *n == "release").map(|_| "--release"))
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("run cargo build");
        assert!(status.success(), "building the test doubles failed");
    }
    let missing: Vec<_> = needed.iter().filter(|n| !bin_dir.join(n).exists()).collect();
    if !missing.is_empty() {
        let msg = format!("test doubles {missing:?} not built in {}", bin_dir.display());
        assert!(std::env::var("CCM_REQUIRE_TEST_DOUBLES").as_deref() != Ok("1"), "{msg}");
        eprintln!("SKIPPED: {msg}");
        return None;
    }
    let dir = tempfile::tempdir().expect("temporary directory");
    let root = dir.path().to_path_buf();
    std::fs::create_dir_all(root.join("state")).expect("state dir");
    let gpu = |uuid: &str, bus: &str, minor: u32| {
        format!(
            r#"{{ "uuid": "{uuid}", "pci_bus_id": "{bus}", "pci_device_id": "0x233510de", "pci_subsystem_id": "0x18bf10de", "minor": {minor}, "name": "NVIDIA H200", "memory_total": 150754820096 }}"#
        )
    };
    let config = format!(
        r#"{{ "driver_version": "580.159.04", "cuda_driver_version": 13000, "gpus": [ {}, {} ] }}"#,
        gpu(G0, "0000:00:06.0", 0),
        gpu(G1, "0000:00:07.0", 1)
    );
    std::fs::write(root.join("gpus.json"), config).expect("GPU set");
    Some(Sim { _dir: dir, root, bin_dir })
}

impl Sim {
    fn command(&self, program: &Path) -> Command {
        let mut c = Command::new(program);
        c.env("CCM_SIM_CONFIG", self.root.join("gpus.json"))
            .env("CCM_SIM_STATE_DIR", self.root.join("state"))
            .env("CRIU_CUDA_MIGRATE_LIBCUDA", self.bin_dir.join("libcuda_test_double.so"))
            .env("CRIU_CUDA_MIGRATE_LIBNVML", self.bin_dir.join("libnvml_test_double.so"))
            .env_remove("CUDA_VISIBLE_DEVICES");
        c
    }
    fn workload(&self) -> Command {
        self.command(Path::new(env!("CARGO_BIN_EXE_ccm-sample-workload")))
    }
    fn ctl(&self, pid: u32, args: &[&str]) {
        let out = self
            .command(&self.bin_dir.join("ccm-sim-ctl"))
            .arg(pid.to_string())
            .args(args)
            .output()
            .expect("run ccm-sim-ctl");
        assert!(out.status.success(), "ccm-sim-ctl {args:?}: {}", String::from_utf8_lossy(&out.stdout));
    }
}

fn wait_for(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !path.exists() {
        assert!(Instant::now() < deadline, "{} did not appear in 30 s", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).expect("report")).expect("report is JSON")
}

#[test]
fn report_now_sees_both_gpus_consistently() {
    let Some(sim) = sim() else { return };
    let out = sim.workload().args(["--report-now", "--mib", "3", "--devices", "0,1"]).output().expect("run workload");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stdout holds only the JSON report");
    assert_eq!(r["device_count"], 2);
    assert_eq!(r["all_consistent"], true, "{r:#}");
    assert_eq!(r["all_data_ok"], true);
    assert_eq!(r["all_ctx_ok"], true);
    assert_eq!(r["devices"][0]["uuid"], G0);
    assert_eq!(r["devices"][1]["nvml_bus_by_uuid"], "00000000:00:07.0");
    assert_eq!(r["devices"][1]["data_bytes"], 3 << 20);
}

#[test]
fn rounds_report_the_stale_identity_after_a_swap_and_hold_no_fd_to_the_dir() {
    let Some(sim) = sim() else { return };
    let dir = sim.root.join("w");
    std::fs::create_dir_all(&dir).expect("dir");
    let mut child = sim
        .workload()
        .args(["--dir", dir.to_str().expect("utf-8 path"), "--mib", "2", "--devices", "0,1", "--rounds", "2"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start workload");
    wait_for(&dir.join("ready"));
    let pid: u32 = std::fs::read_to_string(dir.join("ready")).expect("ready").trim().parse().expect("pid");
    assert_eq!(pid, child.id());

    // Between rounds the process holds no fd into its control directory (CRIU must dump it).
    for fd in std::fs::read_dir(format!("/proc/{pid}/fd")).expect("fd list") {
        let target = std::fs::read_link(fd.expect("fd").path()).unwrap_or_default();
        assert!(!target.starts_with(&dir), "workload holds {}", target.display());
    }

    // Round 1 without migration: all consistent.
    std::fs::write(dir.join("go1"), b"").expect("go1");
    wait_for(&dir.join("done1"));
    let r = read_json(&dir.join("report1.json"));
    assert_eq!(r["all_consistent"], true, "{r:#}");

    // The driver's swap without any reconciliation: the new UUID with the old bus id.
    sim.ctl(pid, &["lockckpt"]);
    sim.ctl(pid, &["restore", "swap"]);
    sim.ctl(pid, &["unlock"]);
    std::fs::write(dir.join("go2"), b"").expect("go2");
    wait_for(&dir.join("done2"));
    let r = read_json(&dir.join("report2.json"));
    let o0 = &r["devices"][0];
    assert_eq!(o0["uuid"], G1, "{r:#}");
    assert_eq!(o0["cuda_bus_id"].as_str().map(str::to_ascii_lowercase).as_deref(), Some("0000:00:06.0"));
    assert_eq!(o0["nvml_uuid_by_bus"], G0);
    assert_eq!(o0["agree"], false);
    assert_eq!(r["devices"][1]["agree"], false);
    assert_eq!(r["all_data_ok"], true, "device data survives the swap");
    assert_eq!(r["all_ctx_ok"], true);

    let status = child.wait().expect("workload exits after its rounds");
    assert!(status.success());
}

#[test]
fn bad_arguments_are_refused_with_a_fix() {
    let Some(sim) = sim() else { return };
    let out = sim.workload().args(["--mib", "1"]).output().expect("run workload");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--dir is required"));
    let out = sim.workload().args(["--report-now", "--devices", "0,0"]).output().expect("run workload");
    assert!(String::from_utf8_lossy(&out.stderr).contains("twice"));
}
