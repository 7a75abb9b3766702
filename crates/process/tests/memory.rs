//! Scans, rewrites and environ edits against real child processes.

// Test code: a failed unwrap or expect names its line (the workspace lints keep them out of product code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use ccm_identity::{GpuUuid, PciSignature};
use ccm_process::mem::SCAN_CHUNK_BYTES;
use ccm_process::{
    env_var, read_environ_block, read_maps, read_signature, scan_signatures, verify_and_write, write_environ_edit,
    ProcessError, ProcessMemory, SiteError, DEFAULT_MAX_MAPPING_BYTES,
};
use common::{parse_hex_u64, parse_sig_hex, sig_to_env, TestChild, HOLDER_SIG_ENV};

#[test]
fn zz_child_entry() {
    common::run_child_if_requested();
}

fn gpu(n: u8) -> GpuUuid {
    GpuUuid([n; 16])
}

/// Signatures unlikely to occur by chance: per-test-process words in the subsystem slot.
fn sigs() -> (PciSignature, PciSignature) {
    let salt = std::process::id() & 0xffff;
    let old = PciSignature::from([0, 0x06, 0x00, 0, 0x233510de, 0x5eed_0000 | salt]);
    let new = PciSignature::from([0, 0x07, 0x00, 0, 0x233510de, 0x5eed_0000 | salt]);
    (old, new)
}

fn spawn_holder(sig: &PciSignature, extra_env: &[(&str, &str)]) -> (TestChild, u64, u64) {
    let sig_env = sig_to_env(sig);
    let mut envs = vec![(HOLDER_SIG_ENV, sig_env.as_str())];
    envs.extend_from_slice(extra_env);
    let mut child = TestChild::spawn("holder", &envs);
    let small = parse_hex_u64(&child.expect("ADDR"));
    let big = parse_hex_u64(&child.expect("BIG"));
    (child, small, big)
}

#[test]
fn scan_finds_and_rewrites_a_heap_signature() {
    let (old, new) = sigs();
    let (mut child, small, big) = spawn_holder(&old, &[]);
    let pid = child.pid();
    let wanted = [(gpu(0xa), old), (gpu(0xb), new)];

    let report = scan_signatures(pid, &wanted, DEFAULT_MAX_MAPPING_BYTES).expect("scan");
    let site = report
        .sites
        .iter()
        .find(|s| s.addr == small)
        .unwrap_or_else(|| panic!("heap signature at {small:#x} not found in {:#?}", report.sites));
    assert_eq!(site.gpu, gpu(0xa));
    assert_eq!(site.words, old);
    assert!(site.mapping_start <= small && small + 24 <= site.mapping_end);
    assert!(!report.sites.iter().any(|s| s.gpu == gpu(0xb)), "the new signature is nowhere yet");
    assert!(!report.sites.iter().any(|s| s.addr >= big && s.addr < big + common::BIG_BUFFER_BYTES as u64));
    // The big buffer is calloc'd and never touched: its pages are skipped as not resident, not read (issue 41 part 2).
    assert!(report.bytes_scanned + report.bytes_not_resident >= common::BIG_BUFFER_BYTES as u64);
    assert!(report.bytes_not_resident >= (common::BIG_BUFFER_BYTES as u64) - (1 << 20), "{report:?}");
    assert!(report.mappings_scanned > 0 && report.mappings_skipped > 0);

    let mem = ProcessMemory::open_read_write(pid).expect("open mem");
    assert_eq!(read_signature(&mem, small).expect("read"), old);
    verify_and_write(&mem, small, &old, &new).expect("rewrite");
    child.send("sig");
    assert_eq!(parse_sig_hex(&child.expect("SIG")), new, "the child sees the new words");

    // A second rewrite expecting the old words must refuse and leave the memory alone.
    match verify_and_write(&mem, small, &old, &new) {
        Err(SiteError::SiteChanged { pid: p, addr, expected, seen }) => {
            assert_eq!((p, addr, expected, seen), (pid, small, old, new));
        }
        other => panic!("expected SiteChanged, got {other:?}"),
    }

    let again = scan_signatures(pid, &wanted, DEFAULT_MAX_MAPPING_BYTES).expect("rescan");
    assert!(again.sites.iter().any(|s| s.addr == small && s.gpu == gpu(0xb)));
    assert!(!again.sites.iter().any(|s| s.addr == small && s.gpu == gpu(0xa)));
}

#[test]
fn scan_sees_signatures_across_chunk_borders_once() {
    let (old, _) = sigs();
    let (mut child, _small, big) = spawn_holder(&old, &[]);
    let pid = child.pid();
    let mapping = read_maps(pid)
        .expect("maps")
        .into_iter()
        .find(|m| m.start <= big && big < m.end)
        .expect("mapping of the big buffer");
    let chunk = SCAN_CHUNK_BYTES as u64;
    let border1 = mapping.start + chunk;
    let border2 = mapping.start + 2 * chunk;
    assert!(border1 - 24 >= big && border2 + 124 <= big + common::BIG_BUFFER_BYTES as u64);
    // Wholly inside the bytes carried over a border, straddling a border, and after it.
    let placed = [border1 - 24, border2 - 12, border2 + 100];
    for addr in placed {
        child.send(&format!("put {addr:x}"));
        child.expect("OK");
    }

    let wanted = [(gpu(0xa), old)];
    let report = scan_signatures(pid, &wanted, DEFAULT_MAX_MAPPING_BYTES).expect("scan");
    let mut in_big: Vec<u64> =
        report.sites.iter().filter(|s| s.mapping_start == mapping.start).map(|s| s.addr).collect();
    in_big.sort_unstable();
    assert_eq!(in_big, placed, "each placed signature exactly once");
    assert!(report
        .sites
        .iter()
        .filter(|s| s.mapping_start == mapping.start)
        .all(|s| s.mapping_name.is_empty() && s.mapping_end == mapping.end && s.words == old));

    // Mappings above the bound are not read.
    let bounded = scan_signatures(pid, &wanted, 1 << 20).expect("bounded scan");
    assert!(!bounded.sites.iter().any(|s| s.mapping_start == mapping.start));
    assert!(bounded.bytes_scanned < report.bytes_scanned);
}

#[test]
fn memory_errors_name_the_problem() {
    match ProcessMemory::open_read_only(u32::MAX) {
        Err(ProcessError::NoSuchProcess { pid, .. }) => assert_eq!(pid, u32::MAX),
        other => panic!("expected NoSuchProcess, got {other:?}"),
    }
    let (old, _) = sigs();
    let (child, small, _) = spawn_holder(&old, &[]);
    let mem = ProcessMemory::open_read_only(child.pid()).expect("open");
    let mut buf = [0u8; 24];
    match mem.read_exact_at(0x1000, &mut buf) {
        Err(e @ ProcessError::Unmapped { .. }) => assert!(e.to_string().contains("not mapped")),
        other => panic!("expected Unmapped, got {other:?}"),
    }
    mem.read_exact_at(small, &mut buf).expect("read");
    assert_eq!(PciSignature::from_bytes(&buf), old);
    // Read-only memory refuses writes.
    assert!(mem.write_all_at(small, &buf).is_err());
}

#[test]
fn environ_is_read_and_edited_in_place() {
    let (old_sig, _) = sigs();
    let before = "GPU-aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa";
    let after = "GPU-bbbbbbbb-bbbb-bbbb-bbbb-bbbbbbbbbbbb";
    let (mut child, _, _) = spawn_holder(&old_sig, &[("CCM_TEST_MARK", before)]);
    let pid = child.pid();

    let block = read_environ_block(pid).expect("environ");
    assert_eq!(env_var(&block, "CCM_TEST_MARK").as_deref(), Some(before));
    assert_eq!(env_var(&block, "CCM_PROCESS_TEST_CHILD").as_deref(), Some("holder"));
    let (offset, value) = block.find_value("CCM_TEST_MARK").expect("offset");
    assert_eq!(value, before.as_bytes());

    // Refusals first: nothing may change.
    assert!(matches!(
        write_environ_edit(pid, block.start, offset, b"GPU-x", after.as_bytes()),
        Err(ProcessError::EnvironLengthMismatch { .. })
    ));
    assert!(matches!(
        write_environ_edit(pid, block.start, offset, after.as_bytes(), before.as_bytes()),
        Err(ProcessError::MemoryChanged { .. })
    ));
    assert!(matches!(
        write_environ_edit(pid, block.start, block.bytes.len() - 4, before.as_bytes(), after.as_bytes()),
        Err(ProcessError::EnvironOutOfBounds { .. })
    ));
    assert!(matches!(
        write_environ_edit(pid, block.start + 8, offset - 8, before.as_bytes(), after.as_bytes()),
        Err(ProcessError::EnvironOutOfBounds { .. })
    ));

    write_environ_edit(pid, block.start, offset, before.as_bytes(), after.as_bytes()).expect("edit");
    child.send("env CCM_TEST_MARK");
    assert_eq!(child.expect("ENV"), after, "getenv in the child sees the edit");
    let block = read_environ_block(pid).expect("environ again");
    assert_eq!(env_var(&block, "CCM_TEST_MARK").as_deref(), Some(after));
}
