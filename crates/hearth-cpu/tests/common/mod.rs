//! What the kernel tests share (and `src/attention/tests.rs`, through a `#[path]`).

/// Small deterministic PRNG (PCG-style LCG) so failures reproduce.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u32(&mut self) -> u32 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) as u32
    }

    /// Uniform in [-1, 1).
    pub fn unit(&mut self) -> f32 {
        (self.next_u32() >> 8) as f32 / (1u32 << 23) as f32 - 1.0
    }

    /// `n` values uniform in [-scale, scale).
    #[allow(dead_code)] // not every test crate that includes this module draws vectors
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.unit() * scale).collect()
    }
}
