//! The NVIDIA nodes held by processes of the tree that are no CUDA processes (children forked after
//! their parent's `cuInit`: DataLoader and `multiprocessing.Pool` workers, a bare `os.fork()`), which
//! the plugin claims so that CRIU can dump and restore them (`ccm_identity::claims` says what each
//! becomes).
//!
//! - Dump: CHECKPOINT_DEVICES of a process that is no CUDA process records what it holds
//!   ([`DumpClaims::record_holder`]); CRIU then asks about each device mapping (HANDLE_DEVICE_VMA:
//!   [`DumpClaims::device_vma`]) and each open file it cannot dump (DUMP_EXT_FILE:
//!   [`DumpClaims::ext_file`]). Every claim is written at once into `cuda-migrate-devices.img` (a
//!   post-dump script may take the images away before CRIU's end).
//! - Restore: `init(RESTORE)` reads that file and decides, before CRIU restores anything, which node of
//!   this node each descriptor opens, through the restore's device map ([`RestoreClaims::plan`]); in
//!   the restored task CRIU asks for each descriptor (RESTORE_EXT_FILE: [`RestoreClaims::reopen`]) and
//!   each mapping (UPDATE_VMA_MAP: [`RestoreClaims::placeholder`]).
//!
//! Nothing is claimed by path: device numbers decide, from `/proc/devices` (or the test doubles'
//! stand-ins, `CCM_TEST_DOUBLE_NVIDIA_DEVICES`).

use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ccm_identity::claims::{
    ClaimedFile, ClaimsTally, DevNumber, DeviceClaims, DeviceHolder, NvidiaDevices, NvidiaNode, CLAIMS_FILE_NAME,
    MAX_CLAIMS_BYTES,
};
use ccm_identity::{GpuIdentity, GpuUuid, HostPid};
use ccm_process::claims::Holdings;
use ccm_process::dir::{Dir, FileError};
use ccm_process::ProcessError;
use log::{debug, info, warn};

use crate::config::Config;
use crate::host::CriuHost;
use crate::preflight::ProcessPlan;
use crate::seam::Targets;

pub use crate::error::{ClaimError, ClaimsReadError, NoNodeReason};

/// The NVIDIA device numbers of this node, the test doubles' stand-ins added.
pub fn node_devices(config: &Config, targets: &dyn Targets) -> NvidiaDevices {
    with_stand_ins(config, targets.nvidia_devices())
}

/// `real` (a node's NVIDIA device numbers) with the test doubles' stand-ins the configuration names added: the one
/// rule the plugin, `job` and `preflight` read devices by.
pub fn with_stand_ins(config: &Config, real: NvidiaDevices) -> NvidiaDevices {
    match &config.test_double_devices {
        // Checked when the configuration was read.
        Some(v) => real.clone().with_stand_ins(v).unwrap_or(real),
        None => real,
    }
}

/// What processes hold of the NVIDIA nodes, read ahead of their hooks ([`read_holdings`]): each entry is taken once.
#[derive(Debug, Default)]
pub struct ReadHoldings {
    by_pid: BTreeMap<u32, Result<(String, Holdings), ProcessError>>,
    /// The kernel driver's GPUs (the claims' minors), read beside them when any process holds a node.
    pub kernel_gpus: Option<Vec<GpuIdentity>>,
    elapsed: Duration,
}

impl ReadHoldings {
    /// `pid`'s holdings, if they were read (and not taken yet).
    pub fn take(&mut self, pid: u32) -> Option<Result<(String, Holdings), ProcessError>> {
        self.by_pid.remove(&pid)
    }
    pub fn len(&self) -> usize {
        self.by_pid.len()
    }
    pub fn is_empty(&self) -> bool {
        self.by_pid.is_empty()
    }
    pub fn elapsed_ms(&self) -> f64 {
        self.elapsed.as_secs_f64() * 1e3
    }
}

/// Processes one reading thread takes at least (a thread costs about what reading one process does).
const PIDS_PER_READER: usize = 4;
/// Most reading threads (each reads `/proc`, one process after the other).
const MAX_READERS: usize = 4;

/// What each of `pids` holds of `devices`, read in up to [`MAX_READERS`] threads (all joined before it returns).
/// A process whose thread panicked is left out: its hook reads it.
pub fn read_holdings(targets: &dyn Targets, devices: &NvidiaDevices, pids: &[u32]) -> ReadHoldings {
    let t0 = Instant::now();
    if pids.is_empty() {
        return ReadHoldings::default();
    }
    let readers = pids.len().div_ceil(PIDS_PER_READER).clamp(1, MAX_READERS);
    let chunk = pids.len().div_ceil(readers);
    let by_pid = std::thread::scope(|s| {
        let threads: Vec<_> = pids
            .chunks(chunk)
            .map(|c| s.spawn(move || c.iter().map(|&p| (p, targets.device_holdings(p, devices))).collect::<Vec<_>>()))
            .collect();
        threads.into_iter().filter_map(|t| t.join().ok()).flatten().collect::<BTreeMap<_, _>>()
    });
    let holds_any = by_pid.values().any(|r| r.as_ref().is_ok_and(|(_, h)| !h.mappings.is_empty() || !h.fds.is_empty()));
    let kernel_gpus = holds_any.then(|| targets.kernel_gpus().ok()).flatten().filter(|g| !g.is_empty());
    ReadHoldings { by_pid, kernel_gpus, elapsed: t0.elapsed() }
}

/// The dump's side.
#[derive(Default)]
pub struct DumpClaims {
    devices: Option<NvidiaDevices>,
    claims: Option<DeviceClaims>,
    /// The claims file, created at the first claim; every later claim is appended to it.
    file: Option<ccm_process::dir::RewrittenFile>,
    /// Bytes in the file so far: the next append's offset.
    written: u64,
    /// What the claims will take, checked against the one bound before each process is recorded.
    tally: Option<ClaimsTally>,
    /// Which NVIDIA nodes each recorded process maps (by the pid CRIU dumps it as): HANDLE_DEVICE_VMA's lookup.
    mapped: BTreeMap<u32, BTreeSet<NvidiaNode>>,
    /// Time spent writing the claims in this dump, against [`WRITE_BUDGET`].
    write_time: Duration,
}

/// The most time one dump may spend writing its claims (each claim is an append of a line: microseconds; a
/// filesystem that stalls fails the dump with this said, instead of holding the frozen tree).
pub const WRITE_BUDGET: Duration = Duration::from_secs(10);

/// What HANDLE_DEVICE_VMA and DUMP_EXT_FILE answer.
#[derive(Debug)]
pub enum Claim {
    /// Not an NVIDIA node: CRIU asks the next plugin.
    NotMine,
    /// Claimed (for a file: written into the claims).
    Mine,
    Refused(ClaimError),
}

/// The claims file's bound over a tree's holdings, read ahead before any lock: the first process that would cross
/// it, with the bound's words. The same check each claim makes ([`add_within_bound`]), and `criu-cuda-migrate job`
/// makes; the header is reserved at its longest ([`ccm_identity::claims::MAX_HEADER_LINE`]).
pub fn check_tree_bounds<'a>(
    holders: impl IntoIterator<Item = (u32, &'a str, &'a Holdings)>,
) -> Result<ClaimsTally, ClaimError> {
    let mut tally = ClaimsTally::new(ccm_identity::claims::MAX_HEADER_LINE);
    for (pid, comm, held) in holders {
        if held.mappings.is_empty() && held.fds.is_empty() {
            continue;
        }
        add_within_bound(&mut tally, &holder_of(pid, pid, comm, held.clone()))?;
    }
    Ok(tally)
}

/// The record of process `host_pid` (`ns_pid` in its own namespace) and what it holds.
fn holder_of(ns_pid: u32, host_pid: u32, comm: &str, held: Holdings) -> DeviceHolder {
    DeviceHolder {
        pid: ns_pid,
        host_pid,
        comm: comm.chars().take(ccm_identity::claims::MAX_TEXT).collect(),
        mappings: held.mappings,
        fds: held.fds,
        creds: held.creds,
    }
}

/// Adds `h` to `tally`, or says which bound it would cross, naming the process.
fn add_within_bound(tally: &mut ClaimsTally, h: &DeviceHolder) -> Result<(), ClaimError> {
    tally.add(h).map_err(|why| ClaimError::OverBound {
        pid: h.host_pid,
        comm: ccm_identity::text::shown(&h.comm),
        holders: tally.holders,
        why,
    })
}

impl DumpClaims {
    /// The node's NVIDIA device numbers, read once per dump (the claims and the managed-memory check share them).
    pub(crate) fn devices(&mut self, config: &Config, targets: &dyn Targets) -> &NvidiaDevices {
        self.devices.get_or_insert_with(|| node_devices(config, targets))
    }

    /// CHECKPOINT_DEVICES of `pid`, which is no CUDA process: records the NVIDIA nodes it holds. What it
    /// recorded (a line for the log), or `None` when it holds none.
    /// `read`: its holdings when read already (the tree's, at the first hook), else they are read here.
    #[allow(clippy::too_many_arguments)]
    pub fn record_holder(
        &mut self,
        pid: HostPid,
        ns_pid: u32,
        read: Option<Result<(String, Holdings), ProcessError>>,
        config: &Config,
        targets: &dyn Targets,
        gpus: impl FnOnce() -> Vec<GpuIdentity>,
        host: &dyn CriuHost,
    ) -> Result<Option<String>, ClaimError> {
        let devices = self.devices(config, targets).clone();
        if devices.is_empty() {
            return Ok(None);
        }
        // Every process of every tree dumped on a GPU node comes here: one whose holdings cannot be read is left to
        // CRIU, which fails the dump itself, naming the mapping, if it does hold an NVIDIA node (a warning says why
        // the plugin could not claim it; HANDLE_DEVICE_VMA claims no mapping for it), and dumps it as before if it
        // does not.
        let (comm, held) = match read.unwrap_or_else(|| targets.device_holdings(pid.get(), &devices)) {
            Ok(h) => h,
            Err(e) => {
                warn!("{}", ClaimError::Unreadable { pid, why: Arc::new(e) });
                return Ok(None);
            }
        };
        if let Some((what, name)) = held.unclaimed.first() {
            return Err(ClaimError::Unclaimable {
                pid,
                comm: ccm_identity::text::shown(&comm),
                what: what.clone(),
                name: name.clone(),
            });
        }
        if held.mappings.is_empty() && held.fds.is_empty() {
            return Ok(None);
        }
        let claims = self.claims.get_or_insert_with(|| {
            let minors = gpus().into_iter().map(|g| (g.minor, g.uuid)).collect::<BTreeMap<u32, GpuUuid>>();
            DeviceClaims::new(&targets.hostname(), minors)
        });
        let holder = holder_of(ns_pid, pid.get(), &comm, held);
        let replaces = claims.holders.iter().any(|h| h.host_pid == pid.get() || h.pid == ns_pid);
        if replaces {
            claims.holders.retain(|h| h.host_pid != pid.get() && h.pid != ns_pid);
            self.tally = None;
        }
        let tally = self.tally.get_or_insert_with(|| {
            let mut t = ClaimsTally::new(claims.header_line().len());
            for h in &claims.holders {
                // Each was added through this check already.
                let _ = t.add(h);
            }
            t
        });
        add_within_bound(tally, &holder)?;
        let line = format!(
            "pid {pid} ({}) is no CUDA process but holds {} NVIDIA descriptor(s) and {} device mapping(s), inherited \
             from a CUDA parent (a child forked after cuInit): claimed; the descriptors are reopened on the restoring \
             node and the mappings restored as inert placeholders",
            ccm_identity::text::shown(&holder.comm),
            holder.fds.len(),
            holder.mappings.len()
        );
        self.mapped.insert(pid.get(), holder.mappings.iter().map(|m| m.node).collect());
        let appended = ccm_identity::claims::holder_line(&holder);
        claims.holders.push(holder);
        if replaces {
            self.write_all(host)?;
        } else {
            self.append(&appended, host)?;
        }
        Ok(Some(line))
    }

    /// HANDLE_DEVICE_VMA: a device mapping CRIU cannot dump. Claimed when it is an NVIDIA node that the process
    /// CRIU is parsing (`parsed`: the pid whose mappings CRIU walks now) was recorded mapping (its content is the
    /// driver's, not the process's: nothing to dump). When CRIU's task cannot be told, any recorded process mapping
    /// the node will do (a debug line says so).
    pub fn device_vma(
        &mut self,
        number: DevNumber,
        parsed: Option<u32>,
        config: &Config,
        targets: &dyn Targets,
    ) -> Claim {
        let Some(node) = self.devices(config, targets).classify(number) else { return Claim::NotMine };
        let recorded = match parsed {
            Some(pid) => self.mapped.get(&pid).is_some_and(|nodes| nodes.contains(&node)),
            None => {
                debug!("device mapping of {node}: the task CRIU parses could not be told; any recorded holder counts");
                self.mapped.values().any(|nodes| nodes.contains(&node))
            }
        };
        if recorded {
            debug!("device mapping of {node} ({number}): claimed, restored as a placeholder");
            Claim::Mine
        } else {
            Claim::Refused(ClaimError::UnknownMapping { node, pid: parsed })
        }
    }

    /// DUMP_EXT_FILE: an open file CRIU cannot dump (CRIU's `id`, the file's device and open flags).
    pub fn ext_file(
        &mut self,
        id: u32,
        number: DevNumber,
        flags: i32,
        config: &Config,
        targets: &dyn Targets,
        host: &dyn CriuHost,
    ) -> Claim {
        let Some(node) = self.devices(config, targets).classify(number) else { return Claim::NotMine };
        let Some(claims) = self.claims.as_mut() else {
            // A CUDA process's own descriptors are the driver's (it closes them at its checkpoint): one here
            // belongs to no process the dump recorded.
            return Claim::Refused(ClaimError::UnknownMapping { node, pid: None });
        };
        let gpu = match node {
            NvidiaNode::Gpu(minor) => match claims.gpus.get(&minor) {
                Some(u) => Some(*u),
                None => return Claim::Refused(ClaimError::UnknownGpu { node, id, minor }),
            },
            _ => None,
        };
        let file = ClaimedFile { id, node, gpu, flags };
        let replaces = claims.file(id).is_some();
        if !replaces && claims.files.len() >= ccm_identity::claims::MAX_FILES {
            return Claim::Refused(ClaimError::TooManyFiles { max: ccm_identity::claims::MAX_FILES });
        }
        let line = ccm_identity::claims::file_line(&file);
        claims.add_file(file);
        debug!("open file {id:#x} of {node}: claimed, reopened at restore");
        let written = if replaces { self.write_all(host) } else { self.append(&line, host) };
        match written {
            Ok(()) => Claim::Mine,
            Err(e) => Claim::Refused(e),
        }
    }

    /// The claims file, created (not through a link, mode 0600, empty) at the first claim.
    fn open_file(&mut self, host: &dyn CriuHost) -> Result<(), ClaimError> {
        if self.file.is_none() {
            let fd = host.image_dir().ok_or(ClaimError::NoImageDir)?;
            let dir = Dir::from_owned(fd, PathBuf::from("CRIU's image directory"))
                .map_err(|e| ClaimError::Write(Arc::new(e)))?;
            self.file =
                Some(dir.create_rewritten(CLAIMS_FILE_NAME, 0o600).map_err(|e| ClaimError::Write(Arc::new(e)))?);
            self.written = 0;
        }
        Ok(())
    }

    /// Appends one claim's line: written at once, since a post-dump script may take the images before CRIU's end.
    /// Linear in what is claimed: each claim writes its own line only (before: the whole file per claim, 19 ms a
    /// call at 30 000 mappings). The first claim writes the header with it. Not synced: as durable as CRIU's own
    /// images.
    fn append(&mut self, line: &[u8], host: &dyn CriuHost) -> Result<(), ClaimError> {
        let t0 = Instant::now();
        if self.file.is_none() {
            self.open_file(host)?;
            self.write_all_records()?;
        } else if let Some(file) = &self.file {
            file.write_at(line, self.written).map_err(|e| ClaimError::Write(Arc::new(e)))?;
            self.written += line.len() as u64;
        }
        self.spent(t0.elapsed())
    }

    /// Rewrites the whole file: only when a claim replaces an earlier one (a process or file asked about twice).
    fn write_all(&mut self, host: &dyn CriuHost) -> Result<(), ClaimError> {
        let t0 = Instant::now();
        self.open_file(host)?;
        self.write_all_records()?;
        self.spent(t0.elapsed())
    }

    fn write_all_records(&mut self) -> Result<(), ClaimError> {
        let (Some(claims), Some(file)) = (&self.claims, &self.file) else { return Ok(()) };
        let bytes = claims.encode();
        file.rewrite(&bytes).map_err(|e| ClaimError::Write(Arc::new(e)))?;
        self.written = bytes.len() as u64;
        Ok(())
    }

    fn spent(&mut self, d: Duration) -> Result<(), ClaimError> {
        self.write_time += d;
        if self.write_time > WRITE_BUDGET {
            return Err(ClaimError::WriteDeadline { spent: self.write_time.as_secs_f64() });
        }
        Ok(())
    }
}

/// Reads the claims of an image directory, if the dump wrote any.
pub fn read_claims(dir: &Dir) -> Result<Option<DeviceClaims>, ClaimError> {
    let path = dir.shown_file(CLAIMS_FILE_NAME);
    let bytes = match dir.read_file(CLAIMS_FILE_NAME, MAX_CLAIMS_BYTES as u64) {
        Ok(b) => b,
        Err(FileError::Missing { .. }) => return Ok(None),
        Err(e) => return Err(ClaimError::Read { path, why: ClaimsReadError::File(Arc::new(e)) }),
    };
    DeviceClaims::decode(&bytes).map(Some).map_err(|e| ClaimError::Read { path, why: e.into() })
}

/// The restore's side: the claims and, for each claimed open file, the node it opens here.
#[derive(Debug, Clone)]
pub struct RestoreClaims {
    pub claims: DeviceClaims,
    /// CRIU's file id → what it opens on this node.
    reopen: BTreeMap<u32, Reopen>,
    /// CRIU's own mounts, read in CRIU's process when a descriptor moves to another GPU's node: the file systems
    /// a restored task's `/dev` must not be for the plugin to add that node there (`set_host_mounts`).
    host_mounts: Vec<ccm_process::mountinfo::MountEntry>,
}

/// One claimed descriptor at restore: the node it opens on this node, that node's device number, the open flags,
/// and the node it was at dump.
#[derive(Debug, Clone, Copy)]
struct Reopen {
    node: NvidiaNode,
    number: DevNumber,
    flags: i32,
    held: NvidiaNode,
}

impl RestoreClaims {
    /// Decides which node of this node each claimed descriptor opens: GPU nodes through the device map
    /// the CUDA processes' plans chose (every plan that pairs a GPU must pair it alike), else the same
    /// GPU, else the only usable one. A node this node lacks refuses the restore, naming it.
    /// `usable`: the GPUs this restore may use (the usable-GPU setting, else the restoring runtime's spec, else
    /// every GPU: the CUDA processes' rule); `config`'s explicit device map pairs a dump GPU that no CUDA process's
    /// plan does (a tree of forked holders alone has no plan).
    pub fn plan(
        claims: DeviceClaims,
        devices: &NvidiaDevices,
        plans: &[ProcessPlan],
        node_gpus: &[GpuIdentity],
        usable: &[GpuUuid],
        config: &Config,
    ) -> Result<RestoreClaims, ClaimError> {
        let explicit: &[(GpuUuid, GpuUuid)] = config.device_map.as_ref().map_or(&[], |m| &m.value);
        let mut reopen = BTreeMap::new();
        for f in &claims.files {
            let no = |why: NoNodeReason| ClaimError::NoNode { node: f.node, id: f.id, why };
            let node = match (f.node, f.gpu) {
                (NvidiaNode::Gpu(_), Some(old)) => {
                    let new = gpu_target(old, plans, node_gpus, usable, explicit).map_err(no)?;
                    let minor = node_gpus
                        .iter()
                        .find(|g| g.uuid == new)
                        .map(|g| g.minor)
                        .ok_or_else(|| no(NoNodeReason::NoMinor(new)))?;
                    NvidiaNode::Gpu(minor)
                }
                (n, _) => n,
            };
            let number = devices.number_of(node).ok_or_else(|| no(NoNodeReason::NotRegistered(node.dev_name())))?;
            reopen.insert(f.id, Reopen { node, number, flags: f.flags, held: f.node });
        }
        Ok(RestoreClaims { claims, reopen, host_mounts: Vec::new() })
    }

    /// The GPU nodes (minors on this node) the claimed descriptors open.
    pub fn gpu_minors(&self) -> Vec<u32> {
        let mut m: Vec<u32> = self
            .reopen
            .values()
            .filter_map(|r| match r.node {
                NvidiaNode::Gpu(minor) => Some(minor),
                _ => None,
            })
            .collect();
        m.sort_unstable();
        m.dedup();
        m
    }

    /// The GPUs (minor, and its UUID among `gpus`, else `minor N`) whose nodes the restore reopens.
    pub fn gpu_targets(&self, gpus: &[GpuIdentity]) -> Vec<(u32, String)> {
        self.gpu_minors()
            .into_iter()
            .map(|m| {
                let gpu = gpus.iter().find(|g| g.minor == m);
                (m, gpu.map_or_else(|| format!("minor {m}"), |g| g.uuid.to_string()))
            })
            .collect()
    }

    /// Whether a descriptor opens another GPU's node than it held at dump (a node the restored `/dev` may lack).
    pub fn moves_a_gpu_node(&self) -> bool {
        self.reopen.values().any(|r| r.node != r.held && matches!(r.node, NvidiaNode::Gpu(_)))
    }

    /// CRIU's own mounts ([`ccm_process::container::own_mounts`], read in CRIU's process before the tasks exist).
    pub fn set_host_mounts(&mut self, mounts: Vec<ccm_process::mountinfo::MountEntry>) {
        self.host_mounts = mounts;
    }

    /// The log lines of the plan: each process and what it gets.
    pub fn describe(&self) -> String {
        let mut lines = self.claims.summary_lines();
        for (id, r) in &self.reopen {
            lines.push(format!("file {id:#x}: reopened as {} ({})", r.node, r.number));
        }
        lines.join("\n")
    }

    /// RESTORE_EXT_FILE, in the restored task `ns_pid`: the claimed file `id` opened anew, no wider than the
    /// driver opens such a node, and only if the task's credentials at dump could open it here. `None`: not ours.
    /// A descriptor moved onto another GPU's node that the restored `/dev` lacks gets that node added first
    /// ([`ccm_process::claims::reopen_moved_gpu_node`]), once CRIU's mounts were read ([`Self::set_host_mounts`]).
    pub fn reopen(&self, id: u32, ns_pid: u32) -> Option<Result<OwnedFd, ccm_process::claims::ReopenError>> {
        let r = self.reopen.get(&id)?;
        let creds = self.claims.holder(ns_pid).and_then(|h| h.creds.as_ref());
        let flags = ccm_identity::claims::narrowed_flags(r.node, r.flags);
        if r.node == r.held || self.host_mounts.is_empty() {
            return Some(ccm_process::claims::reopen_node(r.node, r.number, flags, creds));
        }
        let opened =
            ccm_process::claims::reopen_moved_gpu_node(r.node, r.held, r.number, flags, creds, &self.host_mounts);
        Some(opened.map(|(fd, added)| {
            if added {
                info!(
                    "pid {ns_pid}: added {} ({}) to the restored container's /dev for file {id:#x} (held {} at dump): \
                     CRIU's copy of the dumped /dev lacks the node of the GPU it moved to",
                    r.node, r.number, r.held
                );
            }
            fd
        }))
    }

    /// UPDATE_VMA_MAP, in the restored task `ns_pid`: the placeholder behind its claimed mapping at `addr`
    /// (mapped at offset 0). `None`: not a mapping this dump claimed.
    pub fn placeholder(&self, ns_pid: u32, addr: u64) -> Option<Result<OwnedFd, ccm_process::claims::Errno>> {
        let holder = self.claims.holder(ns_pid)?;
        holder.mapping_at(addr)?;
        Some(ccm_process::claims::placeholder(holder.placeholder_bytes()))
    }
}

/// The GPU of this node that a claimed descriptor of dump GPU `old` opens: the GPU the CUDA processes' map sends
/// it to, else the explicit device map's, else the same GPU, else the only usable one; always a usable GPU of this
/// node (a GPU given to another tenant is never opened).
fn gpu_target(
    old: GpuUuid,
    plans: &[ProcessPlan],
    node_gpus: &[GpuIdentity],
    usable: &[GpuUuid],
    explicit: &[(GpuUuid, GpuUuid)],
) -> Result<GpuUuid, NoNodeReason> {
    let allowed = |new: GpuUuid| usable.contains(&new) && node_gpus.iter().any(|g| g.uuid == new);
    let checked = |new: GpuUuid| if allowed(new) { Ok(new) } else { Err(NoNodeReason::NotUsable { old, new }) };
    let mut paired: Vec<GpuUuid> =
        plans.iter().flat_map(|p| p.map.pairs.iter()).filter(|pair| pair.old == old).map(|pair| pair.new).collect();
    paired.sort();
    paired.dedup();
    match paired.as_slice() {
        [one] => return checked(*one),
        [] => {}
        many => return Err(NoNodeReason::MapsDisagree { old, new: many.to_vec() }),
    }
    if let Some((_, new)) = explicit.iter().find(|(o, _)| *o == old) {
        return checked(*new);
    }
    if allowed(old) {
        return Ok(old);
    }
    match usable {
        [only] if allowed(*only) => Ok(*only),
        _ => Err(NoNodeReason::Unplaced { old, usable: usable.len() }),
    }
}

/// Logs the claims a restore holds (once, at init).
pub fn log_plan(c: &RestoreClaims) {
    info!(
        "{} forked process(es) of the checkpoint hold NVIDIA nodes without a CUDA context (dumped on {}):\n{}",
        c.claims.holders.len(),
        ccm_identity::text::shown(&c.claims.hostname),
        c.describe()
    );
}
