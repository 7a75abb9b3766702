//! The plugin's whole flow under REAL CRIU 4.x on the TEST DOUBLES of libcuda and NVML (CI has no
//! GPU): one test per case of `tests/sim/plugin-flow.sh`. The doubles model driver 580's checkpoint
//! semantics and the stale PCI identity; GPU proof of the same flows is `tests/gpu/run.sh`.

mod support;

use std::path::PathBuf;
use std::sync::Mutex;

/// The cases share the two simulated GPUs' state directory layout and the machine's two cores:
/// run them one at a time so the doubles' call timeouts measure the plugin, not the scheduler.
static SERIAL: Mutex<()> = Mutex::new(());

fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("path of the test binary");
    exe.parent().and_then(|p| p.parent()).expect("target/<profile>/deps/").to_path_buf()
}

fn run_case(case: &str) {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(root) = support::criu_root_or_skip(&format!("sim_flow::{case}")) else { return };
    let bin = target_dir();
    for f in [
        "libcriu_cuda_migrate.so",
        "ccm-sample-workload",
        "criu-cuda-migrate",
        "libcuda_test_double.so",
        "libnvml_test_double.so",
    ] {
        assert!(
            bin.join(f).exists(),
            "{} is missing: run `cargo build --workspace` first (tests/run-all.sh does)",
            bin.join(f).display()
        );
    }
    let script = support::repo_root().join("tests/sim/plugin-flow.sh");
    let work = tempfile::tempdir().expect("scratch dir");
    let work_dir = work.path().join(case);
    let out = root.run(
        &[bin.as_path(), work.path()],
        &["bash", script.to_str().unwrap(), bin.to_str().unwrap(), case],
        &[("CCM_FLOW_WORK", work_dir.to_str().unwrap()), ("CCM_SIM_CALL_TIMEOUT_MS", "20000")],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains(&format!("FLOW {case} OK")),
        "plugin-flow.sh {case} failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        out.status
    );
}

/// Dump and restore onto the same GPUs: identity map, data intact, everything agrees.
#[test]
fn same_gpus() {
    run_case("same");
}

/// Restore with the swap map: the stale PCI words are rewritten from the sites recorded at dump;
/// `criu-cuda-migrate inspect` and `preflight` read the same images.
#[test]
fn swap_is_reconciled() {
    run_case("swap");
}

/// The bug itself, with reconciliation off: the new UUID with the old bus id.
#[test]
fn swap_without_reconciliation_shows_the_bug() {
    run_case("swap-noreconcile");
}

/// Three chained migrations of one process.
#[test]
fn three_chained_swaps() {
    run_case("chain3");
}

/// Preflight refuses a usable set this node cannot serve (images untouched), then the automatic
/// map moves a CUDA_VISIBLE_DEVICES-limited process onto the one usable GPU and fixes its environ.
#[test]
fn preflight_refusal_then_automatic_map() {
    run_case("refuse");
}

/// A tree of two CUDA processes: one parallel checkpoint, two images, one restore swapped.
#[test]
fn two_process_tree_swapped() {
    run_case("two-procs");
}

/// The dump adds the plugin to CRIU's image inventory: CRIU refuses a restore without it.
#[test]
fn restore_without_the_plugin_is_refused_by_criu() {
    run_case("no-plugin");
}

/// Three GPUs moved in a cycle: one snapshot of the sites, every ordinal on its new GPU.
#[test]
fn three_gpu_cycle() {
    run_case("cycle3");
}
