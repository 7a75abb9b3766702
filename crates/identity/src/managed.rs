//! CUDA managed memory (`cudaMallocManaged`, `cuMemAllocManaged`: UVM) as seen from outside the process.
//!
//! Driver 580's checkpoint does not support managed memory: `cuCheckpointProcessCheckpoint` answers
//! `CUDA_ERROR_NOT_SUPPORTED` after the process was locked. From outside, managed memory is a shared mapping of
//! `/dev/nvidia-uvm`. Measured on H100s (driver 580.159.04, docs/GPU-TESTING.md "Managed memory"):
//!
//! - every CUDA process, torch included, maps exactly one 2 MiB region of `/dev/nvidia-uvm` of the driver's own,
//!   low in the address space, inside the range libcuda reserves for device memory (`0x203400000`, `0x204a00000`);
//! - each managed allocation adds a mapping where the kernel places `mmap`s (`0x7f...`): 64 MiB for a 64 MiB
//!   allocation; one 2 MiB mapping holding both a 4 KiB and a 1 MiB allocation; another 2 MiB one for a 2 MiB
//!   allocation.
//!
//! So a 2 MiB mapping below [`DRIVER_REGION_BELOW`] is the driver's own, and every other one is managed memory.
//! A managed allocation the kernel placed that low (only after some 60 TiB of mappings) would be missed: the
//! driver still refuses its checkpoint, and the plugin unlocks the tree again. A driver region outside that rule
//! would be taken for managed memory: `CRIU_CUDA_MIGRATE_MANAGED=try` lets the driver decide.

/// The size of the driver's own `/dev/nvidia-uvm` region in every CUDA process.
pub const DRIVER_REGION_BYTES: u64 = 2 << 20;

/// The driver's region lies in libcuda's reservation, far below where the kernel places `mmap`s (47-bit
/// address spaces put them just under 128 TiB, growing down): 64 TiB.
pub const DRIVER_REGION_BELOW: u64 = 1 << 46;

/// One `/dev/nvidia-uvm` mapping of a process, `[start, end)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UvmMapping {
    pub start: u64,
    pub end: u64,
}

impl UvmMapping {
    pub fn len(&self) -> u64 {
        self.end.saturating_sub(self.start)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The driver's own region: 2 MiB, low in the address space.
    pub fn is_driver_region(&self) -> bool {
        self.len() == DRIVER_REGION_BYTES && self.start < DRIVER_REGION_BELOW
    }
}

/// A process's managed memory: the mappings beyond the driver's own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ManagedMemory {
    /// How many mappings.
    pub mappings: usize,
    /// Their bytes (address space: managed pages may sit on the host, on the GPU or nowhere yet).
    pub bytes: u64,
    /// The largest one, for the message.
    pub largest: Option<UvmMapping>,
}

impl ManagedMemory {
    pub fn is_empty(&self) -> bool {
        self.mappings == 0
    }
}

/// The managed memory among a process's `/dev/nvidia-uvm` mappings.
pub fn managed_memory(uvm: impl IntoIterator<Item = UvmMapping>) -> ManagedMemory {
    let mut m = ManagedMemory::default();
    for u in uvm.into_iter().filter(|u| !u.is_empty() && !u.is_driver_region()) {
        m.mappings += 1;
        m.bytes = m.bytes.saturating_add(u.len());
        match m.largest {
            Some(l) if l.len() >= u.len() => {}
            _ => m.largest = Some(u),
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(start: u64, len: u64) -> UvmMapping {
        UvmMapping { start, end: start + len }
    }

    const MIB: u64 = 1 << 20;

    /// The measured shapes: a plain CUDA process (torch too), one 64 MiB allocation, and 4 KiB + 1 MiB + 2 MiB more.
    #[test]
    fn the_measured_processes() {
        assert!(managed_memory([map(0x2_04a0_0000, 2 * MIB)]).is_empty());
        assert!(managed_memory([map(0x2_0340_0000, 2 * MIB)]).is_empty());
        let one = managed_memory([map(0x2_04a0_0000, 2 * MIB), map(0x7f33_8800_0000, 64 * MIB)]);
        assert_eq!((one.mappings, one.bytes), (1, 64 * MIB));
        assert_eq!(one.largest, Some(map(0x7f33_8800_0000, 64 * MIB)));
        let more = managed_memory([
            map(0x2_04a0_0000, 2 * MIB),
            map(0x7f0a_1200_0000, 2 * MIB),
            map(0x7f0a_1220_0000, 2 * MIB),
            map(0x7f0a_1400_0000, 64 * MIB),
        ]);
        assert_eq!((more.mappings, more.bytes), (3, 68 * MIB));
        assert_eq!(more.largest.map(|l| l.len()), Some(64 * MIB));
    }

    /// Not the driver's region: another size low down, or 2 MiB up where mmaps go; empty ones count for nothing.
    #[test]
    fn what_is_not_the_driver_region() {
        assert!(!map(0x2_0000_0000, 4 * MIB).is_driver_region());
        assert!(!map(DRIVER_REGION_BELOW, 2 * MIB).is_driver_region());
        assert!(map(DRIVER_REGION_BELOW - 2 * MIB, 2 * MIB).is_driver_region());
        assert!(managed_memory([map(0x7f00_0000_0000, 0)]).is_empty());
        assert!(managed_memory([]).is_empty());
    }
}
