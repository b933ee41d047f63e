//! A seeded random number generator for the randomized tests.

/// A tiny deterministic PRNG (xorshift64*), so a randomized test can print
/// its seed and be replayed without a dependency.
#[derive(Debug, Clone)]
pub struct XorShift(u64);

impl XorShift {
    /// A generator from `seed` (0 is mapped to a fixed non-zero state).
    pub fn new(seed: u64) -> XorShift {
        XorShift(if seed == 0 {
            0x9E37_79B9_7F4A_7C15
        } else {
            seed
        })
    }

    /// A seed from `variable` when set (to replay a run), else from the clock.
    ///
    /// # Panics
    /// When `variable` is set to something other than a `u64`.
    pub fn seed_from_env(variable: &str) -> u64 {
        match std::env::var(variable) {
            Ok(text) => text
                .parse()
                .unwrap_or_else(|e| panic!("{variable}={text} is not a u64 seed: {e}")),
            Err(_) => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |elapsed| elapsed.as_nanos() as u64),
        }
    }

    /// The next number.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n` (n > 0), close enough for test workloads.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}
