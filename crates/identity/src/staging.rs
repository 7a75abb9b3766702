//! The driver's staging pages (issue 47): the rules, with no I/O.
//!
//! `cuCheckpointProcessCheckpoint` copies a process's device memory into its own host memory, into anonymous
//! private read-write mappings the driver creates during that call. CRIU would write those pages through its page
//! walk (about 1.5 GB/s). Instead the plugin copies them into a page file of its own in CRIU's image directory
//! (parallel, all-zero chunks left out as holes), records where each chunk went in the identity image (the
//! [`StagingTable`]) and releases the pages in the task, so that CRIU finds them empty. At restore it fills them
//! back from the page file, every chunk checked against its checksum, before the driver's restore reads them.
//!
//! Here: which memory is staging memory ([`staging_ranges`]: private anonymous read-write, new since the lock: in
//! no mapping the process had before), the table and its rules ([`StagingTable::check`]:
//! a table read from an image is untrusted input), and whether a restored task's mappings can take the table
//! back ([`check_restored`]).

/// The page file of the process whose identity image is `cuda-migrate-<pid>.img` (the pid in its own namespace).
pub fn page_file_name(pid: u32) -> String {
    format!("cuda-migrate-pages-{pid}.img")
}

/// The pid of a page file's name (see [`page_file_name`]); only the canonical decimal form.
pub fn is_page_file_name(name: &str) -> Option<u32> {
    crate::image::pid_in_name(name, "cuda-migrate-pages-", ".img")
}

/// The kernel's page size on every machine this runs on (x86-64, and arm64 with 4 KiB pages); mappings and the
/// page file's extents are aligned to it (the page file is written with `O_DIRECT` where the filesystem takes it).
pub const PAGE_BYTES: u64 = 4096;
/// The chunk the copy works in (one buffer per worker, one checksum, one hole or extent).
pub const DEFAULT_CHUNK_BYTES: u64 = 8 << 20;
/// The smallest and largest chunk a table may name (a table is untrusted at restore: every worker of the fill holds a
/// buffer of one chunk).
pub const MIN_CHUNK_BYTES: u64 = 64 << 10;
pub const MAX_CHUNK_BYTES: u64 = 32 << 20;
/// At most this many staging regions per process.
pub const MAX_REGIONS: usize = 4096;
/// At most this many chunks per process (4 TiB at the default chunk).
pub const MAX_CHUNKS: usize = 1 << 19;

/// What the staging rules need of one line of `/proc/PID/maps`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapView {
    pub start: u64,
    pub end: u64,
    pub readable: bool,
    pub writable: bool,
    pub executable: bool,
    pub shared: bool,
    /// No file behind it and no name (`[heap]`, `[stack]`, `[anon:...]` are named).
    pub anonymous: bool,
}

impl MapView {
    /// Anonymous, private, readable and writable, not executable: what the driver's staging mappings are, and what
    /// a restored task must have where the table says they were.
    pub fn is_private_anonymous_rw(&self) -> bool {
        self.anonymous && !self.shared && self.readable && self.writable && !self.executable
    }
}

/// The staging memory: the parts of `after`'s private anonymous read-write mappings (the maps after the checkpoint)
/// that no mapping of `before` (the maps after the lock, before the checkpoint) covered. Every task is stopped
/// from the lock on and only the driver's checkpoint runs in it, so memory new since the lock is the driver's; a new
/// mapping placed right beside an older one (the kernel places them so) or merged into an older neighbour of the
/// same kind counts for its new part only, and the older part is left to CRIU. Sorted by address, page-aligned.
pub fn staging_ranges(before: &[MapView], after: &[MapView]) -> Vec<(u64, u64)> {
    let mut old: Vec<(u64, u64)> = before.iter().map(|b| (b.start, b.end)).collect();
    old.sort_unstable();
    let mut out = Vec::new();
    for m in after.iter().filter(|m| m.is_private_anonymous_rw() && m.end > m.start) {
        if m.start % PAGE_BYTES != 0 || m.end % PAGE_BYTES != 0 {
            continue;
        }
        // m minus every old range.
        let mut at = m.start;
        for &(s, e) in old.iter().filter(|&&(s, e)| s < m.end && e > m.start) {
            if s > at {
                out.push((at, s));
            }
            at = at.max(e);
        }
        if at < m.end {
            out.push((at, m.end));
        }
    }
    out.sort_unstable();
    out
}

/// Where one chunk of a staging region went.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StagedChunk {
    /// All zero: not in the page file; the restored task's fresh mapping is zero there already.
    Hole,
    /// In the page file at `offset`, its CRC32 `crc`.
    Data { offset: u64, crc: u32 },
}

/// One staging mapping of the dumped process, chunk by chunk.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StagingRegion {
    pub start: u64,
    pub len: u64,
    pub chunks: Vec<StagedChunk>,
}

/// The staging pages the plugin wrote for one process (recorded in its identity image, version 3).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StagingTable {
    pub chunk_bytes: u64,
    /// The page file's size: the data chunks, end to end.
    pub file_bytes: u64,
    pub regions: Vec<StagingRegion>,
}

/// One chunk of a table, placed: where in the task, how long, where in the page file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkPlace {
    pub addr: u64,
    pub len: u64,
    pub chunk: StagedChunk,
}

/// Why a staging table cannot be used (a damaged or forged image), or why a restored task cannot take it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StagingError {
    #[error("the staging table's chunk size {0} is not a power of two between 64 KiB and 32 MiB")]
    ChunkSize(u64),
    #[error("the staging table names {found} {what}, above the limit of {max}")]
    TooMany { what: &'static str, found: usize, max: usize },
    #[error(
        "staging region {index} ({start:#x}, {len} bytes) is empty, not page-aligned or runs past the address space"
    )]
    BadRegion { index: usize, start: u64, len: u64 },
    #[error("staging regions {0} and {1} overlap or are out of order")]
    RegionOrder(usize, usize),
    #[error("staging region {index} has {found} chunks where its length makes {expected}")]
    ChunkCount { index: usize, found: usize, expected: u64 },
    #[error(
        "the staging table's data chunks do not tile its page file of {file_bytes} bytes end to end (at byte {at})"
    )]
    Extents { file_bytes: u64, at: u64 },
    #[error(
        "the restored task has no private anonymous read-write mapping over {start:#x}..{end:#x} (a staging region of \
         the dump): it has {found} there; the images do not belong to this restore, or CRIU restored the mapping \
         differently: the restore is refused before the driver is called"
    )]
    RestoredMapping { start: u64, end: u64, found: String },
    #[error("the driver storage table has {found} chunk regions for {expected} non-empty GPU regions")]
    DriverRegions { found: usize, expected: usize },
}

impl StagingTable {
    /// Bytes of device data the table describes (holes included).
    pub fn region_bytes(&self) -> u64 {
        self.regions.iter().map(|r| r.len).sum()
    }

    /// Chunks left out as all zero.
    pub fn holes(&self) -> usize {
        self.regions.iter().flat_map(|r| &r.chunks).filter(|c| matches!(c, StagedChunk::Hole)).count()
    }

    pub fn chunk_count(&self) -> usize {
        self.regions.iter().map(|r| r.chunks.len()).sum()
    }

    /// Every chunk with its place in the task.
    pub fn places(&self) -> Vec<ChunkPlace> {
        let mut out = Vec::with_capacity(self.chunk_count());
        for r in &self.regions {
            for (i, c) in r.chunks.iter().enumerate() {
                let off = i as u64 * self.chunk_bytes;
                out.push(ChunkPlace { addr: r.start + off, len: self.chunk_bytes.min(r.len - off), chunk: *c });
            }
        }
        out
    }

    /// Checks every rule a table must keep before anything is read or written by it: a chunk size in bounds;
    /// regions page-aligned, in order and apart, each with as many chunks as its length makes; and the data chunks
    /// tiling the page file `[0, file_bytes)` exactly, page-aligned (so no chunk reads outside the file, none
    /// twice, and a file of another size is noticed before any restore).
    pub fn check(&self) -> Result<(), StagingError> {
        let c = self.chunk_bytes;
        if !c.is_power_of_two() || !(MIN_CHUNK_BYTES..=MAX_CHUNK_BYTES).contains(&c) {
            return Err(StagingError::ChunkSize(c));
        }
        if self.regions.len() > MAX_REGIONS {
            return Err(StagingError::TooMany { what: "regions", found: self.regions.len(), max: MAX_REGIONS });
        }
        let chunks = self.chunk_count();
        if chunks > MAX_CHUNKS {
            return Err(StagingError::TooMany { what: "chunks", found: chunks, max: MAX_CHUNKS });
        }
        let mut extents = Vec::new();
        for (index, r) in self.regions.iter().enumerate() {
            let bad = r.len == 0
                || r.start % PAGE_BYTES != 0
                || r.len % PAGE_BYTES != 0
                || r.start.checked_add(r.len).is_none_or(|e| e > 1 << 57);
            if bad {
                return Err(StagingError::BadRegion { index, start: r.start, len: r.len });
            }
            if index > 0 {
                let p = &self.regions[index - 1];
                if p.start + p.len > r.start {
                    return Err(StagingError::RegionOrder(index - 1, index));
                }
            }
            let expected = r.len.div_ceil(c);
            if r.chunks.len() as u64 != expected {
                return Err(StagingError::ChunkCount { index, found: r.chunks.len(), expected });
            }
            for (i, ch) in r.chunks.iter().enumerate() {
                if let StagedChunk::Data { offset, .. } = ch {
                    let off = i as u64 * c;
                    extents.push((*offset, c.min(r.len - off)));
                }
            }
        }
        extents.sort_unstable();
        let mut at = 0u64;
        for (offset, len) in extents {
            if offset != at {
                return Err(StagingError::Extents { file_bytes: self.file_bytes, at });
            }
            at += len;
        }
        if at != self.file_bytes {
            return Err(StagingError::Extents { file_bytes: self.file_bytes, at });
        }
        Ok(())
    }
}

/// The device memory the driver handed the plugin itself (its custom storage, CUDA 13.4 / driver r615): one region
/// per GPU, copied into the page file by the driver agent instead of through the process's host memory. The regions
/// of data lie end to end in a numbering of their own (`table`'s addresses are not the task's: see
/// [`DriverStorage::places`]), so that the page file, its chunks, checksums and holes and every rule of
/// [`StagingTable::check`] are the staging path's. A region's last chunk may run past its `size` (to the page): those
/// bytes are zero in the page file and never copied to the GPU. An empty region (a GPU the process holds nothing on)
/// has no table region.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DriverStorage {
    /// The GPU each region was on at dump and its exact size, in the driver's order (the restore's regions come in
    /// the same order, on the GPUs the device map names).
    pub regions: Vec<DriverRegion>,
    pub table: StagingTable,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DriverRegion {
    pub gpu: crate::GpuUuid,
    pub size: u64,
}

impl DriverStorage {
    /// Where each non-empty region of `sizes` lies in the table's numbering: `(index among sizes, start, len)`, the
    /// first at 0, each at the page-rounded end of the one before. `None` past the address space.
    pub fn places(sizes: &[u64]) -> Option<Vec<(usize, u64, u64)>> {
        let mut at = 0u64;
        let mut out = Vec::new();
        for (i, &size) in sizes.iter().enumerate().filter(|(_, s)| **s > 0) {
            let len = size.checked_next_multiple_of(PAGE_BYTES)?;
            out.push((i, at, len));
            at = at.checked_add(len)?;
        }
        Some(out)
    }

    /// The staging table's rules, and the numbering: one table region per non-empty driver region, each where
    /// [`DriverStorage::places`] puts it.
    pub fn check(&self) -> Result<(), StagingError> {
        self.table.check()?;
        let sizes: Vec<u64> = self.regions.iter().map(|r| r.size).collect();
        let places = DriverStorage::places(&sizes).unwrap_or_default();
        if places.len() != self.table.regions.len() {
            return Err(StagingError::DriverRegions { found: self.table.regions.len(), expected: places.len() });
        }
        for (index, (r, &(_, start, len))) in self.table.regions.iter().zip(&places).enumerate() {
            if (r.start, r.len) != (start, len) {
                return Err(StagingError::BadRegion { index, start: r.start, len: r.len });
            }
        }
        Ok(())
    }

    /// Each non-empty driver region (its index in the driver's order, size) with its table region.
    pub fn regions_with_chunks(&self) -> impl Iterator<Item = (usize, u64, &StagingRegion)> {
        self.regions
            .iter()
            .enumerate()
            .filter(|(_, r)| r.size > 0)
            .zip(&self.table.regions)
            .map(|((i, r), t)| (i, r.size, t))
    }

    /// Bytes of device memory (the regions' exact sizes).
    pub fn device_bytes(&self) -> u64 {
        self.regions.iter().map(|r| r.size).sum()
    }
}

/// Whether the restored task's mappings (`maps`, sorted as `/proc/PID/maps` lists them) cover every region of the
/// table with private anonymous read-write memory, one mapping or several end to end (the kernel may merge a
/// restored region with a neighbour of the same kind). The first region that is not so, named.
pub fn check_restored(table: &StagingTable, maps: &[MapView]) -> Result<(), StagingError> {
    for r in &table.regions {
        let end = r.start + r.len;
        let mut at = r.start;
        while at < end {
            match maps.iter().find(|m| m.start <= at && at < m.end) {
                Some(m) if m.is_private_anonymous_rw() => at = m.end,
                Some(m) => {
                    return Err(StagingError::RestoredMapping {
                        start: r.start,
                        end,
                        found: format!(
                            "{:#x}..{:#x} {}{}{}{} {}",
                            m.start,
                            m.end,
                            if m.readable { 'r' } else { '-' },
                            if m.writable { 'w' } else { '-' },
                            if m.executable { 'x' } else { '-' },
                            if m.shared { 's' } else { 'p' },
                            if m.anonymous { "anonymous" } else { "file-backed or named" }
                        ),
                    })
                }
                None => {
                    return Err(StagingError::RestoredMapping {
                        start: r.start,
                        end,
                        found: format!("nothing mapped at {at:#x}"),
                    })
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn anon(start: u64, end: u64) -> MapView {
        MapView { start, end, readable: true, writable: true, executable: false, shared: false, anonymous: true }
    }

    #[test]
    fn page_file_names_round_trip_and_refuse_other_forms() {
        assert_eq!(is_page_file_name(&page_file_name(4242)), Some(4242));
        for bad in ["cuda-migrate-pages-007.img", "cuda-migrate-pages-.img", "cuda-migrate-pages-1.imgx", "x"] {
            assert_eq!(is_page_file_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_new_parts_of_private_anonymous_rw_mappings_are_staging() {
        let before = vec![anon(0x1000, 0x3000), anon(0x10000, 0x20000)];
        let mut file = anon(0x50000, 0x60000);
        file.anonymous = false;
        let mut shared = anon(0x60000, 0x70000);
        shared.shared = true;
        let mut ro = anon(0x70000, 0x80000);
        ro.writable = false;
        let after = vec![
            anon(0x1000, 0x3000),   // old
            anon(0x3000, 0x8000),   // new, right beside an old one
            anon(0x10000, 0x30000), // an old one that grew (or a new one merged into it): its new part
            anon(0x40000, 0x48000), // new
            file,
            shared,
            ro,
        ];
        assert_eq!(staging_ranges(&before, &after), vec![(0x3000, 0x8000), (0x20000, 0x30000), (0x40000, 0x48000)]);
    }

    fn table(regions: Vec<(u64, u64, Vec<bool>)>) -> StagingTable {
        let chunk_bytes = MIN_CHUNK_BYTES;
        let mut file_bytes = 0;
        let regions = regions
            .into_iter()
            .map(|(start, len, data)| {
                let chunks = data
                    .iter()
                    .enumerate()
                    .map(|(i, &d)| {
                        if !d {
                            return StagedChunk::Hole;
                        }
                        let l = chunk_bytes.min(len - i as u64 * chunk_bytes);
                        let c = StagedChunk::Data { offset: file_bytes, crc: 7 };
                        file_bytes += l;
                        c
                    })
                    .collect();
                StagingRegion { start, len, chunks }
            })
            .collect();
        StagingTable { chunk_bytes, file_bytes, regions }
    }

    #[test]
    fn a_well_formed_table_passes_and_places_its_chunks() {
        let t = table(vec![(0x100000, 2 * MIN_CHUNK_BYTES + PAGE_BYTES, vec![true, false, true])]);
        t.check().unwrap();
        assert_eq!(t.file_bytes, MIN_CHUNK_BYTES + PAGE_BYTES);
        assert_eq!(t.holes(), 1);
        let p = t.places();
        assert_eq!(p[2].addr, 0x100000 + 2 * MIN_CHUNK_BYTES);
        assert_eq!(p[2].len, PAGE_BYTES);
    }

    #[test]
    fn forged_tables_are_refused_naming_the_rule() {
        let good = table(vec![(0x100000, 2 * MIN_CHUNK_BYTES, vec![true, true]), (0x400000, PAGE_BYTES, vec![true])]);
        good.check().unwrap();
        let mut t = good.clone();
        t.chunk_bytes = 3 << 20;
        assert!(matches!(t.check(), Err(StagingError::ChunkSize(_))));
        let mut t = good.clone();
        t.file_bytes += PAGE_BYTES;
        assert!(matches!(t.check(), Err(StagingError::Extents { .. })));
        let mut t = good.clone();
        t.regions[1].chunks[0] = StagedChunk::Data { offset: 0, crc: 1 };
        assert!(matches!(t.check(), Err(StagingError::Extents { .. })), "a chunk read twice");
        let mut t = good.clone();
        t.regions[1].start = 0x100000 + PAGE_BYTES;
        assert!(matches!(t.check(), Err(StagingError::RegionOrder(0, 1))));
        let mut t = good.clone();
        t.regions[0].chunks.pop();
        assert!(matches!(t.check(), Err(StagingError::ChunkCount { index: 0, .. })));
        let mut t = good;
        t.regions[0].start += 1;
        assert!(matches!(t.check(), Err(StagingError::BadRegion { index: 0, .. })));
    }

    #[test]
    fn a_restored_task_must_have_private_anonymous_rw_memory_over_every_region() {
        let t = table(vec![(0x100000, 0x20000, vec![true])]);
        check_restored(&t, &[anon(0xf0000, 0x110000), anon(0x110000, 0x200000)]).unwrap();
        let err = check_restored(&t, &[anon(0x100000, 0x110000)]).unwrap_err();
        assert!(err.to_string().contains("nothing mapped at 0x110000"), "{err}");
        let mut shared = anon(0x100000, 0x120000);
        shared.shared = true;
        let err = check_restored(&t, &[shared]).unwrap_err();
        assert!(err.to_string().contains("rw-s"), "{err}");
    }

    proptest! {
        #[test]
        fn staging_ranges_never_overlap_an_old_mapping(
            before in proptest::collection::vec((0u64..64, 1u64..8), 0..8),
            after in proptest::collection::vec((0u64..64, 1u64..8), 0..8),
        ) {
            let to = |v: Vec<(u64, u64)>| v.into_iter().map(|(s, l)| anon(s * PAGE_BYTES, (s + l) * PAGE_BYTES)).collect::<Vec<_>>();
            let (before, after) = (to(before), to(after));
            for (s, e) in staging_ranges(&before, &after) {
                prop_assert!(before.iter().all(|b| b.end <= s || e <= b.start));
            }
        }
    }
}
