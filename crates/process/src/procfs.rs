//! Small helpers over `/proc`: paths, reads with errors that name the pid and the fix, and the
//! `/proc/PID/stat` field split shared by [`crate::environ`] and [`crate::tree`].

use crate::ProcessError;
use std::io;
use std::path::{Path, PathBuf};

/// `/proc/<pid>/<rest>` (`rest` may be empty for the directory itself).
pub(crate) fn proc_path(pid: u32, rest: &str) -> PathBuf {
    if rest.is_empty() {
        PathBuf::from(format!("/proc/{pid}"))
    } else {
        PathBuf::from(format!("/proc/{pid}/{rest}"))
    }
}

/// Turns an I/O error on a `/proc` path into the error kind callers can act on.
pub(crate) fn io_error(pid: u32, action: &'static str, path: &Path, err: io::Error) -> ProcessError {
    match err.raw_os_error() {
        Some(libc::ENOENT) | Some(libc::ESRCH) => ProcessError::NoSuchProcess { pid, path: path.to_path_buf() },
        Some(libc::EACCES) | Some(libc::EPERM) => {
            ProcessError::PermissionDenied { pid, action, path: path.to_path_buf() }
        }
        _ => ProcessError::Io { pid, action, path: path.to_path_buf(), source: err },
    }
}

/// The most read of a small `/proc/PID` file (`stat`, `status`, `comm`): the kernel writes a few
/// KiB; `status`'s `Groups:` line is the longest part, at most 65536 groups (NGROUPS_MAX) of up to
/// 10 digits and a space.
pub(crate) const MAX_SMALL_PROC_FILE: u64 = 1 << 20;
/// The most read of `/proc/PID/maps`. Its size is the process's choice: it can map one file
/// 65530 times (`vm.max_map_count`) under a name of 4095 bytes, about 270 MB of text (and as much
/// again parsed); a real process, a PyTorch job included, has a few thousand lines of about 100
/// bytes, and even a `vm.max_map_count` of 262144 of such lines is 26 MB.
pub(crate) const MAX_MAPS_BYTES: u64 = 64 << 20;
/// The most read of `/proc/PID/task/TID/children`: pids of up to 8 characters and a space, so
/// about half a million children of one thread.
pub(crate) const MAX_CHILDREN_BYTES: u64 = 4 << 20;

/// Reads a `/proc/<pid>/...` text file (lossily: `maps` paths need not be UTF-8), at most `limit`
/// bytes: the kernel makes these files as large as the process's state is, which the process
/// controls, so a larger one is refused ([`ProcessError::ProcFileTooLarge`]), not read whole.
pub(crate) fn read_text(pid: u32, rest: &str, limit: u64) -> Result<String, ProcessError> {
    use std::io::Read;
    let path = proc_path(pid, rest);
    let file = std::fs::File::open(&path).map_err(|e| io_error(pid, "reading", &path, e))?;
    let mut bytes = Vec::new();
    file.take(limit.saturating_add(1)).read_to_end(&mut bytes).map_err(|e| io_error(pid, "reading", &path, e))?;
    if u64::try_from(bytes.len()).map_or(true, |n| n > limit) {
        return Err(ProcessError::ProcFileTooLarge { pid, path, limit });
    }
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// The fields of a `/proc/PID/stat` line from field 3 (`state`) on.
///
/// Field 2 (`comm`) is in parentheses and may itself contain spaces and parentheses, so the
/// split happens after the LAST `)`. Returns `None` when the line has no `)`.
pub(crate) fn stat_fields_after_comm(stat: &str) -> Option<Vec<&str>> {
    let close = stat.rfind(')')?;
    Some(stat[close + 1..].split_ascii_whitespace().collect())
}

/// Field `number` (1-based, as in `proc(5)`; 3 or above) of a `/proc/PID/stat` line.
pub(crate) fn stat_field(stat: &str, number: usize) -> Option<&str> {
    let index = number.checked_sub(3)?;
    stat_fields_after_comm(stat)?.get(index).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proc_file_over_its_limit_is_refused() {
        let me = std::process::id();
        assert!(read_text(me, "stat", MAX_SMALL_PROC_FILE).unwrap().starts_with(&format!("{me} (")));
        match read_text(me, "maps", 64) {
            Err(e @ ProcessError::ProcFileTooLarge { limit: 64, .. }) => {
                assert!(e.to_string().contains(&format!("/proc/{me}/maps")), "{e}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn stat_fields_survive_odd_comm() {
        // Fields 3..=52 hold their own field number, so every lookup is checkable.
        let rest: Vec<String> = (3..=52).map(|n| n.to_string()).collect();
        let line = format!("4242 (a) b (c)) {}\n", rest.join(" "));
        for n in 3..=52 {
            assert_eq!(stat_field(&line, n), Some(n.to_string().as_str()));
        }
        assert_eq!(stat_field(&line, 53), None);
        assert_eq!(stat_field(&line, 2), None);
        assert_eq!(stat_field("no parens here", 3), None);
    }
}
