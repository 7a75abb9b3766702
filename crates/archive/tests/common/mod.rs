//! Archive builders shared by the tests: well-formed members through `tar::Builder`, hostile ones
//! through hand-set header bytes (the builder refuses `..` and absolute names, as it should).

#![allow(dead_code)] // each test binary uses a part

use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ccm_archive::Compression;
use tar::{Builder, EntryType, Header};

pub const MIB: u64 = 1 << 20;

/// Far more than any of these reads needs on an idle machine (they take milliseconds to a few
/// hundred), with room for a loaded two-core CI box running unoptimized decoders.
pub const QUICK: Duration = Duration::from_secs(2);

/// An identity image's bytes: not parsed by this crate, but not all alike either, so a read-back
/// that shifted or cut them would show.
pub fn image_bytes(seed: u8) -> Vec<u8> {
    let mut out = b"CCMIDIMG".to_vec();
    out.extend((0..3000u32).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)));
    out
}

pub const SPEC: &[u8] = br#"{"ociVersion":"1.0.2","process":{"env":["NVIDIA_VISIBLE_DEVICES=0"]}}"#;

/// A tar under construction.
pub struct Tar(Builder<Vec<u8>>);

impl Default for Tar {
    fn default() -> Self {
        Self::new()
    }
}

impl Tar {
    pub fn new() -> Self {
        Tar(Builder::new(Vec::new()))
    }

    fn gnu(kind: EntryType, size: u64, mode: u32) -> Header {
        let mut h = Header::new_gnu();
        h.set_entry_type(kind);
        h.set_size(size);
        h.set_mode(mode);
        h.set_mtime(1_700_000_000);
        h
    }

    pub fn dir(&mut self, name: &str) -> &mut Self {
        let mut h = Self::gnu(EntryType::Directory, 0, 0o755);
        self.0.append_data(&mut h, name, io::empty()).unwrap();
        self
    }

    pub fn file(&mut self, name: &str, data: &[u8]) -> &mut Self {
        let mut h = Self::gnu(EntryType::Regular, data.len() as u64, 0o600);
        self.0.append_data(&mut h, name, data).unwrap();
        self
    }

    /// A member of `len` zero bytes, streamed (never held).
    pub fn zeros(&mut self, name: &str, len: u64) -> &mut Self {
        let mut h = Self::gnu(EntryType::Regular, len, 0o600);
        self.0.append_data(&mut h, name, io::repeat(0).take(len)).unwrap();
        self
    }

    /// A symbolic or hard link.
    pub fn link(&mut self, kind: EntryType, name: &str, target: &str) -> &mut Self {
        let mut h = Self::gnu(kind, 0, 0o777);
        self.0.append_link(&mut h, name, target).unwrap();
        self
    }

    /// A member of any type with no data (FIFO, device, directory).
    pub fn special(&mut self, kind: EntryType, name: &str) -> &mut Self {
        let mut h = Self::gnu(kind, 0, 0o644);
        self.0.append_data(&mut h, name, io::empty()).unwrap();
        self
    }

    /// A header with `name` written straight into its name field (up to 100 bytes), claiming
    /// `size` bytes, followed by `data` (which may be shorter than `size`, padded to a block).
    pub fn raw(&mut self, name: &[u8], kind: EntryType, size: u64, data: &[u8]) -> &mut Self {
        self.raw_header(&raw_header(name, kind, size));
        self.bytes(data);
        let pad = (512 - data.len() % 512) % 512;
        self.bytes(&vec![0; pad])
    }

    /// A GNU long-name member naming the next member, the way GNU tar writes one.
    pub fn long_name(&mut self, name: &[u8]) -> &mut Self {
        let mut data = name.to_vec();
        data.push(0);
        self.raw(b"././@LongLink", EntryType::GNULongName, data.len() as u64, &data)
    }

    pub fn raw_header(&mut self, header: &Header) -> &mut Self {
        self.bytes(header.as_bytes())
    }

    /// Bytes appended as they are.
    pub fn bytes(&mut self, data: &[u8]) -> &mut Self {
        self.0.get_mut().write_all(data).unwrap();
        self
    }

    /// A PAX extension header for the next member.
    pub fn pax(&mut self, records: &[(&str, &[u8])]) -> &mut Self {
        self.0.append_pax_extensions(records.iter().copied()).unwrap();
        self
    }

    /// The archive with tar's end-of-archive blocks.
    pub fn finish(self) -> Vec<u8> {
        self.0.into_inner().unwrap()
    }

    /// The archive as it stands, without end-of-archive blocks.
    pub fn unfinished(&self) -> Vec<u8> {
        self.0.get_ref().clone()
    }
}

/// A GNU header whose name field is set byte by byte (no checks), checksum set.
pub fn raw_header(name: &[u8], kind: EntryType, size: u64) -> Header {
    assert!(name.len() <= 100);
    let mut h = Tar::gnu(kind, size, 0o644);
    h.as_mut_bytes()[..name.len()].copy_from_slice(name);
    h.set_cksum();
    h
}

/// What `podman container checkpoint --export` writes, roughly: CRIU's images with ours among
/// them, a 20 MiB `pages-1.img`, and the engine's files beside `checkpoint/`.
pub fn podman_like() -> Vec<u8> {
    let mut t = Tar::new();
    t.dir("checkpoint")
        .file("checkpoint/inventory.img", b"\x54\xc6\x60\x58inventory")
        .file("checkpoint/core-5.img", &[7; 1500])
        .file("checkpoint/mm-5.img", &[8; 700])
        .file("checkpoint/pagemap-5.img", &[9; 300])
        .zeros("checkpoint/pages-1.img", 20 * MIB)
        .file("checkpoint/cuda-migrate-5.img", &image_bytes(5))
        .file("checkpoint/dump.log", b"(00.000001) Dumping finished successfully\n")
        .file("config.dump", br#"{"id":"3f2a"}"#)
        .file("spec.dump", SPEC)
        .file("network.status", b"[]")
        .file("stats-dump", &[1; 100])
        .zeros("rootfs-diff.tar", 10240)
        .file("deleted.files", b"[]");
    t.finish()
}

/// Members in [`podman_like`].
pub const PODMAN_MEMBERS: usize = 14;

pub fn compress(tar: &[u8], compression: Compression) -> Vec<u8> {
    match compression {
        Compression::None => tar.to_vec(),
        Compression::Gzip => gzip(tar),
        Compression::Zstd => zstd::stream::encode_all(tar, 3).unwrap(),
    }
}

pub fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

pub fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

pub fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let start = Instant::now();
    let out = f();
    (out, start.elapsed())
}
