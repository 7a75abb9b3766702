//! Fault injection under REAL CRIU 4.x on the TEST DOUBLES of libcuda and NVML: one test per case of
//! `tests/sim/faults.sh`. Each case injects one failure (a fault knob of the doubles, a damaged or missing
//! image, a bad configuration, a killed CRIU) and checks what the user sees in CRIU's log and the CUDA
//! state of every process afterwards. The table of outcomes is `docs/RELIABILITY.md`.

// Test code: a failed unwrap or expect names its line (the workspace lints keep them out of product code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

fn run_case(case: &str) {
    support::run_sim_case(
        &support::SimScript {
            test: "sim_faults",
            script: "tests/sim/faults.sh",
            work_var: "CCM_FAULT_WORK",
            ok_word: "FAULT",
            extra_bins: &["ccm-sim-ctl"],
        },
        case,
    );
}

/// The driver does not lock in time: PAUSE_DEVICES fails, the dump fails, the process runs on.
#[test]
fn lock_timeout_fails_the_dump_and_leaves_the_process_running() {
    run_case("lock-timeout");
}

/// One of two processes of a tree fails its checkpoint: the dump fails and BOTH are RUNNING again.
#[test]
fn checkpoint_failure_of_one_of_two_rolls_both_back() {
    run_case("checkpoint-fail-one-of-two");
}

/// The driver answers NOT_SUPPORTED to the checkpoint (managed memory on driver 580): the dump fails with a
/// line naming managed memory, MPS and MIG, and the process is RUNNING again with its data.
#[test]
fn checkpoint_not_supported_names_its_causes_and_the_process_runs_on() {
    run_case("checkpoint-unsupported");
}

/// `CRIU_CUDA_MIGRATE_MULTI_PROCESS=refuse` and two CUDA processes: refused before any checkpoint, both
/// RUNNING with their data, no identity image.
#[test]
fn several_cuda_processes_are_refused_before_any_checkpoint_when_told() {
    run_case("multi-process-refuse");
}

/// Two CUDA processes dumped (the default warns about CUDA IPC); their driver restore fails as an IPC
/// importer's does on driver 580: the line names CUDA IPC and the way out, not free memory.
#[test]
fn a_restore_failing_like_an_ipc_importer_names_ipc() {
    run_case("multi-process-ipc-restore");
}

/// The driver's restore fails in strict mode (the default): the restored tree is killed, the log
/// says so and what to do, the images are intact, and a retry restores the process.
#[test]
fn restore_failure_kills_the_tree_in_strict_mode_and_a_retry_succeeds() {
    run_case("restore-fail");
}

/// The driver's restore fails in permissive mode: the process stays CHECKPOINTED, the log names
/// `recover --pid N`, and `criu-cuda-migrate recover` brings it back with its data.
#[test]
fn restore_failure_in_permissive_mode_leaves_checkpointed_and_recover_brings_it_back() {
    run_case("restore-fail-permissive");
}

/// The unlock after a restore fails: LOCKED, named in the log, recovered by the CLI.
#[test]
fn unlock_failure_at_restore_leaves_locked_and_recover_unlocks() {
    run_case("unlock-fail");
}

/// NVML cannot be initialised at dump: the dump succeeds with an image that records no GPU, so a
/// remapped restore is refused in preflight and a restore onto the same GPUs works.
#[test]
fn nvml_missing_at_dump() {
    run_case("nvml-missing-dump");
}

/// NVML cannot be initialised at restore: refused in preflight, images unchanged, a later restore works.
#[test]
fn nvml_missing_at_restore_is_refused_in_preflight() {
    run_case("nvml-missing-restore");
}

/// No libcuda for CRIU: the plugin disables itself and a plain process dumps and restores as before.
#[test]
fn libcuda_missing_at_dump_disables_the_plugin() {
    run_case("libcuda-missing-dump");
}

/// No libcuda at restore of a CUDA checkpoint: refused in preflight, images unchanged.
#[test]
fn libcuda_missing_at_restore_is_refused_in_preflight() {
    run_case("libcuda-missing-restore");
}

/// The identity image is missing from the image directory: the restore must be refused (CRIU's
/// inventory says the dump had CUDA processes) or at least name the process it leaves CHECKPOINTED.
#[test]
fn missing_identity_image_is_refused() {
    run_case("image-missing");
}

/// One of two CUDA processes has no identity image (a checkpoint image's whiteout deletes it at unpack): strict
/// mode kills the restored tree naming the missing image; the same images restore in permissive mode, that
/// process onto its own GPUs with a warning (issue 35 part 3).
#[test]
fn a_cuda_process_without_its_image_kills_the_tree_in_strict_mode_and_restores_in_permissive_mode() {
    run_case("image-missing-one-of-two");
}

/// A truncated identity image: refused in preflight naming the fix, images byte-identical.
#[test]
fn truncated_identity_image_is_refused_in_preflight() {
    run_case("image-truncated");
}

/// An identity image of a newer format version: refused in preflight naming the upgrade.
#[test]
fn newer_format_version_is_refused_in_preflight() {
    run_case("image-newer-version");
}

/// A device map naming a GPU this node does not have: refused in preflight, listing the node's GPUs.
#[test]
fn device_map_naming_an_unknown_gpu_is_refused_in_preflight() {
    run_case("map-unknown-gpu");
}

/// The recorded PCI sites no longer hold the expected words: strict mode kills the restored tree.
#[test]
fn moved_sites_in_strict_mode_kill_the_tree() {
    run_case("sites-moved-strict");
}

/// The same in permissive mode: the process runs on, with an error line.
#[test]
fn moved_sites_in_permissive_mode_resume_with_an_error() {
    run_case("sites-moved-permissive");
}

/// CRIU is SIGKILLed between dump hooks: the driver agent unlocks what it had locked.
#[test]
fn criu_killed_mid_dump_is_rolled_back_by_the_driver_agent() {
    run_case("criu-killed-mid-dump");
}

/// A restore node whose driver is newer than this build knows: a migration is refused in preflight
/// (its restore arguments may have changed), a restore onto the same GPUs works.
#[test]
fn a_newer_driver_refuses_a_migration_and_restores_in_place() {
    run_case("newer-driver");
}

/// `criu dump --leave-running`: the process keeps running and its GPU state is RUNNING again.
#[test]
fn leave_running_dump_puts_the_process_back_to_running() {
    run_case("leave-running");
}

/// CRIU dies (SIGKILL) during a restore, while the driver restores the process: the driver agent lets that
/// restore end, kills the half-restored process with an ERROR line, and the same images restore again.
#[test]
fn criu_killed_mid_restore_leaves_no_half_restored_process() {
    run_case("criu-killed-mid-restore");
}

/// The driver agent stops (SIGSTOP) right after it asked for the lock: the lock's deadline (CRIU's
/// timeout + 10 s) ends the wait, the agent is killed, and a fresh agent unlocks the process.
#[test]
fn a_stopped_agent_at_lock_is_killed_and_the_process_put_back() {
    run_case("agent-stop-lock");
}

#[test]
fn a_killed_agent_at_lock_leaves_the_process_running() {
    run_case("agent-kill-lock");
}

/// Stopped during the checkpoint: the driver finishes it, and the fresh agent restores and
/// unlocks from the CHECKPOINTED state it reports.
#[test]
fn a_stopped_agent_at_checkpoint_is_killed_and_the_process_put_back() {
    run_case("agent-stop-checkpoint");
}

#[test]
fn a_killed_agent_at_checkpoint_leaves_the_process_running() {
    run_case("agent-kill-checkpoint");
}

/// Stopped during the driver's restore: the restored tree is killed, the images stay, a retry works.
#[test]
fn a_stopped_agent_at_restore_kills_the_tree_and_a_retry_restores() {
    run_case("agent-stop-restore");
}

#[test]
fn a_killed_agent_at_restore_kills_the_tree_and_a_retry_restores() {
    run_case("agent-kill-restore");
}

/// A panic in the driver agent (the test build's failpoint) at lock, checkpoint and restore: an
/// error reply instead of a silent hang, the process put back (dump) or the tree killed and the
/// images intact (restore).
#[test]
fn a_panic_in_the_agent_at_lock_fails_the_dump_and_leaves_the_process_running() {
    run_case("agent-panic-lock");
}

#[test]
fn a_panic_in_the_agent_at_checkpoint_fails_the_dump_and_puts_the_process_back() {
    run_case("agent-panic-checkpoint");
}

#[test]
fn a_panic_in_the_agent_at_restore_kills_the_tree_and_a_retry_restores() {
    run_case("agent-panic-restore");
}

/// Hostile identity images: refused in the plugin's init within seconds, nothing read through a
/// link or from a FIFO, no foreign byte printed, the directory unchanged.
#[test]
fn an_image_that_links_to_dev_zero_is_refused_without_reading_it() {
    run_case("image-symlink-zero");
}

#[test]
fn an_image_that_is_a_fifo_is_refused_without_hanging() {
    run_case("image-fifo");
}

#[test]
fn an_image_that_links_to_a_secret_is_refused_without_printing_it() {
    run_case("image-symlink-secret");
}

#[test]
fn an_oversized_image_is_refused_unread() {
    run_case("image-oversized");
}

#[test]
fn an_image_with_control_characters_is_refused_and_forges_no_log_line() {
    run_case("image-control");
}

#[test]
fn an_image_renamed_to_another_pid_is_refused() {
    run_case("image-pid-renamed");
}

/// `CRIU_CUDA_MIGRATE_DISABLE=y` is refused instead of leaving the plugin on.
#[test]
fn an_unknown_disable_value_is_refused() {
    run_case("setting-disable-unknown");
}

/// The default (`CRIU_CUDA_MIGRATE_MULTI_PROCESS=check`): two CUDA processes whose importer check cannot run (the
/// test doubles have no kernel driver) are refused before any checkpoint, naming why and `=warn`; both run on.
#[test]
fn several_cuda_processes_the_importer_check_cannot_clear_are_refused_by_default() {
    run_case("multi-process-unchecked");
}

/// Issue 47: a page file cut short is refused by the preflight before CRIU restores anything; the images are
/// unchanged and the whole file restores the process with its data.
#[test]
fn a_cut_page_file_is_refused_before_any_restore() {
    run_case("staging-page-file-cut");
}

/// Issue 47: one byte flipped in the page file fails its chunk's CRC32 at the fill, before the driver's restore: the
/// restored tree is killed, the images are unchanged, and the whole file restores the process with its data.
#[test]
fn a_flipped_byte_in_the_page_file_is_refused_before_the_driver_restore() {
    run_case("staging-page-file-flipped");
}

/// Issue 47: CRIU killed after the staging pages were written and released: the driver agent fills them back from
/// the page file before it restores and unlocks the process, which runs on with its device data intact.
#[test]
fn criu_killed_after_the_release_is_filled_back_and_put_back_by_the_driver_agent() {
    run_case("criu-killed-after-release");
}

/// Issue 47, item 6: the driver's custom storage (CUDA 13.4) on the doubles: the driver agent copies the device
/// memory into the page file; --leave-running puts the process back from it; a
/// flipped byte is refused before the driver's restore, a driver without custom storage by the preflight (images
/// unchanged); the process then moves onto the other GPUs with its data.
#[test]
fn custom_storage_puts_back_refuses_damage_and_moves_the_process() {
    run_case("custom-storage");
}

/// Issue 47, item 6: a dump of two whose second checkpoint fails rolls the first back from its page file.
#[test]
fn a_failed_dump_puts_back_the_process_checkpointed_to_custom_storage() {
    run_case("custom-storage-one-of-two");
}

/// Issue 47, item 6: CRIU killed after a checkpoint to custom storage: the driver agent restores the process from its
/// page file and unlocks it, RUNNING with its data.
#[test]
fn criu_killed_after_a_custom_storage_checkpoint_is_put_back_from_the_page_file() {
    run_case("custom-storage-criu-killed");
}

/// CRIU's post-dump action script fails after the exit hook was told the dump succeeded: CRIU resumes the process
/// CHECKPOINTED with its staging pages released. The driver agent, handed the process at the hook, fills the pages
/// back and puts it back once CRIU is gone: RUNNING, data intact.
#[test]
fn a_failed_post_dump_script_is_put_back_by_the_driver_agent() {
    run_case("post-dump-fails");
}

/// The same on a driver with custom storage: the process is restored from its page file.
#[test]
fn a_failed_post_dump_script_after_a_custom_storage_checkpoint_is_put_back_from_the_page_file() {
    run_case("custom-storage-post-dump-fails");
}

/// `criu dump --leave-stopped`: the process stays stopped and CHECKPOINTED; the driver agent fills its staging pages
/// back and names `recover`, which brings it back RUNNING with its data once it is continued.
#[test]
fn a_dump_that_leaves_the_process_stopped_names_recover_and_recover_brings_it_back() {
    run_case("leave-stopped");
}
