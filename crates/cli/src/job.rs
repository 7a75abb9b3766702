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
use ccm_identity::claims::{NvidiaDevices, NvidiaNode};
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
    /// No CUDA context of its own, but NVIDIA descriptors or mappings (a child forked after its parent's
    /// cuInit): the plugin claims them (reopened, placeholders) and CRIU dumps it.
    forked_holder: Option<HolderFacts>,
    /// What it holds that CRIU cannot dump (an io_uring, ...): the dump would fail in CRIU.
    criu_cannot_dump: Vec<ccm_identity::criu_support::Undumpable>,
    #[serde(skip)]
    holdings: ccm_process::claims::Holdings,
}

#[derive(Serialize, Clone)]
struct HolderFacts {
    descriptors: usize,
    mappings: usize,
    /// The CUDA process whose open files it shares (its parent), when the kernel could tell.
    inherited_from: Option<u32>,
}

#[derive(Serialize)]
struct JobReport {
    pid: u32,
    processes: Vec<ProcessRow>,
    cuda_processes: Vec<u32>,
    /// The importers that are MPS clients.
    mps_clients: Vec<u32>,
    importer_check: ImporterCheck,
    /// `ready`, `refused` (the plugin would refuse the dump before any lock) or `would-fail` (CRIU would fail it:
    /// something it cannot dump, named with the way out).
    verdict: &'static str,
    /// The plugin's line: the refusal, the warning, or the line it logs.
    message: String,
    exit_code: u8,
    /// Unix sockets of the tree bound to a path: CRIU binds each again at restore, so a move to another node needs
    /// their folders there (not part of the verdict: on this node they exist).
    bound_sockets: Vec<BoundSocket>,
}

#[derive(Serialize)]
struct BoundSocket {
    pid: u32,
    path: String,
}

/// The most bound sockets listed.
const MAX_BOUND_SOCKETS: usize = 256;

#[derive(Serialize)]
struct ImporterCheck {
    ran: bool,
    /// Why it could not run.
    why: Option<String>,
    driver_version: Option<String>,
    milliseconds: Option<f64>,
}

pub fn run(pid: i32, criu: Option<&std::path::Path>, json: bool) -> CliResult {
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
    // Each pid names the process that has it now: its start time before the question, read again after.
    let started: Vec<(u32, Option<u64>)> = tree.iter().map(|&p| (p, ccm_process::tree::start_time(p))).collect();
    let rm = ccm_driver::rm::video_memory_within(&tree, RM_DEADLINE);
    let devices = node_devices(&config);
    let rows: Vec<ProcessRow> = tree.iter().map(|&p| row(p, rm.as_ref().ok(), &node_gpus, &devices)).collect();
    let rows = classify_forked(rows, &devices);
    // What the plugin cannot claim refuses the dump, in its words.
    let unclaimable = rows.iter().find_map(|r| {
        r.holdings.unclaimed.first().map(|(what, name)| {
            ccm_engine::claims::ClaimError::Unclaimable {
                pid: HostPid::new(r.pid.into()).unwrap_or(root),
                comm: r.command.clone(),
                what: what.clone(),
                name: name.clone(),
            }
            .to_string()
        })
    });
    // Managed memory, which driver 580 cannot checkpoint, refuses the dump before any lock, in the plugin's words.
    let refuse_managed = config.managed == ccm_engine::config::ManagedMemory::Refuse;
    let managed = rows.iter().filter(|r| r.cuda && refuse_managed).find_map(|r| {
        let managed = ccm_engine::sharing::managed_memory_of(&r.holdings);
        (!managed.is_empty()).then(|| {
            let pid = HostPid::new(r.pid.into()).unwrap_or(root);
            ccm_engine::EngineError::ManagedMemoryRefused { pid, comm: r.command.clone(), managed }.to_string()
        })
    });
    // What the claims file could not record refuses the dump before any lock (the plugin's check, its words).
    let over_bound =
        ccm_engine::claims::check_tree_bounds(rows.iter().map(|r| (r.pid, r.command.as_str(), &r.holdings)))
            .err()
            .map(|e| e.to_string());
    let refused_first = unclaimable.or(managed).or(over_bound);
    // What CRIU itself cannot dump (an io_uring: torchrun's agent) fails the dump in CRIU.
    let would_fail: Vec<String> = rows
        .iter()
        .filter(|r| !r.criu_cannot_dump.is_empty())
        .map(|r| ccm_identity::criu_support::line(r.pid, &r.command, &r.criu_cannot_dump))
        .collect();
    let mut would_fail = would_fail;
    if let Some(line) = inet_sockets_line(&rows, criu) {
        would_fail.push(line);
    }
    let cuda_pids: Vec<HostPid> = rows.iter().filter(|r| r.cuda).filter_map(|r| HostPid::new(r.pid.into())).collect();
    let mut facts = rm.as_ref().map(|r| importers_in(r, |pci| node_gpus.iter().find(|g| g.pci == pci).map(|g| g.uuid)));
    // As the plugin: only live processes holding a GPU node count (a dead process's memory stays under its number).
    let mut stale_line = None;
    if let Some(f) = facts.as_mut().ok().filter(|f| !f.importers.is_empty()) {
        let (live, stale) = ccm_engine::sharing::split_live_importers(std::mem::take(&mut f.importers), |p| {
            let before = started.iter().find(|(q, _)| *q == p.get()).and_then(|(_, t)| *t);
            before.is_some_and(|t| ccm_process::tree::start_time(p.get()) == Some(t))
                && ccm_process::devices::nvidia_minors_in_use(p.get()).is_ok_and(|m| !m.is_empty())
                // A child forked after cuInit (a row classified `fork` above) has no context to import with: the
                // memory under its number is a dead process's (as the plugin decides).
                && rows.iter().find(|r| r.pid == p.get()).is_none_or(|r| r.forked_holder.is_none())
        });
        f.importers = live;
        if !stale.is_empty() {
            stale_line = Some(ccm_engine::sharing::stale_importers_line(&stale));
        }
    }
    // An MPS client reads as an importer (its memory is the MPS server's): named as such, as the plugin does.
    if let Some(f) = facts.as_mut().ok().filter(|f| !f.importers.is_empty()) {
        let servers = ccm_process::tree::processes_running(ccm_engine::sharing::MPS_SERVER_EXE, 64);
        if !servers.is_empty() {
            if let Ok(r) = ccm_driver::rm::video_memory_within(&servers, RM_DEADLINE) {
                ccm_engine::sharing::mark_mps_clients(&mut f.importers, &r);
            }
        }
    }
    // Why the importer check could not run, as the verdict's lines name it.
    let unchecked = facts.as_ref().err().map(|e| format!("the resource manager: {e}")).unwrap_or_default();
    let v = verdict(&cuda_pids, facts.as_ref().map_err(|_| unchecked.as_str()), config.ipc, config.multi_process);
    let mps_clients: Vec<u32> = match &facts {
        Ok(f) => f.importers.iter().filter(|i| i.is_mps_client()).map(|i| i.pid.get()).collect(),
        Err(_) => Vec::new(),
    };
    let importers: BTreeSet<u32> = match &facts {
        Ok(f) => f.importers.iter().map(|i| i.pid.get()).collect(),
        Err(_) => BTreeSet::new(),
    };
    let rows: Vec<ProcessRow> =
        rows.into_iter().map(|r| ProcessRow { importer: importers.contains(&r.pid), ..r }).collect();
    let holders: Vec<String> = rows
        .iter()
        .filter_map(|r| {
            let h = r.forked_holder.as_ref()?;
            Some(format!(
                "pid {} ({}): no CUDA context, {} NVIDIA descriptor(s) and {} device mapping(s){}: handled (the plugin \
                 reopens the descriptors on the restoring node and restores the mappings as inert placeholders)",
                r.pid,
                r.command,
                h.descriptors,
                h.mappings,
                h.inherited_from.map(|p| format!(" inherited from pid {p}")).unwrap_or_default()
            ))
        })
        .collect();
    let (verdict_word, message, code) = match &v {
        _ if refused_first.is_some() => ("refused", refused_first.clone().unwrap_or_default(), 1),
        _ if !would_fail.is_empty() => ("would-fail", would_fail.join("; "), 1),
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
    let message = if holders.is_empty() || code == 1 {
        message
    } else {
        format!("{message}{}{}", if message.is_empty() { "" } else { "; " }, holders.join("; "))
    };
    let message = match stale_line {
        Some(l) => format!("{message}; {l}"),
        None => message,
    };
    let report = JobReport {
        pid: root.get(),
        cuda_processes: cuda_pids.iter().map(|p| p.get()).collect(),
        mps_clients,
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
        bound_sockets: bound_sockets(&tree),
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
        return Err(Failure::Refused(if report.verdict == "would-fail" {
            "a checkpoint of this tree now would fail in CRIU (the verdict line above says why and what to do)".into()
        } else {
            "a checkpoint of this tree now would be refused (the verdict line above says why and what to do)".into()
        }));
    }
    Ok(())
}

/// How long `criu --version` may take.
const CRIU_VERSION_DEADLINE: std::time::Duration = std::time::Duration::from_secs(5);

/// The version `criu --version` prints (`Version: 4.1.1` → `4.1.1`), or `None` when it cannot be run or told.
fn criu_version(criu: &std::path::Path) -> Option<String> {
    use std::io::Read;
    let mut child = std::process::Command::new(criu)
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .ok()?;
    let t0 = std::time::Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if t0.elapsed() < CRIU_VERSION_DEADLINE => {
                std::thread::sleep(std::time::Duration::from_millis(10))
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
    let mut text = String::new();
    child.stdout.take()?.take(4096).read_to_string(&mut text).ok()?;
    let v = text.lines().find_map(|l| l.strip_prefix("Version:"))?.trim().to_string();
    (!v.is_empty() && v.len() < 64).then_some(v)
}

/// The kernel's release (`/proc/sys/kernel/osrelease`: a line of some 30 bytes), read by the plugin's file rules:
/// relative to its directory, no link followed, a regular file, at most 256 bytes.
fn kernel_release() -> Option<String> {
    let bytes =
        ccm_process::dir::Dir::open(std::path::Path::new("/proc/sys/kernel")).ok()?.read_file("osrelease", 256).ok()?;
    Some(String::from_utf8_lossy(&bytes).trim().to_string())
}

/// The line saying that the tree's inet sockets would fail the dump in CRIU (CRIU before 4.2 on Linux 6.16 and later:
/// `ccm_identity::criu_support::inet_sockets_undumpable`), when that is so. CRIU is `criu` (else `criu` on PATH).
fn inet_sockets_line(rows: &[ProcessRow], criu: Option<&std::path::Path>) -> Option<String> {
    use ccm_identity::criu_support::{inet_socket_line, inet_sockets_undumpable, major_minor};
    let kernel = kernel_release()?;
    let version = criu_version(criu.unwrap_or(std::path::Path::new("criu")))?;
    if !inet_sockets_undumpable(major_minor(&version)?, major_minor(&kernel)?) {
        return None;
    }
    let mut by_namespace: std::collections::BTreeMap<u64, BTreeSet<u64>> = Default::default();
    let mut holders = Vec::new();
    for r in rows {
        let Ok(p) = ccm_process::sockets::ProcessSockets::open(r.pid) else { continue };
        let Ok(mine) = p.socket_inodes() else { continue };
        if mine.is_empty() {
            continue;
        }
        let Ok(ns) = p.net_namespace() else { continue };
        let inet = by_namespace.entry(ns).or_insert_with(|| p.inet_socket_inodes().unwrap_or_default());
        let n = mine.intersection(inet).count();
        if n > 0 {
            holders.push((r.pid, r.command.clone(), n));
        }
    }
    (!holders.is_empty()).then(|| inet_socket_line(&holders, &version, &kernel))
}

/// The NVIDIA device numbers as the plugin reads them (`/proc/devices`, and the test doubles' stand-ins).
fn node_devices(config: &ccm_engine::Config) -> NvidiaDevices {
    ccm_engine::claims::with_stand_ins(config, ccm_process::claims::nvidia_devices().unwrap_or_default())
}

/// Which processes are children forked after a CUDA parent's `cuInit` (the plugin claims their nodes) rather than
/// CUDA processes (the driver checkpoints them), decided as the dump decides: the driver has a context (a restore
/// thread) for a process that ran `cuInit` itself, whatever memory it holds (torchrun's elastic agent initialises
/// CUDA and allocates nothing: the dump checkpoints it), and none for a forked child. From outside, the kernel tells
/// the two apart: a forked child's NVIDIA descriptors are all its parent's open files (`kcmp`).
fn classify_forked(mut rows: Vec<ProcessRow>, devices: &NvidiaDevices) -> Vec<ProcessRow> {
    let verdicts: Vec<Option<HolderFacts>> = rows
        .iter()
        .map(|r| {
            let holds = !r.holdings.fds.is_empty() || !r.holdings.mappings.is_empty();
            // Its own descriptors were read with its row: only its parent's are read here.
            let inherited =
                if holds { ccm_process::forked::fds_all_parents(r.pid, &r.holdings.fds, devices) } else { None };
            let facts = ForkFacts {
                holds,
                cuda_like: r.cuda,
                own_memory: r.gpus.iter().any(|g| g.memory.is_some_and(|m| m.total() > 0)),
                parents_files_only: inherited,
                uvm_mapping: r.holdings.mappings.iter().any(|m| m.node == NvidiaNode::Uvm),
                own_memory_known: own_memory_known(r),
            };
            is_forked_holder(&facts).then(|| HolderFacts {
                descriptors: r.holdings.fds.len(),
                mappings: r.holdings.mappings.len(),
                inherited_from: (inherited == Some(true)).then(|| ccm_process::tree::parent_of(r.pid)).flatten(),
            })
        })
        .collect();
    for (r, v) in rows.iter_mut().zip(verdicts) {
        if v.is_some() {
            r.cuda = false;
        }
        r.forked_holder = v;
    }
    rows
}

/// What [`is_forked_holder`] decides by.
struct ForkFacts {
    /// It holds NVIDIA descriptors or mappings.
    holds: bool,
    /// It maps libcuda and holds a GPU node or GPU memory (what a CUDA process looks like from outside).
    cuda_like: bool,
    /// The resource manager shows GPU memory of its own.
    own_memory: bool,
    /// Whether its NVIDIA descriptors are all its parent's open files (`None`: the kernel could not tell).
    parents_files_only: Option<bool>,
    /// It maps `/dev/nvidia-uvm` (a CUDA process does; a fork does not copy that mapping: VM_DONTCOPY).
    uvm_mapping: bool,
    own_memory_known: bool,
}

/// A holder of NVIDIA nodes without a CUDA context of its own. The kernel's answer decides when it has one; without
/// it, a process with no memory of its own and no nvidia-uvm mapping is taken for a fork.
fn is_forked_holder(f: &ForkFacts) -> bool {
    if !f.holds {
        return false;
    }
    match f.parents_files_only {
        Some(true) => true,
        Some(false) => !f.cuda_like,
        None => !f.cuda_like || !f.own_memory && !f.uvm_mapping && f.own_memory_known,
    }
}

/// Whether the resource manager answered for this process (its memory is known to be none).
fn own_memory_known(r: &ProcessRow) -> bool {
    !r.gpus.is_empty() && r.gpus.iter().all(|g| g.memory.is_some())
}

/// One process: its CUDA use from `/proc` and the resource manager's answers.
fn row(pid: u32, rm: Option<&PidMemoryReport>, node_gpus: &[GpuIdentity], devices: &NvidiaDevices) -> ProcessRow {
    // A process names itself (`prctl(PR_SET_NAME)`): escaped before it reaches the table or a verdict line.
    let command = ccm_identity::text::shown(&ccm_process::tree::comm(pid).unwrap_or_default());
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
    let holdings = ccm_process::claims::holdings(pid, &maps, devices).unwrap_or_default();
    let criu_cannot_dump = ccm_process::undumpable::undumpable(pid, &maps).unwrap_or_default();
    ProcessRow { pid, command, cuda, importer: false, gpus, forked_holder: None, criu_cannot_dump, holdings }
}

/// The unix sockets the processes of `tree` hold that are bound to a path, each namespace's list read once.
fn bound_sockets(tree: &[u32]) -> Vec<BoundSocket> {
    use ccm_process::sockets;
    let mut by_namespace: std::collections::BTreeMap<u64, std::collections::BTreeMap<u64, String>> = Default::default();
    let mut out = Vec::new();
    for &pid in tree {
        let Ok(process) = sockets::ProcessSockets::open(pid) else { continue };
        let Ok(inodes) = process.socket_inodes() else { continue };
        if inodes.is_empty() {
            continue;
        }
        let Ok(ns) = process.net_namespace() else { continue };
        let bound = by_namespace.entry(ns).or_insert_with(|| process.bound_unix_sockets().unwrap_or_default());
        out.extend(
            inodes
                .iter()
                .filter_map(|i| bound.get(i))
                .map(|path| BoundSocket { pid, path: ccm_identity::text::shown(path) }),
        );
        if out.len() >= MAX_BOUND_SOCKETS {
            out.truncate(MAX_BOUND_SOCKETS);
            break;
        }
    }
    out
}

/// The line for a move to another node: the folders of the tree's bound unix sockets, with the pids binding there.
fn bound_sockets_line(sockets: &[BoundSocket]) -> Option<String> {
    if sockets.is_empty() {
        return None;
    }
    let mut folders: std::collections::BTreeMap<&str, BTreeSet<u32>> = Default::default();
    for s in sockets {
        let folder = s.path.rsplit_once('/').map(|(d, _)| if d.is_empty() { "/" } else { d }).unwrap_or("/");
        folders.entry(folder).or_default().insert(s.pid);
    }
    let listed: Vec<String> = folders
        .iter()
        .map(|(f, pids)| format!("{f} (pid {})", pids.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")))
        .collect();
    Some(format!(
        "for a move to another node: {} unix socket(s) bound in {}: CRIU binds each again at restore, at the same path, \
         so these folders must exist on the restoring node (a container's checkpoint carries what it wrote in its own \
         file system; for a bare process, copy them with the images, or start it with TMPDIR inside a folder you carry)",
        sockets.len(),
        listed.join(", ")
    ))
}

fn mib(b: u64) -> String {
    format!("{} MiB", b.div_ceil(1 << 20))
}

fn print_table(r: &JobReport) {
    println!("job of pid {}: {} process(es), {} CUDA process(es)", r.pid, r.processes.len(), r.cuda_processes.len());
    println!("{:<8} {:<16} {:<5} {:<46} {:>12} {:>10}", "pid", "command", "CUDA", "GPU", "memory", "imported");
    for p in &r.processes {
        let cuda = if p.cuda {
            "yes"
        } else if p.forked_holder.is_some() {
            "fork"
        } else {
            "no"
        };
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
            let mark = match g.memory.is_some_and(|m| m.shared_duped > 0) {
                true if r.mps_clients.contains(&p.pid) => "  <- MPS client",
                true => "  <- importer",
                false => "",
            };
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
    if let Some(line) = bound_sockets_line(&r.bound_sockets) {
        println!("{line}");
    }
    let head = match r.verdict {
        "ready" => "ready",
        "would-fail" => "would fail",
        _ => "would be refused",
    };
    println!("verdict: {head}: {}", r.message);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(parents_files_only: Option<bool>) -> ForkFacts {
        ForkFacts {
            holds: true,
            cuda_like: true,
            own_memory: false,
            parents_files_only,
            uvm_mapping: false,
            own_memory_known: true,
        }
    }

    /// Issue 46: torchrun's elastic agent ran cuInit itself (its NVIDIA descriptors are its own), allocates nothing
    /// and maps no nvidia-uvm: the driver gives it a restore thread and the dump checkpoints it, so `job` lists it as
    /// a CUDA process, not as a fork (it said `fork` before). A DataLoader worker's descriptors are all its parent's.
    #[test]
    fn the_agent_is_a_cuda_process_and_a_worker_a_fork_as_the_dump_decides() {
        assert!(!is_forked_holder(&facts(Some(false))), "the agent");
        assert!(is_forked_holder(&facts(Some(true))), "a DataLoader worker");
        // Without the kernel's answer: no memory and no nvidia-uvm mapping reads as a fork, as before.
        assert!(is_forked_holder(&facts(None)));
        assert!(!is_forked_holder(&ForkFacts { own_memory: true, ..facts(None) }));
        assert!(!is_forked_holder(&ForkFacts { holds: false, ..facts(Some(true)) }));
        // Not looking like a CUDA process at all (no libcuda, or no GPU node or memory): whatever it holds is no
        // context of its own.
        assert!(is_forked_holder(&ForkFacts { cuda_like: false, ..facts(Some(false)) }));
    }

    #[test]
    fn bound_sockets_are_named_by_folder_with_the_pids_binding_there() {
        assert_eq!(bound_sockets_line(&[]), None);
        let sockets = [
            BoundSocket { pid: 41, path: "/tmp/pymp-a1/listener-x".into() },
            BoundSocket { pid: 42, path: "/tmp/pymp-a1/listener-y".into() },
            BoundSocket { pid: 40, path: "/ctl.sock".into() },
        ];
        let line = bound_sockets_line(&sockets).unwrap();
        assert!(
            line.starts_with(
                "for a move to another node: 3 unix socket(s) bound in / (pid 40), /tmp/pymp-a1 (pid 41, 42): "
            ),
            "{line}"
        );
        assert!(line.contains("must exist on the restoring node"));
    }
}
