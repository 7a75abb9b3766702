//! Hostile and broken archives: each must end in its own clear error, quickly, without reading what
//! it need not read.

// Test code: a failed unwrap or expect names its line (the workspace lints keep them out of product code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::time::Duration;

use ccm_archive::{read_archive, ArchiveError, Compression, Limits, PathRule, Truncation};
use common::*;
use tar::EntryType;

/// Reads `bytes` as an archive file under `dir` and returns the error, checking that it came quickly
/// and that its message names the archive.
fn refuse_with(dir: &Path, bytes: &[u8], limits: &Limits) -> ArchiveError {
    let path = write(dir, "hostile.tar", bytes);
    refuse_path(&path, limits)
}

fn refuse_path(path: &Path, limits: &Limits) -> ArchiveError {
    let (result, took) = timed(|| read_archive(path, limits));
    let err = match result {
        Ok(archive) => panic!("read: {archive:?}"),
        Err(e) => e,
    };
    assert!(took < QUICK, "{err} took {took:?}");
    assert!(err.to_string().contains(&path.display().to_string()), "names the archive: {err}");
    err
}

fn refuse(bytes: &[u8]) -> ArchiveError {
    let dir = tempfile::tempdir().unwrap();
    refuse_with(dir.path(), bytes, &Limits::default())
}

/// A small valid checkpoint around `middle`: the hostile part sits between good members.
fn around(middle: impl FnOnce(&mut Tar)) -> Vec<u8> {
    let mut t = Tar::new();
    t.dir("checkpoint").file("checkpoint/inventory.img", b"inv");
    middle(&mut t);
    t.file("checkpoint/cuda-migrate-1.img", &image_bytes(1)).file("spec.dump", SPEC);
    t.finish()
}

fn unsafe_path(err: &ArchiveError) -> (String, PathRule) {
    match err {
        ArchiveError::UnsafePath { member, rule, .. } => (member.clone(), *rule),
        other => panic!("not an unsafe path: {other}"),
    }
}

// --- member paths ---

#[test]
fn parent_dir_member_is_refused_even_though_it_would_be_skipped() {
    let err = refuse(&around(|t| {
        t.raw(b"../etc/passwd", EntryType::Regular, 8, b"hunter2\n");
    }));
    assert_eq!(unsafe_path(&err), ("../etc/passwd".into(), PathRule::ParentDir));
    let msg = err.to_string();
    assert!(msg.contains("`../etc/passwd`") && msg.contains("`..` component"), "{msg}");
    assert!(!msg.contains("hunter2"), "no contents in messages: {msg}");
}

#[test]
fn absolute_member_is_refused() {
    let err = refuse(&around(|t| {
        t.raw(b"/abs/path", EntryType::Regular, 3, b"abc");
    }));
    assert_eq!(unsafe_path(&err), ("/abs/path".into(), PathRule::Absolute));
    assert!(err.to_string().contains("absolute path"));
}

#[test]
fn parent_dir_inside_checkpoint_is_refused() {
    let err = refuse(&around(|t| {
        t.raw(b"checkpoint/../../x", EntryType::Regular, 0, b"");
    }));
    assert_eq!(unsafe_path(&err), ("checkpoint/../../x".into(), PathRule::ParentDir));
}

#[test]
fn parent_dir_in_a_symlink_name_is_refused() {
    let err = refuse(&around(|t| {
        t.raw(b"checkpoint/..", EntryType::Symlink, 0, b"");
    }));
    assert_eq!(unsafe_path(&err).1, PathRule::ParentDir);
}

#[test]
fn parent_dir_in_a_pax_path_is_refused_though_the_header_name_is_benign() {
    let err = refuse(&around(|t| {
        t.pax(&[("path", b"checkpoint/../../../root/.ssh/authorized_keys")]);
        t.raw(b"benign", EntryType::Regular, 1, b"k");
    }));
    assert_eq!(unsafe_path(&err), ("checkpoint/../../../root/.ssh/authorized_keys".into(), PathRule::ParentDir));
}

#[test]
fn parent_dir_in_a_gnu_long_name_is_refused() {
    let err = refuse(&around(|t| {
        t.long_name(format!("checkpoint/{}../../x", "a/".repeat(60)).as_bytes());
        t.raw(b"benign", EntryType::Regular, 0, b"");
    }));
    assert_eq!(unsafe_path(&err).1, PathRule::ParentDir);
}

#[test]
fn control_characters_in_names_are_escaped_in_messages() {
    let err = refuse(&around(|t| {
        t.raw(b"../\x1b[2J\x1b]0;owned\x07", EntryType::Regular, 0, b"");
    }));
    let msg = err.to_string();
    assert!(!msg.chars().any(|c| c.is_control()), "{msg:?}");
    assert!(msg.contains("\\u{1b}[2J"), "{msg}");

    // The archive's own path too.
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "a\nb.tar", b"not a tar");
    let msg = read_archive(&path, &Limits::default()).unwrap_err().to_string();
    assert!(msg.contains("a\\nb.tar") && !msg.contains('\n'), "{msg}");
}

// --- the members we read must be unique regular files ---

fn not_regular(err: &ArchiveError) -> (&str, &str) {
    match err {
        ArchiveError::NotRegularMember { member, kind, .. } => (member.as_str(), *kind),
        other => panic!("not a not-regular-member error: {other}"),
    }
}

#[test]
fn symlink_named_like_an_identity_image_is_refused() {
    let err = refuse(&around(|t| {
        t.link(EntryType::Symlink, "checkpoint/cuda-migrate-7.img", "pages-1.img");
    }));
    assert_eq!(not_regular(&err), ("checkpoint/cuda-migrate-7.img", "a symbolic link"));
    assert!(err.to_string().contains("must be a regular file"));
}

#[test]
fn hardlink_named_like_an_identity_image_is_refused() {
    let err = refuse(&around(|t| {
        t.link(EntryType::Link, "checkpoint/cuda-migrate-7.img", "checkpoint/inventory.img");
    }));
    assert_eq!(not_regular(&err), ("checkpoint/cuda-migrate-7.img", "a hard link"));
}

#[test]
fn special_files_named_like_an_identity_image_are_refused() {
    for (kind, name) in [
        (EntryType::Fifo, "a FIFO"),
        (EntryType::Char, "a character device"),
        (EntryType::Block, "a block device"),
        (EntryType::Directory, "a directory"),
        (EntryType::Continuous, "a contiguous file (tar type 7)"),
    ] {
        let err = refuse(&around(|t| {
            t.special(kind, "checkpoint/cuda-migrate-7.img");
        }));
        assert_eq!(not_regular(&err), ("checkpoint/cuda-migrate-7.img", name));
    }
    // A regular entry whose name ends in `/` is a directory to extractors.
    let err = refuse(&around(|t| {
        t.raw(b"checkpoint/cuda-migrate-7.img/", EntryType::Regular, 0, b"");
    }));
    assert_eq!(not_regular(&err).1, "a directory (its name ends in `/`)");
}

#[test]
fn links_named_like_the_other_members_we_read_are_refused() {
    for name in ["spec.dump", "./checkpoint/inventory.img", "checkpoint/cuda-migrate-restore-3.txt"] {
        let mut t = Tar::new();
        t.dir("checkpoint");
        t.raw(name.as_bytes(), EntryType::Symlink, 0, b"");
        let err = refuse(&t.finish());
        assert_eq!(not_regular(&err), (name, "a symbolic link"));
    }
}

#[test]
fn duplicate_identity_image_is_refused() {
    let err = refuse(&around(|t| {
        t.file("checkpoint/cuda-migrate-7.img", &image_bytes(7));
        t.file("checkpoint/cuda-migrate-7.img", &image_bytes(8));
    }));
    assert!(matches!(err, ArchiveError::Duplicate { ref member, .. } if member == "checkpoint/cuda-migrate-7.img"));
}

#[test]
fn dot_slash_spelling_of_the_same_image_is_a_duplicate() {
    for (first, second) in [
        ("checkpoint/cuda-migrate-7.img", "./checkpoint/cuda-migrate-7.img"),
        ("./checkpoint/cuda-migrate-7.img", "checkpoint//./cuda-migrate-7.img"),
        ("spec.dump", "./spec.dump"),
    ] {
        let err = refuse(&around(|t| {
            t.raw(first.as_bytes(), EntryType::Regular, 4, b"aaaa");
            t.raw(second.as_bytes(), EntryType::Regular, 12, b"SECRET-TOKEN");
        }));
        match err {
            ArchiveError::Duplicate { ref member, first: ref f, .. } => {
                assert_eq!((member.as_str(), f.as_str()), (second, first));
            }
            ref other => panic!("{other}"),
        }
        assert!(!err.to_string().contains("SECRET"), "no contents: {err}");
    }
}

// --- sizes ---

fn too_large(err: &ArchiveError) -> (&str, u64, u64) {
    match err {
        ArchiveError::MemberTooLarge { member, size, max, .. } => (member.as_str(), *size, *max),
        other => panic!("not a too-large error: {other}"),
    }
}

#[test]
fn identity_image_of_17_mib_is_refused() {
    let err = refuse(&around(|t| {
        t.zeros("checkpoint/cuda-migrate-3.img", 17 * MIB);
    }));
    assert_eq!(too_large(&err), ("checkpoint/cuda-migrate-3.img", 17 * MIB, 16 * MIB));
    assert!(err.to_string().contains("an identity image may be 16777216 bytes (16.0 MiB) at most"), "{err}");
}

#[test]
fn oversized_member_is_refused_from_its_header_without_reading() {
    // The header says 17 MiB and the archive ends right after it: had the data been read, this would
    // be a truncation.
    let mut t = Tar::new();
    t.dir("checkpoint").raw_header(&raw_header(b"checkpoint/cuda-migrate-3.img", EntryType::Regular, 17 * MIB));
    let err = refuse(&t.unfinished());
    assert_eq!(too_large(&err).1, 17 * MIB);
}

#[test]
fn oversized_report_and_spec_are_refused() {
    let err = refuse(&around(|t| {
        t.zeros("checkpoint/cuda-migrate-restore-3.txt", MIB + 1);
    }));
    assert_eq!(too_large(&err), ("checkpoint/cuda-migrate-restore-3.txt", MIB + 1, MIB));
    let mut t = Tar::new();
    t.dir("checkpoint").zeros("spec.dump", 4 * MIB + 1);
    assert_eq!(too_large(&refuse(&t.finish())), ("spec.dump", 4 * MIB + 1, 4 * MIB));
}

#[test]
fn oversized_extension_header_is_refused_without_reading() {
    // A "long name" of 2 GiB (the `tar` crate would read it into memory whole).
    let mut t = Tar::new();
    t.dir("checkpoint").raw_header(&raw_header(b"././@LongLink", EntryType::GNULongName, 2 << 30));
    let err = refuse(&t.unfinished());
    assert!(matches!(err, ArchiveError::CorruptHeader { offset: 512, .. }), "{err}");
    assert!(err.to_string().contains("GNU long-name header of 2147483648 bytes"), "{err}");
}

#[test]
fn kept_members_together_are_capped() {
    let dir = tempfile::tempdir().unwrap();
    let limits = Limits { max_kept_bytes: 3 * MIB / 2, ..Limits::default() };
    let bytes = around(|t| {
        t.zeros("checkpoint/cuda-migrate-2.img", MIB).zeros("checkpoint/cuda-migrate-3.img", MIB);
    });
    let err = refuse_with(dir.path(), &bytes, &limits);
    assert!(matches!(err, ArchiveError::KeptLimit { max, .. } if max == 3 * MIB / 2), "{err}");
}

#[test]
fn member_count_is_capped() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = Tar::new();
    t.dir("checkpoint");
    for i in 0..50 {
        t.file(&format!("checkpoint/f{i}"), b"");
    }
    let limits = Limits { max_members: 10, ..Limits::default() };
    let err = refuse_with(dir.path(), &t.finish(), &limits);
    assert!(matches!(err, ArchiveError::TooManyMembers { max: 10, .. }), "{err}");
}

// --- truncation ---

fn truncation(err: ArchiveError) -> Truncation {
    match err {
        ArchiveError::Truncated { what, .. } => what,
        other => panic!("not a truncation: {other}"),
    }
}

/// [`podman_like`] cut in the middle of its 20 MiB `pages-1.img`.
fn cut_in_pages() -> Vec<u8> {
    let mut tar = podman_like();
    tar.truncate(10 * usize::try_from(MIB).unwrap());
    tar
}

#[test]
fn archive_cut_inside_a_member_is_truncated() {
    let err = refuse(&cut_in_pages());
    assert!(err.to_string().contains("truncated archive: it ends inside member `checkpoint/pages-1.img`"), "{err}");
    match truncation(err) {
        Truncation::InMember { member, size, present, .. } => {
            assert_eq!((member.as_str(), size), ("checkpoint/pages-1.img", 20 * MIB));
            assert!(present > 9 * MIB && present < 10 * MIB, "{present}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn compressed_archive_of_a_cut_tar_is_truncated() {
    for compression in [Compression::Gzip, Compression::Zstd] {
        let bytes = compress(&cut_in_pages(), compression);
        assert!(matches!(truncation(refuse(&bytes)), Truncation::InMember { .. }), "{compression}");
    }
}

#[test]
fn cut_compressed_stream_is_truncated() {
    for compression in [Compression::Gzip, Compression::Zstd] {
        let mut bytes = compress(&podman_like(), compression);
        bytes.truncate(bytes.len() / 2);
        match truncation(refuse(&bytes)) {
            Truncation::CompressedStream { compression: c, .. } => assert_eq!(c, compression),
            other => panic!("{compression}: {other:?}"),
        }
    }
}

#[test]
fn header_saying_1_gib_with_1_kib_after_it_is_truncated() {
    let mut t = Tar::new();
    t.dir("checkpoint")
        .raw_header(&raw_header(b"checkpoint/pages-1.img", EntryType::Regular, 1 << 30))
        .bytes(&[0x11; 1024]);
    let tar = t.unfinished();
    for compression in [Compression::None, Compression::Gzip, Compression::Zstd] {
        match truncation(refuse(&compress(&tar, compression))) {
            Truncation::InMember { size, present, .. } => assert_eq!((size, present), (1 << 30, 1024)),
            other => panic!("{compression}: {other:?}"),
        }
    }
}

#[test]
fn cut_between_members_is_truncated() {
    // No end-of-archive block: the cut may have dropped members, so this is no answer.
    let mut t = Tar::new();
    t.dir("checkpoint").file("checkpoint/inventory.img", b"inv");
    let tar = t.unfinished();
    for compression in [Compression::None, Compression::Gzip] {
        let what = truncation(refuse(&compress(&tar, compression)));
        // The directory's header, the file's header and its one block of data.
        assert_eq!(what, Truncation::NoEndMarker { offset: 1536 }, "{compression}");
    }
}

#[test]
fn cut_inside_a_header_is_truncated() {
    let mut t = Tar::new();
    t.dir("checkpoint").file("checkpoint/inventory.img", b"inv");
    let mut tar = t.finish();
    tar.truncate(1536 + 100);
    assert_eq!(truncation(refuse(&tar)), Truncation::InHeader { offset: 1536 });
}

// --- bombs ---

/// A zstd stream of `parts`: each raw part as its own frame, and `Zeros(n)` as frames of 1 MiB of
/// zeros, compressed once and repeated (a few dozen bytes each).
enum Part<'a> {
    Raw(&'a [u8]),
    Zeros(u64),
}

fn zstd_of(parts: &[Part]) -> Vec<u8> {
    let mib_of_zeros = zstd::stream::encode_all(io::repeat(0).take(MIB), 3).unwrap();
    let mut out = Vec::new();
    for part in parts {
        match part {
            Part::Raw(bytes) => out.extend(zstd::stream::encode_all(*bytes, 1).unwrap()),
            Part::Zeros(n) => {
                assert_eq!(n % MIB, 0);
                for _ in 0..n / MIB {
                    out.extend_from_slice(&mib_of_zeros);
                }
            }
        }
    }
    out
}

fn scan_limit(err: &ArchiveError) -> u64 {
    match err {
        ArchiveError::ScanLimit { max, .. } => *max,
        other => panic!("not the scan limit: {other}"),
    }
}

const SMALL_SCAN: Limits = Limits { max_scanned_bytes: 64 * MIB, max_members: 1_000_000, max_kept_bytes: 256 * MIB };

#[test]
fn zstd_bomb_of_one_member_stops_at_the_scan_limit() {
    // 2 GiB of zeros in one member, compressed to a few dozen KiB.
    let header = raw_header(b"checkpoint/pages-1.img", EntryType::Regular, 2 << 30);
    let bomb = zstd_of(&[Part::Raw(header.as_bytes()), Part::Zeros(2 << 30), Part::Raw(&[0; 1024])]);
    assert!(bomb.len() < 128 * 1024, "{}", bomb.len());
    let dir = tempfile::tempdir().unwrap();
    let err = refuse_with(dir.path(), &bomb, &SMALL_SCAN);
    assert_eq!(scan_limit(&err), 64 * MIB);
    let msg = err.to_string();
    assert!(msg.contains("raise the scan limit") && msg.contains("checkpoint/ directory"), "{msg}");
}

#[test]
fn zstd_bomb_of_many_members_stops_at_the_scan_limit() {
    // 2048 members of 1 MiB: each passes on its own, the sum does not; the walk reads at most the
    // limit before it stops.
    let mut parts = Vec::new();
    let headers: Vec<_> = (0..2048)
        .map(|i| raw_header(format!("checkpoint/pages-{i}.img").as_bytes(), EntryType::Regular, MIB))
        .collect();
    for h in &headers {
        parts.push(Part::Raw(h.as_bytes()));
        parts.push(Part::Zeros(MIB));
    }
    let bomb = zstd_of(&parts);
    let dir = tempfile::tempdir().unwrap();
    let (err, took) = timed(|| refuse_with(dir.path(), &bomb, &SMALL_SCAN));
    assert_eq!(scan_limit(&err), 64 * MIB);
    assert!(took < QUICK, "{took:?}");
}

#[test]
fn gzip_bomb_stops_at_the_scan_limit() {
    // Concatenated gzip members: headers, and 1 MiB of zeros compressed once and repeated.
    let mib_of_zeros = gzip(&vec![0; usize::try_from(MIB).unwrap()]);
    let mut bomb = Vec::new();
    for i in 0..2048 {
        bomb.extend(gzip(
            raw_header(format!("checkpoint/pages-{i}.img").as_bytes(), EntryType::Regular, MIB).as_bytes(),
        ));
        bomb.extend_from_slice(&mib_of_zeros);
    }
    let dir = tempfile::tempdir().unwrap();
    let limits = Limits { max_scanned_bytes: 16 * MIB, ..Limits::default() };
    assert_eq!(scan_limit(&refuse_with(dir.path(), &bomb, &limits)), 16 * MIB);
}

#[test]
fn plain_archive_is_held_to_the_scan_limit_too() {
    let dir = tempfile::tempdir().unwrap();
    let limits = Limits { max_scanned_bytes: 8 * MIB, ..Limits::default() };
    assert_eq!(scan_limit(&refuse_with(dir.path(), &podman_like(), &limits)), 8 * MIB);
}

// --- not a checkpoint, not a tar, not a file ---

#[test]
fn tar_without_checkpoint_directory_is_not_a_checkpoint() {
    let mut t = Tar::new();
    t.file("config.dump", b"{}").file("spec.dump", SPEC).file("cuda-migrate-1.img", b"x").file("checkpoint", b"file");
    let err = refuse(&t.finish());
    assert!(matches!(err, ArchiveError::NotCheckpoint { .. }), "{err}");
    assert!(err.to_string().contains("not a CRIU checkpoint archive"), "{err}");
}

#[test]
fn data_that_is_no_tar_is_refused() {
    let not_tar = |bytes: &[u8]| match refuse(bytes) {
        ArchiveError::NotTar { why, .. } => why,
        other => panic!("{other}"),
    };
    assert_eq!(not_tar(b""), "it is empty");
    assert_eq!(not_tar(b"{\"json\": true}"), "it is shorter than one tar header");
    assert_eq!(not_tar(&[b'x'; 4096]), "its first 512 bytes are not a tar header");
    assert!(not_tar(&[0xfd, b'7', b'z', b'X', b'Z', 0, 0, 0]).contains("xz"));
    assert!(not_tar(&compress(&[b'x'; 4096], Compression::Zstd)).contains("decompressed data"));
    // An empty tar is a tar, but no checkpoint.
    assert!(matches!(refuse(&[0; 1024]), ArchiveError::NotCheckpoint { .. }));
}

#[test]
fn corrupt_gzip_is_a_decompression_error() {
    let mut bytes = compress(&podman_like(), Compression::Gzip);
    for b in &mut bytes[20..200] {
        *b ^= 0x5a;
    }
    assert!(matches!(refuse(&bytes), ArchiveError::Decompress { compression: Compression::Gzip, .. }));
}

#[test]
fn header_checksum_mismatch_is_corrupt() {
    let mut t = Tar::new();
    t.dir("checkpoint").file("checkpoint/inventory.img", b"inv");
    let mut tar = t.finish();
    tar[512] ^= 0x20; // the second header's name
    assert!(matches!(refuse(&tar), ArchiveError::CorruptHeader { offset: 512, .. }));
}

#[test]
fn readers_disagreeing_on_the_layout_are_refused() {
    // A symlink carrying data: Go reads none, others read 512 bytes.
    let err = refuse(&around(|t| {
        t.raw(b"checkpoint/link", EntryType::Symlink, 512, &[b'x'; 512]);
    }));
    assert!(err.to_string().contains("is a symbolic link with 512 bytes of data"), "{err}");
    // Two long names for one member.
    let err = refuse(&around(|t| {
        t.long_name(b"checkpoint/a").long_name(b"checkpoint/b").raw(b"x", EntryType::Regular, 0, b"");
    }));
    assert!(err.to_string().contains("after another one for the same member"), "{err}");
    // A malformed PAX record.
    let err = refuse(&around(|t| {
        t.raw(b"PaxHeader", EntryType::XHeader, 9, b"9 size=x\n");
        t.raw(b"x", EntryType::Regular, 0, b"");
    }));
    assert!(err.to_string().contains("a PAX size that is not a decimal number"), "{err}");
    // Extension headers with no member after them.
    let mut t = Tar::new();
    t.dir("checkpoint").long_name(b"checkpoint/a");
    assert!(refuse(&t.finish()).to_string().contains("extension headers that no member follows"));
}

fn not_regular_file(path: &Path) -> &'static str {
    match refuse_path(path, &Limits::default()) {
        ArchiveError::NotRegularFile { kind, .. } => kind,
        other => panic!("{other}"),
    }
}

#[test]
fn archive_path_that_is_a_fifo_is_refused_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("export.tar");
    let status = std::process::Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(status.success());
    // No writer ever comes: an open without O_NONBLOCK (or at all) would hang here.
    assert_eq!(not_regular_file(&fifo), "a FIFO (named pipe)");
}

#[test]
fn archive_path_that_is_a_directory_or_device_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(not_regular_file(dir.path()), "a directory");
    assert_eq!(not_regular_file(Path::new("/dev/null")), "a character device");
    let link = dir.path().join("to-dir");
    std::os::unix::fs::symlink(dir.path(), &link).unwrap();
    assert_eq!(not_regular_file(&link), "a directory");
}

#[test]
fn missing_archive_is_an_open_error() {
    let path = PathBuf::from("/nonexistent/ccm-archive-test.tar");
    let (result, took) = timed(|| read_archive(&path, &Limits::default()));
    assert!(matches!(result, Err(ArchiveError::Open { .. })));
    assert!(took < Duration::from_secs(1));
}

// --- every tar reader must name each member alike (issue 29) ---

/// A valid checkpoint with a benign image, and after it `attack`: a member that GNU tar, Python and
/// Go would unpack under another name than this reader resolves.
fn after_benign(attack: impl FnOnce(&mut Tar)) -> Vec<u8> {
    let mut t = Tar::new();
    t.dir("checkpoint")
        .file("checkpoint/inventory.img", b"inv")
        .file("checkpoint/cuda-migrate-1.img", &image_bytes(1))
        .file("spec.dump", SPEC);
    attack(&mut t);
    t.finish()
}

fn ambiguous(err: &ArchiveError) -> &'static str {
    match err {
        ArchiveError::Ambiguous { reason, .. } => reason,
        other => panic!("not an ambiguous header: {other}"),
    }
}

/// Where GNU tar and Python can be run: that they name `expected` (normalized) among the members,
/// which this reader would not have seen. It proves the archive is the attack it claims to be.
fn oracles_see(bytes: &[u8], expected: &str) {
    let Some(oracles) = oracle_names(bytes) else { return };
    for (oracle, names) in oracles {
        let names = shown_names(&names.unwrap_or_else(|e| panic!("{oracle}: {e}")));
        let count = names.iter().filter(|n| *n == expected).count();
        assert!(count >= 1, "{oracle} does not name `{expected}`: {names:?}");
    }
}

#[test]
fn a_pax_gnu_sparse_name_is_refused() {
    // GNU tar, Python and Go name the member by `GNU.sparse.name`; the `tar` crate by the header.
    for name in [&b"checkpoint/cuda-migrate-1.img"[..], b"./checkpoint/cuda-migrate-1.img", b"../../etc/cron.d/x"] {
        let bytes = after_benign(|t| {
            t.pax(&[("GNU.sparse.name", name)]);
            t.file("checkpoint/core-9.img", b"EVIL-IMAGE");
        });
        oracles_see(&bytes, &String::from_utf8_lossy(&normalized(name)));
        let err = refuse(&bytes);
        assert!(ambiguous(&err).contains("GNU.sparse"), "{err}");
        let msg = err.to_string();
        assert!(msg.contains("read differently by different tar readers") && msg.contains("re-export"), "{msg}");
        assert!(!msg.contains("EVIL"), "{msg}");
    }
    // The other keys of GNU's PAX sparse formats likewise.
    for key in ["GNU.sparse.major", "GNU.sparse.map", "GNU.sparse.size", "GNU.sparse.realsize"] {
        let err = refuse(&after_benign(|t| {
            t.pax(&[(key, b"1")]);
            t.file("checkpoint/core-9.img", b"x");
        }));
        assert!(ambiguous(&err).contains("GNU.sparse"), "{key}: {err}");
    }
}

/// A ustar header (magic `ustar\0`) with `version`, the name `cuda-migrate-1.img` and the prefix
/// `checkpoint`.
fn ustar_with_prefix(version: &[u8; 2], trailer: Option<&[u8; 4]>) -> tar::Header {
    let mut h = tar::Header::new_ustar();
    h.set_entry_type(EntryType::Regular);
    h.set_size(10);
    h.set_mode(0o600);
    let b = h.as_mut_bytes();
    b[..18].copy_from_slice(b"cuda-migrate-1.img");
    b[345..355].copy_from_slice(b"checkpoint");
    b[263..265].copy_from_slice(version);
    if let Some(trailer) = trailer {
        b[508..512].copy_from_slice(trailer);
    }
    h.set_cksum();
    h
}

#[test]
fn a_ustar_header_of_another_version_is_refused() {
    // GNU tar, Python and Go read the prefix of any `ustar\0` header; the `tar` crate only of version
    // `00`, so it saw `cuda-migrate-1.img` at the top where the others unpack the image.
    for version in [b"\0\0", b" \0", b"01", b"0\0"] {
        let bytes = after_benign(|t| {
            t.raw_header(&ustar_with_prefix(version, None)).bytes(b"EVIL-IMAGE").bytes(&[0; 502]);
        });
        oracles_see(&bytes, "checkpoint/cuda-migrate-1.img");
        let err = refuse(&bytes);
        assert!(ambiguous(&err).contains("version is not `00`"), "{version:?}: {err}");
    }
    // Version `00` is plain ustar: every reader takes the prefix, and the image is a duplicate.
    let err = refuse(&after_benign(|t| {
        t.raw_header(&ustar_with_prefix(b"00", None)).bytes(b"EVIL-IMAGE").bytes(&[0; 502]);
    }));
    assert!(matches!(err, ArchiveError::Duplicate { .. }), "{err}");
}

#[test]
fn a_star_trailer_is_refused() {
    // Go reads a star header's prefix as 131 bytes, the others as 155.
    let err = refuse(&after_benign(|t| {
        t.raw_header(&ustar_with_prefix(b"00", Some(b"tar\0"))).bytes(&[0; 512]);
    }));
    assert!(ambiguous(&err).contains("star trailer"), "{err}");
}

#[test]
fn a_gnu_or_old_header_with_a_prefix_is_refused() {
    // Python prefixes the name of any header with the string at byte 345; GNU tar, Go and the `tar`
    // crate read no prefix in a GNU or pre-POSIX header.
    for magic in [&b"ustar  \0"[..], b"\0\0\0\0\0\0\0\0", b"ustar \0\0"] {
        let mut h = raw_header(b"cuda-migrate-1.img", EntryType::Regular, 10);
        let b = h.as_mut_bytes();
        b[257..265].copy_from_slice(magic);
        b[345..355].copy_from_slice(b"checkpoint");
        h.set_cksum();
        let bytes = after_benign(|t| {
            t.raw_header(&h).bytes(b"EVIL-IMAGE").bytes(&[0; 502]);
        });
        let err = refuse(&bytes);
        assert!(ambiguous(&err).contains("ustar's name prefix"), "{magic:?}: {err}");
    }
}

#[test]
fn tar_types_outside_posix_and_gnu_are_refused() {
    // `X` is a PAX header to GNU tar and Python, a file to Go and the `tar` crate; `V`, `M`, `N`,
    // `D` are GNU tar's own.
    for flag in [b'X', b'V', b'M', b'N', b'D', b'A', b'Z'] {
        let err = refuse(&after_benign(|t| {
            t.raw(b"checkpoint/x", EntryType::new(flag), 0, b"");
        }));
        assert!(ambiguous(&err).contains("a tar type other than"), "{}: {err}", flag as char);
    }
}

#[test]
fn a_member_through_an_earlier_symlink_is_refused() {
    // `x -> checkpoint`, then `x/cuda-migrate-1.img`: GNU tar and Python write it into checkpoint/.
    let bytes = after_benign(|t| {
        t.link(EntryType::Symlink, "x", "checkpoint").file("x/cuda-migrate-1.img", b"EVIL-IMAGE");
    });
    let err = refuse(&bytes);
    match &err {
        ArchiveError::ThroughLink { member, link, kind, .. } => {
            assert_eq!((member.as_str(), link.as_str(), *kind), ("x/cuda-migrate-1.img", "x", "a symbolic link"));
        }
        other => panic!("{other}"),
    }
    assert!(err.to_string().contains("tar would write it through that link"), "{err}");
    for (link, member) in [
        // Spelled otherwise, or deeper.
        ("./x", "x//./cuda-migrate-1.img"),
        ("a/b", "a/b/c/d"),
        // The checkpoint directory itself a link.
        ("checkpoint2", "checkpoint2/x"),
        // A member that replaces a link: Python writes it into the link's target.
        ("y", "y"),
    ] {
        let err = refuse(&after_benign(|t| {
            t.link(EntryType::Symlink, link, "checkpoint").file(member, b"x");
        }));
        assert!(matches!(err, ArchiveError::ThroughLink { .. }), "{link} {member}: {err}");
    }
    // Through a hard link (to a symbolic link), and a hard link whose target runs through one.
    let err = refuse(&after_benign(|t| {
        t.link(EntryType::Symlink, "s", "checkpoint")
            .link(EntryType::Link, "h", "s")
            .file("h/cuda-migrate-1.img", b"x");
    }));
    assert!(matches!(err, ArchiveError::ThroughLink { kind, .. } if kind == "a hard link"), "{err}");
    let err = refuse(&after_benign(|t| {
        t.link(EntryType::Symlink, "s", "checkpoint").link(EntryType::Link, "h", "s/cuda-migrate-1.img");
    }));
    assert!(matches!(err, ArchiveError::ThroughLink { ref path, .. } if path == "s/cuda-migrate-1.img"), "{err}");
    // A directory the symlink is put beside, not through, is fine.
    let mut t = Tar::new();
    t.dir("checkpoint").link(EntryType::Symlink, "x", "checkpoint").file("xy/cuda-migrate-1.img", b"x");
    t.file("checkpoint/cuda-migrate-1.img", &image_bytes(1));
    let dir = tempfile::tempdir().unwrap();
    read_archive(&write(dir.path(), "ok.tar", &t.finish()), &Limits::default()).unwrap();
}

/// A symlink whose target is a GNU long link name or a PAX linkpath.
fn link_refusal(err: &ArchiveError) -> (&str, &str, PathRule) {
    match err {
        ArchiveError::UnsafeLinkTarget { member, target, rule, .. } => (member, target, *rule),
        other => panic!("not an unsafe link target: {other}"),
    }
}

#[test]
fn link_targets_are_held_to_the_path_rules() {
    let err = refuse(&around(|t| {
        t.link(EntryType::Symlink, "checkpoint/link-to-shadow", "/etc/shadow");
    }));
    assert_eq!(link_refusal(&err), ("checkpoint/link-to-shadow", "/etc/shadow", PathRule::Absolute));
    assert!(err.to_string().contains("is a link to `/etc/shadow`, which is refused: it is an absolute path"), "{err}");
    let err = refuse(&around(|t| {
        t.link(EntryType::Link, "checkpoint/hard", "../../etc/passwd");
    }));
    assert_eq!(link_refusal(&err).2, PathRule::ParentDir);
    // Through a PAX linkpath (the header's is benign) and a GNU long link name.
    let err = refuse(&around(|t| {
        t.pax(&[("linkpath", b"../../../root/.ssh")]);
        t.link(EntryType::Symlink, "checkpoint/l", "benign");
    }));
    assert_eq!(link_refusal(&err).1, "../../../root/.ssh");
    let err = refuse(&around(|t| {
        let mut target = b"../".repeat(40);
        target.push(0);
        t.raw(b"././@LongLink", EntryType::GNULongLink, target.len() as u64, &target);
        t.link(EntryType::Symlink, "checkpoint/l", "benign");
    }));
    assert_eq!(link_refusal(&err).2, PathRule::ParentDir);
}

#[test]
fn headers_readers_pick_names_from_differently_are_refused() {
    // A global header that renames: GNU tar applies it to every later member, Go to none.
    let err = refuse(&after_benign(|t| {
        let mut g = tar::Header::new_ustar();
        let record = b"38 path=checkpoint/cuda-migrate-1.img\n";
        g.set_entry_type(EntryType::XGlobalHeader);
        g.set_size(record.len() as u64);
        g.set_path("pax_global_header").unwrap();
        g.set_cksum();
        t.raw_header(&g).bytes(record).bytes(&[0; 512 - 38]);
        t.file("checkpoint/core-9.img", b"EVIL");
    }));
    assert!(ambiguous(&err).contains("global header"), "{err}");
    // A GNU long name and a PAX path that differ: Python takes the later one, the others the GNU one.
    let err = refuse(&after_benign(|t| {
        t.pax(&[("path", b"checkpoint/cuda-migrate-1.img")]).long_name(b"checkpoint/core-9.img");
        t.raw(b"x", EntryType::Regular, 0, b"");
    }));
    assert!(ambiguous(&err).contains("GNU long name and a different PAX path"), "{err}");
    // Two PAX paths in one header: the `tar` crate takes the first, the others the last (this
    // reader too, before: it saw `core-9.img` where the `tar` crate sees the image).
    let err = refuse(&after_benign(|t| {
        t.pax(&[("path", b"checkpoint/cuda-migrate-1.img"), ("path", b"checkpoint/core-9.img")]);
        t.raw(b"x", EntryType::Regular, 0, b"");
    }));
    assert!(ambiguous(&err).contains("two PAX"), "{err}");
    // A GNU sparse map that says more maps follow after a short one: GNU tar reads no more.
    let err = refuse(&after_benign(|t| {
        t.raw_header(&gnu_sparse_header(2, 512, true)).bytes(&gnu_sparse_extension(&[], false)).bytes(&[0xaa; 512]);
    }));
    assert!(ambiguous(&err).contains("GNU sparse map"), "{err}");
}

// --- names exhaust nothing ---

#[test]
fn names_of_a_mebibyte_are_refused_at_once() {
    // Issue 29: 3,000 empty members named by ~1 MiB PAX paths (357 KB of zstd) held 3.08 GB for 18 s.
    // A name is shorter than PATH_MAX; the first such member ends the read.
    let mut t = Tar::new();
    t.dir("checkpoint");
    for i in 0..300 {
        let mut path = b"./".repeat((usize::try_from(MIB).unwrap() - 64) / 2);
        path.extend_from_slice(format!("checkpoint/cuda-migrate-{}.img", i + 2).as_bytes());
        t.pax(&[("path", &path)]);
        t.raw(b"x", EntryType::Regular, 0, b"");
    }
    let tar = t.finish();
    let bytes = compress(&tar, Compression::Zstd);
    assert!(bytes.len() < tar.len() / 100, "{}", bytes.len());
    let (err, took) = timed(|| refuse(&bytes));
    assert!(took < Duration::from_secs(1), "{took:?}");
    let (member, rule) = unsafe_path(&err);
    assert!(matches!(rule, PathRule::TooLong { len } if len > 1 << 19), "{rule:?}");
    assert!(member.len() < 300 && member.ends_with("..."), "the name is cut in messages: {member}");
    assert!(err.to_string().contains("shorter than PATH_MAX (4096 bytes)"), "{err}");
    // GNU long names are refused from their header.
    let mut t = Tar::new();
    t.dir("checkpoint").raw_header(&raw_header(b"././@LongLink", EntryType::GNULongName, 4097));
    assert!(refuse(&t.unfinished()).to_string().contains("at most 4096 bytes are read"));
}

#[test]
fn names_count_toward_the_kept_bytes() {
    // Names just under PATH_MAX on empty images: the names alone pass the kept limit.
    let mut t = Tar::new();
    t.dir("checkpoint");
    for i in 0..400 {
        let mut path = b"./".repeat(2000);
        path.extend_from_slice(format!("checkpoint/cuda-migrate-{}.img", i + 2).as_bytes());
        t.pax(&[("path", &path)]);
        t.raw(b"x", EntryType::Regular, 0, b"");
    }
    let dir = tempfile::tempdir().unwrap();
    let limits = Limits { max_kept_bytes: MIB, ..Limits::default() };
    let err = refuse_with(dir.path(), &t.finish(), &limits);
    assert!(matches!(err, ArchiveError::KeptLimit { max, .. } if max == MIB), "{err}");
}

#[test]
fn identity_images_are_counted() {
    let mut t = Tar::new();
    t.dir("checkpoint");
    for i in 0..=ccm_archive::MAX_IMAGES {
        t.raw(format!("checkpoint/cuda-migrate-{}.img", i + 1).as_bytes(), EntryType::Regular, 0, b"");
    }
    let err = refuse(&t.finish());
    assert!(matches!(err, ArchiveError::TooManyImages { max: 4096, .. }), "{err}");
    assert!(err.to_string().contains("one per CUDA process"), "{err}");
}

// --- what containerd's unpack reads otherwise (issue 35) ---

/// An OCI whiteout anywhere in a checkpoint archive: containerd's CRI restore applies the archive (and an image's
/// layer) with `archive.Apply`, which deletes the file `.wh.NAME` names instead of writing the member.
#[test]
fn whiteouts_are_refused() {
    for (name, dir) in [
        ("checkpoint/.wh.cuda-migrate-1.img", false),
        ("./checkpoint/.wh..wh..opq", false),
        (".wh.checkpoint", true),
        ("checkpoint/.wh.x/pages-1.img", false),
    ] {
        let err = refuse(&around(|t| {
            if dir {
                t.dir(name);
            } else {
                t.file(name, b"");
            }
        }));
        match &err {
            ArchiveError::Whiteout { member, .. } => {
                assert_eq!(normalized(member.as_bytes()), normalized(name.as_bytes()), "{member}")
            }
            other => panic!("{name}: {other}"),
        }
        assert!(
            err.to_string().contains("containerd's unpack does not write it but deletes the file it names"),
            "{err}"
        );
    }
    // `.wh` inside a name is only a name.
    let dir = tempfile::tempdir().unwrap();
    let ok = around(|t| {
        t.file("checkpoint/x.wh.y", b"").file("checkpoint/wh.z", b"");
    });
    read_archive(&write(dir.path(), "ok.tar", &ok), &Limits::default()).unwrap();
}

/// A lone zero block followed by more members: GNU tar ("A lone zero block") and Python stop there, `tar
/// --ignore-zeros` reads on and finds the member after it, Go's archive/tar (containerd, Podman) refuses the
/// archive (`archive/tar: invalid tar header`). Refused; two zero blocks end the archive as before, and one
/// zero block at the end of the file is the end too (Go accepts it).
#[test]
fn a_lone_zero_block_followed_by_members_is_refused() {
    let mut t = Tar::new();
    t.dir("checkpoint").file("checkpoint/inventory.img", b"inv");
    let head = t.unfinished();
    let mut hidden = Tar::new();
    hidden.file("checkpoint/cuda-migrate-1.img", &image_bytes(1));
    let hidden = hidden.finish();
    let mut lone = head.clone();
    lone.extend([0; 512]);
    lone.extend(&hidden);
    for c in [Compression::None, Compression::Gzip] {
        match refuse(&compress(&lone, c)) {
            ArchiveError::Ambiguous { offset, reason, .. } => {
                assert_eq!(offset, head.len() as u64 + 512, "{c}");
                assert!(reason.contains("lone zero block"), "{reason}");
            }
            other => panic!("{c}: {other}"),
        }
    }
    // Half a block after the zero block: Go's reader fails there too (unexpected EOF).
    let mut half = head.clone();
    half.extend([0; 512 + 256]);
    assert!(matches!(refuse(&half), ArchiveError::Truncated { what: Truncation::InHeader { .. }, .. }));

    let dir = tempfile::tempdir().unwrap();
    let mut one = head.clone();
    one.extend([0; 512]);
    let mut two_then_more = head.clone();
    two_then_more.extend([0; 1024]);
    two_then_more.extend(&hidden);
    for (what, bytes) in [("one zero block at the end", one), ("two zero blocks, then a member", two_then_more)] {
        let a = read_archive(&write(dir.path(), "end.tar", &bytes), &Limits::default())
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(a.images.is_empty() && a.has_inventory, "{what}");
        assert_eq!(a.bytes_scanned, head.len() as u64 + 512, "{what}");
    }

    // What the real readers make of the lone block.
    if !oracles_present() {
        return;
    }
    let path = write(dir.path(), "lone.tar", &lone);
    let listing = |args: &[&str]| {
        let out = std::process::Command::new(GNU_TAR).args(args).arg(&path).output().unwrap();
        (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (plain, warned) = listing(&["-tf"]);
    assert!(!plain.contains("cuda-migrate-1.img") && warned.contains("lone zero block"), "{plain} {warned}");
    let (ignoring, _) = listing(&["--ignore-zeros", "-tf"]);
    assert!(ignoring.contains("checkpoint/cuda-migrate-1.img"), "tar -i: {ignoring}");
    let python = python_names(&path).unwrap();
    assert!(!python.iter().any(|n| n.ends_with(b"cuda-migrate-1.img")), "Python stops at the zero block");
}

// --- a member that replaces an earlier one of another kind (issue 41 part 3) ---

fn replaces(err: &ArchiveError) -> (String, &'static str, String, &'static str) {
    match err {
        ArchiveError::Replaces { member, kind, earlier, earlier_kind, .. } => {
            (member.clone(), *kind, earlier.clone(), *earlier_kind)
        }
        other => panic!("not a replacement: {other}"),
    }
}

/// The red team's archive: a benign `checkpoint/` (its images pass), then a `checkpoint -> evil` link, which
/// containerd's and containers/storage's unpack put in the directory's place (CRIU then restores `evil/`).
#[test]
fn a_link_after_the_checkpoint_directory_is_refused() {
    let mut t = Tar::new();
    t.dir("checkpoint")
        .file("checkpoint/inventory.img", b"inv")
        .file("checkpoint/cuda-migrate-1.img", &image_bytes(1))
        .dir("evil")
        .file("evil/inventory.img", b"other");
    t.link(EntryType::Symlink, "checkpoint", "evil");
    let err = refuse(&t.finish());
    assert_eq!(replaces(&err), ("checkpoint".into(), "a link", "checkpoint".into(), "a directory"));
    let msg = err.to_string();
    assert!(msg.contains("containerd") && msg.contains("refused"), "{msg}");
}

/// At every depth, both ways, and for directories only implied by a file beneath them.
#[test]
fn every_change_of_kind_at_one_path_is_refused() {
    type Case = (Box<dyn Fn(&mut Tar)>, &'static str, &'static str);
    let cases: Vec<Case> = vec![
        // A directory implied by its file, then a link at its name.
        (
            Box::new(|t| {
                t.file("rootfs/etc/hosts", b"h");
                t.link(EntryType::Symlink, "rootfs/etc", "other");
            }),
            "a link",
            "a directory",
        ),
        // A file, then a directory at its name.
        (
            Box::new(|t| {
                t.file("config.dump", b"{}").dir("config.dump/");
            }),
            "a directory",
            "a file",
        ),
        // A hard link where a file was.
        (
            Box::new(|t| {
                t.file("stats-dump", b"s");
                t.link(EntryType::Link, "stats-dump", "checkpoint/inventory.img");
            }),
            "a link",
            "a file",
        ),
    ];
    for (middle, kind, earlier_kind) in cases {
        let err = refuse(&around(middle));
        let (_, k, _, e) = replaces(&err);
        assert_eq!((k, e), (kind, earlier_kind), "{err}");
    }
    // A file where a link was is refused already as written through the link.
    let err = refuse(&around(|t| {
        t.link(EntryType::Symlink, "deep/a/b", "x");
        t.file("deep/a/b", b"y");
    }));
    assert!(matches!(err, ArchiveError::ThroughLink { .. }), "{err}");
}

/// The same kind twice at one path (a directory listed again, as some writers do) is no replacement.
#[test]
fn a_directory_listed_twice_is_no_replacement() {
    let mut t = Tar::new();
    t.dir("checkpoint").file("checkpoint/inventory.img", b"inv").dir("checkpoint").dir("rootfs").dir("rootfs");
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "twice.tar", &t.finish());
    read_archive(&path, &Limits::default()).unwrap();
}
