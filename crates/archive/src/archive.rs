//! What a read of a checkpoint archive gives ([`CheckpointArchive`]: the members kept, [`ArchiveFile`], and how
//! the stream was stored, [`Compression`]) and the bounds it keeps to ([`Limits`] and the cap on each kind of
//! member kept). Plain types, below every module that reads: the tar walk fills them, the image reader and the
//! errors name them, and the crate's root re-exports them.

use std::fmt;
use std::path::PathBuf;

use ccm_identity::image::{is_image_file_name, is_report_file_name};

/// Upper bound of a restore report kept from an archive.
pub const MAX_REPORT_BYTES: u64 = 1024 * 1024;
/// Upper bound of `spec.dump` kept from an archive (an OCI spec is a few KiB to some 100 KiB).
pub const MAX_SPEC_BYTES: u64 = 4 * 1024 * 1024;
/// Upper bound of a GNU long-name/long-link or PAX extension header (Go's archive/tar's bound).
pub const MAX_EXTENSION_BYTES: u64 = 1024 * 1024;
/// Most identity images read from one archive (a checkpoint holds one per CUDA process); the
/// preflight's directory read has the same bound.
pub const MAX_IMAGES: usize = 4096;
/// Default of [`Limits::max_scanned_bytes`]: 256 GiB of tar data.
pub const DEFAULT_MAX_SCANNED_BYTES: u64 = 256 << 30;
/// Default of [`Limits::max_members`].
pub const DEFAULT_MAX_MEMBERS: u64 = 1_000_000;
/// Default of [`Limits::max_kept_bytes`]: 256 MiB, sixteen maximal identity images.
pub const DEFAULT_MAX_KEPT_BYTES: u64 = 256 << 20;

/// The bounds of one read. A hostile archive meets one of them; a real checkpoint too large for them
/// gets an error that says so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Tar bytes (after decompression) walked at most, skipped members included. Bounds the time a
    /// decompression bomb can take; a checkpoint's `pages-*.img` are about the process's memory.
    pub max_scanned_bytes: u64,
    /// Members at most (each one costs a header and a name check).
    pub max_members: u64,
    /// Bytes of identity images, restore reports and `spec.dump` held together at most, their names
    /// (and those of link members, which are remembered) counted in.
    pub max_kept_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_scanned_bytes: DEFAULT_MAX_SCANNED_BYTES,
            max_members: DEFAULT_MAX_MEMBERS,
            max_kept_bytes: DEFAULT_MAX_KEPT_BYTES,
        }
    }
}

/// How the tar stream is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Zstd,
}

impl fmt::Display for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Compression::None => "none",
            Compression::Gzip => "gzip",
            Compression::Zstd => "zstd",
        })
    }
}

/// A member kept from the archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchiveFile {
    /// Its name in the archive, as written there (`./checkpoint/cuda-migrate-7.img`).
    pub member: String,
    /// Its file name (`cuda-migrate-7.img`, `spec.dump`).
    pub name: String,
    /// Its contents, unparsed.
    pub bytes: Vec<u8>,
}

impl ArchiveFile {
    /// The pid in an identity image's or restore report's file name.
    pub fn pid(&self) -> Option<u32> {
        is_image_file_name(&self.name).or_else(|| is_report_file_name(&self.name))
    }
}

/// What a checkpoint archive holds, for `inspect` and `preflight`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointArchive {
    /// The archive as named by the caller.
    pub path: PathBuf,
    pub compression: Compression,
    /// Every `checkpoint/cuda-migrate-<pid>.img`, by pid.
    pub images: Vec<ArchiveFile>,
    /// Every `checkpoint/cuda-migrate-restore-<pid>.txt`, by pid.
    pub reports: Vec<ArchiveFile>,
    /// `spec.dump`, the container's OCI spec (JSON), where the archive has one.
    pub spec: Option<ArchiveFile>,
    /// `checkpoint/cuda-migrate-devices.img`: what the dump claimed of forked processes' NVIDIA nodes.
    pub claims: Option<ArchiveFile>,
    /// Every `checkpoint/cuda-migrate-pages-<pid>.img` (a process's staging pages): file name and size.
    pub page_files: Vec<(String, u64)>,
    /// Whether `checkpoint/inventory.img` is there (CRIU writes it last, so a dump that completed
    /// has it).
    pub has_inventory: bool,
    /// Members in the archive (extension headers not counted).
    pub members: usize,
    /// Bytes of the tar stream walked, after decompression: up to and including the end-of-archive
    /// block, skipped data included.
    pub bytes_scanned: u64,
    /// The dumping CRIU's version, from the `Version:` line of the archive's `dump.log` (its first
    /// 16 KiB are read), and that member's name; `None` where there is no such log or line.
    pub criu_version: Option<(String, String)>,
}
