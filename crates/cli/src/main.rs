//! `criu-cuda-migrate`: inspect a checkpoint's GPU identity, preflight this node for a restore,
//! list this node's GPUs, recover a process a failed run left LOCKED or CHECKPOINTED, and serve
//! as CRIU's action script (the restored network namespace's loopback, which runc leaves down).
//!
//! One rule for exit codes: 0 success; 1 a refusal (preflight refused, recover could not bring the
//! process back, `node --check` found the node not ready); 2 bad usage or unreadable input (an unknown option, a malformed value, a missing
//! or damaged checkpoint, no NVIDIA driver for `node` or `recover`). Under `--json` every outcome,
//! a failure included, is one JSON document on stdout.

#![forbid(unsafe_code)]

// First: its println!/eprintln! (escaping every foreign character) are the ones every module after it uses.
#[macro_use]
mod out;
mod job;
mod readiness;
mod recover;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use ccm_driver::nvml::Nvml;
use ccm_engine::config::{parse_device_map, Sourced};
use ccm_engine::preflight::{self, FreeMemoryError, MemoryVerdict, NodeView};
use ccm_engine::Config;
use ccm_identity::claims::DeviceClaims;
use ccm_identity::image::IdentityImage;
use ccm_identity::map::UsableGpus;
use ccm_identity::{GpuIdentity, GpuUuid};
use ccm_process::dir::{Dir, FileError};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "criu-cuda-migrate",
    version,
    about = "Inspect CUDA checkpoints made with the criu-cuda-migrate CRIU plugin and preflight a node for their restore"
)]
struct Cli {
    /// Print machine-readable JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show the identity images of a checkpoint: GPUs used and enumerated, environment, PCI sites.
    Inspect {
        /// CRIU's image directory (`criu dump -D DIR`), a checkpoint archive as Podman exports it or the kubelet
        /// writes it (a tar: plain, gzip or zstd), or a checkpoint image (an OCI layout directory or an
        /// oci-archive, as buildah and skopeo write them), read without unpacking it.
        checkpoint: PathBuf,
        #[command(flatten)]
        archive: ArchiveArgs,
    },
    /// Run the restore's checks against this node and print the device map a restore would use.
    Preflight {
        /// CRIU's image directory (`criu dump -D DIR`) as it will be restored, a checkpoint archive or a checkpoint
        /// image (as for `inspect`).
        checkpoint: PathBuf,
        #[command(flatten)]
        archive: ArchiveArgs,
        /// Explicit map `OLD=NEW,...` of GPU UUIDs (default: $CRIU_CUDA_MIGRATE_DEVICE_MAP).
        #[arg(long)]
        device_map: Option<String>,
        /// GPUs the restore may use, UUIDs or NVML indices (default: $CRIU_CUDA_MIGRATE_USABLE_GPUS).
        #[arg(long)]
        usable_gpus: Option<String>,
        /// The container bundle the restore will use: without --usable-gpus, the GPUs its config.json gives the
        /// container, as a runc or crun restore gives them.
        #[arg(long)]
        bundle: Option<PathBuf>,
    },
    /// List the GPUs NVML sees on this node; with --check, check whether this node is ready for GPU
    /// checkpoint/restore.
    Node(readiness::NodeArgs),
    /// Can this process tree be checkpointed and restored now? Each process's CUDA use, its GPUs and device
    /// memory, whether it has another process's device memory open (a CUDA IPC importer, which driver 580 cannot
    /// restore), and the verdict the plugin would give, in its words. Exit 0: a dump would go ahead; 1: it would
    /// be refused. Run as root on the node, before `criu dump` or the kubelet's checkpoint API.
    Job {
        /// The tree's first process (for a container: its init's pid on this host).
        #[arg(long)]
        pid: i32,
        /// The CRIU that will dump the tree (its version decides what it can dump on this kernel); default: `criu`
        /// on PATH.
        #[arg(long, value_name = "PATH")]
        criu: Option<std::path::PathBuf>,
    },
    /// Run a command (and everything it starts) without io_uring, which CRIU cannot checkpoint: torchrun's elastic
    /// agent makes one for its rendezvous store whatever torchrun is told. A seccomp filter answers
    /// `io_uring_setup` with ENOSYS (libuv then uses epoll); the job runs as before and can be checkpointed.
    /// `criu-cuda-migrate no-io-uring -- torchrun --standalone --nproc-per-node 8 train.py`
    NoIoUring {
        /// The command and its arguments.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true, value_name = "COMMAND")]
        command: Vec<std::ffi::OsString>,
    },
    /// Bring a process left LOCKED or CHECKPOINTED back to RUNNING (restore onto the same GPUs, then unlock).
    Recover {
        /// The process's pid (as `ps` shows it on this host).
        #[arg(long)]
        pid: i32,
        /// The dump's image directory, for a process whose device memory went to the page file there through the
        /// driver's custom storage (CUDA 13.4): it is restored from that file (the plugin's ERROR line names it).
        #[arg(long, value_name = "DIR")]
        images: Option<PathBuf>,
    },
    /// CRIU's action script for runc: brings a restored network namespace's loopback up (run by CRIU, not by hand)
    ///
    /// CRIU runs it when `action-script /usr/lib/criu-cuda-migrate/action-script` is in its configuration file
    /// (criu-cuda-migrate(1)). At a restore's setup-namespaces it brings the loopback interface of the restored
    /// network namespace up, which runc leaves down, so that TCP connections on 127.0.0.1 restored with
    /// --tcp-established can come back; at every other action it does nothing. It reads CRTOOLS_SCRIPT_ACTION and
    /// CRTOOLS_INIT_PID from CRIU, prints nothing when it succeeds and takes no options: CRIU reads only its exit
    /// status, so --json does not apply here (it is accepted and ignored).
    ActionScript {
        /// The global --json, hidden and ignored here: CRIU reads only the exit status.
        #[arg(long, hide = true)]
        json: bool,
    },
}

/// Bounds of an archive read (the archive is untrusted: a compressed bomb must end).
#[derive(clap::Args)]
struct ArchiveArgs {
    /// Stop reading an archive after this many GiB of tar data (after decompression); a checkpoint's size is about
    /// its processes' memory.
    #[arg(long, value_name = "GIB", default_value_t = ccm_archive::DEFAULT_MAX_SCANNED_BYTES >> 30)]
    archive_scan_gib: u64,
}

impl ArchiveArgs {
    fn limits(&self) -> ccm_archive::Limits {
        ccm_archive::Limits {
            max_scanned_bytes: self.archive_scan_gib.saturating_mul(1 << 30),
            ..ccm_archive::Limits::default()
        }
    }
}

/// How a command failed, and so its exit code.
#[derive(Debug)]
enum Failure {
    /// Bad usage or unreadable input (exit 2).
    Input(String),
    /// The check refused (exit 1).
    Refused(String),
}

impl Failure {
    fn code(&self) -> u8 {
        match self {
            Failure::Input(_) => 2,
            Failure::Refused(_) => 1,
        }
    }
    fn text(&self) -> &str {
        match self {
            Failure::Input(t) | Failure::Refused(t) => t,
        }
    }
}

type CliResult = Result<(), Failure>;

fn input(e: impl std::fmt::Display) -> Failure {
    Failure::Input(e.to_string())
}

/// `no-io-uring -- COMMAND...`: the filter, then the command in this process's place (it returns only on failure).
fn no_io_uring(command: &[std::ffi::OsString]) -> CliResult {
    use std::os::unix::process::CommandExt;
    let (program, args) = command.split_first().ok_or_else(|| Failure::Input("no command given".into()))?;
    ccm_process::seccomp::deny_io_uring()
        .map_err(|e| Failure::Refused(format!("the seccomp filter against io_uring cannot be installed: {e}")))?;
    let e = std::process::Command::new(program).args(args).exec();
    Err(Failure::Input(format!("{}: {e}", program.to_string_lossy())))
}

fn main() -> ExitCode {
    out::init_logger();
    // Clap's own usage errors exit 2, as ours do.
    let cli = Cli::parse();
    // CRIU reads only the action script's exit status; its messages go to CRIU's log as plain lines.
    let json = cli.json && !matches!(cli.command, Command::ActionScript { .. });
    out::set_json(json);
    let (name, r) = match &cli.command {
        Command::Inspect { checkpoint, archive } => ("inspect", inspect(checkpoint, archive, json)),
        Command::Preflight { checkpoint, archive, device_map, usable_gpus, bundle } => (
            "preflight",
            run_preflight(checkpoint, archive, device_map.as_deref(), usable_gpus.as_deref(), bundle.as_deref(), json),
        ),
        Command::Node(a) if a.check => ("node", readiness::run(a, json)),
        Command::Node(_) => ("node", node(json)),
        Command::Job { pid, criu } => ("job", job::run(*pid, criu.as_deref(), json)),
        Command::Recover { pid, images } => ("recover", recover::run(*pid, images.as_deref(), json)),
        Command::NoIoUring { command } => ("no-io-uring", no_io_uring(command)),
        Command::ActionScript { .. } => ("action-script", action_script()),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            if json {
                let mut doc = serde_json::json!({"ok": false, "error": f.text(), "exit_code": f.code()});
                // A refused preflight still says what the checkpoint needs.
                if let Some(needs) = REFUSED_NEEDS.get() {
                    doc["needs"] = needs.clone();
                }
                println!("{doc}");
            } else if name == "preflight" && matches!(f, Failure::Refused(_)) {
                println!("preflight refused: {}", f.text());
            } else {
                eprintln!("criu-cuda-migrate {name}: {}", f.text());
            }
            ExitCode::from(f.code())
        }
    }
}

/// `preflight --json`: what the checkpoint needs, for the document of a refusal too.
static REFUSED_NEEDS: std::sync::OnceLock<serde_json::Value> = std::sync::OnceLock::new();

/// A checkpoint as the commands read it: its identity images and the restore reports beside them.
struct Checkpoint {
    shown: String,
    images: Vec<(PathBuf, IdentityImage)>,
    reports: Vec<(String, String)>,
    /// Whether CRIU's `inventory.img` is there (a regular file), which CRIU writes when a dump
    /// completes: without it this is no checkpoint, or a cut one.
    has_inventory: bool,
    /// Where the checkpoint came from an archive: what else the archive told.
    archive: Option<ArchiveFacts>,
    /// The dumping CRIU's version and where it was read (`dump.log`), where the checkpoint has it.
    criu_version: Option<(String, String)>,
    /// What the dump claimed of forked processes' NVIDIA nodes (`cuda-migrate-devices.img`).
    claims: Option<DeviceClaims>,
}

/// The refusal of what is no complete checkpoint (no `inventory.img`): `preflight` refuses it, and
/// `inspect` too when it holds no identity image either (an empty directory, `/etc`).
fn not_a_checkpoint(c: &Checkpoint) -> Failure {
    Failure::Input(if c.archive.is_some() {
        format!(
            "{} has no checkpoint/inventory.img, which CRIU writes when a dump completes: it is a cut or partial \
             checkpoint that no restore can use; export the checkpoint again",
            c.shown
        )
    } else {
        format!(
            "{} has no inventory.img, which CRIU writes when a dump completes: it is no CRIU checkpoint, or a cut or \
             partial one that no restore can use; pass the image directory of a completed `criu dump -D DIR`, or dump \
             again",
            c.shown
        )
    })
}

/// What an archive holds besides the identity images and reports.
struct ArchiveFacts {
    compression: ccm_archive::Compression,
    members: usize,
    bytes_scanned: u64,
    has_inventory: bool,
    /// `spec.dump`: the DUMPED container's OCI spec (member name, text).
    spec: Option<(String, String)>,
    /// Where the archive is the layer of a checkpoint image: the image.
    image: Option<ImageFacts>,
}

/// A checkpoint image around the archive (its layer).
struct ImageFacts {
    format: ccm_archive::ImageFormat,
    manifest_digest: String,
    layer_digest: String,
    layer_media_type: String,
    layer_size: u64,
    /// Tags and annotations, escaped.
    ref_names: Vec<String>,
    annotations: Vec<(String, String)>,
    /// The blob containerd takes for the image (index.json's entry: the manifest or a nested index) and its own
    /// annotations, escaped: where containerd looks for its checkpoint annotation.
    target_digest: String,
    target_annotations: Vec<(String, String)>,
}

/// Largest restore report read (the plugin writes a few KiB).
const MAX_REPORT_BYTES: u64 = 1 << 20;

/// What `inspect` and `preflight` take, for the hint of a path they cannot read.
const CHECKPOINT_KINDS: &str = "pass CRIU's image directory (the -D of `criu dump`), a checkpoint archive (as \
     `podman container checkpoint --export` or the kubelet writes it: a tar, plain, gzip or zstd) or a checkpoint \
     image (an OCI layout directory or an oci-archive)";

fn open_image_dir(dir: &Path) -> Result<Dir, Failure> {
    Dir::open(dir).map_err(|e| match e {
        FileError::Missing { .. } => Failure::Input(format!("{} does not exist; {CHECKPOINT_KINDS}", dir.display())),
        FileError::NotRegular { .. } => {
            Failure::Input(format!("{} is not a directory; {CHECKPOINT_KINDS}", dir.display()))
        }
        e => input(e),
    })
}

/// Reads a CRIU image directory: every identity image (relative to the directory's fd, never
/// through a link, capped) and the restore reports, with any control character but the line
/// breaks escaped.
fn load_checkpoint(path: &Path, limits: &ccm_archive::Limits) -> Result<Checkpoint, Failure> {
    // A file is an archive or an oci-archive; a directory with `oci-layout` an OCI image layout; anything else is
    // read as an image directory (whose open says what is wrong).
    if std::fs::metadata(path).is_ok_and(|m| !m.is_dir()) {
        return load_archive(path, limits);
    }
    if ccm_archive::is_image_layout(path) {
        let image = ccm_archive::read_image_layout(path, limits).map_err(|e| archive_failure(e, path))?;
        return checkpoint_of_image(path, image);
    }
    load_image_dir(path)
}

/// An archive's error, with the hint of what to do where the error alone does not say it.
fn archive_failure(e: ccm_archive::ArchiveError, path: &Path) -> Failure {
    match &e {
        ccm_archive::ArchiveError::ScanLimit { .. } => {
            Failure::Input(format!("{e} (--archive-scan-gib N raises it to N GiB)"))
        }
        // The file given is no tar at all (not a layer inside an image, which names its blob): say what is taken.
        ccm_archive::ArchiveError::NotTar { archive, .. }
            if *archive == ccm_identity::text::escaped(&path.display().to_string()) =>
        {
            Failure::Input(format!("{e}; {CHECKPOINT_KINDS}"))
        }
        _ => input(e),
    }
}

/// A checkpoint image: its layer read as an archive, and what the image says around it.
fn checkpoint_of_image(path: &Path, image: ccm_archive::CheckpointImage) -> Result<Checkpoint, Failure> {
    let esc = |t: &str| ccm_identity::text::escaped(t);
    let facts = ImageFacts {
        format: image.format,
        manifest_digest: image.manifest_digest.clone(),
        layer_digest: image.layer_digest.clone(),
        layer_media_type: esc(&image.layer_media_type),
        layer_size: image.layer_size,
        ref_names: image.ref_names.iter().map(|r| esc(r)).collect(),
        annotations: image.annotations.iter().map(|(k, v)| (esc(k), esc(v))).collect(),
        target_digest: image.target_digest.clone(),
        target_annotations: image.target_annotations.iter().map(|(k, v)| (esc(k), esc(v))).collect(),
    };
    let mut c = checkpoint_of_archive(path, &image.checkpoint)?;
    if let Some(a) = &mut c.archive {
        a.image = Some(facts);
    }
    Ok(c)
}

/// Lines of an untrusted text, with any control character but the line breaks escaped.
fn shown_text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).lines().map(ccm_identity::text::escaped).collect::<Vec<_>>().join("\n")
}

/// Reads a checkpoint archive (streamed, bounded, never unpacked: see `ccm_archive`) and decodes its
/// identity images by the rules of a directory's.
fn load_archive(path: &Path, limits: &ccm_archive::Limits) -> Result<Checkpoint, Failure> {
    match ccm_archive::read_checkpoint_file(path, limits).map_err(|e| archive_failure(e, path))? {
        ccm_archive::CheckpointFile::Archive(a) => checkpoint_of_archive(path, &a),
        ccm_archive::CheckpointFile::Image(i) => checkpoint_of_image(path, i),
    }
}

/// The identity images of an archive (or of an image's layer), decoded by the rules of a directory's.
fn checkpoint_of_archive(path: &Path, a: &ccm_archive::CheckpointArchive) -> Result<Checkpoint, Failure> {
    let shown = path.display().to_string();
    let mut images = Vec::new();
    for f in &a.images {
        let member = PathBuf::from(format!("{shown}:{}", ccm_identity::text::escaped(&f.member)));
        images.push((member.clone(), preflight::decode_image(member, &f.name, &f.bytes).map_err(input)?));
    }
    images.sort_by_key(|(_, i)| i.pid);
    // A process's page file (issue 47): there, of the size its table names, before any restore.
    for (member, img) in &images {
        let Some(t) = img.page_table() else { continue };
        let name = ccm_identity::staging::page_file_name(img.pid);
        let why = match a.page_files.iter().find(|(n, _)| *n == name) {
            Some((_, size)) if *size == t.file_bytes => continue,
            Some((_, size)) => format!("it is {size} bytes where the table names {}", t.file_bytes),
            None => "it is not in the archive".to_string(),
        };
        return Err(input(preflight::ImageFileError::PageFile {
            image: member.clone(),
            page_file: PathBuf::from(format!("{shown}:checkpoint/{name}")),
            why,
        }));
    }
    let reports = a.reports.iter().map(|f| (f.name.clone(), shown_text(&f.bytes))).collect();
    let has_inventory = a.has_inventory;
    let claims = match &a.claims {
        Some(f) => Some(
            DeviceClaims::decode(&f.bytes)
                .map_err(|e| Failure::Input(format!("{shown}:{}: {e}", ccm_identity::text::escaped(&f.member))))?,
        ),
        None => None,
    };
    let spec = a.spec.as_ref().map(|f| (f.member.clone(), String::from_utf8_lossy(&f.bytes).into_owned()));
    Ok(Checkpoint {
        shown,
        images,
        reports,
        has_inventory,
        archive: Some(ArchiveFacts {
            compression: a.compression,
            members: a.members,
            bytes_scanned: a.bytes_scanned,
            has_inventory: a.has_inventory,
            spec,
            image: None,
        }),
        criu_version: a.criu_version.as_ref().map(|(v, m)| (v.clone(), ccm_identity::text::escaped(m))),
        claims,
    })
}

/// The GPUs a dumped container's spec gave it, on the dump node (whose GPUs the images record).
fn dumped_container_gpus(spec: &str, images: &[(PathBuf, IdentityImage)]) -> String {
    let Some((_, img)) = images.first() else { return "(no identity image to name the dump node's GPUs)".into() };
    match ccm_settings::spec::gpus_given_by_spec(spec, &img.node_gpus) {
        Ok(Some(g)) => {
            format!("{} ({})", g.uuids.iter().map(|u| u.to_string()).collect::<Vec<_>>().join(", "), g.source)
        }
        Ok(None) => "not limited by the spec (every GPU of the node)".into(),
        Err(e) => format!("(cannot tell: the spec {e})"),
    }
}

fn load_image_dir(dir: &Path) -> Result<Checkpoint, Failure> {
    let d = open_image_dir(dir)?;
    let images = preflight::read_images(&d).map_err(input)?;
    let mut reports = Vec::new();
    for name in d.names().map_err(input)? {
        let Some(name) = name.to_str() else { continue };
        if ccm_identity::image::is_report_file_name(name).is_none() {
            continue;
        }
        let text = match d.read_file(name, MAX_REPORT_BYTES) {
            Ok(b) => shown_text(&b),
            Err(e) => format!("(not read: {e})"),
        };
        reports.push((name.to_string(), text));
    }
    reports.sort();
    let has_inventory =
        matches!(d.kind_of("inventory.img").map_err(input)?, Some(ccm_process::dir::EntryKind::Regular));
    let criu_version = dir_criu_version(&d);
    let claims = ccm_engine::claims::read_claims(&d).map_err(input)?;
    Ok(Checkpoint {
        shown: dir.display().to_string(),
        images,
        reports,
        has_inventory,
        archive: None,
        criu_version,
        claims,
    })
}

/// The dumping CRIU's version from the first 16 KiB of the directory's `dump.log` (`criu dump -o dump.log`,
/// which runc and containerd use), read as any file there: not through a link, capped.
fn dir_criu_version(d: &Dir) -> Option<(String, String)> {
    use std::io::Read;
    let (file, _) = d.open_file("dump.log").ok()?;
    let mut head = Vec::new();
    file.take(16 * 1024).read_to_end(&mut head).ok()?;
    let text = String::from_utf8_lossy(&head);
    let line = text.lines().find(|l| l.contains(") Version: "))?;
    let version = line.split("Version: ").nth(1)?.split_whitespace().next()?;
    let ok = version.len() <= 32
        && version.bytes().next().is_some_and(|b| b.is_ascii_digit())
        && version.bytes().all(|b| b.is_ascii_digit() || b == b'.');
    ok.then(|| (version.to_string(), ccm_identity::text::escaped(&d.shown_file("dump.log").display().to_string())))
}

/// What restoring this checkpoint asks of a node, from the identity images (and the dump's log): the document's
/// `needs` object of `inspect --json` and `preflight --json`.
fn needs(c: &Checkpoint) -> serde_json::Value {
    use std::collections::BTreeSet;
    // The GPUs the processes used, in first-seen order, with the device memory recorded on each.
    let mut gpus: Vec<(GpuUuid, String, u64, Option<u64>)> = Vec::new();
    let mut memory_recorded = true;
    for (_, img) in &c.images {
        let mut add = |u: &GpuUuid, bytes: u64| {
            let at = match gpus.iter().position(|g| g.0 == *u) {
                Some(at) => at,
                None => {
                    let (name, total) = img.gpu(u).map(|g| (g.name.clone(), g.memory_total)).unwrap_or_default();
                    gpus.push((*u, name, total, Some(0)));
                    gpus.len() - 1
                }
            };
            if let Some(b) = &mut gpus[at].3 {
                *b += bytes;
            }
        };
        for u in &img.used {
            add(u, 0);
        }
        match &img.device_memory {
            Some(uses) => uses.iter().for_each(|m| add(&m.gpu, m.bytes)),
            None => memory_recorded = false,
        }
    }
    if !memory_recorded {
        gpus.iter_mut().for_each(|g| g.3 = None);
    }
    let models: BTreeSet<&str> = gpus.iter().map(|g| g.1.as_str()).collect();
    let drivers: BTreeSet<&str> = c.images.iter().map(|(_, i)| i.driver_version.as_str()).collect();
    let branches: BTreeSet<&str> = drivers.iter().map(|d| d.split('.').next().unwrap_or(d)).collect();
    let cuda: BTreeSet<i32> = c.images.iter().map(|(_, i)| i.cuda_driver_version).collect();
    let one_or_list = |set: Vec<serde_json::Value>| match set.len() {
        0 => serde_json::Value::Null,
        1 => set.into_iter().next().unwrap_or_default(),
        _ => serde_json::Value::Array(set),
    };
    serde_json::json!({
        "cuda_processes": c.images.len(),
        "gpu_count": gpus.len(),
        "models": models,
        "gpus": gpus.iter().map(|(u, name, total, bytes)| serde_json::json!({
            "dump_gpu": u.to_string(),
            "model": name,
            "memory_total_bytes": total,
            "device_memory_bytes": bytes,
        })).collect::<Vec<_>>(),
        "memory_per_gpu_bytes": if memory_recorded {
            serde_json::json!(gpus.iter().map(|g| g.3.unwrap_or(0)).max().unwrap_or(0))
        } else {
            serde_json::Value::Null
        },
        "memory_recorded": memory_recorded || c.images.is_empty(),
        "driver": {
            "version_at_dump": one_or_list(drivers.iter().map(|d| serde_json::json!(d)).collect()),
            "cuda_driver_version_at_dump": one_or_list(cuda.iter().map(|v| serde_json::json!(v)).collect()),
            "branch": one_or_list(branches.iter().map(|b| serde_json::json!(b)).collect()),
            "rule": "a driver of the same branch on the target node, with GPUs of the same models (the driver's \
                     checkpoint restores onto its own branch and refuses a map between different chips)",
        },
        "criu": {
            "version_at_dump": c.criu_version.as_ref().map(|(v, _)| v),
            "version_read_from": c.criu_version.as_ref().map(|(_, m)| m),
            "criu_version_matters": false,
            "reason": "the identity images do not depend on CRIU's version, and CRIU reads images by their own \
                       format version (inventory.img); the restoring CRIU must be 4.0 or later (the plugin's hooks)",
        },
    })
}

/// The JSON of a checkpoint image around an archive.
fn image_json(i: &ImageFacts) -> serde_json::Value {
    let ann = |k: &str| i.annotations.iter().find(|(key, _)| key == k).map(|(_, v)| v.clone());
    let target = |k: &str| i.target_annotations.iter().find(|(key, _)| key == k).map(|(_, v)| v.clone());
    serde_json::json!({
        "format": i.format.to_string(),
        "manifest_digest": i.manifest_digest,
        "ref_names": i.ref_names,
        "layer_digest": i.layer_digest,
        "layer_media_type": i.layer_media_type,
        "layer_size": i.layer_size,
        "digests_verified": true,
        "annotations": i.annotations.iter().cloned().collect::<std::collections::BTreeMap<_, _>>(),
        "target_digest": i.target_digest,
        "target_annotations": i.target_annotations.iter().cloned().collect::<std::collections::BTreeMap<_, _>>(),
        "checkpoint_name_cri_o": ann(ccm_archive::oci::CRIO_CHECKPOINT_ANNOTATION),
        "checkpoint_name_containerd": target(ccm_archive::oci::CONTAINERD_CHECKPOINT_ANNOTATION),
    })
}

/// What each runtime makes of an image's annotations: containerd reads its target's (index.json's entry), CRI-O
/// the manifest's.
fn image_runtime_notes(i: &ImageFacts) -> Vec<String> {
    let has = |of: &[(String, String)], k: &str| of.iter().any(|(key, _)| key == k);
    let mut notes = Vec::new();
    for (key, runtime, of) in [
        (ccm_archive::oci::CONTAINERD_CHECKPOINT_ANNOTATION, "containerd 2.x", &i.target_annotations),
        (ccm_archive::oci::CRIO_CHECKPOINT_ANNOTATION, "CRI-O", &i.annotations),
    ] {
        notes.push(if has(of, key) {
            format!("{runtime} restores from it (annotation {key})")
        } else {
            format!("{runtime} takes it for a plain image, not a checkpoint: it lacks the annotation {key}")
        });
    }
    if i.target_digest != i.manifest_digest {
        notes.push(format!(
            "containerd reads the annotations of the index {} that index.json names, not the manifest's",
            i.target_digest
        ));
    }
    notes
}

fn inspect(path: &Path, limits: &ArchiveArgs, json: bool) -> CliResult {
    let c = load_checkpoint(path, &limits.limits())?;
    if !c.has_inventory && c.images.is_empty() {
        return Err(not_a_checkpoint(&c));
    }
    if json {
        let mut v = serde_json::json!({
            "dir": c.shown,
            "has_inventory": c.has_inventory,
            "processes": c.images.iter().map(|(_, i)| i).collect::<Vec<_>>(),
            "forked_holders": c.claims.as_ref().map(|cl| &cl.holders),
            "claimed_files": c.claims.as_ref().map(|cl| &cl.files),
            "restore_reports": c.reports,
        });
        if let Some(a) = &c.archive {
            v["archive"] = serde_json::json!({
                "compression": a.compression.to_string(),
                "members": a.members,
                "bytes_scanned": a.bytes_scanned,
                "has_inventory": a.has_inventory,
                "spec_member": a.spec.as_ref().map(|(m, _)| ccm_identity::text::escaped(m)),
                "dumped_container_gpus": a.spec.as_ref().map(|(_, t)| dumped_container_gpus(t, &c.images)),
            });
            if let Some(i) = &a.image {
                v["image"] = image_json(i);
            }
        }
        v["page_files"] = c
            .images
            .iter()
            .filter_map(|(_, i)| Some((i.pid, i.page_table()?, i.driver_storage.is_some())))
            .map(|(pid, t, custom)| {
                serde_json::json!({
                    "pid": pid,
                    "name": ccm_identity::staging::page_file_name(pid),
                    "written_by": if custom { "driver custom storage" } else { "staging pages" },
                    "bytes": t.file_bytes,
                    "regions": t.regions.len(),
                    "region_bytes": t.region_bytes(),
                    "chunk_bytes": t.chunk_bytes,
                    "chunks": t.chunk_count(),
                    "holes": t.holes(),
                })
            })
            .collect::<Vec<_>>()
            .into();
        v["needs"] = needs(&c);
        println!("{}", serde_json::to_string_pretty(&v).map_err(input)?);
        return Ok(());
    }
    if let Some(i) = c.archive.as_ref().and_then(|a| a.image.as_ref()) {
        println!(
            "{}: checkpoint image ({}{}), manifest {}, its one layer {} ({}, {} bytes); every digest verified",
            c.shown,
            i.format,
            if i.ref_names.is_empty() { String::new() } else { format!(", tagged {}", i.ref_names.join(", ")) },
            i.manifest_digest,
            i.layer_digest,
            i.layer_media_type,
            i.layer_size
        );
        for note in image_runtime_notes(i) {
            println!("  {note}");
        }
    }
    if let Some(a) = &c.archive {
        println!(
            "{}{}: checkpoint archive ({} compression, {} members, {} MiB of tar read{})",
            c.shown,
            if a.image.is_some() { " (its layer)" } else { "" },
            a.compression,
            a.members,
            a.bytes_scanned >> 20,
            if a.has_inventory { "" } else { "; NO checkpoint/inventory.img: the dump did not complete" }
        );
        if let Some((member, text)) = &a.spec {
            println!(
                "  {}: the dumped container's GPUs: {}",
                ccm_identity::text::escaped(member),
                dumped_container_gpus(text, &c.images)
            );
        }
    }
    if let Some((version, from)) = &c.criu_version {
        println!("{}: dumped by CRIU {version} ({from})", c.shown);
    }
    if c.archive.is_none() && !c.has_inventory {
        println!("{}: NO inventory.img: the dump did not complete, and no restore can use this directory", c.shown);
    }
    if let Some(cl) = &c.claims {
        println!(
            "{}: {} process(es) without a CUDA context holding NVIDIA nodes (forked after CUDA init), claimed by the \
             plugin ({}, {} open file(s)):",
            c.shown,
            cl.holders.len(),
            ccm_identity::claims::CLAIMS_FILE_NAME,
            cl.files.len()
        );
        for line in cl.summary_lines() {
            println!("  {line}");
        }
    }
    if c.images.is_empty() {
        println!("{}: no criu-cuda-migrate identity images (no CUDA process was dumped with the plugin)", c.shown);
        return Ok(());
    }
    for (path, img) in &c.images {
        println!("{}", path.display());
        println!(
            "  pid {} (host pid {}), dumped on {} with driver {} (CUDA {}.{})",
            img.pid,
            img.host_pid,
            img.hostname,
            img.driver_version,
            img.cuda_driver_version / 1000,
            (img.cuda_driver_version % 1000) / 10
        );
        println!(
            "  {:<8} {:<42} {:<14} {:<22} {:>9} {:>6} {:>6} {:>9}",
            "role", "GPU", "PCI", "name", "MiB", "sites", "props", "held MiB"
        );
        for g in &img.node_gpus {
            let role = if let Some(i) = img.used.iter().position(|u| *u == g.uuid) {
                format!("cuda:{i}")
            } else if img.enumerated.contains(&g.uuid) {
                "enum".to_string()
            } else {
                "-".to_string()
            };
            let sites = img.sites.iter().filter(|s| s.gpu == g.uuid).count();
            let props = img.prop_sites.iter().filter(|s| s.gpu == g.uuid).count();
            // Device memory the process held there at dump ("?": not recorded).
            let held = match &img.device_memory {
                Some(uses) => (uses.iter().filter(|u| u.gpu == g.uuid).map(|u| u.bytes).sum::<u64>() >> 20).to_string(),
                None => "?".into(),
            };
            println!(
                "  {:<8} {:<42} {:<14} {:<22} {:>9} {:>6} {:>6} {:>9}",
                role,
                g.uuid.to_string(),
                g.pci.to_string(),
                g.name,
                g.memory_total >> 20,
                sites,
                props,
                held
            );
        }
        if let Some(t) = &img.staging {
            println!("  {}", staging_line(img.pid, t));
        }
        if let Some(d) = &img.driver_storage {
            println!("  {}", driver_storage_line(img.pid, d));
        }
        let env = &img.env;
        for (k, v) in [
            ("CUDA_VISIBLE_DEVICES", &env.cuda_visible_devices),
            ("CUDA_DEVICE_ORDER", &env.cuda_device_order),
            ("NVIDIA_VISIBLE_DEVICES", &env.nvidia_visible_devices),
        ] {
            if let Some(v) = v {
                println!("  {k}={v}");
            }
        }
    }
    for (name, text) in &c.reports {
        println!("\n{name}:\n{text}");
    }
    Ok(())
}

/// The line `inspect` prints for a process whose staging pages the plugin wrote (issue 47): its page file, checked
/// whole when the checkpoint was read (there, and of the size its table names), and what the table holds.
fn staging_line(pid: u32, t: &ccm_identity::staging::StagingTable) -> String {
    let mib = |b: u64| format!("{:.1} MiB", b as f64 / f64::from(1u32 << 20));
    let holes = t.holes();
    format!(
        "staging pages: the driver's {} in {} region(s), written by the plugin to {} ({}, its size checked); {} \
         chunk(s) of {}, {holes} of them all zero and left out as holes ({} not written), each written chunk with its \
         CRC-32",
        mib(t.region_bytes()),
        t.regions.len(),
        ccm_identity::staging::page_file_name(pid),
        mib(t.file_bytes),
        t.chunk_count(),
        mib(t.chunk_bytes),
        mib(t.region_bytes().saturating_sub(t.file_bytes)),
    )
}

/// The line `inspect` prints for a process whose device memory the driver agent copied through the driver's custom
/// storage (CUDA 13.4).
fn driver_storage_line(pid: u32, d: &ccm_identity::staging::DriverStorage) -> String {
    let mib = |b: u64| format!("{:.1} MiB", b as f64 / f64::from(1u32 << 20));
    let t = &d.table;
    format!(
        "device memory: {} in {} GPU region(s), copied by the driver agent through the driver's custom storage (CUDA \
         13.4) to {} ({}, its size checked); {} chunk(s) of {}, {} of them all zero and left out as holes, each \
         written chunk with its CRC-32; its restore needs a driver with custom storage (r615 or later)",
        mib(d.device_bytes()),
        d.regions.len(),
        ccm_identity::staging::page_file_name(pid),
        mib(t.file_bytes),
        t.chunk_count(),
        mib(t.chunk_bytes),
        t.holes(),
    )
}

/// This node as the command-line tool sees it: NVML, called directly (no agent: the tool is no
/// CRIU, and no namespace work follows).
struct DirectNode {
    nvml: Option<Nvml>,
    gpus: Vec<GpuIdentity>,
    /// Why NVML gave no GPU list (its load or query error).
    nvml_error: Option<String>,
}

impl NodeView for DirectNode {
    fn gpus(&self) -> &[GpuIdentity] {
        &self.gpus
    }
    fn free_memory(&self) -> Result<Vec<(GpuUuid, Option<u64>)>, FreeMemoryError> {
        let n = self.nvml.as_ref().ok_or(FreeMemoryError::NoNvml)?;
        let memory = n.device_memory().map_err(|e| FreeMemoryError::Nvml(e.into()))?;
        Ok(memory.into_iter().map(|g| (g.gpu, g.free)).collect())
    }
    fn cuda_driver_version(&self) -> i32 {
        self.nvml.as_ref().and_then(|n| n.cuda_driver_version().ok()).unwrap_or(0)
    }
    fn nvml_error(&self) -> Option<String> {
        self.nvml_error.clone()
    }
}

fn run_preflight(
    path: &Path,
    limits: &ArchiveArgs,
    device_map: Option<&str>,
    usable: Option<&str>,
    bundle: Option<&Path>,
    json: bool,
) -> CliResult {
    // The user's own input first, named as typed, before anything about the checkpoint or this node.
    let mut config = Config::from_sources(|k| std::env::var(k).ok(), &[], &[]).map_err(input)?;
    if let Some(t) = device_map {
        config.device_map = parse_device_map(t, "--device-map").map_err(input)?;
    }
    // A malformed value is the user's input (exit 2), named as typed; a GPU this node lacks is a refusal (exit 1),
    // found by the preflight. The environment's value was parsed the same way by `Config::from_sources`.
    if let Some(t) = usable {
        let value = t.parse::<UsableGpus>().map_err(|e| {
            Failure::Input(format!(
                "--usable-gpus \"{}\": {e}; list UUIDs or indices from `nvidia-smi -L`, comma-separated, or `all`",
                ccm_identity::text::shown(t)
            ))
        })?;
        config.usable_gpus = Some(Sourced { value, from: "--usable-gpus".into() });
    }
    let checkpoint = load_checkpoint(path, &limits.limits())?;
    if !checkpoint.has_inventory {
        return Err(not_a_checkpoint(&checkpoint));
    }
    let needs = needs(&checkpoint);
    let image = checkpoint.archive.as_ref().and_then(|a| a.image.as_ref()).map(image_json);
    let _ = REFUSED_NEEDS.set(needs.clone());
    if let (Some(i), false) = (checkpoint.archive.as_ref().and_then(|a| a.image.as_ref()), json) {
        for note in image_runtime_notes(i) {
            println!("note: {note}");
        }
    }
    let spec = match bundle {
        Some(b) => {
            let d = Dir::open(b).map_err(|e| Failure::Input(format!("--bundle: {e}")))?;
            let bytes = d
                .read_file("config.json", ccm_process::container::MAX_SPEC_BYTES)
                .map_err(|e| Failure::Input(format!("--bundle: {e}")))?;
            Some((d.shown_file("config.json"), String::from_utf8_lossy(&bytes).into_owned()))
        }
        None => None,
    };
    // Without NVML the GPU list is empty, and the one preflight refuses as the plugin does.
    let nvml = Nvml::init(config.libnvml.as_deref());
    let (gpus, nvml_error) =
        match nvml.as_ref().map_err(|e| e.to_string()).and_then(|v| v.gpus().map_err(|e| e.to_string())) {
            Ok(g) => (g, None),
            Err(e) => (Vec::new(), Some(e)),
        };
    let node = DirectNode { nvml: nvml.ok(), gpus, nvml_error };
    // NVML's failure before the bundle's GPUs are looked for on a node without a GPU list (the
    // one preflight says the same; the plugin reads its spec after it).
    if let (false, true, Some(e)) = (checkpoint.images.is_empty(), node.gpus.is_empty(), &node.nvml_error) {
        return Err(Failure::Refused(
            preflight::PreflightError::NvmlFailed(ccm_identity::text::escaped(e)).to_string(),
        ));
    }
    // The bundle's spec stands for the restoring runtime's, in the one order the plugin uses too.
    let usable = preflight::usable_source(&config, || match &spec {
        Some((path, text)) => ccm_settings::spec::gpus_given_by_spec(text, node.gpus())
            .map_err(|e| Failure::Refused(format!("the bundle's spec {} {e}", path.display()))),
        None => Ok(None),
    })?;
    // An archive's spec.dump is the DUMPED container's: which GPUs the restored one gets is the restoring
    // runtime's choice (the kubelet's device plugin allocates anew), so it only informs.
    if let (Some(a), None, None, false) = (&checkpoint.archive, bundle, &config.usable_gpus, json) {
        if let Some((_, text)) = &a.spec {
            println!(
                "note: the dumped container had {}; to check the GPUs the restored container will get, pass \
                 --bundle (its runc/crun bundle) or --usable-gpus",
                dumped_container_gpus(text, &checkpoint.images)
            );
        }
    }
    if let (preflight::UsableSource::Spec(g), false) = (&usable, json) {
        println!(
            "usable GPUs from the bundle's spec ({}): {}",
            g.source,
            g.uuids.iter().map(|u| u.to_string()).collect::<Vec<_>>().join(", ")
        );
    }
    let verdict =
        preflight::run(&node, checkpoint.images, &config, &usable).map_err(|e| Failure::Refused(e.to_string()))?;
    let plans = &verdict.plans;
    // The forked processes' descriptors, as the plugin plans them at its init.
    let devices =
        ccm_engine::claims::with_stand_ins(&config, ccm_process::claims::nvidia_devices().unwrap_or_default());
    let claims = match checkpoint.claims {
        Some(cl) => {
            // The same usable set as the CUDA processes' map (the plugin's rule).
            let usable_uuids = usable.gpus_of(node.gpus()).map_err(|e| Failure::Refused(e.to_string()))?;
            Some(
                ccm_engine::claims::RestoreClaims::plan(cl, &devices, plans, node.gpus(), &usable_uuids, &config)
                    .map_err(|e| Failure::Refused(e.to_string()))?,
            )
        }
        None => None,
    };
    if let (Some(c), false) = (&claims, json) {
        println!("forked processes without a CUDA context:\n{}", c.describe());
    }
    // The GPUs' nodes against the devices cgroup of the spec the restored container gets, as the plugin checks them
    // at its init: the bundle's refuses; an archive's spec.dump is the one Podman's `restore --import` keeps (a CRI
    // restore builds a new spec), so what it denies is said, not refused.
    let mut targets = ccm_engine::restore::cuda_gpu_targets(plans, node.gpus());
    if let Some(c) = &claims {
        targets.extend(c.gpu_targets(node.gpus()));
        targets.sort();
        targets.dedup();
    }
    let mut spec_dump_denies = None;
    if let Some((path, text)) = &spec {
        if let Some(d) = ccm_engine::restore::node_the_spec_denies(text, &devices, &targets) {
            return Err(Failure::Refused(
                ccm_engine::EngineError::NodeDenied {
                    spec: format!("spec {} (--bundle)", path.display()),
                    node: d.node,
                    gpu: d.gpu,
                    who: "its processes".into(),
                }
                .to_string(),
            ));
        }
    } else if let Some((member, text)) = checkpoint.archive.as_ref().and_then(|a| a.spec.as_ref()) {
        spec_dump_denies = ccm_engine::restore::node_the_spec_denies(text, &devices, &targets);
        if let (Some(d), false) = (&spec_dump_denies, json) {
            println!(
                "note: Podman's `restore --import` keeps the dumped container's spec ({}), whose devices cgroup does \
                 not let the container open {}, the node of GPU {} that this restore puts its processes on: the \
                 plugin refuses that restore before CRIU restores anything. Restore with Podman onto the GPUs the \
                 container had, or through CRI, whose restore builds a new spec (check it with --bundle)",
                ccm_identity::text::shown(member),
                d.node,
                d.gpu
            );
        }
    }
    if json {
        let v: Vec<_> = plans
            .iter()
            .map(|p| {
                serde_json::json!({
                    "pid": p.image.pid,
                    "pairs": p.map.pairs.iter().map(|x| serde_json::json!({
                        "old": x.old.to_string(), "new": x.new.to_string(), "used": x.used, "reason": format!("{:?}", x.reason)
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        let mut doc = serde_json::json!({"ok": true, "processes": v, "needs": needs});
        if let Some(d) = &spec_dump_denies {
            // What Podman's `restore --import` (which keeps spec.dump) would be refused.
            doc["spec_dump_denies"] = serde_json::json!({"node": d.node, "gpu": d.gpu});
        }
        if let Some(i) = image {
            doc["image"] = i;
        }
        println!("{doc}");
    } else if plans.is_empty() {
        println!("no CUDA process in {}: nothing to restore onto a GPU", checkpoint.shown);
    } else {
        for p in plans {
            println!("pid {}: device map\n{}", p.image.pid, p.map.render_table(&p.image, node.gpus()));
        }
        match &verdict.memory {
            MemoryVerdict::Checked { targets, .. } if !targets.is_empty() => {
                println!("device memory: {}", preflight::render_memory(targets))
            }
            MemoryVerdict::Checked { .. } => println!("device memory: the images record none to check"),
            MemoryVerdict::Off => println!("device memory: not checked (the free-memory check is off)"),
            MemoryVerdict::Unreadable(e) => println!("device memory: not checked ({e})"),
        }
        println!("preflight passed: this node can restore {} CUDA process(es)", plans.len());
    }
    Ok(())
}

fn node(json: bool) -> CliResult {
    let nvml = Nvml::init(Config::driver_libs_in_env().libnvml.as_deref()).map_err(input)?;
    let gpus = nvml.gpus().map_err(input)?;
    if json {
        println!(
            "{}",
            serde_json::json!({"ok": true, "driver_version": nvml.driver_version().unwrap_or_default(), "gpus": gpus})
        );
    } else {
        println!("driver {}", nvml.driver_version().unwrap_or_default());
        for (i, g) in gpus.iter().enumerate() {
            println!("{i}  {}  {}  {}  minor {}  {} MiB", g.uuid, g.pci, g.name, g.minor, g.memory_total >> 20);
        }
    }
    Ok(())
}

/// CRIU's action script. CRIU runs it for every action of a dump and a restore, and a script that
/// exits non-zero fails the whole operation; so only a call that is not from CRIU at all is an
/// error. A loopback that cannot be brought up is a warning: only a restore with established TCP
/// connections on it needs it, and CRIU's own error says so when it does.
///
/// Nothing is printed on success: under runc, CRIU's output is the restored container's own (its
/// log), which is not ours to write in.
fn action_script() -> CliResult {
    let action = std::env::var("CRTOOLS_SCRIPT_ACTION").map_err(|_| {
        Failure::Input(
            "CRTOOLS_SCRIPT_ACTION is not set: this command is CRIU's action script, run by CRIU; put \
             `action-script /usr/lib/criu-cuda-migrate/action-script` in the CRIU configuration file (criu-cuda-migrate(1))"
                .to_string(),
        )
    })?;
    if action != "setup-namespaces" {
        return Ok(());
    }
    let raw = std::env::var("CRTOOLS_INIT_PID").unwrap_or_default();
    let Some(pid) = raw.trim().parse::<i64>().ok().and_then(ccm_identity::HostPid::new) else {
        eprintln!(
            "criu-cuda-migrate action-script: WARNING: CRIU gave no valid CRTOOLS_INIT_PID ({raw:?}) at \
             setup-namespaces; the restored network namespace's loopback is left as it is"
        );
        return Ok(());
    };
    if let Err(e) = ccm_process::netns::bring_loopback_up(pid) {
        eprintln!(
            "criu-cuda-migrate action-script: WARNING: {e}; established TCP connections on the restored \
             loopback cannot be restored"
        );
    }
    Ok(())
}
