//! The live environ block of another process.
//!
//! `/proc/PID/environ` reads the same memory, but an edit needs the block's address: it is
//! `env_start..env_end` (fields 50 and 51 of `/proc/PID/stat`), which CRIU restores as they were
//! (`PR_SET_MM_MAP`). The block is a run of `KEY=VALUE\0` strings that `getenv` of the process
//! reads in place until the process calls `setenv`/`putenv` (glibc then copies `environ`'s
//! pointer array, but unchanged strings keep pointing into this block).

use crate::mem::ProcessMemory;
use crate::procfs::{proc_path, read_text, stat_field, MAX_SMALL_PROC_FILE};
use crate::ProcessError;

/// Field numbers (1-based, `proc(5)`) of the environ bounds in `/proc/PID/stat`.
const STAT_FIELD_ENV_START: usize = 50;
const STAT_FIELD_ENV_END: usize = 51;

/// The largest environ block read: what `execve` can give a process. Since Linux 4.18 the kernel
/// takes at most 3/4 of `_STK_LIM` (8 MiB), so 6 MiB, for argv and envp together, strings and
/// pointers (`fs/exec.c`, `bprm_stack_limits`), whatever the stack rlimit. A larger
/// `env_start..env_end` was not made by exec: the process set it with `prctl(PR_SET_MM,
/// PR_SET_MM_MAP)`, which needs no capability and accepts any ordered range of its address space
/// (a 2 GiB span cost root's CRIU 2.1 GB and 11.6 s; a 1 TiB one aborted it), so it is refused
/// before any byte is allocated or read.
pub const MAX_ENVIRON_BYTES: u64 = 6 << 20;

/// A copy of a process's environ block and where it lives in that process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvBlock {
    /// Address of the block's first byte in the process (`env_start`).
    pub start: u64,
    /// The block's bytes: `KEY=VALUE\0` strings.
    pub bytes: Vec<u8>,
}

impl EnvBlock {
    /// The `KEY=VALUE` entries with their byte offsets into the block (NULs excluded; empty
    /// entries skipped).
    pub fn entries(&self) -> impl Iterator<Item = (usize, &[u8])> {
        let mut offset = 0usize;
        self.bytes.split(|&b| b == 0).filter_map(move |entry| {
            let at = offset;
            offset += entry.len() + 1;
            (!entry.is_empty()).then_some((at, entry))
        })
    }

    /// Offset into the block of the VALUE of the first `key=` entry, and the value's bytes.
    pub fn find_value(&self, key: &str) -> Option<(usize, &[u8])> {
        let key = key.as_bytes();
        self.entries().find_map(|(at, entry)| {
            let value = entry.strip_prefix(key)?.strip_prefix(b"=")?;
            Some((at + key.len() + 1, value))
        })
    }
}

/// Parses `env_start` and `env_end` out of a `/proc/PID/stat` line.
fn parse_env_bounds(pid: u32, stat: &str) -> Result<(u64, u64), ProcessError> {
    let field = |number: usize| -> Result<u64, ProcessError> {
        stat_field(stat, number).and_then(|s| s.parse::<u64>().ok()).ok_or_else(|| ProcessError::Parse {
            pid,
            path: proc_path(pid, "stat"),
            detail: format!("field {number} (environ bounds) is missing or not a number"),
        })
    };
    let (start, end) = (field(STAT_FIELD_ENV_START)?, field(STAT_FIELD_ENV_END)?);
    if start == 0 || end == 0 {
        return Err(ProcessError::EnvironHidden { pid });
    }
    if end < start {
        return Err(ProcessError::Parse {
            pid,
            path: proc_path(pid, "stat"),
            detail: format!("env_end {end:#x} is below env_start {start:#x}"),
        });
    }
    Ok((start, end))
}

/// The length of the block `start..end` (ordered, see [`parse_env_bounds`]) as a buffer size, when
/// it is no more than [`MAX_ENVIRON_BYTES`]: the size comes from the target, so it is checked
/// before anything is allocated from it.
fn checked_environ_len(pid: u32, start: u64, end: u64) -> Result<usize, ProcessError> {
    let span = end - start;
    if span > MAX_ENVIRON_BYTES {
        return Err(ProcessError::EnvironTooLarge { pid, start, end, span, max: MAX_ENVIRON_BYTES });
    }
    usize::try_from(span).map_err(|_| ProcessError::EnvironTooLarge { pid, start, end, span, max: MAX_ENVIRON_BYTES })
}

fn env_bounds(pid: u32) -> Result<(u64, u64), ProcessError> {
    parse_env_bounds(pid, &read_text(pid, "stat", MAX_SMALL_PROC_FILE)?)
}

/// Reads the live environ block of `pid` through `/proc/PID/mem`: at most
/// [`MAX_ENVIRON_BYTES`]; a larger span is [`ProcessError::EnvironTooLarge`], nothing read.
pub fn read_environ_block(pid: u32) -> Result<EnvBlock, ProcessError> {
    let (start, end) = env_bounds(pid)?;
    let len = checked_environ_len(pid, start, end)?;
    let mem = ProcessMemory::open_read_only(pid)?;
    let mut bytes = vec![0u8; len];
    mem.read_exact_at(start, &mut bytes)?;
    Ok(EnvBlock { start, bytes })
}

/// The value of `key` in the block (the first entry, as `getenv` answers), lossily as UTF-8.
pub fn env_var(block: &EnvBlock, key: &str) -> Option<String> {
    block.find_value(key).map(|(_, v)| String::from_utf8_lossy(v).into_owned())
}

/// Replaces `old` by `new` (same length) at `block_start + offset` in the environ block of `pid`.
///
/// Checks that the edit lies inside the block the kernel reports now and that `block_start` is
/// still its start, re-reads the bytes and writes only if they equal `old`, then reads back.
pub fn write_environ_edit(
    pid: u32,
    block_start: u64,
    offset: usize,
    old: &[u8],
    new: &[u8],
) -> Result<(), ProcessError> {
    if old.len() != new.len() {
        return Err(ProcessError::EnvironLengthMismatch { pid, old_len: old.len(), new_len: new.len() });
    }
    let (start, end) = env_bounds(pid)?;
    let block_len = end - start;
    let out_of_bounds = ProcessError::EnvironOutOfBounds { pid, block_start: start, block_len, offset, len: old.len() };
    if start != block_start {
        return Err(out_of_bounds);
    }
    match (offset as u64).checked_add(old.len() as u64) {
        Some(edit_end) if edit_end <= block_len => {}
        _ => return Err(out_of_bounds),
    }
    let addr = block_start + offset as u64;
    let mem = ProcessMemory::open_read_write(pid)?;
    let mut seen = vec![0u8; old.len()];
    mem.read_exact_at(addr, &mut seen)?;
    if seen != old {
        return Err(ProcessError::MemoryChanged { pid, addr, expected: old.to_vec(), seen });
    }
    mem.write_all_at(addr, new)?;
    mem.read_exact_at(addr, &mut seen)?;
    if seen != new {
        return Err(ProcessError::WriteNotApplied { pid, addr, written: new.to_vec(), seen });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(text: &[u8]) -> EnvBlock {
        EnvBlock { start: 0x7ffd_0000_1000, bytes: text.to_vec() }
    }

    #[test]
    fn finds_values_and_offsets() {
        let b = block(b"PATH=/bin\0CUDA_VISIBLE_DEVICES=GPU-1\0EMPTY=\0CUDA=x\0\0");
        assert_eq!(env_var(&b, "PATH").as_deref(), Some("/bin"));
        assert_eq!(env_var(&b, "CUDA_VISIBLE_DEVICES").as_deref(), Some("GPU-1"));
        assert_eq!(env_var(&b, "EMPTY").as_deref(), Some(""));
        assert_eq!(env_var(&b, "CUDA").as_deref(), Some("x"), "a key prefix does not match a longer key");
        assert_eq!(env_var(&b, "MISSING"), None);
        let (offset, value) = b.find_value("CUDA_VISIBLE_DEVICES").unwrap();
        assert_eq!(&b.bytes[offset..offset + value.len()], b"GPU-1");
    }

    #[test]
    fn first_entry_wins() {
        let b = block(b"A=1\0A=2\0");
        assert_eq!(env_var(&b, "A").as_deref(), Some("1"));
    }

    #[test]
    fn env_bounds_from_stat() {
        let mut fields: Vec<String> = (3..=52).map(|n| n.to_string()).collect();
        fields[STAT_FIELD_ENV_START - 3] = "140737488347000".into();
        fields[STAT_FIELD_ENV_END - 3] = "140737488348000".into();
        let line = format!("77 (my (odd) comm) {}\n", fields.join(" "));
        assert_eq!(parse_env_bounds(77, &line).unwrap(), (140737488347000, 140737488348000));

        fields[STAT_FIELD_ENV_START - 3] = "0".into();
        let hidden = format!("77 (x) {}\n", fields.join(" "));
        assert!(matches!(parse_env_bounds(77, &hidden), Err(ProcessError::EnvironHidden { pid: 77 })));
        assert!(matches!(parse_env_bounds(77, "77 (x) S 1"), Err(ProcessError::Parse { .. })));
    }

    #[test]
    fn a_span_over_what_exec_can_give_is_refused_before_any_allocation() {
        let start = 0x7ffd_0000_0000;
        assert_eq!(checked_environ_len(77, start, start + MAX_ENVIRON_BYTES).unwrap(), 6 << 20);
        for span in [MAX_ENVIRON_BYTES + 1, 2 << 30, 1 << 40] {
            let e = checked_environ_len(77, start, start + span).unwrap_err();
            assert!(matches!(e, ProcessError::EnvironTooLarge { pid: 77, span: s, .. } if s == span), "{e:?}");
            let m = e.to_string();
            assert!(m.contains("PR_SET_MM") && m.contains("not read") && m.contains("6291456"), "{m}");
        }
    }
}
