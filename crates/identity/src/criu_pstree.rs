//! CRIU's `pstree.img`, read from its bytes: the pid, process group, session and threads of every process of
//! a checkpoint, as the dumped tree's pid namespace numbered them.
//!
//! The format (CRIU's `criu/include/magic.h`, `images/pstree.proto`): two little-endian `u32` magics, the
//! images' common one ([`IMG_COMMON_MAGIC`]) and [`PSTREE_MAGIC`], then one entry per process, each a
//! little-endian `u32` length and that many bytes of a protobuf `pstree_entry { required uint32 pid = 1;
//! required uint32 ppid = 2; required uint32 pgid = 3; required uint32 sid = 4; repeated uint32 threads = 5; }`
//! (protobuf-c writes `threads` unpacked; packed is read too). Every count and size is capped; no input panics.

use crate::pid::NsPid;

/// The file's name in CRIU's image directory.
pub const PSTREE_FILE: &str = "pstree.img";
/// The first word of every CRIU image but the service files (`IMG_COMMON_MAGIC`, "Sarov").
pub const IMG_COMMON_MAGIC: u32 = 0x5456_4319;
/// The second word of `pstree.img` (`PSTREE_MAGIC`, "Kyiv").
pub const PSTREE_MAGIC: u32 = 0x5027_3030;
/// The most of `pstree.img` read: 65536 processes of 16 threads take about 6 MiB.
pub const MAX_PSTREE_BYTES: u64 = 16 << 20;
/// The most processes read.
pub const MAX_ENTRIES: usize = 1 << 16;
/// The most thread ids read, over all processes.
pub const MAX_THREADS: usize = 1 << 20;

/// One process of the checkpoint, numbered in the dumped tree's pid namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PstreeEntry {
    pub pid: NsPid,
    /// Its process group id.
    pub pgid: NsPid,
    /// Its session id.
    pub sid: NsPid,
    /// Its threads' ids (the main thread's is `pid`).
    pub threads: Vec<NsPid>,
}

/// Why `pstree.img` could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PstreeError {
    #[error("pstree.img holds {len} bytes, more than the {MAX_PSTREE_BYTES} read of it")]
    TooLarge { len: usize },
    #[error("pstree.img is {len} bytes long, too short for its two magic words")]
    NoMagic { len: usize },
    #[error("pstree.img starts with {found:#010x} where CRIU's images have {expected:#010x} ({which})")]
    BadMagic { which: &'static str, found: u32, expected: u32 },
    #[error("pstree.img: entry {index} at offset {offset} is cut: {why}")]
    Truncated { index: usize, offset: usize, why: &'static str },
    #[error("pstree.img: entry {index} is malformed: {why}")]
    Malformed { index: usize, why: &'static str },
    #[error("pstree.img holds more than {MAX_ENTRIES} processes")]
    TooManyEntries,
    #[error("pstree.img holds more than {MAX_THREADS} threads")]
    TooManyThreads,
}

fn u32_le(bytes: &[u8], at: usize) -> Option<u32> {
    let b = bytes.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// Reads `pstree.img`'s bytes into its entries, in the file's order.
pub fn decode(bytes: &[u8]) -> Result<Vec<PstreeEntry>, PstreeError> {
    if u64::try_from(bytes.len()).map_or(true, |n| n > MAX_PSTREE_BYTES) {
        return Err(PstreeError::TooLarge { len: bytes.len() });
    }
    let (Some(common), Some(pstree)) = (u32_le(bytes, 0), u32_le(bytes, 4)) else {
        return Err(PstreeError::NoMagic { len: bytes.len() });
    };
    if common != IMG_COMMON_MAGIC {
        return Err(PstreeError::BadMagic { which: "IMG_COMMON_MAGIC", found: common, expected: IMG_COMMON_MAGIC });
    }
    if pstree != PSTREE_MAGIC {
        return Err(PstreeError::BadMagic { which: "PSTREE_MAGIC", found: pstree, expected: PSTREE_MAGIC });
    }
    let mut entries = Vec::new();
    let mut threads_total = 0usize;
    let mut at = 8usize;
    while at < bytes.len() {
        let index = entries.len();
        if index == MAX_ENTRIES {
            return Err(PstreeError::TooManyEntries);
        }
        let len = u32_le(bytes, at).ok_or(PstreeError::Truncated { index, offset: at, why: "its length word" })?;
        let start = at + 4;
        let end = usize::try_from(len)
            .ok()
            .and_then(|l| start.checked_add(l))
            .filter(|e| *e <= bytes.len())
            .ok_or(PstreeError::Truncated { index, offset: at, why: "its length runs past the file's end" })?;
        let entry = decode_entry(&bytes[start..end], index, MAX_THREADS - threads_total)?;
        threads_total += entry.threads.len();
        entries.push(entry);
        at = end;
    }
    Ok(entries)
}

/// A protobuf varint at `*at`, at most 10 bytes; `None` when cut or too long.
fn varint(bytes: &[u8], at: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..70).step_by(7) {
        let b = *bytes.get(*at)?;
        *at += 1;
        value |= u64::from(b & 0x7f).checked_shl(shift).unwrap_or(0);
        if b & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

/// One `pstree_entry` message; `threads_left` is what [`MAX_THREADS`] still allows.
fn decode_entry(msg: &[u8], index: usize, threads_left: usize) -> Result<PstreeEntry, PstreeError> {
    let bad = |why| PstreeError::Malformed { index, why };
    let as_u32 = |v: u64| u32::try_from(v).map_err(|_| bad("a uint32 field holds a value over 2^32"));
    let mut fields: [Option<u32>; 4] = [None; 4];
    let mut threads = Vec::new();
    let push_thread = |threads: &mut Vec<NsPid>, v: u64| -> Result<(), PstreeError> {
        if threads.len() >= threads_left {
            return Err(PstreeError::TooManyThreads);
        }
        threads.push(NsPid(as_u32(v)?));
        Ok(())
    };
    let mut at = 0usize;
    while at < msg.len() {
        let key = varint(msg, &mut at).ok_or(bad("a field's key is cut"))?;
        let number = key >> 3;
        match (number, key & 7) {
            (1..=4, 0) => {
                let v = varint(msg, &mut at).ok_or(bad("a varint is cut"))?;
                // In range: `number` is 1..=4.
                let slot = usize::try_from(number - 1).map_err(|_| bad("a field number out of range"))?;
                fields[slot] = Some(as_u32(v)?);
            }
            (5, 0) => {
                let v = varint(msg, &mut at).ok_or(bad("a thread id is cut"))?;
                push_thread(&mut threads, v)?;
            }
            (5, 2) => {
                let len = varint(msg, &mut at).ok_or(bad("the packed threads' length is cut"))?;
                let end = usize::try_from(len)
                    .ok()
                    .and_then(|l| at.checked_add(l))
                    .filter(|e| *e <= msg.len())
                    .ok_or(bad("the packed threads run past the entry's end"))?;
                let packed = &msg[..end];
                while at < end {
                    let v = varint(packed, &mut at).ok_or(bad("a packed thread id is cut"))?;
                    push_thread(&mut threads, v)?;
                }
            }
            (0, _) => return Err(bad("field number 0")),
            (1..=5, _) => return Err(bad("a known field with the wrong wire type")),
            // Fields CRIU may add: skipped by their wire type.
            (_, 0) => {
                varint(msg, &mut at).ok_or(bad("an unknown varint field is cut"))?;
            }
            (_, 1) => at = skip(msg, at, 8).ok_or(bad("an unknown 64-bit field is cut"))?,
            (_, 5) => at = skip(msg, at, 4).ok_or(bad("an unknown 32-bit field is cut"))?,
            (_, 2) => {
                let len = varint(msg, &mut at).ok_or(bad("an unknown field's length is cut"))?;
                let len = usize::try_from(len).map_err(|_| bad("an unknown field's length is too large"))?;
                at = skip(msg, at, len).ok_or(bad("an unknown field runs past the entry's end"))?;
            }
            _ => return Err(bad("a group or an unknown wire type")),
        }
    }
    let [Some(pid), Some(_ppid), Some(pgid), Some(sid)] = fields else {
        return Err(bad("a required field (pid, ppid, pgid or sid) is missing"));
    };
    Ok(PstreeEntry { pid: NsPid(pid), pgid: NsPid(pgid), sid: NsPid(sid), threads })
}

fn skip(msg: &[u8], at: usize, n: usize) -> Option<usize> {
    at.checked_add(n).filter(|e| *e <= msg.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put_varint(out: &mut Vec<u8>, mut v: u64) {
        loop {
            let b = u8::try_from(v & 0x7f).unwrap();
            v >>= 7;
            if v == 0 {
                out.push(b);
                return;
            }
            out.push(b | 0x80);
        }
    }

    /// An entry as protobuf-c writes it (threads unpacked), or packed.
    fn entry(pid: u32, ppid: u32, pgid: u32, sid: u32, threads: &[u32], packed: bool) -> Vec<u8> {
        let mut m = Vec::new();
        for (n, v) in [(1u64, pid), (2, ppid), (3, pgid), (4, sid)] {
            put_varint(&mut m, n << 3);
            put_varint(&mut m, v.into());
        }
        if packed {
            let mut p = Vec::new();
            threads.iter().for_each(|t| put_varint(&mut p, (*t).into()));
            put_varint(&mut m, (5 << 3) | 2);
            put_varint(&mut m, u64::try_from(p.len()).unwrap());
            m.extend(p);
        } else {
            for t in threads {
                put_varint(&mut m, 5 << 3);
                put_varint(&mut m, (*t).into());
            }
        }
        m
    }

    fn file(entries: &[Vec<u8>]) -> Vec<u8> {
        let mut f = Vec::new();
        f.extend(IMG_COMMON_MAGIC.to_le_bytes());
        f.extend(PSTREE_MAGIC.to_le_bytes());
        for e in entries {
            f.extend(u32::try_from(e.len()).unwrap().to_le_bytes());
            f.extend(e);
        }
        f
    }

    fn ns(v: &[u32]) -> Vec<NsPid> {
        v.iter().map(|p| NsPid(*p)).collect()
    }

    #[test]
    fn a_tree_reads_with_packed_and_unpacked_threads() {
        let bytes = file(&[
            entry(4242, 1, 4242, 100, &[4242, 4243, 4250], false),
            entry(4300, 4242, 4242, 100, &[4300], true),
            entry(70000, 4242, 70000, 70000, &[], false),
        ]);
        let got = decode(&bytes).unwrap();
        assert_eq!(got.len(), 3);
        assert_eq!(
            got[0],
            PstreeEntry { pid: NsPid(4242), pgid: NsPid(4242), sid: NsPid(100), threads: ns(&[4242, 4243, 4250]) }
        );
        assert_eq!(got[1].threads, ns(&[4300]));
        assert_eq!((got[2].pid, got[2].pgid, got[2].sid), (NsPid(70000), NsPid(70000), NsPid(70000)));
        assert!(got[2].threads.is_empty());
        // The magics alone: an empty tree.
        assert_eq!(decode(&file(&[])), Ok(Vec::new()));
    }

    #[test]
    fn unknown_fields_are_skipped() {
        let mut e = entry(7, 1, 7, 7, &[7], false);
        // field 6 varint, field 7 length-delimited, field 8 fixed32, field 9 fixed64
        e.extend([6 << 3, 0x96, 0x01, (7 << 3) | 2, 2, 0xaa, 0xbb, (8 << 3) | 5, 1, 2, 3, 4, (9 << 3) | 1]);
        e.extend([0; 8]);
        let got = decode(&file(&[e])).unwrap();
        assert_eq!(got[0].pid, NsPid(7));
        assert_eq!(got[0].threads, ns(&[7]));
    }

    #[test]
    fn wrong_magics_and_short_files_are_refused() {
        assert_eq!(decode(&[]), Err(PstreeError::NoMagic { len: 0 }));
        assert_eq!(decode(&[0x19, 0x43, 0x56, 0x54, 0x30]), Err(PstreeError::NoMagic { len: 5 }));
        let mut b = file(&[]);
        b[0] ^= 1;
        assert!(matches!(decode(&b), Err(PstreeError::BadMagic { which: "IMG_COMMON_MAGIC", .. })));
        let mut b = file(&[]);
        // core.img's magic where pstree's belongs.
        b[4..8].copy_from_slice(&0x5505_3847u32.to_le_bytes());
        let e = decode(&b).unwrap_err();
        assert!(matches!(e, PstreeError::BadMagic { which: "PSTREE_MAGIC", found: 0x5505_3847, .. }), "{e}");
        assert!(e.to_string().contains("0x55053847"), "{e}");
    }

    #[test]
    fn cut_and_malformed_entries_are_refused() {
        let good = file(&[entry(5, 1, 5, 5, &[5], false)]);
        // Cut anywhere inside the entry (or its length word).
        for cut in 9..good.len() {
            assert!(decode(&good[..cut]).is_err(), "cut at {cut}");
        }
        // A length past the end.
        let mut b = file(&[]);
        b.extend(u32::MAX.to_le_bytes());
        assert!(matches!(decode(&b), Err(PstreeError::Truncated { index: 0, offset: 8, .. })));
        // A required field missing (no sid).
        let mut e = Vec::new();
        for (n, v) in [(1u8, 5u8), (2, 1), (3, 5)] {
            e.extend([n << 3, v]);
        }
        assert!(matches!(decode(&file(&[e])), Err(PstreeError::Malformed { index: 0, .. })));
        // pid as a fixed32: a known field with the wrong wire type.
        let mut e = entry(5, 1, 5, 5, &[], false);
        e.extend([(1 << 3) | 5, 0, 0, 0, 0]);
        assert!(matches!(decode(&file(&[e])), Err(PstreeError::Malformed { .. })));
        // A value over u32.
        let mut e = entry(5, 1, 5, 5, &[], false);
        e.push(3 << 3);
        put_varint(&mut e, 1 << 40);
        assert!(matches!(decode(&file(&[e])), Err(PstreeError::Malformed { .. })));
        // An eleven-byte varint.
        let mut e = entry(5, 1, 5, 5, &[], false);
        e.push(5 << 3);
        e.extend([0xff; 10]);
        e.push(0);
        assert!(matches!(decode(&file(&[e])), Err(PstreeError::Malformed { .. })));
        // A group (wire type 3).
        let mut e = entry(5, 1, 5, 5, &[], false);
        e.push((9 << 3) | 3);
        assert!(matches!(decode(&file(&[e])), Err(PstreeError::Malformed { .. })));
        // Packed threads whose length runs past the entry.
        let mut e = entry(5, 1, 5, 5, &[], false);
        e.extend([(5 << 3) | 2, 9, 5]);
        assert!(matches!(decode(&file(&[e])), Err(PstreeError::Malformed { .. })));
    }

    #[test]
    fn counts_and_size_are_capped() {
        let too_large = vec![0u8; usize::try_from(MAX_PSTREE_BYTES).unwrap() + 1];
        assert!(matches!(decode(&too_large), Err(PstreeError::TooLarge { .. })));
        // More entries than allowed: the smallest entries (pid 1..4 = 1, 8 bytes + 4 of length).
        let one = entry(1, 1, 1, 1, &[], false);
        let bytes = file(&vec![one; MAX_ENTRIES + 1]);
        assert_eq!(decode(&bytes), Err(PstreeError::TooManyEntries));
        // More threads than allowed, over two entries.
        let half = vec![9u32; MAX_THREADS / 2 + 1];
        let bytes = file(&[entry(9, 1, 9, 9, &half, true), entry(9, 1, 9, 9, &half, true)]);
        assert_eq!(decode(&bytes), Err(PstreeError::TooManyThreads));
    }

    proptest::proptest! {
        #[test]
        fn decoding_never_panics(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
            let _ = decode(&bytes);
        }

        #[test]
        fn decoding_behind_the_magics_never_panics(
            body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512),
        ) {
            let mut bytes = file(&[]);
            bytes.extend(body);
            let _ = decode(&bytes);
        }

        #[test]
        fn any_tree_reads_back(
            procs in proptest::collection::vec(
                (1u32..1 << 22, 1u32..1 << 22, 1u32..1 << 22, proptest::collection::vec(1u32..1 << 22, 0..8), proptest::prelude::any::<bool>()),
                0..16,
            ),
        ) {
            let bytes = file(&procs.iter().map(|(p, g, s, t, packed)| entry(*p, 1, *g, *s, t, *packed)).collect::<Vec<_>>());
            let got = decode(&bytes).unwrap();
            proptest::prop_assert_eq!(got.len(), procs.len());
            for (e, (p, g, s, t, _)) in got.iter().zip(&procs) {
                proptest::prop_assert_eq!(e, &PstreeEntry { pid: NsPid(*p), pgid: NsPid(*g), sid: NsPid(*s), threads: ns(t) });
            }
        }
    }
}
