//! Every binary of ccm-workload answers `--help` (and `-h`): usage, exit 0, quickly, no file made.

// Test code: a failed unwrap or expect names its line (the workspace lints keep them out of product code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../cli/tests/support/help_check.rs"]
mod help_check;

use std::path::Path;

#[test]
fn every_binary_answers_help() {
    for (bin, word) in [
        (env!("CARGO_BIN_EXE_ccm-sample-workload"), "usage"),
        (env!("CARGO_BIN_EXE_ccm-reaper"), "usage: ccm-reaper"),
        (env!("CARGO_BIN_EXE_ccm-tcp-pair"), "usage: ccm-tcp-pair"),
    ] {
        help_check::assert_help(Path::new(bin), &["--help"], word);
        help_check::assert_help(Path::new(bin), &["-h"], word);
    }
}
