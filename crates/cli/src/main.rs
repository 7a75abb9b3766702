//! `criu-cuda-migrate`: inspect a checkpoint's GPU identity, preflight this node for a restore,
//! list this node's GPUs, and recover a process a failed run left LOCKED or CHECKPOINTED.
//!
//! Exit codes: 0 success; 1 the check failed (preflight refused, recover failed); 2 bad usage or
//! unreadable input.

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use ccm_engine::preflight;
use ccm_engine::Config;
use ccm_identity::image::IdentityImage;
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
    /// Show the identity images of a CRIU image directory: GPUs used and enumerated, environment, PCI sites.
    Inspect {
        /// CRIU's image directory (`criu dump -D DIR`).
        dir: PathBuf,
    },
    /// Run the plugin's restore checks against this node and print the device map it would use.
    Preflight {
        /// CRIU's image directory (`criu dump -D DIR`), as it will be restored.
        dir: PathBuf,
        /// Explicit map `OLD=NEW,...` (default: $CRIU_CUDA_MIGRATE_DEVICE_MAP).
        #[arg(long)]
        device_map: Option<String>,
        /// GPUs the restore may use, UUIDs or NVML indices (default: $CRIU_CUDA_MIGRATE_USABLE_GPUS).
        #[arg(long)]
        usable_gpus: Option<String>,
        /// The container bundle the restore will use: without --usable-gpus, the GPUs its config.json gives the
        /// container, as the plugin reads them at a runc or crun restore.
        #[arg(long)]
        bundle: Option<PathBuf>,
    },
    /// List the GPUs NVML sees on this node.
    Node,
    /// Bring a process left LOCKED or CHECKPOINTED back to RUNNING (restore onto the same GPUs, then unlock).
    Recover {
        /// The process's pid (as `ps` shows it on this host).
        #[arg(long)]
        pid: i32,
    },
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = Cli::parse();
    let r = match &cli.command {
        Command::Inspect { dir } => inspect(dir, cli.json),
        Command::Preflight { dir, device_map, usable_gpus, bundle } => {
            run_preflight(dir, device_map.clone(), usable_gpus.clone(), bundle.as_deref(), cli.json)
        }
        Command::Node => node(cli.json),
        Command::Recover { pid } => recover(*pid, cli.json),
    };
    match r {
        Ok(code) => code,
        Err(e) => {
            eprintln!("criu-cuda-migrate: {e}");
            ExitCode::from(2)
        }
    }
}

type CliResult = Result<ExitCode, String>;

fn load_images(dir: &Path) -> Result<Vec<(PathBuf, IdentityImage)>, String> {
    let d = open_image_dir(dir)?;
    preflight::read_images(&d).map_err(|e| e.to_string())
}

fn open_image_dir(dir: &Path) -> Result<Dir, String> {
    Dir::open(dir).map_err(|e| match e {
        FileError::Missing { .. } => {
            format!("{} does not exist; pass CRIU's image directory (the -D of `criu dump`)", dir.display())
        }
        FileError::NotRegular { .. } => {
            format!("{} is not a directory; pass CRIU's image directory (the -D of `criu dump`)", dir.display())
        }
        e => e.to_string(),
    })
}

fn inspect(dir: &Path, json: bool) -> CliResult {
    let images = load_images(dir)?;
    let reports = restore_reports(dir);
    if json {
        let v = serde_json::json!({
            "dir": dir.display().to_string(),
            "processes": images.iter().map(|(_, i)| i).collect::<Vec<_>>(),
            "restore_reports": reports,
        });
        println!("{}", serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?);
        return Ok(ExitCode::SUCCESS);
    }
    if images.is_empty() {
        println!(
            "{}: no criu-cuda-migrate identity images (no CUDA process was dumped with the plugin)",
            dir.display()
        );
        return Ok(ExitCode::SUCCESS);
    }
    for (path, img) in &images {
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
    for (name, text) in &reports {
        println!("\n{name}:\n{text}");
    }
    Ok(ExitCode::SUCCESS)
}

/// Largest restore report read (the plugin writes a few KiB).
const MAX_REPORT_BYTES: u64 = 1 << 20;

/// The plugin's restore reports (`cuda-migrate-restore-<pid>.txt`) left next to the images, read
/// as the images are (no link followed, capped) and with any control character but the line
/// breaks escaped.
fn restore_reports(dir: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let Ok(d) = Dir::open(dir) else { return out };
    for name in d.names().unwrap_or_default() {
        let Some(name) = name.to_str() else { continue };
        if ccm_identity::image::is_report_file_name(name).is_none() {
            continue;
        }
        let text = match d.read_file(name, MAX_REPORT_BYTES) {
            Ok(b) => {
                String::from_utf8_lossy(&b).lines().map(ccm_identity::text::escaped).collect::<Vec<_>>().join("\n")
            }
            Err(e) => format!("(not read: {e})"),
        };
        out.push((name.to_string(), text));
    }
    out.sort();
    out
}

fn run_preflight(
    dir: &Path,
    device_map: Option<String>,
    usable: Option<String>,
    bundle: Option<&Path>,
    json: bool,
) -> CliResult {
    let images = load_images(dir)?;
    let spec = match bundle {
        Some(b) => {
            let d = Dir::open(b).map_err(|e| format!("--bundle: {e}"))?;
            let bytes = d
                .read_file("config.json", ccm_process::container::MAX_SPEC_BYTES)
                .map_err(|e| format!("--bundle: {e}"))?;
            Some((d.shown_file("config.json"), String::from_utf8_lossy(&bytes).into_owned()))
        }
        None => None,
    };
    let mut config = Config::from_sources(|k| std::env::var(k).ok(), &[], &[]).map_err(|e| e.to_string())?;
    if device_map.is_some() {
        config.device_map = device_map;
    }
    if usable.is_some() {
        config.usable_gpus = usable;
    }
    // The user's own input first, named as typed, before anything about this node.
    if let Some(t) = &config.device_map {
        ccm_identity::map::parse_pairs(t).map_err(|e| format!("--device-map {t:?}: {e}"))?;
    }
    let n = images.len();
    let nvml = ccm_driver::nvml::Nvml::init();
    let gpus = match nvml.as_ref().map_err(|e| e.to_string()).and_then(|n| n.gpus().map_err(|e| e.to_string())) {
        Ok(g) => g,
        Err(e) if n > 0 => {
            return refuse(json, &format!("this node cannot restore the checkpoint's {n} CUDA process(es): {e}"))
        }
        Err(_) => Vec::new(),
    };
    let given = match &spec {
        Some((path, text)) if config.usable_gpus.is_none() => {
            match ccm_identity::runtime::gpus_given_by_spec(text, &gpus) {
                Ok(Some(g)) => Some(g),
                Ok(None) => {
                    return Err(format!(
                    "--bundle: {} names no GPU (no /dev/nvidiaN in linux.devices, no NVIDIA_VISIBLE_DEVICES): without \
                         --usable-gpus the restore would use every GPU of this node",
                    path.display()
                ))
                }
                Err(e) => return refuse(json, &format!("the bundle's spec {} {e}", path.display())),
            }
        }
        _ => None,
    };
    if let (Some(g), false) = (&given, json) {
        println!(
            "usable GPUs from the bundle's spec ({}): {}",
            g.source,
            g.uuids.iter().map(|u| u.to_string()).collect::<Vec<_>>().join(", ")
        );
    }
    let planned = preflight::plan(images, &gpus, &config, given.as_ref()).and_then(|plans| {
        // The same free-memory rule as the plugin's preflight, against this node's GPUs now.
        let memory = match (&nvml, config.memory_check) {
            (Ok(n), true) => {
                let free: Vec<_> =
                    n.device_memory().map(|m| m.into_iter().map(|g| (g.gpu, g.free)).collect()).unwrap_or_default();
                Some(preflight::check_memory(&plans, &free, &gpus)?.0)
            }
            _ => None,
        };
        Ok((plans, memory))
    });
    match planned {
        Ok((plans, memory)) => {
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
                println!("{}", serde_json::json!({"ok": true, "processes": v}));
            } else if plans.is_empty() {
                println!("no CUDA process in {}: nothing for the plugin to do", dir.display());
            } else {
                for p in &plans {
                    println!("pid {}: device map\n{}", p.image.pid, p.map.render_table(&p.image, &gpus));
                }
                match &memory {
                    Some(t) if !t.is_empty() => println!("device memory: {}", preflight::render_memory(t)),
                    Some(_) => println!("device memory: the images record none to check"),
                    None => println!("device memory: not checked"),
                }
                println!("preflight passed: this node can restore {} CUDA process(es)", plans.len());
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => refuse(json, &e.to_string()),
    }
}

fn refuse(json: bool, msg: &str) -> CliResult {
    if json {
        println!("{}", serde_json::json!({"ok": false, "error": msg}));
    } else {
        println!("preflight refused: {msg}");
    }
    Ok(ExitCode::from(1))
}

fn node(json: bool) -> CliResult {
    let nvml = ccm_driver::nvml::Nvml::init().map_err(|e| e.to_string())?;
    let gpus = nvml.gpus().map_err(|e| e.to_string())?;
    if json {
        println!("{}", serde_json::json!({"driver_version": nvml.driver_version().unwrap_or_default(), "gpus": gpus}));
    } else {
        println!("driver {}", nvml.driver_version().unwrap_or_default());
        for (i, g) in gpus.iter().enumerate() {
            println!("{i}  {}  {}  {}  minor {}  {} MiB", g.uuid, g.pci, g.name, g.minor, g.memory_total >> 20);
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn recover(pid: i32, json: bool) -> CliResult {
    if pid <= 0 || !Path::new(&format!("/proc/{pid}")).exists() {
        return Err(format!("pid {pid} does not exist on this host; pass the pid `ps` shows for the stuck process"));
    }
    use ccm_driver::checkpoint::CheckpointApi;
    let lib = ccm_driver::Libcuda::load().map_err(|e| e.to_string())?;
    let api = CheckpointApi::new(&lib).map_err(|e| e.to_string())?;
    lib.init().map_err(|e| e.to_string())?;
    let before = api.state(pid).map_err(|e| format!("pid {pid}: {e}"))?;
    if !json {
        println!("pid {pid}: {before}");
    }
    // The engine's put-back, the one the dump's rollback uses; progress of the long step (the
    // device memory back onto the GPUs, about 1 s per GiB) on stderr, so that --json output stays
    // one document on stdout.
    let done = ccm_driver::checkpoint::put_back(&api, pid, before, std::time::Duration::MAX, |step| {
        if step == ccm_driver::checkpoint::Step::Restore {
            eprintln!("criu-cuda-migrate: pid {pid}: restoring its device memory onto the same GPUs ...");
        }
    });
    let steps: Vec<serde_json::Value> = done
        .iter()
        .map(
            |d| serde_json::json!({"step": d.step.name(), "ok": d.error.is_none(), "seconds": d.elapsed.as_secs_f64()}),
        )
        .collect();
    let mut r: Result<(), String> = Ok(());
    for d in &done {
        match &d.error {
            None if !json => println!("pid {pid}: {} done ({:.3} s)", d.step.name(), d.elapsed.as_secs_f64()),
            None => {}
            Some(e) => r = Err(format!("pid {pid}: {} failed: {e}", d.step.name())),
        }
    }
    let after = api.state(pid).map(|s| s.to_string()).unwrap_or_else(|e| e.to_string());
    if json {
        println!(
            "{}",
            serde_json::json!({
                "pid": pid, "before": before.to_string(), "steps": steps, "after": after,
                "ok": r.is_ok(), "error": r.as_ref().err(),
            })
        );
    }
    match r {
        Ok(()) => {
            if !json {
                println!("pid {pid}: {after}");
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("{e}");
            Ok(ExitCode::from(1))
        }
    }
}
