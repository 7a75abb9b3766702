//! What a dump claims of the NVIDIA device nodes that processes **other than CUDA processes** hold:
//! a child forked after its parent's `cuInit` (a PyTorch DataLoader worker, a `multiprocessing.Pool`
//! worker, a bare `os.fork()`) inherits the parent's `/dev/nvidia*` descriptors (close-on-exec, which
//! a fork does not close) and its device mappings (all but the `VM_DONTCOPY` ones). The driver's
//! checkpoint does not touch such a child (it is no CUDA process: CUDA may not be used after a fork),
//! and CRIU cannot dump what it holds; the plugin claims it.
//!
//! What each claimed thing becomes at restore (measured reasons in docs/GPU-TESTING.md):
//! - a **descriptor** is opened anew on the restoring node: `nvidiactl`, `nvidia-uvm`,
//!   `nvidia-uvm-tools` and `nvidia-modeset` as themselves, `nvidiaN` through the restore's device
//!   map, inside the restored task's root, never created and never by a path taken from the image;
//! - a **mapping** becomes an inert placeholder of the same address, size and protection: anonymous
//!   shared memory reading zeros. The child could not use the device through it before the dump
//!   either (CUDA's rules forbid it after a fork; the parent's driver objects behind it are gone
//!   once the parent is checkpointed).
//!
//! Everything here is pure: the device numbers come in as text (`/proc/devices`) and the records as
//! bytes ([`DeviceClaims::decode`], bounded, never panicking).

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::gpu::GpuUuid;

/// The file the dump writes its claims into, beside the identity images.
pub const CLAIMS_FILE_NAME: &str = "cuda-migrate-devices.img";
/// The format's version; a reader refuses newer ones. Version 2 is one JSON object per line (a header, then one
/// line per process and per open file), so that a dump appends each claim instead of rewriting the file; version 1
/// (one pretty-printed JSON document) is still read.
pub const CLAIMS_VERSION: u16 = 2;
/// What the file's `format` field says.
pub const CLAIMS_FORMAT: &str = "criu-cuda-migrate device claims";
/// The bounds of a claims file: one set, checked by the dump before any lock (the tree's holdings read ahead), by
/// every claim the dump writes, by `criu-cuda-migrate job`, and by the restore's reader, so that whatever the dump
/// writes the restore accepts. Sized for a node: 8 ranks x 32 DataLoader workers with a torch worker's holdings
/// (about 30 mappings and 31 descriptors, 3.5 KB a worker in this encoding) is 256 processes and about 1 MB, far
/// inside them; the limits are there against hostile files, not real jobs.
pub const MAX_CLAIMS_BYTES: usize = 64 << 20;
/// Most processes, mappings per process, descriptors per process and open files in one claims file.
pub const MAX_HOLDERS: usize = 8192;
pub const MAX_MAPPINGS_PER_HOLDER: usize = 16384;
pub const MAX_FDS_PER_HOLDER: usize = 16384;
pub const MAX_FILES: usize = 262_144;
/// Most GPUs of one node.
pub const MAX_GPUS: usize = 64;
/// Longest string kept (a hostname, a process name).
pub const MAX_TEXT: usize = 256;
/// The longest header line a claims file can have (format, version, a hostname of [`MAX_TEXT`] characters, each of
/// [`MAX_GPUS`] minors with its UUID): what a check of a tree's holdings reserves for it before the node's names and
/// GPUs are in hand.
pub const MAX_HEADER_LINE: usize = 160 + 4 * MAX_TEXT + MAX_GPUS * 56;
/// The longest line one claimed open file takes (a GPU node's, with its UUID), reserved per descriptor when a
/// dump checks a tree's holdings against [`MAX_CLAIMS_BYTES`] before the files are known.
pub const MAX_FILE_LINE: usize = 160;

/// One NVIDIA device node, by what it is rather than by its path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NvidiaNode {
    /// `/dev/nvidiactl` (char 195:255).
    Control,
    /// `/dev/nvidia-modeset` (char 195:254).
    Modeset,
    /// `/dev/nvidiaN` (char 195:N): one GPU.
    Gpu(u32),
    /// `/dev/nvidia-uvm` (the nvidia-uvm major, minor 0).
    Uvm,
    /// `/dev/nvidia-uvm-tools` (minor 1).
    UvmTools,
    /// `/dev/nvidia-caps/nvidia-capN` (the nvidia-caps major, minor N): a capability node, which libcuda
    /// opens read-only at its start (measured: `nvidia-cap1` and `nvidia-cap2` in every DataLoader worker on
    /// an H100, driver 580).
    Cap(u32),
}

impl NvidiaNode {
    /// The node's name under `/dev`.
    pub fn dev_name(&self) -> String {
        match self {
            NvidiaNode::Control => "nvidiactl".into(),
            NvidiaNode::Modeset => "nvidia-modeset".into(),
            NvidiaNode::Gpu(m) => format!("nvidia{m}"),
            NvidiaNode::Uvm => "nvidia-uvm".into(),
            NvidiaNode::UvmTools => "nvidia-uvm-tools".into(),
            NvidiaNode::Cap(m) => format!("nvidia-caps/nvidia-cap{m}"),
        }
    }

    /// The node a name under `/dev` is (`nvidiactl`, `nvidia3`, ...).
    pub fn from_dev_name(name: &str) -> Option<NvidiaNode> {
        Some(match name {
            "nvidiactl" => NvidiaNode::Control,
            "nvidia-modeset" => NvidiaNode::Modeset,
            "nvidia-uvm" => NvidiaNode::Uvm,
            "nvidia-uvm-tools" => NvidiaNode::UvmTools,
            _ if name.starts_with("nvidia-caps/nvidia-cap") => {
                let digits = &name["nvidia-caps/nvidia-cap".len()..];
                let m: u32 = digits.parse().ok()?;
                if m.to_string() != digits {
                    return None;
                }
                NvidiaNode::Cap(m)
            }
            _ => {
                let digits = name.strip_prefix("nvidia")?;
                let m: u32 = digits.parse().ok()?;
                if m.to_string() != digits || m >= FIRST_CONTROL_MINOR {
                    return None;
                }
                NvidiaNode::Gpu(m)
            }
        })
    }
}

impl fmt::Display for NvidiaNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "/dev/{}", self.dev_name())
    }
}

/// A device number's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DevType {
    Char,
    Block,
}

/// A device number: type, major, minor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct DevNumber {
    pub kind: DevType,
    pub major: u32,
    pub minor: u32,
}

impl fmt::Display for DevNumber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = match self.kind {
            DevType::Char => "char",
            DevType::Block => "block",
        };
        write!(f, "{t} {}:{}", self.major, self.minor)
    }
}

/// The control minors of the `nvidia` major: 254 `nvidia-modeset`, 255 `nvidiactl`; below them, GPUs.
pub const FIRST_CONTROL_MINOR: u32 = 254;
const MODESET_MINOR: u32 = 254;
const CONTROL_MINOR: u32 = 255;

/// Which device numbers are the NVIDIA driver's on one node, and which of its nodes each is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NvidiaDevices {
    /// The major of `nvidia` (`nvidiactl`, `nvidia-modeset`, `nvidiaN`; 195 on every driver seen).
    pub nvidia_major: Option<u32>,
    /// The major of `nvidia-uvm` (dynamic: 238 on one machine, 511 on another).
    pub uvm_major: Option<u32>,
    /// The major of `nvidia-caps` (dynamic).
    pub caps_major: Option<u32>,
    /// Other majors the NVIDIA driver registered (`nvidia-caps`, `nvidia-nvswitch`, `nvidia-nvlink`,
    /// ...), by name: the plugin claims none of their nodes and says so.
    pub other: Vec<(u32, String)>,
    /// Exact numbers standing for nodes: the test doubles' stand-ins (`CCM_TEST_DOUBLE_NVIDIA_DEVICES`),
    /// looked up before the majors.
    pub stand_ins: Vec<(DevNumber, NvidiaNode)>,
}

/// Why a list of stand-in device numbers does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{entry}`: {why}; write TYPE:MAJOR:MINOR=NAME entries (char:10:237=nvidiactl,block:7:0=nvidia0)")]
pub struct StandInError {
    pub entry: String,
    pub why: &'static str,
}

impl NvidiaDevices {
    /// The NVIDIA majors of `/proc/devices`' text (its "Character devices:" part).
    pub fn from_proc_devices(text: &str) -> NvidiaDevices {
        let mut d = NvidiaDevices::default();
        let mut in_char = false;
        for line in text.lines() {
            let line = line.trim();
            if line.ends_with(':') {
                in_char = line == "Character devices:";
                continue;
            }
            if !in_char {
                continue;
            }
            let Some((major, name)) = line.split_once(char::is_whitespace) else { continue };
            let Ok(major) = major.parse::<u32>() else { continue };
            let name = name.trim();
            match name {
                // Some drivers register the GPU nodes as "nvidia-frontend" (the multiplexer of several modules).
                "nvidia" | "nvidia-frontend" => d.nvidia_major = d.nvidia_major.or(Some(major)),
                "nvidia-uvm" => d.uvm_major = Some(major),
                "nvidia-caps" => d.caps_major = Some(major),
                n if n.starts_with("nvidia") => d.other.push((major, n.chars().take(MAX_TEXT).collect())),
                _ => {}
            }
        }
        d
    }

    /// Adds the test doubles' stand-ins: `TYPE:MAJOR:MINOR=NAME`, comma-separated.
    pub fn with_stand_ins(mut self, text: &str) -> Result<NvidiaDevices, StandInError> {
        for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let bad = |why| StandInError { entry: entry.chars().take(MAX_TEXT).collect(), why };
            let (number, name) = entry.split_once('=').ok_or_else(|| bad("no `=NAME`"))?;
            let node = NvidiaNode::from_dev_name(name.trim()).ok_or_else(|| bad("not an NVIDIA node name"))?;
            let mut parts = number.trim().split(':');
            let kind = match parts.next() {
                Some("char") => DevType::Char,
                Some("block") => DevType::Block,
                _ => return Err(bad("the type is `char` or `block`")),
            };
            let mut num = || parts.next().and_then(|p| p.parse::<u32>().ok()).ok_or_else(|| bad("no MAJOR:MINOR"));
            let (major, minor) = (num()?, num()?);
            self.stand_ins.push((DevNumber { kind, major, minor }, node));
        }
        Ok(self)
    }

    /// Whether this node has any NVIDIA device number at all.
    pub fn is_empty(&self) -> bool {
        self.nvidia_major.is_none()
            && self.uvm_major.is_none()
            && self.caps_major.is_none()
            && self.other.is_empty()
            && self.stand_ins.is_empty()
    }

    /// Which NVIDIA node a device number is, if any.
    pub fn classify(&self, number: DevNumber) -> Option<NvidiaNode> {
        if let Some((_, node)) = self.stand_ins.iter().find(|(n, _)| *n == number) {
            return Some(*node);
        }
        if number.kind != DevType::Char {
            return None;
        }
        if Some(number.major) == self.nvidia_major {
            return Some(match number.minor {
                CONTROL_MINOR => NvidiaNode::Control,
                MODESET_MINOR => NvidiaNode::Modeset,
                m => NvidiaNode::Gpu(m),
            });
        }
        if Some(number.major) == self.caps_major {
            return Some(NvidiaNode::Cap(number.minor));
        }
        if Some(number.major) == self.uvm_major {
            return match number.minor {
                0 => Some(NvidiaNode::Uvm),
                1 => Some(NvidiaNode::UvmTools),
                _ => None,
            };
        }
        None
    }

    /// The NVIDIA driver's name for a major it registered but whose nodes the plugin does not claim
    /// (`nvidia-caps`, ...).
    pub fn unclaimed_major(&self, number: DevNumber) -> Option<&str> {
        if number.kind != DevType::Char || self.classify(number).is_some() {
            return None;
        }
        self.other.iter().find(|(m, _)| *m == number.major).map(|(_, n)| n.as_str())
    }

    /// The device number `node` has on this node.
    pub fn number_of(&self, node: NvidiaNode) -> Option<DevNumber> {
        if let Some((n, _)) = self.stand_ins.iter().find(|(_, s)| *s == node) {
            return Some(*n);
        }
        let char = |major: Option<u32>, minor| major.map(|major| DevNumber { kind: DevType::Char, major, minor });
        match node {
            NvidiaNode::Control => char(self.nvidia_major, CONTROL_MINOR),
            NvidiaNode::Modeset => char(self.nvidia_major, MODESET_MINOR),
            NvidiaNode::Gpu(m) => char(self.nvidia_major, m),
            NvidiaNode::Uvm => char(self.uvm_major, 0),
            NvidiaNode::UvmTools => char(self.uvm_major, 1),
            NvidiaNode::Cap(m) => char(self.caps_major, m),
        }
    }
}

/// A mapping of an NVIDIA node in a process that is no CUDA process.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimedMapping {
    pub start: u64,
    pub end: u64,
    /// `rwxs` as `/proc/PID/maps` shows them (`s` shared, `p` private).
    pub perms: String,
    pub offset: u64,
    pub node: NvidiaNode,
}

impl ClaimedMapping {
    pub fn len(&self) -> u64 {
        self.end.saturating_sub(self.start)
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A descriptor of an NVIDIA node in a process that is no CUDA process.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimedFd {
    pub fd: u32,
    pub node: NvidiaNode,
}

/// The credentials a process opens files with (its file-system uid and gid, and its supplementary groups), as the
/// dump saw them: a descriptor is reopened at restore only if these could open the node there.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HolderCreds {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

/// Most supplementary groups kept (the kernel's NGROUPS_MAX is 65536; a real process has a handful).
pub const MAX_GROUPS: usize = 1024;

/// Whether `creds` may open a node of mode `mode` owned by `owner`:`group` for reading and/or writing, by the
/// permission bits (root may: the restored task keeps CAP_DAC_OVERRIDE when its uid is 0).
pub fn may_open(mode: u32, owner: u32, group: u32, creds: &HolderCreds, read: bool, write: bool) -> bool {
    if creds.uid == 0 {
        return true;
    }
    let bits = if creds.uid == owner {
        (mode >> 6) & 7
    } else if creds.gid == group || creds.groups.contains(&group) {
        (mode >> 3) & 7
    } else {
        mode & 7
    };
    (!read || bits & 4 != 0) && (!write || bits & 2 != 0)
}

/// The open flags a claimed descriptor of `node` is reopened with: the recorded ones, but never wider than the
/// driver's own opens are (a capability node is opened read-only by libcuda; measured on driver 580), whatever the
/// image says.
pub fn narrowed_flags(node: NvidiaNode, flags: i32) -> i32 {
    const O_ACCMODE: i32 = 3;
    match node {
        NvidiaNode::Cap(_) => flags & !O_ACCMODE,
        _ => flags,
    }
}

/// A process of the tree that is no CUDA process but holds NVIDIA nodes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceHolder {
    /// Its pid in its own pid namespace (what it has again after CRIU's restore).
    pub pid: u32,
    /// Its pid as CRIU saw it at dump.
    pub host_pid: u32,
    /// Its name (`/proc/PID/comm`), for reports only.
    pub comm: String,
    pub mappings: Vec<ClaimedMapping>,
    pub fds: Vec<ClaimedFd>,
    /// What it opened files with at dump (absent in files of earlier plugins: then the node's own permission
    /// bits alone decide, with root's credentials).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creds: Option<HolderCreds>,
}

impl DeviceHolder {
    /// The mapping that starts at `addr`.
    pub fn mapping_at(&self, addr: u64) -> Option<&ClaimedMapping> {
        self.mappings.iter().find(|m| m.start == addr)
    }

    /// The size of the placeholder file behind every mapping of this process: the largest mapping.
    /// One size for all, because CRIU maps consecutive mappings of one file through the first one's
    /// descriptor (its `open_filemap` reuses it), at the offset the plugin answered (0).
    pub fn placeholder_bytes(&self) -> u64 {
        self.mappings.iter().map(ClaimedMapping::len).max().unwrap_or(0)
    }
}

/// An open file (CRIU's file id) of an NVIDIA node, dumped through the plugin (`DUMP_EXT_FILE`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimedFile {
    /// CRIU's id of the open file (shared by every descriptor of the same open file description).
    pub id: u32,
    pub node: NvidiaNode,
    /// For a GPU node, the GPU it was at dump (the restore maps it).
    pub gpu: Option<GpuUuid>,
    /// Its open flags (`O_ACCMODE`, `O_NONBLOCK`, ...), as `fcntl(F_GETFL)` gave them.
    pub flags: i32,
}

/// Everything one dump claimed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceClaims {
    pub format: String,
    pub version: u16,
    pub hostname: String,
    /// Every GPU node of the dump node: minor → UUID (a GPU node's descriptor is mapped by its UUID).
    pub gpus: BTreeMap<u32, GpuUuid>,
    pub holders: Vec<DeviceHolder>,
    pub files: Vec<ClaimedFile>,
}

/// Why a claims file cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimsError {
    #[error("it is {got} bytes, more than the {MAX_CLAIMS_BYTES} a claims file may be")]
    TooLarge { got: usize },
    #[error("it is no criu-cuda-migrate claims file: {0}")]
    Syntax(String),
    #[error("it is version {0} of the format; this criu-cuda-migrate reads version {CLAIMS_VERSION}: upgrade it")]
    Newer(u16),
    #[error("it holds {what} {count}, more than the {max} a claims file may")]
    TooMany { what: &'static str, count: usize, max: usize },
    #[error("{0}")]
    Invalid(String),
}

impl DeviceClaims {
    pub fn new(hostname: &str, gpus: BTreeMap<u32, GpuUuid>) -> DeviceClaims {
        DeviceClaims {
            format: CLAIMS_FORMAT.into(),
            version: CLAIMS_VERSION,
            hostname: hostname.chars().take(MAX_TEXT).collect(),
            gpus,
            holders: Vec::new(),
            files: Vec::new(),
        }
    }

    /// Whether anything was claimed.
    pub fn is_empty(&self) -> bool {
        self.holders.is_empty() && self.files.is_empty()
    }

    /// The file CRIU knows by `id`.
    pub fn file(&self, id: u32) -> Option<&ClaimedFile> {
        self.files.iter().find(|f| f.id == id)
    }

    /// The process with pid `ns_pid` in its own namespace.
    pub fn holder(&self, ns_pid: u32) -> Option<&DeviceHolder> {
        self.holders.iter().find(|h| h.pid == ns_pid)
    }

    /// Adds or replaces a file (CRIU asks once per open file; a retried dump asks again).
    pub fn add_file(&mut self, file: ClaimedFile) {
        self.files.retain(|f| f.id != file.id);
        self.files.push(file);
    }

    /// The GPUs (dump UUIDs) the claimed descriptors need on the restoring node.
    pub fn gpus_needed(&self) -> Vec<GpuUuid> {
        let mut v: Vec<GpuUuid> = self.files.iter().filter_map(|f| f.gpu).collect();
        v.sort();
        v.dedup();
        v
    }

    /// The bytes of the file: the header line, then one line per process and per open file (JSON Lines: readable
    /// with any tool, appended claim by claim by the dump, bounded on read).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = self.header_line();
        for h in &self.holders {
            out.extend(holder_line(h));
        }
        for f in &self.files {
            out.extend(file_line(f));
        }
        out
    }

    /// The first line of the file: format, version, the dump node's name and GPUs.
    pub fn header_line(&self) -> Vec<u8> {
        let head = Header {
            format: self.format.clone(),
            version: CLAIMS_VERSION,
            hostname: self.hostname.clone(),
            gpus: self.gpus.clone(),
        };
        json_line(&head)
    }

    /// Reads a claims file, refusing anything out of bounds or not this format.
    pub fn decode(bytes: &[u8]) -> Result<DeviceClaims, ClaimsError> {
        if bytes.len() > MAX_CLAIMS_BYTES {
            return Err(ClaimsError::TooLarge { got: bytes.len() });
        }
        let (first, rest) = match bytes.iter().position(|&b| b == b'\n') {
            Some(i) => (&bytes[..i], &bytes[i + 1..]),
            None => (bytes, &[][..]),
        };
        #[derive(Deserialize)]
        struct Head {
            format: String,
            version: u16,
        }
        // Version 2: a whole header on the first line. Version 1: one pretty-printed document ("{" alone first).
        let c = match serde_json::from_slice::<Head>(first) {
            Ok(head) => {
                check_head(&head.format, head.version)?;
                if head.version < 2 {
                    return Err(ClaimsError::Syntax("a version 1 header on one line".into()));
                }
                decode_lines(first, rest)?
            }
            Err(_) => {
                let head: Head = serde_json::from_slice(bytes).map_err(|e| ClaimsError::Syntax(e.to_string()))?;
                check_head(&head.format, head.version)?;
                if head.version != 1 {
                    return Err(ClaimsError::Syntax(format!("version {} written as one document", head.version)));
                }
                serde_json::from_slice::<DeviceClaims>(bytes).map_err(|e| ClaimsError::Syntax(e.to_string()))?
            }
        };
        c.check()?;
        Ok(c)
    }

    fn check(&self) -> Result<(), ClaimsError> {
        many("processes", self.holders.len(), MAX_HOLDERS)?;
        many("files", self.files.len(), MAX_FILES)?;
        many("GPUs", self.gpus.len(), MAX_GPUS)?;
        let mut pids = std::collections::BTreeSet::new();
        for h in &self.holders {
            holder_fits(h)?;
            if !pids.insert(h.pid) {
                return Err(ClaimsError::Invalid(format!("pid {} is listed twice", h.pid)));
            }
        }
        let mut ids = std::collections::BTreeSet::new();
        for f in &self.files {
            if !ids.insert(f.id) {
                return Err(ClaimsError::Invalid(format!("file id {:#x} is listed twice", f.id)));
            }
            match (f.node, f.gpu) {
                (NvidiaNode::Gpu(_), None) => {
                    return Err(ClaimsError::Invalid(format!("file id {:#x} opens a GPU node but names no GPU", f.id)))
                }
                (NvidiaNode::Gpu(_), Some(_)) | (_, None) => {}
                (_, Some(_)) => {
                    return Err(ClaimsError::Invalid(format!("file id {:#x} names a GPU for {}", f.id, f.node)))
                }
            }
        }
        Ok(())
    }

    /// One line per process for reports: `pid 12 (pt_data_worker): 8 descriptors, 8 mappings: handled`.
    pub fn summary_lines(&self) -> Vec<String> {
        self.holders
            .iter()
            .map(|h| {
                format!(
                    "pid {} ({}): {} GPU descriptor(s), {} device mapping(s) inherited, no CUDA context: handled (descriptors reopened on the restoring node, mappings restored as inert placeholders)",
                    h.pid,
                    crate::text::shown(&h.comm),
                    h.fds.len(),
                    h.mappings.len()
                )
            })
            .collect()
    }
}

/// The header line of a version 2 file.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Header {
    format: String,
    version: u16,
    hostname: String,
    gpus: BTreeMap<u32, GpuUuid>,
}

/// Every line after the header of a version 2 file.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
enum Record {
    Holder(DeviceHolder),
    File(ClaimedFile),
}

#[derive(Serialize)]
#[serde(rename_all = "kebab-case")]
enum RecordRef<'a> {
    Holder(&'a DeviceHolder),
    File(&'a ClaimedFile),
}

fn json_line(value: &impl Serialize) -> Vec<u8> {
    // Serializing plain data with string keys cannot fail.
    let mut v = serde_json::to_vec(value).unwrap_or_default();
    v.push(b'\n');
    v
}

/// The line a dump appends for one process.
pub fn holder_line(h: &DeviceHolder) -> Vec<u8> {
    json_line(&RecordRef::Holder(h))
}

/// The line a dump appends for one open file.
pub fn file_line(f: &ClaimedFile) -> Vec<u8> {
    json_line(&RecordRef::File(f))
}

fn many(what: &'static str, count: usize, max: usize) -> Result<(), ClaimsError> {
    if count > max {
        Err(ClaimsError::TooMany { what, count, max })
    } else {
        Ok(())
    }
}

fn check_head(format: &str, version: u16) -> Result<(), ClaimsError> {
    if format != CLAIMS_FORMAT {
        return Err(ClaimsError::Syntax(format!("its format is {:?}", crate::text::shown(format))));
    }
    if version > CLAIMS_VERSION {
        return Err(ClaimsError::Newer(version));
    }
    Ok(())
}

fn decode_lines(first: &[u8], rest: &[u8]) -> Result<DeviceClaims, ClaimsError> {
    let head: Header = serde_json::from_slice(first).map_err(|e| ClaimsError::Syntax(format!("line 1: {e}")))?;
    let mut c = DeviceClaims {
        format: head.format,
        version: head.version,
        hostname: head.hostname,
        gpus: head.gpus,
        holders: Vec::new(),
        files: Vec::new(),
    };
    for (i, line) in rest.split(|&b| b == b'\n').enumerate() {
        if line.is_empty() {
            continue;
        }
        let record: Record =
            serde_json::from_slice(line).map_err(|e| ClaimsError::Syntax(format!("line {}: {e}", i + 2)))?;
        match record {
            Record::Holder(h) => {
                c.holders.push(h);
                many("processes", c.holders.len(), MAX_HOLDERS)?;
            }
            Record::File(f) => {
                c.files.push(f);
                many("files", c.files.len(), MAX_FILES)?;
            }
        }
    }
    Ok(c)
}

/// Whether one process's claims are inside the per-process bounds and well formed.
pub fn holder_fits(h: &DeviceHolder) -> Result<(), ClaimsError> {
    many("mappings of one process", h.mappings.len(), MAX_MAPPINGS_PER_HOLDER)?;
    many("descriptors of one process", h.fds.len(), MAX_FDS_PER_HOLDER)?;
    many("groups of one process", h.creds.as_ref().map_or(0, |c| c.groups.len()), MAX_GROUPS)?;
    if h.pid == 0 {
        return Err(ClaimsError::Invalid("a process with pid 0".into()));
    }
    for m in &h.mappings {
        if m.start >= m.end || m.start % 4096 != 0 || m.end % 4096 != 0 {
            return Err(ClaimsError::Invalid(format!(
                "pid {}: mapping {:#x}-{:#x} is no page-aligned range",
                h.pid, m.start, m.end
            )));
        }
    }
    Ok(())
}

/// The running total of what a dump will write into the claims file, checked against the bounds before it is
/// written: by the dump before any lock (over the tree's holdings read ahead), by `criu-cuda-migrate job`, and by
/// each claim. Each descriptor reserves one open file's line ([`MAX_FILE_LINE`]): CRIU hands the files over later.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClaimsTally {
    pub holders: usize,
    pub bytes: usize,
    pub reserved_files: usize,
}

impl ClaimsTally {
    /// The tally of a file's header alone.
    pub fn new(header_bytes: usize) -> ClaimsTally {
        ClaimsTally { holders: 0, bytes: header_bytes, reserved_files: 0 }
    }

    /// Adds one process, or says which bound it would cross (nothing is added then).
    pub fn add(&mut self, h: &DeviceHolder) -> Result<(), ClaimsError> {
        holder_fits(h)?;
        many("processes", self.holders + 1, MAX_HOLDERS)?;
        let files = self.reserved_files.saturating_add(h.fds.len());
        let bytes =
            self.bytes.saturating_add(holder_line(h).len()).saturating_add(h.fds.len().saturating_mul(MAX_FILE_LINE));
        if bytes > MAX_CLAIMS_BYTES {
            return Err(ClaimsError::TooLarge { got: bytes });
        }
        self.holders += 1;
        self.bytes = bytes;
        self.reserved_files = files;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROC_DEVICES: &str = "Character devices:\n  1 mem\n  4 tty\n195 nvidia-frontend\n195 nvidia\n238 nvidia-uvm\n239 nvidia-nvswitch\n240 nvidia-nvlink\n241 nvidia-caps\n242 nvidia-caps-imex-channels\n\nBlock devices:\n  7 loop\n195 nvidia-fake-block\n";

    fn devices() -> NvidiaDevices {
        NvidiaDevices::from_proc_devices(PROC_DEVICES)
    }

    fn chr(major: u32, minor: u32) -> DevNumber {
        DevNumber { kind: DevType::Char, major, minor }
    }

    #[test]
    fn proc_devices_gives_the_nvidia_and_uvm_majors_and_names_the_others() {
        let d = devices();
        assert_eq!(d.nvidia_major, Some(195));
        assert_eq!(d.uvm_major, Some(238));
        assert_eq!(d.other.len(), 3);
        assert_eq!(d.caps_major, Some(241));
        assert_eq!(d.classify(chr(241, 2)), Some(NvidiaNode::Cap(2)));
        assert_eq!(d.number_of(NvidiaNode::Cap(1)), Some(chr(241, 1)));
        assert_eq!(d.classify(chr(195, 255)), Some(NvidiaNode::Control));
        assert_eq!(d.classify(chr(195, 254)), Some(NvidiaNode::Modeset));
        assert_eq!(d.classify(chr(195, 3)), Some(NvidiaNode::Gpu(3)));
        assert_eq!(d.classify(chr(238, 0)), Some(NvidiaNode::Uvm));
        assert_eq!(d.classify(chr(238, 1)), Some(NvidiaNode::UvmTools));
        assert_eq!(d.classify(chr(238, 2)), None);
        assert_eq!(d.classify(chr(1, 5)), None);
        // A block device of the same major is not the GPU node.
        assert_eq!(d.classify(DevNumber { kind: DevType::Block, major: 195, minor: 0 }), None);
        assert_eq!(d.unclaimed_major(chr(242, 1)), Some("nvidia-caps-imex-channels"));
        assert_eq!(d.unclaimed_major(chr(241, 1)), None);
        assert_eq!(d.unclaimed_major(chr(195, 1)), None);
        assert_eq!(d.number_of(NvidiaNode::Gpu(2)), Some(chr(195, 2)));
        assert_eq!(d.number_of(NvidiaNode::UvmTools), Some(chr(238, 1)));
        assert!(NvidiaDevices::from_proc_devices("Character devices:\n  1 mem\n").is_empty());
    }

    #[test]
    fn stand_ins_come_first_and_bad_ones_name_the_syntax() {
        let d = devices().with_stand_ins("char:10:237=nvidiactl, block:7:0=nvidia0").unwrap();
        assert_eq!(d.classify(chr(10, 237)), Some(NvidiaNode::Control));
        assert_eq!(d.classify(DevNumber { kind: DevType::Block, major: 7, minor: 0 }), Some(NvidiaNode::Gpu(0)));
        assert_eq!(d.number_of(NvidiaNode::Gpu(0)), Some(DevNumber { kind: DevType::Block, major: 7, minor: 0 }));
        for bad in ["char:10:237", "pipe:1:2=nvidiactl", "char:10=nvidiactl", "char:10:1=nvidia07", "char:1:2=sda"] {
            let e = NvidiaDevices::default().with_stand_ins(bad).unwrap_err();
            assert!(e.to_string().contains("TYPE:MAJOR:MINOR=NAME"), "{e}");
        }
    }

    #[test]
    fn node_names_round_trip_and_refuse_lookalikes() {
        for n in [
            NvidiaNode::Control,
            NvidiaNode::Modeset,
            NvidiaNode::Gpu(0),
            NvidiaNode::Gpu(17),
            NvidiaNode::Uvm,
            NvidiaNode::Cap(2),
        ] {
            assert_eq!(NvidiaNode::from_dev_name(&n.dev_name()), Some(n));
        }
        for bad in [
            "nvidia",
            "nvidia01",
            "nvidia254",
            "nvidia-caps",
            "nvidia-1",
            "../nvidia0",
            "nvidia0 ",
            "nvidia-caps/nvidia-cap01",
            "nvidia-caps/../nvidia-cap1",
        ] {
            assert_eq!(NvidiaNode::from_dev_name(bad), None, "{bad}");
        }
    }

    pub(crate) fn sample() -> DeviceClaims {
        let mut c = DeviceClaims::new("node-a", BTreeMap::from([(0, crate::image::tests::uuid(0))]));
        c.holders.push(DeviceHolder {
            pid: 12,
            host_pid: 3012,
            comm: "pt_data_worker".into(),
            mappings: vec![
                ClaimedMapping {
                    start: 0x2_0060_0000,
                    end: 0x2_0080_0000,
                    perms: "rw-s".into(),
                    offset: 0,
                    node: NvidiaNode::Gpu(0),
                },
                ClaimedMapping {
                    start: 0x7f00_0000_0000,
                    end: 0x7f00_0000_1000,
                    perms: "rw-s".into(),
                    offset: 0x1000,
                    node: NvidiaNode::Control,
                },
            ],
            fds: vec![ClaimedFd { fd: 7, node: NvidiaNode::Control }, ClaimedFd { fd: 9, node: NvidiaNode::Gpu(0) }],
            creds: Some(HolderCreds { uid: 1000, gid: 1000, groups: vec![44] }),
        });
        c.add_file(ClaimedFile { id: 0x11, node: NvidiaNode::Control, gpu: None, flags: 2 });
        c.add_file(ClaimedFile {
            id: 0x12,
            node: NvidiaNode::Gpu(0),
            gpu: Some(crate::image::tests::uuid(0)),
            flags: 2,
        });
        c
    }

    #[test]
    fn claims_round_trip_and_answer_lookups() {
        let c = sample();
        let back = DeviceClaims::decode(&c.encode()).unwrap();
        assert_eq!(back, c);
        assert_eq!(back.file(0x12).map(|f| f.node), Some(NvidiaNode::Gpu(0)));
        assert_eq!(back.holder(12).and_then(|h| h.mapping_at(0x2_0060_0000)).map(|m| m.len()), Some(0x20_0000));
        assert_eq!(back.holder(12).map(|h| h.placeholder_bytes()), Some(0x20_0000));
        assert_eq!(back.gpus_needed(), vec![crate::image::tests::uuid(0)]);
        assert!(back.summary_lines()[0].contains("pid 12 (pt_data_worker): 2 GPU descriptor(s), 2 device mapping(s)"));
    }

    #[test]
    fn hostile_claims_are_refused_with_a_reason() {
        let good = String::from_utf8(sample().encode()).unwrap();
        let cases: Vec<(String, &str)> = vec![
            (good.replace("\"version\":2", "\"version\":9"), "version 9"),
            (good.replace(CLAIMS_FORMAT, "something else"), "format"),
            (good.replace("\"pid\":12", "\"pid\":0"), "pid 0"),
            (good.replace("\"start\":8596226048", "\"start\":8596226049"), "page-aligned"),
            (good.replace("\"id\":18", "\"id\":17"), "listed twice"),
            (good.replace("\"fd\":7", "\"fd\":7,\"extra\":1"), "unknown field"),
            (good.replace("\"holder\"", "\"other\""), "line 2"),
            (format!("{good}{}", String::from_utf8(holder_line(&sample().holders[0])).unwrap()), "listed twice"),
            (good.replace("\"version\":2", "\"version\":1"), "version 1 header"),
            ("[]".into(), "claims file"),
        ];
        for (text, want) in cases {
            let e = DeviceClaims::decode(text.as_bytes()).unwrap_err().to_string();
            assert!(e.contains(want), "{want}: {e}");
        }
        assert!(matches!(DeviceClaims::decode(&vec![b' '; MAX_CLAIMS_BYTES + 1]), Err(ClaimsError::TooLarge { .. })));
    }

    /// Low finding of issue 46's review: a task that could not open a node gets no descriptor of it at restore,
    /// and a capability node is never reopened for writing.
    #[test]
    fn a_node_is_reopened_only_as_the_holders_credentials_allow() {
        let user = HolderCreds { uid: 1000, gid: 1000, groups: vec![44] };
        // nvidia-cap1 as the driver makes it: 0400 root:root.
        assert!(!may_open(0o100400, 0, 0, &user, true, false));
        assert!(may_open(0o100400, 0, 0, &HolderCreds { uid: 0, gid: 0, groups: vec![] }, true, true));
        // nvidiactl 0666: anyone; a 0660 node of group 44 (video): its members only.
        assert!(may_open(0o020666, 0, 0, &user, true, true));
        assert!(may_open(0o020660, 0, 44, &user, true, true));
        assert!(!may_open(0o020660, 0, 45, &user, true, false));
        assert!(may_open(0o020640, 0, 44, &user, true, false) && !may_open(0o020640, 0, 44, &user, true, true));
        assert_eq!(narrowed_flags(NvidiaNode::Cap(1), 0o2_000_002), 0o2_000_000);
        assert_eq!(narrowed_flags(NvidiaNode::Control, 0o2_000_002), 0o2_000_002);
    }

    /// The header's reservation holds the longest header a node can write.
    #[test]
    fn the_longest_header_fits_its_reservation() {
        let gpus = (0..u32::try_from(MAX_GPUS).unwrap()).map(|m| (m + 1000, crate::image::tests::uuid(0xff))).collect();
        let c = DeviceClaims::new(&"\u{7f}".repeat(MAX_TEXT), gpus);
        assert!(c.header_line().len() <= MAX_HEADER_LINE, "{} > {MAX_HEADER_LINE}", c.header_line().len());
    }

    /// Images written by an earlier plugin (version 1: one pretty-printed document) still restore.
    #[test]
    fn a_version_1_file_is_still_read() {
        let mut v1 = sample();
        v1.version = 1;
        let bytes = serde_json::to_vec_pretty(&v1).unwrap();
        assert_eq!(DeviceClaims::decode(&bytes).unwrap(), v1);
        let newer = String::from_utf8(bytes).unwrap().replace("\"version\": 1", "\"version\": 2");
        assert!(DeviceClaims::decode(newer.as_bytes()).unwrap_err().to_string().contains("one document"));
    }

    /// The encoding is appendable: the header, then a line per record, each line alone a record; what the dump
    /// appends claim by claim decodes to the same claims as the whole encoding.
    #[test]
    fn lines_appended_one_by_one_equal_the_whole_encoding() {
        let c = sample();
        let mut appended = c.header_line();
        for h in &c.holders {
            appended.extend(holder_line(h));
        }
        for f in &c.files {
            appended.extend(file_line(f));
        }
        assert_eq!(appended, c.encode());
        assert_eq!(c.encode().iter().filter(|&&b| b == b'\n').count(), 1 + c.holders.len() + c.files.len());
    }

    /// A torch DataLoader worker's real holdings (measured on an H100: 30 device mappings, 31 descriptors): 8 ranks
    /// x 32 workers fit the one bound with room to spare, and the tally refuses what the reader would refuse.
    #[test]
    fn a_node_of_8_ranks_by_32_workers_fits_and_the_tally_matches_the_reader() {
        let worker = |pid: u32| DeviceHolder {
            pid,
            host_pid: pid + 100_000,
            comm: "pt_data_worker".into(),
            mappings: (0..30u64)
                .map(|i| ClaimedMapping {
                    start: 0x7f00_0000_0000 + i * 0x20_0000,
                    end: 0x7f00_0000_0000 + i * 0x20_0000 + 0x1000,
                    perms: "rw-s".into(),
                    offset: i * 0x1000,
                    node: if i % 3 == 0 { NvidiaNode::Gpu(u32::try_from(i % 8).unwrap()) } else { NvidiaNode::Control },
                })
                .collect(),
            fds: (0..31u32).map(|fd| ClaimedFd { fd: fd + 10, node: NvidiaNode::Gpu(fd % 8) }).collect(),
            creds: Some(HolderCreds { uid: 1000, gid: 1000, groups: (0..8).collect() }),
        };
        let mut c =
            DeviceClaims::new("node-a", (0..8u8).map(|m| (u32::from(m), crate::image::tests::uuid(m))).collect());
        let mut tally = ClaimsTally::new(c.header_line().len());
        for pid in 0..256 {
            let h = worker(pid + 2);
            tally.add(&h).unwrap();
            c.holders.push(h);
        }
        let bytes = c.encode();
        assert!(bytes.len() < 2 << 20, "{} bytes", bytes.len());
        assert!(tally.bytes >= bytes.len() && tally.bytes < MAX_CLAIMS_BYTES / 16);
        assert_eq!(DeviceClaims::decode(&bytes).unwrap().holders.len(), 256);
        // One process over a per-process bound: the tally and the reader refuse it alike.
        let mut big = worker(9999);
        big.fds = (0..=u32::try_from(MAX_FDS_PER_HOLDER).unwrap())
            .map(|fd| ClaimedFd { fd, node: NvidiaNode::Control })
            .collect();
        let e = tally.clone().add(&big).unwrap_err();
        assert!(e.to_string().contains("descriptors of one process"), "{e}");
        c.holders.push(big);
        assert_eq!(DeviceClaims::decode(&c.encode()).unwrap_err(), e);
    }

    proptest::proptest! {
        #[test]
        fn decoding_never_panics(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
            let _ = DeviceClaims::decode(&bytes);
        }
    }
}
