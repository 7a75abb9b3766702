//! The driver's staging pages copied between CUDA processes and the plugin's page files (issue 47), in parallel.
//!
//! - [`write_page_files`]: after the checkpoint, every staging region of every process is read chunk by chunk
//!   (`process_vm_readv`: the tasks are stopped, nothing changes them), an all-zero chunk is left out as a hole,
//!   every other one gets its CRC32 and a place in its process's page file (appended where the file's end is at
//!   that moment: chunks land in the order workers finish them, the table says where each went). One pool of
//!   workers for all processes, each with one buffer of one chunk: the memory the copy holds is bounded by
//!   `threads x chunk`.
//! - [`fill_from_page_files`]: at restore (or when a dump puts a process back), every data chunk is read from its
//!   page file, checked against its CRC32 and written into the task (`process_vm_writev`); holes stay as the fresh
//!   mapping has them (zero).
//!
//! The files are opened by the caller (relative to CRIU's image directory fd, never through a link); with
//! `O_DIRECT` where the filesystem takes it: the buffers are page-aligned and every extent is a multiple of a page.
//! A filesystem that refuses `O_DIRECT` on the first write gets the flag cleared and the write again (buffered,
//! synced at the end).

use std::fs::File;
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ccm_identity::staging::{StagedChunk, StagingRegion, StagingTable, MAX_CHUNK_BYTES, PAGE_BYTES};
use nix::sys::uio::{process_vm_readv, process_vm_writev, RemoteIoVec};
use nix::unistd::Pid;

/// Why a page file could not be written or filled back from.
#[derive(Debug, thiserror::Error)]
pub enum StagingIoError {
    #[error("pid {pid}: reading its staging pages at {addr:#x} ({len} bytes) failed: {errno}")]
    ReadTask { pid: u32, addr: u64, len: u64, errno: nix::errno::Errno },
    #[error("pid {pid}: writing its staging pages back at {addr:#x} ({len} bytes) failed: {errno}")]
    WriteTask { pid: u32, addr: u64, len: u64, errno: nix::errno::Errno },
    #[error("pid {pid}: its page file could not be {action} at offset {offset}: {source}")]
    File { pid: u32, action: &'static str, offset: u64, source: std::io::Error },
    #[error(
        "pid {pid}: the page file holds other bytes than the dump wrote for the chunk at {addr:#x} (file offset \
         {offset}: CRC32 {found:#010x}, the image says {expected:#010x}); the checkpoint is damaged: restore from \
         another copy or dump again"
    )]
    Checksum { pid: u32, addr: u64, offset: u64, expected: u32, found: u32 },
    #[error(
        "pid {pid}: the page file ends at byte {size}, before the {needed} bytes its table names; the file was cut: \
         restore from a whole copy of the checkpoint or dump again"
    )]
    Short { pid: u32, size: u64, needed: u64 },
    #[error("the staging pages' copy passed its deadline of {0:?}")]
    Deadline(Duration),
    #[error("a staging chunk is larger than the {max}-byte buffers of the copy; the table is damaged")]
    ChunkTooLarge { max: u64 },
}

/// A 64-bit length or address as `usize` (the product runs on 64-bit targets only: saturating elsewhere).
fn us(v: u64) -> usize {
    usize::try_from(v).unwrap_or(usize::MAX)
}

fn task(pid: u32) -> Pid {
    Pid::from_raw(libc::pid_t::try_from(pid).unwrap_or(libc::pid_t::MAX))
}

/// How the copy runs.
#[derive(Clone, Copy, Debug)]
pub struct CopyOptions {
    pub chunk_bytes: u64,
    pub threads: usize,
    pub deadline: Duration,
}

/// One process's staging regions and the page file they go to (opened for reading and writing, empty).
pub struct WriteJob<'a> {
    pub pid: u32,
    pub ranges: Vec<(u64, u64)>,
    pub file: &'a File,
}

/// What one process's copy gave.
#[derive(Debug)]
pub struct Written {
    pub table: StagingTable,
    /// Whether the page file was written with `O_DIRECT` to the end.
    pub direct: bool,
}

/// A page-aligned buffer of `len` bytes, in safe code: a vector one page longer, used from its first aligned byte.
struct AlignedBuf {
    raw: Vec<u8>,
    at: usize,
}

impl AlignedBuf {
    fn new(len: usize) -> AlignedBuf {
        let raw = vec![0u8; len + us(PAGE_BYTES)];
        let at = raw.as_ptr().align_offset(us(PAGE_BYTES));
        AlignedBuf { raw, at }
    }
    fn slice(&mut self, len: usize) -> &mut [u8] {
        &mut self.raw[self.at..self.at + len]
    }
}

/// Whether every byte is zero (vectorised by the compiler: 64 bytes a step).
pub fn is_all_zero(b: &[u8]) -> bool {
    let mut chunks = b.chunks_exact(64);
    let whole = chunks.by_ref().all(|c| c.iter().fold(0u8, |a, &x| a | x) == 0);
    whole && chunks.remainder().iter().all(|&x| x == 0)
}

/// Runs `step(done)` (one `process_vm_readv` or `process_vm_writev` from byte `done` on) until `len` bytes are
/// through; a call that moves nothing is EFAULT (the range is not mapped whole), EINTR is asked again.
fn whole_range(len: usize, mut step: impl FnMut(usize) -> nix::Result<usize>) -> Result<(), nix::errno::Errno> {
    let mut done = 0usize;
    while done < len {
        match step(done) {
            Ok(0) => return Err(nix::errno::Errno::EFAULT),
            Ok(n) => done += n,
            Err(nix::errno::Errno::EINTR) => {}
            Err(errno) => return Err(errno),
        }
    }
    Ok(())
}

fn read_task(pid: u32, addr: u64, buf: &mut [u8]) -> Result<(), StagingIoError> {
    let len = buf.len();
    whole_range(len, |done| {
        let remote = [RemoteIoVec { base: us(addr + done as u64), len: len - done }];
        process_vm_readv(task(pid), &mut [IoSliceMut::new(&mut buf[done..])], &remote)
    })
    .map_err(|errno| StagingIoError::ReadTask { pid, addr, len: len as u64, errno })
}

fn write_task(pid: u32, addr: u64, buf: &[u8]) -> Result<(), StagingIoError> {
    let len = buf.len();
    whole_range(len, |done| {
        let remote = [RemoteIoVec { base: us(addr + done as u64), len: len - done }];
        process_vm_writev(task(pid), &[IoSlice::new(&buf[done..])], &remote)
    })
    .map_err(|errno| StagingIoError::WriteTask { pid, addr, len: len as u64, errno })
}

/// Whether `file` is open with `O_DIRECT`.
fn is_direct(file: &File) -> bool {
    rustix::fs::fcntl_getfl(file.as_fd()).is_ok_and(|f| f.contains(rustix::fs::OFlags::DIRECT))
}

/// Clears `O_DIRECT` on `file` (a filesystem that refused it for this write).
fn clear_direct(file: &File) -> bool {
    match rustix::fs::fcntl_getfl(file.as_fd()) {
        Ok(f) => rustix::fs::fcntl_setfl(file.as_fd(), f - rustix::fs::OFlags::DIRECT).is_ok(),
        Err(_) => false,
    }
}

/// `pwrite` of a whole extent; an `EINVAL` from an `O_DIRECT` file clears the flag and writes again, buffered.
fn write_extent(pid: u32, file: &File, bytes: &[u8], offset: u64) -> Result<(), StagingIoError> {
    match file.write_all_at(bytes, offset) {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) && is_direct(file) && clear_direct(file) => {
            log::debug!("pid {pid}: the page file's filesystem refused O_DIRECT; writing it buffered");
            file.write_all_at(bytes, offset)
        }
        r => r,
    }
    .map_err(|source| StagingIoError::File { pid, action: "written", offset, source })
}

fn read_extent(pid: u32, file: &File, buf: &mut [u8], offset: u64) -> Result<(), StagingIoError> {
    match file.read_exact_at(buf, offset) {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) && is_direct(file) && clear_direct(file) => {
            file.read_exact_at(buf, offset)
        }
        r => r,
    }
    .map_err(|source| StagingIoError::File { pid, action: "read", offset, source })
}

/// One chunk of work: job, region, chunk index, address, length.
type Work = (usize, usize, usize, u64, u64);

/// The most the copy's buffers hold together (one chunk per worker): fewer workers for bigger chunks.
pub const MAX_BUFFER_BYTES: u64 = 256 << 20;

fn workers(opts: &CopyOptions, chunk: u64, work: usize) -> usize {
    let by_memory = us(MAX_BUFFER_BYTES / chunk.max(1)).max(1);
    opts.threads.clamp(1, 256).min(by_memory).min(work.max(1))
}

/// Runs `each(item, buffer)` for every item of `work` on a pool of [`workers`] threads, each with one page-aligned
/// buffer of `chunk` bytes cut to the item's length ([`WorkLen`]); the first error stops the
/// pool (items in flight finish) and is returned; so is the deadline.
fn pool<T: Sync + WorkLen>(
    work: &[T],
    chunk: u64,
    opts: CopyOptions,
    each: impl Fn(&T, &mut [u8]) -> Result<(), StagingIoError> + Sync,
) -> Result<(), StagingIoError> {
    // A table's chunk size was checked against MAX_CHUNK_BYTES (`StagingTable::check`); the buffers never exceed it.
    let chunk = chunk.clamp(PAGE_BYTES, MAX_CHUNK_BYTES);
    if work.iter().any(|w| w.len() > chunk) {
        return Err(StagingIoError::ChunkTooLarge { max: chunk });
    }
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let first_error: Mutex<Option<StagingIoError>> = Mutex::new(None);
    let started = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..workers(&opts, chunk, work.len()) {
            s.spawn(|| {
                let mut buf = AlignedBuf::new(us(chunk));
                while !failed.load(Ordering::Relaxed) {
                    let Some(item) = work.get(next.fetch_add(1, Ordering::Relaxed)) else { break };
                    let done = if started.elapsed() > opts.deadline {
                        Err(StagingIoError::Deadline(opts.deadline))
                    } else {
                        each(item, buf.slice(us(item.len())))
                    };
                    if let Err(e) = done {
                        failed.store(true, Ordering::Relaxed);
                        first_error.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(e);
                    }
                }
            });
        }
    });
    match first_error.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// The bytes one item of a pool's work moves.
trait WorkLen {
    fn len(&self) -> u64;
}

/// A chunk to write: job, region, chunk index, address, length.
impl WorkLen for Work {
    fn len(&self) -> u64 {
        self.4
    }
}

/// A chunk to fill: job, address, length, page file offset, CRC32.
impl WorkLen for (usize, u64, u64, u64, u32) {
    fn len(&self) -> u64 {
        self.2
    }
}

/// Copies every job's staging regions into its page file, all jobs' chunks shared by one pool of workers. Either
/// every job is written (and synced) or the first error is returned (the files then hold a partial copy: the caller
/// removes them; nothing in the tasks was changed).
pub fn write_page_files(jobs: &[WriteJob<'_>], opts: CopyOptions) -> Result<Vec<Written>, StagingIoError> {
    let chunk = opts.chunk_bytes;
    let work: Vec<Work> = jobs
        .iter()
        .enumerate()
        .flat_map(|(j, job)| {
            job.ranges.iter().enumerate().flat_map(move |(r, &(start, end))| {
                (0..(end - start).div_ceil(chunk)).map(move |c| {
                    let addr = start + c * chunk;
                    (j, r, us(c), addr, chunk.min(end - addr))
                })
            })
        })
        .collect();
    let results: Vec<Vec<Mutex<Vec<Option<StagedChunk>>>>> = jobs
        .iter()
        .map(|job| job.ranges.iter().map(|&(s, e)| Mutex::new(vec![None; us((e - s).div_ceil(chunk))])).collect())
        .collect();
    let ends: Vec<AtomicU64> = jobs.iter().map(|_| AtomicU64::new(0)).collect();
    pool(&work, chunk, opts, |&(j, r, c, addr, len), b| {
        let job = &jobs[j];
        read_task(job.pid, addr, b)?;
        let ch = if is_all_zero(b) {
            StagedChunk::Hole
        } else {
            let crc = crc32fast::hash(b);
            let offset = ends[j].fetch_add(len, Ordering::Relaxed);
            write_extent(job.pid, job.file, b, offset)?;
            StagedChunk::Data { offset, crc }
        };
        results[j][r].lock().unwrap_or_else(|p| p.into_inner())[c] = Some(ch);
        Ok(())
    })?;
    let mut out = Vec::new();
    for (j, job) in jobs.iter().enumerate() {
        job.file.sync_all().map_err(|source| StagingIoError::File {
            pid: job.pid,
            action: "synced",
            offset: 0,
            source,
        })?;
        let regions = job
            .ranges
            .iter()
            .zip(&results[j])
            .map(|(&(start, end), chunks)| StagingRegion {
                start,
                len: end - start,
                chunks: chunks
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .iter()
                    .map(|c| c.unwrap_or(StagedChunk::Hole))
                    .collect(),
            })
            .collect();
        out.push(Written {
            table: StagingTable { chunk_bytes: chunk, file_bytes: ends[j].load(Ordering::Relaxed), regions },
            direct: is_direct(job.file),
        });
    }
    Ok(out)
}

/// One process to fill back: its table (checked by the caller: [`StagingTable::check`]) and its page file.
pub struct FillJob<'a> {
    pub pid: u32,
    pub table: &'a StagingTable,
    pub file: &'a File,
    /// The page file's size: a file shorter than the table says is refused before any byte is written.
    pub file_size: u64,
}

/// Writes every data chunk of every job back into its task, each checked against its CRC32 first. A short page
/// file is refused before anything is written; a chunk whose bytes differ stops the fill at that chunk (the task's
/// memory is then partly filled: the caller fails the restore, or for a put-back names the process).
pub fn fill_from_page_files(jobs: &[FillJob<'_>], opts: CopyOptions) -> Result<u64, StagingIoError> {
    for job in jobs {
        if job.file_size < job.table.file_bytes {
            return Err(StagingIoError::Short { pid: job.pid, size: job.file_size, needed: job.table.file_bytes });
        }
    }
    let work: Vec<(usize, u64, u64, u64, u32)> = jobs
        .iter()
        .enumerate()
        .flat_map(|(j, job)| {
            job.table.places().into_iter().filter_map(move |p| match p.chunk {
                StagedChunk::Hole => None,
                StagedChunk::Data { offset, crc } => Some((j, p.addr, p.len, offset, crc)),
            })
        })
        .collect();
    let chunk = jobs.iter().map(|j| j.table.chunk_bytes).max().unwrap_or(PAGE_BYTES);
    let filled = AtomicU64::new(0);
    pool(&work, chunk, opts, |&(j, addr, len, offset, crc), b| {
        let job = &jobs[j];
        read_extent(job.pid, job.file, b, offset)?;
        let found = crc32fast::hash(b);
        if found != crc {
            return Err(StagingIoError::Checksum { pid: job.pid, addr, offset, expected: crc, found });
        }
        write_task(job.pid, addr, b)?;
        filled.fetch_add(len, Ordering::Relaxed);
        Ok(())
    })?;
    Ok(filled.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_detection_sees_a_single_byte_anywhere() {
        let mut b = vec![0u8; 4096 + 13];
        assert!(is_all_zero(&b));
        for at in [0, 63, 64, 4095, 4096 + 12] {
            b[at] = 1;
            assert!(!is_all_zero(&b), "{at}");
            b[at] = 0;
        }
    }

    /// This process's own memory as the "task": regions of a buffer, copied out and filled back.
    #[test]
    fn a_copy_out_and_fill_back_of_own_memory_is_identical_with_zero_chunks_as_holes() {
        let chunk = 64 << 10;
        let mut src = AlignedBuf::new(4 * chunk + 4096);
        let region = src.slice(4 * chunk + 4096);
        for (i, b) in region.iter_mut().enumerate() {
            // chunk 1 all zero
            *b = if (chunk..2 * chunk).contains(&i) { 0 } else { u8::try_from(i % 251).unwrap_or(0) + 1 };
        }
        let start = region.as_ptr() as u64;
        let end = start + region.len() as u64;
        let expected = region.to_vec();
        let dir = tempfile::tempdir().unwrap();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.path().join("p"))
            .unwrap();
        let pid = std::process::id();
        let opts = CopyOptions { chunk_bytes: chunk as u64, threads: 3, deadline: Duration::from_secs(30) };
        let w = write_page_files(&[WriteJob { pid, ranges: vec![(start, end)], file: &file }], opts).unwrap();
        let table = &w[0].table;
        table.check().unwrap();
        assert_eq!(table.holes(), 1);
        assert_eq!(table.file_bytes, 3 * chunk as u64 + 4096);
        region.fill(0);
        std::hint::black_box(&mut *region);
        let size = file.metadata().unwrap().len();
        fill_from_page_files(&[FillJob { pid, table, file: &file, file_size: size }], opts).unwrap();
        assert_eq!(std::hint::black_box(&*region), &expected[..]);
        // A flipped byte in the file is refused, naming the chunk.
        let mut one = [0u8; 1];
        file.read_exact_at(&mut one, 100).unwrap();
        file.write_all_at(&[one[0] ^ 0xff], 100).unwrap();
        let e = fill_from_page_files(&[FillJob { pid, table, file: &file, file_size: size }], opts).unwrap_err();
        assert!(matches!(e, StagingIoError::Checksum { .. }), "{e}");
        let e = fill_from_page_files(&[FillJob { pid, table, file: &file, file_size: size - 1 }], opts).unwrap_err();
        assert!(matches!(e, StagingIoError::Short { .. }), "{e}");
    }
}
