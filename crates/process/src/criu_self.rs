//! What CRIU's own process tells about the task it is dumping: CRIU asks HANDLE_DEVICE_VMA about a device mapping
//! without naming the task, while it parses that task's mappings with `/proc/PID/map_files` open (its
//! `parse_smaps` keeps the directory open for the whole walk). The one such directory among CRIU's descriptors
//! names the task, so that a mapping is claimed for the process that holds it, not for any process of the tree.

use std::sync::atomic::{AtomicI32, Ordering};

/// The descriptor that named the task last time: looked at first (one `readlink`), the rest only when it moved.
static LAST_FD: AtomicI32 = AtomicI32::new(-1);
/// Most of CRIU's descriptors looked at.
const MAX_FDS: usize = 4096;

/// The pid (as CRIU's `/proc` numbers it) whose `map_files` directory CRIU has open now, when exactly one is.
pub fn task_being_parsed() -> Option<u32> {
    let last = LAST_FD.load(Ordering::Relaxed);
    if last >= 0 {
        if let Some(pid) = map_files_pid_of_fd(last) {
            return Some(pid);
        }
    }
    let mut found: Option<(i32, u32)> = None;
    for entry in std::fs::read_dir("/proc/self/fd").ok()?.flatten().take(MAX_FDS) {
        let Some(fd) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        let Some(pid) = map_files_pid_of_fd(fd) else { continue };
        match found {
            Some((_, p)) if p != pid => return None,
            _ => found = Some((fd, pid)),
        }
    }
    let (fd, pid) = found?;
    LAST_FD.store(fd, Ordering::Relaxed);
    Some(pid)
}

fn map_files_pid_of_fd(fd: i32) -> Option<u32> {
    let link = std::fs::read_link(format!("/proc/self/fd/{fd}")).ok()?;
    map_files_pid(link.to_str()?)
}

/// The pid of a link text `…/PID/map_files` (CRIU's `/proc` may be mounted anywhere).
pub fn map_files_pid(link: &str) -> Option<u32> {
    let rest = link.strip_suffix("/map_files")?;
    let digits = rest.rsplit('/').next()?;
    if digits.is_empty() || digits.len() > 10 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse::<u32>().ok().filter(|&p| p > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_map_files_link_names_its_pid_wherever_proc_is_mounted() {
        assert_eq!(map_files_pid("/proc/1234/map_files"), Some(1234));
        assert_eq!(map_files_pid("/tmp/.criu.proc.x/77/map_files"), Some(77));
        for bad in ["/proc/self/map_files", "/proc/12a/map_files", "/proc/0/map_files", "/proc/12/maps", "map_files"] {
            assert_eq!(map_files_pid(bad), None, "{bad}");
        }
    }

    /// This test process with its own map_files open is "the task being parsed"; with none open, nothing is.
    #[test]
    fn the_open_map_files_directory_names_the_task() {
        let me = std::process::id();
        let dir = std::fs::File::open(format!("/proc/{me}/map_files"));
        if let Ok(_d) = dir {
            assert_eq!(task_being_parsed(), Some(me));
        }
    }
}
