//! Checkpoint images against containerd 2.1 itself (issue 35): each hostile image of `tests/images.rs` imported
//! and unpacked by containerd's client (`ctr images import --local`, tests/container/oci-import.sh) in the forky
//! runtimes root, and ccm-archive's verdict held against what containerd did with it: where containerd refuses an
//! image, so does this reader; where containerd takes it and unpacks something other than what the layer's tar
//! names (a whiteout, diff_ids naming a snapshot the node already has), this reader refuses it too.
//!
//! Needs root and the forky runtimes root (`CCM_CRIU_SUITE=forky tests/criu-root.sh prepare-runtimes`, which
//! tests/run-all.sh makes before the workspace's tests); skips loudly without them, fails under CI.

// Test code: a failed unwrap or expect names its line (the workspace lints keep them out of product code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use ccm_archive::{read_checkpoint_file, ArchiveError, CheckpointFile, Compression, Limits};
use common::oci::{config_of, descriptor, digest, layer_type, Image, Parts, CONFIG, INDEX, MANIFEST};
use common::*;

fn loud(line: &str) {
    let _ = writeln!(std::io::stderr(), "\n######## {line} ########\n");
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// The forky runtimes root, or `None` after a loud skip.
fn forky_runtimes() -> Option<PathBuf> {
    let ci = std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0");
    let uid = Command::new("id").arg("-u").output().map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    if uid.as_deref().ok() != Some("0") {
        assert!(!ci, "CI must run the containerd differential, but it needs root (mount namespaces, containerd)");
        loud("SKIPPED the containerd 2.1 differential of checkpoint images: not root");
        return None;
    }
    let out = Command::new("env")
        .args(["-u", "CCM_TRIXIE_ROOT", "-u", "CCM_RUNTIMES_ROOT", "CCM_CRIU_SUITE=forky", "bash"])
        .arg(repo().join("tests/criu-root.sh"))
        .arg("runtimes-path")
        .output()
        .unwrap();
    let root = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if !root.join("usr/bin/containerd").is_file() || !root.join("usr/sbin/criu").is_file() {
        assert!(!ci, "no forky runtimes root at {}: CI must make it (tests/run-all.sh does)", root.display());
        loud(&format!(
            "SKIPPED the containerd 2.1 differential of checkpoint images: no forky runtimes root at {} \
             (CCM_CRIU_SUITE=forky tests/criu-root.sh prepare-runtimes)",
            root.display()
        ));
        return None;
    }
    Some(root)
}

/// A small checkpoint as the kubelet's archive holds it.
fn checkpoint_tar(inventory: &[u8]) -> Vec<u8> {
    let mut t = Tar::new();
    t.dir("checkpoint")
        .file("checkpoint/inventory.img", inventory)
        .file("checkpoint/cuda-migrate-7.img", &image_bytes(7))
        .file("dump.log", b"(00.000000) Version: 4.2 (gitid 0)\n")
        .file("spec.dump", SPEC);
    t.finish()
}

/// What containerd did with one case.
struct Imported {
    rc: i32,
    err: String,
    ls: String,
    files: String,
    inventory: String,
}

fn read(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(name)).unwrap_or_default()
}

fn imported(dir: &Path, name: &str) -> Imported {
    Imported {
        rc: read(dir, &format!("{name}.rc")).trim().parse().unwrap_or(-1),
        err: read(dir, &format!("{name}.err")) + &read(dir, &format!("{name}.out")),
        ls: read(dir, &format!("{name}.ls")),
        files: read(dir, &format!("{name}.files")),
        inventory: read(dir, &format!("{name}.inventory")),
    }
}

/// ccm-archive's verdict on an oci-archive.
fn ours(path: &Path) -> Result<ccm_archive::CheckpointImage, ArchiveError> {
    match read_checkpoint_file(path, &Limits::default())? {
        CheckpointFile::Image(i) => Ok(i),
        CheckpointFile::Archive(a) => panic!("{}: read as a checkpoint archive: {a:?}", path.display()),
    }
}

#[test]
fn containerd_2_1_refuses_or_unpacks_otherwise_each_image_this_reader_refuses() {
    let Some(root) = forky_runtimes() else { return };
    let scratch = tempfile::Builder::new().prefix("ccm-oci-import-").tempdir().unwrap();
    let cases = scratch.path().join("cases");
    std::fs::create_dir(&cases).unwrap();

    let good = checkpoint_tar(b"checkpoint A");
    let other = checkpoint_tar(b"checkpoint B");
    let gz = Compression::Gzip;
    let plain = Compression::None;
    let image_of = |layer: &[u8], c, config: Vec<u8>| Parts::of(compress(layer, c), layer_type(c), config).image();
    let (_, parts) = Image::of(&good, gz);
    let mut all: Vec<(&str, Image)> = vec![
        ("good-gzip", Image::of(&good, gz).0),
        ("good-plain", Image::of(&good, plain).0),
        // Checkpoint B's layer under checkpoint A's diff_ids: alone, and on a node that has A's snapshot.
        ("diffid-other", image_of(&other, gz, config_of(&[&digest(&good)]))),
        ("diffid-other-on-a-node-with-it", image_of(&other, gz, config_of(&[&digest(&good)]))),
        ("diffids-empty", image_of(&good, gz, config_of(&[]))),
        ("config-array", image_of(&good, gz, b"[1,2,3]".to_vec())),
        (
            "config-array-of-a-rootfs",
            image_of(&good, gz, format!(r#"[{{"type":"layers","diff_ids":["{}"]}}]"#, digest(&good)).into_bytes()),
        ),
        ("config-empty-object", image_of(&good, gz, b"{}".to_vec())),
        (
            "manifest-with-manifests",
            Parts {
                manifest: format!(
                    r#"{{"schemaVersion":2,"mediaType":"{MANIFEST}","config":{},"layers":[{}],"manifests":[]}}"#,
                    descriptor(CONFIG, &parts.config),
                    descriptor(layer_type(gz), &parts.layer)
                )
                .into_bytes(),
                ..parts.clone()
            }
            .image(),
        ),
    ];
    let mut index_with_layers = parts.image();
    let nested_with_layers =
        format!(r#"{{"schemaVersion":2,"manifests":[{}],"layers":[]}}"#, descriptor(MANIFEST, &parts.manifest));
    index_with_layers.blob(nested_with_layers.as_bytes());
    index_with_layers.index = format!(
        r#"{{"schemaVersion":2,"manifests":[{}]}}"#,
        descriptor(INDEX, nested_with_layers.as_bytes()).trim_end_matches('}').to_string()
            + r#","annotations":{"org.opencontainers.image.ref.name":"ckpt"}}"#
    )
    .into_bytes();
    all.push(("nested-index-with-layers", index_with_layers));
    let mut lone = Tar::new();
    lone.dir("checkpoint").file("checkpoint/inventory.img", b"checkpoint A");
    let mut lone = lone.unfinished();
    lone.extend([0; 512]);
    let mut hidden = Tar::new();
    hidden.file("checkpoint/cuda-migrate-7.img", &image_bytes(7));
    lone.extend(hidden.finish());
    all.push(("lone-zero-block", image_of(&lone, gz, config_of(&[&digest(&lone)]))));
    let mut garbage = compress(&good, gz);
    garbage.extend(b"trailing garbage");
    all.push(("gzip-trailing-garbage", Parts::of(garbage, layer_type(gz), config_of(&[&digest(&good)])).image()));
    let mut wh = Tar::new();
    wh.dir("checkpoint")
        .file("checkpoint/inventory.img", b"checkpoint A")
        .file("checkpoint/cuda-migrate-7.img", &image_bytes(7))
        .file("checkpoint/.wh.cuda-migrate-7.img", b"");
    let wh = wh.finish();
    all.push(("whiteout", image_of(&wh, gz, config_of(&[&digest(&wh)]))));
    // The red team's layer (issue 41 part 3): a benign checkpoint/, then a `checkpoint -> evil` link.
    let mut swap = Tar::new();
    swap.dir("checkpoint")
        .file("checkpoint/inventory.img", b"checkpoint A")
        .file("checkpoint/cuda-migrate-7.img", &image_bytes(7))
        .dir("evil")
        .file("evil/inventory.img", b"evil");
    swap.link(tar::EntryType::Symlink, "checkpoint", "evil");
    let swap = swap.finish();
    all.push(("checkpoint-link-after-dir", image_of(&swap, gz, config_of(&[&digest(&swap)]))));
    // index.json → nested index (annotated) → manifest: containerd's image target is the nested index.
    let mut nested = parts.image();
    let inner = format!(
        r#"{{"schemaVersion":2,"mediaType":"{INDEX}","manifests":[{}],"annotations":{{"org.criu.checkpoint.container.name":"from-the-index"}}}}"#,
        descriptor(MANIFEST, &parts.manifest)
    );
    nested.blob(inner.as_bytes());
    nested.index = format!(
        r#"{{"schemaVersion":2,"manifests":[{}]}}"#,
        descriptor(INDEX, inner.as_bytes()).trim_end_matches('}').to_string()
            + r#","annotations":{"org.opencontainers.image.ref.name":"ckpt"}}"#
    )
    .into_bytes();
    all.push(("nested-target", nested));

    for (name, image) in &all {
        write(&cases, &format!("{name}.tar"), &image.archive());
    }
    // `index.json/` as a directory after the file.
    let image = Image::of(&good, gz).0;
    let mut t = Tar::new();
    t.dir("blobs").dir("blobs/sha256");
    for (hex, data) in &image.blobs {
        t.file(&format!("blobs/sha256/{hex}"), data);
    }
    t.file("index.json", &image.index).file("oci-layout", &image.layout).dir("index.json/");
    write(&cases, "index-json-dir.tar", &t.finish());
    std::fs::write(cases.join("diffid-other-on-a-node-with-it.first"), "good-plain").unwrap();

    let s = scratch.path().to_str().unwrap();
    let out = Command::new("bash")
        .arg(repo().join("tests/criu-root.sh"))
        .args(["run", "--bind", s, "--", "bash"])
        .arg(repo().join("tests/container/oci-import.sh"))
        .arg(s)
        .env_remove("CCM_RUNTIMES_ROOT")
        .env("CCM_CRIU_SUITE", "forky")
        .env("CCM_TRIXIE_ROOT", &root)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "oci-import.sh: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = scratch.path();
    assert_eq!(read(dir, "version.rc").trim(), "0", "containerd: {}", read(dir, "containerd.log"));
    assert!(read(dir, "version.out").contains("2.1"), "{}", read(dir, "version.out"));

    let mut names: Vec<String> = std::fs::read_dir(&cases)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.strip_suffix(".tar").map(str::to_string))
        .collect();
    names.sort();
    let mut table = String::new();
    for name in &names {
        let ctrd = imported(dir, name);
        let verdict = ours(&cases.join(format!("{name}.tar")));
        table += &format!(
            "{name}: containerd: rc {}, {}; ccm-archive: {}\n",
            ctrd.rc,
            ctrd.err.lines().filter(|l| !l.trim().is_empty()).collect::<Vec<_>>().join(" | "),
            match &verdict {
                Ok(_) => "accepted".to_string(),
                Err(e) => format!("refused: {e}"),
            }
        );
    }
    loud(&format!("containerd 2.1 and ccm-archive on the same checkpoint images:\n{table}"));
    let check = |name: &str, ok: bool, what: &str| {
        let verdict = ours(&cases.join(format!("{name}.tar")));
        assert_eq!(verdict.is_ok(), ok, "{name}: {what}: {:?}", verdict.err());
        imported(dir, name)
    };

    for name in ["good-gzip", "good-plain"] {
        let c = check(name, true, "a checkpoint image as buildah writes it");
        assert_eq!(c.rc, 0, "{name}: {}", c.err);
        assert!(c.files.contains("./checkpoint/cuda-migrate-7.img"), "{name}: {}", c.files);
        assert_eq!(c.inventory, "checkpoint A");
    }
    // containerd refuses these at the unpack, with these words.
    for (name, words) in [
        ("diffid-other", "wrong diff id calculated on extraction"),
        ("diffids-empty", "mismatched image rootfs and manifest layers"),
        ("config-array", "cannot unmarshal array"),
        ("config-array-of-a-rootfs", "cannot unmarshal array"),
        ("config-empty-object", "mismatched image rootfs and manifest layers"),
        ("manifest-with-manifests", "expected manifest but found index"),
        ("nested-index-with-layers", "expected index but found manifest"),
        ("lone-zero-block", "invalid tar header"),
        ("gzip-trailing-garbage", "gzip: invalid header"),
    ] {
        let c = check(name, false, words);
        assert!(c.rc != 0 && c.err.contains(words), "{name}: containerd: rc {}: {}", c.rc, c.err);
    }
    // containerd takes these, and what it unpacks is not what the layer's tar names.
    let first = imported(dir, "diffid-other-on-a-node-with-it.first");
    assert_eq!(first.rc, 0, "{}", first.err);
    let c = check("diffid-other-on-a-node-with-it", false, "diff_ids naming a snapshot the node has");
    assert_eq!(c.rc, 0, "containerd skips the unpack where the snapshot exists: {}", c.err);
    assert_eq!(c.inventory, "checkpoint A", "containerd's snapshot is checkpoint A's, the layer holds B's");
    let c = check("checkpoint-link-after-dir", false, "a checkpoint link replacing the checkpoint directory");
    assert_eq!(c.rc, 0, "{}", c.err);
    assert_eq!(c.inventory, "evil", "containerd's unpack put the link in the directory's place: {}", c.files);
    let c = check("whiteout", false, "a whiteout");
    assert_eq!(c.rc, 0, "{}", c.err);
    assert!(!c.files.contains("cuda-migrate-7.img"), "the whiteout deleted the image at unpack: {}", c.files);
    // containerd's importer reads the file and skips directory members; GNU tar's extraction replaces the file
    // with the directory (images.rs): the readers disagree, and this one refuses.
    let c = check("index-json-dir", false, "a directory named index.json after the file");
    assert_eq!(c.rc, 0, "{}", c.err);
    // The nested target: containerd's image is the nested index (whose annotations it reads for the checkpoint).
    let c = check("nested-target", true, "index.json → nested index → manifest");
    assert_eq!(c.rc, 0, "{}", c.err);
    let i = ours(&cases.join("nested-target.tar")).unwrap();
    let target_line = c.ls.lines().find(|l| l.contains("ckpt")).unwrap_or_default().to_string();
    assert!(
        target_line.contains(INDEX) && target_line.contains(&i.target_digest),
        "containerd's target is the nested index {}: {}",
        i.target_digest,
        c.ls
    );
    assert_eq!(i.target_annotations.get("org.criu.checkpoint.container.name").unwrap(), "from-the-index");
}
