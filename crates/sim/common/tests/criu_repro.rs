//! The stale-identity bug under REAL CRIU, on the TEST DOUBLES and without the plugin
//! (`tests/sim/criu-repro.sh` inside the trixie root of `tests/criu-root.sh`).
//!
//! Needs root and a prepared root (`tests/criu-root.sh prepare`). Without them the test says why
//! and passes, unless `CCM_REQUIRE_CRIU=1` (CI), where it fails.

// Test code: a failed unwrap or expect names its line (the workspace lints keep them out of product code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../..").canonicalize().expect("the repository exists")
}

fn skip_or_fail(why: &str) {
    if std::env::var("CCM_REQUIRE_CRIU").is_ok_and(|v| v == "1") {
        panic!("cannot run the CRIU reproduction: {why}");
    }
    eprintln!("SKIPPED: {why} (set CCM_REQUIRE_CRIU=1 to make this a failure)");
}

#[test]
fn stale_pci_identity_after_criu_restore_and_remapped_cuda_restore() {
    let repo = repo();
    let harness = repo.join("tests/criu-root.sh");
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return skip_or_fail("not root");
    }
    let ready = Command::new(&harness).arg("path").output().ok().and_then(|o| {
        let root = PathBuf::from(String::from_utf8_lossy(&o.stdout).trim());
        root.join("usr/sbin/criu").exists().then_some(root)
    });
    if ready.is_none() {
        return skip_or_fail("no trixie root; run `tests/criu-root.sh prepare`");
    }

    // The doubles come from the other packages; build them with the same cargo.
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_ccm-sim-target")).parent().expect("a directory").to_path_buf();
    let mut build = Command::new(env!("CARGO"));
    build.args(["build", "--quiet", "-p", "cuda-test-double", "-p", "nvml-test-double"]);
    if bin.file_name().is_some_and(|n| n == "release") {
        build.arg("--release");
    }
    assert!(build.status().expect("cargo runs").success(), "building the test doubles failed");

    let out = Command::new(&harness)
        .arg("run")
        .arg(repo.join("tests/sim/criu-repro.sh"))
        .arg(&bin)
        .output()
        .expect("the harness runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && stdout.contains("REPRO OK"), "stdout:\n{stdout}\nstderr:\n{stderr}");
    println!("{stdout}");
}
