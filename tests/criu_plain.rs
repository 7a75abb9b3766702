//! Real CRIU 4.x (the Debian root of `tests/criu-root.sh`: trixie's CRIU 4.1.1, or forky's 4.2.1 with
//! `CCM_CRIU_SUITE=forky`; tests/run-all.sh runs both) with the freshly built plugin loaded through `--libdir`, on
//! a plain process that does not use CUDA: the plugin must load, say so in CRIU's own logs, answer `-ENOTSUP`,
//! write nothing, and never make CRIU reject it. The same plugin file serves both CRIUs: it is built against one
//! header (trixie's, 4.1.1: 12 hook slots) and declares `max_hooks` 12, fewer than 4.2.1's 13, which CRIU accepts
//! (it reads only `hooks[0..max_hooks)`); a descriptor declaring one more than the running CRIU knows is refused.
//!
//! These tests need root; they skip loudly without it, and fail under CI instead of skipping.

// Test code: a failed unwrap or expect names its line (the workspace lints keep them out of product code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::fs;
use std::time::Duration;

use support::{
    criu_root_or_skip, hook_enumerators, hook_value, init_line, loud, not_cuda_line, plugin_so, read_descriptor,
    run_plain, PlainRun, LOG_PREFIX,
};

/// `CRIU_PLUGIN_VERSION` of every CRIU from 3.18 to 4.2: GEN_VERSION(0, 2, 0).
const PLUGIN_ABI_VERSION: u32 = 0x200;

fn plugin_bytes() -> Vec<u8> {
    let so = plugin_so();
    fs::read(&so).unwrap_or_else(|e| panic!("read {}: {e}", so.display()))
}

#[test]
fn plain_process_is_dumped_and_restored_with_the_plugin_loaded() {
    let Some(root) = criu_root_or_skip("plain_process_is_dumped_and_restored_with_the_plugin_loaded") else {
        return;
    };
    let plugin = plugin_bytes();
    let run =
        run_plain(&root, &PlainRun { plugin: &plugin, restore: true, verbosity: 4, dump_args: "", restore_args: "" });
    let why = run.describe();
    assert_eq!(run.dump_rc, Some(0), "criu dump failed with the plugin loaded:\n{why}");
    assert_eq!(run.restore_rc, Some(0), "criu restore failed with the plugin loaded:\n{why}");
    assert!(
        run.workload_makes_progress(Duration::from_secs(5)),
        "the restored process {} does not run:\n{why}",
        run.pid
    );

    let dump_log = run.dump_log();
    let restore_log = run.restore_log();
    assert!(dump_log.contains(&init_line("dump")), "dump.log lacks {:?}:\n{why}", init_line("dump"));
    assert!(restore_log.contains(&init_line("restore")), "restore.log lacks {:?}:\n{why}", init_line("restore"));
    assert!(
        dump_log.contains(&not_cuda_line(run.pid)),
        "dump.log lacks the plugin's -ENOTSUP answer {:?}:\n{why}",
        not_cuda_line(run.pid)
    );
    assert!(
        run.plugin_images().is_empty(),
        "the plugin wrote images for a process that does not use CUDA: {:?}",
        run.plugin_images()
    );
}

#[test]
fn plugin_lines_land_in_criu_logs_one_line_per_message_at_the_right_level() {
    let Some(root) = criu_root_or_skip("plugin_lines_land_in_criu_logs_one_line_per_message_at_the_right_level") else {
        return;
    };
    let plugin = plugin_bytes();
    let verbose =
        run_plain(&root, &PlainRun { plugin: &plugin, restore: true, verbosity: 4, dump_args: "", restore_args: "" });
    let why = verbose.describe();
    assert_eq!((verbose.dump_rc, verbose.restore_rc), (Some(0), Some(0)), "{why}");

    let init_prefix = format!("criu-cuda-migrate {}: ", env!("CARGO_PKG_VERSION"));
    for (name, log) in [("dump.log", verbose.dump_log()), ("restore.log", verbose.restore_log())] {
        // The plugin's own messages: "criu-cuda-migrate: ..." and the init line "criu-cuda-migrate 0.1.0: ...".
        // (CRIU's lines that merely name the plugin, such as `Plugin "criu-cuda-migrate" (version ...)`, are not.)
        let ours: Vec<&str> = log.lines().filter(|l| l.contains(LOG_PREFIX) || l.contains(&init_prefix)).collect();
        assert!(!ours.is_empty(), "{name} holds no line of the plugin:\n{why}");
        for line in ours {
            // CRIU's print_on_level stamps every line "(SS.uuuuuu) "; a line without it was not written by CRIU's
            // logger (or a message spilled over several lines).
            assert!(
                line.starts_with('(') && line.contains(") "),
                "{name}: plugin line not written through CRIU's logger: {line:?}"
            );
            assert!(
                line.matches(LOG_PREFIX).count() <= 1 && line.matches(&init_prefix).count() <= 1,
                "{name}: several plugin messages on one line: {line:?}"
            );
        }
    }
    let stderr = verbose.criu_stderr();
    assert!(
        !stderr.contains(LOG_PREFIX) && !stderr.contains(&init_prefix),
        "the plugin wrote to criu's stderr instead of its log:\n{stderr}"
    );

    // At -v3 (info) CRIU drops debug lines: the plugin's DEBUG -ENOTSUP answer must go with them, which shows the
    // plugin maps its levels onto CRIU's instead of printing everything.
    let quiet =
        run_plain(&root, &PlainRun { plugin: &plugin, restore: false, verbosity: 3, dump_args: "", restore_args: "" });
    assert_eq!(quiet.dump_rc, Some(0), "{}", quiet.describe());
    let quiet_log = quiet.dump_log();
    assert!(
        !quiet_log.contains(&not_cuda_line(quiet.pid)),
        "a DEBUG line of the plugin appears at -v3:\n{}",
        quiet.describe()
    );
}

#[test]
fn plugin_disables_itself_once_on_a_machine_without_nvidia_driver() {
    let Some(root) = criu_root_or_skip("plugin_disables_itself_once_on_a_machine_without_nvidia_driver") else {
        return;
    };
    if std::path::Path::new("/proc/driver/nvidia").exists() || std::env::var_os("CRIU_CUDA_MIGRATE_LIBCUDA").is_some() {
        eprintln!("plugin_disables_itself_once_on_a_machine_without_nvidia_driver: this machine has a driver; nothing to test");
        return;
    }
    let plugin = plugin_bytes();
    let run =
        run_plain(&root, &PlainRun { plugin: &plugin, restore: false, verbosity: 4, dump_args: "", restore_args: "" });
    let why = run.describe();
    assert_eq!(run.dump_rc, Some(0), "init must never fail a dump without NVIDIA driver:\n{why}");
    let disabled = format!("{LOG_PREFIX}disabled: ");
    let count = run.dump_log().lines().filter(|l| l.contains(&disabled)).count();
    assert_eq!(count, 1, "expected exactly one {disabled:?} line in dump.log:\n{why}");
}

#[test]
fn max_hooks_does_not_exceed_the_hook_count_of_the_criu_in_use() {
    let Some(root) = criu_root_or_skip("max_hooks_does_not_exceed_the_hook_count_of_the_criu_in_use") else {
        return;
    };
    let header_path = root.plugin_header();
    let header = fs::read_to_string(&header_path).expect("read the root's criu-plugin.h");
    let hooks = hook_enumerators(&header);
    let criu_max = hook_value(&hooks, "CR_PLUGIN_HOOK__MAX");
    let desc =
        read_descriptor(&plugin_bytes()).unwrap_or_else(|e| panic!("CR_PLUGIN_DESC in {}: {e}", plugin_so().display()));

    assert_eq!(desc.version, PLUGIN_ABI_VERSION, "CR_PLUGIN_DESC.version");
    assert!(
        desc.max_hooks <= criu_max,
        "CR_PLUGIN_DESC.max_hooks = {} exceeds CR_PLUGIN_HOOK__MAX = {criu_max} of {}: that CRIU rejects the plugin \
         (\"Corrupted plugin\") and fails every dump",
        desc.max_hooks,
        header_path.display()
    );
    // CRIU reads only hooks[0..max_hooks): a smaller value would silently drop the device hooks.
    for hook in
        ["CR_PLUGIN_HOOK__PAUSE_DEVICES", "CR_PLUGIN_HOOK__CHECKPOINT_DEVICES", "CR_PLUGIN_HOOK__RESUME_DEVICES_LATE"]
    {
        assert!(hook_value(&hooks, hook) < desc.max_hooks, "max_hooks = {} hides {hook} from CRIU", desc.max_hooks);
    }
    // The header the plugin was built against: the size of its hooks[] array (CR_PLUGIN_DESC's symbol size).
    let built_slots = criu_plugin_sys::CR_PLUGIN_HOOK__MAX;
    let relation = match desc.max_hooks.cmp(&criu_max) {
        std::cmp::Ordering::Less => "fewer than this CRIU knows: accepted, the hooks above are never read",
        std::cmp::Ordering::Equal => "as many as this CRIU knows",
        std::cmp::Ordering::Greater => unreachable!("asserted above"),
    };
    loud(&format!(
        "NOTE: CRIU {} ({} root) knows {criu_max} hooks; the plugin file (built with {built_slots} hook slots) \
         declares max_hooks {}: {relation}",
        root.criu_version(),
        root.suite,
        desc.max_hooks
    ));
}

/// CRIU PR #3138's `criu_plugin_get_options` is in neither packaged CRIU (4.1.1, 4.2.1): the plugin looks it up
/// at run time and says in its `settings:` line that options were not offered, and where each setting came from.
#[test]
fn settings_line_says_where_values_came_from_and_whether_criu_offers_plugin_options() {
    let Some(root) =
        criu_root_or_skip("settings_line_says_where_values_came_from_and_whether_criu_offers_plugin_options")
    else {
        return;
    };
    let header = fs::read_to_string(root.plugin_header()).expect("read the root's criu-plugin.h");
    let plugin = plugin_bytes();
    let run =
        run_plain(&root, &PlainRun { plugin: &plugin, restore: false, verbosity: 4, dump_args: "", restore_args: "" });
    let why = run.describe();
    assert_eq!(run.dump_rc, Some(0), "{why}");
    let log = run.dump_log();
    let settings = log
        .lines()
        .find_map(|l| l.split_once(&format!("{LOG_PREFIX}settings: ")).map(|(_, s)| s.to_string()))
        .unwrap_or_else(|| panic!("dump.log has no settings: line:\n{why}"));
    if header.contains("criu_plugin_get_options") {
        assert!(settings.ends_with("no plugin option of ours given"), "{settings}");
    } else {
        assert!(
            settings.contains("sources: all defaults; plugin options not offered by this CRIU"),
            "CRIU {} has no criu_plugin_get_options, so the settings line must say so: {settings}",
            root.criu_version()
        );
        loud(&format!(
            "NOTE: CRIU {} ({} root) has no criu_plugin_get_options (CRIU PR #3138); tests/plugin_options.rs reads \
             plugin options under a CRIU 4.2.1 rebuilt with it",
            root.criu_version(),
            root.suite
        ));
    }
}

#[test]
fn criu_rejects_a_plugin_with_more_hooks_than_it_knows() {
    let Some(root) = criu_root_or_skip("criu_rejects_a_plugin_with_more_hooks_than_it_knows") else {
        return;
    };
    let header = fs::read_to_string(root.plugin_header()).expect("read the root's criu-plugin.h");
    let criu_max = hook_value(&hook_enumerators(&header), "CR_PLUGIN_HOOK__MAX");
    let mut patched = plugin_bytes();
    let desc = read_descriptor(&patched).unwrap_or_else(|e| panic!("CR_PLUGIN_DESC in {}: {e}", plugin_so().display()));
    patched[desc.max_hooks_bytes].copy_from_slice(&(criu_max + 1).to_le_bytes());
    assert_eq!(read_descriptor(&patched).expect("patched descriptor").max_hooks, criu_max + 1);

    let run =
        run_plain(&root, &PlainRun { plugin: &patched, restore: false, verbosity: 4, dump_args: "", restore_args: "" });
    let why = run.describe();
    assert_ne!(
        run.dump_rc,
        Some(0),
        "criu accepted a plugin with max_hooks = {} > CR_PLUGIN_HOOK__MAX = {criu_max}; the max_hooks test proves \
         nothing if CRIU does not check it:\n{why}",
        criu_max + 1
    );
    assert!(run.dump_rc.is_some(), "criu dump did not run:\n{why}");
    assert!(run.dump_log().contains("Corrupted plugin"), "dump.log lacks \"Corrupted plugin\":\n{why}");
    assert!(run.workload_alive(), "the rejected dump must leave the process running:\n{why}");
}
