//! One batch of driver work on CRIU-stopped tasks: resume their restore threads, do the work of
//! each task on a worker thread of its own, stop the threads again.
//!
//! Written once because its order is the rule of `ccm_process::ptrace`: the resume and the
//! re-stop are ptrace requests, which only CRIU's tracer thread (the hook's calling thread) may
//! make; only the work in between runs on other threads, and all of them end before this returns
//! (CRIU's process must have no thread of ours once a hook returns).

use log::error;

pub use crate::error::BatchError;
use crate::seam::Targets;

/// What to do with a task whose restore thread cannot be resumed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnResumeError {
    /// Report it and leave the task alone (the work needs the thread to run).
    Skip,
    /// Do the work anyway: the thread may not be stopped at all (a rollback after CRIU already
    /// let the task go), and the work reports its own failure if it needs the thread.
    WorkAnyway,
}

/// Runs `work` for every item in parallel while its restore thread (`tid(item)`) runs. Returns
/// one result per item, in the order of `items`.
pub fn with_restore_threads_running<T: Sync, R: Send>(
    targets: &dyn Targets,
    items: &[T],
    tid: impl Fn(&T) -> u32,
    on_resume_error: OnResumeError,
    work: impl Fn(&T) -> R + Sync,
) -> Vec<Result<R, BatchError>> {
    let mut running = Vec::new();
    let mut results: Vec<Option<Result<R, BatchError>>> = items.iter().map(|_| None).collect();
    let mut todo = Vec::new();
    let t0 = std::time::Instant::now();
    for (i, item) in items.iter().enumerate() {
        let t = tid(item);
        match targets.resume_restore_thread(t) {
            Ok(r) => {
                running.push(r);
                todo.push(i);
            }
            Err(e) => match on_resume_error {
                OnResumeError::Skip => results[i] = Some(Err(BatchError::Resume { tid: t, source: e })),
                OnResumeError::WorkAnyway => {
                    log::debug!("restore thread {t} not resumed ({e}); assuming it is not stopped");
                    todo.push(i);
                }
            },
        }
    }
    let resumed = t0.elapsed();
    let work = &work;
    let done: Vec<(usize, Result<R, BatchError>)> = std::thread::scope(|s| {
        let handles: Vec<_> = todo.iter().map(|&i| (i, s.spawn(move || work(&items[i])))).collect();
        handles.into_iter().map(|(i, h)| (i, h.join().map_err(|_| BatchError::Panicked))).collect()
    });
    let worked = t0.elapsed();
    let threads = running.len();
    for r in running {
        let t = r.tid();
        if let Err(e) = r.stop() {
            error!("cannot stop restore thread {t} again: {e}");
        }
    }
    log::debug!(
        "batch of {}: {threads} restore thread(s) resumed in {:.4} s, the work took {:.4} s, the threads stopped again in {:.4} s",
        items.len(),
        resumed.as_secs_f64(),
        (worked - resumed).as_secs_f64(),
        (t0.elapsed() - worked).as_secs_f64()
    );
    for (i, r) in done {
        results[i] = Some(r);
    }
    results.into_iter().map(|r| r.unwrap_or(Err(BatchError::Panicked))).collect()
}
