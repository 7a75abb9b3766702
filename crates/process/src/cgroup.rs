//! The cgroup (v2) of a process, and moving this process into another one.
//!
//! Why: under runc, a restore's CRIU runs in the restored container's cgroup (runc puts it there so
//! that the restored tasks land in it), and so does the driver agent CRIU's plugin forks. The
//! container's cgroup must hold only the container's processes once CRIU is done: the agent moves
//! into the cgroup of the runtime that started CRIU at its start, so that the end of the restore
//! need not wait for it to exit.

use std::path::PathBuf;

use crate::procfs::proc_path;

/// Where the unified (v2) hierarchy is mounted.
const CGROUP2_ROOT: &str = "/sys/fs/cgroup";

/// The cgroup v2 path of `pid` (`0::/a/b` → `/a/b`); `None` on a v1 or hybrid host's v1 lines only.
pub fn cgroup_v2_of(pid: u32) -> Option<String> {
    let text = std::fs::read_to_string(proc_path(pid, "cgroup")).ok()?;
    parse_v2(&text)
}

fn parse_v2(text: &str) -> Option<String> {
    text.lines().find_map(|l| l.strip_prefix("0::")).map(|p| p.trim().to_string()).filter(|p| p.starts_with('/'))
}

/// Moves this process into the cgroup `path` of the unified hierarchy.
pub fn move_self_to(path: &str) -> std::io::Result<()> {
    if path.split('/').any(|c| c == "..") {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "a cgroup path with `..`"));
    }
    let procs = PathBuf::from(CGROUP2_ROOT).join(path.trim_start_matches('/')).join("cgroup.procs");
    std::fs::write(procs, std::process::id().to_string())
}

/// When this process's cgroup is not `pid`'s, moves it into `pid`'s: `Some((from, to))` when it did.
pub fn follow(pid: u32) -> Result<Option<(String, String)>, String> {
    let (Some(ours), Some(theirs)) = (cgroup_v2_of(std::process::id()), cgroup_v2_of(pid)) else {
        return Ok(None);
    };
    if ours == theirs {
        return Ok(None);
    }
    move_self_to(&theirs).map_err(|e| format!("cannot move from cgroup {ours} to {theirs}: {e}"))?;
    Ok(Some((ours, theirs)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unified_line_is_read() {
        assert_eq!(parse_v2("0::/user.slice/session-1.scope\n").as_deref(), Some("/user.slice/session-1.scope"));
        assert_eq!(parse_v2("12:cpuset:/\n1:name=systemd:/x\n0::/y\n").as_deref(), Some("/y"));
        assert_eq!(parse_v2("12:cpuset:/\n"), None);
        assert!(move_self_to("/../etc").is_err());
    }
}
