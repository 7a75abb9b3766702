//! The plugin's whole flow under REAL CRIU 4.x on the TEST DOUBLES of libcuda and NVML (CI has no
//! GPU): one test per case of `tests/sim/plugin-flow.sh`. The doubles model driver 580's checkpoint
//! semantics and the stale PCI identity; GPU proof of the same flows is `tests/gpu/run.sh`.

// Test code: a failed unwrap or expect names its line (the workspace lints keep them out of product code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

fn run_case(case: &str) {
    support::run_sim_case(
        &support::SimScript {
            test: "sim_flow",
            script: "tests/sim/plugin-flow.sh",
            work_var: "CCM_FLOW_WORK",
            ok_word: "FLOW",
            extra_bins: &[],
        },
        case,
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

/// A restore onto a GPU without room for the process's device memory (recorded at dump) is refused in
/// preflight, by the plugin and by `criu-cuda-migrate preflight`, naming the GPU, the need and what is
/// free; the images stay intact, and once the memory is free the same images restore.
#[test]
fn restore_onto_a_full_gpu_is_refused_then_succeeds() {
    run_case("memory");
}

/// One preflight, two front ends: the CLI's `preflight` and the plugin's init(RESTORE) give the same
/// verdict and the same reason for a map onto an unknown GPU, too few usable GPUs, no NVML, a newer driver
/// with a map (the restore-argument layout gate), and a valid swap.
#[test]
fn the_cli_and_the_plugin_give_the_same_preflight_verdicts() {
    run_case("parity");
}

/// A child forked after cuInit holding NVIDIA nodes (the test doubles' stand-ins: char 10:237 as nvidiactl, a loop
/// block device as nvidia0, held open and mapped): the job check names it as handled, the dump claims its nodes
/// and writes them (a `--leave-running` dump first, after which the tree runs on), `inspect` shows them, the restore
/// reopens the descriptors and maps placeholders, a second dump and restore of the restored tree (a chained move)
/// claims the reopened descriptors again, and the child's exit code survives.
#[test]
fn a_forked_child_holding_nvidia_nodes_moves() {
    run_case("forked");
}

/// A CUDA process mapping managed memory (the doubles' stand-in of /dev/nvidia-uvm, 64 MiB): the dump refuses it
/// before any lock, naming it; it runs on.
#[test]
fn managed_memory_is_refused_before_the_lock() {
    run_case("managed");
}

/// The forked child restored with the swap map: its GPU descriptor is reopened as the node of the GPU the map gives
/// (the test doubles' stand-in of /dev/nvidia1), as `criu-cuda-migrate preflight` plans it; the parent moves too.
#[test]
fn a_forked_childs_gpu_descriptor_follows_the_device_map() {
    run_case("forked-swap");
}

/// The seed's job at node scale (issue 46): 8 ranks x 32 forked workers on GPUs 0-3 of 8 simulated GPUs, dumped as
/// one tree and restored where only GPUs 4-7 are usable: every worker's GPU descriptor opens a usable GPU, the claims
/// hold all 256 workers, the job check counts them.
#[test]
fn a_node_of_8_ranks_by_32_workers_moves_onto_the_usable_gpus() {
    run_case("node");
}
