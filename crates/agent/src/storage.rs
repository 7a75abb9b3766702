//! The driver's custom storage (CUDA 13.4, driver r615) in the driver agent: the checkpoint's device memory copied
//! from the regions the driver maps into this agent straight into the page file, and back at restore. The page file
//! and its table are the staging path's ([`ccm_identity::staging::DriverStorage`]): chunks with a CRC32 each,
//! all-zero chunks left out as holes.
//!
//! The copy runs one chunk at a time per process (the regions' contexts are the caller's, current on one thread);
//! the agent answers each process's call on a thread of its own, so processes copy in parallel. No r615 driver was on
//! the machines this was built on: it is proven on the test double of libcuda only.

use std::fs::File;
use std::os::unix::fs::FileExt;

use ccm_driver::custom_storage::{CustomStorageApi, Operation};
use ccm_driver::CudaError;
use ccm_identity::staging::{
    DriverRegion, DriverStorage, StagedChunk, StagingRegion, StagingTable, DEFAULT_CHUNK_BYTES,
};
use ccm_identity::GpuUuid;

/// Why a custom-storage checkpoint or restore failed, and where it left the process.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// The driver refused the operation: the process is as it was (LOCKED for a checkpoint, CHECKPOINTED for a
    /// restore).
    #[error("{0}")]
    Refused(CudaError),
    /// The operation is open and cannot be completed without losing the device data (a copy failed, or the driver's
    /// regions do not match the table): the process stays CHECKPOINTING or RESTORING in the driver.
    #[error(
        "pid {pid} is left {state} in the driver: {why}. The driver offers no way to abort a custom-storage \
         operation: end the process and {after}"
    )]
    Open { pid: i32, state: &'static str, why: String, after: &'static str },
}

/// The `recover` command line for `pid`: with `--images` (the page file's directory) for a process whose device
/// memory is in a page file through the driver's custom storage.
pub fn recover_command(pid: impl std::fmt::Display, page_file: Option<&str>) -> String {
    match page_file.and_then(|f| std::path::Path::new(f).parent()) {
        Some(dir) => format!("criu-cuda-migrate recover --pid {pid} --images {}", dir.display()),
        None => format!("criu-cuda-migrate recover --pid {pid}"),
    }
}

/// Chunk sizes and offsets within one (at most 32 MiB: [`ccm_identity::staging::MAX_CHUNK_BYTES`]) as `usize`.
fn us(v: u64) -> usize {
    usize::try_from(v).unwrap_or(usize::MAX)
}

/// A refusal before the driver was called (the process is as it was).
fn refused(description: String) -> StorageError {
    StorageError::Refused(CudaError {
        call: "custom storage",
        code: ccm_driver::abi::CudaCode::InvalidValue,
        name: "CUDA_ERROR_INVALID_VALUE".into(),
        description,
    })
}

fn open_checkpoint(pid: i32, why: String) -> StorageError {
    StorageError::Open {
        pid,
        state: "CHECKPOINTING",
        why,
        after: "restart its job (its device memory was never written whole)",
    }
}

fn open_restore(pid: i32, why: String) -> StorageError {
    StorageError::Open {
        pid,
        state: "RESTORING",
        why,
        after: "restore again from the same images (they are unchanged)",
    }
}

/// Checkpoints the LOCKED `pid` into `file` (empty, opened for writing) and completes the operation.
pub fn checkpoint_to_file(api: &CustomStorageApi, pid: i32, file: &File) -> Result<DriverStorage, StorageError> {
    let op = api.checkpoint(pid).map_err(StorageError::Refused)?;
    let storage = copy_out(&op, file).map_err(|why| open_checkpoint(pid, why))?;
    op.complete().map_err(|e| open_checkpoint(pid, format!("the operation's completion failed: {e}")))?;
    Ok(storage)
}

fn copy_out(op: &Operation<'_>, file: &File) -> Result<DriverStorage, String> {
    // One buffer of the constant chunk (8 MiB); the table's regions bounded by the image's GPU limit before any is
    // reserved.
    let chunk = DEFAULT_CHUNK_BYTES;
    if op.regions.len() > ccm_identity::image::MAX_GPUS {
        return Err(format!("the driver handed over {} regions", op.regions.len()));
    }
    let sizes: Vec<u64> = op.regions.iter().map(|r| r.size).collect();
    let places = DriverStorage::places(&sizes).ok_or("the regions run past the address space")?;
    let mut buf = vec![0u8; us(chunk)];
    let mut file_bytes = 0u64;
    let mut table_regions = Vec::with_capacity(places.len());
    for (i, start, len) in places {
        let size = sizes[i];
        let mut chunks = Vec::new();
        let mut off = 0u64;
        while off < len {
            let l = us(chunk.min(len - off));
            // The last chunk runs to the page: the bytes past the region's size are zero.
            let real = us((size - off).min(l as u64));
            let b = &mut buf[..l];
            b[real..].fill(0);
            op.read(i, off, &mut b[..real]).map_err(|e| format!("the copy of region {i} at {off}: {e}"))?;
            if ccm_process::staging_pages::is_all_zero(b) {
                chunks.push(StagedChunk::Hole);
            } else {
                file.write_all_at(b, file_bytes).map_err(|e| format!("the page file's write at {file_bytes}: {e}"))?;
                chunks.push(StagedChunk::Data { offset: file_bytes, crc: crc32fast::hash(b) });
                file_bytes += l as u64;
            }
            off += l as u64;
        }
        table_regions.push(StagingRegion { start, len, chunks });
    }
    file.sync_all().map_err(|e| format!("the page file's sync: {e}"))?;
    let regions = op.regions.iter().map(|r| DriverRegion { gpu: r.gpu, size: r.size }).collect();
    let storage =
        DriverStorage { regions, table: StagingTable { chunk_bytes: chunk, file_bytes, regions: table_regions } };
    storage.check().map_err(|e| format!("the table made: {e}"))?;
    Ok(storage)
}

/// Restores the CHECKPOINTED `pid` from `file` (of `file_size` bytes) by `storage` (checked again here) onto the
/// GPUs `pairs` name, and completes the operation: the process is LOCKED. A page file shorter than the table is
/// refused before the driver is called.
pub fn restore_from_file(
    api: &CustomStorageApi,
    pid: i32,
    pairs: &[(GpuUuid, GpuUuid)],
    file: &File,
    file_size: u64,
    storage: &DriverStorage,
) -> Result<u64, StorageError> {
    // The table comes from an image: its rules (a chunk of at most 32 MiB, bounded regions and chunks) are checked
    // here, before the buffers below are sized by it.
    storage.check().map_err(|e| refused(format!("the driver storage table: {e} (the driver was not called)")))?;
    if file_size < storage.table.file_bytes {
        return Err(refused(format!(
            "the page file is {file_size} bytes, shorter than the {} its table names: the checkpoint is not whole \
             (the driver was not called)",
            storage.table.file_bytes
        )));
    }
    // Every chunk is checked before the driver is called: once its operation is open, a bad chunk could only leave
    // the process RESTORING.
    verify(file, storage).map_err(|why| refused(format!("{why} (the driver was not called)")))?;
    let op = api.restore(pid, pairs).map_err(StorageError::Refused)?;
    let filled = fill(&op, file, storage).map_err(|why| open_restore(pid, why))?;
    op.complete().map_err(|e| open_restore(pid, format!("the operation's completion failed: {e}")))?;
    Ok(filled)
}

/// Reads every data chunk of the page file and checks it against its CRC32.
fn verify(file: &File, storage: &DriverStorage) -> Result<(), String> {
    let mut buf = vec![0u8; us(storage.table.chunk_bytes)];
    for p in storage.table.places() {
        if let StagedChunk::Data { offset, crc } = p.chunk {
            let b = &mut buf[..us(p.len)];
            file.read_exact_at(b, offset).map_err(|e| format!("the page file's read at {offset}: {e}"))?;
            let got = crc32fast::hash(b);
            if got != crc {
                return Err(format!(
                    "the page file's chunk at offset {offset} differs from its checksum ({got:#010x}, recorded                      {crc:#010x}): the page file was changed"
                ));
            }
        }
    }
    Ok(())
}

fn fill(op: &Operation<'_>, file: &File, storage: &DriverStorage) -> Result<u64, String> {
    let found: Vec<u64> = op.regions.iter().map(|r| r.size).collect();
    let expected: Vec<u64> = storage.regions.iter().map(|r| r.size).collect();
    if found != expected {
        return Err(format!(
            "the driver's regions ({found:?} bytes) are not the checkpoint's ({expected:?}): the images do not belong \
             to this process"
        ));
    }
    let chunk = storage.table.chunk_bytes;
    let mut buf = vec![0u8; us(chunk)];
    let mut filled = 0u64;
    for (i, size, t) in storage.regions_with_chunks() {
        for (k, c) in t.chunks.iter().enumerate() {
            let off = k as u64 * chunk;
            let l = us(chunk.min(t.len - off));
            let real = us((size - off).min(l as u64));
            let b = &mut buf[..l];
            match c {
                // The driver does not say what a fresh region holds: a hole is written as the zeros it was.
                StagedChunk::Hole => b.fill(0),
                StagedChunk::Data { offset, crc } => {
                    file.read_exact_at(b, *offset).map_err(|e| format!("the page file's read at {offset}: {e}"))?;
                    let got = crc32fast::hash(b);
                    if got != *crc {
                        return Err(format!(
                            "region {i}'s chunk at {off} differs from its checksum (page file offset {offset}: \
                             {got:#010x}, recorded {crc:#010x}): the page file was changed"
                        ));
                    }
                    filled += real as u64;
                }
            }
            op.write(i, off, &b[..real]).map_err(|e| format!("the fill of region {i} at {off}: {e}"))?;
        }
    }
    Ok(filled)
}
