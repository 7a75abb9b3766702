//! Another process's memory through `/proc/PID/mem`, and the scan for libcuda's PCI identity words.
//!
//! `/proc/PID/mem` is read and written with `pread`/`pwrite` at the target's virtual address.
//! This works while the target runs or is ptrace-stopped, provided the caller may ptrace-attach to
//! it (root, or CRIU as its tracer). Writes go through even to read-only pages (the kernel uses
//! `FOLL_FORCE`), so callers must only write where they have verified what is there.

use crate::maps::{read_maps, Mapping, ScanScope};
use crate::procfs::{io_error, proc_path};
use crate::{ProcessError, SiteError};
use ccm_identity::devprop::{self, PropSite};
use ccm_identity::pattern::{self, find_signatures};
use ccm_identity::PciSite;
use ccm_identity::{GpuIdentity, GpuUuid, PciSignature};
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// An open `/proc/PID/mem` of one process.
#[derive(Debug)]
pub struct ProcessMemory {
    pid: u32,
    path: PathBuf,
    file: File,
}

impl ProcessMemory {
    /// Opens `/proc/PID/mem` for reading only (scans, verification).
    pub fn open_read_only(pid: u32) -> Result<Self, ProcessError> {
        Self::open(pid, false)
    }

    /// Opens `/proc/PID/mem` for reading and writing (rewrites).
    pub fn open_read_write(pid: u32) -> Result<Self, ProcessError> {
        Self::open(pid, true)
    }

    fn open(pid: u32, write: bool) -> Result<Self, ProcessError> {
        let path = proc_path(pid, "mem");
        let file =
            File::options().read(true).write(write).open(&path).map_err(|e| io_error(pid, "opening", &path, e))?;
        Ok(ProcessMemory { pid, path, file })
    }

    /// The process this memory belongs to.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    fn access_error(&self, action: &'static str, addr: u64, len: usize, err: io::Error) -> ProcessError {
        match err.raw_os_error() {
            // The kernel answers EIO when the first page of the range is not mapped (or not
            // accessible even with FOLL_FORCE).
            Some(libc::EIO) | Some(libc::EFAULT) => {
                ProcessError::Unmapped { pid: self.pid, action, addr, len, source: err }
            }
            _ => io_error(self.pid, action, &self.path, err),
        }
    }

    /// One `pread` at `addr`: returns how many bytes were read. 0 means the process's address
    /// space is gone (it exited); a short count means the range crosses the end of a mapping.
    pub fn read_at(&self, addr: u64, buf: &mut [u8]) -> Result<usize, ProcessError> {
        loop {
            match self.file.read_at(buf, addr) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.access_error("read", addr, buf.len(), e)),
            }
        }
    }

    /// Reads exactly `buf.len()` bytes at `addr`.
    pub fn read_exact_at(&self, addr: u64, buf: &mut [u8]) -> Result<(), ProcessError> {
        let mut done = 0;
        while done < buf.len() {
            let n = self.read_at(addr + done as u64, &mut buf[done..])?;
            if n == 0 {
                return Err(ProcessError::Short { pid: self.pid, action: "read", addr, wanted: buf.len(), done });
            }
            done += n;
        }
        Ok(())
    }

    /// Writes all of `data` at `addr` (the memory must have been opened read-write).
    pub fn write_all_at(&self, addr: u64, data: &[u8]) -> Result<(), ProcessError> {
        let mut done = 0;
        while done < data.len() {
            let at = addr + done as u64;
            match self.file.write_at(&data[done..], at) {
                Ok(0) => {
                    return Err(ProcessError::Short { pid: self.pid, action: "write", addr, wanted: data.len(), done })
                }
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.access_error("write", at, data.len() - done, e)),
            }
        }
        Ok(())
    }
}

/// What [`scan_signatures`] found and what it cost.
#[derive(Clone, Debug, Default)]
pub struct ScanReport {
    /// Every place holding one of the wanted signatures, in address order per mapping.
    pub sites: Vec<PciSite>,
    /// Bytes read from the target.
    pub bytes_scanned: u64,
    /// Mappings read (fully or up to the point where they stopped being readable).
    pub mappings_scanned: usize,
    /// Mappings not read: not scannable (see [`crate::is_scannable`]) or unreadable from the start
    /// (unmapped since `/proc/PID/maps` was read; logged at warn level).
    pub mappings_skipped: usize,
    /// Wall time of the scan.
    pub elapsed: Duration,
    /// The CUDA runtime's `cudaDeviceProp` copies identified (see `ccm_identity::devprop`).
    pub prop_sites: Vec<PropSite>,
    /// Look-alikes of such copies, left alone.
    pub prop_lookalikes: usize,
    /// Bytes of the scanned mappings not read because no page backs them (never touched: they read as zeros,
    /// which hold no identity word, and reading them would make the kernel fault every page in for the target).
    pub bytes_not_resident: u64,
    /// Why the scan stopped before the end, if it did: its byte budget or its deadline ([`ScanLimits`]).
    pub stopped: Option<ScanStop>,
}

/// Why a scan stopped before the end of its mappings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ScanStop {
    #[error("its deadline of {} s passed", .0.as_secs())]
    Deadline(Duration),
    #[error("it read its budget of {} MiB of resident memory", .0 >> 20)]
    ProcessBudget(u64),
    #[error("the dump's scans read their budget of {} MiB together", DUMP_SCAN_BYTES >> 20)]
    DumpBudget,
}

/// Takes `n` from `left`; false when fewer are left (nothing is taken then).
fn take_from(left: &std::sync::atomic::AtomicU64, n: u64) -> bool {
    use std::sync::atomic::Ordering::SeqCst;
    left.fetch_update(SeqCst, SeqCst, |l| l.checked_sub(n)).is_ok()
}

/// What one scan may cost. A process chooses how much address space it maps (2 TiB of untouched `MAP_NORESERVE`
/// memory costs it nothing), so the scan reads only resident pages, at most `bytes` of them (shared with every other
/// scan of the same dump through [`DumpScanBudget`]), and stops at `deadline`.
#[derive(Debug, Clone, Copy)]
pub struct ScanLimits {
    pub bytes: u64,
    pub deadline: Duration,
}

impl ScanLimits {
    /// A process's scan: 4 GiB of resident memory (a PyTorch process with a model's host copy scanned 1.7 GiB),
    /// 20 s (1.7 GiB took 0.58 s).
    pub const PROCESS: ScanLimits = ScanLimits { bytes: 4 << 30, deadline: Duration::from_secs(20) };
}

/// Resident bytes all scans of one dump may read together (16 GiB), shared by its processes' scans.
pub const DUMP_SCAN_BYTES: u64 = 16 << 30;

/// The dump's shared scan budget: what is left of [`DUMP_SCAN_BYTES`]. One CRIU run is one dump, so the plugin
/// resets it at each `init(DUMP)`.
pub struct DumpScanBudget;

static DUMP_SCAN_LEFT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(DUMP_SCAN_BYTES);

impl DumpScanBudget {
    pub fn reset() {
        DUMP_SCAN_LEFT.store(DUMP_SCAN_BYTES, std::sync::atomic::Ordering::SeqCst);
    }

    /// Takes `n` bytes from the dump's budget; false when fewer are left.
    fn take(n: u64) -> bool {
        take_from(&DUMP_SCAN_LEFT, n)
    }
}

/// One scan's own budget, shared by its worker threads.
struct ScanBudget {
    left: std::sync::atomic::AtomicU64,
    until: Instant,
    limits: ScanLimits,
}

impl ScanBudget {
    fn new(limits: ScanLimits) -> ScanBudget {
        ScanBudget {
            left: std::sync::atomic::AtomicU64::new(limits.bytes),
            until: Instant::now() + limits.deadline,
            limits,
        }
    }

    /// Takes `n` bytes of this scan's and the dump's budget, or says why not.
    fn take(&self, n: u64) -> Result<(), ScanStop> {
        if Instant::now() >= self.until {
            return Err(ScanStop::Deadline(self.limits.deadline));
        }
        if !take_from(&self.left, n) {
            return Err(ScanStop::ProcessBudget(self.limits.bytes));
        }
        if !DumpScanBudget::take(n) {
            return Err(ScanStop::DumpBudget);
        }
        Ok(())
    }
}

/// `/proc/PID/pagemap`: which pages of the target are backed (present, or swapped out).
struct Pagemap {
    file: File,
}

/// Most bytes of pagemap read at once: one scan chunk's pages (8 bytes a page), whatever a caller asks.
const MAX_PAGEMAP_BYTES: usize = (SCAN_CHUNK_BYTES + SCAN_OVERLAP_BYTES) / PAGE_BYTES * 8 + 8;

const PAGE: u64 = 4096;
const PAGE_BYTES: usize = 4096;

impl Pagemap {
    fn open(pid: u32) -> Option<Pagemap> {
        File::open(proc_path(pid, "pagemap")).ok().map(|file| Pagemap { file })
    }

    /// For each page of `[addr, addr + len)`, whether it is backed; `None` when the kernel does not say, or for a
    /// range larger than one scan chunk (the caller then reads it all, within its budget).
    fn backed(&self, addr: u64, len: u64, out: &mut Vec<bool>) -> Option<()> {
        use std::os::unix::fs::FileExt;
        let bytes = usize::try_from(len.div_ceil(PAGE)).ok()?.checked_mul(8)?;
        if bytes > MAX_PAGEMAP_BYTES {
            return None;
        }
        let mut raw = vec![0u8; bytes];
        let mut done = 0;
        while done < raw.len() {
            let n = self.file.read_at(&mut raw[done..], (addr / PAGE) * 8 + done as u64).ok()?;
            if n == 0 {
                return None;
            }
            done += n;
        }
        out.clear();
        out.extend(raw.chunks_exact(8).map(|e| {
            let v = u64::from_le_bytes([e[0], e[1], e[2], e[3], e[4], e[5], e[6], e[7]]);
            // Bit 63: present in RAM; bit 62: swapped out.
            v >> 62 != 0
        }));
        Some(())
    }
}

/// Bytes read per `pread`. Large enough that syscall cost is negligible, small enough to keep
/// one worker's buffer cheap.
pub const SCAN_CHUNK_BYTES: usize = 8 << 20;

/// Bytes carried from the end of one chunk to the front of the next, so a signature or a
/// `cudaDeviceProp` span crossing a chunk border is still seen whole. A multiple of 8 keeps each
/// window's base address 8-byte aligned like the chunk size.
const SCAN_OVERLAP_BYTES: usize = 1024;
const _: () = assert!(SCAN_OVERLAP_BYTES >= PciSignature::LEN_BYTES && SCAN_OVERLAP_BYTES >= devprop::MAX_SPAN);

/// Scans every scannable mapping of `pid` (see [`crate::is_scannable`]) for the wanted signatures and
/// returns where each was found.
///
/// The target may run during the scan (a site can then change before it is rewritten, which
/// [`verify_and_write`] catches). Fails if the process is gone or cannot be read at all; a
/// mapping that vanished since its maps were read is skipped with a warning.
pub fn scan_signatures(
    pid: u32,
    wanted: &[(GpuUuid, PciSignature)],
    max_mapping_bytes: u64,
) -> Result<ScanReport, ProcessError> {
    scan_signatures_in(pid, wanted, ScanScope { max_mapping_bytes, max_heap_bytes: max_mapping_bytes })
}

/// [`scan_signatures`] over the mappings `scope` admits.
pub fn scan_signatures_in(
    pid: u32,
    wanted: &[(GpuUuid, PciSignature)],
    scope: ScanScope,
) -> Result<ScanReport, ProcessError> {
    scan_identity_in(pid, wanted, &[], scope)
}

/// One pass over the mappings `scope` admits for the wanted PCI signatures and for the
/// `cudaDeviceProp` copies of the `props` GPUs (never in libcuda's own mappings).
pub fn scan_identity_in(
    pid: u32,
    wanted: &[(GpuUuid, PciSignature)],
    props: &[GpuIdentity],
    scope: ScanScope,
) -> Result<ScanReport, ProcessError> {
    if wanted.is_empty() && props.is_empty() {
        return Ok(ScanReport::default());
    }
    scan_identity_over(pid, &read_maps(pid)?, wanted, props, scope)
}

/// [`scan_identity_in`] over mappings read earlier (`maps`, of `pid`): the dump reads them before
/// the driver's checkpoint starts, so the mappings that checkpoint adds (the device memory's copy)
/// are never scanned, whenever the scan runs. A mapping gone since reads as unreadable.
pub fn scan_identity_over(
    pid: u32,
    maps: &[Mapping],
    wanted: &[(GpuUuid, PciSignature)],
    props: &[GpuIdentity],
    scope: ScanScope,
) -> Result<ScanReport, ProcessError> {
    let started = Instant::now();
    let mut report = ScanReport::default();
    if wanted.is_empty() && props.is_empty() {
        report.elapsed = started.elapsed();
        return Ok(report);
    }
    let mem = ProcessMemory::open_read_only(pid)?;
    let pagemap = Pagemap::open(pid);
    let budget = ScanBudget::new(ScanLimits::PROCESS);
    let (scannable, skipped): (Vec<&Mapping>, Vec<&Mapping>) = maps.iter().partition(|m| scope.admits(m));
    report.mappings_skipped = skipped.len();
    // A PyTorch process holds gigabytes of host memory: spread the mappings over a few threads
    // (balanced by size, largest first) so the scan is bound by memory bandwidth, not one core.
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).clamp(1, MAX_SCAN_THREADS);
    let mut groups: Vec<(u64, Vec<&Mapping>)> = vec![(0, Vec::new()); threads];
    let mut by_size = scannable;
    by_size.sort_by_key(|m| std::cmp::Reverse(m.len()));
    for m in by_size {
        if let Some(g) = groups.iter_mut().min_by_key(|g| g.0) {
            g.0 += m.len();
            g.1.push(m);
        }
    }
    let partials: Vec<Result<ScanReport, ProcessError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = groups
            .iter()
            .filter(|g| !g.1.is_empty())
            .map(|(_, group)| {
                let (mem, pagemap, budget) = (&mem, pagemap.as_ref(), &budget);
                scope.spawn(move || {
                    let mut part = ScanReport::default();
                    let mut buf = vec![0u8; SCAN_OVERLAP_BYTES + SCAN_CHUNK_BYTES];
                    let reader = Reader { mem, pagemap, budget };
                    for mapping in group {
                        if part.stopped.is_some() {
                            part.mappings_skipped += 1;
                            continue;
                        }
                        scan_one(pid, &reader, mapping, wanted, props, &mut buf, &mut part)?;
                    }
                    Ok(part)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(ProcessError::Parse { pid, path: proc_path(pid, "mem"), detail: "scan worker panicked".into() })
                })
            })
            .collect()
    });
    for part in partials {
        let part = part?;
        report.sites.extend(part.sites);
        report.bytes_scanned += part.bytes_scanned;
        report.mappings_scanned += part.mappings_scanned;
        report.mappings_skipped += part.mappings_skipped;
        report.prop_sites.extend(part.prop_sites);
        report.prop_lookalikes += part.prop_lookalikes;
        report.bytes_not_resident += part.bytes_not_resident;
        if report.stopped.is_none() {
            report.stopped = part.stopped;
        }
    }
    report.sites.sort_by_key(|s| s.addr);
    report.prop_sites.sort_by_key(|s| s.addr);
    report.elapsed = started.elapsed();
    Ok(report)
}

/// Most threads one scan uses.
const MAX_SCAN_THREADS: usize = 8;

/// What a scan reads through: the target's memory, which of its pages are backed, and the scan's budget.
struct Reader<'a> {
    mem: &'a ProcessMemory,
    pagemap: Option<&'a Pagemap>,
    budget: &'a ScanBudget,
}

/// Scans one mapping; a mapping that vanished since the maps were read is skipped with a warning.
fn scan_one(
    pid: u32,
    reader: &Reader<'_>,
    mapping: &Mapping,
    wanted: &[(GpuUuid, PciSignature)],
    props: &[GpuIdentity],
    buf: &mut [u8],
    report: &mut ScanReport,
) -> Result<(), ProcessError> {
    match scan_mapping(reader, mapping, wanted, props, buf, report) {
        Ok(()) => report.mappings_scanned += 1,
        Err(ProcessError::Unmapped { addr, source, .. }) if addr == mapping.start => {
            log::warn!(
                "process {pid}: skipping mapping {:#x}-{:#x} {}: not readable ({source}); it was \
                 probably unmapped after /proc/{pid}/maps was read",
                mapping.start,
                mapping.end,
                mapping.display_name()
            );
            report.mappings_skipped += 1;
        }
        Err(ProcessError::Unmapped { addr, source, .. }) => {
            log::warn!(
                "process {pid}: mapping {:#x}-{:#x} {} stopped being readable at {addr:#x} \
                 ({source}); the rest of it was not scanned",
                mapping.start,
                mapping.end,
                mapping.display_name()
            );
            report.mappings_scanned += 1;
        }
        Err(e) => return Err(e),
    }
    Ok(())
}

/// Scans one mapping in chunks, appending its sites to `report`.
fn scan_mapping(
    reader: &Reader<'_>,
    mapping: &Mapping,
    wanted: &[(GpuUuid, PciSignature)],
    props: &[GpuIdentity],
    buf: &mut [u8],
    report: &mut ScanReport,
) -> Result<(), ProcessError> {
    let props = if devprop::mapping_may_hold_props(&mapping.path) { props } else { &[] };
    // The runtime's property copies are whole structs, so one on the stack is real; PCI words there are not.
    let wanted = if pattern::mapping_may_hold_pci_words(&mapping.path) { wanted } else { &[] };
    // `buf[..carried]` holds the last bytes of the previous window, at `next - carried`.
    let mem = reader.mem;
    let mut next = mapping.start;
    let mut carried = 0usize;
    let mut backed = Vec::new();
    while next < mapping.end {
        let remaining = usize::try_from(mapping.end - next).unwrap_or(usize::MAX);
        // Chunks start at `mapping.start + k * SCAN_CHUNK_BYTES`; `buf` has room for the carry.
        let want = remaining.min(SCAN_CHUNK_BYTES);
        let absent_before = report.bytes_not_resident;
        let got = match read_resident(reader, next, &mut buf[carried..carried + want], &mut backed, report) {
            Ok(Chunk::Read(n)) => n,
            // A chunk no page backs: nothing to scan, and no signature can run from the carried bytes into its zeros
            // (a signature's last words, the PCI ids, are never zero).
            Ok(Chunk::NothingBacked) => {
                next += want as u64;
                carried = 0;
                continue;
            }
            Err(ReadStop::Target(e)) => return Err(e),
            Err(ReadStop::Scan(why)) => {
                report.stopped = Some(why);
                return Ok(());
            }
        };
        if got == 0 {
            // pread on /proc/PID/mem returns 0 only when the address space is gone.
            return Err(ProcessError::NoSuchProcess { pid: mem.pid(), path: proc_path(mem.pid(), "mem") });
        }
        let window = &buf[..carried + got];
        let base = next - carried as u64;
        for (gpu, addr) in if wanted.is_empty() { Vec::new() } else { find_signatures(window, base, wanted) } {
            // A hit lying wholly in the carried bytes was already reported from the previous window.
            if addr + PciSignature::LEN_BYTES as u64 <= next {
                continue;
            }
            let Some(&(_, words)) = wanted.iter().find(|(g, _)| *g == gpu) else {
                continue;
            };
            report.sites.push(PciSite {
                gpu,
                addr,
                mapping_start: mapping.start,
                mapping_end: mapping.end,
                mapping_name: mapping.path.clone(),
                words,
            });
        }
        if !props.is_empty() {
            let found = devprop::find_device_props(window, base, props);
            // A copy whose span lay wholly in the carried bytes was judged in the previous window.
            let new_here = |addr: u64| addr + devprop::MAX_SPAN as u64 > next;
            for (gpu, addr, runtime_major) in found.found.into_iter().filter(|f| new_here(f.1)) {
                report.prop_sites.push(PropSite {
                    gpu,
                    addr,
                    runtime_major,
                    mapping_start: mapping.start,
                    mapping_end: mapping.end,
                    mapping_name: mapping.path.clone(),
                });
            }
            report.prop_lookalikes += found.lookalikes.into_iter().filter(|a| new_here(*a)).count();
        }
        report.bytes_scanned += (got as u64).saturating_sub(report.bytes_not_resident - absent_before);
        next += got as u64;
        let keep = SCAN_OVERLAP_BYTES.min(window.len());
        let window_len = window.len();
        buf.copy_within(window_len - keep..window_len, 0);
        carried = keep;
    }
    Ok(())
}

/// What one chunk of a mapping gave.
enum Chunk {
    /// The bytes that count at the front of the buffer (as [`read_some`]).
    Read(usize),
    /// No page of it is backed: it reads as zeros and holds no identity word; skipped unscanned.
    NothingBacked,
}

/// Why a chunk was not read: the target's memory failed, or the scan's budget or deadline ended it.
enum ReadStop {
    Target(ProcessError),
    Scan(ScanStop),
}

/// Fills `buf` with the target's memory at `addr`, reading only the backed pages (the others are zeros, as the
/// target would read them) and charging what it reads to the scan's budget.
fn read_resident(
    reader: &Reader<'_>,
    addr: u64,
    buf: &mut [u8],
    backed: &mut Vec<bool>,
    report: &mut ScanReport,
) -> Result<Chunk, ReadStop> {
    let len = buf.len() as u64;
    let known = reader.pagemap.and_then(|p| p.backed(addr, len, backed));
    if known.is_none() {
        // The kernel does not say: read it all, within the budget.
        reader.budget.take(len).map_err(ReadStop::Scan)?;
        return read_some(reader.mem, addr, buf).map(Chunk::Read).map_err(ReadStop::Target);
    }
    let resident = backed.iter().filter(|b| **b).count() as u64 * PAGE;
    if resident == 0 {
        report.bytes_not_resident += len;
        return Ok(Chunk::NothingBacked);
    }
    reader.budget.take(resident.min(len)).map_err(ReadStop::Scan)?;
    let mut page = 0usize;
    while page < backed.len() {
        let from = page;
        let is_backed = backed[page];
        while page < backed.len() && backed[page] == is_backed {
            page += 1;
        }
        let start = from * PAGE_BYTES;
        let end = (page * PAGE_BYTES).min(buf.len());
        if is_backed {
            match read_some(reader.mem, addr + start as u64, &mut buf[start..end]) {
                Ok(n) if n == end - start => {}
                // Unreadable from here: what was read counts, as read_some says.
                Ok(n) => return Ok(Chunk::Read(start + n)),
                Err(e) if start == 0 => return Err(ReadStop::Target(e)),
                Err(_) => return Ok(Chunk::Read(start)),
            }
        } else {
            buf[start..end].fill(0);
            report.bytes_not_resident += (end - start) as u64;
        }
    }
    Ok(Chunk::Read(buf.len()))
}

/// Reads as much of `buf` as the target allows at `addr`: stops early at the end of readable
/// memory (returning what was read) and fails only if nothing at `addr` could be read.
fn read_some(mem: &ProcessMemory, addr: u64, buf: &mut [u8]) -> Result<usize, ProcessError> {
    let mut done = 0;
    while done < buf.len() {
        match mem.read_at(addr + done as u64, &mut buf[done..]) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(ProcessError::Unmapped { .. }) if done > 0 => break,
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// Reads the 24 bytes at `addr` as a PCI signature.
pub fn read_signature(mem: &ProcessMemory, addr: u64) -> Result<PciSignature, ProcessError> {
    let mut bytes = [0u8; PciSignature::LEN_BYTES];
    mem.read_exact_at(addr, &mut bytes)?;
    Ok(PciSignature::from_bytes(&bytes))
}

/// Rewrites `expect` at `addr` with `write` (same length) only if `expect` is still there, then
/// reads it back, like [`verify_and_write`] for the runtime's property copies.
pub fn verify_and_write_bytes(mem: &ProcessMemory, addr: u64, expect: &[u8], write: &[u8]) -> Result<(), ProcessError> {
    let mut seen = vec![0u8; expect.len()];
    mem.read_exact_at(addr, &mut seen)?;
    if seen != expect {
        return Err(ProcessError::MemoryChanged { pid: mem.pid(), addr, expected: expect.to_vec(), seen });
    }
    mem.write_all_at(addr, write)?;
    mem.read_exact_at(addr, &mut seen)?;
    if seen != write {
        return Err(ProcessError::WriteNotApplied { pid: mem.pid(), addr, written: write.to_vec(), seen });
    }
    Ok(())
}

/// Rewrites one site: re-reads the 24 bytes at `addr` right before writing and writes `write`
/// only if they still equal `expect`, then reads them back to confirm.
///
/// The check and the write are not atomic against a running target: the target must be locked
/// by the driver or ptrace-stopped while its sites are rewritten.
pub fn verify_and_write(
    mem: &ProcessMemory,
    addr: u64,
    expect: &PciSignature,
    write: &PciSignature,
) -> Result<(), SiteError> {
    let seen = read_signature(mem, addr)?;
    if seen != *expect {
        return Err(SiteError::SiteChanged { pid: mem.pid(), addr, expected: *expect, seen });
    }
    mem.write_all_at(addr, &write.to_bytes())?;
    let seen = read_signature(mem, addr)?;
    if seen != *write {
        return Err(SiteError::WriteNotApplied { pid: mem.pid(), addr, written: *write, seen });
    }
    Ok(())
}
