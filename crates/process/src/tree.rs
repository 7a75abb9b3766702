//! Pids, threads and the process tree, from `/proc`.

use crate::procfs::{io_error, proc_path, read_text, stat_field, MAX_CHILDREN_BYTES, MAX_SMALL_PROC_FILE};
use crate::ProcessError;
use std::collections::{BTreeSet, VecDeque};

/// The innermost namespace pid from a `/proc/PID/status` text: the last number of its `NSpid:`
/// line, or `None` when the line is missing (kernels before 4.1) or malformed.
fn parse_ns_pid(status: &str) -> Option<u32> {
    let line = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
    line.split_ascii_whitespace().last()?.parse().ok()
}

/// This process's effective uid (a syscall: no file read).
pub fn effective_uid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// The pid of `pid` as seen inside its innermost pid namespace (its own `getpid()`).
///
/// On a kernel without `NSpid` (before 4.1) there are no nested views to report, so `pid` itself
/// is returned.
pub fn ns_pid(pid: u32) -> Result<u32, ProcessError> {
    let status = read_text(pid, "status", MAX_SMALL_PROC_FILE)?;
    if !status.lines().any(|l| l.starts_with("NSpid:")) {
        return Ok(pid);
    }
    parse_ns_pid(&status).ok_or_else(|| ProcessError::Parse {
        pid,
        path: proc_path(pid, "status"),
        detail: "the NSpid line holds no pid".to_string(),
    })
}

/// Thread ids of `pid` (from `/proc/PID/task`), ascending; empty if the process is gone.
pub fn threads(pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir(proc_path(pid, "task")) else {
        return Vec::new();
    };
    let mut tids: Vec<u32> =
        entries.flatten().filter_map(|e| e.file_name().to_str().and_then(|s| s.parse().ok())).collect();
    tids.sort_unstable();
    tids
}

/// Parses a `/proc/PID/task/TID/children` text: space-separated pids.
fn parse_children(text: &str) -> Vec<u32> {
    text.split_ascii_whitespace().filter_map(|s| s.parse().ok()).collect()
}

/// `root` and all its descendants, breadth-first (`root` first), from every thread's
/// `/proc/PID/task/TID/children` (a child belongs to the thread that forked it).
///
/// Empty if `root` is gone. Processes that exit during the walk are left out; the list is a
/// snapshot, exact only while the tree is frozen (as it is under CRIU). The `children` files
/// need CONFIG_PROC_CHILDREN, which CRIU itself requires; without it only `root` is listed.
pub fn children_recursive(root: u32) -> Vec<u32> {
    if !proc_path(root, "").exists() {
        return Vec::new();
    }
    let mut order = Vec::new();
    let mut seen = BTreeSet::new();
    let mut queue = VecDeque::from([root]);
    seen.insert(root);
    while let Some(pid) = queue.pop_front() {
        order.push(pid);
        for tid in threads(pid) {
            let Ok(text) = read_text(pid, &format!("task/{tid}/children"), MAX_CHILDREN_BYTES) else {
                continue;
            };
            for child in parse_children(&text) {
                if seen.insert(child) {
                    queue.push_back(child);
                }
            }
        }
    }
    order
}

/// The command name of `pid` (`/proc/PID/comm`, at most 16 bytes), `None` when it cannot be read.
pub fn comm(pid: u32) -> Option<String> {
    read_text(pid, "comm", MAX_SMALL_PROC_FILE).ok().map(|c| c.trim_end_matches('\n').to_string())
}

/// The node's MPS server processes (`exe_name` is `nvidia-cuda-mps-server`), at most `max`: those whose command name
/// is `exe_name`'s first 15 bytes and whose executable, the file the process runs, is named `exe_name`, is root's and
/// is writable by neither its group nor others ([`runs_roots_executable_named`]). A name alone is anyone's to give a
/// program: a user's own `nvidia-cuda-mps-server` is not counted.
pub fn processes_running(exe_name: &str, max: usize) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    // The name first (cheap, at most 15 bytes: a prefix of the executable's), then the executable itself.
    let prefix: String = exe_name.chars().take(15).collect();
    let mut found = Vec::new();
    for e in entries.flatten().take(1 << 20) {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        if comm(pid).is_none_or(|c| c != prefix) {
            continue;
        }
        if runs_roots_executable_named(pid, exe_name) {
            found.push(pid);
            if found.len() >= max {
                break;
            }
        }
    }
    found
}

/// Whether `pid` runs a file named `exe_name` that is root's and that only root can write ([`is_roots_executable`]).
/// `/proc/PID/exe` is opened once (`O_PATH`: the link followed to the file the process runs, nothing of the file
/// opened for reading); its owner and mode come from `fstat` of that descriptor and its name from the descriptor's
/// own link, so both are of one file even if the process execs another meanwhile. `false` when any step fails (the
/// process gone, or not ours to look at).
fn runs_roots_executable_named(pid: u32, exe_name: &str) -> bool {
    use std::os::fd::AsRawFd;
    let flags = rustix::fs::OFlags::PATH | rustix::fs::OFlags::CLOEXEC;
    let Ok(exe) = rustix::fs::open(proc_path(pid, "exe"), flags, rustix::fs::Mode::empty()) else { return false };
    if !rustix::fs::fstat(&exe).is_ok_and(|st| is_roots_executable(&st)) {
        return false;
    }
    let Ok(path) = rustix::fs::readlink(format!("/proc/self/fd/{}", exe.as_raw_fd()), Vec::new()) else {
        return false;
    };
    let path = path.to_string_lossy();
    let name = path.rsplit('/').next().unwrap_or_default();
    name.trim_end_matches(" (deleted)") == exe_name
}

/// Whether a `stat` is of a regular file owned by root that neither its group nor others may write: a program only
/// root can have put there (what the MPS server the driver's packages install is).
fn is_roots_executable(st: &rustix::fs::Stat) -> bool {
    rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::RegularFile
        && st.st_uid == 0
        && st.st_mode & 0o022 == 0
}

/// When `pid` started (`/proc/PID/stat` field 22, clock ticks since boot): with the pid, it names one process,
/// whatever reuses the number later. `None` when it cannot be read (gone).
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = read_text(pid, "stat", MAX_SMALL_PROC_FILE).ok()?;
    stat_field(&stat, 22)?.parse().ok()
}

/// The parent of `pid` (`/proc/PID/stat` field 4), `None` when it cannot be read.
pub fn parent_of(pid: u32) -> Option<u32> {
    let stat = read_text(pid, "stat", MAX_SMALL_PROC_FILE).ok()?;
    stat_field(&stat, 4)?.parse().ok()
}

/// The state letter of `/proc/PID/stat` (`R`, `S`, `T` stopped, `t` traced, `Z` zombie...).
pub fn state_letter(pid: u32) -> Option<char> {
    let stat = read_text(pid, "stat", MAX_SMALL_PROC_FILE).ok()?;
    stat_field(&stat, 3)?.chars().next()
}

/// The task that ptrace-traces a process, as `/proc/PID/status` names it (`TracerPid`), with what
/// it runs, read when asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tracer {
    /// The tracing task (CRIU traces from its main thread, so its pid).
    pub pid: u32,
    /// Its command name (`/proc/T/comm`), empty when it could not be read.
    pub comm: String,
    /// Its executable (`/proc/T/exe`), when it could be read.
    pub exe: Option<std::path::PathBuf>,
}

impl Tracer {
    /// Whether the tracer is CRIU, by its command name or its executable's name: a dump or a
    /// restore of the process is under way.
    pub fn is_criu(&self) -> bool {
        let exe_name = self.exe.as_ref().and_then(|e| e.file_name()).map(|n| n.to_string_lossy().into_owned());
        self.comm == "criu" || exe_name.is_some_and(|n| n.trim_end_matches(" (deleted)") == "criu")
    }
}

/// The `TracerPid:` of a `/proc/PID/status` text (0: not traced), or `None` when the line is
/// missing or malformed.
fn parse_tracer_pid(status: &str) -> Option<u32> {
    status.lines().find_map(|l| l.strip_prefix("TracerPid:"))?.trim().parse().ok()
}

/// Who traces `pid` now, if anyone (`None`: not traced).
pub fn tracer(pid: u32) -> Result<Option<Tracer>, ProcessError> {
    let status = read_text(pid, "status", MAX_SMALL_PROC_FILE)?;
    let Some(t) = parse_tracer_pid(&status).filter(|t| *t != 0) else { return Ok(None) };
    let comm =
        read_text(t, "comm", MAX_SMALL_PROC_FILE).map(|c| c.trim_end_matches('\n').to_string()).unwrap_or_default();
    let exe = std::fs::read_link(proc_path(t, "exe")).ok();
    Ok(Some(Tracer { pid: t, comm, exe }))
}

/// A process held by a pidfd: a signal through it reaches that process, or nobody once it is
/// gone, never another process that got its number since.
#[derive(Debug)]
pub struct ProcessHandle {
    pub pid: u32,
    pidfd: Option<std::os::fd::OwnedFd>,
}

impl ProcessHandle {
    /// Opens a handle on `pid` (a kernel without pidfds, before 5.3, gives a handle by pid only).
    pub fn open(pid: u32) -> Result<ProcessHandle, ProcessError> {
        let p = i32::try_from(pid).ok().and_then(rustix::process::Pid::from_raw).ok_or_else(|| ProcessError::Io {
            pid,
            action: "open a pidfd of",
            path: proc_path(pid, ""),
            source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "no process can have this pid"),
        })?;
        match rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()) {
            Ok(fd) => Ok(ProcessHandle { pid, pidfd: Some(fd) }),
            Err(rustix::io::Errno::NOSYS) => Ok(ProcessHandle { pid, pidfd: None }),
            Err(rustix::io::Errno::SRCH) => Err(ProcessError::NoSuchProcess { pid, path: proc_path(pid, "") }),
            Err(e) => Err(io_error(pid, "open a pidfd of", &proc_path(pid, ""), e.into())),
        }
    }

    /// SIGKILL; a process that is already gone is not an error.
    pub fn kill(&self) -> Result<(), ProcessError> {
        match &self.pidfd {
            Some(fd) => match rustix::process::pidfd_send_signal(fd, rustix::process::Signal::KILL) {
                Ok(()) | Err(rustix::io::Errno::SRCH) => Ok(()),
                Err(e) => Err(io_error(self.pid, "sending SIGKILL to", &proc_path(self.pid, ""), e.into())),
            },
            None => kill_by_pid(self.pid),
        }
    }
}

/// Whether `pid` exists and is not a zombie (`Z`) or dead (`X`/`x`).
pub fn is_alive(pid: u32) -> bool {
    let Ok(stat) = read_text(pid, "stat", MAX_SMALL_PROC_FILE) else {
        return false;
    };
    !matches!(stat_field(&stat, 3), Some("Z" | "X" | "x") | None)
}

/// Whether `pid` is gone or on its way out: a zombie or dead, exiting (`PF_EXITING` in `/proc/PID/stat`'s flags), or
/// with a SIGKILL pending (`SigPnd`/`ShdPnd` of `/proc/PID/status`). A dump's CRIU kills the dumped tasks before it
/// exits: after its exit, a dumped task that is none of these was resumed instead.
pub fn is_gone_or_ending(pid: u32) -> bool {
    const PF_EXITING: u64 = 0x4;
    const SIGKILL_BIT: u64 = 1 << (9 - 1);
    let Ok(stat) = read_text(pid, "stat", MAX_SMALL_PROC_FILE) else {
        return true;
    };
    if matches!(stat_field(&stat, 3), Some("Z" | "X" | "x") | None) {
        return true;
    }
    if stat_field(&stat, 9).and_then(|f| f.parse::<u64>().ok()).is_some_and(|f| f & PF_EXITING != 0) {
        return true;
    }
    let Ok(status) = read_text(pid, "status", MAX_SMALL_PROC_FILE) else {
        return true;
    };
    status
        .lines()
        .filter_map(|l| l.strip_prefix("SigPnd:").or_else(|| l.strip_prefix("ShdPnd:")))
        .any(|v| u64::from_str_radix(v.trim(), 16).is_ok_and(|mask| mask & SIGKILL_BIT != 0))
}

/// Sends SIGKILL to `pid` through a pidfd opened for it (a restored task whose GPU identity could
/// not be made right must not run). A process that is already gone is not an error. Where the
/// pid was learnt long before, hold a [`ProcessHandle`] from then instead.
pub fn kill(pid: u32) -> Result<(), ProcessError> {
    if pid != 0 {
        if let Ok(h) = ProcessHandle::open(pid) {
            if h.pidfd.is_some() {
                return h.kill();
            }
        } else if !proc_path(pid, "").exists() {
            return Ok(());
        }
    }
    kill_by_pid(pid)
}

fn kill_by_pid(pid: u32) -> Result<(), ProcessError> {
    // Pids above i32::MAX cannot exist (pid_max is at most 2^22); converting one would make a
    // negative pid, which kill(2) reads as a process group.
    let Ok(raw) = i32::try_from(pid) else { return Ok(()) };
    if raw == 0 {
        // kill(0) would signal our own process group: CRIU itself.
        return Err(ProcessError::Io {
            pid,
            action: "sending SIGKILL to",
            path: proc_path(pid, ""),
            source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "pid 0 names no process"),
        });
    }
    match nix::sys::signal::kill(nix::unistd::Pid::from_raw(raw), nix::sys::signal::Signal::SIGKILL) {
        Ok(()) | Err(nix::errno::Errno::ESRCH) => Ok(()),
        Err(e) => {
            Err(io_error(pid, "sending SIGKILL to", &proc_path(pid, ""), std::io::Error::from_raw_os_error(e as i32)))
        }
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn tracer_pid_and_criu_by_name() {
        assert_eq!(parse_tracer_pid("Name:\tsleep\nTracerPid:\t4711\nUid:\t0\n"), Some(4711));
        assert_eq!(parse_tracer_pid("TracerPid:\t0\n"), Some(0));
        assert_eq!(parse_tracer_pid("Name:\tx\n"), None);
        let t = |comm: &str, exe: &str| Tracer { pid: 1, comm: comm.into(), exe: Some(exe.into()) };
        assert!(t("criu", "/usr/sbin/criu").is_criu());
        assert!(t("criu-4.1", "/opt/criu/sbin/criu (deleted)").is_criu());
        assert!(t("criu", "/x/y").is_criu());
        assert!(!t("gdb", "/usr/bin/gdb").is_criu() && !t("strace", "/usr/bin/criu-tools").is_criu());
    }
    use super::*;

    #[test]
    fn ns_pid_is_innermost() {
        let status = "Name:\tsleep\nTgid:\t4242\nPid:\t4242\nNSpid:\t4242\t17\t1\nNStgid:\t4242\t17\t1\n";
        assert_eq!(parse_ns_pid(status), Some(1));
        assert_eq!(parse_ns_pid("Name:\tx\nNSpid:\t99\n"), Some(99));
        assert_eq!(parse_ns_pid("Name:\tx\n"), None);
        assert_eq!(parse_ns_pid("NSpid:\t\n"), None);
    }

    #[test]
    fn children_text() {
        assert_eq!(parse_children("12 13 200 \n"), vec![12, 13, 200]);
        assert_eq!(parse_children(""), Vec::<u32>::new());
    }

    /// A copy of `sleep` named `nvidia-cuda-mps-server`, started as `mode` (and `owner`'s when given), and whether
    /// [`processes_running`] counts it as an MPS server. The child is killed when this returns.
    fn counted_as_mps_server(mode: u32, owner: Option<u32>) -> bool {
        use std::os::unix::fs::PermissionsExt;
        const NAME: &str = "nvidia-cuda-mps-server";
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join(NAME);
        std::fs::copy("/bin/sleep", &exe).unwrap();
        if let Some(uid) = owner {
            std::os::unix::fs::chown(&exe, Some(uid), None).unwrap();
        }
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(mode)).unwrap();
        // Another test's fork may hold the copy's write descriptor for a moment (ETXTBSY): try again.
        let mut child = None;
        for _ in 0..100 {
            match std::process::Command::new(&exe).arg("60").spawn() {
                Ok(c) => {
                    child = Some(c);
                    break;
                }
                Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) => {
                    std::thread::sleep(std::time::Duration::from_millis(20))
                }
                Err(e) => panic!("starting {}: {e}", exe.display()),
            }
        }
        let mut child = child.expect("the copy never stopped being busy");
        let pid = child.id();
        // spawn returns once the exec closed the child's descriptors, which the kernel does before it names the task
        // after the new program: the name may lag a moment (seen once as the test thread's name).
        for _ in 0..100 {
            if comm(pid).as_deref() == Some("nvidia-cuda-mps") {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(comm(pid).as_deref(), Some("nvidia-cuda-mps"), "the kernel keeps 15 bytes of the name");
        let counted = processes_running(NAME, 1 << 16).contains(&pid);
        child.kill().unwrap();
        child.wait().unwrap();
        counted
    }

    /// Guards the MPS server check (review finding: any user could run a binary called `nvidia-cuda-mps-server` and
    /// be counted as the node's MPS server): a program others can write, or, as root, one another user owns, is not
    /// counted; root's own, writable by root alone, is (so the refusals are not for another reason).
    #[test]
    fn only_a_roots_executable_counts_as_an_mps_server() {
        assert!(!counted_as_mps_server(0o777, None), "writable by others");
        assert!(!counted_as_mps_server(0o775, None), "writable by its group");
        if rustix::process::geteuid().is_root() {
            assert!(!counted_as_mps_server(0o755, Some(65534)), "owned by nobody");
            assert!(counted_as_mps_server(0o755, None), "root's, 0755");
        }
    }

    #[test]
    fn own_process() {
        let me = std::process::id();
        assert!(is_alive(me));
        assert!(ns_pid(me).unwrap() > 0);
        assert!(threads(me).contains(&me));
        assert_eq!(children_recursive(me).first(), Some(&me));
        assert!(!is_alive(u32::MAX));
        assert!(children_recursive(u32::MAX).is_empty());
        assert!(matches!(ns_pid(u32::MAX), Err(ProcessError::NoSuchProcess { .. })));
        assert!(kill(0).is_err(), "pid 0 would be our own process group");
        assert!(kill(u32::MAX).is_ok(), "no such process");
    }
}
