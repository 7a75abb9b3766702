//! The rules a checkpoint image is held to on top of the archive's ([`crate::oci`] reads an image by them): the
//! bounds of its JSON and of its indexes, and [`ImageRule`], why an image was refused, with the fix in its text.
//! Here, below the reader, because the archive's error ([`crate::ArchiveError::Image`]) and the tar walk (which
//! keeps an `oci-archive`'s `oci-layout` and `index.json` within the same bound) name them too.

use std::fmt;

use crate::archive::Compression;

/// Largest `oci-layout`, `index.json`, nested index, manifest or config read.
pub const MAX_JSON_BYTES: u64 = 4 << 20;
/// Most image JSON read in all: `oci-layout`, `index.json`, every nested index, the manifest and the config
/// together (a checkpoint image's are a few KiB). Each blob is counted from its descriptor's size before it is
/// read, so 48 nested indexes of 3.8 MB each are refused after the second, not after 184 MB (1.64 GB resident).
pub const MAX_TOTAL_JSON_BYTES: u64 = 2 * MAX_JSON_BYTES;
/// Most levels of indexes, `index.json` counted.
pub const MAX_INDEX_DEPTH: usize = 4;
/// Most descriptors looked at in all the indexes together.
pub const MAX_DESCRIPTORS: usize = 256;

/// Why an image was refused (the layer's own refusals are the archive's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageRule {
    /// No usable `oci-layout`.
    NotLayout { why: String },
    /// A file or blob of the layout is a symbolic link.
    Link { path: String },
    /// `index.json`, `blobs/sha256/` or a blob is missing.
    Missing { what: String },
    /// A file of the layout could not be read (not a regular file, I/O).
    Unreadable { reason: String },
    /// Image JSON larger than [`MAX_JSON_BYTES`].
    TooLarge { what: String, size: u64 },
    /// Image JSON that is malformed or read differently by Go.
    Json { what: String, reason: String },
    /// A digest that is not `sha256:` and 64 lowercase hex digits.
    Digest { digest: String },
    /// A blob whose size differs from its descriptor's.
    SizeMismatch { digest: String, declared: u64, actual: u64 },
    /// A blob whose SHA-256 differs from its digest.
    DigestMismatch { digest: String, actual: String },
    /// An index reached twice.
    Loop { digest: String },
    /// Indexes nested deeper than [`MAX_INDEX_DEPTH`].
    TooDeep,
    /// More descriptors than [`MAX_DESCRIPTORS`].
    TooManyDescriptors,
    /// More blobs in an `oci-archive` than it may hold.
    TooManyBlobs { max: usize },
    /// A media type where another is needed.
    MediaType { what: String, media_type: String },
    /// A descriptor with embedded data or foreign URLs.
    Embedded { digest: String },
    /// Not exactly one image in the layout.
    Images { count: usize, refs: Vec<String> },
    /// Not exactly one layer.
    Layers { count: usize },
    /// A layer whose bytes are compressed otherwise than its media type says.
    Compression { media_type: String, found: Compression },
    /// A layer that holds no `checkpoint/`.
    NoCheckpoint,
    /// A compressed `oci-archive`.
    CompressedArchive { compression: Compression },
    /// A tar with both an OCI layout and a `checkpoint/`.
    Both,
    /// More image JSON in all than [`MAX_TOTAL_JSON_BYTES`].
    JsonTotal,
    /// A config without `rootfs.type` `layers` and one `rootfs.diff_ids` entry per layer.
    RootFs { config: String, reason: String },
    /// `rootfs.diff_ids` names other content than the layer's, uncompressed.
    DiffId { declared: String, actual: String },
    /// The layer's compressed stream goes on after its tar with data the decoder refuses.
    TrailingData { compression: Compression, reason: String },
    /// `index.json` reaches the image through entries whose annotations differ.
    Targets { targets: Vec<String> },
}

impl fmt::Display for ImageRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use ImageRule::*;
        const REBUILD: &str = "rebuild the image from the checkpoint archive (buildah, docs/USER-GUIDE.md 5.4) or \
                               inspect the archive itself";
        match self {
            NotLayout { why } => write!(
                f,
                "not an OCI image layout: {why}; pass an OCI layout directory (`oci:DIR`), an oci-archive \
                 (`oci-archive:FILE`), a checkpoint archive or CRIU's image directory"
            ),
            Link { path } => write!(
                f,
                "{path} is a symbolic link; criu-cuda-migrate runs as root and follows no link inside an image: \
                 copy the image with `skopeo copy` to get real files"
            ),
            Missing { what } => write!(f, "{what} is missing: the image is incomplete; copy it again"),
            Unreadable { reason } => write!(f, "{reason}"),
            TooLarge { what, size } => write!(
                f,
                "{what} is {size} bytes, more than the {MAX_JSON_BYTES} bytes an image's JSON may be (refused \
                 without reading it): this is no checkpoint image"
            ),
            Json { what, reason } => write!(f, "{what} is refused: {reason}; {REBUILD}"),
            Digest { digest } => write!(
                f,
                "the digest `{digest}` is refused: only `sha256:` with 64 lowercase hex digits names a blob here \
                 (other algorithms are not read; anything else could name a path)"
            ),
            SizeMismatch { digest, declared, actual } => write!(
                f,
                "blob {digest} is {actual} bytes, and its descriptor says {declared}: the image is damaged or was \
                 altered; copy it again"
            ),
            DigestMismatch { digest, actual } => write!(
                f,
                "blob {digest} has the SHA-256 {actual}, not the one its name says: the image is damaged or was \
                 altered; copy it again"
            ),
            Loop { digest } => write!(f, "the index {digest} is reached twice (a loop or a repeat); {REBUILD}"),
            TooDeep => write!(f, "indexes are nested more than {MAX_INDEX_DEPTH} deep; {REBUILD}"),
            TooManyDescriptors => {
                write!(f, "its indexes hold more than {MAX_DESCRIPTORS} descriptors; this is no checkpoint image")
            }
            TooManyBlobs { max } => write!(f, "it holds more than {max} blobs; this is no checkpoint image"),
            MediaType { what, media_type } => write!(f, "{what} has the media type `{media_type}`; {REBUILD}"),
            Embedded { digest } => write!(
                f,
                "the descriptor of {digest} carries embedded data or foreign URLs, which a runtime may read instead \
                 of the blob; {REBUILD}"
            ),
            Images { count: 0, .. } => write!(f, "its index names no image manifest"),
            Images { refs, .. } => write!(
                f,
                "it holds more than one image ({}), and a checkpoint image is one: copy the one out with `skopeo \
                 copy oci:DIR:REF oci-archive:FILE`",
                if refs.is_empty() { "untagged".to_string() } else { refs.join(", ") }
            ),
            Layers { count } => write!(
                f,
                "its manifest has {count} layers, and a checkpoint image has one (what `buildah add` of the \
                 checkpoint archive makes): with several, a runtime unpacks their overlay, not what one of them holds; \
                 {REBUILD}"
            ),
            Compression { media_type, found } => write!(
                f,
                "its layer's media type is `{media_type}` but its bytes are {}; {REBUILD}",
                match found {
                    crate::archive::Compression::None => "not compressed".to_string(),
                    c => format!("{c}-compressed"),
                }
            ),
            NoCheckpoint => write!(
                f,
                "its layer holds no checkpoint/ directory: it is no checkpoint image (build one with `buildah add CTR \
                 CHECKPOINT.tar /` from the checkpoint archive)"
            ),
            CompressedArchive { compression } => write!(
                f,
                "it is a {compression}-compressed tar of an OCI layout, and an oci-archive is read as the plain tar \
                 skopeo and buildah write: decompress it first"
            ),
            Both => write!(f, "it holds both an OCI image layout and a checkpoint/ directory: it is neither, refused"),
            JsonTotal => write!(
                f,
                "its image JSON (oci-layout, index.json, nested indexes, manifest, config) is more than \
                 {MAX_TOTAL_JSON_BYTES} bytes together, and a checkpoint image's is a few KiB (refused before reading \
                 more): this is no checkpoint image; {REBUILD}"
            ),
            RootFs { config, reason } => write!(
                f,
                "the config {config} is refused: {reason}; containerd unpacks and restores the layer its \
                 rootfs.diff_ids name (`rootfs.type` `layers`, one sha256 of the uncompressed layer per layer); {REBUILD}"
            ),
            DiffId { declared, actual } => write!(
                f,
                "the config's rootfs.diff_ids names the layer content {declared}, but this layer's uncompressed content \
                 is {actual}: containerd restores the snapshot diff_ids name, and on a node that already has that \
                 snapshot restores it without unpacking this layer, so what it restores is not what this tool read; \
                 {REBUILD}"
            ),
            TrailingData { compression, reason } => write!(
                f,
                "after its tar, the layer's {compression} stream holds data that is no {compression} frame ({reason}): \
                 containerd reads a layer to its end to verify it and refuses this one; {REBUILD}"
            ),
            Targets { targets } => write!(
                f,
                "index.json reaches its image through entries whose annotations differ ({}): containerd reads the \
                 annotations of the entry the restored name stands for, so whether it takes the image for a checkpoint \
                 depends on that name; {REBUILD}",
                targets.join(", ")
            ),
        }
    }
}
