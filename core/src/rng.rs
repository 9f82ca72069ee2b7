//! A counter-based random number generator: value `i` of stream `seed` is a pure function of
//! `(seed, i)`, written with 32-bit integer ops only, so the Cpu and every GPU produce the same bits
//! (the WGSL twin is `rand.wgsl`). Dropout masks are therefore identical on every backend.

/// PCG-style integer hash (one round of a permuted congruential step).
pub fn pcg_hash(x: u32) -> u32 {
    let state = x.wrapping_mul(747_796_405).wrapping_add(2_891_336_453);
    let word = ((state >> ((state >> 28) + 4)) ^ state).wrapping_mul(277_803_737);
    (word >> 22) ^ word
}

/// The 32-bit key a 64-bit seed is folded into.
pub fn seed_key(seed: u64) -> u32 {
    pcg_hash((seed as u32) ^ pcg_hash((seed >> 32) as u32 ^ 0x9e37_79b9))
}

/// Uniform in [0, 1) with 24 random bits: exactly representable in f32, so equal on every backend.
pub fn uniform(key: u32, i: u32) -> f32 {
    (pcg_hash(i ^ pcg_hash(key.wrapping_add(i.rotate_left(16)))) >> 8) as f32 * (1.0 / 16_777_216.0)
}

/// Standard normal from two uniforms (Box–Muller); host-side only, used to create random tensors.
pub fn normal(key: u32, i: u32) -> f32 {
    let u1 = uniform(key, 2 * i).max(1e-7);
    let u2 = uniform(key, 2 * i + 1);
    (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos()
}

#[cfg(test)]
mod tests {
    #[test]
    fn uniform_is_spread_and_seeded() {
        let k = super::seed_key(42);
        let xs: Vec<f32> = (0..10_000).map(|i| super::uniform(k, i)).collect();
        let mean = xs.iter().sum::<f32>() / xs.len() as f32;
        assert!((mean - 0.5).abs() < 0.02, "mean {mean}");
        assert!(xs.iter().all(|&x| (0.0..1.0).contains(&x)));
        assert_ne!(super::uniform(super::seed_key(43), 0), xs[0]);
    }
}
