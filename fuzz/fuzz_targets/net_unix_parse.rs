//! Raw bytes into `ccm_process::sockets::parse_net_unix`, the reader of `/proc/PID/net/unix` (whose paths any
//! process of the namespace chooses, line breaks included). For any input: it returns; every path it reports is a
//! file's (starts with `/`); and an inode it reports is no longer reported once another record names it too (the
//! ambiguity rule that keeps a path from forging a record for another socket).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let bound = ccm_process::sockets::parse_net_unix(data);
    for path in bound.values() {
        assert!(path.starts_with('/'), "a reported path that is no file's: {path:?}");
    }
    if let Some(&inode) = bound.keys().next() {
        let mut twice = data.to_vec();
        if !twice.ends_with(b"\n") {
            twice.push(b'\n');
        }
        twice
            .extend_from_slice(format!("0000000000000000: 00000002 00000000 00010000 0001 01 {inode:>5}\n").as_bytes());
        let again = ccm_process::sockets::parse_net_unix(&twice);
        assert!(!again.contains_key(&inode), "inode {inode} named by two records is still reported: {again:?}");
    }
});
