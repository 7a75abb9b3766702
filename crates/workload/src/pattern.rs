//! The known data each ordinal's buffer holds: a per-ordinal fill word, with every 1 MiB block
//! stamped at its start with (magic, ordinal, block index, !block index).
//!
//! The fill word alone would not notice pages moved inside the buffer or a buffer swapped
//! with another ordinal's; the stamps do, and cost one 16-byte copy per MiB to write.

/// Bytes per stamped block.
pub const BLOCK_BYTES: usize = 1 << 20;
/// 32-bit words per block.
pub const BLOCK_WORDS: usize = BLOCK_BYTES / 4;
/// Words of the stamp at the start of every block.
pub const STAMP_WORDS: usize = 4;
const STAMP_MAGIC: u32 = 0xB10C_5EED;

/// The word every non-stamp position of `ordinal`'s buffer holds.
pub fn fill_word(ordinal: u32) -> u32 {
    0x5EED_0000 ^ ordinal.wrapping_mul(0x0101_0101)
}

/// The stamp at the start of block `block` of `ordinal`'s buffer.
pub fn stamp(ordinal: u32, block: usize) -> [u32; STAMP_WORDS] {
    // The low 32 bits of the block number: 2^32 blocks is far past any buffer this makes.
    #[allow(clippy::cast_possible_truncation)]
    let b = block as u32;
    [STAMP_MAGIC, ordinal, b, !b]
}

/// Native-endian bytes of a stamp, as written to the device.
pub fn stamp_bytes(ordinal: u32, block: usize) -> [u8; STAMP_WORDS * 4] {
    let mut out = [0u8; STAMP_WORDS * 4];
    for (i, w) in stamp(ordinal, block).iter().enumerate() {
        out[i * 4..i * 4 + 4].copy_from_slice(&w.to_ne_bytes());
    }
    out
}

/// The expected word at word index `index` of `ordinal`'s buffer.
pub fn expected_word(ordinal: u32, index: usize) -> u32 {
    let within = index % BLOCK_WORDS;
    if within < STAMP_WORDS {
        stamp(ordinal, index / BLOCK_WORDS)[within]
    } else {
        fill_word(ordinal)
    }
}

/// Counts the words of `chunk` (device bytes from word index `first_word` on) that differ
/// from the pattern. A trailing partial word counts as wrong.
pub fn count_bad_words(ordinal: u32, first_word: usize, chunk: &[u8]) -> u64 {
    let words = chunk.chunks_exact(4);
    let partial = u64::from(!words.remainder().is_empty());
    let fill = fill_word(ordinal);
    words
        .enumerate()
        .filter(|(i, w)| {
            let got = u32::from_ne_bytes([w[0], w[1], w[2], w[3]]);
            let index = first_word + i;
            // Fast path for the fill word; the stamp positions are rare.
            let want = if index % BLOCK_WORDS >= STAMP_WORDS { fill } else { expected_word(ordinal, index) };
            got != want
        })
        .count() as u64
        + partial
}

#[cfg(test)]
mod tests {
    use super::*;

    fn make(ordinal: u32, words: usize) -> Vec<u8> {
        (0..words).flat_map(|i| expected_word(ordinal, i).to_ne_bytes()).collect()
    }

    #[test]
    fn pattern_differs_per_ordinal() {
        assert_ne!(fill_word(0), fill_word(1));
        assert_ne!(stamp(0, 3), stamp(1, 3));
        assert_ne!(stamp(0, 3), stamp(0, 4));
    }

    #[test]
    fn counts_mismatches() {
        let words = BLOCK_WORDS * 2 + 10;
        let mut buf = make(1, words);
        assert_eq!(count_bad_words(1, 0, &buf), 0);
        assert!(count_bad_words(0, 0, &buf) > 0, "another ordinal's data must not pass");
        // A chunk that starts mid-buffer is checked against its own positions.
        assert_eq!(count_bad_words(1, BLOCK_WORDS, &buf[BLOCK_BYTES..]), 0);
        assert!(count_bad_words(1, 0, &buf[BLOCK_BYTES..]) > 0, "a moved block must not pass");
        // One flipped stamp word and one flipped fill word.
        buf[BLOCK_BYTES + 8] ^= 1;
        buf[100] ^= 0x80;
        assert_eq!(count_bad_words(1, 0, &buf), 2);
        assert_eq!(count_bad_words(1, 0, &buf[..5]), 1, "a trailing partial word counts as wrong");
    }

    #[test]
    fn stamp_bytes_match_words() {
        let b = stamp_bytes(2, 7);
        let got: Vec<u32> = b.chunks_exact(4).map(|w| u32::from_ne_bytes([w[0], w[1], w[2], w[3]])).collect();
        assert_eq!(got, stamp(2, 7));
    }
}
