//! Our own descriptors, as a process that CRIU will dump sees them.

/// Closes every descriptor above stdio that this process inherited.
///
/// A process CRIU is to dump must not hold an inherited descriptor CRIU cannot restore (a file
/// on another mount namespace's mount, a pipe of the launcher): call this first thing in `main`,
/// before the process opens anything of its own.
pub fn close_inherited_fds() {
    // SAFETY: close_range(3, ~0, 0) only closes descriptors; the caller runs it before it opens
    // any descriptor of its own, so nothing in the process refers to the closed ones. A kernel
    // without close_range answers ENOSYS, which leaves everything as it was.
    unsafe {
        libc::syscall(libc::SYS_close_range, 3 as libc::c_uint, libc::c_uint::MAX, 0 as libc::c_uint);
    }
}
