//! `--plugin-option` under a real CRIU that has `criu_plugin_get_options` (CRIU PR #3138). No packaged CRIU has it
//! (4.1.1 and 4.2.1 do not; tests/criu_plain.rs shows the plugin saying so there), so `tests/criu-root.sh
//! prepare-patched` rebuilds forky's CRIU 4.2.1 from Debian's source with the PR's interface backported
//! (tests/criu-patches/criu-4.2.1-plugin-options.patch). The same plugin file, which finds the function with dlsym,
//! reads the options there: they override the environment, the `settings:` line says where each value came from,
//! CRIU cuda_plugin's `cuda_plugin.device-map=auto` is taken, other plugins' options are left alone, and a bad
//! option of ours fails the restore with the fix in CRIU's log.
//!
//! Needs root like every real-CRIU test; without the patched root it skips loudly, and under CI it fails.

// Test code: a failed unwrap or expect names its line (the workspace lints keep them out of product code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::fs;
use std::time::Duration;

use support::{init_line, loud, plugin_so, run_plain, CriuRoot, PlainRun, LOG_PREFIX};

fn patched_root_or_skip(test: &str) -> Option<CriuRoot> {
    // The same rules as every real-CRIU test (root, CI), then the patched root itself.
    support::criu_root_or_skip(test)?;
    let root = CriuRoot::patched();
    if !root.is_complete() {
        assert!(
            std::env::var("CI").is_err() && std::env::var("CCM_REQUIRE_TEST_DOUBLES").is_err(),
            "{test}: no patched root at {}: CI must make it (`CCM_CRIU_SUITE=forky bash tests/criu-root.sh prepare-patched`)",
            root.path().display()
        );
        loud(&format!(
            "SKIPPED {test}: no patched CRIU root at {}; `CCM_CRIU_SUITE=forky bash tests/criu-root.sh prepare-patched` makes it (tests/run-all.sh does)",
            root.path().display()
        ));
        return None;
    }
    Some(root)
}

fn settings_line(log: &str) -> String {
    log.lines()
        .find_map(|l| l.split_once(&format!("{LOG_PREFIX}settings: ")).map(|(_, s)| s.to_string()))
        .unwrap_or_else(|| panic!("no settings: line in\n{log}"))
}

#[test]
fn plugin_options_of_a_criu_with_criu_plugin_get_options_reach_the_plugin() {
    let test = "plugin_options_of_a_criu_with_criu_plugin_get_options_reach_the_plugin";
    let Some(root) = patched_root_or_skip(test) else {
        return;
    };
    let header = fs::read_to_string(root.plugin_header()).expect("the patched root's criu-plugin.h");
    assert!(header.contains("criu_plugin_get_options"), "the patched root's header lacks criu_plugin_get_options");
    let plugin = fs::read(plugin_so()).expect("the plugin file");

    // Dump: our options and another plugin's, on CRIU's command line.
    let run = run_plain(
        &root,
        &PlainRun {
            plugin: &plugin,
            restore: true,
            verbosity: 4,
            dump_args:
                "--plugin-option criu-cuda-migrate.mode=permissive --plugin-option=criu-cuda-migrate.leave-running=0 \
                        --plugin-option example.flag --plugin-option cuda_plugin.backend=driver-api",
            restore_args: "--plugin-option cuda_plugin.device-map=auto --plugin-option criu-cuda-migrate.reconcile=off",
        },
    );
    let why = run.describe();
    assert_eq!(run.dump_rc, Some(0), "{why}");
    assert_eq!(run.restore_rc, Some(0), "{why}");
    assert!(run.workload_makes_progress(Duration::from_secs(5)), "the restored process does not run:\n{why}");
    let dump = settings_line(&run.dump_log());
    assert!(
        dump.contains("mode permissive")
            && dump.contains("leave-running no")
            && dump.contains("mode from --plugin-option criu-cuda-migrate.mode")
            && dump.contains("leave-running from --plugin-option criu-cuda-migrate.leave-running")
            && dump.ends_with("plugin options read"),
        "dump: {dump}"
    );
    let restore = settings_line(&run.restore_log());
    assert!(
        restore.contains("device map automatic")
            && restore.contains("reconcile off")
            && restore.contains("device-map from --plugin-option cuda_plugin.device-map")
            && restore.contains("reconcile from --plugin-option criu-cuda-migrate.reconcile"),
        "restore: {restore}"
    );
    assert!(run.restore_log().contains(&init_line("restore")), "{why}");
    drop(run);

    // A bad option of ours: the plugin's init fails, so CRIU refuses the dump, with what to write in its log.
    let bad = run_plain(
        &root,
        &PlainRun {
            plugin: &plugin,
            restore: false,
            verbosity: 4,
            dump_args: "--plugin-option criu-cuda-migrate.mode=loose",
            restore_args: "",
        },
    );
    let why = bad.describe();
    assert!(bad.dump_rc.is_some_and(|rc| rc != 0), "a bad plugin option did not fail the dump:\n{why}");
    assert!(
        bad.dump_log().contains(&format!(
            "{LOG_PREFIX}Error: configuration: --plugin-option criu-cuda-migrate.mode=\"loose\" is not valid: expected strict or permissive"
        )),
        "{why}"
    );
    assert!(bad.workload_alive(), "the refused dump must leave the process running:\n{why}");
    loud(&format!(
        "NOTE: plugin options read under CRIU {} rebuilt with CRIU PR #3138's interface backported (tests/criu-patches/)",
        root.criu_version()
    ));
}
