//! The payload parser: the input with its header length and CRC32 trailer made consistent first, so the
//! fuzzer's mutations are not all stopped by the checksum.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    ccm_identity_fuzz::oracle::check_decode(&ccm_identity_fuzz::oracle::with_consistent_framing(data));
});
