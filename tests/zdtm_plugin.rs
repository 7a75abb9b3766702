//! CRIU's own test suite, zdtm, with the plugin loaded into every `criu dump` and `criu restore` and without it (issue
//! 41 part 6): the plugin must never harm a process it does not own. `tests/zdtm/run.sh` runs the tests of
//! `tests/zdtm/tests.txt` (memory, files, sockets, signals, the process tree, terminals and namespaces, each in the
//! flavors listed there) twice from the zdtm root of the suite `CCM_CRIU_SUITE` names (trixie: CRIU 4.1.1, made by
//! `tests/criu-root.sh prepare-zdtm`; tests/run-all.sh runs this binary again on forky's CRIU 4.2.1): once with the
//! test doubles' node in criu's environment and no plugin, once with the plugin in the directory zdtm.py hands every
//! criu as `CRIU_LIBS_DIR`, active (its driver agent started on the doubles' libcuda, every process of each tree
//! left to CRIU, never disabled). No test may differ between the two, and every test must pass in both.
//!
//! Needs root like every real-CRIU test; without root or without the zdtm root it skips loudly, and under CI (or
//! with `CCM_REQUIRE_TEST_DOUBLES=1`) it fails instead.

// Test code: a failed unwrap or expect names its line (the workspace lints keep them out of product code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use support::{criu_root_or_skip, ensure_built, loud, repo_root, CriuRoot, PLUGIN_FILE};

/// The areas the list must cover (its `## AREA` headings), and how many tests must pass in both passes.
const AREAS: [&str; 7] = ["memory", "files", "sockets", "signals", "process-tree", "terminals", "namespaces"];
const MIN_TESTS: usize = 80;

fn required() -> bool {
    std::env::var("CCM_REQUIRE_TEST_DOUBLES").as_deref() == Ok("1")
        || std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0")
}

/// The zdtm root of the suite under test (`tests/criu-root.sh zdtm-path`), or `None` after a loud message.
fn zdtm_root_or_skip(test: &str) -> Option<(CriuRoot, PathBuf)> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root_user = unsafe { libc::geteuid() } == 0;
    assert!(root_user || !required(), "{test}: CI must run the zdtm suite, but it needs root (mount namespaces, criu)");
    let Some(root) = criu_root_or_skip(test) else {
        assert!(
            !required(),
            "{test}: CI must run the zdtm suite, but the CRIU root is missing (the line above says how to make it)"
        );
        return None;
    };
    let out = Command::new("bash")
        .arg(repo_root().join("tests/criu-root.sh"))
        .arg("zdtm-path")
        .env("CCM_CRIU_SUITE", &root.suite)
        .output()
        .expect("run tests/criu-root.sh zdtm-path");
    assert!(out.status.success(), "tests/criu-root.sh zdtm-path failed: {out:?}");
    let zdtm = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if !zdtm.join(".ccm-zdtm").is_file() {
        let make = format!("CCM_CRIU_SUITE={} bash tests/criu-root.sh prepare-zdtm", root.suite);
        assert!(!required(), "{test}: no zdtm root at {}: CI must make it (`{make}`)", zdtm.display());
        loud(&format!("SKIPPED {test}: no zdtm root at {}; `{make}` makes it (tests/run-all.sh does)", zdtm.display()));
        return None;
    }
    Some((root, zdtm))
}

/// One row of the runner's `results-PASS.tsv`: test, area, flavor, outcome, seconds, the plugin's evidence.
struct Row {
    test: String,
    area: String,
    flavor: String,
    outcome: String,
    evidence: String,
}

fn rows(path: &Path) -> Vec<Row> {
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    text.lines()
        .map(|line| {
            let f: Vec<&str> = line.split('\t').collect();
            assert_eq!(f.len(), 6, "a row of {} has {} fields: {line:?}", path.display(), f.len());
            Row {
                test: f[0].to_string(),
                area: f[1].to_string(),
                flavor: f[2].to_string(),
                outcome: f[3].to_string(),
                evidence: f[5].to_string(),
            }
        })
        .collect()
}

#[test]
fn zdtm_tests_pass_alike_with_the_plugin_loaded_and_without_it() {
    let test = "zdtm_tests_pass_alike_with_the_plugin_loaded_and_without_it";
    let Some((root, zdtm)) = zdtm_root_or_skip(test) else {
        return;
    };
    let bin = ensure_built();
    for f in [PLUGIN_FILE, "libcuda_test_double.so", "libnvml_test_double.so"] {
        assert!(bin.join(f).is_file(), "{} is missing after cargo build --workspace", bin.join(f).display());
    }
    let out_dir = tempfile::Builder::new().prefix("ccm-zdtm-").tempdir().expect("results directory");
    let run = Command::new("bash")
        .arg(repo_root().join("tests/zdtm/run.sh"))
        .arg("--bin")
        .arg(&bin)
        .arg("--out")
        .arg(out_dir.path())
        .env("CCM_CRIU_SUITE", &root.suite)
        .current_dir(repo_root())
        .stdin(Stdio::null())
        .output()
        .expect("run tests/zdtm/run.sh");
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    let tail = |text: &str, n: usize| -> String {
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    };
    // The table and the summary are the proof: shown whether the test passes or not (straight to stderr: the
    // harness captures what passing tests print).
    let _ = writeln!(std::io::stderr(), "\n{stdout}");
    if !run.status.success() {
        // zdtm's output and CRIU's logs of each test that did not pass as it should stay for the reader.
        let kept = out_dir.keep();
        panic!(
            "tests/zdtm/run.sh failed on {} (CRIU {}, {}): {}; its results and logs: {}\n--- its log (tail) ---\n{}",
            root.suite,
            root.criu_version(),
            zdtm.display(),
            run.status,
            kept.display(),
            tail(&stderr, 60)
        );
    }

    // What the runner checked, checked again from its results, with the list's coverage.
    let without = rows(&out_dir.path().join("results-without.tsv"));
    let with = rows(&out_dir.path().join("results-with.tsv"));
    assert_eq!(without.len(), with.len(), "the two passes ran different numbers of tests");
    let mut passing: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (a, b) in without.iter().zip(&with) {
        assert_eq!((&a.test, &a.flavor), (&b.test, &b.flavor), "the two passes ran the tests in another order");
        assert_eq!(
            a.outcome, b.outcome,
            "{} ({}) differs: without the plugin {}, with it {}",
            a.test, a.flavor, a.outcome, b.outcome
        );
        assert_eq!(a.outcome, "PASS", "{} ({}) does not pass: {}", a.test, a.flavor, a.outcome);
        assert_eq!(a.evidence, "absent", "{} ({}) without the plugin: {}", a.test, a.flavor, a.evidence);
        assert!(b.evidence.starts_with("ok: agent pid "), "{} ({}) with the plugin: {}", b.test, b.flavor, b.evidence);
        passing.entry(a.area.as_str()).or_default().insert(a.test.as_str());
    }
    let tests: BTreeSet<&str> = passing.values().flatten().copied().collect();
    assert!(
        tests.len() >= MIN_TESTS,
        "only {} zdtm tests pass in both passes; the list must hold {MIN_TESTS}",
        tests.len()
    );
    for area in AREAS {
        assert!(passing.contains_key(area), "no test of the area {area} ran: {:?}", passing.keys());
    }
    let summary = stdout.lines().rev().find(|l| l.starts_with("zdtm on ")).unwrap_or("(no summary line)");
    loud(&format!("NOTE {test}: {summary}"));
}
