//! The identity scan reads only resident memory (issue 41 part 2): a process that maps a great deal of untouched
//! address space (free for it with `MAP_NORESERVE`) must not make root fault it all in, nor take long, and a PCI
//! signature in touched memory beside it is still found.

// Test code: a failed unwrap or expect names its line (the workspace lints keep them out of product code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use ccm_identity::{GpuUuid, PciSignature};
use ccm_process::{read_maps, scan_identity_over, ScanScope};

const CHUNK: usize = 64 << 20;
const CHUNKS: usize = 256; // 16 GiB of address space, none of it touched

/// Whether the page at `addr` of this process is backed (pagemap bits 63 and 62).
fn backed(addr: usize) -> bool {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open("/proc/self/pagemap").unwrap();
    let mut e = [0u8; 8];
    f.read_exact_at(&mut e, (addr as u64 / 4096) * 8).unwrap();
    u64::from_le_bytes(e) >> 62 != 0
}

#[test]
fn untouched_address_space_is_skipped_not_faulted_in_and_a_signature_beside_it_is_found() {
    let mut regions = Vec::new();
    for _ in 0..CHUNKS {
        // SAFETY: a fresh private anonymous mapping the kernel places; never read or written by this test.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                CHUNK,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        // Every other one with another VM flag, so that the kernel merges none of them into one large mapping (the
        // red team's 64 MiB chunks each stayed a mapping of their own, admitted by the scan's scope).
        if regions.len() % 2 == 1 {
            // SAFETY: advises the mapping just made; it changes no content.
            assert_eq!(unsafe { libc::madvise(p, CHUNK, libc::MADV_DONTFORK) }, 0);
        }
        regions.push(p as usize);
    }
    // One touched page holding a signature, in a small mapping of its own.
    let sig = PciSignature {
        domain: 0,
        bus: 0x2a,
        device: 0,
        zero: 0,
        pci_device_id: 0x2335_10de,
        pci_subsystem_id: 0x18bf_10de,
    };
    let mut page = vec![0u8; 1 << 20];
    page[4096..4096 + PciSignature::LEN_BYTES].copy_from_slice(&sig.to_bytes());
    let gpu = GpuUuid([7; 16]);
    let me = std::process::id();
    let maps = read_maps(me).unwrap();
    let started = Instant::now();
    let report = scan_identity_over(me, &maps, &[(gpu, sig)], &[], ScanScope::LIBCUDA_OBJECTS).unwrap();
    let took = started.elapsed();
    assert!(report.sites.iter().any(|s| s.gpu == gpu), "the signature in touched memory is found");
    assert!(
        report.bytes_not_resident >= ((CHUNKS - 2) * CHUNK) as u64,
        "the untouched 16 GiB (but a chunk or two the kernel merged with a neighbour beyond the scope) are skipped as not resident: {} MiB",
        report.bytes_not_resident >> 20
    );
    assert!(report.bytes_scanned < 2 << 30, "only resident memory is read: {} MiB", report.bytes_scanned >> 20);
    assert!(took < Duration::from_secs(10), "took {took:?}");
    assert!(report.stopped.is_none(), "{:?}", report.stopped);
    // Nothing of the untouched space was faulted in by the scan.
    for r in &regions {
        assert!(!backed(*r) && !backed(*r + CHUNK / 2), "the scan faulted in {r:#x}");
    }
    drop(page);
    for r in regions {
        // SAFETY: unmaps exactly the mappings made above, which nothing refers to.
        unsafe { libc::munmap(r as *mut libc::c_void, CHUNK) };
    }
}
