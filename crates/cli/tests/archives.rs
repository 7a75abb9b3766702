//! `inspect ARCHIVE` and `preflight ARCHIVE`: checkpoint archives read in place (Podman's export,
//! the kubelet's checkpoint tar; plain, gzip, zstd), and hostile ones refused with the documented
//! exit code, a message naming the member and the rule, bounded memory and no panic. The reader's
//! own rules are tested in `ccm-archive`; these tests are the command's side of them.

// Test code: a failed unwrap or expect names its line (the workspace lints keep them out of product code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use ccm_identity::image::{IdentityImage, ProcessEnv};
use tar::EntryType;

#[path = "../../archive/tests/common/mod.rs"]
mod common;
use common::{compress, raw_header, Tar, MIB};

fn cli() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_criu-cuda-migrate"))
}

/// Runs the CLI with a deadline: a read that never ends fails the test instead of hanging it.
fn run(args: &[&str], limit: Duration) -> Output {
    let mut child = Command::new(cli())
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .env_remove("CRIU_CUDA_MIGRATE_USABLE_GPUS")
        .env_remove("CRIU_CUDA_MIGRATE_DEVICE_MAP")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run the CLI");
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > limit {
            let _ = child.kill();
            panic!("the CLI did not end within {limit:?} on {args:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn assert_clean_failure(out: &Output, code: i32, needles: &[&str]) {
    let all = text(out);
    assert_eq!(out.status.code(), Some(code), "exit code: {all}");
    assert!(!all.contains("panicked"), "the CLI panicked: {all}");
    for n in needles {
        assert!(all.contains(n), "expected {n:?} in: {all}");
    }
}

/// An identity image of pid `pid` on a one-GPU dump node (what the dump writes, minus the sites).
fn image(pid: u32) -> Vec<u8> {
    image_holding(pid, None)
}

/// The same, with the device memory the dump recorded on its GPU.
fn image_holding(pid: u32, device_memory: Option<u64>) -> Vec<u8> {
    image_with(pid, device_memory, None)
}

/// A staging table (issue 47) of one region of three 64 KiB chunks, the middle one all zero: a page file of 128 KiB.
fn staging_table() -> ccm_identity::staging::StagingTable {
    use ccm_identity::staging::{StagedChunk, StagingRegion, StagingTable, MIN_CHUNK_BYTES};
    StagingTable {
        chunk_bytes: MIN_CHUNK_BYTES,
        file_bytes: 2 * MIN_CHUNK_BYTES,
        regions: vec![StagingRegion {
            start: 0x7f00_0000_0000,
            len: 3 * MIN_CHUNK_BYTES,
            chunks: vec![
                StagedChunk::Data { offset: 0, crc: 1 },
                StagedChunk::Hole,
                StagedChunk::Data { offset: MIN_CHUNK_BYTES, crc: 2 },
            ],
        }],
    }
}

/// [`image_holding`] with the staging table the dump recorded, if any.
fn image_with(pid: u32, device_memory: Option<u64>, staging: Option<ccm_identity::staging::StagingTable>) -> Vec<u8> {
    let gpu = ccm_identity::GpuIdentity {
        uuid: "GPU-6ebf35c8-1111-2222-3333-444455556666".parse().unwrap(),
        pci: ccm_identity::PciAddress::parse("0000:00:06.0").unwrap(),
        pci_device_id: 0x233510de,
        pci_subsystem_id: 0x18081414,
        name: "NVIDIA H200".into(),
        minor: 0,
        memory_total: 140 << 30,
    };
    let uuid = gpu.uuid;
    IdentityImage {
        staging,
        driver_storage: None,
        pid,
        host_pid: 4000 + pid,
        dumped_at_unix: 1_790_000_000,
        hostname: "dump-node".into(),
        driver_version: "580.159.04".into(),
        cuda_driver_version: 13000,
        enumerated: vec![gpu.uuid],
        used: vec![gpu.uuid],
        node_gpus: vec![gpu],
        env: ProcessEnv { nvidia_visible_devices: Some("all".into()), ..ProcessEnv::default() },
        sites: Vec::new(),
        prop_sites: Vec::new(),
        device_memory: device_memory.map(|bytes| vec![ccm_identity::image::DeviceMemoryUse { gpu: uuid, bytes }]),
    }
    .try_encode()
    .expect("a clean image encodes")
}

/// A Podman-style export: CRIU's images (ours among them) under `checkpoint/`, the engine's files beside.
fn export(prefix: &str, with_inventory: bool) -> Vec<u8> {
    let mut t = Tar::new();
    t.dir(&format!("{prefix}checkpoint"));
    if with_inventory {
        t.file(&format!("{prefix}checkpoint/inventory.img"), b"\x54\xc6\x60\x58inventory");
    }
    t.file(&format!("{prefix}checkpoint/core-7.img"), &[7; 1500])
        .zeros(&format!("{prefix}checkpoint/pages-1.img"), 4 * MIB)
        .file(&format!("{prefix}checkpoint/cuda-migrate-7.img"), &image(7))
        .file(&format!("{prefix}checkpoint/cuda-migrate-restore-7.txt"), b"restored pid 7\nresult: ok\n")
        .file(&format!("{prefix}config.dump"), br#"{"id":"3f2a"}"#)
        .file(
            &format!("{prefix}spec.dump"),
            br#"{"ociVersion":"1.0.2","process":{"env":["NVIDIA_VISIBLE_DEVICES=0"]}}"#,
        );
    t.finish()
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> String {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p.to_str().unwrap().to_string()
}

const QUICK: Duration = Duration::from_secs(20);

#[test]
fn inspect_reads_podman_and_kubelet_archives_in_every_compression() {
    let dir = tempfile::tempdir().unwrap();
    for (form, prefix) in [("podman", ""), ("kubelet", "./")] {
        for c in [ccm_archive::Compression::None, ccm_archive::Compression::Gzip, ccm_archive::Compression::Zstd] {
            // The compression is told by the bytes: the name says nothing.
            let path = write(dir.path(), &format!("{form}-{c}.archive"), &compress(&export(prefix, true), c));
            let out = run(&["inspect", &path], QUICK);
            let all = text(&out);
            assert_eq!(out.status.code(), Some(0), "{form} {c}: {all}");
            assert!(all.contains(&format!("checkpoint archive ({c} compression")), "{form} {c}: {all}");
            assert!(all.contains("pid 7 (host pid 4007), dumped on dump-node"), "{all}");
            assert!(all.contains("cuda-migrate-restore-7.txt:\nrestored pid 7"), "{all}");
            assert!(
                all.contains("the dumped container's GPUs: GPU-6ebf35c8-1111-2222-3333-444455556666 (process.env NVIDIA_VISIBLE_DEVICES=0)"),
                "{all}"
            );
            let out = run(&["--json", "inspect", &path], QUICK);
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
            assert_eq!(v["archive"]["compression"], c.to_string());
            assert_eq!(v["archive"]["has_inventory"], true);
            assert_eq!(v["processes"][0]["pid"], 7);
        }
    }
}

#[test]
fn preflight_refuses_an_archive_without_inventory_as_an_unusable_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "cut.tar", &export("", false));
    let out = run(&["preflight", &path], QUICK);
    assert_clean_failure(&out, 2, &["no checkpoint/inventory.img", "export the checkpoint again"]);
    // inspect still shows what is there, and says so.
    let out = run(&["inspect", &path], QUICK);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("NO checkpoint/inventory.img"));
}

/// An archive with neither CRIU's inventory nor an identity image (a dump cut before either) is no
/// checkpoint: `inspect` refuses it as `preflight` does (and as both do a directory of the same
/// content); with an identity image `inspect` still shows it (the test above).
#[test]
fn an_archive_that_is_no_checkpoint_is_refused_by_inspect_too() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = Tar::new();
    t.dir("checkpoint").file("checkpoint/core-7.img", &[7; 100]).file("config.dump", br#"{"id":"3f2a"}"#);
    let path = write(dir.path(), "plain.tar", &t.finish());
    for cmd in ["inspect", "preflight"] {
        let out = run(&[cmd, &path], QUICK);
        assert_clean_failure(&out, 2, &["has no checkpoint/inventory.img", "export the checkpoint again"]);
    }
}

#[test]
fn hostile_archives_are_refused_naming_the_member_and_the_rule() {
    let dir = tempfile::tempdir().unwrap();
    let inventory = |t: &mut Tar| {
        t.dir("checkpoint").file("checkpoint/inventory.img", b"inv");
    };
    let cases: Vec<(&str, Vec<u8>, &[&str])> = vec![
        (
            "a .. member",
            {
                let mut t = Tar::new();
                inventory(&mut t);
                t.raw(b"checkpoint/../../etc/cron.d/x", EntryType::Regular, 3, b"x\n\n");
                t.finish()
            },
            &["../../etc/cron.d/x"],
        ),
        (
            "a symbolic link named like an identity image",
            {
                let mut t = Tar::new();
                inventory(&mut t);
                t.link(EntryType::Symlink, "checkpoint/cuda-migrate-7.img", "/etc/shadow");
                t.finish()
            },
            &["checkpoint/cuda-migrate-7.img"],
        ),
        (
            "a member larger than its data",
            {
                let mut t = Tar::new();
                inventory(&mut t);
                t.raw(b"checkpoint/pages-1.img", EntryType::Regular, 1 << 30, &[0; 4096]);
                t.unfinished()
            },
            &["checkpoint/pages-1.img"],
        ),
        (
            "an identity image of 17 MiB",
            {
                let mut t = Tar::new();
                inventory(&mut t);
                t.zeros("checkpoint/cuda-migrate-7.img", 17 * MIB);
                t.finish()
            },
            &["checkpoint/cuda-migrate-7.img"],
        ),
        (
            "an image whose name says another pid",
            {
                let mut t = Tar::new();
                inventory(&mut t);
                t.file("checkpoint/cuda-migrate-8.img", &image(7));
                t.finish()
            },
            &["holds pid 7, but its name says pid 8"],
        ),
        (
            "a control character in a member name",
            {
                let mut t = Tar::new();
                inventory(&mut t);
                t.raw(b"checkpoint/../\x1b[2Jx", EntryType::Regular, 0, b"");
                t.finish()
            },
            &["\\u{1b}"],
        ),
    ];
    for (what, bytes, needles) in cases {
        let path = write(dir.path(), "hostile.tar", &bytes);
        for cmd in ["inspect", "preflight"] {
            let out = run(&[cmd, &path], QUICK);
            assert_clean_failure(&out, 2, needles);
            assert!(!out.stdout.contains(&0x1b) && !out.stderr.contains(&0x1b), "{what}: a raw ESC was printed");
        }
    }
}

/// The largest resident size (KiB) of any child this test binary has waited for.
fn children_max_rss_kib() -> i64 {
    // SAFETY: getrusage writes the zeroed struct of this frame and nothing else.
    unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut u);
        u.ru_maxrss
    }
}

#[test]
fn a_zstd_bomb_ends_at_the_scan_limit_in_bounded_memory() {
    // 8 GiB of zeros in one member, a few hundred KiB compressed: one MiB of zeros compressed once and
    // repeated (zstd frames concatenate).
    let header = raw_header(b"checkpoint/pages-1.img", EntryType::Regular, 8 << 30);
    let mut bomb = zstd::stream::encode_all(&header.as_bytes()[..], 1).unwrap();
    let mib = zstd::stream::encode_all(std::io::repeat(0).take(MIB), 3).unwrap();
    for _ in 0..(8 << 10) {
        bomb.extend_from_slice(&mib);
    }
    assert!(bomb.len() < 2 * usize::try_from(MIB).unwrap(), "{}", bomb.len());
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "bomb.tar.zst", &bomb);
    let out = run(&["preflight", "--archive-scan-gib", "1", &path], Duration::from_secs(120));
    assert_clean_failure(&out, 2, &["scan limit of 1073741824 bytes (1.0 GiB)", "--archive-scan-gib N raises it"]);
    let rss = children_max_rss_kib();
    assert!(rss < 256 << 10, "a CLI run grew to {rss} KiB: the read was not bounded");
}

#[test]
fn a_fifo_or_a_device_as_the_checkpoint_is_refused_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("ckpt.tar");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    for path in [fifo.to_str().unwrap(), "/dev/zero"] {
        for cmd in ["inspect", "preflight"] {
            let out = run(&[cmd, path], QUICK);
            assert_clean_failure(&out, 2, &["not a regular file: a checkpoint archive must be a regular file"]);
        }
    }
}

/// The kubelet's archive of a CUDA container with 2 GiB on its GPU, as `buildah add` puts it into a checkpoint image.
fn kubelet_layer() -> Vec<u8> {
    let mut t = Tar::new();
    t.dir("checkpoint")
        .file("checkpoint/inventory.img", b"\x54\xc6\x60\x58inventory")
        .file("checkpoint/cuda-migrate-7.img", &image_holding(7, Some(2 << 30)))
        .file("dump.log", b"(00.000000) Version: 4.2 (gitid 0)\n")
        .file("config.dump", br#"{"id":"3f2a"}"#)
        .file("spec.dump", br#"{"ociVersion":"1.0.2","process":{"env":["NVIDIA_VISIBLE_DEVICES=0"]}}"#);
    t.finish()
}

#[test]
fn inspect_and_preflight_read_a_checkpoint_image_and_say_what_it_needs() {
    let dir = tempfile::tempdir().unwrap();
    let (image, parts) = common::oci::Image::of(&kubelet_layer(), ccm_archive::Compression::Gzip);
    let layout = dir.path().join("layout");
    image.write_layout(&layout);
    let layout = layout.to_str().unwrap().to_string();
    let archive = write(dir.path(), "image.tar", &image.archive());

    let out = run(&["inspect", &layout], QUICK);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    for needle in [
        "checkpoint image (OCI image layout, tagged ckpt)",
        "every digest verified",
        "containerd 2.x restores from it (annotation org.criu.checkpoint.container.name)",
        "CRI-O restores from it (annotation io.kubernetes.cri-o.annotations.checkpoint.name)",
        "(its layer): checkpoint archive (gzip compression",
        "dumped by CRIU 4.2 (dump.log)",
        "pid 7 (host pid 4007), dumped on dump-node",
    ] {
        assert!(all.contains(needle), "{needle:?} in {all}");
    }

    for path in [&layout, &archive] {
        let out = run(&["--json", "inspect", path], QUICK);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
        assert_eq!(v["image"]["manifest_digest"], common::oci::digest(&parts.manifest));
        assert_eq!(v["image"]["checkpoint_name_containerd"], "counter");
        assert_eq!(v["image"]["digests_verified"], true);
        assert_eq!(v["archive"]["compression"], "gzip");
        let needs = &v["needs"];
        assert_eq!(needs["gpu_count"], 1, "{needs}");
        assert_eq!(needs["models"], serde_json::json!(["NVIDIA H200"]));
        assert_eq!(needs["memory_per_gpu_bytes"], 2u64 << 30);
        assert_eq!(needs["gpus"][0]["device_memory_bytes"], 2u64 << 30);
        assert_eq!(needs["driver"]["version_at_dump"], "580.159.04");
        assert_eq!(needs["driver"]["branch"], "580");
        assert_eq!(needs["criu"]["version_at_dump"], "4.2");
        assert_eq!(needs["criu"]["criu_version_matters"], false);
        assert!(needs["criu"]["reason"].as_str().unwrap().contains("4.0 or later"));
    }
    let formats: Vec<_> = [&layout, &archive]
        .iter()
        .map(|p| {
            serde_json::from_slice::<serde_json::Value>(&run(&["--json", "inspect", p], QUICK).stdout).unwrap()["image"]
                ["format"]
                .clone()
        })
        .collect();
    assert_eq!(formats, [serde_json::json!("OCI image layout"), serde_json::json!("oci-archive")]);

    // preflight: on a node without NVIDIA's driver (CI) it refuses, and still says what the checkpoint needs.
    for path in [&layout, &archive] {
        let out = run(&["--json", "preflight", path], QUICK);
        assert!(matches!(out.status.code(), Some(0 | 1)), "{}", text(&out));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
        assert_eq!(v["needs"]["gpu_count"], 1, "{v}");
        assert_eq!(v["needs"]["memory_per_gpu_bytes"], 2u64 << 30, "{v}");
    }
}

#[test]
fn a_damaged_or_hostile_checkpoint_image_is_refused_naming_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let (mut image, parts) = common::oci::Image::of(&kubelet_layer(), ccm_archive::Compression::None);
    let mut altered = parts.layer.clone();
    altered[700] ^= 1;
    image.replace_blob(&parts.layer, &altered);
    let layout = dir.path().join("damaged");
    image.write_layout(&layout);
    for cmd in ["inspect", "preflight"] {
        let out = run(&[cmd, layout.to_str().unwrap()], QUICK);
        assert_clean_failure(&out, 2, &["checkpoint image", "SHA-256", "copy it again"]);
        let out = run(&["--json", cmd, layout.to_str().unwrap()], QUICK);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
        assert_eq!(v["exit_code"], 2);
    }
    // A layer holding a member that climbs out: the archive rule, naming the layer.
    let mut t = Tar::new();
    t.dir("checkpoint").raw(b"../../etc/cron.d/x", EntryType::Regular, 1, b"x");
    let (image, _) = common::oci::Image::of(&t.finish(), ccm_archive::Compression::Zstd);
    let path = write(dir.path(), "hostile-image.tar", &image.archive());
    let out = run(&["inspect", &path], QUICK);
    assert_clean_failure(&out, 2, &["blobs/sha256/", "../../etc/cron.d/x", "`..` component"]);
}

/// Every checkpoint image containerd 2.1 would refuse or read otherwise (issue 35): `inspect` and `preflight`
/// (text and `--json`) exit 2 with one line that says what is wrong and what to do.
#[test]
fn an_image_containerd_reads_otherwise_is_refused_by_inspect_and_preflight_naming_the_fix() {
    use common::oci::{config_of, descriptor, digest, layer_type, Parts, INDEX, MANIFEST};
    use std::fmt::Write as _;
    let dir = tempfile::tempdir().unwrap();
    let plain = kubelet_layer();
    let none = ccm_archive::Compression::None;
    let gz = ccm_archive::Compression::Gzip;
    let image_of = |layer: Vec<u8>, c, config: Vec<u8>| Parts::of(compress(&layer, c), layer_type(c), config).image();
    let good = |layer: &[u8], c| image_of(layer.to_vec(), c, config_of(&[&digest(layer)]));
    let mut other = Tar::new();
    other.dir("checkpoint").file("checkpoint/inventory.img", b"another checkpoint");
    let (_, parts) = common::oci::Image::of(&plain, none);
    let layer_desc = descriptor(layer_type(none), &parts.layer);
    let config_desc = descriptor(common::oci::CONFIG, &parts.config);

    let mut cases: Vec<(&str, common::oci::Image, Vec<&str>)> = vec![
        (
            "diff_ids naming another layer",
            image_of(plain.clone(), none, config_of(&[&digest(&other.finish())])),
            vec!["rootfs.diff_ids names the layer content", "containerd restores the snapshot", "rebuild the image"],
        ),
        (
            "diff_ids: []",
            image_of(plain.clone(), gz, config_of(&[])),
            vec!["diff_ids names 0 layer(s)", "rebuild the image"],
        ),
        (
            "a config of [1,2,3]",
            image_of(plain.clone(), none, b"[1,2,3]".to_vec()),
            vec!["config sha256:", "rebuild the image"],
        ),
        (
            "a config of {}",
            image_of(plain.clone(), none, b"{}".to_vec()),
            vec!["it has no rootfs", "rebuild the image"],
        ),
        (
            "a manifest with manifests",
            Parts {
                manifest: format!(
                    r#"{{"schemaVersion":2,"config":{config_desc},"layers":[{layer_desc}],"manifests":[]}}"#
                )
                .into_bytes(),
                ..parts.clone()
            }
            .image(),
            vec!["expected manifest but found index", "rebuild the image"],
        ),
    ];
    let mut index_with_layers = parts.image();
    index_with_layers.index =
        format!(r#"{{"schemaVersion":2,"manifests":[{}],"layers":[]}}"#, descriptor(MANIFEST, &parts.manifest))
            .into_bytes();
    cases.push((
        "an index with layers",
        index_with_layers,
        vec!["expected index but found manifest", "rebuild the image"],
    ));
    let mut lone = Tar::new();
    lone.dir("checkpoint").file("checkpoint/inventory.img", b"inv");
    let mut lone = lone.unfinished();
    lone.extend([0; 512]);
    let mut hidden = Tar::new();
    hidden.file("checkpoint/cuda-migrate-7.img", &image(7));
    lone.extend(hidden.finish());
    cases.push((
        "a zero block followed by more members",
        good(&lone, none),
        vec!["lone zero block", "re-export the checkpoint"],
    ));
    let mut garbage = compress(&plain, gz);
    garbage.extend(b"trailing garbage");
    cases.push((
        "gzip trailing garbage",
        Parts::of(garbage, layer_type(gz), config_of(&[&digest(&plain)])).image(),
        vec!["holds data that is no gzip frame", "rebuild the image"],
    ));
    let mut wh = Tar::new();
    wh.dir("checkpoint")
        .file("checkpoint/inventory.img", b"inv")
        .file("checkpoint/cuda-migrate-7.img", &image(7))
        .file("checkpoint/.wh.cuda-migrate-8.img", b"");
    cases.push(("a whiteout", good(&wh.finish(), gz), vec!["is an OCI whiteout", "export the checkpoint again"]));
    let mut two = parts.image();
    let other_manifest = String::from_utf8(parts.manifest.clone()).unwrap().replace("counter", "other");
    two.blob(other_manifest.as_bytes());
    two.index = format!(
        r#"{{"schemaVersion":2,"manifests":[{},{}]}}"#,
        descriptor(MANIFEST, &parts.manifest),
        descriptor(MANIFEST, other_manifest.as_bytes())
    )
    .into_bytes();
    cases.push(("two images", two, vec!["more than one image", "skopeo copy"]));
    let mut nested = parts.image();
    let mut descs = String::new();
    for i in 0..3 {
        let pad = "x".repeat(4_000_000);
        let idx = format!(
            r#"{{"schemaVersion":2,"manifests":[{}],"annotations":{{"pad{i}":"{pad}"}}}}"#,
            descriptor(MANIFEST, &parts.manifest)
        );
        let _ = write!(descs, "{}{}", if i == 0 { "" } else { "," }, descriptor(INDEX, idx.as_bytes()));
        nested.blob(idx.as_bytes());
    }
    nested.index = format!(r#"{{"schemaVersion":2,"manifests":[{descs}]}}"#).into_bytes();
    cases.push(("nested indexes of 12 MB", nested, vec!["bytes together", "this is no checkpoint image"]));

    for (n, (what, image, needles)) in cases.into_iter().enumerate() {
        let layout = dir.path().join(format!("layout-{n}"));
        image.write_layout(&layout);
        let layout = layout.to_str().unwrap().to_string();
        let archive = write(dir.path(), &format!("image-{n}.tar"), &image.archive());
        for path in [&layout, &archive] {
            for cmd in ["inspect", "preflight"] {
                let out = run(&[cmd, path], QUICK);
                assert_clean_failure(&out, 2, &needles);
                // Named: the image, or its layer's blob (the archive rules).
                assert!(text(&out).contains("checkpoint image `") || text(&out).contains(":blobs/sha256/"), "{what}");
                assert!(out.stdout.is_empty(), "{what}: {cmd} printed {}", text(&out));
                assert_eq!(String::from_utf8_lossy(&out.stderr).lines().count(), 1, "{what}: one line: {}", text(&out));
                let out = run(&["--json", cmd, path], QUICK);
                let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
                assert_eq!((v["ok"].clone(), v["exit_code"].clone()), (false.into(), 2.into()), "{what}: {v}");
                assert!(v["error"].as_str().unwrap().contains(needles[0]), "{what}: {v}");
            }
        }
    }

    // `index.json/` as a directory after the file, in an oci-archive.
    let image = parts.image();
    let mut t = Tar::new();
    t.dir("blobs").dir("blobs/sha256");
    for (hex, data) in &image.blobs {
        t.file(&format!("blobs/sha256/{hex}"), data);
    }
    t.file("index.json", &image.index).file("oci-layout", &image.layout).dir("index.json/");
    let path = write(dir.path(), "index-dir.tar", &t.finish());
    for cmd in ["inspect", "preflight"] {
        let out = run(&[cmd, &path], QUICK);
        assert_clean_failure(
            &out,
            2,
            &["member `index.json/` is a directory", "must be a regular file", "copy the image again"],
        );
    }
}

/// index.json → nested index → manifest: containerd takes the nested index for the image and reads its
/// annotations (`checkIfCheckpointOCIImage`), so `inspect` reports those for containerd, the manifest's for CRI-O.
#[test]
fn inspect_reports_the_annotations_containerd_reads_on_a_nested_index() {
    use common::oci::{descriptor, digest, INDEX, MANIFEST};
    let dir = tempfile::tempdir().unwrap();
    let (_, parts) = common::oci::Image::of(&kubelet_layer(), ccm_archive::Compression::None);
    for (annotations, containerd) in [
        (r#"{"org.criu.checkpoint.container.name":"from-the-index"}"#, "containerd 2.x restores from it"),
        ("{}", "containerd 2.x takes it for a plain image, not a checkpoint"),
    ] {
        let inner = format!(
            r#"{{"schemaVersion":2,"manifests":[{}],"annotations":{annotations}}}"#,
            descriptor(MANIFEST, &parts.manifest)
        );
        let mut image = parts.image();
        image.blob(inner.as_bytes());
        image.index =
            format!(r#"{{"schemaVersion":2,"manifests":[{}]}}"#, descriptor(INDEX, inner.as_bytes())).into_bytes();
        let layout = dir.path().join("nested");
        let _ = std::fs::remove_dir_all(&layout);
        image.write_layout(&layout);
        let out = run(&["inspect", layout.to_str().unwrap()], QUICK);
        let all = text(&out);
        assert_eq!(out.status.code(), Some(0), "{all}");
        for needle in [
            containerd,
            "CRI-O restores from it",
            &format!(
                "containerd reads the annotations of the index {} that index.json names",
                digest(inner.as_bytes())
            ),
        ] {
            assert!(all.contains(needle), "{needle:?} in {all}");
        }
        let out = run(&["--json", "inspect", layout.to_str().unwrap()], QUICK);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
        assert_eq!(v["image"]["target_digest"], digest(inner.as_bytes()));
        assert_eq!(v["image"]["checkpoint_name_cri_o"], "counter");
        let expected = if annotations == "{}" { serde_json::Value::Null } else { "from-the-index".into() };
        assert_eq!(v["image"]["checkpoint_name_containerd"], expected, "{v}");
    }
}

/// `inspect ... | head`: the reader goes away, the command ends at its next write, quietly (no panic, nothing on
/// stderr), with the status a shell reports for tar or cat there (141, SIGPIPE's).
#[test]
fn a_closed_stdout_ends_inspect_quietly() {
    let dir = tempfile::tempdir().unwrap();
    // A restore report of 300 KiB: more than a pipe holds, so the command writes after head is gone.
    let report: String =
        (0..6000).map(|i| format!("reconciliation line {i:05} of a long report ...........\n")).collect();
    let mut t = Tar::new();
    t.dir("checkpoint")
        .file("checkpoint/inventory.img", b"inv")
        .file("checkpoint/cuda-migrate-7.img", &image(7))
        .file("checkpoint/cuda-migrate-restore-7.txt", report.as_bytes());
    let archive = write(dir.path(), "long.tar", &t.finish());
    for json in [false, true] {
        let script = format!(
            "'{}' {} inspect '{archive}' | head -n 1 >/dev/null; echo \"status ${{PIPESTATUS[0]}}\"",
            cli().display(),
            if json { "--json" } else { "" }
        );
        let out = Command::new("bash").args(["-c", &script]).env("RUST_BACKTRACE", "1").output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(stdout.trim(), "status 141", "json {json}: {stdout} {stderr}");
        assert!(stderr.is_empty(), "json {json}: quiet, no panic: {stderr}");
    }
}

#[test]
fn inspect_shows_a_processes_page_file_and_a_cut_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let with_pages = |page_file_bytes: Option<usize>| {
        let mut t = Tar::new();
        t.dir("checkpoint")
            .file("checkpoint/inventory.img", b"\x54\xc6\x60\x58inventory")
            .file("checkpoint/cuda-migrate-7.img", &image_with(7, Some(64 << 20), Some(staging_table())));
        if let Some(n) = page_file_bytes {
            t.file("checkpoint/cuda-migrate-pages-7.img", &vec![0x5a; n]);
        }
        t.finish()
    };
    let whole = write(dir.path(), "whole.tar", &with_pages(Some(128 << 10)));
    let out = run(&["inspect", &whole], QUICK);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    assert!(
        all.contains(
            "staging pages: the driver's 0.2 MiB in 1 region(s), written by the plugin to cuda-migrate-pages-7.img \
             (0.1 MiB, its size checked); 3 chunk(s) of 0.1 MiB, 1 of them all zero and left out as holes (0.1 MiB not \
             written)"
        ),
        "{all}"
    );
    let out = run(&["inspect", "--json", &whole], QUICK);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let pages = &v["page_files"][0];
    assert_eq!(pages["name"], "cuda-migrate-pages-7.img", "{v}");
    assert_eq!(
        (pages["bytes"].as_u64(), pages["chunks"].as_u64(), pages["holes"].as_u64()),
        (Some(128 << 10), Some(3), Some(1))
    );
    // A cut page file, or none: refused before anything else, naming the file and the fix.
    for (name, pages) in [("cut.tar", Some(100 << 10)), ("none.tar", None)] {
        let path = write(dir.path(), name, &with_pages(pages));
        let out = run(&["inspect", &path], QUICK);
        assert_clean_failure(&out, 2, &["cuda-migrate-pages-7.img"]);
    }
}
