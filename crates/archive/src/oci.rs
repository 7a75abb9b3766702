//! Checkpoint images: the OCI image Kubernetes users build from a checkpoint archive to restore it
//! (`buildah from scratch`, `buildah add CTR checkpoint.tar /`, `buildah config --annotation ...`,
//! `buildah commit`), as an **OCI image layout directory** (`oci:DIR`) or an **`oci-archive`** (a tar
//! of that layout, `oci-archive:FILE`), read in place.
//!
//! The way in: `oci-layout` (version 1.0.0) → `index.json` → the image's manifest (nested indexes
//! followed, at most [`MAX_INDEX_DEPTH`] deep and [`MAX_DESCRIPTORS`] descriptors in all; every
//! reference to one manifest counts as one image, and more than one image is refused: which one a
//! runtime would take is a matter of tags) → its config (verified) and its one layer → the layer,
//! read as a checkpoint archive by every rule of [`crate::read_archive`].
//!
//! # Rules, on top of the archive rules
//!
//! - **Blobs by digest only**: `sha256:` and 64 lowercase hex digits; any other algorithm, case, or
//!   length (a path, `..`) is refused before anything is opened. Every blob read is hashed while it
//!   streams, and its size and SHA-256 must be what its descriptor says.
//! - **No link is followed**: in a layout directory `oci-layout`, `index.json`, `blobs/`,
//!   `blobs/sha256/` and each blob are opened relative to their directory, without following a link;
//!   in an `oci-archive` a link or a second member under these names is refused as in any archive.
//! - **Bounded**: image JSON is at most [`MAX_JSON_BYTES`] (refused from its size), an `oci-archive`
//!   holds at most 4096 blobs, and the layer is walked within the same [`crate::Limits`].
//! - **No second reading**: keys Go's `encoding/json` (every runtime's reader) would match
//!   differently from this reader are refused ([`crate::json`]); so is a descriptor with embedded
//!   `data` or foreign `urls` (a runtime may take the data from there instead of the blob), a
//!   manifest whose own `mediaType` differs from its descriptor's, and a layer whose bytes are
//!   compressed otherwise than its media type says.
//! - **One layer**: a checkpoint image has the one layer `buildah add` made; with several, what a
//!   runtime unpacks is their overlay (whiteouts included), not what any one of them holds.
//! - An `oci-archive` must be a plain tar (as skopeo and buildah write it): its blobs are read where
//!   they lie, so a manifest is read before the layer it names, in one pass over the layer.

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use ccm_process::dir::{Dir, FileError};
use serde::de::DeserializeOwned;
use serde::Deserialize;

use crate::archive::{CheckpointArchive, Compression, Limits};
use crate::error::ArchiveError;
pub use crate::image_rule::{ImageRule, MAX_DESCRIPTORS, MAX_INDEX_DEPTH, MAX_JSON_BYTES, MAX_TOTAL_JSON_BYTES};
use crate::sha256::Hashing;
use crate::{input, walk};

/// The annotation CRI-O looks for on a checkpoint image (the Kubernetes documentation's buildah line).
pub const CRIO_CHECKPOINT_ANNOTATION: &str = "io.kubernetes.cri-o.annotations.checkpoint.name";
/// The annotation containerd 2.x looks for on the image's manifest or index to take it for a
/// checkpoint (checkpointctl's `org.criu.checkpoint.container.name`; containerd's
/// `checkIfCheckpointOCIImage`).
pub const CONTAINERD_CHECKPOINT_ANNOTATION: &str = "org.criu.checkpoint.container.name";
/// The tag of an image in an OCI layout's index.
const REF_NAME: &str = "org.opencontainers.image.ref.name";

const INDEX_TYPES: &[&str] =
    &["application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json"];
const MANIFEST_TYPES: &[&str] =
    &["application/vnd.oci.image.manifest.v1+json", "application/vnd.docker.distribution.manifest.v2+json"];
const CONFIG_TYPES: &[&str] =
    &["application/vnd.oci.image.config.v1+json", "application/vnd.docker.container.image.v1+json"];

/// The compression a layer media type announces; `None` for a type that is no plain layer.
fn layer_compression(media_type: &str) -> Option<Compression> {
    match media_type {
        "application/vnd.oci.image.layer.v1.tar" => Some(Compression::None),
        "application/vnd.oci.image.layer.v1.tar+gzip" | "application/vnd.docker.image.rootfs.diff.tar.gzip" => {
            Some(Compression::Gzip)
        }
        "application/vnd.oci.image.layer.v1.tar+zstd" => Some(Compression::Zstd),
        _ => None,
    }
}

/// How the image is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageFormat {
    /// An OCI image layout directory (`oci:DIR`).
    Layout,
    /// A tar of one (`oci-archive:FILE`).
    OciArchive,
}

impl fmt::Display for ImageFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ImageFormat::Layout => "OCI image layout",
            ImageFormat::OciArchive => "oci-archive",
        })
    }
}

/// A checkpoint image, its layer read as a checkpoint archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointImage {
    pub path: PathBuf,
    pub format: ImageFormat,
    /// `sha256:...` of the image's manifest.
    pub manifest_digest: String,
    /// Its tags in the layout (`org.opencontainers.image.ref.name`), unescaped.
    pub ref_names: Vec<String>,
    /// The manifest's annotations, unescaped (where buildah's `config --annotation` puts them).
    pub annotations: BTreeMap<String, String>,
    /// `sha256:...` of the blob `index.json`'s entry names: the image's target in containerd (`ctr images
    /// import`, a pull), the manifest itself or a nested index above it.
    pub target_digest: String,
    /// The target's own annotations, unescaped: the ones containerd 2.x reads to take the image for a
    /// checkpoint (`checkIfCheckpointOCIImage` reads the target's blob as an index): the manifest's where
    /// `index.json` names the manifest, the nested index's where it names one.
    pub target_annotations: BTreeMap<String, String>,
    pub layer_digest: String,
    pub layer_media_type: String,
    pub layer_size: u64,
    /// The layer, read as a checkpoint archive; its `path` is `IMAGE:blobs/sha256/HEX`.
    pub checkpoint: CheckpointArchive,
}

impl CheckpointImage {
    /// The container name CRI-O's annotation gives (on the manifest), else containerd's (on the target).
    pub fn checkpoint_name(&self) -> Option<&str> {
        self.annotations
            .get(CRIO_CHECKPOINT_ANNOTATION)
            .or_else(|| self.target_annotations.get(CONTAINERD_CHECKPOINT_ANNOTATION))
            .map(String::as_str)
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LayoutFile {
    image_layout_version: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Descriptor {
    media_type: String,
    digest: String,
    size: u64,
    #[serde(default)]
    annotations: Option<BTreeMap<String, String>>,
    #[serde(default)]
    urls: Option<Vec<String>>,
    #[serde(default)]
    data: Option<serde::de::IgnoredAny>,
}

/// Whether a key is there, whatever its value (`null` too): what containerd's `validateMediaType` asks of the
/// keys that tell an index from a manifest (a `json.RawMessage` of any value is not empty there).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    serde::de::IgnoredAny::deserialize(d).map(|_| true)
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Index {
    schema_version: u32,
    #[serde(default)]
    media_type: Option<String>,
    #[serde(default)]
    manifests: Option<Vec<Descriptor>>,
    #[serde(default)]
    annotations: Option<BTreeMap<String, String>>,
    /// A manifest's keys, which make it no index to containerd.
    #[serde(default, deserialize_with = "present")]
    config: bool,
    #[serde(default, deserialize_with = "present")]
    layers: bool,
    #[serde(default, rename = "fsLayers", deserialize_with = "present")]
    fs_layers: bool,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Manifest {
    schema_version: u32,
    #[serde(default)]
    media_type: Option<String>,
    config: Descriptor,
    #[serde(default)]
    layers: Option<Vec<Descriptor>>,
    #[serde(default)]
    annotations: Option<BTreeMap<String, String>>,
    /// An index's key, which makes it no manifest to containerd.
    #[serde(default, deserialize_with = "present")]
    manifests: bool,
    #[serde(default, rename = "fsLayers", deserialize_with = "present")]
    fs_layers: bool,
}

/// The part of an image config containerd's unpack reads (`unpackConfig`, `images.RootFS`).
#[derive(Deserialize)]
struct ImageConfig {
    #[serde(default)]
    rootfs: Option<RootFs>,
}

#[derive(Deserialize)]
struct RootFs {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    diff_ids: Option<Vec<String>>,
}

/// The blob containerd takes for an image (its target): the entry of `index.json` the image descends from.
#[derive(Clone, PartialEq, Eq)]
enum Target {
    /// `index.json` names the manifest itself.
    Manifest,
    /// `index.json` names a nested index, with these annotations of its own.
    Index { digest: String, annotations: BTreeMap<String, String> },
}

/// The image's one manifest, as the indexes name it.
struct FoundManifest {
    desc: Descriptor,
    tags: Vec<String>,
    /// Every distinct entry of `index.json` it is reached through.
    targets: Vec<Target>,
}

/// A digest for messages: escaped, cut.
fn shown_digest(digest: &str) -> String {
    crate::name::shown(digest.as_bytes())
}

/// The hex of a `sha256:` digest, or the rule it breaks.
fn sha256_hex(digest: &str) -> Result<&str, ImageRule> {
    match digest.split_once(':') {
        Some(("sha256", hex)) if hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) => {
            Ok(hex)
        }
        _ => Err(ImageRule::Digest { digest: shown_digest(digest) }),
    }
}

fn parse<T: DeserializeOwned>(bytes: &[u8], what: &str) -> Result<T, ImageRule> {
    crate::json::check(bytes)
        .and_then(|()| serde_json::from_slice(bytes))
        .map_err(|e| ImageRule::Json { what: what.to_string(), reason: e.to_string() })
}

/// Where the blobs are.
enum Blobs<'a> {
    /// `blobs/sha256/` of a layout directory (`None`: there is none).
    Layout(Option<Dir>),
    /// Members of an `oci-archive` (a plain tar): `sha256/HEX` → data offset and size.
    Archive { file: &'a File, members: HashMap<String, (u64, u64)> },
}

/// A byte range of a file, read with `pread`.
struct Range<'a> {
    file: &'a File,
    pos: u64,
    end: u64,
}

impl Read for Range<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let want = usize::try_from(self.end - self.pos).unwrap_or(usize::MAX).min(buf.len());
        if want == 0 {
            return Ok(0);
        }
        let n = self.file.read_at(&mut buf[..want], self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

fn file_rule(e: FileError) -> ImageRule {
    match e {
        FileError::Symlink { path } | FileError::Replaced { path } => {
            ImageRule::Link { path: ccm_identity::text::escaped(&path.display().to_string()) }
        }
        FileError::Missing { path } => {
            ImageRule::Missing { what: ccm_identity::text::escaped(&path.display().to_string()) }
        }
        e => ImageRule::Unreadable { reason: ccm_identity::text::escaped(&e.to_string()) },
    }
}

/// One image read.
struct Reader<'a> {
    image: String,
    path: &'a Path,
    blobs: Blobs<'a>,
    limits: &'a Limits,
    /// Image JSON read so far, against [`MAX_TOTAL_JSON_BYTES`].
    json_read: Cell<u64>,
}

impl Reader<'_> {
    fn refuse(&self, rule: ImageRule) -> ArchiveError {
        ArchiveError::Image { image: self.image.clone(), rule }
    }

    /// Counts `size` more bytes of image JSON, before they are read.
    fn count_json(&self, size: u64) -> Result<(), ArchiveError> {
        let total = self.json_read.get().saturating_add(size);
        if total > MAX_TOTAL_JSON_BYTES {
            return Err(self.refuse(ImageRule::JsonTotal));
        }
        self.json_read.set(total);
        Ok(())
    }

    /// The blob's bytes, at most `size`, unhashed.
    fn open(&self, hex: &str, digest: &str, size: u64) -> Result<Box<dyn Read + '_>, ArchiveError> {
        let missing = || self.refuse(ImageRule::Missing { what: format!("blob {}", shown_digest(digest)) });
        let actual = match &self.blobs {
            Blobs::Layout(None) => return Err(missing()),
            Blobs::Layout(Some(dir)) => {
                let (file, len) = dir.open_file(hex).map_err(|e| self.refuse(file_rule(e)))?;
                if len == size {
                    return Ok(Box::new(file.take(size)));
                }
                len
            }
            Blobs::Archive { file, members } => {
                let &(offset, len) = members.get(&format!("sha256/{hex}")).ok_or_else(missing)?;
                if len == size {
                    return Ok(Box::new(Range { file, pos: offset, end: offset + size }));
                }
                len
            }
        };
        Err(self.refuse(ImageRule::SizeMismatch { digest: shown_digest(digest), declared: size, actual }))
    }

    /// A small blob (image JSON), checked against its descriptor.
    fn small(&self, d: &Descriptor, what: &str) -> Result<Vec<u8>, ArchiveError> {
        let hex = sha256_hex(&d.digest).map_err(|r| self.refuse(r))?;
        if d.data.is_some() || d.urls.as_ref().is_some_and(|u| !u.is_empty()) {
            return Err(self.refuse(ImageRule::Embedded { digest: shown_digest(&d.digest) }));
        }
        if d.size > MAX_JSON_BYTES {
            return Err(self.refuse(ImageRule::TooLarge { what: format!("{what} {}", d.digest), size: d.size }));
        }
        self.count_json(d.size)?;
        let mut reader = Hashing::new(self.open(hex, &d.digest, d.size)?);
        let mut bytes = Vec::new();
        reader
            .read_to_end(&mut bytes)
            .map_err(|e| self.refuse(ImageRule::Unreadable { reason: format!("reading blob {}: {e}", d.digest) }))?;
        self.verify(reader, &d.digest, hex, d.size)?;
        Ok(bytes)
    }

    /// Reads what is left of a blob and checks its size and digest.
    fn verify<R: Read>(&self, reader: Hashing<R>, digest: &str, hex: &str, size: u64) -> Result<(), ArchiveError> {
        let (actual, count) = reader
            .finish()
            .map_err(|e| self.refuse(ImageRule::Unreadable { reason: format!("reading blob {digest}: {e}") }))?;
        if count != size {
            return Err(self.refuse(ImageRule::SizeMismatch {
                digest: shown_digest(digest),
                declared: size,
                actual: count,
            }));
        }
        if actual != hex {
            return Err(self.refuse(ImageRule::DigestMismatch {
                digest: shown_digest(digest),
                actual: format!("sha256:{actual}"),
            }));
        }
        Ok(())
    }

    /// Parses an index (`index.json` or a nested one) and holds it to what containerd takes for one.
    fn index(&self, bytes: &[u8], what: &str) -> Result<Index, ArchiveError> {
        let idx: Index = parse(bytes, what).map_err(|r| self.refuse(r))?;
        let json = |reason: String| self.refuse(ImageRule::Json { what: what.to_string(), reason });
        if idx.schema_version != 2 {
            return Err(json(format!("its schemaVersion is {}, not 2", idx.schema_version)));
        }
        if let Some(t) = idx.media_type.as_deref().filter(|t| !INDEX_TYPES.contains(t)) {
            return Err(self.refuse(ImageRule::MediaType {
                what: what.to_string(),
                media_type: crate::name::shown(t.as_bytes()),
            }));
        }
        // containerd's validateMediaType: an index with a manifest's keys is refused (`expected index but found
        // manifest`), and so is Docker's schema 1.
        if let Some(key) = [(idx.config, "config"), (idx.layers, "layers"), (idx.fs_layers, "fsLayers")]
            .iter()
            .find_map(|&(there, key)| there.then_some(key))
        {
            return Err(json(format!(
                "it is an index with a `{key}` key, which only a manifest has: containerd refuses it (media-type: \
                 expected index but found manifest)"
            )));
        }
        Ok(idx)
    }

    /// Follows the indexes from `index.json` down to the image's manifest: its descriptor, the tags that name it
    /// and the entries of `index.json` it is reached through. A second manifest ends the walk at once.
    fn manifest_descriptor(&self, index: &[u8]) -> Result<FoundManifest, ArchiveError> {
        let mut found: Option<FoundManifest> = None;
        let mut visited = HashSet::new();
        let mut count = 0usize;
        // (bytes, what, depth, the target its manifests descend from): a stack instead of recursion. An
        // index below index.json is the target of what lies below it.
        let mut todo: Vec<(Vec<u8>, String, usize, Option<Target>)> =
            vec![(index.to_vec(), "index.json".to_string(), 1usize, None)];
        while let Some((bytes, what, depth, target)) = todo.pop() {
            let idx = self.index(&bytes, &what)?;
            drop(bytes);
            let target = match (depth, target) {
                (2, _) => Some(Target::Index {
                    digest: what.trim_start_matches("index ").to_string(),
                    annotations: idx.annotations.clone().unwrap_or_default(),
                }),
                (_, target) => target,
            };
            for d in idx.manifests.unwrap_or_default() {
                count += 1;
                if count > MAX_DESCRIPTORS {
                    return Err(self.refuse(ImageRule::TooManyDescriptors));
                }
                let hex = sha256_hex(&d.digest).map_err(|r| self.refuse(r))?.to_string();
                if INDEX_TYPES.contains(&d.media_type.as_str()) {
                    if depth >= MAX_INDEX_DEPTH {
                        return Err(self.refuse(ImageRule::TooDeep));
                    }
                    if !visited.insert(hex) {
                        return Err(self.refuse(ImageRule::Loop { digest: shown_digest(&d.digest) }));
                    }
                    let bytes = self.small(&d, "the index")?;
                    todo.push((bytes, format!("index {}", d.digest), depth + 1, target.clone()));
                } else if MANIFEST_TYPES.contains(&d.media_type.as_str()) {
                    let tag = d.annotations.as_ref().and_then(|a| a.get(REF_NAME)).cloned();
                    let via = target.clone().unwrap_or(Target::Manifest);
                    match &mut found {
                        Some(f) if f.desc.digest != d.digest => {
                            // A second image: which one a runtime takes is a matter of tags. Refused here,
                            // before any more of the indexes is read.
                            let refs = f.tags.iter().chain(&tag).map(|t| crate::name::shown(t.as_bytes())).collect();
                            return Err(self.refuse(ImageRule::Images { count: 2, refs }));
                        }
                        Some(f) => {
                            if f.desc.size != d.size || f.desc.media_type != d.media_type {
                                return Err(self.refuse(ImageRule::Json {
                                    what,
                                    reason: format!("two descriptors of {} disagree on its size or type", d.digest),
                                }));
                            }
                            f.tags.extend(tag);
                            if !f.targets.contains(&via) {
                                f.targets.push(via);
                            }
                        }
                        None => {
                            found = Some(FoundManifest { desc: d, tags: tag.into_iter().collect(), targets: vec![via] })
                        }
                    }
                } else {
                    return Err(self.refuse(ImageRule::MediaType {
                        what: format!("the descriptor {} in {what}", shown_digest(&d.digest)),
                        media_type: crate::name::shown(d.media_type.as_bytes()),
                    }));
                }
            }
        }
        found.ok_or_else(|| self.refuse(ImageRule::Images { count: 0, refs: Vec::new() }))
    }

    /// The one `rootfs.diff_ids` entry of the config, as its hex: what containerd unpacks the layer as.
    fn diff_id(&self, config: &[u8], digest: &str, layers: usize) -> Result<String, ArchiveError> {
        let what = format!("config {digest}");
        let c: ImageConfig = parse(config, &what).map_err(|r| self.refuse(r))?;
        let refuse = |reason: String| self.refuse(ImageRule::RootFs { config: digest.to_string(), reason });
        let Some(rootfs) = c.rootfs else {
            return Err(refuse(format!(
                "it has no rootfs (containerd: mismatched image rootfs and manifest layers, {layers} != 0)"
            )));
        };
        if rootfs.kind != "layers" {
            return Err(refuse(format!(
                "its rootfs.type is `{}`, not `layers`",
                crate::name::shown(rootfs.kind.as_bytes())
            )));
        }
        let ids = rootfs.diff_ids.unwrap_or_default();
        if ids.len() != layers {
            return Err(refuse(format!(
                "its rootfs.diff_ids names {} layer(s), and its manifest has {layers} (containerd: mismatched image \
                 rootfs and manifest layers)",
                ids.len()
            )));
        }
        let id = &ids[0];
        Ok(sha256_hex(id).map_err(|r| self.refuse(r))?.to_string())
    }

    fn read(&self, format: ImageFormat, layout: &[u8], index: &[u8]) -> Result<CheckpointImage, ArchiveError> {
        self.count_json(u64::try_from(layout.len() + index.len()).unwrap_or(u64::MAX))?;
        let l: LayoutFile = parse(layout, "oci-layout").map_err(|r| self.refuse(r))?;
        if l.image_layout_version != "1.0.0" {
            return Err(self.refuse(ImageRule::NotLayout {
                why: format!(
                    "its oci-layout says imageLayoutVersion `{}`, and 1.0.0 is the one version there is",
                    crate::name::shown(l.image_layout_version.as_bytes())
                ),
            }));
        }
        let FoundManifest { desc, tags: ref_names, targets } = self.manifest_descriptor(index)?;
        let what = format!("manifest {}", desc.digest);
        let m: Manifest = parse(&self.small(&desc, "the manifest")?, &what).map_err(|r| self.refuse(r))?;
        if m.schema_version != 2 {
            return Err(self.refuse(ImageRule::Json {
                what,
                reason: format!("its schemaVersion is {}, not 2", m.schema_version),
            }));
        }
        if let Some(t) = m.media_type.as_deref().filter(|t| *t != desc.media_type) {
            return Err(self.refuse(ImageRule::MediaType {
                what: format!("{what} (its descriptor says `{}`)", crate::name::shown(desc.media_type.as_bytes())),
                media_type: crate::name::shown(t.as_bytes()),
            }));
        }
        // containerd's validateMediaType: a manifest with an index's key is refused (`expected manifest but
        // found index`), and so is Docker's schema 1.
        if let Some(key) = [(m.manifests, "manifests"), (m.fs_layers, "fsLayers")]
            .iter()
            .find_map(|&(there, key)| there.then_some(key))
        {
            return Err(self.refuse(ImageRule::Json {
                what,
                reason: format!(
                    "it is a manifest with a `{key}` key, which only an index has: containerd refuses it (media-type: \
                     expected manifest but found index)"
                ),
            }));
        }
        if !CONFIG_TYPES.contains(&m.config.media_type.as_str()) {
            return Err(self.refuse(ImageRule::MediaType {
                what: format!("the config of {what}"),
                media_type: crate::name::shown(m.config.media_type.as_bytes()),
            }));
        }
        let config = self.small(&m.config, "the config")?;
        let mut layers = m.layers.unwrap_or_default();
        if layers.len() != 1 {
            return Err(self.refuse(ImageRule::Layers { count: layers.len() }));
        }
        let diff_id = self.diff_id(&config, &m.config.digest, layers.len())?;
        drop(config);
        let annotations = m.annotations.unwrap_or_default();
        let (target_digest, target_annotations) = self.target(&desc.digest, &annotations, &targets)?;
        let layer = layers.remove(0);
        let checkpoint = self.layer(&layer, &diff_id)?;
        Ok(CheckpointImage {
            path: self.path.to_path_buf(),
            format,
            manifest_digest: desc.digest,
            ref_names,
            annotations,
            target_digest,
            target_annotations,
            layer_digest: layer.digest,
            layer_media_type: layer.media_type,
            layer_size: layer.size,
            checkpoint,
        })
    }

    /// The target containerd reads the annotations of, and those annotations; refused where `index.json` reaches
    /// the manifest through entries that say different things.
    fn target(
        &self,
        manifest: &str,
        annotations: &BTreeMap<String, String>,
        targets: &[Target],
    ) -> Result<(String, BTreeMap<String, String>), ArchiveError> {
        let resolved: Vec<(&str, &BTreeMap<String, String>)> = targets
            .iter()
            .map(|t| match t {
                Target::Manifest => (manifest, annotations),
                Target::Index { digest, annotations } => (digest.as_str(), annotations),
            })
            .collect();
        let Some(&(digest, first)) = resolved.first() else {
            return Ok((manifest.to_string(), annotations.clone()));
        };
        if resolved.iter().any(|(_, a)| *a != first) {
            return Err(
                self.refuse(ImageRule::Targets { targets: resolved.iter().map(|(d, _)| shown_digest(d)).collect() })
            );
        }
        Ok((digest.to_string(), first.clone()))
    }

    /// Streams the layer through the archive reader, hashing it on the way: the blob as stored (its digest)
    /// and its uncompressed tar, to its end (its diff_id, `diff_id`'s hex).
    fn layer(&self, d: &Descriptor, diff_id: &str) -> Result<CheckpointArchive, ArchiveError> {
        let hex = sha256_hex(&d.digest).map_err(|r| self.refuse(r))?;
        if d.data.is_some() || d.urls.as_ref().is_some_and(|u| !u.is_empty()) {
            return Err(self.refuse(ImageRule::Embedded { digest: shown_digest(&d.digest) }));
        }
        let Some(expected) = layer_compression(&d.media_type) else {
            return Err(self.refuse(ImageRule::MediaType {
                what: format!("the layer {}", shown_digest(&d.digest)),
                media_type: crate::name::shown(d.media_type.as_bytes()),
            }));
        };
        let mut reader = Hashing::new(self.open(hex, &d.digest, d.size)?);
        let layer_path = PathBuf::from(format!("{}:blobs/sha256/{hex}", self.path.display()));
        let shown_layer = input::shown_path(&layer_path);
        let walked = (|| {
            let (stream, compression) = input::from_reader(&layer_path, &mut reader)?;
            if compression != expected {
                return Err(self.refuse(ImageRule::Compression {
                    media_type: crate::name::shown(d.media_type.as_bytes()),
                    found: compression,
                }));
            }
            let mut tar = Hashing::new(stream);
            let found = walk::Walk::new(
                input::Input::Stream(Box::new(&mut tar)),
                compression,
                shown_layer.clone(),
                self.limits,
            )
            .run()?;
            // containerd hashes the whole uncompressed stream, after the tar's end too (its padding, and
            // whatever follows), and its decoder refuses trailing data that is no frame: so is it read here,
            // within what is left of the scan limit.
            let left = self.limits.max_scanned_bytes.saturating_sub(tar.count);
            let tar_digest = match tar.finish_within(left) {
                Ok(Some((digest, _))) => digest,
                Ok(None) => {
                    return Err(ArchiveError::ScanLimit {
                        archive: shown_layer.clone(),
                        max: self.limits.max_scanned_bytes,
                    })
                }
                Err(e) => return Err(self.refuse(ImageRule::TrailingData { compression, reason: e.to_string() })),
            };
            Ok((compression, found, tar_digest))
        })();
        // The blob is verified whatever the walk said: a damaged or altered layer is named as one, not by
        // the tar error its damage made. What is left to hash is at most the blob's size on disk (a
        // decompression bomb is small there), never its decompressed data.
        let verified = self.verify(reader, &d.digest, hex, d.size);
        let (compression, found, tar_digest) = match (walked, verified) {
            (_, Err(e)) => return Err(e),
            (Err(e), Ok(())) => return Err(e),
            (Ok(w), Ok(())) => w,
        };
        if !found.has_checkpoint {
            return Err(self.refuse(ImageRule::NoCheckpoint));
        }
        if tar_digest != diff_id {
            return Err(self.refuse(ImageRule::DiffId {
                declared: format!("sha256:{diff_id}"),
                actual: format!("sha256:{tar_digest}"),
            }));
        }
        walk::finish(&layer_path, compression, found)
    }
}

/// Whether `path` is a directory with an `oci-layout` entry (of any kind: a link there is refused
/// when the image is read).
pub fn is_image_layout(path: &Path) -> bool {
    Dir::open(path).is_ok_and(|d| d.kind_of("oci-layout").is_ok_and(|k| k.is_some()))
}

/// Reads the OCI image layout directory at `path` (the path itself is followed: the user typed it;
/// nothing below it is).
pub fn read_image_layout(path: &Path, limits: &Limits) -> Result<CheckpointImage, ArchiveError> {
    let image = input::shown_path(path);
    let refuse = |rule| ArchiveError::Image { image: image.clone(), rule };
    let d = Dir::open(path).map_err(|e| refuse(file_rule(e)))?;
    let layout = match d.read_file("oci-layout", MAX_JSON_BYTES) {
        Err(FileError::Missing { .. }) => {
            return Err(refuse(ImageRule::NotLayout { why: "it has no oci-layout file".into() }))
        }
        r => r.map_err(|e| refuse(file_rule(e)))?,
    };
    let size = d.file_size("index.json").map_err(|e| refuse(file_rule(e)))?;
    if size > MAX_JSON_BYTES {
        return Err(refuse(ImageRule::TooLarge { what: "index.json".into(), size }));
    }
    let index = d.read_file("index.json", MAX_JSON_BYTES).map_err(|e| refuse(file_rule(e)))?;
    let blobs = match d.open_dir("blobs").and_then(|b| b.open_dir("sha256")) {
        Ok(dir) => Some(dir),
        Err(FileError::Missing { .. }) => None,
        Err(e) => return Err(refuse(file_rule(e))),
    };
    Reader { image, path, blobs: Blobs::Layout(blobs), limits, json_read: Cell::new(0) }.read(
        ImageFormat::Layout,
        &layout,
        &index,
    )
}

/// Reads an `oci-archive` whose outer tar was walked into `found`; `file` is the same file, for the
/// blobs' data.
pub(crate) fn read_oci_archive(
    path: &Path,
    file: &File,
    compression: Compression,
    found: walk::Found,
    limits: &Limits,
) -> Result<CheckpointImage, ArchiveError> {
    let image = input::shown_path(path);
    let refuse = |rule| ArchiveError::Image { image: image.clone(), rule };
    if found.has_checkpoint {
        return Err(refuse(ImageRule::Both));
    }
    if compression != Compression::None {
        return Err(refuse(ImageRule::CompressedArchive { compression }));
    }
    let Some(layout) = found.oci_layout else {
        return Err(refuse(ImageRule::NotLayout { why: "the tar has index.json but no oci-layout".into() }));
    };
    let Some(index) = found.oci_index else {
        return Err(refuse(ImageRule::Missing { what: "index.json".into() }));
    };
    let members = found.blobs.into_iter().map(|b| (b.key, (b.offset, b.size))).collect();
    Reader { image, path, blobs: Blobs::Archive { file, members }, limits, json_read: Cell::new(0) }.read(
        ImageFormat::OciArchive,
        &layout.bytes,
        &index.bytes,
    )
}
