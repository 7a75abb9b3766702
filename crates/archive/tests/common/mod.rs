//! Archive builders shared by the tests: well-formed members through `tar::Builder`, hostile ones
//! through hand-set header bytes (the builder refuses `..` and absolute names, as it should).

#![allow(dead_code)] // each test binary uses a part

pub mod oci;

use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
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
    out.extend((0..3000u32).map(|i| i.to_le_bytes()[0].wrapping_mul(31).wrapping_add(seed)));
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

/// An old-style GNU sparse header of `checkpoint/pages-2.img` for chunks of 256 bytes at every
/// 1024 (`chunks` of them, the first four in the header's map), `size` bytes of data, and the
/// `isextended` flag as given.
pub fn gnu_sparse_header(chunks: u64, size: u64, extended: bool) -> Header {
    let mut h = Header::new_gnu();
    h.set_path("checkpoint/pages-2.img").unwrap();
    h.set_entry_type(EntryType::GNUSparse);
    h.set_size(size);
    h.set_mode(0o600);
    let gnu = h.as_gnu_mut().unwrap();
    for (i, entry) in gnu.sparse.iter_mut().enumerate().take(chunks.min(4) as usize) {
        entry.set_offset(i as u64 * 1024);
        entry.set_length(256);
    }
    gnu.set_real_size(chunks * 1024);
    gnu.set_is_extended(extended);
    h.set_cksum();
    h
}

/// An extension block of a GNU sparse map with entries at the given chunk indices.
pub fn gnu_sparse_extension(chunks: &[u64], extended: bool) -> Vec<u8> {
    let mut ext = tar::GnuExtSparseHeader::new();
    for (entry, &i) in ext.sparse_mut().iter_mut().zip(chunks) {
        entry.set_offset(i * 1024);
        entry.set_length(256);
    }
    ext.isextended[0] = u8::from(extended);
    ext.as_bytes().to_vec()
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

// --- the readers an archive must agree with ---

/// A name as an extractor resolves it: components, `.` and empty ones dropped (`./checkpoint//x/`
/// is `checkpoint/x`; readers differ only in how they print a trailing `/`).
pub fn normalized(name: &[u8]) -> Vec<u8> {
    name.split(|&b| b == b'/').filter(|c| !c.is_empty() && *c != b".").collect::<Vec<_>>().join(&b'/')
}

/// The uncompressed tar of an archive file, for the oracles (the compression names nothing).
pub fn decompressed(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    match bytes {
        [0x1f, 0x8b, ..] => {
            flate2::read::MultiGzDecoder::new(bytes).read_to_end(&mut out).unwrap();
        }
        [0x28, 0xb5, 0x2f, 0xfd, ..] | [_, 0x2a, 0x4d, 0x18, ..] => {
            zstd::stream::read::Decoder::new(bytes).unwrap().read_to_end(&mut out).unwrap();
        }
        _ => out = bytes.to_vec(),
    }
    out
}

pub const GNU_TAR: &str = "/usr/bin/tar";

/// Python's `tarfile`, listing every member's name as bytes, one hex string a line.
const PYTHON_LIST: &str = r#"
import os, sys, tarfile
with tarfile.open(sys.argv[1], "r:") as t:
    for m in t.getmembers():
        print(os.fsencode(m.name).hex())
"#;

/// Whether GNU tar and Python's `tarfile` are there to compare with. Where one is missing the
/// differential checks say so loudly and are skipped, unless `CCM_REQUIRE_TEST_DOUBLES=1` (CI), where
/// that is a failure.
pub fn oracles_present() -> bool {
    static PRESENT: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    let present = PRESENT.get_or_init(|| {
        let tar = Command::new(GNU_TAR).arg("--version").output();
        match tar {
            Ok(out) if out.status.success() && String::from_utf8_lossy(&out.stdout).contains("GNU tar") => {}
            Ok(_) => return Err(format!("{GNU_TAR} is not GNU tar")),
            Err(e) => return Err(format!("GNU tar ({GNU_TAR}) cannot run: {e}")),
        }
        match Command::new("python3").args(["-c", "import tarfile"]).output() {
            Ok(out) if out.status.success() => Ok(()),
            Ok(out) => Err(format!("python3 has no tarfile: {}", String::from_utf8_lossy(&out.stderr))),
            Err(e) => Err(format!("python3 cannot run: {e}")),
        }
    });
    match present {
        Ok(()) => true,
        Err(why) => {
            assert!(
                std::env::var("CCM_REQUIRE_TEST_DOUBLES").as_deref() != Ok("1"),
                "the archive reader's differential needs GNU tar and Python: {why}"
            );
            eprintln!(
                "######## ccm-archive differential: {why}; the comparison with other tar readers is skipped ########"
            );
            false
        }
    }
}

/// GNU tar's member names (`tar -t`), unescaped, or why it failed.
pub fn gnu_tar_names(tar: &Path) -> Result<Vec<Vec<u8>>, String> {
    let out = Command::new(GNU_TAR)
        .env("LC_ALL", "C")
        .args(["--quoting-style=escape", "-tf"])
        .arg(tar)
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!("GNU tar: {}: {}", out.status, String::from_utf8_lossy(&out.stderr)));
    }
    Ok(lines(&out.stdout).map(unescape).collect())
}

/// The lines of an oracle's output: an empty line is an empty name.
fn lines(out: &[u8]) -> impl Iterator<Item = &[u8]> {
    out.strip_suffix(b"\n").unwrap_or(out).split(|&b| b == b'\n').filter(move |_| !out.is_empty())
}

/// Undoes GNU tar's `escape` quoting style: C escapes and three-digit octal.
fn unescape(line: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < line.len() {
        if line[i] != b'\\' || i + 1 == line.len() {
            out.push(line[i]);
            i += 1;
            continue;
        }
        let c = line[i + 1];
        i += 2;
        out.push(match c {
            b'n' => b'\n',
            b't' => b'\t',
            b'r' => b'\r',
            b'a' => 7,
            b'b' => 8,
            b'f' => 12,
            b'v' => 11,
            b'0'..=b'7' => {
                let digits = &line[i - 1..(i + 2).min(line.len())];
                i += digits.len() - 1;
                digits.iter().fold(0u8, |n, d| n.wrapping_mul(8).wrapping_add(d - b'0'))
            }
            other => other,
        });
    }
    out
}

/// Python `tarfile`'s member names, or why it failed.
pub fn python_names(tar: &Path) -> Result<Vec<Vec<u8>>, String> {
    let out = Command::new("python3").args(["-c", PYTHON_LIST]).arg(tar).output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!("python3 tarfile: {}: {}", out.status, String::from_utf8_lossy(&out.stderr)));
    }
    let hex = |h: &[u8]| -> Vec<u8> {
        h.chunks(2).map(|p| u8::from_str_radix(std::str::from_utf8(p).unwrap(), 16).unwrap()).collect()
    };
    Ok(lines(&out.stdout).map(hex).collect())
}

/// An oracle's member names, or why it failed.
pub type Listing = Result<Vec<Vec<u8>>, String>;

/// Each oracle's names for the archive `bytes` (compressed or not), normalized; `None` where the
/// oracles are missing (and that is allowed).
pub fn oracle_names(bytes: &[u8]) -> Option<Vec<(&'static str, Listing)>> {
    if !oracles_present() {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let tar = write(dir.path(), "oracle.tar", &decompressed(bytes));
    let norm = |names: Listing| names.map(|n| n.iter().map(|n| normalized(n)).collect());
    Some(vec![("GNU tar", norm(gnu_tar_names(&tar))), ("Python tarfile", norm(python_names(&tar)))])
}

/// Checks that the member names `ccm_archive` resolves for the archive file at `path` are the names
/// GNU tar and Python's `tarfile` list, in the same order.
pub fn assert_readers_agree(path: &Path) {
    let ours = ccm_archive::member_names(path, &ccm_archive::Limits::default())
        .unwrap_or_else(|e| panic!("member_names refused what read_archive accepted: {e}"));
    let ours: Vec<Vec<u8>> = ours.iter().map(|n| normalized(n)).collect();
    let Some(oracles) = oracle_names(&std::fs::read(path).unwrap()) else { return };
    for (oracle, names) in oracles {
        let names = names.unwrap_or_else(|e| panic!("{oracle} cannot list {}: {e}", path.display()));
        assert_eq!(
            shown_names(&names),
            shown_names(&ours),
            "{oracle} and ccm-archive name {}'s members differently",
            path.display()
        );
    }
}

pub fn shown_names(names: &[Vec<u8>]) -> Vec<String> {
    names.iter().map(|n| String::from_utf8_lossy(n).into_owned()).collect()
}
