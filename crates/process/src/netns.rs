//! The loopback interface of a restored task's network namespace.
//!
//! runc dumps a container's network namespace EMPTY (its checkpoint always passes CRIU
//! `--empty-ns network`: "runc doesn't manage network devices") and, on restore, recreates only
//! veth interfaces in the new namespace CRIU makes. A namespace runc itself created (Podman
//! `--network none`: the spec asks for a new one without a path) so comes back with its loopback
//! interface DOWN, and CRIU's repair of an established TCP connection on 127.0.0.1 fails with
//! "Can't connect inet socket back: Network is unreachable". crun dumps and restores the namespace; Podman networks and
//! Kubernetes pods hand runc a namespace by path, which CRIU joins as it is.
//!
//! [`bring_loopback_up`] is what CRIU's `setup-namespaces` action script needs: after CRIU has made
//! the restored tree's namespaces and before it restores any socket, set `lo` up in the namespace
//! of the tree's root task. The namespace is entered by a pidfd on a thread of its own, so the
//! caller's thread never changes namespace.

use crate::LoopbackError;
use ccm_identity::HostPid;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

/// What [`bring_loopback_up`] found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loopback {
    /// `lo` was down; it is up now.
    BroughtUp,
    /// `lo` was up already (a namespace CRIU restored whole, or joined by path).
    AlreadyUp,
    /// The process is in this process's own network namespace (the host's): left alone.
    SharedWithUs,
}

fn failed(pid: HostPid, action: &'static str) -> impl FnOnce(std::io::Error) -> LoopbackError {
    move |source| LoopbackError::Failed { pid: pid.get(), action, source }
}

/// Sets the loopback interface of `pid`'s network namespace up, unless it is up already or the
/// namespace is this process's own. Needs CAP_NET_ADMIN over that namespace and CAP_SYS_ADMIN
/// (root, as CRIU's action scripts run).
pub fn bring_loopback_up(pid: HostPid) -> Result<Loopback, LoopbackError> {
    // The pidfd pins the process: a pid reused by another process between the check and the
    // setns cannot be entered by mistake.
    let pidfd = rustix::process::pidfd_open(
        i32::try_from(pid.get())
            .ok()
            .and_then(rustix::process::Pid::from_raw)
            .ok_or(LoopbackError::Gone { pid: pid.get() })?,
        rustix::process::PidfdFlags::empty(),
    )
    .map_err(|e| match e {
        rustix::io::Errno::SRCH => LoopbackError::Gone { pid: pid.get() },
        e => LoopbackError::Failed { pid: pid.get(), action: "open a pidfd of", source: e.into() },
    })?;
    // setns changes the calling THREAD's namespace: a thread of its own, which ends with it.
    std::thread::scope(|s| {
        s.spawn(|| in_namespace_of(pid, &pidfd))
            .join()
            .unwrap_or_else(|_| Err(failed(pid, "bring lo up in")(std::io::Error::other("its thread panicked"))))
    })
}

/// A datagram socket in the calling thread's network namespace.
fn inet_socket(pid: HostPid, action: &'static str) -> Result<OwnedFd, LoopbackError> {
    rustix::net::socket(rustix::net::AddressFamily::INET, rustix::net::SocketType::DGRAM, None)
        .map_err(|e| failed(pid, action)(e.into()))
}

/// The network namespace `sock` lives in, as (device, inode) of its nsfs file. Asked of the socket
/// (SIOCGSKNS), not of a path: nothing in a file system is looked up.
fn socket_network_namespace(pid: HostPid, sock: &OwnedFd) -> Result<(u64, u64), LoopbackError> {
    // SAFETY: SIOCGSKNS takes no argument and returns a new descriptor of the socket's network
    // namespace (or -1); `sock` is an open socket.
    let fd = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGSKNS as _) };
    if fd == -1 {
        return Err(failed(pid, "read the network namespace of a socket, for")(std::io::Error::last_os_error()));
    }
    // SAFETY: `fd` was just returned by the kernel as a new descriptor that nothing else owns.
    let ns = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let st = rustix::fs::fstat(&ns).map_err(|e| failed(pid, "stat a network namespace, for")(e.into()))?;
    Ok((st.st_dev, st.st_ino))
}

fn in_namespace_of(pid: HostPid, pidfd: &OwnedFd) -> Result<Loopback, LoopbackError> {
    let ours = socket_network_namespace(pid, &inet_socket(pid, "open a socket in our network namespace, for")?)?;
    rustix::thread::move_into_thread_name_spaces(pidfd.as_fd(), rustix::thread::ThreadNameSpaceType::NETWORK)
        .map_err(|e| failed(pid, "enter the network namespace of")(e.into()))?;
    // Compared after the move, through the pidfd: no pid reuse can make this look at another process.
    let sock = inet_socket(pid, "open a socket in the network namespace of")?;
    if socket_network_namespace(pid, &sock)? == ours {
        return Ok(Loopback::SharedWithUs);
    }
    let mut req = ifreq_lo();
    // SAFETY: SIOCGIFFLAGS reads the flags of the interface named in `req` into `req`, a live,
    // fully initialised `ifreq` of this frame that outlives the call; `sock` is an open socket.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) } == -1 {
        return Err(failed(pid, "read the flags of lo in the network namespace of")(std::io::Error::last_os_error()));
    }
    // SAFETY: after SIOCGIFFLAGS the flags member of the union is the one the kernel wrote.
    let flags = unsafe { req.ifr_ifru.ifru_flags };
    if flags & IFF_UP != 0 {
        return Ok(Loopback::AlreadyUp);
    }
    req.ifr_ifru.ifru_flags = flags | IFF_UP;
    // SAFETY: as above; SIOCSIFFLAGS only reads `req`.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) } == -1 {
        return Err(failed(pid, "set lo up in the network namespace of")(std::io::Error::last_os_error()));
    }
    Ok(Loopback::BroughtUp)
}

/// `IFF_UP` as `ifr_flags` holds it (a `c_short`).
// libc declares IFF_UP a c_int; it is bit 0, so it fits.
#[allow(clippy::cast_possible_truncation)]
const IFF_UP: libc::c_short = libc::IFF_UP as libc::c_short;

/// An `ifreq` naming `lo`, every other byte zero.
fn ifreq_lo() -> libc::ifreq {
    // SAFETY: `ifreq` is plain old data (a name array and a union of integers and structs of
    // integers), for which all zero bytes are a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        // ASCII: the same value as a c_char of either sign.
        #[allow(clippy::cast_possible_wrap)]
        {
            *dst = *src as libc::c_char;
        }
    }
    req
}
