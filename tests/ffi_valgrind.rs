//! The plugin's C ABI under valgrind: a C harness loads it as CRIU does and runs init, every hook
//! and exit many times over (tests/ffi/init_exit.c). valgrind must see no invalid access and no
//! definite or indirect leak. Without a driver or CRIU around, every hook must answer -ENOTSUP.

// Test code: a failed unwrap or expect names its line (the workspace lints keep them out of product code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::Path;
use std::process::Command;

fn have(tool: &str) -> bool {
    Command::new("sh").arg("-c").arg(format!("command -v {tool}")).output().is_ok_and(|o| o.status.success())
}

#[test]
fn repeated_init_hooks_exit_are_clean_under_valgrind() {
    let so = support::plugin_so();
    let ci = std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0");
    if !have("valgrind") || !have("cc") {
        assert!(!ci, "CI must run the valgrind test: install valgrind (scripts/install-deps.sh does) and a C compiler");
        support::loud("SKIPPED repeated_init_hooks_exit_are_clean_under_valgrind: no valgrind or cc");
        return;
    }
    if Path::new("/proc/driver/nvidia").exists() {
        eprintln!("repeated_init_hooks_exit_are_clean_under_valgrind: this machine has an NVIDIA driver; the -ENOTSUP contract differs");
        return;
    }
    let dir = tempfile::tempdir().expect("scratch dir");
    let harness = dir.path().join("init_exit");
    let src = support::repo_root().join("tests/ffi/init_exit.c");
    let cc =
        Command::new("cc").arg("-O0").arg("-g").arg("-o").arg(&harness).arg(&src).arg("-ldl").output().expect("cc");
    assert!(cc.status.success(), "compiling {}: {}", src.display(), String::from_utf8_lossy(&cc.stderr));

    let out = Command::new("valgrind")
        .args([
            "--quiet",
            "--error-exitcode=99",
            "--leak-check=full",
            "--errors-for-leak-kinds=definite,indirect",
            "--show-leak-kinds=definite,indirect",
        ])
        .arg(&harness)
        .arg(&so)
        .arg("30")
        .env_remove("CRIU_CUDA_MIGRATE_LIBCUDA")
        .output()
        .expect("run valgrind");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("30 rounds ok"),
        "valgrind / harness failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        out.status
    );
}
