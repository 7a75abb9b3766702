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
