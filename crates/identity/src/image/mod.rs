//! The identity image: what the dump node knew about a CUDA process's GPUs.
//!
//! The plugin writes one image per CUDA process at dump, into CRIU's image directory, as
//! `cuda-migrate-<pid>.img`; restore reads it back and never modifies it. The format is a small,
//! hand-written, little-endian binary layout (see `docs/IMAGE-FORMAT.md`): a fixed header, a
//! payload and a CRC32 trailer. Decoding treats the file as untrusted input: every count and
//! length is bounded and checked against the bytes that remain before anything is allocated,
//! and no input makes it panic.
//!
//! - [`records`]: what an image holds (the process, its GPUs, the places of their identity in its
//!   memory, its device memory), with no knowledge of the bytes;
//! - [`codec`]: the byte layout, its bounds and the errors of a damaged or foreign file.
//!
//! The other identity rules (`devprop`, `memory`, `map`, `pattern`) read these records; the records
//! depend on nothing but the GPU types.

mod codec;
mod records;

pub use codec::*;
pub use records::*;

/// The name of the restore report the plugin leaves next to the images (never an image itself).
pub fn report_file_name(pid: u32) -> String {
    format!("cuda-migrate-restore-{pid}.txt")
}

/// The pid of a restore report's file name (see [`report_file_name`]).
pub fn is_report_file_name(name: &str) -> Option<u32> {
    pid_in_name(name, "cuda-migrate-restore-", ".txt")
}

/// Parses the pid back out of an identity image's file name (`cuda-migrate-<pid>.img`).
/// Only the canonical decimal form that [`IdentityImage::file_name`] writes is accepted.
pub fn is_image_file_name(name: &str) -> Option<u32> {
    pid_in_name(name, "cuda-migrate-", ".img")
}

/// The pid between `prefix` and `suffix` of a file name the plugin writes, in the canonical decimal form only: no
/// sign, no leading zero ("007" would name the same pid as "7" and is not a file we write).
pub(crate) fn pid_in_name(name: &str, prefix: &str, suffix: &str) -> Option<u32> {
    let digits = name.strip_prefix(prefix)?.strip_suffix(suffix)?;
    if digits.is_empty() || !digits.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let pid: u32 = digits.parse().ok()?;
    (pid.to_string() == digits).then_some(pid)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::gpu::{GpuIdentity, GpuUuid, PciAddress, PciSignature};
    use proptest::prelude::*;

    pub(crate) fn uuid(n: u8) -> GpuUuid {
        let mut b = [0u8; 16];
        b[0] = 0xa0;
        b[15] = n;
        GpuUuid(b)
    }

    pub(crate) fn h200(n: u8, bus: u32) -> GpuIdentity {
        GpuIdentity {
            uuid: uuid(n),
            pci: PciAddress { domain: 0, bus: 0, device: bus, function: 0 },
            pci_device_id: 0x2335_10de,
            pci_subsystem_id: 0x18bf_10de,
            minor: u32::from(n),
            name: "NVIDIA H200".into(),
            memory_total: 143_771 * 1024 * 1024,
        }
    }

    pub(crate) fn sample() -> IdentityImage {
        let g0 = h200(0, 6);
        let g1 = h200(1, 7);
        IdentityImage {
            staging: None,
            driver_storage: None,
            pid: 42,
            host_pid: 4242,
            dumped_at_unix: 1_760_000_000,
            hostname: "gpu-node-a".into(),
            driver_version: "580.159.04".into(),
            cuda_driver_version: 13000,
            sites: vec![
                PciSite {
                    gpu: g0.uuid,
                    addr: 0x5555_0000_1000,
                    mapping_start: 0x5555_0000_0000,
                    mapping_end: 0x5555_0010_0000,
                    mapping_name: "[heap]".into(),
                    words: g0.signature(),
                },
                PciSite {
                    gpu: g1.uuid,
                    addr: 0x7f00_0000_2000,
                    mapping_start: 0x7f00_0000_0000,
                    mapping_end: 0x7f00_0010_0000,
                    mapping_name: String::new(),
                    words: g1.signature(),
                },
            ],
            enumerated: vec![g0.uuid, g1.uuid],
            used: vec![g0.uuid],
            env: ProcessEnv {
                cuda_visible_devices: Some(g0.uuid.to_string()),
                cuda_device_order: None,
                nvidia_visible_devices: Some("all".into()),
            },
            prop_sites: vec![PropSite {
                gpu: g0.uuid,
                addr: 0x5555_0000_4000,
                runtime_major: 13,
                mapping_start: 0x5555_0000_0000,
                mapping_end: 0x5555_0010_0000,
                mapping_name: "[heap]".into(),
            }],
            device_memory: Some(vec![DeviceMemoryUse { gpu: g0.uuid, bytes: 600 << 20 }]),
            node_gpus: vec![g0, g1],
        }
    }

    /// `img` as format version 1 wrote it: the same payload up to the PCI sites, nothing after.
    fn encode_v1(img: &IdentityImage) -> Vec<u8> {
        let v2 = IdentityImage { prop_sites: Vec::new(), device_memory: None, ..img.clone() }.encode();
        // Version 2 appends a u32 count (0) and a u8 flag (0) to version 1's payload.
        let payload = &v2[HEADER_LEN..v2.len() - TRAILER_LEN - 5];
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&1u16.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&u32::try_from(payload.len()).unwrap().to_le_bytes());
        out.extend_from_slice(payload);
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    #[test]
    fn version_1_images_still_read_without_the_new_records() {
        let img = sample();
        let old = IdentityImage::decode(&encode_v1(&img)).unwrap();
        assert_eq!(old, IdentityImage { prop_sites: Vec::new(), device_memory: None, ..img });
    }

    #[test]
    fn round_trip_sample() {
        let img = sample();
        let bytes = img.try_encode().unwrap();
        assert_eq!(&bytes[..8], b"CCMIDIMG");
        assert_eq!(IdentityImage::decode(&bytes).unwrap(), img);
    }

    #[test]
    fn header_layout() {
        let bytes = sample().encode();
        assert_eq!(u16::from_le_bytes([bytes[8], bytes[9]]), 2);
        assert_eq!(u16::from_le_bytes([bytes[10], bytes[11]]), 0);
        let len = u32::from_le_bytes([bytes[12], bytes[13], bytes[14], bytes[15]]) as usize;
        assert_eq!(bytes.len(), HEADER_LEN + len + TRAILER_LEN);
        // The payload starts with pid and host_pid, little-endian.
        assert_eq!(u32::from_le_bytes([bytes[16], bytes[17], bytes[18], bytes[19]]), 42);
        assert_eq!(u32::from_le_bytes([bytes[20], bytes[21], bytes[22], bytes[23]]), 4242);
    }

    /// Rewrites the header's checksum so a test can reach the checks behind it.
    fn reseal(bytes: &mut [u8]) {
        let body = bytes.len() - TRAILER_LEN;
        let crc = crc32fast::hash(&bytes[..body]);
        bytes[body..].copy_from_slice(&crc.to_le_bytes());
    }

    #[test]
    fn specific_errors() {
        let good = sample().encode();
        assert!(matches!(IdentityImage::decode(&good[..10]), Err(ImageError::TooShort { .. })));

        let mut bad = good.clone();
        bad[0] = b'X';
        assert!(matches!(IdentityImage::decode(&bad), Err(ImageError::BadMagic)));

        let mut newer = good.clone();
        newer[8] = 9;
        let err = IdentityImage::decode(&newer).unwrap_err();
        assert_eq!(err, ImageError::NewerVersion { found: 9, supported: 4 });
        assert!(err.to_string().contains("upgrade"));

        let mut zero = good.clone();
        zero[8] = 0;
        assert!(matches!(IdentityImage::decode(&zero), Err(ImageError::UnsupportedVersion { .. })));

        let mut flipped = good.clone();
        let mid = flipped.len() / 2;
        flipped[mid] ^= 0x40;
        assert!(matches!(IdentityImage::decode(&flipped), Err(ImageError::ChecksumMismatch { .. })));

        assert!(matches!(IdentityImage::decode(&good[..good.len() - 1]), Err(ImageError::Truncated { .. })));
        let mut longer = good.clone();
        longer.push(0);
        assert!(matches!(IdentityImage::decode(&longer), Err(ImageError::TrailingBytes { .. })));

        let mut huge_len = good.clone();
        huge_len[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(IdentityImage::decode(&huge_len), Err(ImageError::LengthOutOfBounds { .. })));
    }

    #[test]
    fn inner_errors_behind_a_valid_checksum() {
        let img = sample();
        // hostname length field sits at payload offset 16 (pid, host_pid, dumped_at).
        let hostname_len_at = HEADER_LEN + 16;
        let mut bytes = img.encode();
        bytes[hostname_len_at..hostname_len_at + 4].copy_from_slice(&5000u32.to_le_bytes());
        reseal(&mut bytes);
        assert!(matches!(IdentityImage::decode(&bytes), Err(ImageError::LengthOutOfBounds { field: "hostname", .. })));

        let mut bytes = img.encode();
        bytes[hostname_len_at + 4] = 0xff; // first byte of "gpu-node-a"
        reseal(&mut bytes);
        assert!(matches!(IdentityImage::decode(&bytes), Err(ImageError::InvalidUtf8 { field: "hostname" })));

        // A count that claims more elements than bytes remain is refused before allocating.
        let mut bytes = img.encode();
        let node_count_at = HEADER_LEN + 16 + 4 + img.hostname.len() + 4 + img.driver_version.len() + 4;
        bytes[node_count_at..node_count_at + 4].copy_from_slice(&64u32.to_le_bytes());
        reseal(&mut bytes);
        assert!(matches!(IdentityImage::decode(&bytes), Err(ImageError::Truncated { .. })));

        // Payload with extra bytes after the last site, sealed correctly.
        let mut bytes = img.encode();
        let body = bytes.len() - TRAILER_LEN;
        bytes.insert(body, 0);
        let len = u32::try_from(body + 1 - HEADER_LEN).unwrap();
        bytes[12..16].copy_from_slice(&len.to_le_bytes());
        reseal(&mut bytes);
        assert!(matches!(IdentityImage::decode(&bytes), Err(ImageError::TrailingBytes { .. })));
    }

    #[test]
    fn bounds_are_checked_at_encode() {
        let mut img = sample();
        img.hostname = "x".repeat(MAX_STRING_BYTES + 1);
        assert!(matches!(img.try_encode(), Err(ImageError::LengthOutOfBounds { field: "hostname", .. })));
        assert!(IdentityImage::decode(&img.encode()).is_err());
    }

    /// A table of data chunks only, laid out as [`crate::staging::DriverStorage::places`] says.
    fn driver_storage(sizes: &[u64]) -> crate::staging::DriverStorage {
        use crate::staging::{DriverRegion, DriverStorage, StagedChunk, StagingRegion, StagingTable, MIN_CHUNK_BYTES};
        let mut file_bytes = 0;
        let mut table_regions = Vec::new();
        for (_, start, len) in DriverStorage::places(sizes).unwrap() {
            let chunks = (0..len.div_ceil(MIN_CHUNK_BYTES))
                .map(|k| {
                    let l = MIN_CHUNK_BYTES.min(len - k * MIN_CHUNK_BYTES);
                    let c = StagedChunk::Data { offset: file_bytes, crc: 9 };
                    file_bytes += l;
                    c
                })
                .collect();
            table_regions.push(StagingRegion { start, len, chunks });
        }
        DriverStorage {
            regions: sizes
                .iter()
                .enumerate()
                .map(|(i, &size)| DriverRegion { gpu: uuid(u8::try_from(i).unwrap()), size })
                .collect(),
            table: StagingTable { chunk_bytes: MIN_CHUNK_BYTES, file_bytes, regions: table_regions },
        }
    }

    #[test]
    fn driver_storage_images_are_version_4_and_round_trip() {
        // The second GPU holds nothing: its region is empty and has no chunks.
        let d = driver_storage(&[3 * crate::staging::MIN_CHUNK_BYTES + 100, 0, 4096]);
        assert_eq!(d.table.regions.len(), 2);
        d.check().unwrap();
        let img = IdentityImage { driver_storage: Some(d.clone()), ..sample() };
        let bytes = img.try_encode().unwrap();
        assert_eq!(u16::from_le_bytes([bytes[8], bytes[9]]), 4);
        assert_eq!(IdentityImage::decode(&bytes).unwrap(), img);
        // With a staging table beside it.
        let both = IdentityImage { staging: Some(d.table.clone()), ..img.clone() };
        assert_eq!(IdentityImage::decode(&both.try_encode().unwrap()).unwrap(), both);
        // A staging table alone is still version 3, which the previous release reads.
        let v3 = IdentityImage { staging: Some(d.table.clone()), ..sample() }.try_encode().unwrap();
        assert_eq!(u16::from_le_bytes([v3[8], v3[9]]), 3);
        // A table whose regions are not where the sizes put them is refused, at encode and at decode.
        let mut forged = d.clone();
        forged.regions[0].size = 4096;
        let img = IdentityImage { driver_storage: Some(forged), ..sample() };
        assert!(matches!(img.try_encode(), Err(ImageError::Staging(_))));
        assert!(matches!(IdentityImage::decode(&img.encode()), Err(ImageError::Staging(_))));
        let mut fewer = d;
        fewer.regions.remove(0);
        assert!(matches!(fewer.check(), Err(crate::staging::StagingError::DriverRegions { .. })));
    }

    #[test]
    fn file_names() {
        assert_eq!(IdentityImage::file_name(1234), "cuda-migrate-1234.img");
        assert_eq!(is_image_file_name("cuda-migrate-1234.img"), Some(1234));
        assert_eq!(is_image_file_name(&IdentityImage::file_name(u32::MAX)), Some(u32::MAX));
        for bad in [
            "cuda-migrate-.img",
            "cuda-migrate-+5.img",
            "cuda-migrate-007.img",
            "cuda-migrate-12a.img",
            "cuda-migrate-restore-12.txt",
            "cuda-migrate-99999999999.img",
            "pages-1.img",
        ] {
            assert_eq!(is_image_file_name(bad), None, "{bad}");
        }
        assert_eq!(is_report_file_name(&report_file_name(12)), Some(12));
        assert_eq!(is_report_file_name("cuda-migrate-12.img"), None);
        assert_eq!(is_report_file_name("cuda-migrate-restore-012.txt"), None);
        let img = sample();
        assert_eq!(img.gpu(&uuid(1)).map(|g| g.pci.device), Some(7));
        assert!(img.gpu(&uuid(9)).is_none());
    }

    fn arb_uuid() -> impl Strategy<Value = GpuUuid> {
        any::<[u8; 16]>().prop_map(GpuUuid)
    }

    fn arb_gpu() -> impl Strategy<Value = GpuIdentity> {
        (arb_uuid(), any::<[u32; 4]>(), any::<[u32; 3]>(), "[^\\p{Cc}]{0,20}", any::<u64>()).prop_map(
            |(uuid, p, ids, name, memory_total)| GpuIdentity {
                uuid,
                pci: PciAddress { domain: p[0], bus: p[1], device: p[2], function: p[3] },
                pci_device_id: ids[0],
                pci_subsystem_id: ids[1],
                minor: ids[2],
                name,
                memory_total,
            },
        )
    }

    fn arb_site() -> impl Strategy<Value = PciSite> {
        (arb_uuid(), any::<[u64; 3]>(), "[\\[\\]a-z/._ -]{0,30}", any::<[u32; 6]>()).prop_map(
            |(gpu, a, mapping_name, w)| PciSite {
                gpu,
                addr: a[0],
                mapping_start: a[1],
                mapping_end: a[2],
                mapping_name,
                words: PciSignature::from(w),
            },
        )
    }

    fn arb_prop_site() -> impl Strategy<Value = PropSite> {
        (arb_uuid(), any::<[u64; 3]>(), any::<u16>(), "[\\[\\]a-z/._ -]{0,30}").prop_map(
            |(gpu, a, runtime_major, mapping_name)| PropSite {
                gpu,
                addr: a[0],
                runtime_major,
                mapping_start: a[1],
                mapping_end: a[2],
                mapping_name,
            },
        )
    }

    fn arb_memory() -> impl Strategy<Value = Option<Vec<DeviceMemoryUse>>> {
        proptest::option::of(prop::collection::vec(
            (arb_uuid(), any::<u64>()).prop_map(|(gpu, bytes)| DeviceMemoryUse { gpu, bytes }),
            0..4,
        ))
    }

    pub(crate) fn arb_image() -> impl Strategy<Value = IdentityImage> {
        (
            (any::<u32>(), any::<u32>(), any::<u64>(), "[^\\p{Cc}]{0,30}", "[0-9.]{0,12}", any::<i32>()),
            prop::collection::vec(arb_gpu(), 0..6),
            prop::collection::vec(arb_uuid(), 0..6),
            prop::collection::vec(arb_uuid(), 0..6),
            (
                proptest::option::of("[^\\p{Cc}]{0,40}"),
                proptest::option::of("[^\\p{Cc}]{0,12}"),
                proptest::option::of("[^\\p{Cc}]{0,40}"),
            ),
            prop::collection::vec(arb_site(), 0..10),
            (prop::collection::vec(arb_prop_site(), 0..4), arb_memory()),
        )
            .prop_map(|(head, node_gpus, enumerated, used, env, sites, (prop_sites, device_memory))| {
                IdentityImage {
                    staging: None,
                    driver_storage: None,
                    pid: head.0,
                    host_pid: head.1,
                    dumped_at_unix: head.2,
                    hostname: head.3,
                    driver_version: head.4,
                    cuda_driver_version: head.5,
                    node_gpus,
                    enumerated,
                    used,
                    env: ProcessEnv {
                        cuda_visible_devices: env.0,
                        cuda_device_order: env.1,
                        nvidia_visible_devices: env.2,
                    },
                    sites,
                    prop_sites,
                    device_memory,
                }
            })
    }

    proptest! {
        #[test]
        fn prop_round_trip(img in arb_image()) {
            let bytes = img.try_encode().unwrap();
            prop_assert_eq!(IdentityImage::decode(&bytes).unwrap(), img);
        }

        #[test]
        fn prop_random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
            let _ = IdentityImage::decode(&bytes);
        }

        #[test]
        fn prop_random_payload_behind_valid_header_never_panics(
            payload in prop::collection::vec(any::<u8>(), 0..512)
        ) {
            // Random payloads with a correct header and checksum reach the field parser.
            let mut bytes = MAGIC.to_vec();
            bytes.extend_from_slice(&1u16.to_le_bytes());
            bytes.extend_from_slice(&0u16.to_le_bytes());
            bytes.extend_from_slice(&u32::try_from(payload.len()).unwrap().to_le_bytes());
            bytes.extend_from_slice(&payload);
            let crc = crc32fast::hash(&bytes);
            bytes.extend_from_slice(&crc.to_le_bytes());
            let _ = IdentityImage::decode(&bytes);
        }

        #[test]
        fn prop_every_truncation_fails(img in arb_image()) {
            let bytes = img.encode();
            for len in 0..bytes.len() {
                prop_assert!(IdentityImage::decode(&bytes[..len]).is_err(), "length {}", len);
            }
        }

        #[test]
        fn prop_single_byte_corruption_fails(img in arb_image(), at in any::<prop::sample::Index>(), xor in 1u8..=255) {
            let mut bytes = img.encode();
            let i = at.index(bytes.len());
            bytes[i] ^= xor;
            prop_assert!(IdentityImage::decode(&bytes).is_err(), "byte {} ^ {:#x}", i, xor);
        }
    }
}
