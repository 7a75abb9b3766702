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

/// Reads a `/proc/<pid>/...` text file (lossily: `maps` paths need not be UTF-8).
pub(crate) fn read_text(pid: u32, rest: &str) -> Result<String, ProcessError> {
    let path = proc_path(pid, rest);
    let bytes = std::fs::read(&path).map_err(|e| io_error(pid, "reading", &path, e))?;
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
