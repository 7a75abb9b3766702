//! `job --pid N`: can this process tree be checkpointed and restored now? What a Kubernetes operator
//! (or a user) runs on the node before the kubelet's checkpoint API or `criu dump`.
//!
//! The tree of `pid` as `/proc` shows it; each process's CUDA use (it maps libcuda and holds GPU memory
//! or a GPU node); the kernel driver's resource manager's answer for every process of the tree (the
//! memory each holds on each GPU, the memory dup'd from another process's allocation: a CUDA IPC
//! import); and the verdict of [`ccm_engine::sharing::verdict`] with the settings of this environment,
//! in the words the plugin would log. Exit 0: the plugin would dump it; 1: it would refuse; 2: usage.
//! No CUDA call is made (no `cuInit`, no driver threads): only `/proc` and the resource manager's ioctls.

use std::collections::BTreeSet;
use std::time::Duration;

use ccm_driver::rm::{PidMemoryReport, VideoMemory};
use ccm_engine::sharing::{importers_in, verdict, SharingVerdict};
use ccm_identity::{GpuIdentity, HostPid, PciAddress};
use serde::Serialize;

use crate::{input, CliResult, Failure};

/// As the plugin's check (measured: 1-2 ms).
const RM_DEADLINE: Duration = Duration::from_secs(2);
/// The most processes of a tree looked at.
const MAX_TREE: usize = 4096;

#[derive(Serialize)]
struct GpuUse {
    pci: PciAddress,
    uuid: Option<String>,
    /// As the resource manager reports it (bytes); absent where it was not asked.
    memory: Option<VideoMemory>,
    /// The process holds `/dev/nvidiaN` of this GPU open or mapped.
    node_open: bool,
}

#[derive(Serialize)]
struct ProcessRow {
    pid: u32,
    command: String,
    cuda: bool,
    importer: bool,
    gpus: Vec<GpuUse>,
}

#[derive(Serialize)]
struct JobReport {
    pid: u32,
    processes: Vec<ProcessRow>,
    cuda_processes: Vec<u32>,
    importer_check: ImporterCheck,
    /// `ready` or `refused`.
    verdict: &'static str,
    /// The plugin's line: the refusal, the warning, or the line it logs.
    message: String,
    exit_code: u8,
}

#[derive(Serialize)]
struct ImporterCheck {
    ran: bool,
    /// Why it could not run.
    why: Option<String>,
    driver_version: Option<String>,
    milliseconds: Option<f64>,
}

pub fn run(pid: i32, json: bool) -> CliResult {
    let root = u32::try_from(pid).ok().and_then(|p| HostPid::new(p.into())).ok_or_else(|| {
        Failure::Input(format!("--pid {pid} is no process id; pass the pid `ps` shows for the job's first process"))
    })?;
    let mut tree = ccm_process::tree::children_recursive(root.get());
    if tree.is_empty() {
        return Err(Failure::Input(format!(
            "pid {root} does not exist on this host; pass the pid `ps` shows (for a container, its init's host pid: \
             `crictl inspect`, `podman inspect --format {{{{.State.Pid}}}}`)"
        )));
    }
    tree.truncate(MAX_TREE);
    let config = ccm_engine::Config::from_sources(|k| std::env::var(k).ok(), &[], &[]).map_err(input)?;
    let node_gpus = ccm_driver::procfs::gpus().unwrap_or_default();
    let rm = ccm_driver::rm::video_memory_within(&tree, RM_DEADLINE);
    let rows: Vec<ProcessRow> = tree.iter().map(|&p| row(p, rm.as_ref().ok(), &node_gpus)).collect();
    let cuda_pids: Vec<HostPid> = rows.iter().filter(|r| r.cuda).filter_map(|r| HostPid::new(r.pid.into())).collect();
    let facts = rm.as_ref().map(|r| importers_in(r, |pci| node_gpus.iter().find(|g| g.pci == pci).map(|g| g.uuid)));
    // Why the importer check could not run, as the verdict's lines name it.
    let unchecked = facts.as_ref().err().map(|e| format!("the resource manager: {e}")).unwrap_or_default();
    let v = verdict(&cuda_pids, facts.as_ref().map_err(|_| unchecked.as_str()), config.ipc, config.multi_process);
    let importers: BTreeSet<u32> = match &facts {
        Ok(f) => f.importers.iter().map(|i| i.pid.get()).collect(),
        Err(_) => BTreeSet::new(),
    };
    let rows: Vec<ProcessRow> =
        rows.into_iter().map(|r| ProcessRow { importer: importers.contains(&r.pid), ..r }).collect();
    let (verdict_word, message, code) = match &v {
        SharingVerdict::Proceed { warning: Some(w), .. } => ("ready", w.clone(), 0),
        SharingVerdict::Proceed { info, .. } if cuda_pids.is_empty() => (
            "ready",
            info.clone().unwrap_or_else(|| {
                "no CUDA process in this tree: the plugin leaves it to CRIU, which checkpoints it as any other".into()
            }),
            0,
        ),
        SharingVerdict::Proceed { info, .. } => ("ready", info.clone().unwrap_or_default(), 0),
        refused => ("refused", refused.refusal().unwrap_or_default(), 1),
    };
    let report = JobReport {
        pid: root.get(),
        cuda_processes: cuda_pids.iter().map(|p| p.get()).collect(),
        processes: rows,
        importer_check: match &rm {
            Ok(r) => ImporterCheck {
                ran: true,
                why: None,
                driver_version: Some(r.driver_version.clone()),
                milliseconds: Some(r.seconds * 1e3),
            },
            Err(e) => ImporterCheck { ran: false, why: Some(e.to_string()), driver_version: None, milliseconds: None },
        },
        verdict: verdict_word,
        message,
        exit_code: code,
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&report).map_err(input)?);
        if code == 1 {
            // The one document is out: a refusal only sets the exit code (as `node --check --json`).
            let _ = std::io::Write::flush(&mut std::io::stdout());
            std::process::exit(1);
        }
        return Ok(());
    }
    print_table(&report);
    if code == 1 {
        return Err(Failure::Refused(
            "a checkpoint of this tree now would be refused (the verdict line above says why and what to do)".into(),
        ));
    }
    Ok(())
}

/// One process: its CUDA use from `/proc` and the resource manager's answers.
fn row(pid: u32, rm: Option<&PidMemoryReport>, node_gpus: &[GpuIdentity]) -> ProcessRow {
    let command = ccm_process::tree::comm(pid).unwrap_or_default();
    let maps = ccm_process::read_maps(pid).unwrap_or_default();
    let maps_libcuda = maps.iter().any(|m| m.path.contains(ccm_engine::LIBCUDA_FILE));
    let minors = ccm_process::devices::nvidia_minors_in_use_with(pid, &maps).unwrap_or_default();
    let mut gpus: Vec<GpuUse> = Vec::new();
    for g in rm.map(|r| r.gpus.as_slice()).unwrap_or_default() {
        let memory = g.pids.iter().find(|p| p.pid == pid).map(|p| p.memory);
        let node_open = minors.contains(&g.minor);
        if memory.is_some_and(|m| m.total() > 0) || node_open {
            let uuid = node_gpus.iter().find(|n| n.pci == g.pci).map(|n| n.uuid.to_string());
            gpus.push(GpuUse { pci: g.pci, uuid, memory, node_open });
        }
    }
    // Without the resource manager, the GPU nodes the process holds are what /proc tells.
    if rm.is_none() {
        for minor in &minors {
            if let Some(n) = node_gpus.iter().find(|n| n.minor == *minor) {
                gpus.push(GpuUse { pci: n.pci, uuid: Some(n.uuid.to_string()), memory: None, node_open: true });
            }
        }
    }
    // As the plugin's PAUSE_DEVICES: it maps libcuda, and it has a context somewhere (GPU memory or a GPU node):
    // a process that only loaded the library (torch.compile's workers) has neither.
    let cuda = maps_libcuda && !gpus.is_empty();
    ProcessRow { pid, command, cuda, importer: false, gpus }
}

fn mib(b: u64) -> String {
    format!("{} MiB", b.div_ceil(1 << 20))
}

fn print_table(r: &JobReport) {
    println!("job of pid {}: {} process(es), {} CUDA process(es)", r.pid, r.processes.len(), r.cuda_processes.len());
    println!("{:<8} {:<16} {:<5} {:<46} {:>12} {:>10}", "pid", "command", "CUDA", "GPU", "memory", "imported");
    for p in &r.processes {
        let cuda = if p.cuda { "yes" } else { "no" };
        if p.gpus.is_empty() {
            println!("{:<8} {:<16} {:<5} {:<46} {:>12} {:>10}", p.pid, p.command, cuda, "-", "-", "-");
        }
        for (i, g) in p.gpus.iter().enumerate() {
            let (pid, command) =
                if i == 0 { (p.pid.to_string(), p.command.clone()) } else { (String::new(), String::new()) };
            let gpu = match &g.uuid {
                Some(u) => format!("{} {}", g.pci, u),
                None => g.pci.to_string(),
            };
            let (memory, imported) = match g.memory {
                Some(m) => (mib(m.private + m.shared_owned), mib(m.shared_duped)),
                None => ("?".into(), "?".into()),
            };
            let mark = if g.memory.is_some_and(|m| m.shared_duped > 0) { "  <- importer" } else { "" };
            println!(
                "{pid:<8} {command:<16} {:<5} {gpu:<46} {memory:>12} {imported:>10}{mark}",
                if i == 0 { cuda } else { "" }
            );
        }
    }
    match (&r.importer_check.why, r.importer_check.milliseconds) {
        (Some(why), _) => println!("importer check: could not run: {why}"),
        (None, Some(ms)) => println!(
            "importer check: the kernel driver's resource manager ({}) answered in {ms:.1} ms",
            r.importer_check.driver_version.as_deref().unwrap_or("?")
        ),
        (None, None) => {}
    }
    let head = if r.verdict == "ready" { "ready" } else { "would be refused" };
    println!("verdict: {head}: {}", r.message);
}
