//! The identity image: what the dump node knew about a CUDA process's GPUs.
//!
//! The plugin writes one image per CUDA process at dump, into CRIU's image directory, as
//! `cuda-migrate-<pid>.img`; restore reads it back and never modifies it. The format is a small,
//! hand-written, little-endian binary layout (see `docs/IMAGE-FORMAT.md`): a fixed header, a
//! payload and a CRC32 trailer. Decoding treats the file as untrusted input: every count and
//! length is bounded and checked against the bytes that remain before anything is allocated,
//! and no input makes it panic.

use crate::devprop::PropSite;
use crate::gpu::{GpuIdentity, GpuUuid, PciAddress, PciSignature};
use crate::memory::DeviceMemoryUse;

/// First 8 bytes of every identity image.
pub const MAGIC: [u8; 8] = *b"CCMIDIMG";
/// The format version this code writes, and the newest it reads. Version 2 added the runtime's
/// `cudaDeviceProp` copies and the device memory per GPU; version-1 images read with neither.
pub const FORMAT_VERSION: u16 = 2;
/// Header: magic (8), version (2), flags (2), payload length (4).
pub const HEADER_LEN: usize = 16;
/// Trailer: CRC32 of header and payload.
pub const TRAILER_LEN: usize = 4;
/// Upper bound of a whole image file.
pub const MAX_IMAGE_BYTES: usize = 16 * 1024 * 1024;
/// Upper bound of each GPU list (node GPUs, enumerated, used).
pub const MAX_GPUS: usize = 64;
/// Upper bound of the number of PCI word sites.
pub const MAX_SITES: usize = 4096;
/// Upper bound of each string, in bytes.
pub const MAX_STRING_BYTES: usize = 4096;

/// Encoded size of one UUID.
const UUID_BYTES: usize = 16;
/// Smallest encoded size of one [`GpuIdentity`] (an empty name).
const MIN_GPU_BYTES: usize = UUID_BYTES + 4 * 7 + 4 + 8;
/// Smallest encoded size of one [`PciSite`] (an empty mapping name).
const MIN_SITE_BYTES: usize = UUID_BYTES + 8 * 3 + 4 + 4 * 6;
/// Smallest encoded size of one [`PropSite`] (an empty mapping name).
const MIN_PROP_SITE_BYTES: usize = UUID_BYTES + 8 + 2 + 8 * 2 + 4;
/// Encoded size of one [`DeviceMemoryUse`].
const MEMORY_USE_BYTES: usize = UUID_BYTES + 8;

/// The environment variables that decide which GPUs a CUDA process sees, as they were at dump.
#[derive(Clone, PartialEq, Eq, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct ProcessEnv {
    pub cuda_visible_devices: Option<String>,
    pub cuda_device_order: Option<String>,
    pub nvidia_visible_devices: Option<String>,
}

/// One place in the process's memory where libcuda kept a GPU's six PCI words at dump.
#[derive(Clone, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
pub struct PciSite {
    /// The GPU whose signature was found there.
    pub gpu: GpuUuid,
    /// Virtual address of the first word in the process.
    pub addr: u64,
    /// Start of the mapping that holds it (from `/proc/PID/maps`).
    pub mapping_start: u64,
    /// End (exclusive) of that mapping.
    pub mapping_end: u64,
    /// The mapping's name in `/proc/PID/maps` (`[heap]`, empty for anonymous memory).
    pub mapping_name: String,
    /// The words found there (the GPU's signature at dump).
    pub words: PciSignature,
}

/// Everything the dump recorded about one CUDA process's GPU identity.
#[derive(Clone, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
pub struct IdentityImage {
    /// Pid at dump as seen in the process's own pid namespace (innermost `NSpid`).
    pub pid: u32,
    /// Pid as CRIU saw it at dump.
    pub host_pid: u32,
    /// Seconds since the Unix epoch at dump.
    pub dumped_at_unix: u64,
    pub hostname: String,
    /// NVML system driver version, e.g. "580.159.04".
    pub driver_version: String,
    /// `cuDriverGetVersion`, e.g. 13000.
    pub cuda_driver_version: i32,
    /// Every GPU the kernel driver / NVML saw on the dump node, in NVML index order.
    pub node_gpus: Vec<GpuIdentity>,
    /// GPUs the process's libcuda enumerated at its start: the restore map must pair every one.
    pub enumerated: Vec<GpuUuid>,
    /// GPUs the process used (held `/dev/nvidiaN` open), in its CUDA ordinal order when known.
    pub used: Vec<GpuUuid>,
    pub env: ProcessEnv,
    /// Where the six PCI words sat at dump.
    pub sites: Vec<PciSite>,
    /// The CUDA runtime's (and frameworks') `cudaDeviceProp` copies found at dump (version 2).
    pub prop_sites: Vec<PropSite>,
    /// Device memory the process held per GPU just before its checkpoint; `None` when NVML could
    /// not tell (or a version-1 image).
    pub device_memory: Option<Vec<DeviceMemoryUse>>,
}

/// Why an identity image could not be read (or written within the format's bounds).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageError {
    #[error(
        "identity image is {len} bytes, shorter than the {min}-byte minimum; the file was cut: re-dump the process"
    )]
    TooShort { len: usize, min: usize },
    #[error("identity image is truncated: {needed} bytes needed at offset {offset}, {available} left; the file was cut: re-dump the process")]
    Truncated { offset: usize, needed: usize, available: usize },
    #[error("not a criu-cuda-migrate identity image (it does not start with \"CCMIDIMG\"): a file of that name that criu-cuda-migrate's dump did not write; remove it, or dump again")]
    BadMagic,
    #[error("identity image format version {found} is newer than this build of criu-cuda-migrate reads (up to {supported}); upgrade criu-cuda-migrate to a release that reads format version {found}")]
    NewerVersion { found: u16, supported: u16 },
    #[error("identity image format version {found} is not a released format (this build of criu-cuda-migrate reads 1..={supported}); the file is damaged or not ours: re-dump the process")]
    UnsupportedVersion { found: u16, supported: u16 },
    #[error("identity image checksum mismatch (stored {stored:#010x}, computed {computed:#010x}); the image is corrupted: re-dump the process")]
    ChecksumMismatch { stored: u32, computed: u32 },
    #[error("identity image field `{field}` is {value}, above the format's limit of {max}; the image is corrupted or was written by a broken dumper: re-dump the process")]
    LengthOutOfBounds { field: &'static str, value: u64, max: u64 },
    #[error("identity image field `{field}` is not valid UTF-8; the image is corrupted: re-dump the process")]
    InvalidUtf8 { field: &'static str },
    #[error("identity image field `{field}` holds a control character, which no dump writes; the image is corrupted or forged: re-dump the process")]
    ControlCharacter { field: &'static str },
    #[error("identity image has {count} unexpected trailing bytes at offset {offset}; the image is corrupted or was concatenated: re-dump the process")]
    TrailingBytes { offset: usize, count: usize },
    #[error("identity image field `{field}` holds {value}, which is not allowed there; the image is corrupted: re-dump the process")]
    InvalidValue { field: &'static str, value: u64 },
}

impl IdentityImage {
    /// The file name of the image of the process with this pid: `cuda-migrate-<pid>.img`.
    pub fn file_name(pid: u32) -> String {
        format!("cuda-migrate-{pid}.img")
    }

    /// The dump node's record of a GPU.
    pub fn gpu(&self, u: &GpuUuid) -> Option<&GpuIdentity> {
        self.node_gpus.iter().find(|g| g.uuid == *u)
    }

    /// Every string field, named as errors name it.
    fn strings(&self) -> Vec<(&'static str, &str)> {
        let mut out = vec![("hostname", self.hostname.as_str()), ("driver_version", self.driver_version.as_str())];
        out.extend(self.node_gpus.iter().map(|g| ("gpu.name", g.name.as_str())));
        for (field, value) in [
            ("env.cuda_visible_devices", &self.env.cuda_visible_devices),
            ("env.cuda_device_order", &self.env.cuda_device_order),
            ("env.nvidia_visible_devices", &self.env.nvidia_visible_devices),
        ] {
            out.extend(value.as_deref().map(|v| (field, v)));
        }
        out.extend(self.sites.iter().map(|s| ("site.mapping_name", s.mapping_name.as_str())));
        out.extend(self.prop_sites.iter().map(|s| ("prop_site.mapping_name", s.mapping_name.as_str())));
        out
    }

    /// Escapes the control characters of every string field (`\n` for a newline): what the dump
    /// read from places it does not control (the hostname, another process's maps and environment)
    /// never reaches an image, a log or a terminal raw. Returns whether anything changed.
    pub fn escape_controls(&mut self) -> bool {
        let mut changed = false;
        let mut fix = |s: &mut String| {
            if crate::text::has_control(s) {
                *s = crate::text::escaped(s);
                changed = true;
            }
        };
        fix(&mut self.hostname);
        fix(&mut self.driver_version);
        self.node_gpus.iter_mut().for_each(|g| fix(&mut g.name));
        for v in
            [&mut self.env.cuda_visible_devices, &mut self.env.cuda_device_order, &mut self.env.nvidia_visible_devices]
                .into_iter()
                .flatten()
        {
            fix(v);
        }
        self.sites.iter_mut().for_each(|s| fix(&mut s.mapping_name));
        self.prop_sites.iter_mut().for_each(|s| fix(&mut s.mapping_name));
        changed
    }

    /// Checks that the image fits the format's bounds, so that [`IdentityImage::decode`] will read
    /// back what [`IdentityImage::encode`] writes. The dump side calls this before writing.
    pub fn check_bounds(&self) -> Result<(), ImageError> {
        let count = |field: &'static str, n: usize, max: usize| {
            if n > max {
                Err(ImageError::LengthOutOfBounds { field, value: n as u64, max: max as u64 })
            } else {
                Ok(())
            }
        };
        for (field, text) in self.strings() {
            if crate::text::has_control(text) {
                return Err(ImageError::ControlCharacter { field });
            }
        }
        count("node_gpus", self.node_gpus.len(), MAX_GPUS)?;
        count("enumerated", self.enumerated.len(), MAX_GPUS)?;
        count("used", self.used.len(), MAX_GPUS)?;
        count("sites", self.sites.len(), MAX_SITES)?;
        count("prop_sites", self.prop_sites.len(), MAX_SITES)?;
        count("device_memory", self.device_memory.as_ref().map_or(0, Vec::len), MAX_GPUS)?;
        count("hostname", self.hostname.len(), MAX_STRING_BYTES)?;
        count("driver_version", self.driver_version.len(), MAX_STRING_BYTES)?;
        for g in &self.node_gpus {
            count("gpu.name", g.name.len(), MAX_STRING_BYTES)?;
        }
        for (field, value) in [
            ("env.cuda_visible_devices", &self.env.cuda_visible_devices),
            ("env.cuda_device_order", &self.env.cuda_device_order),
            ("env.nvidia_visible_devices", &self.env.nvidia_visible_devices),
        ] {
            if let Some(v) = value {
                count(field, v.len(), MAX_STRING_BYTES)?;
            }
        }
        for s in &self.sites {
            count("site.mapping_name", s.mapping_name.len(), MAX_STRING_BYTES)?;
        }
        for s in &self.prop_sites {
            count("prop_site.mapping_name", s.mapping_name.len(), MAX_STRING_BYTES)?;
        }
        let total = self.encode_unchecked().len();
        count("image length", total, MAX_IMAGE_BYTES)
    }

    /// Encodes after [`IdentityImage::check_bounds`]: the bytes are guaranteed to decode.
    pub fn try_encode(&self) -> Result<Vec<u8>, ImageError> {
        self.check_bounds()?;
        Ok(self.encode_unchecked())
    }

    /// Encodes the image. Values beyond the format's bounds are written as they are and then
    /// refused by [`IdentityImage::decode`]; use [`IdentityImage::try_encode`] to refuse them here.
    pub fn encode(&self) -> Vec<u8> {
        self.encode_unchecked()
    }

    fn encode_unchecked(&self) -> Vec<u8> {
        let mut p = Writer::default();
        p.u32(self.pid);
        p.u32(self.host_pid);
        p.u64(self.dumped_at_unix);
        p.string(&self.hostname);
        p.string(&self.driver_version);
        p.i32(self.cuda_driver_version);
        p.count(self.node_gpus.len());
        for g in &self.node_gpus {
            p.gpu(g);
        }
        p.count(self.enumerated.len());
        for u in &self.enumerated {
            p.uuid(u);
        }
        p.count(self.used.len());
        for u in &self.used {
            p.uuid(u);
        }
        p.opt_string(self.env.cuda_visible_devices.as_deref());
        p.opt_string(self.env.cuda_device_order.as_deref());
        p.opt_string(self.env.nvidia_visible_devices.as_deref());
        p.count(self.sites.len());
        for s in &self.sites {
            p.uuid(&s.gpu);
            p.u64(s.addr);
            p.u64(s.mapping_start);
            p.u64(s.mapping_end);
            p.string(&s.mapping_name);
            p.signature(&s.words);
        }
        p.count(self.prop_sites.len());
        for s in &self.prop_sites {
            p.uuid(&s.gpu);
            p.u64(s.addr);
            p.u16(s.runtime_major);
            p.u64(s.mapping_start);
            p.u64(s.mapping_end);
            p.string(&s.mapping_name);
        }
        match &self.device_memory {
            None => p.u8(0),
            Some(uses) => {
                p.u8(1);
                p.count(uses.len());
                for u in uses {
                    p.uuid(&u.gpu);
                    p.u64(u.bytes);
                }
            }
        }
        let payload = p.0;

        let mut out = Vec::with_capacity(HEADER_LEN + payload.len() + TRAILER_LEN);
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes()); // flags: none defined in version 1
        out.extend_from_slice(&len_u32(payload.len()).to_le_bytes());
        out.extend_from_slice(&payload);
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Decodes an image. Never panics; every malformed input is an [`ImageError`].
    pub fn decode(bytes: &[u8]) -> Result<Self, ImageError> {
        let min = HEADER_LEN + TRAILER_LEN;
        if bytes.len() < min {
            return Err(ImageError::TooShort { len: bytes.len(), min });
        }
        if bytes.len() > MAX_IMAGE_BYTES {
            return Err(ImageError::LengthOutOfBounds {
                field: "image length",
                value: bytes.len() as u64,
                max: MAX_IMAGE_BYTES as u64,
            });
        }
        let mut header = Reader::new(&bytes[..HEADER_LEN]);
        let magic: [u8; 8] = header.array()?;
        if magic != MAGIC {
            return Err(ImageError::BadMagic);
        }
        let version = header.u16()?;
        if version > FORMAT_VERSION {
            return Err(ImageError::NewerVersion { found: version, supported: FORMAT_VERSION });
        }
        if version == 0 {
            return Err(ImageError::UnsupportedVersion { found: version, supported: FORMAT_VERSION });
        }
        // Flags are reserved in versions 1 and 2: written as 0, ignored on read (the checksum still
        // covers them). A change that old readers must not ignore bumps the version instead.
        let _flags = header.u16()?;
        let payload_len = header.u32()? as usize;
        let max_payload = MAX_IMAGE_BYTES - HEADER_LEN - TRAILER_LEN;
        if payload_len > max_payload {
            return Err(ImageError::LengthOutOfBounds {
                field: "payload length",
                value: payload_len as u64,
                max: max_payload as u64,
            });
        }
        let expected_total = HEADER_LEN + payload_len + TRAILER_LEN;
        if bytes.len() < expected_total {
            return Err(ImageError::Truncated {
                offset: bytes.len(),
                needed: expected_total - bytes.len(),
                available: 0,
            });
        }
        if bytes.len() > expected_total {
            return Err(ImageError::TrailingBytes { offset: expected_total, count: bytes.len() - expected_total });
        }
        let body_end = HEADER_LEN + payload_len;
        let stored =
            u32::from_le_bytes([bytes[body_end], bytes[body_end + 1], bytes[body_end + 2], bytes[body_end + 3]]);
        let computed = crc32fast::hash(&bytes[..body_end]);
        if stored != computed {
            return Err(ImageError::ChecksumMismatch { stored, computed });
        }

        let mut r = Reader { buf: &bytes[..body_end], pos: HEADER_LEN };
        let pid = r.u32()?;
        let host_pid = r.u32()?;
        let dumped_at_unix = r.u64()?;
        let hostname = r.string("hostname")?;
        let driver_version = r.string("driver_version")?;
        let cuda_driver_version = r.i32()?;
        let n = r.count("node_gpus", MAX_GPUS, MIN_GPU_BYTES)?;
        let mut node_gpus = Vec::with_capacity(n);
        for _ in 0..n {
            node_gpus.push(r.gpu()?);
        }
        let n = r.count("enumerated", MAX_GPUS, UUID_BYTES)?;
        let mut enumerated = Vec::with_capacity(n);
        for _ in 0..n {
            enumerated.push(r.uuid()?);
        }
        let n = r.count("used", MAX_GPUS, UUID_BYTES)?;
        let mut used = Vec::with_capacity(n);
        for _ in 0..n {
            used.push(r.uuid()?);
        }
        let env = ProcessEnv {
            cuda_visible_devices: r.opt_string("env.cuda_visible_devices")?,
            cuda_device_order: r.opt_string("env.cuda_device_order")?,
            nvidia_visible_devices: r.opt_string("env.nvidia_visible_devices")?,
        };
        let n = r.count("sites", MAX_SITES, MIN_SITE_BYTES)?;
        let mut sites = Vec::with_capacity(n);
        for _ in 0..n {
            sites.push(PciSite {
                gpu: r.uuid()?,
                addr: r.u64()?,
                mapping_start: r.u64()?,
                mapping_end: r.u64()?,
                mapping_name: r.string("site.mapping_name")?,
                words: r.signature()?,
            });
        }
        let mut prop_sites = Vec::new();
        let mut device_memory = None;
        if version >= 2 {
            let n = r.count("prop_sites", MAX_SITES, MIN_PROP_SITE_BYTES)?;
            prop_sites.reserve(n);
            for _ in 0..n {
                prop_sites.push(PropSite {
                    gpu: r.uuid()?,
                    addr: r.u64()?,
                    runtime_major: r.u16()?,
                    mapping_start: r.u64()?,
                    mapping_end: r.u64()?,
                    mapping_name: r.string("prop_site.mapping_name")?,
                });
            }
            device_memory = match r.u8()? {
                0 => None,
                1 => {
                    let n = r.count("device_memory", MAX_GPUS, MEMORY_USE_BYTES)?;
                    let mut uses = Vec::with_capacity(n);
                    for _ in 0..n {
                        uses.push(DeviceMemoryUse { gpu: r.uuid()?, bytes: r.u64()? });
                    }
                    Some(uses)
                }
                other => return Err(ImageError::InvalidValue { field: "device_memory", value: u64::from(other) }),
            };
        }
        if r.pos != body_end {
            return Err(ImageError::TrailingBytes { offset: r.pos, count: body_end - r.pos });
        }
        Ok(IdentityImage {
            pid,
            host_pid,
            dumped_at_unix,
            hostname,
            driver_version,
            cuda_driver_version,
            node_gpus,
            enumerated,
            used,
            env,
            sites,
            prop_sites,
            device_memory,
        })
    }
}

/// Parses the pid back out of an identity image's file name (`cuda-migrate-<pid>.img`).
/// Only the canonical decimal form that [`IdentityImage::file_name`] writes is accepted.
/// The name of the restore report the plugin leaves next to the images (never an image itself).
pub fn report_file_name(pid: u32) -> String {
    format!("cuda-migrate-restore-{pid}.txt")
}

/// The pid of a restore report's file name (see [`report_file_name`]).
pub fn is_report_file_name(name: &str) -> Option<u32> {
    let digits = name.strip_prefix("cuda-migrate-restore-")?.strip_suffix(".txt")?;
    let pid: u32 = digits.parse().ok()?;
    (pid.to_string() == digits).then_some(pid)
}

pub fn is_image_file_name(name: &str) -> Option<u32> {
    let digits = name.strip_prefix("cuda-migrate-")?.strip_suffix(".img")?;
    if digits.is_empty() || !digits.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let pid: u32 = digits.parse().ok()?;
    // Refuse leading zeros: "007" would name the same pid as "7" and is not a file we write.
    (pid.to_string() == digits).then_some(pid)
}

/// Lengths are bounded far below `u32::MAX` by [`IdentityImage::check_bounds`]; saturating keeps
/// `encode` infallible and makes an oversized field fail at decode instead of wrapping silently.
fn len_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[derive(Default)]
struct Writer(Vec<u8>);

impl Writer {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn i32(&mut self, v: i32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn count(&mut self, n: usize) {
        self.u32(len_u32(n));
    }
    fn string(&mut self, s: &str) {
        self.count(s.len());
        self.0.extend_from_slice(s.as_bytes());
    }
    fn opt_string(&mut self, s: Option<&str>) {
        match s {
            None => self.u8(0),
            Some(s) => {
                self.u8(1);
                self.string(s);
            }
        }
    }
    fn uuid(&mut self, u: &GpuUuid) {
        self.0.extend_from_slice(u.as_bytes());
    }
    fn signature(&mut self, s: &PciSignature) {
        for w in s.words() {
            self.u32(w);
        }
    }
    fn gpu(&mut self, g: &GpuIdentity) {
        self.uuid(&g.uuid);
        self.u32(g.pci.domain);
        self.u32(g.pci.bus);
        self.u32(g.pci.device);
        self.u32(g.pci.function);
        self.u32(g.pci_device_id);
        self.u32(g.pci_subsystem_id);
        self.u32(g.minor);
        self.string(&g.name);
        self.u64(g.memory_total);
    }
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], ImageError> {
        let available = self.remaining();
        if n > available {
            return Err(ImageError::Truncated { offset: self.pos, needed: n, available });
        }
        let out = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], ImageError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }
    fn u8(&mut self) -> Result<u8, ImageError> {
        Ok(self.array::<1>()?[0])
    }
    fn u16(&mut self) -> Result<u16, ImageError> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    fn u32(&mut self) -> Result<u32, ImageError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    fn i32(&mut self) -> Result<i32, ImageError> {
        Ok(i32::from_le_bytes(self.array()?))
    }
    fn u64(&mut self) -> Result<u64, ImageError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// Reads a count and checks it against its bound and against the bytes left (each element
    /// takes at least `min_elem_bytes`), so a hostile count never drives a large allocation.
    fn count(&mut self, field: &'static str, max: usize, min_elem_bytes: usize) -> Result<usize, ImageError> {
        let n = self.u32()? as usize;
        if n > max {
            return Err(ImageError::LengthOutOfBounds { field, value: n as u64, max: max as u64 });
        }
        let needed = n.saturating_mul(min_elem_bytes);
        let available = self.remaining();
        if needed > available {
            return Err(ImageError::Truncated { offset: self.pos, needed, available });
        }
        Ok(n)
    }

    fn string(&mut self, field: &'static str) -> Result<String, ImageError> {
        let n = self.count(field, MAX_STRING_BYTES, 1)?;
        let bytes = self.take(n)?;
        let s = std::str::from_utf8(bytes).map_err(|_| ImageError::InvalidUtf8 { field })?;
        if crate::text::has_control(s) {
            return Err(ImageError::ControlCharacter { field });
        }
        Ok(s.to_owned())
    }

    fn opt_string(&mut self, field: &'static str) -> Result<Option<String>, ImageError> {
        match self.u8()? {
            0 => Ok(None),
            1 => self.string(field).map(Some),
            other => Err(ImageError::InvalidValue { field, value: u64::from(other) }),
        }
    }

    fn uuid(&mut self) -> Result<GpuUuid, ImageError> {
        Ok(GpuUuid::from_bytes(self.array()?))
    }

    fn signature(&mut self) -> Result<PciSignature, ImageError> {
        let mut w = [0u32; 6];
        for slot in &mut w {
            *slot = self.u32()?;
        }
        Ok(PciSignature::from(w))
    }

    fn gpu(&mut self) -> Result<GpuIdentity, ImageError> {
        let uuid = self.uuid()?;
        let pci = PciAddress { domain: self.u32()?, bus: self.u32()?, device: self.u32()?, function: self.u32()? };
        Ok(GpuIdentity {
            uuid,
            pci,
            pci_device_id: self.u32()?,
            pci_subsystem_id: self.u32()?,
            minor: self.u32()?,
            name: self.string("gpu.name")?,
            memory_total: self.u64()?,
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    pub(crate) fn uuid(n: u8) -> GpuUuid {
        let mut b = [0u8; 16];
        b[0] = 0xa0;
        b[15] = n;
        GpuUuid(b)
    }

    pub(crate) fn h200(n: u8, bus: u32) -> GpuIdentity {
        GpuIdentity {
            uuid: uuid(n),
            pci: PciAddress { domain: 0, bus: 0, device: bus, function: 0 },
            pci_device_id: 0x2335_10de,
            pci_subsystem_id: 0x18bf_10de,
            minor: u32::from(n),
            name: "NVIDIA H200".into(),
            memory_total: 143_771 * 1024 * 1024,
        }
    }

    pub(crate) fn sample() -> IdentityImage {
        let g0 = h200(0, 6);
        let g1 = h200(1, 7);
        IdentityImage {
            pid: 42,
            host_pid: 4242,
            dumped_at_unix: 1_760_000_000,
            hostname: "gpu-node-a".into(),
            driver_version: "580.159.04".into(),
            cuda_driver_version: 13000,
            sites: vec![
                PciSite {
                    gpu: g0.uuid,
                    addr: 0x5555_0000_1000,
                    mapping_start: 0x5555_0000_0000,
                    mapping_end: 0x5555_0010_0000,
                    mapping_name: "[heap]".into(),
                    words: g0.signature(),
                },
                PciSite {
                    gpu: g1.uuid,
                    addr: 0x7f00_0000_2000,
                    mapping_start: 0x7f00_0000_0000,
                    mapping_end: 0x7f00_0010_0000,
                    mapping_name: String::new(),
                    words: g1.signature(),
                },
            ],
            enumerated: vec![g0.uuid, g1.uuid],
            used: vec![g0.uuid],
            env: ProcessEnv {
                cuda_visible_devices: Some(g0.uuid.to_string()),
                cuda_device_order: None,
                nvidia_visible_devices: Some("all".into()),
            },
            prop_sites: vec![PropSite {
                gpu: g0.uuid,
                addr: 0x5555_0000_4000,
                runtime_major: 13,
                mapping_start: 0x5555_0000_0000,
                mapping_end: 0x5555_0010_0000,
                mapping_name: "[heap]".into(),
            }],
            device_memory: Some(vec![DeviceMemoryUse { gpu: g0.uuid, bytes: 600 << 20 }]),
            node_gpus: vec![g0, g1],
        }
    }

    /// `img` as format version 1 wrote it: the same payload up to the PCI sites, nothing after.
    fn encode_v1(img: &IdentityImage) -> Vec<u8> {
        let v2 = IdentityImage { prop_sites: Vec::new(), device_memory: None, ..img.clone() }.encode();
        // Version 2 appends a u32 count (0) and a u8 flag (0) to version 1's payload.
        let payload = &v2[HEADER_LEN..v2.len() - TRAILER_LEN - 5];
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&1u16.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        out.extend_from_slice(payload);
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    #[test]
    fn version_1_images_still_read_without_the_new_records() {
        let img = sample();
        let old = IdentityImage::decode(&encode_v1(&img)).unwrap();
        assert_eq!(old, IdentityImage { prop_sites: Vec::new(), device_memory: None, ..img });
    }

    #[test]
    fn round_trip_sample() {
        let img = sample();
        let bytes = img.try_encode().unwrap();
        assert_eq!(&bytes[..8], b"CCMIDIMG");
        assert_eq!(IdentityImage::decode(&bytes).unwrap(), img);
    }

    #[test]
    fn header_layout() {
        let bytes = sample().encode();
        assert_eq!(u16::from_le_bytes([bytes[8], bytes[9]]), 2);
        assert_eq!(u16::from_le_bytes([bytes[10], bytes[11]]), 0);
        let len = u32::from_le_bytes([bytes[12], bytes[13], bytes[14], bytes[15]]) as usize;
        assert_eq!(bytes.len(), HEADER_LEN + len + TRAILER_LEN);
        // The payload starts with pid and host_pid, little-endian.
        assert_eq!(u32::from_le_bytes([bytes[16], bytes[17], bytes[18], bytes[19]]), 42);
        assert_eq!(u32::from_le_bytes([bytes[20], bytes[21], bytes[22], bytes[23]]), 4242);
    }

    /// Rewrites the header's checksum so a test can reach the checks behind it.
    fn reseal(bytes: &mut [u8]) {
        let body = bytes.len() - TRAILER_LEN;
        let crc = crc32fast::hash(&bytes[..body]);
        bytes[body..].copy_from_slice(&crc.to_le_bytes());
    }

    #[test]
    fn specific_errors() {
        let good = sample().encode();
        assert!(matches!(IdentityImage::decode(&good[..10]), Err(ImageError::TooShort { .. })));

        let mut bad = good.clone();
        bad[0] = b'X';
        assert!(matches!(IdentityImage::decode(&bad), Err(ImageError::BadMagic { .. })));

        let mut newer = good.clone();
        newer[8] = 3;
        let err = IdentityImage::decode(&newer).unwrap_err();
        assert_eq!(err, ImageError::NewerVersion { found: 3, supported: 2 });
        assert!(err.to_string().contains("upgrade"));

        let mut zero = good.clone();
        zero[8] = 0;
        assert!(matches!(IdentityImage::decode(&zero), Err(ImageError::UnsupportedVersion { .. })));

        let mut flipped = good.clone();
        let mid = flipped.len() / 2;
        flipped[mid] ^= 0x40;
        assert!(matches!(IdentityImage::decode(&flipped), Err(ImageError::ChecksumMismatch { .. })));

        assert!(matches!(IdentityImage::decode(&good[..good.len() - 1]), Err(ImageError::Truncated { .. })));
        let mut longer = good.clone();
        longer.push(0);
        assert!(matches!(IdentityImage::decode(&longer), Err(ImageError::TrailingBytes { .. })));

        let mut huge_len = good.clone();
        huge_len[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(IdentityImage::decode(&huge_len), Err(ImageError::LengthOutOfBounds { .. })));
    }

    #[test]
    fn inner_errors_behind_a_valid_checksum() {
        let img = sample();
        // hostname length field sits at payload offset 16 (pid, host_pid, dumped_at).
        let hostname_len_at = HEADER_LEN + 16;
        let mut bytes = img.encode();
        bytes[hostname_len_at..hostname_len_at + 4].copy_from_slice(&5000u32.to_le_bytes());
        reseal(&mut bytes);
        assert!(matches!(IdentityImage::decode(&bytes), Err(ImageError::LengthOutOfBounds { field: "hostname", .. })));

        let mut bytes = img.encode();
        bytes[hostname_len_at + 4] = 0xff; // first byte of "gpu-node-a"
        reseal(&mut bytes);
        assert!(matches!(IdentityImage::decode(&bytes), Err(ImageError::InvalidUtf8 { field: "hostname" })));

        // A count that claims more elements than bytes remain is refused before allocating.
        let mut bytes = img.encode();
        let node_count_at = HEADER_LEN + 16 + 4 + img.hostname.len() + 4 + img.driver_version.len() + 4;
        bytes[node_count_at..node_count_at + 4].copy_from_slice(&64u32.to_le_bytes());
        reseal(&mut bytes);
        assert!(matches!(IdentityImage::decode(&bytes), Err(ImageError::Truncated { .. })));

        // Payload with extra bytes after the last site, sealed correctly.
        let mut bytes = img.encode();
        let body = bytes.len() - TRAILER_LEN;
        bytes.insert(body, 0);
        let len = (body + 1 - HEADER_LEN) as u32;
        bytes[12..16].copy_from_slice(&len.to_le_bytes());
        reseal(&mut bytes);
        assert!(matches!(IdentityImage::decode(&bytes), Err(ImageError::TrailingBytes { .. })));
    }

    #[test]
    fn bounds_are_checked_at_encode() {
        let mut img = sample();
        img.hostname = "x".repeat(MAX_STRING_BYTES + 1);
        assert!(matches!(img.try_encode(), Err(ImageError::LengthOutOfBounds { field: "hostname", .. })));
        assert!(IdentityImage::decode(&img.encode()).is_err());
    }

    #[test]
    fn file_names() {
        assert_eq!(IdentityImage::file_name(1234), "cuda-migrate-1234.img");
        assert_eq!(is_image_file_name("cuda-migrate-1234.img"), Some(1234));
        assert_eq!(is_image_file_name(&IdentityImage::file_name(u32::MAX)), Some(u32::MAX));
        for bad in [
            "cuda-migrate-.img",
            "cuda-migrate-+5.img",
            "cuda-migrate-007.img",
            "cuda-migrate-12a.img",
            "cuda-migrate-restore-12.txt",
            "cuda-migrate-99999999999.img",
            "pages-1.img",
        ] {
            assert_eq!(is_image_file_name(bad), None, "{bad}");
        }
        assert_eq!(is_report_file_name(&report_file_name(12)), Some(12));
        assert_eq!(is_report_file_name("cuda-migrate-12.img"), None);
        assert_eq!(is_report_file_name("cuda-migrate-restore-012.txt"), None);
        let img = sample();
        assert_eq!(img.gpu(&uuid(1)).map(|g| g.pci.device), Some(7));
        assert!(img.gpu(&uuid(9)).is_none());
    }

    fn arb_uuid() -> impl Strategy<Value = GpuUuid> {
        any::<[u8; 16]>().prop_map(GpuUuid)
    }

    fn arb_gpu() -> impl Strategy<Value = GpuIdentity> {
        (arb_uuid(), any::<[u32; 4]>(), any::<[u32; 3]>(), "[^\\p{Cc}]{0,20}", any::<u64>()).prop_map(
            |(uuid, p, ids, name, memory_total)| GpuIdentity {
                uuid,
                pci: PciAddress { domain: p[0], bus: p[1], device: p[2], function: p[3] },
                pci_device_id: ids[0],
                pci_subsystem_id: ids[1],
                minor: ids[2],
                name,
                memory_total,
            },
        )
    }

    fn arb_site() -> impl Strategy<Value = PciSite> {
        (arb_uuid(), any::<[u64; 3]>(), "[\\[\\]a-z/._ -]{0,30}", any::<[u32; 6]>()).prop_map(
            |(gpu, a, mapping_name, w)| PciSite {
                gpu,
                addr: a[0],
                mapping_start: a[1],
                mapping_end: a[2],
                mapping_name,
                words: PciSignature::from(w),
            },
        )
    }

    fn arb_prop_site() -> impl Strategy<Value = PropSite> {
        (arb_uuid(), any::<[u64; 3]>(), any::<u16>(), "[\\[\\]a-z/._ -]{0,30}").prop_map(
            |(gpu, a, runtime_major, mapping_name)| PropSite {
                gpu,
                addr: a[0],
                runtime_major,
                mapping_start: a[1],
                mapping_end: a[2],
                mapping_name,
            },
        )
    }

    fn arb_memory() -> impl Strategy<Value = Option<Vec<DeviceMemoryUse>>> {
        proptest::option::of(prop::collection::vec(
            (arb_uuid(), any::<u64>()).prop_map(|(gpu, bytes)| DeviceMemoryUse { gpu, bytes }),
            0..4,
        ))
    }

    pub(crate) fn arb_image() -> impl Strategy<Value = IdentityImage> {
        (
            (any::<u32>(), any::<u32>(), any::<u64>(), "[^\\p{Cc}]{0,30}", "[0-9.]{0,12}", any::<i32>()),
            prop::collection::vec(arb_gpu(), 0..6),
            prop::collection::vec(arb_uuid(), 0..6),
            prop::collection::vec(arb_uuid(), 0..6),
            (
                proptest::option::of("[^\\p{Cc}]{0,40}"),
                proptest::option::of("[^\\p{Cc}]{0,12}"),
                proptest::option::of("[^\\p{Cc}]{0,40}"),
            ),
            prop::collection::vec(arb_site(), 0..10),
            (prop::collection::vec(arb_prop_site(), 0..4), arb_memory()),
        )
            .prop_map(|(head, node_gpus, enumerated, used, env, sites, (prop_sites, device_memory))| {
                IdentityImage {
                    pid: head.0,
                    host_pid: head.1,
                    dumped_at_unix: head.2,
                    hostname: head.3,
                    driver_version: head.4,
                    cuda_driver_version: head.5,
                    node_gpus,
                    enumerated,
                    used,
                    env: ProcessEnv {
                        cuda_visible_devices: env.0,
                        cuda_device_order: env.1,
                        nvidia_visible_devices: env.2,
                    },
                    sites,
                    prop_sites,
                    device_memory,
                }
            })
    }

    proptest! {
        #[test]
        fn prop_round_trip(img in arb_image()) {
            let bytes = img.try_encode().unwrap();
            prop_assert_eq!(IdentityImage::decode(&bytes).unwrap(), img);
        }

        #[test]
        fn prop_random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
            let _ = IdentityImage::decode(&bytes);
        }

        #[test]
        fn prop_random_payload_behind_valid_header_never_panics(
            payload in prop::collection::vec(any::<u8>(), 0..512)
        ) {
            // Random payloads with a correct header and checksum reach the field parser.
            let mut bytes = MAGIC.to_vec();
            bytes.extend_from_slice(&1u16.to_le_bytes());
            bytes.extend_from_slice(&0u16.to_le_bytes());
            bytes.extend_from_slice(&(payload.len() as u32).to_le_bytes());
            bytes.extend_from_slice(&payload);
            let crc = crc32fast::hash(&bytes);
            bytes.extend_from_slice(&crc.to_le_bytes());
            let _ = IdentityImage::decode(&bytes);
        }

        #[test]
        fn prop_every_truncation_fails(img in arb_image()) {
            let bytes = img.encode();
            for len in 0..bytes.len() {
                prop_assert!(IdentityImage::decode(&bytes[..len]).is_err(), "length {}", len);
            }
        }

        #[test]
        fn prop_single_byte_corruption_fails(img in arb_image(), at in any::<prop::sample::Index>(), xor in 1u8..=255) {
            let mut bytes = img.encode();
            let i = at.index(bytes.len());
            bytes[i] ^= xor;
            prop_assert!(IdentityImage::decode(&bytes).is_err(), "byte {} ^ {:#x}", i, xor);
        }
    }
}
