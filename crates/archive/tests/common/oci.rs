//! Checkpoint images for the tests: what `buildah commit` writes for `buildah add CTR checkpoint.tar /` (one layer,
//! the checkpoint's files) as an OCI layout directory or an `oci-archive`, with every part open to be made hostile.

use std::path::Path;

use ccm_archive::sha256::hex_digest;
use ccm_archive::Compression;

use super::{compress, Tar};

pub const INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const CONFIG: &str = "application/vnd.oci.image.config.v1+json";

pub fn layer_type(c: Compression) -> &'static str {
    match c {
        Compression::None => "application/vnd.oci.image.layer.v1.tar",
        Compression::Gzip => "application/vnd.oci.image.layer.v1.tar+gzip",
        Compression::Zstd => "application/vnd.oci.image.layer.v1.tar+zstd",
    }
}

pub fn digest(data: &[u8]) -> String {
    format!("sha256:{}", hex_digest(data))
}

/// An image config whose `rootfs.diff_ids` are `diff_ids`.
pub fn config_of(diff_ids: &[&str]) -> Vec<u8> {
    let ids = diff_ids.iter().map(|d| format!("\"{d}\"")).collect::<Vec<_>>().join(",");
    format!(r#"{{"architecture":"amd64","os":"linux","config":{{}},"rootfs":{{"type":"layers","diff_ids":[{ids}]}}}}"#)
        .into_bytes()
}

pub fn descriptor(media_type: &str, data: &[u8]) -> String {
    format!(r#"{{"mediaType":"{media_type}","digest":"{}","size":{}}}"#, digest(data), data.len())
}

/// An image's files: `oci-layout`, `index.json` and the blobs (by their hex), in the order skopeo's oci-archive
/// holds them.
#[derive(Clone)]
pub struct Image {
    pub layout: Vec<u8>,
    pub index: Vec<u8>,
    pub blobs: Vec<(String, Vec<u8>)>,
}

impl Image {
    /// A checkpoint image of `layer` (a tar, compressed as `compression`), annotated as the user guide says, its
    /// config's `rootfs.diff_ids` the SHA-256 of the uncompressed tar (what buildah writes and containerd checks).
    pub fn of(layer: &[u8], compression: Compression) -> (Image, Parts) {
        let config = config_of(&[&digest(layer)]);
        let layer = compress(layer, compression);
        let parts = Parts::of(layer, layer_type(compression), config);
        (parts.image(), parts)
    }

    pub fn blob(&mut self, data: &[u8]) -> String {
        let hex = hex_digest(data);
        self.blobs.push((hex.clone(), data.to_vec()));
        format!("sha256:{hex}")
    }

    pub fn replace_blob(&mut self, hex_of: &[u8], data: &[u8]) {
        let hex = hex_digest(hex_of);
        for (h, d) in &mut self.blobs {
            if *h == hex {
                *d = data.to_vec();
            }
        }
    }

    pub fn remove_blob(&mut self, hex_of: &[u8]) {
        let hex = hex_digest(hex_of);
        self.blobs.retain(|(h, _)| *h != hex);
    }

    pub fn write_layout(&self, dir: &Path) {
        std::fs::create_dir_all(dir.join("blobs/sha256")).unwrap();
        std::fs::write(dir.join("oci-layout"), &self.layout).unwrap();
        std::fs::write(dir.join("index.json"), &self.index).unwrap();
        for (hex, data) in &self.blobs {
            std::fs::write(dir.join("blobs/sha256").join(hex), data).unwrap();
        }
    }

    /// The oci-archive, with `extra` members added at the end before the layout files.
    pub fn archive_with(&self, extra: impl FnOnce(&mut Tar)) -> Vec<u8> {
        let mut t = Tar::new();
        t.dir("blobs").dir("blobs/sha256");
        for (hex, data) in &self.blobs {
            t.file(&format!("blobs/sha256/{hex}"), data);
        }
        extra(&mut t);
        t.file("index.json", &self.index).file("oci-layout", &self.layout);
        t.finish()
    }

    pub fn archive(&self) -> Vec<u8> {
        self.archive_with(|_| {})
    }
}

/// The blobs of a one-layer image, to rebuild it with one changed.
#[derive(Clone)]
pub struct Parts {
    pub layer: Vec<u8>,
    pub config: Vec<u8>,
    pub manifest: Vec<u8>,
}

/// The annotations the user guide's buildah lines put on a checkpoint image's manifest.
pub const CHECKPOINT_ANNOTATIONS: &str =
    r#"{"io.kubernetes.cri-o.annotations.checkpoint.name":"counter","org.criu.checkpoint.container.name":"counter"}"#;

impl Parts {
    /// The parts of an image of the blob `layer` (of `media_type`) and `config`, its manifest annotated as the user
    /// guide says.
    pub fn of(layer: Vec<u8>, media_type: &str, config: Vec<u8>) -> Parts {
        let manifest = format!(
            r#"{{"schemaVersion":2,"mediaType":"{MANIFEST}","config":{},"layers":[{}],"annotations":{CHECKPOINT_ANNOTATIONS}}}"#,
            descriptor(CONFIG, &config),
            descriptor(media_type, &layer)
        )
        .into_bytes();
        Parts { layer, config, manifest }
    }

    pub fn image(&self) -> Image {
        let mut i =
            Image { layout: br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec(), index: Vec::new(), blobs: Vec::new() };
        i.blob(&self.layer);
        i.blob(&self.config);
        i.blob(&self.manifest);
        i.index = format!(
            r#"{{"schemaVersion":2,"mediaType":"{INDEX}","manifests":[{}]}}"#,
            descriptor(MANIFEST, &self.manifest).trim_end_matches('}').to_string()
                + r#","annotations":{"org.opencontainers.image.ref.name":"ckpt"}}"#
        )
        .into_bytes();
        i
    }
}
