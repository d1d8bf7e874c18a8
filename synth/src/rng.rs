//! A tiny deterministic generator: the same model bytes on every machine and thread count.

/// SplitMix64: every output is a pure function of the seed and the position.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    /// A stream for `(seed, name, index)`.
    pub(crate) fn for_stream(seed: u64, name: &str, index: u64) -> Self {
        // FNV-1a over the name, so streams are independent of tensor order.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in name.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        Rng(seed ^ h ^ index.wrapping_mul(0x9e37_79b9_7f4a_7c15))
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    pub(crate) fn uniform(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// `n` values uniform in [-scale, scale).
    pub(crate) fn fill(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform() * scale).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_deterministic_and_distinct() {
        let a = Rng::for_stream(1, "blk.0.x", 3).fill(4, 1.0);
        assert_eq!(a, Rng::for_stream(1, "blk.0.x", 3).fill(4, 1.0));
        assert_ne!(a, Rng::for_stream(1, "blk.0.x", 4).fill(4, 1.0));
        assert!(a.iter().all(|v| (-1.0..1.0).contains(v)));
    }
}
