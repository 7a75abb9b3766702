//! Device-map rules for restore: which GPU of this node takes the place of each GPU the process
//! had at dump.
//!
//! The driver's restore call needs one `old -> new` pair for every GPU the process's libcuda
//! enumerated at its start (including GPUs hidden only by `CUDA_VISIBLE_DEVICES`), never two old
//! GPUs on one new GPU, and the same chip for every GPU the process actually uses. The rules:
//!
//! 1. Explicit pairs (`CRIU_CUDA_MIGRATE_DEVICE_MAP`) are taken first; a pair that names a GPU the
//!    process did not enumerate, a GPU this node does not have, or that cannot hold a used GPU, is
//!    an error, never silently dropped.
//! 2. Every used GPU without an explicit pair keeps its own GPU when it is on this node, usable and
//!    free; otherwise it gets a usable GPU of the same chip with at least as much memory,
//!    preferring the same PCI location where that keeps the used GPUs in the PCI order they had at
//!    dump, otherwise in the process's ordinal order. (A pod given 03/13/63/73 at dump and
//!    63/83/E3/F3 at restore: 63 keeping its location would put cuda:2 before cuda:0 in PCI order,
//!    unlike any container started there, so it goes 03→63, 13→83, 63→E3, 73→F3.)
//! 3. The enumerated-but-unused GPUs get the rest: their own GPU where free, else the same chip
//!    where possible, else any free GPU. They are placeholders the driver demands and need not be
//!    usable.
//!
//! On one machine this yields a permutation; across machines (foreign old UUIDs) a one-to-one
//! assignment.

use std::collections::HashSet;
use std::fmt;

use crate::gpu::{GpuIdentity, GpuUuid, PciAddress};
use crate::image::IdentityImage;
use crate::table;

/// Environment variable with the explicit map (named in error messages; `ccm_settings::DEVICE_MAP`, a test there
/// holds the two equal).
pub const DEVICE_MAP_VAR: &str = "CRIU_CUDA_MIGRATE_DEVICE_MAP";
/// Environment variable with the GPUs a restore may use (named in error messages; `ccm_settings::USABLE_GPUS`).
pub const USABLE_GPUS_VAR: &str = "CRIU_CUDA_MIGRATE_USABLE_GPUS";

/// Why a device map cannot be built, and what to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MapError {
    #[error("device map entry `{item}` is not OLD=NEW ({reason}); write the map as GPU-<uuid>=GPU-<uuid>[,...] with UUIDs from `nvidia-smi -L`")]
    BadPair { item: String, reason: String },
    #[error("usable GPU entry `{item}` is neither a GPU UUID nor an NVML index of this node ({reason}); list UUIDs or indices from `nvidia-smi -L`, comma-separated; this node has: {node}")]
    BadUsable { item: String, reason: String, node: String },
    #[error("the usable-GPU list names no GPU; leave it unset to let the restore use every GPU of this node, or list UUIDs or NVML indices")]
    EmptyUsable,
    #[error("usable GPU {uuid} is not on this node; this node has: {node}; fix the usable-GPU list")]
    UsableNotOnNode { uuid: GpuUuid, node: String },
    #[error("the identity image lists GPU {uuid} twice among the enumerated GPUs; the image is inconsistent: re-dump the process")]
    DuplicateEnumerated { uuid: GpuUuid },
    #[error("the identity image lists used GPU {uuid} which is not among the enumerated GPUs; the image is inconsistent: re-dump the process")]
    UsedNotEnumerated { uuid: GpuUuid },
    #[error("the identity image has no record (chip, memory) of used GPU {uuid}; the image is inconsistent: re-dump the process, or pair it explicitly with {DEVICE_MAP_VAR}")]
    UsedGpuUnknown { uuid: GpuUuid },
    #[error(
        "this node lists GPU {uuid} twice; the driver or NVML reported an inconsistent GPU list: check `nvidia-smi -L`"
    )]
    DuplicateNodeGpu { uuid: GpuUuid },
    #[error("the process enumerated {needed} GPUs at dump but this node has only {have} ({node}); the driver needs a pair for every enumerated GPU: restore on a node with at least {needed} GPUs")]
    TooFewGpus { needed: usize, have: usize, node: String },
    #[error("the device map names {old}, which the process did not enumerate at dump; its GPUs were: {enumerated}; fix the OLD side of the map")]
    ExplicitUnknownOld { old: GpuUuid, enumerated: String },
    #[error(
        "the device map maps to {new}, which is not on this node; this node has: {node}; fix the NEW side of the map"
    )]
    ExplicitUnknownNew { new: GpuUuid, node: String },
    #[error("the device map pairs {old} more than once; give each dump GPU one target")]
    ExplicitDuplicateOld { old: GpuUuid },
    #[error(
        "the device map maps both {first_old} and {second_old} onto {new}; each target GPU can take only one dump GPU"
    )]
    ExplicitDuplicateNew { new: GpuUuid, first_old: GpuUuid, second_old: GpuUuid },
    #[error("the device map maps used dump GPU {old} onto {new}, a different chip; the driver restores only onto the same chip: pick a GPU of the same model")]
    ExplicitWrongChip { old: String, new: String },
    #[error("the device map maps used dump GPU {old} onto {new}, which has less memory; pick a GPU with at least as much memory")]
    ExplicitTooLittleMemory { old: String, new: String },
    #[error("the device map maps used dump GPU {old} onto {new}, which the usable-GPU list ({USABLE_GPUS_VAR}) excludes; add it there or change the map")]
    ExplicitNotUsable { old: GpuUuid, new: GpuUuid },
    #[error("dump GPU {old} has no usable GPU of the same chip with enough memory on this node; usable: {usable}; set {USABLE_GPUS_VAR} or {DEVICE_MAP_VAR}")]
    NoSuitableGpu { old: String, usable: String },
    #[error("dump GPU {old} has no free usable GPU of the same chip with enough memory left: the process uses {used_count} GPUs and the suitable ones are taken; usable: {usable}; free more GPUs with {USABLE_GPUS_VAR} or pair them with {DEVICE_MAP_VAR}")]
    NotEnoughSuitable { old: String, used_count: usize, usable: String },
}

/// Which setting a [`MapError`] is about, so that the caller can name where its value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Concern {
    DeviceMap,
    UsableGpus,
    /// The image or the node, not a setting.
    Neither,
}

impl MapError {
    pub fn concerns(&self) -> Concern {
        match self {
            MapError::BadPair { .. }
            | MapError::ExplicitUnknownOld { .. }
            | MapError::ExplicitUnknownNew { .. }
            | MapError::ExplicitDuplicateOld { .. }
            | MapError::ExplicitDuplicateNew { .. }
            | MapError::ExplicitWrongChip { .. }
            | MapError::ExplicitTooLittleMemory { .. }
            | MapError::ExplicitNotUsable { .. } => Concern::DeviceMap,
            MapError::BadUsable { .. } | MapError::EmptyUsable | MapError::UsableNotOnNode { .. } => {
                Concern::UsableGpus
            }
            _ => Concern::Neither,
        }
    }
}

/// Why a pair was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum PairReason {
    /// Named in the explicit map.
    Explicit,
    /// The same GPU as at dump.
    Identity,
    /// Another GPU at the same PCI location (typically an identical node).
    SameLocation,
    /// The next free suitable GPU, keeping the process's ordinal order.
    OrdinalOrder,
    /// A placeholder for a GPU the process enumerated but does not use.
    Filler,
}

impl fmt::Display for PairReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PairReason::Explicit => "explicit map",
            PairReason::Identity => "same GPU",
            PairReason::SameLocation => "same PCI location",
            PairReason::OrdinalOrder => "ordinal order",
            PairReason::Filler => "placeholder (not used)",
        })
    }
}

/// One `old -> new` pair.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MapPair {
    pub old: GpuUuid,
    pub new: GpuUuid,
    /// The process uses the old GPU (not only enumerated it).
    pub used: bool,
    pub reason: PairReason,
}

/// The restore's device map: one pair per enumerated GPU of the image, in that order.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct DeviceMap {
    pub pairs: Vec<MapPair>,
}

impl DeviceMap {
    /// Every GPU stays where it was.
    pub fn is_identity(&self) -> bool {
        self.pairs.iter().all(|p| p.old == p.new)
    }

    /// A map of explicit pairs, every GPU used (the unit tests' maps).
    #[cfg(test)]
    pub(crate) fn explicit(pairs: &[(GpuUuid, GpuUuid)]) -> DeviceMap {
        DeviceMap {
            pairs: pairs
                .iter()
                .map(|&(old, new)| MapPair { old, new, used: true, reason: PairReason::Explicit })
                .collect(),
        }
    }

    /// The GPU that takes the place of `old`.
    pub fn new_for(&self, old: &GpuUuid) -> Option<GpuUuid> {
        self.pairs.iter().find(|p| p.old == *old).map(|p| p.new)
    }

    /// The pairs whose GPU changes.
    pub fn changed(&self) -> Vec<(GpuUuid, GpuUuid)> {
        self.pairs.iter().filter(|p| p.old != p.new).map(|p| (p.old, p.new)).collect()
    }

    /// Every pair, as the driver's restore call takes them.
    pub fn driver_pairs(&self) -> Vec<(GpuUuid, GpuUuid)> {
        self.pairs.iter().map(|p| (p.old, p.new)).collect()
    }

    /// A table for logs and the restore report: old GPU and bus, new GPU and bus, used, reason.
    pub fn render_table(&self, image: &IdentityImage, node_gpus: &[GpuIdentity]) -> String {
        let bus = |g: Option<&GpuIdentity>| g.map_or_else(|| "?".to_string(), |g| g.pci.to_string());
        let rows: Vec<Vec<String>> = self
            .pairs
            .iter()
            .map(|p| {
                vec![
                    p.old.to_string(),
                    bus(image.gpu(&p.old)),
                    "->".to_string(),
                    p.new.to_string(),
                    bus(node_gpus.iter().find(|g| g.uuid == p.new)),
                    if p.used { "yes" } else { "no" }.to_string(),
                    p.reason.to_string(),
                ]
            })
            .collect();
        table::render(&["dump GPU", "dump PCI", "", "restore GPU", "restore PCI", "used", "reason"], &rows)
    }
}

/// Everything [`plan`] decides from.
#[derive(Debug, Clone, Copy)]
pub struct MapRequest<'a> {
    pub image: &'a IdentityImage,
    /// The GPUs of the restore node, in NVML index order.
    pub node_gpus: &'a [GpuIdentity],
    /// GPUs the restore may put used GPUs on; `None`: all of `node_gpus`.
    pub usable: Option<&'a [GpuUuid]>,
    /// Explicit pairs, taken first.
    pub explicit: &'a [(GpuUuid, GpuUuid)],
}

/// Parses `OLD=NEW[,OLD=NEW...]` (UUIDs; whitespace around items and `=` is ignored, as are
/// empty items such as a trailing comma). Duplicates are reported by [`plan`].
pub fn parse_pairs(text: &str) -> Result<Vec<(GpuUuid, GpuUuid)>, MapError> {
    let mut pairs = Vec::new();
    for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let bad = |reason: String| MapError::BadPair { item: item.to_string(), reason };
        let (old, new) = item.split_once('=').ok_or_else(|| bad("no `=`".into()))?;
        let old: GpuUuid = old.trim().parse().map_err(|e| bad(format!("{e}")))?;
        let new: GpuUuid = new.trim().parse().map_err(|e| bad(format!("{e}")))?;
        pairs.push((old, new));
    }
    Ok(pairs)
}

/// One GPU of a usable-GPU list as the user wrote it: a UUID, or an NVML index of the restore node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuSelector {
    Uuid(GpuUuid),
    Index(usize),
}

/// `CRIU_CUDA_MIGRATE_USABLE_GPUS` (and the CLI's `--usable-gpus`), parsed once at the edge: `all`, or UUIDs and
/// NVML indices, comma-separated. Its syntax is checked without the node; [`UsableGpus::resolve`] then names the
/// node's GPUs, in the order given, duplicates dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UsableGpus {
    All,
    List(Vec<GpuSelector>),
}

/// Why a usable-GPU list cannot be read, before any node is asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UsableSyntaxError {
    #[error("`{item}` is neither a GPU UUID (GPU-xxxxxxxx-...) nor an NVML index ({reason})")]
    Item { item: String, reason: String },
    #[error("it names no GPU")]
    Empty,
}

impl std::str::FromStr for UsableGpus {
    type Err = UsableSyntaxError;

    fn from_str(text: &str) -> Result<UsableGpus, UsableSyntaxError> {
        if text.trim().eq_ignore_ascii_case("all") {
            return Ok(UsableGpus::All);
        }
        let mut list = Vec::new();
        for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let shown = crate::text::shown(item);
            let selector = if item.starts_with("GPU-") {
                GpuSelector::Uuid(
                    item.parse().map_err(|e| UsableSyntaxError::Item { item: shown, reason: format!("{e}") })?,
                )
            } else {
                GpuSelector::Index(item.parse().map_err(|_| UsableSyntaxError::Item {
                    item: shown,
                    reason: "not a UUID or a decimal index".into(),
                })?)
            };
            list.push(selector);
        }
        if list.is_empty() {
            return Err(UsableSyntaxError::Empty);
        }
        Ok(UsableGpus::List(list))
    }
}

impl std::fmt::Display for UsableGpus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UsableGpus::All => f.write_str("all"),
            UsableGpus::List(list) => {
                let items: Vec<String> = list
                    .iter()
                    .map(|s| match s {
                        GpuSelector::Uuid(u) => u.to_string(),
                        GpuSelector::Index(i) => i.to_string(),
                    })
                    .collect();
                f.write_str(&items.join(","))
            }
        }
    }
}

impl UsableGpus {
    /// The GPUs of this node the list names, in the order given, duplicates dropped (first occurrence wins).
    pub fn resolve(&self, node_gpus: &[GpuIdentity]) -> Result<Vec<GpuUuid>, MapError> {
        let UsableGpus::List(list) = self else { return Ok(node_gpus.iter().map(|g| g.uuid).collect()) };
        let mut out: Vec<GpuUuid> = Vec::new();
        for selector in list {
            let uuid = match *selector {
                GpuSelector::Uuid(uuid) => {
                    if !node_gpus.iter().any(|g| g.uuid == uuid) {
                        return Err(MapError::UsableNotOnNode { uuid, node: list_node(node_gpus) });
                    }
                    uuid
                }
                GpuSelector::Index(index) => {
                    node_gpus.get(index).map(|g| g.uuid).ok_or_else(|| MapError::BadUsable {
                        item: index.to_string(),
                        reason: format!("index {index} is beyond this node's {} GPUs", node_gpus.len()),
                        node: list_node(node_gpus),
                    })?
                }
            };
            if !out.contains(&uuid) {
                out.push(uuid);
            }
        }
        Ok(out)
    }
}

/// Parses and resolves a usable GPU list in one step (tests and callers that hold only text).
pub fn parse_usable(text: &str, node_gpus: &[GpuIdentity]) -> Result<Vec<GpuUuid>, MapError> {
    let usable: UsableGpus = text.parse().map_err(|e| match e {
        UsableSyntaxError::Empty => MapError::EmptyUsable,
        UsableSyntaxError::Item { item, reason } => MapError::BadUsable { item, reason, node: list_node(node_gpus) },
    })?;
    usable.resolve(node_gpus)
}

fn list_node(node_gpus: &[GpuIdentity]) -> String {
    if node_gpus.is_empty() {
        return "no GPUs".into();
    }
    node_gpus.iter().enumerate().map(|(i, g)| format!("[{i}] {}", g.describe())).collect::<Vec<_>>().join("; ")
}

fn list_uuids(uuids: &[GpuUuid]) -> String {
    if uuids.is_empty() {
        return "none".into();
    }
    uuids.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
}

fn describe_old(image: &IdentityImage, old: &GpuUuid) -> String {
    image.gpu(old).map_or_else(|| old.to_string(), GpuIdentity::describe)
}

/// Fits `old` (a used GPU): same chip, at least as much memory, usable.
fn suits(old: &GpuIdentity, new: &GpuIdentity, usable: &HashSet<GpuUuid>) -> bool {
    usable.contains(&new.uuid) && new.same_chip(old) && holds_as_much(new, old)
}

/// Whether `new` has at least `old`'s memory; a total of 0 is unknown (a restore's GPU list from
/// the kernel driver, without NVML) and not held against it: the same chip has the same memory.
fn holds_as_much(new: &GpuIdentity, old: &GpuIdentity) -> bool {
    new.memory_total == 0 || old.memory_total == 0 || new.memory_total >= old.memory_total
}

/// Assignment state: enumerated index -> node index, and back.
#[derive(Clone)]
struct Assignment {
    of_old: Vec<Option<usize>>,
    of_new: Vec<Option<usize>>,
}

impl Assignment {
    fn take(&mut self, old: usize, new: usize) {
        self.of_old[old] = Some(new);
        self.of_new[new] = Some(old);
    }
    fn is_free(&self, new: usize) -> bool {
        self.of_new[new].is_none()
    }
}

/// Plans the device map. See the module documentation for the rules.
pub fn plan(req: &MapRequest) -> Result<DeviceMap, MapError> {
    check_inputs(req)?;
    let mut p = Planner::new(req, usable_set(req)?);
    p.take_explicit(req.explicit)?;
    p.place_used()?;
    p.fill_unused()?;
    p.finish()
}

/// The inputs must be sets, and the node must have a GPU for each enumerated one, before a
/// one-to-one assignment means anything.
fn check_inputs(req: &MapRequest) -> Result<(), MapError> {
    let (image, node) = (req.image, req.node_gpus);
    let mut seen = HashSet::new();
    for u in &image.enumerated {
        if !seen.insert(*u) {
            return Err(MapError::DuplicateEnumerated { uuid: *u });
        }
    }
    let mut seen_node = HashSet::new();
    for g in node {
        if !seen_node.insert(g.uuid) {
            return Err(MapError::DuplicateNodeGpu { uuid: g.uuid });
        }
    }
    if let Some(u) = image.used.iter().find(|u| !seen.contains(u)) {
        return Err(MapError::UsedNotEnumerated { uuid: *u });
    }
    if node.len() < image.enumerated.len() {
        return Err(MapError::TooFewGpus { needed: image.enumerated.len(), have: node.len(), node: list_node(node) });
    }
    Ok(())
}

/// The GPUs used GPUs may go to: the usable list (each on this node), else every GPU.
fn usable_set(req: &MapRequest) -> Result<HashSet<GpuUuid>, MapError> {
    let node = req.node_gpus;
    match req.usable {
        None => Ok(node.iter().map(|g| g.uuid).collect()),
        Some(list) => {
            if let Some(u) = list.iter().find(|u| !node.iter().any(|g| g.uuid == **u)) {
                return Err(MapError::UsableNotOnNode { uuid: *u, node: list_node(node) });
            }
            Ok(list.iter().copied().collect())
        }
    }
}

/// The assignment being built, step by step: explicit pairs, then the used GPUs, then the
/// enumerated-but-unused placeholders.
struct Planner<'a> {
    image: &'a IdentityImage,
    node: &'a [GpuIdentity],
    usable: HashSet<GpuUuid>,
    asg: Assignment,
    reasons: Vec<Option<PairReason>>,
}

impl<'a> Planner<'a> {
    fn new(req: &MapRequest<'a>, usable: HashSet<GpuUuid>) -> Planner<'a> {
        let n_old = req.image.enumerated.len();
        Planner {
            image: req.image,
            node: req.node_gpus,
            usable,
            asg: Assignment { of_old: vec![None; n_old], of_new: vec![None; req.node_gpus.len()] },
            reasons: vec![None; n_old],
        }
    }

    fn enumerated(&self) -> &'a [GpuUuid] {
        &self.image.enumerated
    }

    fn old_index(&self, u: &GpuUuid) -> Option<usize> {
        self.enumerated().iter().position(|e| e == u)
    }

    fn node_index(&self, u: &GpuUuid) -> Option<usize> {
        self.node.iter().position(|g| g.uuid == *u)
    }

    fn is_used(&self, u: &GpuUuid) -> bool {
        self.image.used.contains(u)
    }

    fn usable_text(&self) -> String {
        let list: Vec<String> =
            self.node.iter().filter(|g| self.usable.contains(&g.uuid)).map(GpuIdentity::describe).collect();
        if list.is_empty() {
            "none".to_string()
        } else {
            list.join("; ")
        }
    }

    /// Step 1, explicit pairs, each checked: known on both sides, one-to-one, and for a used GPU the
    /// same chip, enough memory, usable.
    fn take_explicit(&mut self, explicit: &[(GpuUuid, GpuUuid)]) -> Result<(), MapError> {
        let (image, node, enumerated) = (self.image, self.node, self.enumerated());
        for (old, new) in explicit {
            let oi = self
                .old_index(old)
                .ok_or_else(|| MapError::ExplicitUnknownOld { old: *old, enumerated: list_uuids(enumerated) })?;
            let ni = self
                .node_index(new)
                .ok_or_else(|| MapError::ExplicitUnknownNew { new: *new, node: list_node(node) })?;
            if self.asg.of_old[oi].is_some() {
                return Err(MapError::ExplicitDuplicateOld { old: *old });
            }
            if let Some(first) = self.asg.of_new[ni] {
                return Err(MapError::ExplicitDuplicateNew {
                    new: *new,
                    first_old: enumerated[first],
                    second_old: *old,
                });
            }
            if self.is_used(old) {
                // An unknown old identity cannot be checked; the operator named the pair, so it stands.
                if let Some(old_gpu) = image.gpu(old) {
                    let new_gpu = &node[ni];
                    if !new_gpu.same_chip(old_gpu) {
                        return Err(MapError::ExplicitWrongChip { old: old_gpu.describe(), new: new_gpu.describe() });
                    }
                    if !holds_as_much(new_gpu, old_gpu) {
                        return Err(MapError::ExplicitTooLittleMemory {
                            old: old_gpu.describe(),
                            new: new_gpu.describe(),
                        });
                    }
                }
                if !self.usable.contains(new) {
                    return Err(MapError::ExplicitNotUsable { old: *old, new: *new });
                }
            }
            self.asg.take(oi, ni);
            self.reasons[oi] = Some(PairReason::Explicit);
        }
        Ok(())
    }

    /// Step 2, used GPUs without an explicit pair, in ordinal order: the same GPU where it is here,
    /// usable and free; then the same PCI location, where the result keeps the used GPUs' PCI order
    /// of the dump (else without that preference); then the first free suitable GPU, moving an
    /// earlier automatic choice along an augmenting path when needed (so a feasible assignment is
    /// always found).
    fn place_used(&mut self) -> Result<(), MapError> {
        let (image, node, enumerated) = (self.image, self.node, self.enumerated());
        // `candidates[k]` lists the node GPUs that suit automatic used GPU k, in NVML index order
        // (which keeps the process's ordinal order among them).
        let mut auto_used: Vec<usize> = Vec::new();
        let mut candidates: Vec<Vec<usize>> = Vec::new();
        for u in &image.used {
            let Some(oi) = self.old_index(u) else { continue };
            if self.asg.of_old[oi].is_some() {
                continue;
            }
            let old_gpu = image.gpu(u).ok_or(MapError::UsedGpuUnknown { uuid: *u })?;
            auto_used.push(oi);
            candidates.push((0..node.len()).filter(|&ni| suits(old_gpu, &node[ni], &self.usable)).collect());
        }
        for (k, &oi) in auto_used.iter().enumerate() {
            if let Some(&ni) = candidates[k].iter().find(|&&ni| node[ni].uuid == enumerated[oi]) {
                if self.asg.is_free(ni) {
                    self.asg.take(oi, ni);
                }
            }
        }
        let before_location = self.asg.clone();
        self.place_by_location(&auto_used, &candidates);
        self.place_in_ordinal_order(&auto_used, &candidates)?;
        if !self.keeps_pci_order(&auto_used) {
            self.asg = before_location;
            self.place_in_ordinal_order(&auto_used, &candidates)?;
        }
        for &oi in &auto_used {
            if let Some(ni) = self.asg.of_old[oi] {
                let same_pci = image.gpu(&enumerated[oi]).is_some_and(|g| g.pci == node[ni].pci);
                self.reasons[oi] = Some(if node[ni].uuid == enumerated[oi] {
                    PairReason::Identity
                } else if same_pci {
                    PairReason::SameLocation
                } else {
                    PairReason::OrdinalOrder
                });
            }
        }
        Ok(())
    }

    /// Each automatic used GPU still without a target takes the free suitable GPU at its own PCI location.
    fn place_by_location(&mut self, auto_used: &[usize], candidates: &[Vec<usize>]) {
        let (image, node, enumerated) = (self.image, self.node, self.enumerated());
        for (k, &oi) in auto_used.iter().enumerate() {
            if self.asg.of_old[oi].is_some() {
                continue;
            }
            let pci = image.gpu(&enumerated[oi]).map(|g| g.pci);
            if let Some(&ni) = candidates[k].iter().find(|&&ni| Some(node[ni].pci) == pci && self.asg.is_free(ni)) {
                self.asg.take(oi, ni);
            }
        }
    }

    /// Each automatic used GPU still without a target takes the first free suitable GPU, or one an
    /// augmenting path frees.
    fn place_in_ordinal_order(&mut self, auto_used: &[usize], candidates: &[Vec<usize>]) -> Result<(), MapError> {
        let (image, node, enumerated) = (self.image, self.node, self.enumerated());
        for k in 0..auto_used.len() {
            let oi = auto_used[k];
            if self.asg.of_old[oi].is_some() {
                continue;
            }
            if let Some(&ni) = candidates[k].iter().find(|&&ni| self.asg.is_free(ni)) {
                self.asg.take(oi, ni);
                continue;
            }
            let mut visited = vec![false; node.len()];
            if !augment(k, auto_used, candidates, &mut self.asg, &mut visited) {
                let old = describe_old(image, &enumerated[oi]);
                return Err(if candidates[k].is_empty() {
                    MapError::NoSuitableGpu { old, usable: self.usable_text() }
                } else {
                    MapError::NotEnoughSuitable { old, used_count: image.used.len(), usable: self.usable_text() }
                });
            }
        }
        Ok(())
    }

    /// Whether the automatic used GPUs' targets lie in the same PCI order as the GPUs themselves did
    /// at dump (ordinals map onto the node's GPUs the way a container started here would see them).
    fn keeps_pci_order(&self, auto_used: &[usize]) -> bool {
        let (image, node, enumerated) = (self.image, self.node, self.enumerated());
        let placed: Vec<(PciAddress, PciAddress)> = auto_used
            .iter()
            .filter_map(|&oi| Some((image.gpu(&enumerated[oi])?.pci, node[self.asg.of_old[oi]?].pci)))
            .collect();
        placed.iter().enumerate().all(|(i, a)| placed[i + 1..].iter().all(|b| (a.0 < b.0) == (a.1 < b.1)))
    }

    /// Step 3, enumerated but unused GPUs: placeholders the driver demands, in enumerated order: their
    /// own GPU where free, else the same chip at the same location, else the same chip, else any.
    fn fill_unused(&mut self) -> Result<(), MapError> {
        let (image, node, enumerated) = (self.image, self.node, self.enumerated());
        for oi in 0..enumerated.len() {
            if self.asg.of_old[oi].is_some() {
                continue;
            }
            let old_gpu = image.gpu(&enumerated[oi]);
            let asg = &self.asg;
            let free = |ni: &usize| asg.is_free(*ni);
            let same_chip = |ni: &usize| old_gpu.is_some_and(|g| node[*ni].same_chip(g));
            let same_pci = |ni: &usize| old_gpu.is_some_and(|g| node[*ni].pci == g.pci);
            let choice = self
                .node_index(&enumerated[oi])
                .filter(free)
                .or_else(|| (0..node.len()).find(|ni| free(ni) && same_chip(ni) && same_pci(ni)))
                .or_else(|| (0..node.len()).find(|ni| free(ni) && same_chip(ni)))
                .or_else(|| (0..node.len()).find(free));
            // There are at least as many node GPUs as enumerated ones and each assignment takes one,
            // so a free one is always left; the error keeps this path panic-free all the same.
            let ni = choice.ok_or_else(|| MapError::TooFewGpus {
                needed: enumerated.len(),
                have: node.len(),
                node: list_node(node),
            })?;
            self.asg.take(oi, ni);
            self.reasons[oi] =
                Some(if node[ni].uuid == enumerated[oi] { PairReason::Identity } else { PairReason::Filler });
        }
        Ok(())
    }

    /// The pairs, in enumerated order.
    fn finish(self) -> Result<DeviceMap, MapError> {
        let (node, enumerated) = (self.node, self.enumerated());
        let mut pairs = Vec::with_capacity(enumerated.len());
        for (oi, old) in enumerated.iter().enumerate() {
            let (Some(ni), Some(reason)) = (self.asg.of_old[oi], self.reasons[oi]) else {
                // Unreachable by construction (step 3 assigns every remaining GPU).
                return Err(MapError::TooFewGpus { needed: enumerated.len(), have: node.len(), node: list_node(node) });
            };
            pairs.push(MapPair { old: *old, new: node[ni].uuid, used: self.is_used(old), reason });
        }
        Ok(DeviceMap { pairs })
    }
}

/// Kuhn's augmenting path from automatic used GPU `k`: takes a free candidate, or one held by
/// another automatic used GPU that can move elsewhere. Explicit pairs are never moved.
fn augment(
    k: usize,
    auto_used: &[usize],
    candidates: &[Vec<usize>],
    asg: &mut Assignment,
    visited: &mut [bool],
) -> bool {
    for &ni in &candidates[k] {
        if visited[ni] {
            continue;
        }
        visited[ni] = true;
        let movable = match asg.of_new[ni] {
            None => true,
            Some(holder) => match auto_used.iter().position(|&o| o == holder) {
                Some(hk) => augment(hk, auto_used, candidates, asg, visited),
                None => false,
            },
        };
        if movable {
            asg.take(auto_used[k], ni);
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::PciAddress;
    use crate::image::tests::{h200, sample, uuid};
    use proptest::prelude::*;

    fn image(node: Vec<GpuIdentity>, enumerated: Vec<GpuUuid>, used: Vec<GpuUuid>) -> IdentityImage {
        IdentityImage { node_gpus: node, enumerated, used, sites: vec![], ..sample() }
    }

    fn foreign(n: u8, bus: u32) -> GpuIdentity {
        let mut g = h200(n, bus);
        g.uuid.0[0] = 0xb0;
        g
    }

    fn a100(n: u8, bus: u32) -> GpuIdentity {
        GpuIdentity {
            pci_device_id: 0x20b2_10de,
            name: "NVIDIA A100-SXM4-80GB".into(),
            memory_total: 80 << 30,
            ..h200(n, bus)
        }
    }

    fn pairs(map: &DeviceMap) -> Vec<(GpuUuid, GpuUuid, PairReason)> {
        map.pairs.iter().map(|p| (p.old, p.new, p.reason)).collect()
    }

    fn two() -> Vec<GpuIdentity> {
        vec![h200(0, 6), h200(1, 7)]
    }

    #[test]
    fn identity_on_the_same_node() {
        let node = two();
        let img = image(node.clone(), vec![uuid(0), uuid(1)], vec![uuid(0)]);
        let map = plan(&MapRequest { image: &img, node_gpus: &node, usable: None, explicit: &[] }).unwrap();
        assert!(map.is_identity());
        assert!(map.changed().is_empty());
        assert_eq!(map.pairs[0].reason, PairReason::Identity);
        assert!(map.pairs[0].used && !map.pairs[1].used);
    }

    #[test]
    fn usable_subset_forces_a_swap_on_one_machine() {
        let node = two();
        let img = image(node.clone(), vec![uuid(0), uuid(1)], vec![uuid(0)]);
        let usable = [uuid(1)];
        let map = plan(&MapRequest { image: &img, node_gpus: &node, usable: Some(&usable), explicit: &[] }).unwrap();
        assert_eq!(
            pairs(&map),
            vec![(uuid(0), uuid(1), PairReason::OrdinalOrder), (uuid(1), uuid(0), PairReason::Filler)]
        );
        assert_eq!(map.changed().len(), 2);
        assert_eq!(map.new_for(&uuid(0)), Some(uuid(1)));
        assert_eq!(map.new_for(&uuid(7)), None);
        assert_eq!(map.driver_pairs().len(), 2);
    }

    #[test]
    fn explicit_swap() {
        let node = two();
        let img = image(node.clone(), vec![uuid(0), uuid(1)], vec![uuid(0), uuid(1)]);
        let explicit = parse_pairs(&format!(" {}={} , {} = {} ,", uuid(0), uuid(1), uuid(1), uuid(0))).unwrap();
        let map = plan(&MapRequest { image: &img, node_gpus: &node, usable: None, explicit: &explicit }).unwrap();
        assert_eq!(
            pairs(&map),
            vec![(uuid(0), uuid(1), PairReason::Explicit), (uuid(1), uuid(0), PairReason::Explicit)]
        );
        let table = map.render_table(&img, &node);
        assert!(table.contains("0000:00:06.0") && table.contains("explicit map"), "{table}");
        assert_eq!(table.lines().count(), 3);
    }

    #[test]
    fn partial_explicit_is_completed_over_the_enumerated_set() {
        let node = vec![h200(0, 6), h200(1, 7), h200(2, 8)];
        let img = image(node.clone(), vec![uuid(0), uuid(1), uuid(2)], vec![uuid(0)]);
        let explicit = [(uuid(0), uuid(2))];
        let map = plan(&MapRequest { image: &img, node_gpus: &node, usable: None, explicit: &explicit }).unwrap();
        assert_eq!(
            pairs(&map),
            vec![
                (uuid(0), uuid(2), PairReason::Explicit),
                (uuid(1), uuid(1), PairReason::Identity),
                (uuid(2), uuid(0), PairReason::Filler)
            ]
        );
    }

    #[test]
    fn three_cycle_by_usable_order() {
        // Used GPUs 0 and 1 must leave (only 1 and 2 usable): 1 stays, 0 takes 2, 2 fills 0.
        let node = vec![h200(0, 6), h200(1, 7), h200(2, 8)];
        let img = image(node.clone(), vec![uuid(0), uuid(1), uuid(2)], vec![uuid(0), uuid(1)]);
        let usable = [uuid(1), uuid(2)];
        let map = plan(&MapRequest { image: &img, node_gpus: &node, usable: Some(&usable), explicit: &[] }).unwrap();
        assert_eq!(
            pairs(&map),
            vec![
                (uuid(0), uuid(2), PairReason::OrdinalOrder),
                (uuid(1), uuid(1), PairReason::Identity),
                (uuid(2), uuid(0), PairReason::Filler)
            ]
        );
    }

    #[test]
    fn cross_machine_prefers_same_location_then_ordinal_order() {
        let old = vec![h200(0, 6), h200(1, 7)];
        let node = vec![foreign(0, 6), foreign(1, 7)];
        let img = image(old, vec![uuid(0), uuid(1)], vec![uuid(1), uuid(0)]);
        let map = plan(&MapRequest { image: &img, node_gpus: &node, usable: None, explicit: &[] }).unwrap();
        assert_eq!(
            pairs(&map),
            vec![(uuid(0), node[0].uuid, PairReason::SameLocation), (uuid(1), node[1].uuid, PairReason::SameLocation)]
        );

        // Different slots: ordinal order (used order 1, 0) onto NVML order.
        let node = vec![foreign(0, 0x10), foreign(1, 0x11)];
        let map = plan(&MapRequest { image: &img, node_gpus: &node, usable: None, explicit: &[] }).unwrap();
        assert_eq!(
            pairs(&map),
            vec![(uuid(0), node[1].uuid, PairReason::OrdinalOrder), (uuid(1), node[0].uuid, PairReason::OrdinalOrder)]
        );
    }

    /// The seed's pod: a container given the GPUs at 03/13/63/73 of an 8-GPU node, restored on another
    /// node of the same layout into a container given 63/83/E3/F3. 63 keeping its location would put
    /// cuda:2 before cuda:0 in PCI order; the ordinals keep their order instead. Back onto 83/93/E3/F3
    /// of the first node, the same rule; with only three GPUs given, the fourth is named.
    #[test]
    fn a_pod_keeps_its_ordinals_in_pci_order_across_nodes_of_one_layout() {
        let buses = [0x03, 0x13, 0x63, 0x73, 0x83, 0x93, 0xe3, 0xf3];
        let at = |g: GpuIdentity, i: u8| GpuIdentity {
            pci: PciAddress { domain: 0, bus: buses[usize::from(i)], device: 0, function: 0 },
            ..g
        };
        let node_a: Vec<GpuIdentity> = (0u8..8).map(|i| at(h200(i, 0), i)).collect();
        let node_b: Vec<GpuIdentity> = (0u8..8).map(|i| at(foreign(i, 0), i)).collect();
        let given = |node: &[GpuIdentity], at: &[usize]| at.iter().map(|&i| node[i].uuid).collect::<Vec<_>>();
        let dumped: Vec<GpuUuid> = given(&node_a, &[0, 1, 2, 3]);
        let img = image(node_a.clone(), dumped.clone(), dumped.clone());
        let usable = given(&node_b, &[2, 4, 6, 7]);
        let map = plan(&MapRequest { image: &img, node_gpus: &node_b, usable: Some(&usable), explicit: &[] }).unwrap();
        let news: Vec<GpuUuid> = dumped.iter().map(|u| map.new_for(u).unwrap()).collect();
        assert_eq!(news, usable, "{:?}", pairs(&map));
        assert!(map.pairs.iter().all(|p| p.reason == PairReason::OrdinalOrder), "{:?}", pairs(&map));

        // Chained: from B's 63/83/E3/F3 onto A's 83/93/E3/F3 (E3 and F3 keep their places by the order).
        let img = image(node_b.clone(), usable.clone(), usable.clone());
        let back = given(&node_a, &[4, 5, 6, 7]);
        let map = plan(&MapRequest { image: &img, node_gpus: &node_a, usable: Some(&back), explicit: &[] }).unwrap();
        let news: Vec<GpuUuid> = usable.iter().map(|u| map.new_for(u).unwrap()).collect();
        assert_eq!(news, back, "{:?}", pairs(&map));

        // Only 63/83/E3 given: the fourth dump GPU (73) has no place, and the error names it.
        let img = image(node_a.clone(), dumped.clone(), dumped.clone());
        let three = given(&node_b, &[2, 4, 6]);
        let e = plan(&MapRequest { image: &img, node_gpus: &node_b, usable: Some(&three), explicit: &[] }).unwrap_err();
        assert!(matches!(e, MapError::NotEnoughSuitable { .. }), "{e}");
        assert!(e.to_string().contains("0000:73:00.0"), "{e}");

        // The same layout on both sides with every location given: each GPU keeps its location.
        let same = given(&node_b, &[0, 1, 2, 3]);
        let map = plan(&MapRequest { image: &img, node_gpus: &node_b, usable: Some(&same), explicit: &[] }).unwrap();
        assert!(map.pairs.iter().all(|p| p.reason == PairReason::SameLocation), "{:?}", pairs(&map));
    }

    #[test]
    fn hidden_gpus_get_placeholders_of_any_chip() {
        // Process used GPU 0 and enumerated GPU 1 (hidden by CUDA_VISIBLE_DEVICES); the target
        // node has one H200 and one A100: the A100 is a fine placeholder.
        let old = vec![h200(0, 6), h200(1, 7)];
        let mut other_chip = a100(1, 7);
        other_chip.uuid = foreign(1, 7).uuid;
        let node = vec![foreign(0, 6), other_chip];
        let img = image(old, vec![uuid(0), uuid(1)], vec![uuid(0)]);
        let usable = [node[0].uuid];
        let map = plan(&MapRequest { image: &img, node_gpus: &node, usable: Some(&usable), explicit: &[] }).unwrap();
        assert_eq!(
            pairs(&map),
            vec![(uuid(0), node[0].uuid, PairReason::SameLocation), (uuid(1), node[1].uuid, PairReason::Filler)]
        );
    }

    #[test]
    fn augmenting_finds_an_assignment_greedy_would_miss() {
        // Used: a small H200 first (fits both), then a big one (fits only the big target).
        let mut small = h200(0, 6);
        small.memory_total = 80 << 30;
        let old = vec![small, h200(1, 7)];
        let mut small_new = foreign(0, 0x10);
        small_new.memory_total = 80 << 30;
        let big_new = foreign(1, 0x11);
        // NVML order puts the big one first so greedy would give it to the small GPU.
        let node = vec![big_new.clone(), small_new.clone()];
        let img = image(old, vec![uuid(0), uuid(1)], vec![uuid(0), uuid(1)]);
        let map = plan(&MapRequest { image: &img, node_gpus: &node, usable: None, explicit: &[] }).unwrap();
        assert_eq!(map.new_for(&uuid(0)), Some(small_new.uuid));
        assert_eq!(map.new_for(&uuid(1)), Some(big_new.uuid));
    }

    #[test]
    fn errors() {
        let node = two();
        let img = image(node.clone(), vec![uuid(0), uuid(1)], vec![uuid(0)]);
        let run = |usable: Option<&[GpuUuid]>, explicit: &[(GpuUuid, GpuUuid)], node: &[GpuIdentity]| {
            plan(&MapRequest { image: &img, node_gpus: node, usable, explicit })
        };

        // Duplicates in the explicit map.
        let dup_old = [(uuid(0), uuid(0)), (uuid(0), uuid(1))];
        assert!(matches!(run(None, &dup_old, &node), Err(MapError::ExplicitDuplicateOld { .. })));
        let dup_new = [(uuid(0), uuid(1)), (uuid(1), uuid(1))];
        assert!(matches!(run(None, &dup_new, &node), Err(MapError::ExplicitDuplicateNew { .. })));
        // Unknown GPUs in the explicit map.
        let unknown_old = [(uuid(9), uuid(1))];
        assert!(matches!(run(None, &unknown_old, &node), Err(MapError::ExplicitUnknownOld { .. })));
        let unknown_new = [(uuid(0), uuid(9))];
        assert!(matches!(run(None, &unknown_new, &node), Err(MapError::ExplicitUnknownNew { .. })));
        // Explicit target excluded by usable.
        let to_one = [(uuid(0), uuid(1))];
        let usable = [uuid(0)];
        assert!(matches!(run(Some(&usable), &to_one, &node), Err(MapError::ExplicitNotUsable { .. })));
        // Usable naming a GPU not here.
        let usable = [uuid(9)];
        assert!(matches!(run(Some(&usable), &[], &node), Err(MapError::UsableNotOnNode { .. })));

        // Wrong chip, explicit and automatic.
        let mixed = vec![a100(0, 6), a100(1, 7)];
        let explicit = [(uuid(0), uuid(0))];
        let err = run(None, &explicit, &mixed).unwrap_err();
        assert!(matches!(err, MapError::ExplicitWrongChip { .. }), "{err}");
        let err = run(None, &[], &mixed).unwrap_err();
        assert!(matches!(err, MapError::NoSuitableGpu { .. }), "{err}");
        let text = err.to_string();
        assert!(text.contains("NVIDIA H200, 0000:00:06.0, 140 GiB"), "{text}");
        assert!(text.contains(USABLE_GPUS_VAR) && text.contains(DEVICE_MAP_VAR), "{text}");

        // Too little memory.
        let mut small = two();
        for g in &mut small {
            g.memory_total = 80 << 30;
        }
        assert!(matches!(run(None, &explicit, &small), Err(MapError::ExplicitTooLittleMemory { .. })));
        assert!(matches!(run(None, &[], &small), Err(MapError::NoSuitableGpu { .. })));

        // Fewer node GPUs than enumerated.
        let err = run(None, &[], &node[..1]).unwrap_err();
        assert!(matches!(err, MapError::TooFewGpus { needed: 2, have: 1, .. }), "{err}");
    }

    #[test]
    fn not_enough_suitable_gpus() {
        let node = two();
        let img = image(node.clone(), vec![uuid(0), uuid(1)], vec![uuid(0), uuid(1)]);
        let usable = [uuid(1)];
        let err =
            plan(&MapRequest { image: &img, node_gpus: &node, usable: Some(&usable), explicit: &[] }).unwrap_err();
        assert!(matches!(err, MapError::NotEnoughSuitable { .. }), "{err}");
    }

    #[test]
    fn inconsistent_images() {
        let node = two();
        let img = image(node.clone(), vec![uuid(0), uuid(0)], vec![]);
        let r = plan(&MapRequest { image: &img, node_gpus: &node, usable: None, explicit: &[] });
        assert!(matches!(r, Err(MapError::DuplicateEnumerated { .. })));
        let img = image(node.clone(), vec![uuid(0)], vec![uuid(1)]);
        let r = plan(&MapRequest { image: &img, node_gpus: &node, usable: None, explicit: &[] });
        assert!(matches!(r, Err(MapError::UsedNotEnumerated { .. })));
        let img = image(vec![], vec![uuid(0)], vec![uuid(0)]);
        let r = plan(&MapRequest { image: &img, node_gpus: &node, usable: None, explicit: &[] });
        assert!(matches!(r, Err(MapError::UsedGpuUnknown { .. })));
    }

    #[test]
    fn parsing() {
        let node = vec![h200(0, 6), h200(1, 7), h200(2, 8)];
        assert_eq!(parse_pairs("").unwrap(), vec![]);
        assert!(matches!(parse_pairs("GPU-1=GPU-2"), Err(MapError::BadPair { .. })));
        assert!(matches!(parse_pairs(&uuid(0).to_string()), Err(MapError::BadPair { .. })));
        assert_eq!(parse_usable(&format!("2, {} ,0,2", uuid(1)), &node).unwrap(), vec![uuid(2), uuid(1), uuid(0)]);
        assert_eq!(parse_usable(" all ", &node).unwrap().len(), 3);
        // Parsed once, without the node; shown back canonically; resolved against the node after.
        let u: UsableGpus = format!(" 2, {} ,0,2", uuid(1)).parse().unwrap();
        assert_eq!(u.to_string(), format!("2,{},0,2", uuid(1)));
        assert_eq!(u.resolve(&node).unwrap(), vec![uuid(2), uuid(1), uuid(0)]);
        assert_eq!("ALL".parse::<UsableGpus>().unwrap(), UsableGpus::All);
        assert!(matches!("x".parse::<UsableGpus>(), Err(UsableSyntaxError::Item { .. })));
        assert!(matches!("GPU-zz".parse::<UsableGpus>(), Err(UsableSyntaxError::Item { .. })));
        assert_eq!(" , ".parse::<UsableGpus>(), Err(UsableSyntaxError::Empty));
        assert!(matches!("7".parse::<UsableGpus>().unwrap().resolve(&node), Err(MapError::BadUsable { .. })));
        assert!(matches!(parse_usable("3", &node), Err(MapError::BadUsable { .. })));
        assert!(matches!(parse_usable("x", &node), Err(MapError::BadUsable { .. })));
        assert!(matches!(parse_usable(" , ", &node), Err(MapError::EmptyUsable)));
        let other = foreign(0, 6).uuid.to_string();
        assert!(matches!(parse_usable(&other, &node), Err(MapError::UsableNotOnNode { .. })));
    }

    /// A small world: dump GPUs and node GPUs drawn from two chips and two memory sizes, some
    /// shared between dump and node (same machine), some foreign.
    /// Image, node GPUs, usable restriction, explicit pairs.
    type World = (IdentityImage, Vec<GpuIdentity>, Option<Vec<GpuUuid>>, Vec<(GpuUuid, GpuUuid)>);

    fn arb_world() -> impl Strategy<Value = World> {
        let gpu = |id: u8| {
            (any::<bool>(), any::<bool>(), 0u32..4).prop_map(move |(chip, big, bus)| GpuIdentity {
                uuid: uuid(id),
                pci: PciAddress { domain: 0, bus: 0, device: bus, function: 0 },
                pci_device_id: if chip { 0x2335_10de } else { 0x20b2_10de },
                pci_subsystem_id: 0,
                minor: u32::from(id),
                name: "gpu".into(),
                memory_total: if big { 141 << 30 } else { 80 << 30 },
            })
        };
        let pool: Vec<_> = (0u8..8).map(gpu).collect();
        (
            pool,
            prop::sample::subsequence((0u8..8).collect::<Vec<_>>(), 0..=5),
            prop::sample::subsequence((0u8..8).collect::<Vec<_>>(), 0..=6),
            any::<prop::sample::Index>(),
            any::<bool>(),
            prop::collection::vec((0u8..8, 0u8..8), 0..3),
        )
            .prop_map(|(pool, dump_ids, node_ids, used_cut, restrict, explicit)| {
                let dump: Vec<GpuIdentity> = dump_ids.iter().map(|&i| pool[usize::from(i)].clone()).collect();
                let node: Vec<GpuIdentity> = node_ids.iter().map(|&i| pool[usize::from(i)].clone()).collect();
                let enumerated: Vec<GpuUuid> = dump.iter().map(|g| g.uuid).collect();
                let cut = if enumerated.is_empty() { 0 } else { used_cut.index(enumerated.len() + 1) };
                let used = enumerated[..cut].to_vec();
                let usable = restrict.then(|| node.iter().step_by(2).map(|g| g.uuid).collect());
                let explicit = explicit.into_iter().map(|(a, b)| (uuid(a), uuid(b))).collect();
                (image(dump, enumerated, used), node, usable, explicit)
            })
    }

    proptest! {
        #[test]
        fn prop_ok_maps_are_injective_and_complete((img, node, usable, explicit) in arb_world()) {
            let req = MapRequest { image: &img, node_gpus: &node, usable: usable.as_deref(), explicit: &explicit };
            if let Ok(map) = plan(&req) {
                let olds: Vec<GpuUuid> = map.pairs.iter().map(|p| p.old).collect();
                prop_assert_eq!(&olds, &img.enumerated);
                let news: HashSet<GpuUuid> = map.pairs.iter().map(|p| p.new).collect();
                prop_assert_eq!(news.len(), map.pairs.len());
                for p in &map.pairs {
                    let new = node.iter().find(|g| g.uuid == p.new);
                    prop_assert!(new.is_some());
                    prop_assert_eq!(p.used, img.used.contains(&p.old));
                    if p.used {
                        let (old, new) = (img.gpu(&p.old).unwrap(), new.unwrap());
                        prop_assert!(new.same_chip(old) && new.memory_total >= old.memory_total);
                        if let Some(u) = &usable {
                            prop_assert!(u.contains(&p.new));
                        }
                    }
                }
                for (old, new) in &explicit {
                    prop_assert_eq!(map.new_for(old), Some(*new));
                }
            }
        }

        #[test]
        fn prop_without_constraints_a_feasible_world_is_planned((img, node, _usable, _explicit) in arb_world()) {
            // Every GPU of the dump is on the node and all are usable: identity must succeed.
            let mut node = node;
            for g in &img.node_gpus {
                if !node.iter().any(|n| n.uuid == g.uuid) {
                    node.push(g.clone());
                }
            }
            let map = plan(&MapRequest { image: &img, node_gpus: &node, usable: None, explicit: &[] }).unwrap();
            prop_assert!(map.is_identity());
        }
    }
}
