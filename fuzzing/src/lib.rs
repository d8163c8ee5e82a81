//! Runs a fuzz target body in the normal test suite: a seeded, time-bounded
//! mutational fuzzer on the stable toolchain, so CI exercises every parser
//! of network and file input for a bounded time without cargo-fuzz. The same
//! bodies are cargo-fuzz targets (`*/fuzz/`) for longer, coverage-guided
//! runs.
//!
//! Each round takes an input from the corpus (the seeds, then inputs that
//! were kept), applies a few random mutations — bit flips, byte and block
//! insertions, deletions and copies, interesting values, splices with
//! another input — and calls the body. A panic fails the test with the
//! input in hex and the seed to replay it (`SPINLINK_FUZZ_SEED`). Without
//! coverage feedback, the corpus keeps a random sample of mutated inputs so
//! mutations compound.
//!
//! `SPINLINK_FUZZ_SECONDS` sets the time per target (default
//! [`DEFAULT_SECONDS`]); start at [`Fuzz::new`].

#![forbid(unsafe_code)]

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};

/// Seconds each target runs unless `SPINLINK_FUZZ_SECONDS` says otherwise.
pub const DEFAULT_SECONDS: f64 = 6.0;
/// Longest input a mutation may produce.
pub const DEFAULT_MAX_LEN: usize = 4096;
/// Inputs the corpus holds at most.
const CORPUS_MAX: usize = 256;

/// A small, fast generator (xorshift64*): reproducible from its seed.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator starting at `seed` (0 is replaced).
    pub fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next_u64() % n as u64) as usize
        }
    }
}

/// One target's run.
pub struct Fuzz {
    name: &'static str,
    seeds: Vec<Vec<u8>>,
    dictionary: Vec<Vec<u8>>,
    max_len: usize,
    time: Duration,
    seed: u64,
}

impl Fuzz {
    /// A run of the target `name` for the configured time.
    pub fn new(name: &'static str) -> Self {
        let secs = std::env::var("SPINLINK_FUZZ_SECONDS")
            .ok()
            .and_then(|s| s.parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s >= 0.0)
            .unwrap_or(DEFAULT_SECONDS);
        let seed = std::env::var("SPINLINK_FUZZ_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(1, |d| d.as_nanos() as u64)
            });
        Self {
            name,
            seeds: vec![Vec::new()],
            dictionary: Vec::new(),
            max_len: DEFAULT_MAX_LEN,
            time: Duration::from_secs_f64(secs),
            seed,
        }
    }

    /// Inputs to start from (valid examples the mutations break).
    #[must_use]
    pub fn seeds<I, S>(mut self, seeds: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<[u8]>,
    {
        self.seeds
            .extend(seeds.into_iter().map(|s| s.as_ref().to_vec()));
        self
    }

    /// Tokens mutations insert (keywords, magic numbers, field names).
    #[must_use]
    pub fn dictionary<I, S>(mut self, words: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<[u8]>,
    {
        self.dictionary
            .extend(words.into_iter().map(|s| s.as_ref().to_vec()));
        self
    }

    /// The longest input to try.
    #[must_use]
    pub fn max_len(mut self, n: usize) -> Self {
        self.max_len = n.max(1);
        self
    }

    /// Calls `body` on mutated inputs until the time is up; panics (naming
    /// the input and the seed) if `body` panics. Returns the rounds run.
    pub fn run(self, mut body: impl FnMut(&[u8])) -> u64 {
        let mut rng = Rng::new(self.seed);
        let mut corpus = self.seeds.clone();
        let start = Instant::now();
        let mut rounds = 0u64;
        // The seeds themselves first.
        for s in &self.seeds {
            self.call(&mut body, s);
            rounds += 1;
        }
        while start.elapsed() < self.time {
            let base = corpus[rng.below(corpus.len())].clone();
            let input = self.mutate(&mut rng, base, &corpus);
            self.call(&mut body, &input);
            rounds += 1;
            // Keep a sample, so mutations build on mutations.
            if rng.below(16) == 0 {
                if corpus.len() < CORPUS_MAX {
                    corpus.push(input);
                } else {
                    let at = self.seeds.len() + rng.below(CORPUS_MAX - self.seeds.len());
                    corpus[at] = input;
                }
            }
        }
        eprintln!(
            "fuzz {}: {rounds} inputs in {:.1} s (seed {})",
            self.name,
            start.elapsed().as_secs_f64(),
            self.seed
        );
        rounds
    }

    fn call(&self, body: &mut impl FnMut(&[u8]), input: &[u8]) {
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| body(input))) {
            let hex: String = input.iter().map(|b| format!("{b:02x}")).collect();
            let what = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_default();
            panic!(
                "fuzz {} failed on input {hex} ({} bytes): {what}\nreplay with SPINLINK_FUZZ_SEED={}",
                self.name,
                input.len(),
                self.seed
            );
        }
    }

    fn mutate(&self, rng: &mut Rng, mut data: Vec<u8>, corpus: &[Vec<u8>]) -> Vec<u8> {
        const INTERESTING: [u8; 9] = [0, 1, 0x7f, 0x80, 0xff, 0x3f, 0x40, 0x20, 0x0a];
        for _ in 0..1 + rng.below(4) {
            let len = data.len();
            match rng.below(9) {
                0 if len > 0 => {
                    let i = rng.below(len);
                    data[i] ^= 1 << rng.below(8);
                }
                1 if len > 0 => {
                    let i = rng.below(len);
                    data[i] = INTERESTING[rng.below(INTERESTING.len())];
                }
                2 => {
                    let i = rng.below(len + 1);
                    data.insert(i, rng.next_u64() as u8);
                }
                3 if len > 0 => {
                    let i = rng.below(len);
                    let n = 1 + rng.below((len - i).min(16));
                    data.drain(i..i + n);
                }
                4 if len > 0 => {
                    // Copy a block elsewhere (repeated structures).
                    let from = rng.below(len);
                    let n = 1 + rng.below((len - from).min(64));
                    let block = data[from..from + n].to_vec();
                    let to = rng.below(len + 1);
                    data.splice(to..to, block);
                }
                5 if !self.dictionary.is_empty() => {
                    let word = &self.dictionary[rng.below(self.dictionary.len())];
                    let to = rng.below(len + 1);
                    data.splice(to..to, word.iter().copied());
                }
                6 if len >= 4 => {
                    // A length-like field: big-endian u16/u24/u32 at random.
                    let i = rng.below(len - 3);
                    let v = (rng.next_u64() as u32).to_be_bytes();
                    let n = 2 + rng.below(3);
                    data[i..i + n].copy_from_slice(&v[4 - n..]);
                }
                7 => {
                    // Splice with another input.
                    let other = &corpus[rng.below(corpus.len())];
                    let cut = rng.below(len + 1);
                    let from = rng.below(other.len() + 1);
                    data.truncate(cut);
                    data.extend_from_slice(&other[from..]);
                }
                _ if len > 0 => {
                    let n = rng.below(len);
                    data.truncate(n.max(1));
                }
                _ => data.push(rng.next_u64() as u8),
            }
        }
        data.truncate(self.max_len);
        data
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_that_panics_on_some_input_is_found_and_reported() {
        // A parser bug two mutations away from the seed.
        let caught = catch_unwind(|| {
            // Its own time, whatever SPINLINK_FUZZ_SECONDS says: the run
            // stops at the first panic.
            let fuzz = Fuzz {
                time: Duration::from_secs(30),
                ..Fuzz::new("demo")
            };
            fuzz.seeds([b"GET /"]).run(|data| {
                if data.starts_with(b"GEX") {
                    panic!("bad method");
                }
            });
        });
        let message = caught.expect_err("not found").downcast::<String>().unwrap();
        assert!(
            message.contains("bad method") && message.contains("SPINLINK_FUZZ_SEED"),
            "{message}"
        );
    }

    #[test]
    fn the_same_seed_makes_the_same_inputs() {
        let f = Fuzz::new("x");
        let mut a = Rng::new(7);
        let mut b = Rng::new(7);
        let corpus = vec![b"abcdef".to_vec()];
        assert_eq!(
            f.mutate(&mut a, b"abcdef".to_vec(), &corpus),
            f.mutate(&mut b, b"abcdef".to_vec(), &corpus)
        );
    }
}
