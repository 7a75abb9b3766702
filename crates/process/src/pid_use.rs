//! Who keeps a pid number taken in this pid namespace, so that `clone3` with that number as `set_tid` (what
//! CRIU's restore forks each task with) would fail with `EEXIST`.
//!
//! The kernel frees a pid number only once no task uses it in any role: as its pid (a live process, a zombie
//! its parent has not reaped yet, or a thread, whose `/proc/N` is reachable though not listed), or as some
//! process's process group id or session id (`/proc/X/stat` fields 5 and 6), even after the task with that pid
//! was reaped. A check reads `/proc/N/stat` of each number asked, then, for the numbers with no `/proc/N`, every
//! process's `stat` once. Every read is capped (`crate::procfs`); `/proc` is listed through [`crate::dir::Dir`].

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;

use crate::dir::Dir;
use crate::procfs::{read_text, stat_field, MAX_SMALL_PROC_FILE};
use crate::ProcessError;

/// Whether a pid number is free in this pid namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PidUse {
    Free,
    TakenBy(PidHolder),
}

/// What keeps a pid number taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PidHolder {
    /// The process that holds it: the number itself for a process or a zombie, the thread's process for a
    /// thread, the member of the group or session otherwise.
    pub pid: u32,
    /// That process's command name (`/proc/PID/stat`'s second field; its own choice, shown escaped).
    pub comm: String,
    pub how: Holds,
}

/// How a [`PidHolder`] holds the number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holds {
    /// A live process with that pid.
    Process,
    /// A process with that pid that exited and that its parent (`/proc/N/stat` field 4) has not reaped yet.
    Zombie { parent: u32 },
    /// A thread with that id, of process [`PidHolder::pid`].
    Thread,
    /// The number is the process group id of process [`PidHolder::pid`] (the group's leader is gone).
    ProcessGroup,
    /// The number is the session id of process [`PidHolder::pid`] (the session's leader is gone).
    Session,
}

impl fmt::Display for PidHolder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let comm = ccm_identity::text::shown(&self.comm);
        match self.how {
            Holds::Process => write!(f, "the running process {} ({comm})", self.pid),
            Holds::Zombie { parent } => {
                write!(f, "the exited process {} ({comm}), a zombie its parent pid {parent} has not reaped", self.pid)
            }
            Holds::Thread => write!(f, "a thread of pid {} ({comm})", self.pid),
            Holds::ProcessGroup => write!(f, "process group of pid {} ({comm})", self.pid),
            Holds::Session => write!(f, "session of pid {} ({comm})", self.pid),
        }
    }
}

impl PidHolder {
    /// What to do so that the number is freed: which process must end.
    pub fn advice(&self) -> String {
        let comm = ccm_identity::text::shown(&self.comm);
        match self.how {
            Holds::Zombie { parent } => {
                format!("wait until its parent pid {parent} reaps pid {} ({comm}), or end that parent", self.pid)
            }
            _ => format!("wait until pid {} ({comm}) ends, or end it", self.pid),
        }
    }
}

/// The most processes one check reads the `stat` of (as many as a [`Dir`] lists at most).
const MAX_SCANNED: usize = crate::dir::MAX_ENTRIES;

/// Whether `pid` is free in this pid namespace, and if not, who holds it.
pub fn pid_use(pid: u32) -> Result<PidUse, ProcessError> {
    Ok(pid_uses(&[pid])?.remove(&pid).unwrap_or(PidUse::Free))
}

/// [`pid_use`] of each of `pids` (0 left out), with one scan of `/proc` for all the numbers that have no
/// `/proc/N`. Fails only when `/proc` cannot be listed.
pub fn pid_uses(pids: &[u32]) -> Result<BTreeMap<u32, PidUse>, ProcessError> {
    let mut out = BTreeMap::new();
    let mut unseen = BTreeSet::new();
    for &pid in pids {
        if pid == 0 || out.contains_key(&pid) || unseen.contains(&pid) {
            continue;
        }
        match read_text(pid, "stat", MAX_SMALL_PROC_FILE) {
            Ok(stat) => {
                out.insert(pid, PidUse::TakenBy(own_holder(pid, &stat)));
            }
            Err(ProcessError::NoSuchProcess { .. }) => {
                unseen.insert(pid);
            }
            // `/proc/N` is there but cannot be read: a task has the number.
            Err(_) => {
                out.insert(pid, PidUse::TakenBy(PidHolder { pid, comm: String::new(), how: Holds::Process }));
            }
        }
    }
    if !unseen.is_empty() {
        let proc = Dir::open(Path::new("/proc")).map_err(|e| list_error(&e))?;
        let names = proc.names().map_err(|e| list_error(&e))?;
        let stats = names
            .iter()
            .filter_map(|n| n.to_str().and_then(|s| s.parse::<u32>().ok()))
            .take(MAX_SCANNED)
            .filter_map(|x| read_text(x, "stat", MAX_SMALL_PROC_FILE).ok().map(|s| (x, s)));
        let found = group_holders(stats, &unseen);
        for pid in unseen {
            out.insert(pid, found.get(&pid).cloned().map_or(PidUse::Free, PidUse::TakenBy));
        }
    }
    Ok(out)
}

fn list_error(e: &crate::dir::FileError) -> ProcessError {
    ProcessError::Io { pid: 0, action: "list", path: "/proc".into(), source: std::io::Error::other(e.to_string()) }
}

/// The command name of a `/proc/PID/stat` line: between the first `(` and the last `)`.
fn stat_comm(stat: &str) -> Option<&str> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    stat.get(open + 1..close)
}

/// The holder of `pid` whose `/proc/N/stat` reads `stat`: a zombie, a thread of another process (by
/// `/proc/N/status`' `Tgid:`) or the process itself.
fn own_holder(pid: u32, stat: &str) -> PidHolder {
    let comm = stat_comm(stat).unwrap_or_default().to_string();
    if stat_field(stat, 3) == Some("Z") {
        let parent = stat_field(stat, 4).and_then(|p| p.parse().ok()).unwrap_or(0);
        return PidHolder { pid, comm, how: Holds::Zombie { parent } };
    }
    let tgid = read_text(pid, "status", MAX_SMALL_PROC_FILE).ok().and_then(|s| parse_tgid(&s));
    match tgid {
        Some(t) if t != pid => {
            let comm = read_text(t, "stat", MAX_SMALL_PROC_FILE)
                .ok()
                .and_then(|s| stat_comm(&s).map(str::to_string))
                .unwrap_or(comm);
            PidHolder { pid: t, comm, how: Holds::Thread }
        }
        _ => PidHolder { pid, comm, how: Holds::Process },
    }
}

/// The `Tgid:` of a `/proc/PID/status` text.
fn parse_tgid(status: &str) -> Option<u32> {
    status.lines().find_map(|l| l.strip_prefix("Tgid:"))?.trim().parse().ok()
}

/// For each number of `wanted`, a process among `stats` (pid, its `/proc/PID/stat`) whose process group
/// (field 5) or session (field 6) it is; a group wins over a session, the first process over later ones.
fn group_holders<S: AsRef<str>>(
    stats: impl Iterator<Item = (u32, S)>,
    wanted: &BTreeSet<u32>,
) -> BTreeMap<u32, PidHolder> {
    let mut found: BTreeMap<u32, PidHolder> = BTreeMap::new();
    for (x, stat) in stats {
        let stat = stat.as_ref();
        let field = |n| stat_field(stat, n).and_then(|v| v.parse::<u32>().ok());
        for (n, how) in [(5, Holds::ProcessGroup), (6, Holds::Session)] {
            let Some(id) = field(n).filter(|id| wanted.contains(id)) else { continue };
            let better = match found.get(&id) {
                None => true,
                Some(h) => h.how == Holds::Session && how == Holds::ProcessGroup,
            };
            if better {
                let comm = stat_comm(stat).unwrap_or_default().to_string();
                found.insert(id, PidHolder { pid: x, comm, how });
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn stat(pid: u32, comm: &str, state: &str, ppid: u32, pgid: u32, sid: u32) -> String {
        format!("{pid} ({comm}) {state} {ppid} {pgid} {sid} 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 100\n")
    }

    #[test]
    fn groups_and_sessions_are_found_by_their_fields() {
        let wanted: BTreeSet<u32> = [500, 600, 700].into();
        let stats = vec![
            (10, stat(10, "bash", "S", 1, 10, 10)),
            (12, stat(12, "a (b) c", "S", 10, 700, 600)),
            (14, stat(14, "x", "S", 10, 600, 10)),
            (15, stat(15, "y", "R", 10, 10, 10)),
            (16, "garbage".to_string()),
        ];
        let got = group_holders(stats.into_iter(), &wanted);
        assert_eq!(got[&700], PidHolder { pid: 12, comm: "a (b) c".into(), how: Holds::ProcessGroup });
        // 600 is 12's session, then 14's group: the group wins.
        assert_eq!(got[&600], PidHolder { pid: 14, comm: "x".into(), how: Holds::ProcessGroup });
        assert!(!got.contains_key(&500));
        assert_eq!(got[&700].to_string(), "process group of pid 12 (a (b) c)");
        let s = group_holders([(20, stat(20, "s", "S", 1, 20, 600))].into_iter(), &wanted);
        assert_eq!(s[&600].to_string(), "session of pid 20 (s)");
        assert_eq!(s[&600].advice(), "wait until pid 20 (s) ends, or end it");
    }

    #[test]
    fn a_name_with_control_characters_is_shown_escaped() {
        let h = PidHolder { pid: 9, comm: "x\nverdict: ok".into(), how: Holds::Zombie { parent: 3 } };
        assert!(!h.to_string().contains('\n'), "{h}");
        assert!(!h.advice().contains('\n'));
        assert!(h.advice().contains("parent pid 3"));
    }

    #[test]
    fn this_process_and_its_thread_are_taken_a_number_past_pid_max_is_free() {
        let me = std::process::id();
        let PidUse::TakenBy(h) = pid_use(me).unwrap() else { panic!("own pid free") };
        assert_eq!((h.pid, h.how), (me, Holds::Process));
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            tx.send(rustix::thread::gettid().as_raw_nonzero().get()).unwrap();
            let _ = done_rx.recv();
        });
        let tid = u32::try_from(rx.recv().unwrap()).unwrap();
        let PidUse::TakenBy(h) = pid_use(tid).unwrap() else { panic!("own thread free") };
        assert_eq!((h.pid, h.how), (me, Holds::Thread));
        drop(done_tx);
        t.join().unwrap();
        // PID_MAX_LIMIT is 2^22: no task can have these.
        let free = pid_uses(&[(1 << 22) + 7, (1 << 22) + 8, 0, (1 << 22) + 7]).unwrap();
        assert_eq!(free.len(), 2);
        assert!(free.values().all(|u| *u == PidUse::Free), "{free:?}");
    }

    #[test]
    fn a_zombie_and_a_group_whose_leader_is_gone_are_taken() {
        use std::os::unix::process::CommandExt;
        // A child that exits and is not reaped yet.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let zombie = child.id();
        let t0 = Instant::now();
        loop {
            match pid_use(zombie).unwrap() {
                PidUse::TakenBy(PidHolder { how: Holds::Zombie { parent }, .. }) => {
                    assert_eq!(parent, std::process::id());
                    break;
                }
                other => assert!(t0.elapsed() < Duration::from_secs(10), "{other:?}"),
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        child.wait().unwrap();
        // The leader of a group of its own starts a sleep in that group and exits; once it is reaped its number
        // is the sleep's process group.
        let mut sh =
            std::process::Command::new("sh").args(["-c", "sleep 30 & exit 0"]).process_group(0).spawn().unwrap();
        let leader = sh.id();
        sh.wait().unwrap();
        let got = pid_use(leader).unwrap();
        let PidUse::TakenBy(h) = &got else { panic!("{leader} free: {got:?}") };
        // The sleep, or the shell's fork of it before its exec.
        assert!(h.how == Holds::ProcessGroup && ["sleep", "sh"].contains(&h.comm.as_str()), "{got:?}");
        assert_ne!(h.pid, leader);
        crate::tree::kill(h.pid).unwrap();
    }
}
