//! What a process holds that CRIU cannot dump ([`ccm_identity::criu_support`] decides; this reads): its descriptors'
//! link texts (read relative to its `/proc/PID/fd`, never followed, capped) and its mappings' paths.

use std::os::fd::AsFd;

use ccm_identity::criu_support::{undumpable_descriptor, undumpable_mapping, Undumpable};
use rustix::fs::{Mode, OFlags};

use crate::claims::MAX_FDS_LOOKED_AT;
use crate::procfs::proc_path;
use crate::{Mapping, ProcessError};

/// The most read of a descriptor's link text: `anon_inode:[io_uring]` and its kin are short; a longer link is a
/// path, never an anonymous inode.
const MAX_LINK_TEXT: usize = 64;

/// What `pid` (its `maps` read already) holds that CRIU cannot dump: descriptors first, then mappings.
pub fn undumpable(pid: u32, maps: &[Mapping]) -> Result<Vec<Undumpable>, ProcessError> {
    let mut found = Vec::new();
    let path = proc_path(pid, "fd");
    let dir =
        rustix::fs::open(&path, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| crate::procfs::io_error(pid, "opening", &path, e.into()))?;
    let entries = rustix::fs::Dir::read_from(dir.as_fd())
        .map_err(|e| crate::procfs::io_error(pid, "listing", &path, e.into()))?;
    for entry in entries.take(MAX_FDS_LOOKED_AT) {
        let Ok(entry) = entry else { break };
        let Some(fd) = entry.file_name().to_str().ok().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(link) = rustix::fs::readlinkat(dir.as_fd(), entry.file_name(), Vec::with_capacity(MAX_LINK_TEXT)) else {
            continue;
        };
        let bytes = link.as_bytes();
        if bytes.len() > MAX_LINK_TEXT {
            continue;
        }
        if let Some(u) = std::str::from_utf8(bytes).ok().and_then(|l| undumpable_descriptor(fd, l)) {
            found.push(u);
        }
    }
    found.sort_by_key(|u| format!("{:?}", u.held_as));
    found.extend(maps.iter().filter_map(|m| undumpable_mapping(m.start, &m.path)));
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This test process with an eventfd (CRIU dumps it) holds nothing undumpable; with an io_uring it would (made
    /// here only where the kernel allows io_uring_setup).
    #[test]
    fn an_eventfd_is_dumpable_and_an_io_uring_is_not() {
        let me = std::process::id();
        let maps = crate::read_maps(me).unwrap();
        let _efd = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC).unwrap();
        assert!(undumpable(me, &maps).unwrap().iter().all(|u| !u.kind.contains("eventfd")));
        let mut params = [0u8; 120];
        // SAFETY: io_uring_setup(2) reads and writes only the 120-byte io_uring_params we pass; a failure (ENOSYS,
        // EPERM where io_uring is disabled) leaves nothing to clean up.
        let ring = unsafe { libc::syscall(libc::SYS_io_uring_setup, 4 as libc::c_long, params.as_mut_ptr()) };
        if ring < 0 {
            eprintln!("io_uring_setup is refused here; the descriptor half of this test is skipped");
            return;
        }
        let ring = i32::try_from(ring).unwrap();
        let held = undumpable(me, &maps).unwrap();
        assert!(
            held.iter().any(|u| u.is_io_uring()
                && u.held_as == ccm_identity::criu_support::HeldAs::Descriptor(u32::try_from(ring).unwrap())),
            "{held:?}"
        );
        // SAFETY: `ring` is the descriptor io_uring_setup just returned to this test, closed once.
        unsafe { libc::close(ring) };
    }
}
