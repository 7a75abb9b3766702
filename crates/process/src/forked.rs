//! Whether a process holding NVIDIA descriptors opened them itself (it ran `cuInit`: the driver has a context and a
//! restore thread for it, and the plugin checkpoints it) or holds only its parent's (a child forked after the
//! parent's `cuInit`: no context of its own; the plugin claims its nodes). The kernel tells by `kcmp`: a forked
//! child's descriptors are its parent's open files. `criu-cuda-migrate job` classifies by this, as the dump does by
//! the driver's answer; and the importer check counts only processes with their own context (a dead importer's
//! memory stays under its pid number, which a forked worker may now have).

use ccm_identity::claims::{ClaimedFd, NvidiaDevices};

use crate::claims::{holdings, shares_open_file};

/// `Some(true)`: `pid` holds NVIDIA descriptors and every one is an open file of its parent's; `Some(false)`: it holds
/// one of its own (or none at all); `None`: the kernel could not tell (a process gone, no permission).
pub fn holds_only_parents_nvidia_files(pid: u32, devices: &NvidiaDevices) -> Option<bool> {
    let own = holdings(pid, &crate::read_maps(pid).ok()?, devices).ok()?;
    fds_all_parents(pid, &own.fds, devices)
}

/// [`holds_only_parents_nvidia_files`] for a process whose NVIDIA descriptors `own` were read already (`job` has
/// them): only its parent's are read.
pub fn fds_all_parents(pid: u32, own: &[ClaimedFd], devices: &NvidiaDevices) -> Option<bool> {
    if own.is_empty() {
        return Some(false);
    }
    let parent = crate::tree::parent_of(pid).filter(|&p| p != pid && p != 0)?;
    let theirs: Vec<u32> =
        holdings(parent, &crate::read_maps(parent).ok()?, devices).ok()?.fds.iter().map(|f| f.fd).collect();
    if theirs.is_empty() {
        return Some(false);
    }
    for f in own {
        match shares_open_file(pid, f.fd, parent, &theirs) {
            Some(true) => {}
            Some(false) => return Some(false),
            None => return None,
        }
    }
    Some(true)
}
