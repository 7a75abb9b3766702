//! The cgroup (v2) of a process, and moving this process into another one.
//!
//! Why: under runc, a restore's CRIU runs in the restored container's cgroup (runc puts it there so
//! that the restored tasks land in it), and so does the driver agent CRIU's plugin forks. The
//! container's cgroup must hold only the container's processes once CRIU is done: the agent moves
//! into the cgroup of the runtime that started CRIU at its start, so that the end of the restore
//! need not wait for it to exit.
//!
//! And a frozen cgroup: containerd pauses a task (freezes its cgroup) before it asks runc for the
//! checkpoint, to take the container's file system changes in one state. The driver cannot lock or
//! checkpoint a process whose threads are frozen (its calls wait for the process's restore thread),
//! and CRIU thaws only a freezer it was told of. So the dump thaws the CUDA process's cgroup for the
//! driver and freezes it again when the dump ends ([`Thawed`]).

use std::path::PathBuf;
use std::time::Duration;

use crate::dir::{Dir, FileError};
use crate::procfs::proc_path;

/// Why a cgroup could not be followed, thawed or frozen again; each names the cgroup.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("cannot move from cgroup {from} to {to}: {source}")]
    Move {
        from: String,
        to: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the cgroup path {path} has `{part}`")]
    BadPath { path: String, part: String },
    /// A directory or file of the hierarchy could not be opened or read.
    #[error(transparent)]
    File(#[from] FileError),
    #[error("cannot thaw cgroup {path}: {source}")]
    Thaw {
        path: String,
        #[source]
        source: FileError,
    },
    #[error("cgroup {path} is still frozen {deadline:?} after it was thawed")]
    StillFrozen { path: String, deadline: Duration },
    #[error("cannot freeze cgroup {path} again: {source}")]
    Refreeze {
        path: String,
        #[source]
        source: FileError,
    },
}

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
pub fn follow(pid: u32) -> Result<Option<(String, String)>, CgroupError> {
    let (Some(ours), Some(theirs)) = (cgroup_v2_of(std::process::id()), cgroup_v2_of(pid)) else {
        return Ok(None);
    };
    if ours == theirs {
        return Ok(None);
    }
    if let Err(source) = move_self_to(&theirs) {
        return Err(CgroupError::Move { from: ours, to: theirs, source });
    }
    Ok(Some((ours, theirs)))
}

/// The cgroup v2 of `pid` when it is frozen (`frozen 1` in its `cgroup.events`, or `1` in its
/// `cgroup.freeze`, which a freeze in progress shows first).
pub fn frozen_cgroup_of(pid: u32) -> Option<String> {
    let path = cgroup_v2_of(pid)?;
    let dir = open_cgroup(&path).ok()?;
    let events = dir.read_file("cgroup.events", 4096).ok().map(|b| String::from_utf8_lossy(&b).into_owned());
    let freeze = dir.read_file("cgroup.freeze", 64).ok().map(|b| String::from_utf8_lossy(&b).trim().to_string());
    let frozen =
        events.as_deref().is_some_and(|e| e.lines().any(|l| l.trim() == "frozen 1")) || freeze.as_deref() == Some("1");
    frozen.then_some(path)
}

/// The directory of the cgroup `path`, reached from the hierarchy's root without following a link.
fn open_cgroup(path: &str) -> Result<Dir, CgroupError> {
    let mut dir = Dir::open(std::path::Path::new(CGROUP2_ROOT))?;
    for part in path.split('/').filter(|c| !c.is_empty()) {
        if part == ".." || part == "." {
            return Err(CgroupError::BadPath { path: path.to_string(), part: part.to_string() });
        }
        dir = dir.open_dir(part)?;
    }
    Ok(dir)
}

/// A cgroup this process thawed, to be frozen again.
#[derive(Debug)]
pub struct Thawed {
    pub path: String,
    dir: Dir,
}

/// Thaws the frozen cgroup `path` and waits until the kernel says it is thawed (`frozen 0`), at most
/// `deadline`.
pub fn thaw(path: &str, deadline: Duration) -> Result<Thawed, CgroupError> {
    let dir = open_cgroup(path)?;
    dir.write_existing("cgroup.freeze", b"0").map_err(|source| CgroupError::Thaw { path: path.to_string(), source })?;
    let end = std::time::Instant::now() + deadline;
    loop {
        let events = dir.read_file("cgroup.events", 4096)?;
        if String::from_utf8_lossy(&events).lines().any(|l| l.trim() == "frozen 0") {
            return Ok(Thawed { path: path.to_string(), dir });
        }
        if std::time::Instant::now() >= end {
            return Err(CgroupError::StillFrozen { path: path.to_string(), deadline });
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

impl Thawed {
    /// Freezes the cgroup again, as it was found (the kernel freezes it in the background).
    pub fn refreeze(&self) -> Result<(), CgroupError> {
        self.dir
            .write_existing("cgroup.freeze", b"1")
            .map_err(|source| CgroupError::Refreeze { path: self.path.clone(), source })
    }
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
