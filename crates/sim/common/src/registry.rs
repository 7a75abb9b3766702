//! Which processes are CUDA processes of the simulated driver, and how a controller finds one from the pid
//! it sees, in any pid namespace, before and after CRIU restores it into a new one.
//!
//! ```text
//! STATE/reg-<id>/                 one registration per driver instance (cuInit of one process); <id> is
//!                                 64 random bits, fixed for the life of the process, CRIU restores included
//! STATE/reg-<id>/tid              the restore thread's tid, in the process's own pid namespace
//! STATE/reg-<id>/key              the key it is indexed under now (pidns.rs: <ns inode>-<ns pid>)
//! STATE/reg-<id>/id-at            address (hex) of a u64 in the process's memory that holds <id>
//! STATE/reg-<id>/state-at         address (hex) of the i32 in the process's memory that holds its state
//! STATE/reg-<id>/state, request, response   see state.rs and protocol.rs
//! STATE/proc-<key> -> reg-<id>    the index: a symlink per key
//! ```
//!
//! A controller (`cuCheckpointProcess*(pid)` in the host pid namespace) computes the key of `pid`
//! ([`crate::pidns::key_of`]) and follows `proc-<key>`. The process keeps its index current itself: its
//! restore thread compares its key every poll and re-points the index when it changed. That alone is not
//! enough after CRIU restored a container: the restored process has a new pid namespace (new key), and the
//! plugin asks for its restore thread id while CRIU still holds every thread ptrace-stopped, so the process
//! cannot have moved yet. The controller then **adopts** the registration: among the registrations whose
//! recorded key has the same namespace pid, the one whose `id-at` address in `pid`'s memory
//! (`/proc/<pid>/mem`, memory CRIU restored) holds its `<id>` is that process's; the controller points the
//! index at it. Whoever comes second finds the index already right.
//!
//! Thread ids in `tid` are the process's own; [`Resolved::host_tid`] is the same thread as the
//! controller's `/proc` names it, which is what `cuCheckpointProcessGetRestoreThreadId` answers (the
//! plugin ptrace-resumes that tid).

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::pidns::{self, ProcKey};
use crate::{write_atomic, SimError, StateDir};

const REG_PREFIX: &str = "reg-";
const INDEX_PREFIX: &str = "proc-";

/// A registration directory `STATE/reg-<id>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registration {
    pub id: u64,
    dir: PathBuf,
}

impl Registration {
    pub fn new(state: &StateDir, id: u64) -> Registration {
        Registration { id, dir: state.root().join(Self::dir_name(id)) }
    }
    fn dir_name(id: u64) -> String {
        format!("{REG_PREFIX}{id:016x}")
    }
    /// `<id>` as it appears in file names (also the owner part of the allocation files).
    pub fn id_text(&self) -> String {
        format!("{:016x}", self.id)
    }
    pub fn dir(&self) -> &Path {
        &self.dir
    }
    /// A custom-storage operation's regions (CUDA 13.4), one line per GPU slot: `UUID SIZE PATH` (the region file
    /// the caller reads or fills).
    pub fn custom_regions(&self) -> PathBuf {
        self.dir.join("custom-regions")
    }
    /// The region file of GPU slot `slot` of a custom-storage operation.
    pub fn custom_region(&self, slot: usize) -> PathBuf {
        self.dir.join(format!("region-{slot}"))
    }
    /// The restore thread's tid in the process's own pid namespace.
    pub fn tid(&self) -> PathBuf {
        self.dir.join("tid")
    }
    /// 0 RUNNING, 1 LOCKED, 2 CHECKPOINTED.
    pub fn state(&self) -> PathBuf {
        self.dir.join("state")
    }
    pub fn request(&self) -> PathBuf {
        self.dir.join("request")
    }
    pub fn response(&self) -> PathBuf {
        self.dir.join("response")
    }
    pub fn key(&self) -> PathBuf {
        self.dir.join("key")
    }
    pub fn id_at(&self) -> PathBuf {
        self.dir.join("id-at")
    }
    pub fn state_at(&self) -> PathBuf {
        self.dir.join("state-at")
    }

    /// The restore thread's tid as the process knows it.
    pub fn ns_tid(&self) -> Option<i32> {
        std::fs::read_to_string(self.tid()).ok()?.trim().parse().ok()
    }

    /// The key the process was last indexed under.
    pub fn recorded_key(&self) -> Option<ProcKey> {
        std::fs::read_to_string(self.key()).ok()?.parse().ok()
    }

    /// Whether `pid`'s memory holds this registration's id where the process said it keeps it.
    fn is_in_memory_of(&self, pid: i32) -> bool {
        read_memory::<8>(pid, &self.id_at()).is_some_and(|w| u64::from_ne_bytes(w) == self.id)
    }

    /// The process's checkpoint state as its memory holds it (0 RUNNING, 1 LOCKED, 2 CHECKPOINTED), `pid` being
    /// its pid in the caller's `/proc`. This is what the driver's state is after CRIU restored the process, while
    /// the `state` file says what the process last wrote, possibly after the dump CRIU restored it from. `None`
    /// without ptrace access to `pid` (the caller then falls back to the file).
    pub fn state_in_memory_of(&self, pid: i32) -> Option<i32> {
        read_memory::<4>(pid, &self.state_at()).map(i32::from_ne_bytes)
    }
}

/// `N` bytes of `pid`'s memory at the address (hex) written in `addr_file`.
fn read_memory<const N: usize>(pid: i32, addr_file: &Path) -> Option<[u8; N]> {
    let text = std::fs::read_to_string(addr_file).ok()?;
    let addr = u64::from_str_radix(text.trim().trim_start_matches("0x"), 16).ok()?;
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).ok()?;
    let mut bytes = [0u8; N];
    mem.read_exact_at(&mut bytes, addr).ok()?;
    Some(bytes)
}

impl StateDir {
    /// The index entry of a key: `STATE/proc-<key>`, a symlink to the registration.
    pub fn index(&self, key: &ProcKey) -> PathBuf {
        self.root().join(format!("{INDEX_PREFIX}{key}"))
    }

    /// The registration `proc-<key>` points to, if any.
    pub fn follow(&self, key: &ProcKey) -> Option<Registration> {
        let target = std::fs::read_link(self.index(key)).ok()?;
        let name = target.file_name()?.to_str()?;
        let id = u64::from_str_radix(name.strip_prefix(REG_PREFIX)?, 16).ok()?;
        Some(Registration::new(self, id))
    }

    /// Every registration directory.
    pub fn registrations(&self) -> Vec<Registration> {
        let Ok(entries) = std::fs::read_dir(self.root()) else { return Vec::new() };
        entries
            .filter_map(Result::ok)
            .filter_map(|e| {
                let name = e.file_name();
                let id = u64::from_str_radix(name.to_str()?.strip_prefix(REG_PREFIX)?, 16).ok()?;
                Some(Registration::new(self, id))
            })
            .collect()
    }

    /// Points `proc-<key>` at `reg` (atomically: a new symlink renamed over the old entry) and records the
    /// key in the registration.
    pub fn point_index(&self, key: &ProcKey, reg: &Registration) -> Result<(), SimError> {
        let index = self.index(key);
        let io = |what: &str, source| SimError::Io { what: format!("{what} {}", index.display()), source };
        // SAFETY: getpid and gettid have no preconditions.
        let (pid, tid) = unsafe { (libc::getpid(), libc::gettid()) };
        let tmp = self.root().join(format!(".{INDEX_PREFIX}{key}.{pid}.{tid}.tmp"));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(Registration::dir_name(reg.id), &tmp).map_err(|e| io("link", e))?;
        std::fs::rename(&tmp, &index).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            io("rename into place", e)
        })?;
        write_atomic(&reg.key(), key.to_string().as_bytes())
    }

    /// Removes `proc-<key>` if it points at `reg` (another process may have taken the key since).
    pub fn unpoint_index(&self, key: &ProcKey, reg: &Registration) {
        if self.follow(key).is_some_and(|r| r.id == reg.id) {
            let _ = std::fs::remove_file(self.index(key));
        }
    }
}

/// A live registration found for a controller's pid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    pub registration: Registration,
    pub key: ProcKey,
    /// The restore thread, as the controller's `/proc` names it.
    pub host_tid: i32,
}

/// The registration of `pid` (a pid of the caller's `/proc`), if `pid` is a live process of the
/// simulated driver: through the index, else by adopting a registration that moved namespace (see the
/// module comment). A stale index entry of a dead process does not count.
pub fn resolve(state: &StateDir, pid: i32) -> Option<Resolved> {
    let key = pidns::key_of(pid).ok()?;
    if let Some(registration) = state.follow(&key) {
        if let Some(host_tid) = registration.ns_tid().and_then(|t| pidns::host_tid(pid, t)) {
            return Some(Resolved { registration, key, host_tid });
        }
    }
    adopt(state, pid, key)
}

fn adopt(state: &StateDir, pid: i32, key: ProcKey) -> Option<Resolved> {
    state
        .registrations()
        .into_iter()
        .filter(|r| r.recorded_key().is_some_and(|k| k.ns_pid == key.ns_pid))
        .filter(|r| r.is_in_memory_of(pid))
        .find_map(|registration| {
            let host_tid = registration.ns_tid().and_then(|t| pidns::host_tid(pid, t))?;
            if let Err(e) = state.point_index(&key, &registration) {
                eprintln!("ccm-sim: cannot re-index process {pid}: {e}");
            }
            Some(Resolved { registration, key, host_tid })
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Registers this test process as the simulated driver would: registration `id`, its id said to be kept
    /// at `cell`'s address.
    fn register(state: &StateDir, id: u64, cell: &u64, key: ProcKey) -> Registration {
        let reg = Registration::new(state, id);
        std::fs::create_dir_all(reg.dir()).unwrap();
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        std::fs::write(reg.tid(), tid.to_string()).unwrap();
        std::fs::write(reg.id_at(), format!("{:x}", cell as *const u64 as usize)).unwrap();
        state.point_index(&key, &reg).unwrap();
        reg
    }

    #[test]
    fn the_index_finds_a_live_process_and_not_a_dead_thread() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::new(dir.path());
        let id = Box::new(0x1234_5678_9abc_def0_u64);
        let key = pidns::own_key().unwrap();
        let reg = register(&state, *id, &id, key);
        assert_eq!(state.follow(&key), Some(reg.clone()));
        assert_eq!(reg.recorded_key(), Some(key));
        // SAFETY: getpid and gettid have no preconditions.
        let (pid, tid) = unsafe { (libc::getpid(), libc::gettid()) };
        let r = resolve(&state, pid).unwrap();
        assert_eq!((r.registration, r.key, r.host_tid), (reg.clone(), key, tid));

        // A tid that is no thread of ours: the registration is stale, and nothing else matches.
        std::fs::write(reg.tid(), i32::MAX.to_string()).unwrap();
        assert_eq!(resolve(&state, pid), None);
        assert_eq!(resolve(&state, 999_999), None);

        state.unpoint_index(&key, &Registration::new(&state, 1));
        assert!(state.follow(&key).is_some(), "removed an index entry of another registration");
        state.unpoint_index(&key, &reg);
        assert_eq!(state.follow(&key), None);
    }

    #[test]
    fn a_registration_that_moved_namespace_is_adopted_by_its_memory() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::new(dir.path());
        // SAFETY: getpid and gettid have no preconditions.
        let (pid, tid) = unsafe { (libc::getpid(), libc::gettid()) };
        let now = pidns::own_key().unwrap();
        // As CRIU leaves it: registered under the key of a namespace that is gone, same namespace pid.
        let before = ProcKey { ns_inode: now.ns_inode ^ 0x5a5a, ns_pid: now.ns_pid };
        // Two candidates with our namespace pid: one whose id is not where it says in our memory, and ours.
        let elsewhere = Box::new(7_u64);
        let decoy = register(&state, 8, &elsewhere, ProcKey { ns_inode: 1, ns_pid: now.ns_pid });
        let id = Box::new(0xfeed_u64);
        let reg = register(&state, *id, &id, before);
        // And one with another namespace pid (never read).
        register(&state, 9, &id, ProcKey { ns_inode: 1, ns_pid: now.ns_pid + 1 });
        assert_eq!(state.follow(&now), None);

        let r = resolve(&state, pid).expect("not adopted");
        assert_eq!((&r.registration, r.key, r.host_tid), (&reg, now, tid));
        assert_eq!(state.follow(&now), Some(reg.clone()));
        assert_eq!(reg.recorded_key(), Some(now));
        // The next call goes through the index.
        assert_eq!(resolve(&state, pid).map(|r| r.registration), Some(reg));
        assert_eq!(state.follow(&ProcKey { ns_inode: 1, ns_pid: now.ns_pid }), Some(decoy));
    }
}
