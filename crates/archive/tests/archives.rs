//! Well-formed checkpoint archives: Podman's and the kubelet's layouts, every compression, the tar
//! dialects real writers use. Each must read back exactly.

// Test code: a failed unwrap or expect names its line (the workspace lints keep them out of product code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;

use ccm_archive::{read_archive, read_archive_from, ArchiveFile, CheckpointArchive, Compression, Limits};
use common::*;
use tar::{EntryType, Header};

/// Reads an archive that must be accepted, and checks that GNU tar and Python's `tarfile` name its
/// members as this reader does (the differential of issue 29: what `inspect` reads must be what an
/// extractor unpacks).
fn read(path: &Path) -> CheckpointArchive {
    let archive = read_archive(path, &Limits::default()).unwrap_or_else(|e| panic!("{e}"));
    assert_readers_agree(path);
    archive
}

fn check_podman(compression: Compression) {
    let dir = tempfile::tempdir().unwrap();
    let tar = podman_like();
    let path = write(dir.path(), "export.tar", &compress(&tar, compression));

    let (archive, took) = timed(|| read(&path));

    assert_eq!(archive.path, path);
    assert_eq!(archive.compression, compression);
    assert_eq!(
        archive.images,
        [ArchiveFile {
            member: "checkpoint/cuda-migrate-5.img".into(),
            name: "cuda-migrate-5.img".into(),
            bytes: image_bytes(5),
        }]
    );
    assert_eq!(archive.images[0].pid(), Some(5));
    assert!(archive.reports.is_empty());
    let spec = archive.spec.as_ref().expect("spec.dump");
    assert_eq!((spec.member.as_str(), spec.name.as_str(), &spec.bytes[..]), ("spec.dump", "spec.dump", SPEC));
    assert!(archive.has_inventory);
    assert_eq!(archive.members, PODMAN_MEMBERS);
    // Everything up to and including the first end-of-archive block; the builder writes two.
    assert_eq!(archive.bytes_scanned, tar.len() as u64 - 512);
    assert!(archive.bytes_scanned > 20 * MIB);
    assert!(took < QUICK, "{compression}: {took:?}");
}

#[test]
fn podman_export_plain_reads_back_exactly() {
    check_podman(Compression::None);
}

#[test]
fn podman_export_gzip_reads_back_exactly() {
    check_podman(Compression::Gzip);
}

#[test]
fn podman_export_zstd_reads_back_exactly() {
    check_podman(Compression::Zstd);
}

#[test]
fn kubelet_archive_with_dot_slash_names() {
    // The builder strips `./`; containerd's writer may keep it, so these headers are set by hand.
    let mut t = Tar::new();
    let reg = EntryType::Regular;
    let mut raw = |name: &str, kind: EntryType, data: &[u8]| {
        t.raw(name.as_bytes(), kind, data.len() as u64, data);
    };
    raw("./", EntryType::Directory, b"");
    raw("./checkpoint/", EntryType::Directory, b"");
    raw("./checkpoint/inventory.img", reg, b"inv");
    raw("./checkpoint/cuda-migrate-12.img", reg, &image_bytes(12));
    raw("./checkpoint/pages-1.img", reg, &vec![0; 3 * usize::try_from(MIB).unwrap()]);
    raw("./checkpoint/cuda-migrate-3.img", reg, &image_bytes(3));
    raw("./checkpoint/cuda-migrate-restore-3.txt", reg, b"restored pid 3 onto GPU-1\n");
    // Not images: a leading zero, a subdirectory, the wrong directory.
    raw("./checkpoint/cuda-migrate-007.img", reg, b"x");
    raw("./checkpoint/parent/cuda-migrate-8.img", reg, b"x");
    raw("./cuda-migrate-9.img", reg, b"x");
    raw("./config.dump", reg, b"{}");
    raw("./spec.dump", reg, SPEC);
    raw("./status", reg, b"{}");
    raw("./container.log", reg, b"log");
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "checkpoint-pod_default-ctr-2025-01-01T00:00:00Z.tar", &t.finish());

    let archive = read(&path);

    assert_eq!(archive.compression, Compression::None);
    let images: Vec<_> = archive.images.iter().map(|f| (f.member.as_str(), f.pid(), f.bytes.clone())).collect();
    assert_eq!(
        images,
        [
            ("./checkpoint/cuda-migrate-3.img", Some(3), image_bytes(3)),
            ("./checkpoint/cuda-migrate-12.img", Some(12), image_bytes(12)),
        ],
        "every image, ordered by pid"
    );
    assert_eq!(archive.reports.len(), 1);
    assert_eq!(archive.reports[0].name, "cuda-migrate-restore-3.txt");
    assert_eq!(archive.reports[0].pid(), Some(3));
    assert_eq!(archive.reports[0].bytes, b"restored pid 3 onto GPU-1\n");
    assert_eq!(archive.spec.as_ref().unwrap().member, "./spec.dump");
    assert!(archive.has_inventory);
    assert_eq!(archive.members, 14);
}

#[test]
fn checkpoint_without_images_or_inventory_is_read_and_says_so() {
    let mut t = Tar::new();
    t.dir("checkpoint").file("checkpoint/core-1.img", b"core").file("config.dump", b"{}");
    let dir = tempfile::tempdir().unwrap();
    let archive = read(&write(dir.path(), "a.tar", &t.finish()));
    assert!(archive.images.is_empty() && archive.reports.is_empty() && archive.spec.is_none());
    assert!(!archive.has_inventory);
    assert_eq!(archive.members, 3);
}

#[test]
fn checkpoint_directory_entry_alone_is_enough() {
    // Members below checkpoint/ without a directory entry of their own count as well.
    let mut t = Tar::new();
    t.file("checkpoint/inventory.img", b"inv");
    let dir = tempfile::tempdir().unwrap();
    assert!(read(&write(dir.path(), "a.tar", &t.finish())).has_inventory);
}

#[test]
fn gnu_long_names_and_pax_records_are_followed() {
    let mut t = Tar::new();
    t.dir("checkpoint");
    // A GNU long name (GNU tar's way past 100 bytes), the header's own name cut short.
    let long = format!("./checkpoint/{}cuda-migrate-9.img", "./".repeat(60));
    let data9 = image_bytes(9);
    t.long_name(long.as_bytes()).raw(&long.as_bytes()[..100], EntryType::Regular, data9.len() as u64, &data9);
    // A PAX path and size override a header that says neither (Go writes size 0 in the header and
    // the real size in a PAX record for members of 8 GiB and more).
    let data = image_bytes(10);
    let size = data.len().to_string();
    t.pax(&[("path", b"checkpoint/cuda-migrate-10.img"), ("size", size.as_bytes()), ("mtime", b"1.5")]);
    t.raw(b"placeholder", EntryType::Regular, 0, &data);
    // A member after them proves the walk stayed on the block grid.
    t.file("spec.dump", SPEC);
    let dir = tempfile::tempdir().unwrap();

    let archive = read(&write(dir.path(), "a.tar", &t.finish()));

    assert_eq!(archive.images.len(), 2);
    assert_eq!((archive.images[0].pid(), &archive.images[0].member), (Some(9), &long));
    assert_eq!(archive.images[0].bytes, image_bytes(9));
    assert_eq!(archive.images[1].member, "checkpoint/cuda-migrate-10.img");
    assert_eq!(archive.images[1].bytes, data);
    assert_eq!(archive.spec.unwrap().bytes, SPEC);
    assert_eq!(archive.members, 4, "extension headers are not members");
}

#[test]
fn pax_global_header_is_skipped() {
    // `git archive` and some Go writers start with one.
    let mut t = Tar::new();
    let mut g = Header::new_ustar();
    let record = b"52 comment=2a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d\n";
    g.set_entry_type(EntryType::XGlobalHeader);
    g.set_size(record.len() as u64);
    g.set_path("pax_global_header").unwrap();
    g.set_cksum();
    t.raw_header(&g).bytes(record).bytes(&[0; 512 - 52]);
    t.file("checkpoint/cuda-migrate-1.img", &image_bytes(1));
    let dir = tempfile::tempdir().unwrap();
    let archive = read(&write(dir.path(), "a.tar", &t.finish()));
    assert_eq!(archive.images[0].bytes, image_bytes(1));
    assert_eq!(archive.members, 2);
}

#[test]
fn gnu_sparse_member_is_stepped_over_with_its_maps() {
    // What `tar --sparse --format=gnu` writes for a file of five data chunks: four in the header's
    // map, the fifth in one extension block, 5 x 256 bytes of data.
    let mut t = Tar::new();
    t.dir("checkpoint");
    t.raw_header(&gnu_sparse_header(5, 5 * 256, true)).bytes(&gnu_sparse_extension(&[4], false));
    t.bytes(&[0xaa; 1280]).bytes(&[0; 256]);
    t.file("checkpoint/cuda-migrate-2.img", &image_bytes(2));
    let dir = tempfile::tempdir().unwrap();
    let archive = read(&write(dir.path(), "a.tar", &t.finish()));
    assert_eq!(archive.images[0].bytes, image_bytes(2));
}

#[test]
fn links_and_devices_under_other_names_are_skipped() {
    // This reader creates and follows nothing, so links elsewhere, whose targets stay inside the
    // archive, are harmless to it; restoring them is CRIU's and the engine's business.
    let mut t = Tar::new();
    t.dir("checkpoint")
        .link(EntryType::Symlink, "checkpoint/link-to-core", "core-1.img")
        .link(EntryType::Link, "checkpoint/hard", "checkpoint/core-1.img")
        .special(EntryType::Fifo, "checkpoint/fifo")
        .special(EntryType::Char, "dev-null")
        .file("checkpoint/cuda-migrate-4.img", &image_bytes(4));
    let dir = tempfile::tempdir().unwrap();
    let archive = read(&write(dir.path(), "a.tar", &t.finish()));
    assert_eq!(archive.images[0].bytes, image_bytes(4));
}

#[test]
fn concatenated_gzip_members_are_one_stream() {
    // pigz and parallel writers produce several gzip members; the tar runs across them.
    let tar = podman_like();
    let (a, b) = tar.split_at(12345);
    let mut gz = gzip(a);
    gz.extend(gzip(b));
    let dir = tempfile::tempdir().unwrap();
    let archive = read(&write(dir.path(), "a.tar.gz", &gz));
    assert_eq!(archive.compression, Compression::Gzip);
    assert_eq!(archive.images[0].bytes, image_bytes(5));
    assert_eq!(archive.bytes_scanned, tar.len() as u64 - 512);
}

#[test]
fn zstd_frames_and_a_leading_skippable_frame_are_one_stream() {
    let tar = podman_like();
    let (a, b) = tar.split_at(54321);
    // A skippable frame (as pzstd writes first), then two frames.
    let mut zst = vec![0x50, 0x2a, 0x4d, 0x18, 4, 0, 0, 0, 1, 2, 3, 4];
    zst.extend(compress(a, Compression::Zstd));
    zst.extend(compress(b, Compression::Zstd));
    let dir = tempfile::tempdir().unwrap();
    let archive = read(&write(dir.path(), "a.tar.zst", &zst));
    assert_eq!(archive.compression, Compression::Zstd);
    assert_eq!(archive.images[0].bytes, image_bytes(5));
}

#[test]
fn reading_from_a_reader_gives_the_same_answer() {
    let dir = tempfile::tempdir().unwrap();
    for compression in [Compression::None, Compression::Gzip, Compression::Zstd] {
        let bytes = compress(&podman_like(), compression);
        let path = write(dir.path(), "a.tar", &bytes);
        let from_file = read(&path);
        let from_reader = read_archive_from(&bytes[..], &path, &Limits::default()).unwrap();
        assert_eq!(from_reader, from_file, "{compression}");
    }
}

#[test]
fn a_symlink_to_the_archive_is_followed() {
    // The user named the path; a link in it is theirs to make.
    let dir = tempfile::tempdir().unwrap();
    let target = write(dir.path(), "real.tar", &podman_like());
    let link = dir.path().join("link.tar");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let archive = read(&link);
    assert_eq!(archive.path, link);
    assert_eq!(archive.images.len(), 1);
}

#[test]
fn trailing_data_after_the_end_block_is_not_read() {
    // GNU tar pads to 10 KiB records; whatever follows the end block is not part of the archive.
    let mut tar = podman_like();
    let len = tar.len() as u64;
    tar.extend([0xee; 4096]);
    let dir = tempfile::tempdir().unwrap();
    let archive = read(&write(dir.path(), "a.tar", &tar));
    assert_eq!(archive.bytes_scanned, len - 512);
}
