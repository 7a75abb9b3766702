//! Reading CRIU checkpoint archives without unpacking them.
//!
//! `criu-cuda-migrate inspect` and `preflight` need a few small files of a checkpoint: the identity
//! images `checkpoint/cuda-migrate-<pid>.img`, the restore reports
//! `checkpoint/cuda-migrate-restore-<pid>.txt`, the container's OCI spec `spec.dump`, and whether
//! CRIU's `checkpoint/inventory.img` is there. Container engines hand checkpoints around as archives;
//! [`read_archive`] streams one and returns those files ([`CheckpointArchive`]), holding nothing else
//! in memory and writing nothing to disk.
//!
//! # Formats
//!
//! - **Podman**, `podman container checkpoint --export=FILE [--compress gzip|zstd|none]`: a tar,
//!   plain or compressed, with `checkpoint/` (CRIU's image directory: `inventory.img`, `core-*.img`,
//!   `pages-*.img` of up to the process's whole memory, ..., and this project's images), beside
//!   `config.dump`, `spec.dump`, `network.status`, `stats-dump`, `rootfs-diff.tar` and more.
//! - **The kubelet** through containerd's CRI (`checkpoint-<pod>_<ns>-<ctr>-<time>.tar`): a plain
//!   tar with `checkpoint/`, `config.dump`, `spec.dump`, `status`, ...; member names may start with
//!   `./`.
//!
//! The compression is told by the first bytes, not the file name: gzip `1f 8b`, zstd `28 b5 2f fd`
//! (or a zstd skippable frame), anything else is read as a plain tar. The tar may be ustar, GNU or
//! PAX (Go's archive/tar, which Podman and containerd use, writes PAX records for long names and for
//! members of 8 GiB and more).
//!
//! # Rules, and why
//!
//! The archive is untrusted input, and this tool often runs as root. So:
//!
//! - **Only a regular file is opened.** A FIFO would block the open, a device may act on it, a
//!   directory is not an archive ([`ArchiveError::NotRegularFile`]). A symbolic link in the path is
//!   followed: the user typed the path. The open uses `O_NONBLOCK` and is checked again with `fstat`.
//! - **Streamed, never unpacked.** Members we do not keep are stepped over: seeked over in a plain
//!   file, read through and dropped in a compressed one. Memory holds the kept members, one skip
//!   buffer, and the decoder's window (zstd windows are capped at 128 MiB).
//! - **Member paths** must be relative, free of `..` components and shorter than [`PATH_MAX`], for
//!   every member, even one that is skipped ([`ArchiveError::UnsafePath`]): such an archive is
//!   hostile or broken, and whoever restores it with another tool would write outside its directory.
//!   A link's target is held to the same rules ([`ArchiveError::UnsafeLinkTarget`]). Names are
//!   compared after dropping `.` and empty components, so `./checkpoint/x` and `checkpoint//x` are
//!   `checkpoint/x`.
//! - **No member goes through a link.** A member whose path is, or runs through, a link an earlier
//!   member made (`x -> checkpoint`, then `x/cuda-migrate-1.img`) is refused
//!   ([`ArchiveError::ThroughLink`]): an extractor writes it where the link points, under a name
//!   this reader would not recognize.
//! - **The members we read must be unique regular files.** A link, directory or device under the name
//!   of an identity image, restore report, `spec.dump` or `inventory.img` is refused
//!   ([`ArchiveError::NotRegularMember`]), so the report cannot describe another file than the one a
//!   restore reads; two members of one name ([`ArchiveError::Duplicate`]) likewise. Links under other
//!   names are skipped: nothing here follows or creates them.
//! - **Sizes are capped before reading.** An identity image may be
//!   [`ccm_identity::image::MAX_IMAGE_BYTES`], a restore report [`MAX_REPORT_BYTES`], `spec.dump`
//!   [`MAX_SPEC_BYTES`], a PAX header [`MAX_EXTENSION_BYTES`], a GNU long name [`PATH_MAX`]; a larger
//!   one is refused from its header ([`ArchiveError::MemberTooLarge`]); at most [`MAX_IMAGES`]
//!   identity images are read ([`ArchiveError::TooManyImages`]). [`Limits`] caps the number of members, the
//!   kept bytes together and the tar bytes scanned, so a gzip or zstd bomb ends at the limit in
//!   bounded time and memory ([`ArchiveError::ScanLimit`]); the message says how to get past a limit
//!   that is too small for a real checkpoint (raise it, or unpack the archive and point the tool at
//!   its `checkpoint/` directory).
//! - **A cut archive is an error, never a short answer** ([`ArchiveError::Truncated`]): a member whose
//!   data ends before its header says, a header cut short, a compressed stream that ends early, and
//!   an archive without tar's end-of-archive block (every writer writes one; without it, the cut may
//!   have fallen between two members and dropped an identity image silently).
//! - **Readers must not disagree.** Where Go's archive/tar (the reader of Podman and containerd) and
//!   other readers would walk the stream differently (a malformed PAX record, a link or directory
//!   with data, two long names for one member), the archive is refused
//!   ([`ArchiveError::CorruptHeader`]); where GNU tar, Python's `tarfile` and Go would name a member
//!   differently from this reader (a PAX `GNU.sparse.*` record, a `ustar\0` header of a version
//!   other than `00`, a star trailer, bytes in a GNU header where ustar's prefix would be, a tar type
//!   outside POSIX's and GNU's long-name and sparse ones, a PAX global header with `path`, `linkpath`
//!   or `size`, a GNU long name that differs from the PAX path), too ([`ArchiveError::Ambiguous`]):
//!   what `inspect` shows must be what a restore gets. The tests hold [`member_names`] against GNU
//!   tar's and Python's listings.
//! - **Messages** name the archive, the member and the rule, never a member's contents, with control
//!   characters of names escaped.
//!
//! The identity images are handed back as bytes: decoding them is `ccm_identity`'s job.

#![forbid(unsafe_code)]

mod archive;
mod error;
mod image_rule;
mod input;
mod json;
mod name;
pub mod oci;
mod pax;
pub mod sha256;
mod walk;

use std::io::Read;
use std::path::Path;

pub use archive::{
    ArchiveFile, CheckpointArchive, Compression, Limits, DEFAULT_MAX_KEPT_BYTES, DEFAULT_MAX_MEMBERS,
    DEFAULT_MAX_SCANNED_BYTES, MAX_EXTENSION_BYTES, MAX_IMAGES, MAX_REPORT_BYTES, MAX_SPEC_BYTES,
};
pub use ccm_identity::image::MAX_IMAGE_BYTES;
pub use error::{ArchiveError, Truncation};
pub use image_rule::ImageRule;
pub use name::{PathRule, PATH_MAX};
pub use oci::{is_image_layout, read_image_layout, CheckpointImage, ImageFormat};

/// What a checkpoint file holds: a checkpoint archive, or a checkpoint image as an `oci-archive`.
// One value per command, moved once: the image's larger size costs nothing a box would save.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckpointFile {
    Archive(CheckpointArchive),
    Image(CheckpointImage),
}

/// Reads the file at `path`: a checkpoint archive (as [`read_archive`]) or an `oci-archive` of a
/// checkpoint image (a plain tar holding `oci-layout`, `index.json` and `blobs/`; see [`oci`]),
/// told apart by what the tar holds, in one walk of it and one more of the image's layer.
pub fn read_checkpoint_file(path: &Path, limits: &Limits) -> Result<CheckpointFile, ArchiveError> {
    let (file, len) = input::open(path)?;
    let blobs = file.try_clone().map_err(|source| ArchiveError::Open { archive: input::shown_path(path), source })?;
    let (input, compression) = input::from_file(path, file, len)?;
    let found = walk::Walk::new(input, compression, input::shown_path(path), limits).run()?;
    if found.oci_layout.is_some() || found.oci_index.is_some() {
        return oci::read_oci_archive(path, &blobs, compression, found, limits).map(CheckpointFile::Image);
    }
    walk::finish(path, compression, found).map(CheckpointFile::Archive)
}

/// Reads the checkpoint archive at `path`. See the crate documentation for the formats and rules.
pub fn read_archive(path: &Path, limits: &Limits) -> Result<CheckpointArchive, ArchiveError> {
    let (file, len) = input::open(path)?;
    let (input, compression) = input::from_file(path, file, len)?;
    walk::finish(path, compression, walk::Walk::new(input, compression, input::shown_path(path), limits).run()?)
}

/// Reads a checkpoint archive from any reader (a pipe, a buffer, a fuzzer's bytes), by the same rules
/// as [`read_archive`]; `path` only names it in the result and in messages. Data is read through,
/// never seeked, so skipping a large plain member costs reading it.
pub fn read_archive_from(reader: impl Read, path: &Path, limits: &Limits) -> Result<CheckpointArchive, ArchiveError> {
    let (input, compression) = input::from_reader(path, reader)?;
    walk::finish(path, compression, walk::Walk::new(input, compression, input::shown_path(path), limits).run()?)
}

/// The name of every member of the archive at `path`, in order, as this reader resolves it (GNU long
/// name, PAX path, ustar prefix), after the same rules as [`read_archive`] (a tar that holds no
/// `checkpoint/` is listed too). Extension headers and PAX global headers are no members. This is what
/// the tests hold against GNU tar's and Python's listings: a name this reader sees must be the name
/// every mainstream reader sees. Names count toward [`Limits::max_kept_bytes`].
pub fn member_names(path: &Path, limits: &Limits) -> Result<Vec<Vec<u8>>, ArchiveError> {
    let (file, len) = input::open(path)?;
    let (input, compression) = input::from_file(path, file, len)?;
    walk::Walk::new(input, compression, input::shown_path(path), limits).names()
}
