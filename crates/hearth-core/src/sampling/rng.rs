//! xoshiro256** (Blackman & Vigna, 2018) seeded through splitmix64: small, fast, and defined
//! only with integer arithmetic, so a seed gives the same stream on every platform, wasm included.

/// The xoshiro256** generator. Its state is never all zero (splitmix64 cannot produce four zeros).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Xoshiro256StarStar {
    state: [u64; 4],
}

/// One step of splitmix64; the recommended way to expand a 64-bit seed into xoshiro state.
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Xoshiro256StarStar {
    pub fn seed_from_u64(seed: u64) -> Self {
        let mut sm = seed;
        let state = [splitmix64(&mut sm), splitmix64(&mut sm), splitmix64(&mut sm), splitmix64(&mut sm)];
        Xoshiro256StarStar { state }
    }

    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.state;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1) with 53 random bits (exactly representable, platform independent).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}
