//! The driver's staging pages taken off CRIU's page walk (issue 47), for the dump and the restore sessions.
//!
//! Dump ([`offload`]), after the checkpoint batch, every task stopped: each checkpointed process's staging
//! mappings ([`ccm_identity::staging::staging_ranges`]: new since the lock, private anonymous read-write, apart
//! from every older mapping) are copied into its page file in CRIU's image directory by one pool of workers, then
//! released in the task (`madvise(MADV_DONTNEED)` run inside it, on the hook's thread: the tracer), so that CRIU
//! writes none of them. The table goes into the identity image.
//!
//! Restore and put-back ([`fill`]): every data chunk is read back, checked against its CRC32 and written into the
//! task before the driver's restore reads it.
//!
//! A process whose staging mappings cannot be told exactly, or whose page file cannot be written, is left to CRIU
//! (it writes them as before), one line saying why.

use std::collections::BTreeMap;
use std::fs::File;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ccm_identity::staging::{page_file_name, staging_ranges, MapView, StagingTable, DEFAULT_CHUNK_BYTES};
use ccm_identity::HostPid;
use ccm_process::dir::Dir;
use ccm_process::staging_pages::{CopyOptions, FillJob, WriteJob};
use ccm_process::Mapping;
use log::{info, warn};

use crate::seam::{DriverAgent, Targets};
use crate::{Config, ProcessFailure, Staging};

/// How long the staging copy of a process may take: the driver's deadline for its device memory (the copy runs
/// at storage speed, far above the driver's).
fn copy_deadline(config: &Config, bytes: u64) -> Duration {
    config.call_deadline(Some(bytes))
}

/// What the staging rules need of a mapping.
pub fn map_view(m: &Mapping) -> MapView {
    MapView {
        start: m.start,
        end: m.end,
        readable: m.readable,
        writable: m.writable,
        executable: m.executable,
        shared: m.shared,
        anonymous: m.inode == 0 && m.path.is_empty(),
    }
}

pub fn map_views(maps: &[Mapping]) -> Vec<MapView> {
    maps.iter().map(map_view).collect()
}

/// One process's staging pages in its page file.
#[derive(Debug)]
pub struct Staged {
    /// The page file, open for reading (a put-back fills the task from it).
    pub file: Arc<File>,
    pub table: StagingTable,
    /// Whether the pages were released in the task (then a put-back must fill them back first).
    pub released: bool,
}

/// One checkpointed process to offload: host pid, the pid its images are named by, its mappings before the
/// checkpoint.
pub struct Checkpointed {
    pub pid: HostPid,
    pub image_pid: u32,
    pub before: Vec<MapView>,
}

/// The dump's offload of every process of `procs` (see the module). Returns the processes whose pages went to
/// page files (released or not); `Err` names a process that must not run on (its registers could not be put
/// back after the release: `ProcessFailure`), the others' results being kept.
pub fn offload(
    targets: &dyn Targets,
    agent: &dyn DriverAgent,
    config: &Config,
    dir: &Dir,
    procs: &[Checkpointed],
) -> (BTreeMap<HostPid, Staged>, BTreeMap<HostPid, ProcessFailure>) {
    let mut staged = BTreeMap::new();
    let mut failed = BTreeMap::new();
    if config.staging == Staging::Criu || procs.is_empty() {
        return (staged, failed);
    }
    let t0 = Instant::now();
    // Which mappings, and each page file.
    struct Todo {
        pid: HostPid,
        name: String,
        tmp: String,
        file: File,
        ranges: Vec<(u64, u64)>,
        after: Vec<Mapping>,
        direct: bool,
    }
    let mut todo = Vec::new();
    for p in procs {
        let after = match targets.read_maps(p.pid.get()) {
            Ok(m) => m,
            Err(e) => {
                warn!(
                    "pid {}: its maps after the checkpoint cannot be read ({e}); CRIU writes its staging pages",
                    p.pid
                );
                continue;
            }
        };
        let ranges = staging_ranges(&p.before, &map_views(&after));
        if ranges.is_empty() {
            info!(
                "pid {}: no private anonymous read-write memory new since its lock (no staging pages: a process without \
                 device memory, or a driver that keeps them elsewhere); CRIU writes whatever there is",
                p.pid
            );
            continue;
        }
        let name = page_file_name(p.image_pid);
        match dir.create_fresh(&name, 0o600, true) {
            Ok((file, tmp, direct)) => todo.push(Todo { pid: p.pid, name, tmp, file, ranges, after, direct }),
            Err(e) => warn!("pid {}: its page file cannot be created ({e}); CRIU writes its staging pages", p.pid),
        }
    }
    if todo.is_empty() {
        return (staged, failed);
    }
    let bytes: u64 = todo.iter().flat_map(|t| &t.ranges).map(|(s, e)| e - s).sum();
    let opts = CopyOptions {
        chunk_bytes: DEFAULT_CHUNK_BYTES,
        threads: config.staging_threads(),
        deadline: copy_deadline(config, bytes),
    };
    let jobs: Vec<WriteJob<'_>> =
        todo.iter().map(|t| WriteJob { pid: t.pid.get(), ranges: t.ranges.clone(), file: &t.file }).collect();
    let written = targets.write_staging(&jobs, opts);
    drop(jobs);
    let copy_s = t0.elapsed().as_secs_f64();
    let written = match written {
        Ok(w) => w,
        Err(e) => {
            warn!("the staging pages' copy failed ({e}); CRIU writes them for every process, as with staging criu");
            for t in &todo {
                let _ = dir.remove(&t.tmp);
            }
            return (staged, failed);
        }
    };
    let file_bytes: u64 = written.iter().map(|w| w.table.file_bytes).sum();
    info!(
        "timing: staging write of {} process(es): {} MiB of staging pages, {} MiB written ({} MiB all-zero left \
         out), {copy_s:.3} s ({:.2} GB/s), {} threads",
        todo.len(),
        bytes >> 20,
        file_bytes >> 20,
        (bytes - file_bytes) >> 20,
        bytes as f64 / copy_s.max(1e-9) / 1e9,
        opts.threads
    );
    for (t, w) in todo.into_iter().zip(written) {
        if let Err(e) = dir.rename_into_place(&t.tmp, &t.name) {
            warn!("pid {}: its page file cannot be named {} ({e}); CRIU writes its staging pages", t.pid, t.name);
            let _ = dir.remove(&t.tmp);
            continue;
        }
        // The driver agent learns where the pages are before they are released: should CRIU go away from here on,
        // it fills them back before it puts the process back. Without that record they are not released (CRIU
        // writes them too; the page file holds the same bytes).
        let path = page_file_path(dir, &t.name);
        if let Err(e) = agent.staging_released(t.pid, &path, &w.table) {
            warn!("pid {}: the driver agent cannot record its page file ({e}); its staging pages are not released, so CRIU writes them too", t.pid);
            staged.insert(t.pid, Staged { file: Arc::new(t.file), table: w.table, released: false });
            continue;
        }
        // Released on this (the hook's, CRIU's tracer) thread.
        let r0 = Instant::now();
        let released = targets.release_pages(t.pid.get(), &t.after, &t.ranges);
        let released = match released {
            Ok(()) => true,
            Err(ccm_process::remote_syscall::RemoteSyscallError::NotPutBack { tid, what }) => {
                failed.insert(t.pid, ProcessFailure::StagingRelease(format!("task {tid}: {what}")));
                true
            }
            Err(e) => {
                // Some ranges may be released: the table stays, and the restore fills them all (the others hold
                // the same bytes).
                warn!(
                    "pid {}: its staging pages could not all be released ({e}); CRIU writes those still there",
                    t.pid
                );
                true
            }
        };
        info!(
            "pid {}: staging pages: {} region(s), {} MiB, {} chunk(s) all zero; {} ({} MiB, {}); released in {:.1} ms",
            t.pid,
            w.table.regions.len(),
            w.table.region_bytes() >> 20,
            w.table.holes(),
            t.name,
            w.table.file_bytes >> 20,
            if t.direct && w.direct { "O_DIRECT" } else { "buffered, synced" },
            r0.elapsed().as_secs_f64() * 1e3
        );
        staged.insert(t.pid, Staged { file: Arc::new(t.file), table: w.table, released });
    }
    (staged, failed)
}

/// The page file's absolute path in CRIU's mount namespace (which the driver agent shares), from CRIU's descriptor
/// of the image directory.
pub(crate) fn page_file_path(dir: &Dir, name: &str) -> String {
    use std::os::fd::AsRawFd;
    let at = std::fs::read_link(format!("/proc/self/fd/{}", dir.as_fd().as_raw_fd()))
        .unwrap_or_else(|_| dir.shown().to_path_buf());
    at.join(name).display().to_string()
}

/// Fills every process's staging pages back from its page file (restore, put-back). `jobs`: host pid, table,
/// page file. The bytes filled, or the first error.
pub fn fill(
    targets: &dyn Targets,
    config: &Config,
    jobs: &[(HostPid, &StagingTable, &File)],
) -> Result<u64, ccm_process::staging_pages::StagingIoError> {
    let t0 = Instant::now();
    let bytes: u64 = jobs.iter().map(|(_, t, _)| t.file_bytes).sum();
    let fills: Vec<FillJob<'_>> = jobs
        .iter()
        .map(|(pid, table, file)| FillJob {
            pid: pid.get(),
            table,
            file,
            file_size: file.metadata().map(|m| m.len()).unwrap_or(0),
        })
        .collect();
    let opts = CopyOptions {
        chunk_bytes: DEFAULT_CHUNK_BYTES,
        threads: config.staging_threads(),
        deadline: copy_deadline(config, bytes),
    };
    let filled = targets.fill_staging(&fills, opts)?;
    let s = t0.elapsed().as_secs_f64();
    info!(
        "timing: staging fill of {} process(es): {} MiB from page files in {s:.3} s ({:.2} GB/s), {} threads",
        jobs.len(),
        filled >> 20,
        filled as f64 / s.max(1e-9) / 1e9,
        opts.threads
    );
    Ok(filled)
}
