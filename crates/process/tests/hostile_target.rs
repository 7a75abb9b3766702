//! Target processes that make what the kernel reports of them huge (issue 35 item 1): an environ
//! span set with `prctl(PR_SET_MM_MAP)`, a `/proc/PID/maps` of tens of thousands of long names.

// Test code: a failed unwrap or expect names its line (the workspace lints keep them out of product code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use ccm_process::{read_environ_block, read_maps, ProcessError};
use common::{TestChild, ENV_SPAN_ENV, MAPS_COUNT_ENV, MAPS_FILE_ENV};
use std::time::{Duration, Instant};

#[test]
fn zz_child_entry() {
    common::run_child_if_requested();
}

/// An unprivileged process (uid 65534, no capability when the test runs as root) sets its
/// `env_start..env_end` to 2 GiB and to 1 TiB with `prctl(PR_SET_MM, PR_SET_MM_MAP)`: the read is
/// refused from the bounds alone, at once, with a line that names the span and the cap; before the
/// cap it allocated the span (2.1 GB of root's CRIU for 2 GiB; an abort for 1 TiB).
#[test]
fn a_huge_environ_span_set_by_an_unprivileged_process_is_refused_unread() {
    for span in [2u64 << 30, 1 << 40] {
        let mut child = TestChild::spawn("env-span", &[(ENV_SPAN_ENV, &span.to_string())]);
        let uid = child.expect("UID");
        let cap_eff = child.expect("CAPEFF");
        if common::is_root() {
            assert!(uid.starts_with("65534"), "the child runs as nobody: {uid}");
            assert_eq!(cap_eff, "0000000000000000", "the child holds no capability");
        }
        let set = child.expect_any(&["SPAN", "PRCTL"]);
        let Some(bounds) = set.strip_prefix("SPAN ") else {
            panic!("prctl(PR_SET_MM, PR_SET_MM_MAP) refused in this kernel: {set}");
        };
        let (start, end) = bounds.split_once(' ').unwrap();
        let (start, end) = (u64::from_str_radix(start, 16).unwrap(), u64::from_str_radix(end, 16).unwrap());
        assert_eq!(end - start, span);
        let pid = child.pid();
        let t0 = Instant::now();
        let r = read_environ_block(pid);
        let took = t0.elapsed();
        match r {
            Err(e @ ProcessError::EnvironTooLarge { .. }) => {
                let m = e.to_string();
                assert!(m.contains(&format!("{span} bytes")) && m.contains("6291456 bytes"), "{m}");
                assert!(m.contains("PR_SET_MM") && m.contains("not read"), "{m}");
            }
            other => panic!("a {span}-byte environ span was read: {other:?}"),
        }
        eprintln!("a {span}-byte span refused after {took:?}");
        assert!(took < Duration::from_millis(500), "the refusal took {took:?}");
    }
}

/// A process maps one file of a 4 KB name 20,000 times: 78 MB of `/proc/PID/maps`, which root's
/// CRIU read whole (and parsed into as much again) at every dump. The read stops at 64 MiB and
/// refuses the process, naming the file.
#[test]
fn maps_larger_than_the_cap_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let mut dir = tmp.path().to_path_buf();
    let component = "m".repeat(250);
    while dir.as_os_str().len() + 251 < 4000 {
        dir.push(&component);
        std::fs::create_dir(&dir).unwrap();
    }
    let file = dir.join("f");
    std::fs::write(&file, [0u8; 4096]).unwrap();
    let count = 20_000;
    let mut child =
        TestChild::spawn("many-maps", &[(MAPS_FILE_ENV, file.to_str().unwrap()), (MAPS_COUNT_ENV, &count.to_string())]);
    let mapped: usize = child.expect("MAPPED").parse().unwrap();
    assert_eq!(mapped, count, "the child mapped the file {count} times");
    let t0 = Instant::now();
    match read_maps(child.pid()) {
        Err(e @ ProcessError::ProcFileTooLarge { .. }) => {
            let m = e.to_string();
            assert!(m.contains(&format!("/proc/{}/maps", child.pid())) && m.contains("67108864 bytes"), "{m}");
        }
        Ok(maps) => panic!("{} mappings read", maps.len()),
        Err(other) => panic!("{other:?}"),
    }
    eprintln!("refused after {:?}", t0.elapsed());
}
