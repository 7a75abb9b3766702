//! criu-cuda-migrate and each of its subcommands answer `--help`: usage, exit 0, quickly, no file
//! made. (The other binaries of the workspace have the same test in their own package.)

// Test code: a failed unwrap or expect names its line (the workspace lints keep them out of product code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support {
    pub mod help_check;
}

use std::path::Path;
use support::help_check::assert_help;

#[test]
fn every_subcommand_answers_help() {
    let bin = Path::new(env!("CARGO_BIN_EXE_criu-cuda-migrate"));
    let top = assert_help(bin, &["--help"], "usage: criu-cuda-migrate");
    for sub in ["inspect", "preflight", "node", "recover", "action-script"] {
        assert!(top.contains(sub), "--help does not list {sub}: {top}");
        assert_help(bin, &[sub, "--help"], "usage: criu-cuda-migrate");
    }
    assert_help(bin, &["-h"], "usage");
    let node = assert_help(bin, &["node", "--help"], "--check");
    assert!(!node.contains("--root"), "the tests' --root is hidden: {node}");
}

#[test]
fn action_script_has_a_short_line_in_the_list_and_its_own_help_without_json() {
    let bin = Path::new(env!("CARGO_BIN_EXE_criu-cuda-migrate"));
    let top = assert_help(bin, &["--help"], "usage: criu-cuda-migrate");
    let line = top.lines().find(|l| l.trim_start().starts_with("action-script")).unwrap();
    assert!(line.contains("run by CRIU, not by hand"), "{line}");
    assert!(!top.contains("CRTOOLS_SCRIPT_ACTION"), "the top-level --help holds action-script's whole text: {top}");

    let own = assert_help(bin, &["action-script", "--help"], "usage: criu-cuda-migrate action-script");
    assert!(own.contains("setup-namespaces") && own.contains("CRTOOLS_INIT_PID"), "{own}");
    assert!(!own.lines().any(|l| l.trim_start().starts_with("--json")), "action-script offers --json: {own}");
    assert!(own.contains("--json does not apply here"), "{own}");

    // Given anyway, --json changes nothing: a call not from CRIU is refused in plain words, not as JSON.
    let out = std::process::Command::new(bin)
        .args(["action-script", "--json"])
        .env_remove("CRTOOLS_SCRIPT_ACTION")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(out.stdout.is_empty(), "{}", String::from_utf8_lossy(&out.stdout));
    assert!(stderr.starts_with("criu-cuda-migrate action-script: CRTOOLS_SCRIPT_ACTION is not set"), "{stderr}");
}
