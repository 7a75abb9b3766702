//! Every binary of ccm-sim-common answers `--help` (and `-h`): usage, exit 0, quickly, no file made.

// Test code: a failed unwrap or expect names its line (the workspace lints keep them out of product code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../../cli/tests/support/help_check.rs"]
mod help_check;

use std::path::Path;

#[test]
fn every_binary_answers_help() {
    for (bin, word) in [
        (env!("CARGO_BIN_EXE_ccm-sim-ctl"), "usage: ccm-sim-ctl"),
        (env!("CARGO_BIN_EXE_ccm-sim-target"), "usage: ccm-sim-target"),
    ] {
        help_check::assert_help(Path::new(bin), &["--help"], word);
        help_check::assert_help(Path::new(bin), &["-h"], word);
    }
}
