//! Raw bytes into `DeviceClaims::decode`, as the restore reads `cuda-migrate-devices.img` from CRIU's image
//! directory: it returns (never panics, hangs or allocates beyond its bounds), and a refusal renders as a message.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(e) = ccm_identity::claims::DeviceClaims::decode(data) {
        assert!(!e.to_string().is_empty(), "a claims error with an empty message: {e:?}");
    }
});
