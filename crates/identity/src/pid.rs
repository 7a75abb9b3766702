//! Pids of two pid namespaces, kept apart by type. CRIU, `/proc`, ptrace and the driver name a
//! process by its pid in CRIU's pid namespace ([`HostPid`]; the host's, unless CRIU itself runs in
//! a container); an identity image records the pid the process has in its own, innermost pid
//! namespace ([`NsPid`]), which is what CRIU restores it with. A container's init is `NsPid` 1 and
//! some `HostPid` that changes with every restore.

use std::fmt;

/// A pid as CRIU's pid namespace names it.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HostPid(u32);

/// A pid as the process's own (innermost) pid namespace names it.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
pub struct NsPid(pub u32);

/// A thread id as CRIU's pid namespace names it (the driver's restore thread, which ptrace takes).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HostTid(u32);

/// The largest pid Linux hands out (`PID_MAX_LIMIT`, 2^22): every pid fits the driver's `int`.
const PID_MAX_LIMIT: u32 = 1 << 22;

impl HostPid {
    /// A pid as a CRIU hook or the driver passes it: positive and at most `PID_MAX_LIMIT`, else
    /// `None` (0 and negative values name process groups in kill(2), never one process).
    // The cast follows the range check (a const fn has no try_from): 1..=2^22 fits u32.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    pub const fn new(raw: i64) -> Option<HostPid> {
        if raw >= 1 && raw <= PID_MAX_LIMIT as i64 {
            Some(HostPid(raw as u32))
        } else {
            None
        }
    }
    /// The number, for `/proc` paths and the process layer.
    pub fn get(self) -> u32 {
        self.0
    }
    /// The number as the driver's C API takes it (`int`; it always fits).
    // At most PID_MAX_LIMIT (2^22) by construction (`new`), so it fits i32.
    #[allow(clippy::cast_possible_wrap)]
    pub fn driver(self) -> i32 {
        self.0 as i32
    }
}

impl HostTid {
    pub const fn new(raw: i64) -> Option<HostTid> {
        match HostPid::new(raw) {
            Some(p) => Some(HostTid(p.0)),
            None => None,
        }
    }
    pub fn get(self) -> u32 {
        self.0
    }
}

// Debug is the bare number too: lists of pids (`{:?}` of a Vec) are read in CRIU's log by people and
// by the tests, which expect `[12, 34]`, as before the types.
impl fmt::Debug for HostPid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Debug for NsPid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Debug for HostTid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Display for HostPid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Display for NsPid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Display for HostTid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_of_pids_reads_as_numbers() {
        let pids = [HostPid::new(12).unwrap(), HostPid::new(34).unwrap()];
        assert_eq!(format!("{pids:?}"), "[12, 34]");
        assert_eq!(format!("{:?}", [NsPid(1)]), "[1]");
    }

    #[test]
    fn only_real_pids_are_pids() {
        assert_eq!(HostPid::new(42).map(HostPid::get), Some(42));
        assert_eq!(HostPid::new(42).map(HostPid::driver), Some(42));
        for bad in [0, -1, -42, i64::from(u32::MAX), (1 << 22) + 1] {
            assert_eq!(HostPid::new(bad), None, "{bad}");
        }
        assert_eq!(HostTid::new(7).map(HostTid::get), Some(7));
    }
}
