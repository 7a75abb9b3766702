//! ccm-bench answers `--help` (and `-h`): usage, exit 0, quickly, no file made.

// Test code: a failed unwrap or expect names its line (the workspace lints keep them out of product code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../cli/tests/support/help_check.rs"]
mod help_check;

use std::path::Path;

#[test]
fn the_binary_answers_help() {
    let bin = Path::new(env!("CARGO_BIN_EXE_ccm-bench"));
    help_check::assert_help(bin, &["--help"], "usage");
    help_check::assert_help(bin, &["-h"], "usage");
}
