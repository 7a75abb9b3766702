//! Raw bytes into `IdentityImage::decode`, as the plugin reads a file from CRIU's image directory.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    ccm_identity_fuzz::oracle::check_decode(data);
});
