//! What must hold for ANY input to the identity image reader, checked by the cargo-fuzz targets and by
//! the stable-Rust mutation test (`tests/identity_image_mutation.rs`), which includes this file.
//!
//! - `IdentityImage::decode` returns (never panics, hangs or allocates beyond the input's size; the
//!   allocation bound is enforced by libFuzzer's `-malloc_limit_mb` and by the mutation test's allocator);
//! - an error renders as a message (its `Display` does not panic);
//! - an accepted image is within the format's bounds and is canonical: encoding it gives back the same
//!   bytes (apart from the reserved flags, which the reader ignores), and decoding those gives back the
//!   same image. An image of an older format version is written back in the current one, so for it only
//!   the second half holds.

use ccm_identity::image::{IdentityImage, FORMAT_VERSION, HEADER_LEN, TRAILER_LEN};

/// Offset of the format version (u16) in the header.
const VERSION_AT: usize = 8;
/// Offset of the reserved flags (u16) in the header.
const FLAGS_AT: usize = 10;
/// Offset of the payload length (u32) in the header.
const PAYLOAD_LEN_AT: usize = 12;

/// Decodes `bytes` and checks the properties above; panics (a fuzz finding) when one does not hold.
pub fn check_decode(bytes: &[u8]) {
    match IdentityImage::decode(bytes) {
        Err(e) => {
            let message = e.to_string();
            assert!(!message.is_empty(), "an image error with an empty message: {e:?}");
        }
        Ok(image) => {
            if let Err(e) = image.check_bounds() {
                panic!("decode accepted an image outside the format's bounds: {e}");
            }
            let encoded = image.encode();
            let version = u16::from_le_bytes([bytes[VERSION_AT], bytes[VERSION_AT + 1]]);
            if version < FORMAT_VERSION {
                match IdentityImage::decode(&encoded) {
                    Ok(again) => assert!(again == image, "an older image, written back, decodes differently"),
                    Err(e) => panic!("an older image, written back in the current format, does not decode: {e}"),
                }
                return;
            }
            let mut expected = bytes.to_vec();
            // Flags are written as 0 and ignored on read; the checksum covers them, so recompute it.
            if expected[FLAGS_AT..FLAGS_AT + 2] != [0, 0] {
                expected[FLAGS_AT..FLAGS_AT + 2].copy_from_slice(&[0, 0]);
                set_checksum(&mut expected);
            }
            assert!(encoded == expected, "decode accepted a non-canonical image: re-encoding changed its bytes");
            match IdentityImage::decode(&encoded) {
                Ok(again) => assert!(again == image, "decode(encode(image)) differs from image"),
                Err(e) => panic!("a re-encoded image does not decode: {e}"),
            }
        }
    }
}

/// `data` made into an image whose header length and trailer checksum agree with its payload (when it is
/// long enough to have a header and a trailer), so mutations of the payload reach the payload parser.
pub fn with_consistent_framing(data: &[u8]) -> Vec<u8> {
    let mut bytes = data.to_vec();
    if bytes.len() < HEADER_LEN + TRAILER_LEN {
        return bytes;
    }
    let payload_len = u32::try_from(bytes.len() - HEADER_LEN - TRAILER_LEN).unwrap_or(u32::MAX);
    bytes[PAYLOAD_LEN_AT..PAYLOAD_LEN_AT + 4].copy_from_slice(&payload_len.to_le_bytes());
    set_checksum(&mut bytes);
    bytes
}

/// Rewrites the trailer with the CRC32 of everything before it.
fn set_checksum(bytes: &mut [u8]) {
    let body_end = bytes.len() - TRAILER_LEN;
    let crc = crc32(&bytes[..body_end]);
    bytes[body_end..].copy_from_slice(&crc.to_le_bytes());
}

/// CRC-32 (IEEE 802.3, reflected, as crc32fast and zlib compute it); bitwise, no table: the oracle must not
/// depend on the code it checks, and speed does not matter at these sizes.
pub fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in data {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            let mask = (crc & 1).wrapping_neg();
            crc = (crc >> 1) ^ (0xEDB8_8320 & mask);
        }
    }
    !crc
}
