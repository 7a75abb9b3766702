//! Every refusal of [`crate::read_archive`], one variant per rule.
//!
//! Each message names the archive, the member (where there is one) and the rule, so that a user can
//! tell a damaged archive from a hostile one from a limit that is too small. No message quotes a
//! member's contents; member names and the archive's path are printed with control characters
//! escaped (a name is attacker-chosen and could otherwise rewrite the user's terminal).

use std::fmt;
use std::io;

use crate::archive::Compression;
use crate::name::PathRule;

/// Why an archive was not read. `archive` and `member` fields are already escaped for printing.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    /// The archive file could not be looked up, opened or examined.
    #[error("cannot open checkpoint archive `{archive}`: {source}")]
    Open {
        archive: String,
        #[source]
        source: io::Error,
    },

    /// The path names a directory, FIFO, device or socket. It is not opened (a FIFO would block, a
    /// device may act on open); a checkpoint directory is handled by the caller, not here.
    #[error("`{archive}` is {kind}, not a regular file: a checkpoint archive must be a regular file")]
    NotRegularFile { archive: String, kind: &'static str },

    /// Reading the (uncompressed) archive failed.
    #[error("reading checkpoint archive `{archive}` at tar offset {offset}: {source}")]
    Read {
        archive: String,
        offset: u64,
        #[source]
        source: io::Error,
    },

    /// The gzip or zstd stream is corrupt (or needs more memory than we allow, for zstd).
    #[error("`{archive}`: the {compression} stream is corrupt near tar offset {offset}: {source}")]
    Decompress {
        archive: String,
        compression: Compression,
        offset: u64,
        #[source]
        source: io::Error,
    },

    /// The data does not start with a tar header.
    #[error("`{archive}` is not a tar archive (plain, gzip or zstd): {why}")]
    NotTar { archive: String, why: &'static str },

    /// A tar header (or extension header) is malformed.
    #[error("`{archive}`: corrupt tar header at offset {offset}: {reason}")]
    CorruptHeader { archive: String, offset: u64, reason: String },

    /// The archive ends before its own headers say it does.
    #[error("`{archive}`: truncated archive: {what}")]
    Truncated { archive: String, what: Truncation },

    /// A member's path climbs out of the archive, is absolute or is too long.
    #[error("`{archive}`: member `{member}` is refused: {rule}")]
    UnsafePath { archive: String, member: String, rule: PathRule },

    /// A link's target climbs out of the archive, is absolute or is too long.
    #[error(
        "`{archive}`: member `{member}` is a link to `{target}`, which is refused: {rule}; a checkpoint archive's \
         links stay inside it"
    )]
    UnsafeLinkTarget { archive: String, member: String, target: String, rule: PathRule },

    /// A member (or a hard link's target) whose path is, or runs through, a link an earlier member
    /// made: an extractor would write through that link (`x -> checkpoint`, then
    /// `x/cuda-migrate-1.img`), so what it unpacks is not what this reader names.
    #[error(
        "`{archive}`: member `{member}` is refused: `{path}` is or runs through `{link}`, which an earlier \
         member made {kind}, so tar would write it through that link; a checkpoint archive never does this: \
         re-export the checkpoint"
    )]
    ThroughLink { archive: String, member: String, path: String, link: String, kind: &'static str },

    /// A header that tar readers would name or lay out differently (a ustar version other than
    /// `00`, a star trailer, a PAX `GNU.sparse.*` record, an unknown type, ...): what `inspect`
    /// shows would not be what a restore unpacks.
    #[error(
        "`{archive}`: the tar header at offset {offset} is read differently by different tar readers \
         (GNU tar, Python, Go's archive/tar): {reason}; refused, since what this tool reads must be what a \
         restore unpacks: re-export the checkpoint with podman or the kubelet"
    )]
    Ambiguous { archive: String, offset: u64, reason: &'static str },

    /// A member named like one this crate reads (identity image, restore report, `spec.dump`,
    /// `inventory.img`, an OCI layout's `oci-layout`, `index.json` and blobs) is a link, directory or
    /// special file.
    #[error(
        "`{archive}`: member `{member}` is {kind}, but a member of this name must be a regular file \
         (links, directories and special files under the names this tool reads are refused: an extractor would \
         put them where the file is); no checkpoint or image writer makes one: export the checkpoint again, or \
         copy the image again with skopeo"
    )]
    NotRegularMember { archive: String, member: String, kind: &'static str },

    /// A member whose name has a component starting `.wh.`: an OCI whiteout, which containerd's unpack
    /// (`archive.Apply`, for an image's layer and for a checkpoint archive alike) does not write but takes
    /// as an order to delete the file it names, so what a restore finds is not what this reader read.
    #[error(
        "`{archive}`: member `{member}` is an OCI whiteout (a name starting `.wh.`): containerd's unpack does not \
         write it but deletes the file it names (`.wh..wh..opq` empties its directory), so a restore would not find \
         what this tool reads; no checkpoint writer makes one: export the checkpoint again, and build the image \
         from that archive"
    )]
    Whiteout { archive: String, member: String },

    /// A member this crate would keep in memory is larger than its cap; refused from its header.
    #[error("`{archive}`: member `{member}` is {}; {what} may be {} at most (refused without reading it)",
        Bytes(*.size), Bytes(*.max))]
    MemberTooLarge { archive: String, member: String, what: &'static str, size: u64, max: u64 },

    /// A member replaces an earlier member of another kind at the same path (a link where a directory was, a
    /// file where a link was), as an extractor applies it.
    #[error(
        "`{archive}`: member `{member}` is {kind} where an earlier member (`{earlier}`) made {earlier_kind}: \
         containerd's and containers/storage's unpack replace the one by the other, so what a restore reads is not \
         what this tool checked; refused (a checkpoint archive holds each path once, as one kind)"
    )]
    Replaces { archive: String, member: String, kind: &'static str, earlier: String, earlier_kind: &'static str },

    /// Two members name the same file (also `checkpoint/x` and `./checkpoint/x`).
    #[error(
        "`{archive}`: member `{member}` appears twice (first as `{first}`): a checkpoint archive holds \
         each file once, and which copy a restore would use is unclear"
    )]
    Duplicate { archive: String, member: String, first: String },

    /// More members than [`crate::Limits::max_members`].
    #[error(
        "`{archive}` has more than {max} members, the member limit: a CRIU checkpoint holds far fewer; \
         raise the member limit, or unpack the archive and point the tool at its checkpoint/ directory"
    )]
    TooManyMembers { archive: String, max: u64 },

    /// More tar data than [`crate::Limits::max_scanned_bytes`] (a decompression bomb, or a very large
    /// checkpoint).
    #[error(
        "`{archive}`: stopped at the scan limit of {} of tar data (after decompression): raise the scan \
         limit, or unpack the archive and point the tool at its checkpoint/ directory",
        Bytes(*.max)
    )]
    ScanLimit { archive: String, max: u64 },

    /// The members kept in memory together exceed [`crate::Limits::max_kept_bytes`].
    #[error(
        "`{archive}`: the identity images, restore reports and spec in it exceed {} together, the \
         limit of what is held in memory: raise that limit, or unpack the archive and point the tool at \
         its checkpoint/ directory",
        Bytes(*.max)
    )]
    KeptLimit { archive: String, max: u64 },

    /// More identity images than [`crate::MAX_IMAGES`].
    #[error(
        "`{archive}` holds more than {max} identity images (checkpoint/cuda-migrate-*.img), more than this tool \
         reads: a checkpoint holds one per CUDA process; remove the images that are not this dump's"
    )]
    TooManyImages { archive: String, max: usize },

    /// An OCI image (a layout directory or an `oci-archive`) that breaks one of the image rules
    /// ([`crate::ImageRule`], read by [`crate::oci`]): its layer, once found, is read by every rule above and fails
    /// with those.
    #[error("checkpoint image `{image}`: {rule}")]
    Image { image: String, rule: crate::image_rule::ImageRule },

    /// A well-formed tar that holds no `checkpoint/` directory.
    #[error(
        "`{archive}` is a tar archive but holds no `checkpoint/` directory: it is not a CRIU checkpoint \
         archive (Podman's `container checkpoint --export` or the kubelet's checkpoint-*.tar)"
    )]
    NotCheckpoint { archive: String },
}

/// Where an archive ends too early.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Truncation {
    /// Inside a member's data (or its padding to the next 512-byte block).
    InMember {
        member: String,
        /// The data size its header says.
        size: u64,
        /// The bytes of its record (data and padding) that are there.
        present: u64,
        /// The record's size: `size` rounded up to 512.
        record: u64,
    },
    /// Inside a 512-byte header.
    InHeader { offset: u64 },
    /// At a header boundary, without tar's end-of-archive block: every writer (Go's archive/tar of
    /// Podman and containerd, GNU tar, bsdtar) writes it, so its absence means the file was cut.
    NoEndMarker { offset: u64 },
    /// The gzip or zstd stream ends before its own framing says.
    CompressedStream { compression: Compression, offset: u64 },
}

impl fmt::Display for Truncation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Truncation::InMember { member, size, present, record } => write!(
                f,
                "it ends inside member `{member}`: its header says {}, a record of {} with padding, \
                 and only {} of it is there",
                Bytes(*size),
                Bytes(*record),
                Bytes(*present)
            ),
            Truncation::InHeader { offset } => write!(f, "it ends inside the tar header at offset {offset}"),
            Truncation::NoEndMarker { offset } => {
                write!(f, "it ends at offset {offset} without tar's end-of-archive block (cut between two members?)")
            }
            Truncation::CompressedStream { compression, offset } => {
                write!(f, "the {compression} stream ends early (after {offset} bytes of tar data)")
            }
        }
    }
}

/// A byte count for messages: exact, with a binary unit beside it from 1 MiB on.
pub(crate) struct Bytes(pub u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const MIB: u64 = 1 << 20;
        const GIB: u64 = 1 << 30;
        let n = self.0;
        if n >= GIB {
            write!(f, "{n} bytes ({:.1} GiB)", n as f64 / GIB as f64)
        } else if n >= MIB {
            write!(f, "{n} bytes ({:.1} MiB)", n as f64 / MIB as f64)
        } else {
            write!(f, "{n} bytes")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_counts_read_well() {
        assert_eq!(Bytes(512).to_string(), "512 bytes");
        assert_eq!(Bytes(17 << 20).to_string(), "17825792 bytes (17.0 MiB)");
        assert_eq!(Bytes(256 << 30).to_string(), "274877906944 bytes (256.0 GiB)");
    }
}
