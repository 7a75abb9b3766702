//! Stable-Rust fuzzing of the identity image reader: a deterministic mutation loop over the checked-in seed
//! corpus (`fuzz/seeds/identity_image/`: real images from dumps on the test doubles plus hand-made edge
//! cases), with the same oracle as the cargo-fuzz targets (`fuzz/src/oracle.rs`). It runs in every
//! `cargo test`, with no nightly toolchain; the coverage-guided run is `tests/suite-fuzz.sh`.
//!
//! A counting global allocator turns "no unbounded allocation" into an assertion: no single allocation
//! while decoding may exceed a small multiple of the input's size.
//!
//! `CCM_MUTATION_RUNS=N` changes the number of mutated inputs (default 60 000; a few seconds).

// Test code: a failed unwrap or expect names its line (the workspace lints keep them out of product code).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../fuzz/src/oracle.rs"]
mod oracle;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::PathBuf;

/// The system allocator, recording the largest single request of each thread since its last reset (per
/// thread, so the harness's other tests running in parallel do not count).
struct LargestAllocation;

thread_local! {
    // const-initialised and without Drop: using it inside the allocator never allocates.
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn record(size: usize) {
    // try_with: no panic while the thread's locals are being torn down.
    let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
}

// SAFETY: every call is forwarded unchanged to the system allocator; only a counter is updated besides.
unsafe impl GlobalAlloc for LargestAllocation {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        record(layout.size());
        // SAFETY: the caller upholds GlobalAlloc::alloc's contract, which System's alloc has too.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by System with this layout (every allocation goes through alloc).
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        record(new_size);
        // SAFETY: as for dealloc; `new_size` satisfies realloc's contract by the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: LargestAllocation = LargestAllocation;

/// xorshift64*: deterministic, so a failure reproduces with the printed run number.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            usize::try_from(self.next() % n as u64).unwrap()
        }
    }
}

/// Values that sit on the format's bounds, written over counts and lengths.
const INTERESTING_U32: [u32; 12] = [0, 1, 2, 16, 63, 64, 65, 4095, 4096, 4097, 0x7fff_ffff, u32::MAX];

fn mutate(rng: &mut Rng, seeds: &[Vec<u8>], input: &mut Vec<u8>) {
    for _ in 0..=rng.below(4) {
        let len = input.len();
        match rng.below(8) {
            // flip a bit
            0 if len > 0 => {
                let at = rng.below(len);
                input[at] ^= 1 << rng.below(8);
            }
            // set a byte
            1 if len > 0 => {
                let at = rng.below(len);
                input[at] = rng.next().to_le_bytes()[0];
            }
            // an interesting little-endian u32
            2 if len >= 4 => {
                let at = rng.below(len - 3);
                let v = INTERESTING_U32[rng.below(INTERESTING_U32.len())];
                input[at..at + 4].copy_from_slice(&v.to_le_bytes());
            }
            // truncate
            3 => input.truncate(rng.below(len + 1)),
            // insert random bytes
            4 => {
                let at = rng.below(len + 1);
                let n = 1 + rng.below(16);
                let bytes: Vec<u8> = (0..n).map(|_| rng.next().to_le_bytes()[0]).collect();
                input.splice(at..at, bytes);
            }
            // remove a range
            5 if len > 0 => {
                let at = rng.below(len);
                let n = 1 + rng.below((len - at).min(32));
                input.drain(at..at + n);
            }
            // splice in a piece of another seed
            6 => {
                let other = &seeds[rng.below(seeds.len())];
                if !other.is_empty() {
                    let from = rng.below(other.len());
                    let n = 1 + rng.below((other.len() - from).min(64));
                    let at = rng.below(len + 1);
                    input.splice(at..at, other[from..from + n].iter().copied());
                }
            }
            // duplicate a range (repeated records)
            _ if len > 0 => {
                let from = rng.below(len);
                let n = 1 + rng.below((len - from).min(128));
                let piece = input[from..from + n].to_vec();
                let at = rng.below(len + 1);
                input.splice(at..at, piece);
            }
            _ => {}
        }
    }
}

fn seeds() -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/identity_image");
    let mut seeds: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("seed corpus {}: {e}", dir.display()))
        .map(|entry| {
            let path = entry.expect("seed corpus entry").path();
            let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            (path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(), bytes)
        })
        .collect();
    seeds.sort();
    seeds
}

/// Checks one input under the allocation bound: the decoder may allocate in proportion to the input
/// (strings, lists), never more.
fn check(input: &[u8], what: &dyn Fn() -> String) {
    let bound = 64 * 1024 + 16 * input.len();
    LARGEST.with(|l| l.set(0));
    let result = std::panic::catch_unwind(|| oracle::check_decode(input));
    let largest = LARGEST.with(Cell::get);
    if let Err(panic) = result {
        std::panic::resume_unwind(Box::new(format!("{}: {:?}", what(), panic.downcast_ref::<String>())));
    }
    assert!(largest <= bound, "{}: an allocation of {largest} bytes for a {}-byte input", what(), input.len());
}

#[test]
fn real_images_in_the_corpus_decode() {
    let seeds = seeds();
    let real: Vec<_> = seeds.iter().filter(|(name, _)| name.starts_with("real-")).collect();
    assert!(real.len() >= 3, "the corpus must hold real images from dumps (real-*.img), found {}", real.len());
    for (name, bytes) in real {
        ccm_identity::image::IdentityImage::decode(bytes)
            .unwrap_or_else(|e| panic!("seed {name} is a real image but does not decode: {e}"));
    }
}

#[test]
fn every_seed_meets_the_oracle() {
    for (name, bytes) in seeds() {
        check(&bytes, &|| format!("seed {name}"));
        check(&oracle::with_consistent_framing(&bytes), &|| format!("seed {name} with consistent framing"));
    }
}

#[test]
fn mutated_seeds_meet_the_oracle() {
    let runs: usize = std::env::var("CCM_MUTATION_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(60_000);
    let named = seeds();
    let seeds: Vec<Vec<u8>> = named.iter().map(|(_, b)| b.clone()).collect();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for run in 0..runs {
        let pick = rng.below(seeds.len());
        let mut input = seeds[pick].clone();
        mutate(&mut rng, &seeds, &mut input);
        // Half the runs keep the framing consistent so the payload parser sees the mutation.
        if run % 2 == 1 {
            input = oracle::with_consistent_framing(&input);
        }
        check(&input, &|| format!("run {run} (seed {}, {} bytes)", named[pick].0, input.len()));
    }
}

#[test]
fn the_oracle_crc_matches_the_format() {
    // Cross-check the oracle's own CRC32 against an image the product wrote.
    for (name, bytes) in seeds().into_iter().filter(|(n, _)| n.starts_with("real-")) {
        let body = bytes.len() - ccm_identity::image::TRAILER_LEN;
        let stored = u32::from_le_bytes(bytes[body..].try_into().expect("4 bytes"));
        assert_eq!(oracle::crc32(&bytes[..body]), stored, "{name}");
    }
}
