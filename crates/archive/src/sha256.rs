//! SHA-256, for the blob digests of OCI images, from the RustCrypto `sha2` crate (hardware SHA
//! instructions where the CPU has them). Streaming: bytes go in as they are read, so a layer of many
//! GiB is verified in one pass without holding it.

use std::io::{self, Read};

use sha2::Digest;

/// A running SHA-256.
#[derive(Clone, Default)]
pub struct Sha256(sha2::Sha256);

impl Sha256 {
    pub fn update(&mut self, data: &[u8]) {
        self.0.update(data);
    }

    /// The digest, as 64 lowercase hex digits (how OCI writes it after `sha256:`).
    pub fn hex(self) -> String {
        self.0.finalize().iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// A reader that hashes and counts every byte read through it.
pub(crate) struct Hashing<R> {
    inner: R,
    hash: Sha256,
    pub(crate) count: u64,
}

impl<R: Read> Hashing<R> {
    pub(crate) fn new(inner: R) -> Self {
        Hashing { inner, hash: Sha256::default(), count: 0 }
    }

    /// Reads the rest of the stream (already bounded by the caller) and returns the digest and the
    /// byte count.
    pub(crate) fn finish(mut self) -> io::Result<(String, u64)> {
        io::copy(&mut self, &mut io::sink())?;
        Ok((self.hash.hex(), self.count))
    }
}

impl<R: Read> Hashing<R> {
    /// Reads the rest of a stream that is not bounded otherwise, at most `max` more bytes: the digest and the
    /// byte count, or `None` where more than `max` were left.
    pub(crate) fn finish_within(mut self, max: u64) -> io::Result<Option<(String, u64)>> {
        let start = self.count;
        io::copy(&mut (&mut self).take(max.saturating_add(1)), &mut io::sink())?;
        if self.count - start > max {
            return Ok(None);
        }
        Ok(Some((self.hash.hex(), self.count)))
    }
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }
}

/// The SHA-256 of `data`, as lowercase hex.
pub fn hex_digest(data: &[u8]) -> String {
    let mut h = Sha256::default();
    h.update(data);
    h.hex()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nist_vectors() {
        assert_eq!(hex_digest(b""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
        assert_eq!(hex_digest(b"abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        assert_eq!(
            hex_digest(b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
        );
        let million = vec![b'a'; 1_000_000];
        assert_eq!(hex_digest(&million), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    }

    #[test]
    fn streaming_in_any_pieces_is_the_same() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7).to_le_bytes()[0]).collect();
        for step in [1, 3, 63, 64, 65, 999] {
            let mut h = Sha256::default();
            for piece in data.chunks(step) {
                h.update(piece);
            }
            assert_eq!(h.hex(), hex_digest(&data), "pieces of {step}");
        }
    }
}
