//! Checkpoint images (an OCI image layout directory, an `oci-archive`) read in place, and hostile ones refused
//! each with its own error: blobs by digest only, verified while they stream, no link followed, every size
//! bounded, the layer held to every archive rule.

// Test code: a failed unwrap or expect names its line (the workspace lints keep them out of product code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::fs::symlink;
use std::path::Path;

use ccm_archive::oci::{
    CONTAINERD_CHECKPOINT_ANNOTATION, MAX_DESCRIPTORS, MAX_INDEX_DEPTH, MAX_JSON_BYTES, MAX_TOTAL_JSON_BYTES,
};
use ccm_archive::{
    read_checkpoint_file, read_image_layout, ArchiveError, CheckpointFile, CheckpointImage, Compression, ImageFormat,
    ImageRule, Limits, PathRule,
};
use common::oci::{
    config_of, descriptor, digest, layer_type, Image, Parts, CHECKPOINT_ANNOTATIONS, CONFIG, INDEX, MANIFEST,
};
use common::*;
use tar::EntryType;

/// A small checkpoint, as the kubelet's archive holds it (with CRIU's dump.log naming its version).
fn checkpoint_tar() -> Vec<u8> {
    let mut t = Tar::new();
    t.dir("checkpoint")
        .file("checkpoint/inventory.img", b"inv")
        .file("checkpoint/cuda-migrate-7.img", &image_bytes(7))
        .file("dump.log", b"(00.000000) Version: 4.2 (gitid 0)\n(00.000010) Running on ...\n")
        .file("spec.dump", SPEC)
        .file("config.dump", br#"{"id":"3f2a"}"#);
    t.finish()
}

fn layout(dir: &Path, image: &Image) -> Result<CheckpointImage, ArchiveError> {
    let at = dir.join("layout");
    image.write_layout(&at);
    read_image_layout(&at, &Limits::default())
}

fn archive(dir: &Path, bytes: &[u8]) -> Result<CheckpointImage, ArchiveError> {
    let path = write(dir, "image.tar", bytes);
    match read_checkpoint_file(&path, &Limits::default())? {
        CheckpointFile::Image(i) => Ok(i),
        CheckpointFile::Archive(a) => panic!("read as a checkpoint archive: {a:?}"),
    }
}

/// The image rule an error is, failing on any other error.
fn rule(r: Result<CheckpointImage, ArchiveError>) -> ImageRule {
    match r {
        Ok(i) => panic!("read: {i:?}"),
        Err(ArchiveError::Image { rule, .. }) => rule,
        Err(e) => panic!("not an image refusal: {e}"),
    }
}

/// The same image refused the same way as a layout directory and as an oci-archive.
fn both(image: &Image) -> [ImageRule; 2] {
    let dir = tempfile::tempdir().unwrap();
    [rule(layout(dir.path(), image)), rule(archive(dir.path(), &image.archive()))]
}

fn one_layer() -> (Image, Parts) {
    Image::of(&checkpoint_tar(), Compression::None)
}

/// `parts` with its manifest replaced by `manifest`.
fn with_manifest(parts: &Parts, manifest: String) -> Image {
    Parts { manifest: manifest.into_bytes(), ..parts.clone() }.image()
}

// --- what is read ---

#[test]
fn a_layout_directory_and_an_oci_archive_are_read_with_their_layer_in_every_compression() {
    let dir = tempfile::tempdir().unwrap();
    for c in [Compression::None, Compression::Gzip, Compression::Zstd] {
        let (image, parts) = Image::of(&checkpoint_tar(), c);
        for (format, read) in [
            (ImageFormat::Layout, layout(dir.path(), &image)),
            (ImageFormat::OciArchive, archive(dir.path(), &image.archive())),
        ] {
            let i = read.unwrap_or_else(|e| panic!("{c} {format}: {e}"));
            assert_eq!(i.format, format);
            assert_eq!(i.manifest_digest, digest(&parts.manifest));
            assert_eq!(i.layer_digest, digest(&parts.layer));
            assert_eq!(i.layer_media_type, layer_type(c));
            assert_eq!(i.ref_names, ["ckpt"]);
            assert_eq!(i.checkpoint_name(), Some("counter"));
            assert_eq!(i.checkpoint.compression, c);
            assert!(i.checkpoint.has_inventory);
            assert_eq!(i.checkpoint.images.len(), 1);
            assert_eq!(i.checkpoint.images[0].bytes, image_bytes(7));
            assert_eq!(i.checkpoint.spec.as_ref().unwrap().bytes, SPEC);
            assert_eq!(i.checkpoint.criu_version, Some(("4.2".to_string(), "dump.log".to_string())));
        }
    }
}

#[test]
fn a_checkpoint_archive_is_still_read_as_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "checkpoint.tar", &checkpoint_tar());
    match read_checkpoint_file(&path, &Limits::default()).unwrap() {
        CheckpointFile::Archive(a) => assert_eq!(a.images.len(), 1),
        CheckpointFile::Image(i) => panic!("read as an image: {i:?}"),
    }
}

#[test]
fn the_index_may_nest_and_repeat_a_manifest_within_bounds() {
    let (_, parts) = one_layer();
    let mut image = parts.image();
    // The nested index says what the manifest says: containerd reads the same annotations whichever entry of
    // index.json names the image.
    let inner = format!(
        r#"{{"schemaVersion":2,"manifests":[{}],"annotations":{CHECKPOINT_ANNOTATIONS}}}"#,
        descriptor(MANIFEST, &parts.manifest)
    );
    image.blob(inner.as_bytes());
    image.index = format!(
        r#"{{"schemaVersion":2,"manifests":[{},{}]}}"#,
        descriptor(INDEX, inner.as_bytes()),
        descriptor(MANIFEST, &parts.manifest)
    )
    .into_bytes();
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(layout(dir.path(), &image).unwrap().manifest_digest, digest(&parts.manifest));
}

/// containerd takes the blob `index.json`'s entry names for the image (`ctr images import`, a pull) and reads
/// the checkpoint annotation from that target (`checkIfCheckpointOCIImage`): with index.json → nested index →
/// manifest, the nested index's, not the manifest's (issue 35 part 8).
#[test]
fn the_annotations_containerd_reads_are_the_target_s() {
    let (_, parts) = one_layer();
    let mut image = parts.image();
    let inner = format!(
        r#"{{"schemaVersion":2,"mediaType":"{INDEX}","manifests":[{}],"annotations":{{"org.criu.checkpoint.container.name":"from-the-index"}}}}"#,
        descriptor(MANIFEST, &parts.manifest)
    );
    image.blob(inner.as_bytes());
    image.index =
        format!(r#"{{"schemaVersion":2,"manifests":[{}]}}"#, descriptor(INDEX, inner.as_bytes())).into_bytes();
    let dir = tempfile::tempdir().unwrap();
    for i in [layout(dir.path(), &image).unwrap(), archive(dir.path(), &image.archive()).unwrap()] {
        assert_eq!(i.target_digest, digest(inner.as_bytes()));
        assert_eq!(
            i.target_annotations.get(CONTAINERD_CHECKPOINT_ANNOTATION).map(String::as_str),
            Some("from-the-index")
        );
        assert_eq!(i.annotations.get(CONTAINERD_CHECKPOINT_ANNOTATION).map(String::as_str), Some("counter"));
    }
    // Without the annotation on the nested index containerd takes the image for a plain one, whatever the
    // manifest says.
    let bare = format!(r#"{{"schemaVersion":2,"manifests":[{}]}}"#, descriptor(MANIFEST, &parts.manifest));
    let mut image = parts.image();
    image.blob(bare.as_bytes());
    image.index = format!(r#"{{"schemaVersion":2,"manifests":[{}]}}"#, descriptor(INDEX, bare.as_bytes())).into_bytes();
    let i = layout(dir.path(), &image).unwrap();
    assert!(i.target_annotations.is_empty(), "{:?}", i.target_annotations);
    // Directly named, the manifest is the target.
    let i = layout(dir.path(), &parts.image()).unwrap();
    assert_eq!((i.target_digest.as_str(), &i.target_annotations), (i.manifest_digest.as_str(), &i.annotations));

    // Two entries of index.json reaching the manifest with different annotations: what containerd reads depends
    // on the name restored.
    let mut image = parts.image();
    image.blob(bare.as_bytes());
    image.index = format!(
        r#"{{"schemaVersion":2,"manifests":[{},{}]}}"#,
        descriptor(INDEX, bare.as_bytes()),
        descriptor(MANIFEST, &parts.manifest)
    )
    .into_bytes();
    for r in both(&image) {
        assert!(matches!(r, ImageRule::Targets { ref targets } if targets.len() == 2), "{r}");
        assert!(r.to_string().contains("depends on that name"), "{r}");
    }
}

// --- blobs: digest, size, presence, links ---

#[test]
fn a_layer_whose_bytes_do_not_match_its_digest_is_refused() {
    let (mut image, parts) = one_layer();
    let mut altered = parts.layer.clone();
    altered[600] ^= 1;
    image.replace_blob(&parts.layer, &altered);
    for r in both(&image) {
        assert!(
            matches!(r, ImageRule::DigestMismatch { ref digest, .. } if *digest == common::oci::digest(&parts.layer)),
            "{r}"
        );
        assert!(r.to_string().contains("copy it again"), "{r}");
    }
}

#[test]
fn a_manifest_whose_bytes_do_not_match_its_digest_is_refused() {
    let (mut image, parts) = one_layer();
    let altered = String::from_utf8(parts.manifest.clone()).unwrap().replace("counter", "Counter");
    image.replace_blob(&parts.manifest, altered.as_bytes());
    for r in both(&image) {
        assert!(matches!(r, ImageRule::DigestMismatch { .. }), "{r}");
    }
}

#[test]
fn a_blob_of_another_size_than_its_descriptor_is_refused() {
    let (mut image, parts) = one_layer();
    let mut longer = parts.layer.clone();
    longer.extend([0; 512]);
    image.replace_blob(&parts.layer, &longer);
    for r in both(&image) {
        assert!(matches!(r, ImageRule::SizeMismatch { declared, actual, .. } if actual == declared + 512), "{r}");
    }
}

#[test]
fn a_missing_blob_is_refused() {
    let (mut image, parts) = one_layer();
    image.remove_blob(&parts.layer);
    for r in both(&image) {
        assert!(matches!(r, ImageRule::Missing { ref what } if what.contains("blob")), "{r}");
    }
    let (mut image, parts) = one_layer();
    image.remove_blob(&parts.manifest);
    for r in both(&image) {
        assert!(matches!(r, ImageRule::Missing { .. }), "{r}");
    }
}

#[test]
fn a_symlinked_blob_is_refused_in_a_layout_and_in_an_oci_archive() {
    let dir = tempfile::tempdir().unwrap();
    let (image, parts) = one_layer();
    let at = dir.path().join("layout");
    image.write_layout(&at);
    // The real layer elsewhere, the blob a link to it: never followed.
    let hex = ccm_archive::sha256::hex_digest(&parts.layer);
    let elsewhere = write(dir.path(), "elsewhere", &parts.layer);
    std::fs::remove_file(at.join("blobs/sha256").join(&hex)).unwrap();
    symlink(&elsewhere, at.join("blobs/sha256").join(&hex)).unwrap();
    let r = rule(read_image_layout(&at, &Limits::default()));
    assert!(matches!(r, ImageRule::Link { .. }), "{r}");
    assert!(r.to_string().contains("symbolic link"), "{r}");

    // A linked index.json and a linked blobs/ directory, likewise.
    for linked in ["index.json", "blobs"] {
        let at = dir.path().join(format!("layout-{linked}"));
        image.write_layout(&at);
        let real = dir.path().join(format!("real-{linked}"));
        std::fs::rename(at.join(linked), &real).unwrap();
        symlink(&real, at.join(linked)).unwrap();
        let r = rule(read_image_layout(&at, &Limits::default()));
        assert!(matches!(r, ImageRule::Link { .. }), "{linked}: {r}");
    }

    // In an oci-archive: the blob a symlink member.
    let mut without = image.clone();
    without.remove_blob(&parts.layer);
    let bytes = without.archive_with(|t| {
        t.link(EntryType::Symlink, &format!("blobs/sha256/{hex}"), "elsewhere");
    });
    let path = write(dir.path(), "linked.tar", &bytes);
    match read_checkpoint_file(&path, &Limits::default()) {
        Err(ArchiveError::NotRegularMember { member, kind, .. }) => {
            assert!(member.contains(&hex) && kind.contains("symbolic link"), "{member} {kind}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn two_blobs_of_one_name_in_an_oci_archive_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (image, parts) = one_layer();
    let hex = ccm_archive::sha256::hex_digest(&parts.layer);
    let bytes = image.archive_with(|t| {
        t.file(&format!("./blobs/sha256/{hex}"), b"another");
    });
    let path = write(dir.path(), "twice.tar", &bytes);
    assert!(matches!(read_checkpoint_file(&path, &Limits::default()), Err(ArchiveError::Duplicate { .. })));
}

// --- sizes and counts ---

#[test]
fn a_huge_index_is_refused_without_reading_it() {
    let (mut image, _) = one_layer();
    let mut huge = b"{\"schemaVersion\":2,\"manifests\":[],\"x\":\"".to_vec();
    huge.resize(usize::try_from(MAX_JSON_BYTES).unwrap() + 10, b'a');
    huge.extend(b"\"}");
    image.index = huge;
    let dir = tempfile::tempdir().unwrap();
    let r = rule(layout(dir.path(), &image));
    assert!(matches!(r, ImageRule::TooLarge { ref what, .. } if what == "index.json"), "{r}");
    let path = write(dir.path(), "huge.tar", &image.archive());
    match read_checkpoint_file(&path, &Limits::default()) {
        Err(ArchiveError::MemberTooLarge { member, .. }) => assert_eq!(member, "index.json"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_manifest_descriptor_claiming_a_huge_size_is_refused_before_any_read() {
    let (mut image, parts) = one_layer();
    image.index = format!(
        r#"{{"schemaVersion":2,"manifests":[{{"mediaType":"{MANIFEST}","digest":"{}","size":9000000000}}]}}"#,
        digest(&parts.manifest)
    )
    .into_bytes();
    for r in both(&image) {
        assert!(matches!(r, ImageRule::TooLarge { size: 9_000_000_000, .. }), "{r}");
    }
}

#[test]
fn too_many_descriptors_are_refused() {
    let (mut image, parts) = one_layer();
    let d = descriptor(MANIFEST, &parts.manifest);
    let many = vec![d; MAX_DESCRIPTORS + 1].join(",");
    image.index = format!(r#"{{"schemaVersion":2,"manifests":[{many}]}}"#).into_bytes();
    for r in both(&image) {
        assert_eq!(r, ImageRule::TooManyDescriptors);
    }
}

#[test]
fn more_than_one_image_or_layer_is_refused() {
    let (mut image, parts) = one_layer();
    let other = String::from_utf8(parts.manifest.clone()).unwrap().replace("counter", "other");
    image.blob(other.as_bytes());
    image.index = format!(
        r#"{{"schemaVersion":2,"manifests":[{},{}]}}"#,
        descriptor(MANIFEST, &parts.manifest),
        descriptor(MANIFEST, other.as_bytes())
    )
    .into_bytes();
    for r in both(&image) {
        assert!(matches!(r, ImageRule::Images { count: 2, .. }), "{r}");
        assert!(r.to_string().contains("skopeo copy"), "{r}");
    }

    let manifest = format!(
        r#"{{"schemaVersion":2,"config":{},"layers":[{},{}]}}"#,
        descriptor(CONFIG, &parts.config),
        descriptor(layer_type(Compression::None), &parts.layer),
        descriptor(layer_type(Compression::None), &parts.layer)
    );
    for r in both(&with_manifest(&parts, manifest)) {
        assert_eq!(r, ImageRule::Layers { count: 2 });
    }
}

// --- digests that are no digests, indexes that loop ---

#[test]
fn digests_that_could_name_a_path_or_another_algorithm_are_refused() {
    let (_, parts) = one_layer();
    let hex = ccm_archive::sha256::hex_digest(&parts.layer);
    for bad in [
        "sha256:../../../../etc/passwd".to_string(),
        format!("sha256:{}", hex.to_uppercase()),
        format!("sha256:{hex}/../x"),
        format!("sha512:{hex}{hex}"),
        format!("sha256:{}", &hex[..63]),
        hex.clone(),
    ] {
        let manifest = format!(
            r#"{{"schemaVersion":2,"config":{},"layers":[{{"mediaType":"{}","digest":"{bad}","size":{}}}]}}"#,
            descriptor(CONFIG, &parts.config),
            layer_type(Compression::None),
            parts.layer.len()
        );
        for r in both(&with_manifest(&parts, manifest)) {
            assert!(matches!(r, ImageRule::Digest { .. }), "{bad}: {r}");
        }
    }
}

#[test]
fn an_index_reached_twice_or_nested_too_deep_is_refused() {
    let (_, parts) = one_layer();
    // The same nested index twice (a loop cannot be made of digests that verify: a blob cannot hold its own).
    let inner = format!(r#"{{"schemaVersion":2,"manifests":[{}]}}"#, descriptor(MANIFEST, &parts.manifest));
    let mut image = parts.image();
    image.blob(inner.as_bytes());
    let d = descriptor(INDEX, inner.as_bytes());
    image.index = format!(r#"{{"schemaVersion":2,"manifests":[{d},{d}]}}"#).into_bytes();
    for r in both(&image) {
        assert!(matches!(r, ImageRule::Loop { .. }), "{r}");
    }

    // An index that names itself can never verify.
    let mut image = parts.image();
    let fake = "sha256:".to_string() + &"ab".repeat(32);
    let selfish =
        format!(r#"{{"schemaVersion":2,"manifests":[{{"mediaType":"{INDEX}","digest":"{fake}","size":100}}]}}"#);
    image.blobs.push(("ab".repeat(32), selfish.clone().into_bytes()));
    image.index = selfish.into_bytes();
    for r in both(&image) {
        assert!(matches!(r, ImageRule::SizeMismatch { .. } | ImageRule::DigestMismatch { .. }), "{r}");
    }

    // A chain of indexes one deeper than allowed.
    let mut image = parts.image();
    let mut below = descriptor(MANIFEST, &parts.manifest);
    for _ in 0..MAX_INDEX_DEPTH {
        let idx = format!(r#"{{"schemaVersion":2,"manifests":[{below}]}}"#);
        image.blob(idx.as_bytes());
        below = descriptor(INDEX, idx.as_bytes());
    }
    image.index = format!(r#"{{"schemaVersion":2,"manifests":[{below}]}}"#).into_bytes();
    for r in both(&image) {
        assert_eq!(r, ImageRule::TooDeep);
    }
}

// --- what the runtimes would read differently ---

#[test]
fn json_that_go_reads_otherwise_is_refused() {
    let (_, parts) = one_layer();
    let manifest = format!(
        r#"{{"schemaVersion":2,"config":{},"layers":[],"Layers":[{}]}}"#,
        descriptor(CONFIG, &parts.config),
        descriptor(layer_type(Compression::None), &parts.layer)
    );
    for r in both(&with_manifest(&parts, manifest)) {
        assert!(matches!(r, ImageRule::Json { ref reason, .. } if reason.contains("twice")), "{r}");
    }
    let manifest = format!(
        r#"{{"schemaVersion":2,"config":{},"LAYERS":[{}]}}"#,
        descriptor(CONFIG, &parts.config),
        descriptor(layer_type(Compression::None), &parts.layer)
    );
    for r in both(&with_manifest(&parts, manifest)) {
        assert!(matches!(r, ImageRule::Json { ref reason, .. } if reason.contains("takes it for `layers`")), "{r}");
    }
}

#[test]
fn a_layer_compressed_otherwise_than_its_media_type_says_is_refused() {
    let (_, parts) = Image::of(&checkpoint_tar(), Compression::Gzip);
    let manifest = format!(
        r#"{{"schemaVersion":2,"config":{},"layers":[{}]}}"#,
        descriptor(CONFIG, &parts.config),
        descriptor(layer_type(Compression::None), &parts.layer)
    );
    for r in both(&with_manifest(&parts, manifest)) {
        assert_eq!(
            r,
            ImageRule::Compression { media_type: layer_type(Compression::None).into(), found: Compression::Gzip }
        );
    }
}

#[test]
fn embedded_data_foreign_urls_and_other_media_types_are_refused() {
    let (_, parts) = one_layer();
    let layer = descriptor(layer_type(Compression::None), &parts.layer);
    for (changed, expect_embedded) in [
        (layer.replace(r#""size""#, r#""data":"AAAA","size""#), true),
        (layer.replace(r#""size""#, r#""urls":["https://example.com/x"],"size""#), true),
        (layer.replace("layer.v1.tar", "layer.nondistributable.v1.tar"), false),
    ] {
        let manifest =
            format!(r#"{{"schemaVersion":2,"config":{},"layers":[{changed}]}}"#, descriptor(CONFIG, &parts.config));
        for r in both(&with_manifest(&parts, manifest.clone())) {
            match expect_embedded {
                true => assert!(matches!(r, ImageRule::Embedded { .. }), "{r}"),
                false => assert!(matches!(r, ImageRule::MediaType { .. }), "{r}"),
            }
        }
    }
    // A manifest whose own media type is not its descriptor's.
    let manifest = format!(
        r#"{{"schemaVersion":2,"mediaType":"{INDEX}","config":{},"layers":[{layer}]}}"#,
        descriptor(CONFIG, &parts.config)
    );
    for r in both(&with_manifest(&parts, manifest)) {
        assert!(matches!(r, ImageRule::MediaType { .. }), "{r}");
    }
}

#[test]
fn a_layout_of_another_version_or_without_oci_layout_is_refused() {
    let (mut image, _) = one_layer();
    image.layout = br#"{"imageLayoutVersion":"2.0.0"}"#.to_vec();
    for r in both(&image) {
        assert!(matches!(r, ImageRule::NotLayout { .. }), "{r}");
    }
    let dir = tempfile::tempdir().unwrap();
    let (image, _) = one_layer();
    let at = dir.path().join("layout");
    image.write_layout(&at);
    std::fs::remove_file(at.join("oci-layout")).unwrap();
    assert!(matches!(rule(read_image_layout(&at, &Limits::default())), ImageRule::NotLayout { .. }));
}

#[test]
fn a_compressed_oci_archive_and_a_tar_with_both_layout_and_checkpoint_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (image, _) = one_layer();
    let r = rule(archive(dir.path(), &gzip(&image.archive())));
    assert_eq!(r, ImageRule::CompressedArchive { compression: Compression::Gzip });
    let both_kinds = image.archive_with(|t| {
        t.dir("checkpoint").file("checkpoint/inventory.img", b"inv");
    });
    assert_eq!(rule(archive(dir.path(), &both_kinds)), ImageRule::Both);
}

// --- a hostile layer: every archive rule holds inside the image ---

#[test]
fn a_layer_that_is_no_checkpoint_is_refused() {
    let mut t = Tar::new();
    t.file("etc/hostname", b"x");
    let (image, _) = Image::of(&t.finish(), Compression::None);
    for r in both(&image) {
        assert_eq!(r, ImageRule::NoCheckpoint);
    }
}

/// Whether an error is the refusal a case expects.
type IsRefusal = fn(&ArchiveError) -> bool;

#[test]
fn a_hostile_layer_is_refused_by_the_archive_rules_naming_the_layer() {
    let dir = tempfile::tempdir().unwrap();
    let hostile: Vec<(&str, Vec<u8>, IsRefusal)> = vec![
        (
            "a member climbing out",
            {
                let mut t = Tar::new();
                t.dir("checkpoint").raw(b"../../etc/cron.d/x", EntryType::Regular, 1, b"x");
                t.finish()
            },
            |e| matches!(e, ArchiveError::UnsafePath { rule: PathRule::ParentDir, .. }),
        ),
        (
            "a symlink named like an identity image",
            {
                let mut t = Tar::new();
                t.dir("checkpoint").link(EntryType::Symlink, "checkpoint/cuda-migrate-1.img", "/etc/shadow");
                t.finish()
            },
            |e| matches!(e, ArchiveError::UnsafeLinkTarget { .. } | ArchiveError::NotRegularMember { .. }),
        ),
        (
            "a member through a link",
            {
                let mut t = Tar::new();
                t.link(EntryType::Symlink, "x", "checkpoint").file("x/cuda-migrate-1.img", &image_bytes(1));
                t.finish()
            },
            |e| matches!(e, ArchiveError::ThroughLink { .. }),
        ),
        (
            "an identity image twice",
            {
                let mut t = Tar::new();
                t.dir("checkpoint")
                    .file("checkpoint/cuda-migrate-1.img", &image_bytes(1))
                    .file("./checkpoint/cuda-migrate-1.img", &image_bytes(2));
                t.finish()
            },
            |e| matches!(e, ArchiveError::Duplicate { .. }),
        ),
        (
            "a cut tar",
            {
                let mut t = Tar::new();
                t.dir("checkpoint").file("checkpoint/inventory.img", b"inv");
                t.unfinished()
            },
            |e| matches!(e, ArchiveError::Truncated { .. }),
        ),
    ];
    for (what, layer, is) in hostile {
        for c in [Compression::None, Compression::Zstd] {
            let (image, parts) = Image::of(&layer, c);
            let hex = ccm_archive::sha256::hex_digest(&parts.layer);
            for r in [layout(dir.path(), &image), archive(dir.path(), &image.archive())] {
                let e = r.expect_err(what);
                assert!(is(&e), "{what} ({c}): {e}");
                assert!(e.to_string().contains(&format!("blobs/sha256/{hex}")), "{what}: names the layer: {e}");
            }
        }
    }
}

#[test]
fn a_zstd_bomb_of_a_layer_ends_at_the_scan_limit() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = Tar::new();
    t.dir("checkpoint").zeros("checkpoint/pages-1.img", 64 * MIB);
    let (image, _) = Image::of(&t.finish(), Compression::Zstd);
    let limits = Limits { max_scanned_bytes: 8 * MIB, ..Limits::default() };
    let at = dir.path().join("layout");
    image.write_layout(&at);
    let (r, took) = timed(|| read_image_layout(&at, &limits));
    assert!(matches!(r, Err(ArchiveError::ScanLimit { .. })), "{r:?}");
    assert!(took < QUICK, "{took:?}");
}

// --- what containerd reads otherwise (issue 35) ---

/// An image of `checkpoint_tar()` (plain) whose config is `config`.
fn with_config(config: Vec<u8>) -> Image {
    let (_, parts) = one_layer();
    Parts::of(parts.layer, layer_type(Compression::None), config).image()
}

/// containerd's CRI import mounts the snapshot named by the ChainID of the config's `rootfs.diff_ids` and skips
/// unpacking a layer whose snapshot exists: an image whose layer holds checkpoint A and whose diff_ids name B
/// restores B on a node that has B. The diff_ids must name this layer, uncompressed; `[]`, another type, no
/// rootfs, a config that is no object are refused as containerd refuses them.
#[test]
fn the_config_s_diff_ids_must_name_the_uncompressed_layer() {
    let tar = checkpoint_tar();
    let mut other = Tar::new();
    other.dir("checkpoint").file("checkpoint/inventory.img", b"B's");
    let other = other.finish();
    for (what, config) in [
        ("diff_ids of another checkpoint's layer", config_of(&[&digest(&other)])),
        ("diff_ids: []", config_of(&[])),
        ("two diff_ids", config_of(&[&digest(&tar), &digest(&tar)])),
        ("rootfs.type foo", br#"{"rootfs":{"type":"foo","diff_ids":[]}}"#.to_vec()),
        ("no rootfs ({})", b"{}".to_vec()),
        ("no diff_ids", br#"{"rootfs":{"type":"layers"}}"#.to_vec()),
    ] {
        for r in both(&with_config(config)) {
            match what {
                "diff_ids of another checkpoint's layer" => {
                    assert_eq!(r, ImageRule::DiffId { declared: digest(&other), actual: digest(&tar) }, "{what}")
                }
                _ => assert!(matches!(r, ImageRule::RootFs { .. }), "{what}: {r}"),
            }
            assert!(r.to_string().contains("diff_ids"), "{what}: {r}");
        }
    }
    for r in both(&with_config(b"[1,2,3]".to_vec())) {
        assert!(matches!(r, ImageRule::Json { ref what, .. } if what.starts_with("config sha256:")), "{r}");
    }
    for r in both(&with_config(br#"{"rootfs":{"type":"layers","diff_ids":["sha256:../../x"]}}"#.to_vec())) {
        assert!(matches!(r, ImageRule::Digest { .. }), "{r}");
    }
    // Compressed layers: the diff_id is the uncompressed tar's, never the blob's.
    for c in [Compression::Gzip, Compression::Zstd] {
        let blob = compress(&tar, c);
        for r in both(&Parts::of(blob.clone(), layer_type(c), config_of(&[&digest(&blob)])).image()) {
            assert_eq!(r, ImageRule::DiffId { declared: digest(&blob), actual: digest(&tar) }, "{c}");
        }
        let dir = tempfile::tempdir().unwrap();
        layout(dir.path(), &Parts::of(blob, layer_type(c), config_of(&[&digest(&tar)])).image())
            .unwrap_or_else(|e| panic!("{c}: {e}"));
    }
    // The whole uncompressed stream counts, GNU tar's padding after the end blocks too.
    let mut padded = tar.clone();
    padded.extend([0; 10240 - 1024]);
    let dir = tempfile::tempdir().unwrap();
    layout(
        dir.path(),
        &Parts::of(padded.clone(), layer_type(Compression::None), config_of(&[&digest(&padded)])).image(),
    )
    .unwrap();
    for r in both(&Parts::of(padded, layer_type(Compression::None), config_of(&[&digest(&tar)])).image()) {
        assert!(matches!(r, ImageRule::DiffId { .. }), "{r}");
    }
}

/// containerd's `validateMediaType`: a manifest with `manifests` (any value, `null` too) is an index to it, an
/// index with `config` or `layers` a manifest, `fsLayers` Docker's schema 1; each is refused there.
#[test]
fn a_manifest_with_manifests_or_an_index_with_layers_is_refused() {
    let (_, parts) = one_layer();
    let layer = descriptor(layer_type(Compression::None), &parts.layer);
    let config = descriptor(CONFIG, &parts.config);
    for extra in [r#""manifests":[]"#, r#""manifests":null"#, r#""fsLayers":[]"#] {
        let manifest = format!(r#"{{"schemaVersion":2,"config":{config},"layers":[{layer}],{extra}}}"#);
        for r in both(&with_manifest(&parts, manifest)) {
            assert!(
                matches!(r, ImageRule::Json { ref reason, .. } if reason.contains("expected manifest but found index")),
                "{extra}: {r}"
            );
        }
    }
    for extra in [r#""layers":[]"#, r#""config":{}"#, r#""layers":null"#] {
        // In index.json, and in a nested index.
        let mut image = parts.image();
        image.index =
            format!(r#"{{"schemaVersion":2,"manifests":[{}],{extra}}}"#, descriptor(MANIFEST, &parts.manifest))
                .into_bytes();
        for r in both(&image) {
            assert!(
                matches!(r, ImageRule::Json { ref what, ref reason } if what == "index.json" && reason.contains("expected index but found manifest")),
                "{extra}: {r}"
            );
        }
        let inner = format!(r#"{{"schemaVersion":2,"manifests":[{}],{extra}}}"#, descriptor(MANIFEST, &parts.manifest));
        let mut image = parts.image();
        image.blob(inner.as_bytes());
        image.index =
            format!(r#"{{"schemaVersion":2,"manifests":[{}]}}"#, descriptor(INDEX, inner.as_bytes())).into_bytes();
        for r in both(&image) {
            assert!(matches!(r, ImageRule::Json { ref what, .. } if what.starts_with("index sha256:")), "{extra}: {r}");
        }
    }
}

/// An OCI whiteout in a checkpoint's layer: containerd's unpack deletes the file `.wh.NAME` names instead of
/// writing a member, so the preflight would pass a process whose identity image the restore no longer finds.
#[test]
fn a_whiteout_in_a_layer_is_refused() {
    for name in ["checkpoint/.wh.cuda-migrate-7.img", "checkpoint/.wh..wh..opq", ".wh.spec.dump"] {
        let mut t = Tar::new();
        t.dir("checkpoint")
            .file("checkpoint/inventory.img", b"inv")
            .file("checkpoint/cuda-migrate-7.img", &image_bytes(7))
            .file(name, b"");
        let (image, _) = Image::of(&t.finish(), Compression::Gzip);
        let dir = tempfile::tempdir().unwrap();
        for r in [layout(dir.path(), &image), archive(dir.path(), &image.archive())] {
            match r {
                Err(ArchiveError::Whiteout { member, .. }) => assert_eq!(member, name),
                other => panic!("{name}: {other:?}"),
            }
        }
    }
}

/// A lone zero block, then members: Go's archive/tar (containerd's unpack) refuses the layer, GNU tar and Python
/// stop at the block, `tar --ignore-zeros` reads the members after it.
#[test]
fn a_lone_zero_block_followed_by_members_in_a_layer_is_refused() {
    let mut t = Tar::new();
    t.dir("checkpoint").file("checkpoint/inventory.img", b"inv");
    let mut layer = t.unfinished();
    layer.extend([0; 512]);
    let mut hidden = Tar::new();
    hidden.file("checkpoint/cuda-migrate-7.img", &image_bytes(7));
    layer.extend(hidden.finish());
    let (image, _) = Image::of(&layer, Compression::Zstd);
    let dir = tempfile::tempdir().unwrap();
    for r in [layout(dir.path(), &image), archive(dir.path(), &image.archive())] {
        assert!(
            matches!(r, Err(ArchiveError::Ambiguous { reason, .. }) if reason.contains("lone zero block")),
            "{r:?}"
        );
    }
}

/// containerd reads a layer's stream to its end (it hashes the uncompressed tar for its diff_id) with Go's gzip
/// reader, which refuses bytes after a member that are no gzip member; the zstd decoder likewise.
#[test]
fn trailing_garbage_after_a_compressed_layer_is_refused() {
    let tar = checkpoint_tar();
    for c in [Compression::Gzip, Compression::Zstd] {
        for trailer in [&b"garbage!garbage!"[..], &[0; 64]] {
            let mut blob = compress(&tar, c);
            blob.extend(trailer);
            let image = Parts::of(blob, layer_type(c), config_of(&[&digest(&tar)])).image();
            for r in both(&image) {
                assert!(matches!(r, ImageRule::TrailingData { compression, .. } if compression == c), "{c}: {r}");
                assert!(r.to_string().contains("containerd reads a layer to its end"), "{r}");
            }
        }
    }
}

/// `index.json/` as a directory after the file `index.json` in an oci-archive: an extractor replaces the file
/// with the directory, so it is refused as a second `index.json`; likewise a directory under a blob's name.
#[test]
fn a_directory_under_a_layout_file_s_name_is_refused() {
    let (image, _) = one_layer();
    let dir = tempfile::tempdir().unwrap();
    for name in ["index.json/", "oci-layout/", "blobs/sha256/0000/"] {
        let mut t = Tar::new();
        t.dir("blobs").dir("blobs/sha256");
        for (h, data) in &image.blobs {
            t.file(&format!("blobs/sha256/{h}"), data);
        }
        t.file("index.json", &image.index).file("oci-layout", &image.layout).dir(name);
        let path = write(dir.path(), "dir-after.tar", &t.finish());
        match read_checkpoint_file(&path, &Limits::default()) {
            Err(ArchiveError::NotRegularMember { member, kind, .. }) => {
                assert_eq!(member, name);
                assert!(kind.contains("directory"), "{kind}");
            }
            other => panic!("{name}: {other:?}"),
        }
        // The extractors disagree on what `index.json` is then: GNU tar replaces the file with the directory,
        // Python's tarfile keeps the file (containerd's importer reads the file: tests/containerd.rs).
        if name == "index.json/" && oracles_present() {
            let gnu = dir.path().join("gnu");
            let python = dir.path().join("python");
            std::fs::create_dir_all(&gnu).unwrap();
            let tar = std::process::Command::new(GNU_TAR).arg("-xf").arg(&path).arg("-C").arg(&gnu).status().unwrap();
            assert!(tar.success());
            assert!(gnu.join("index.json").is_dir(), "GNU tar made index.json a directory");
            let py = std::process::Command::new("python3")
                .args(["-c", "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter='data')"])
                .arg(&path)
                .arg(&python)
                .status()
                .unwrap();
            assert!(py.success());
            assert!(python.join("index.json").is_file(), "Python kept the file");
        }
    }
}

/// Nested indexes cost memory and time in proportion to their JSON: the whole read is capped, and the second
/// distinct manifest ends the walk before anything after it is read (issue 35 part 4: 48 nested indexes of
/// 3.8 MB took 1.64 GB and 14 s before "more than one image").
#[test]
fn image_json_is_capped_in_total_and_a_second_manifest_ends_the_walk() {
    let (_, parts) = one_layer();
    let mut image = parts.image();
    let mut big = Vec::new();
    for i in 0..3 {
        let pad = "x".repeat(usize::try_from(MAX_JSON_BYTES).unwrap() - 1000);
        let idx = format!(
            r#"{{"schemaVersion":2,"manifests":[{}],"annotations":{{"pad{i}":"{pad}"}}}}"#,
            descriptor(MANIFEST, &parts.manifest)
        );
        big.push(descriptor(INDEX, idx.as_bytes()));
        image.blob(idx.as_bytes());
    }
    image.index = format!(r#"{{"schemaVersion":2,"manifests":[{}]}}"#, big.join(",")).into_bytes();
    let dir = tempfile::tempdir().unwrap();
    let at = dir.path().join("big");
    image.write_layout(&at);
    let (r, took) = timed(|| read_image_layout(&at, &Limits::default()));
    let r = rule(r);
    assert_eq!(r, ImageRule::JsonTotal, "{r}");
    assert!(r.to_string().contains(&MAX_TOTAL_JSON_BYTES.to_string()), "{r}");
    assert!(took < QUICK * 4, "{took:?}");

    // A second manifest, then descriptors of blobs that are not there: refused at the second manifest, none of
    // the others looked for.
    let (_, parts) = one_layer();
    let mut image = parts.image();
    let other = String::from_utf8(parts.manifest.clone()).unwrap().replace("counter", "other");
    image.blob(other.as_bytes());
    let absent = format!(r#"{{"mediaType":"{INDEX}","digest":"sha256:{}","size":10}}"#, "ab".repeat(32));
    image.index = format!(
        r#"{{"schemaVersion":2,"manifests":[{},{},{absent}]}}"#,
        descriptor(MANIFEST, &parts.manifest),
        descriptor(MANIFEST, other.as_bytes())
    )
    .into_bytes();
    for r in both(&image) {
        assert!(matches!(r, ImageRule::Images { .. }), "{r}");
        assert!(r.to_string().contains("more than one image"), "{r}");
    }
}

/// serde reads a struct from an array (its fields in order), Go's encoding/json only from an object: a config of
/// `[{"type":"layers","diff_ids":[...]}]` was an image whose rootfs this reader took from the array while
/// containerd refuses the config (`cannot unmarshal array into Go value of type v1.Image`).
#[test]
fn arrays_where_go_reads_an_object_are_refused() {
    let tar = checkpoint_tar();
    let rootfs = format!(r#"{{"type":"layers","diff_ids":["{}"]}}"#, digest(&tar));
    for r in both(&with_config(format!("[{rootfs}]").into_bytes())) {
        assert!(matches!(r, ImageRule::Json { ref reason, .. } if reason.contains("the document is an array")), "{r}");
        assert!(r.to_string().contains("takes nothing but an object"), "{r}");
    }
    for r in both(&with_config(format!(r#"{{"rootfs":[{}]}}"#, r#""layers",[]"#).into_bytes())) {
        assert!(matches!(r, ImageRule::Json { ref reason, .. } if reason.contains("the value of `rootfs`")), "{r}");
    }
    let (_, parts) = one_layer();
    let manifest = format!(
        r#"{{"schemaVersion":2,"config":{},"layers":[["{}","{}",{}]]}}"#,
        descriptor(CONFIG, &parts.config),
        layer_type(Compression::None),
        digest(&parts.layer),
        parts.layer.len()
    );
    for r in both(&with_manifest(&parts, manifest)) {
        assert!(matches!(r, ImageRule::Json { ref reason, .. } if reason.contains("an element of `layers`")), "{r}");
    }
}
