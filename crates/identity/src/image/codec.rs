//! The identity image's byte layout (`docs/IMAGE-FORMAT.md`): a fixed header, a payload and a
//! CRC32 trailer, little-endian. Decoding treats the file as untrusted input: every count and
//! length is bounded and checked against the bytes that remain before anything is allocated, and
//! no input makes it panic.

use super::records::{DeviceMemoryUse, IdentityImage, PciSite, ProcessEnv, PropSite};
use crate::gpu::{GpuIdentity, GpuUuid, PciAddress, PciSignature};
use crate::staging::{DriverRegion, DriverStorage, StagedChunk, StagingRegion, StagingTable, MAX_CHUNKS, MAX_REGIONS};

/// First 8 bytes of every identity image.
pub const MAGIC: [u8; 8] = *b"CCMIDIMG";
/// The format version this code writes, and the newest it reads. Version 2 added the runtime's
/// `cudaDeviceProp` copies and the device memory per GPU; version-1 images read with neither.
/// Version 3 added the staging table (issue 47); an image without one is still written as version 2, which
/// older builds read. Version 4 added the driver storage table (the device memory copied out by the driver agent
/// through the driver's custom storage, CUDA 13.4): the staging table becomes optional (a presence byte before it)
/// and the driver storage table follows, also optional; an image without a driver storage table is still written
/// as version 3 (or 2).
pub const FORMAT_VERSION: u16 = 4;
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
    #[error(
        "identity image's staging table is not usable: {0}; the image is corrupted or forged: re-dump the process"
    )]
    Staging(crate::staging::StagingError),
}

impl IdentityImage {
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
        if let Some(t) = &self.staging {
            t.check().map_err(ImageError::Staging)?;
        }
        if let Some(d) = &self.driver_storage {
            count("driver_storage.regions", d.regions.len(), MAX_GPUS)?;
            d.check().map_err(ImageError::Staging)?;
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
        let version: u16 = match (&self.staging, &self.driver_storage) {
            (_, Some(d)) => {
                match &self.staging {
                    None => p.u8(0),
                    Some(t) => {
                        p.u8(1);
                        p.staging(t);
                    }
                }
                p.u8(1);
                p.count(d.regions.len());
                for r in &d.regions {
                    p.uuid(&r.gpu);
                    p.u64(r.size);
                }
                p.staging(&d.table);
                4
            }
            (Some(t), None) => {
                p.staging(t);
                3
            }
            (None, None) => 2,
        };
        let payload = p.0;

        let mut out = Vec::with_capacity(HEADER_LEN + payload.len() + TRAILER_LEN);
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&version.to_le_bytes());
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
        let (staging, driver_storage) = match version {
            ..=2 => (None, None),
            3 => (Some(r.staging()?), None),
            _ => {
                let staging = match r.u8()? {
                    0 => None,
                    1 => Some(r.staging()?),
                    other => return Err(ImageError::InvalidValue { field: "staging", value: u64::from(other) }),
                };
                let driver = match r.u8()? {
                    0 => None,
                    1 => Some(r.driver_storage()?),
                    other => return Err(ImageError::InvalidValue { field: "driver_storage", value: u64::from(other) }),
                };
                (staging, driver)
            }
        };
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
            staging,
            driver_storage,
        })
    }
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
    fn staging(&mut self, t: &StagingTable) {
        self.u64(t.chunk_bytes);
        self.u64(t.file_bytes);
        self.count(t.regions.len());
        for r in &t.regions {
            self.u64(r.start);
            self.u64(r.len);
            self.count(r.chunks.len());
            for c in &r.chunks {
                match c {
                    StagedChunk::Hole => self.u8(0),
                    StagedChunk::Data { offset, crc } => {
                        self.u8(1);
                        self.u64(*offset);
                        self.u32(*crc);
                    }
                }
            }
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

    /// The staging table, checked by its own rules ([`StagingTable::check`]) before the image is accepted.
    fn staging(&mut self) -> Result<StagingTable, ImageError> {
        let chunk_bytes = self.u64()?;
        let file_bytes = self.u64()?;
        let n = self.count("staging.regions", MAX_REGIONS, 8 + 8 + 4)?;
        let mut regions = Vec::with_capacity(n);
        for _ in 0..n {
            let start = self.u64()?;
            let len = self.u64()?;
            let k = self.count("staging.chunks", MAX_CHUNKS, 1)?;
            let mut chunks = Vec::with_capacity(k);
            for _ in 0..k {
                chunks.push(match self.u8()? {
                    0 => StagedChunk::Hole,
                    1 => StagedChunk::Data { offset: self.u64()?, crc: self.u32()? },
                    other => return Err(ImageError::InvalidValue { field: "staging.chunk", value: u64::from(other) }),
                });
            }
            regions.push(StagingRegion { start, len, chunks });
        }
        let t = StagingTable { chunk_bytes, file_bytes, regions };
        t.check().map_err(ImageError::Staging)?;
        Ok(t)
    }

    /// The driver storage table, checked by its own rules ([`DriverStorage::check`]) before the image is accepted.
    fn driver_storage(&mut self) -> Result<DriverStorage, ImageError> {
        let n = self.count("driver_storage.regions", MAX_GPUS, UUID_BYTES + 8)?;
        let mut regions = Vec::with_capacity(n);
        for _ in 0..n {
            regions.push(DriverRegion { gpu: self.uuid()?, size: self.u64()? });
        }
        let d = DriverStorage { regions, table: self.staging()? };
        d.check().map_err(ImageError::Staging)?;
        Ok(d)
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
