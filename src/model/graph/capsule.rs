//! MIND's capsule layer as the graph describes it: the interest count of
//! a sequence (`Op::Capsules`) and the fixed routing logits EasyRec starts
//! from in inference (NumPy's legacy generator seeded with 28). The
//! routing itself is each executor's (`exec::cpu::capsule`).

use super::live;

/// How many interest capsules a sequence gets (`Op::Capsules`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Count {
    pub max_k: usize,
    /// The sequence's positions: a longer length counts as this.
    pub positions: usize,
    /// Always `max_k` (`const_caps_num`).
    pub constant: bool,
}

impl Count {
    /// The count for a sequence of length `len` (a count): `max_k` when
    /// constant, else `max(1, min(max_k, ⌊ln len⌋))`, 1 for an empty
    /// sequence (EasyRec's `tf.log` of 0 is −∞, which the `max` lifts to 1).
    pub fn of(&self, len: f32) -> f32 {
        if self.constant {
            return self.max_k as f32;
        }
        let live = live(len, self.positions);
        if live == 0 {
            return 1.0;
        }
        ((live as f32).ln().floor() as usize).clamp(1, self.max_k) as f32
    }
}

/// EasyRec's inference routing logits: `np.random.seed(28)` then
/// `np.random.uniform(high=stddev, size=[max_seq_len, max_k])` as float32,
/// the first `positions` rows of it (`[positions, max_k]`).
pub fn eval_logits(positions: usize, max_k: usize, stddev: f32) -> Vec<f32> {
    let mut mt = Mt19937::new(28);
    (0..positions * max_k)
        .map(|_| (mt.random_sample() * stddev as f64) as f32)
        .collect()
}

/// The Mersenne Twister as NumPy's legacy `RandomState` runs it: seeded by
/// `init_genrand`, doubles from two draws (`genrand_res53`). Written here
/// because only this one fixed stream is needed, to reproduce EasyRec's
/// constant; no crate is worth its build for it.
struct Mt19937 {
    key: [u32; 624],
    pos: usize,
}

impl Mt19937 {
    fn new(seed: u32) -> Self {
        let mut key = [0u32; 624];
        key[0] = seed;
        for i in 1..624 {
            let prev = key[i - 1];
            key[i] = 1_812_433_253u32
                .wrapping_mul(prev ^ (prev >> 30))
                .wrapping_add(i as u32);
        }
        Mt19937 { key, pos: 624 }
    }

    fn next_u32(&mut self) -> u32 {
        const UPPER: u32 = 0x8000_0000;
        const LOWER: u32 = 0x7fff_ffff;
        const MATRIX: u32 = 0x9908_b0df;
        if self.pos >= 624 {
            for i in 0..624 {
                let y = (self.key[i] & UPPER) | (self.key[(i + 1) % 624] & LOWER);
                let mag = if y & 1 == 1 { MATRIX } else { 0 };
                self.key[i] = self.key[(i + 397) % 624] ^ (y >> 1) ^ mag;
            }
            self.pos = 0;
        }
        let mut y = self.key[self.pos];
        self.pos += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }

    /// Uniform in [0, 1) with 53 random bits.
    fn random_sample(&mut self) -> f64 {
        let a = (self.next_u32() >> 5) as f64;
        let b = (self.next_u32() >> 6) as f64;
        (a * 67_108_864.0 + b) / 9_007_199_254_740_992.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mersenne_twister_draws_numpys_stream() {
        // The reference generator's first output for its default seed.
        assert_eq!(Mt19937::new(5489).next_u32(), 3_499_211_612);
        // np.random.seed(0); np.random.uniform(size=3)
        let mut mt = Mt19937::new(0);
        let want = [
            0.548_813_503_927_324_8,
            0.715_189_366_372_419_5,
            0.602_763_376_071_643_9,
        ];
        for w in want {
            assert_eq!(mt.random_sample(), w);
        }
    }

    #[test]
    fn capsule_count_follows_the_log_of_the_length() {
        let count = |max_k, positions, constant| Count {
            max_k,
            positions,
            constant,
        };
        let c = |len: f32| count(5, 64, false).of(len);
        assert_eq!(
            [c(0.0), c(1.0), c(7.0), c(8.0), c(20.0), c(55.0), c(64.0)],
            [1.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
        );
        assert_eq!(count(5, 300, false).of(200.0), 5.0);
        assert_eq!(count(5, 64, true).of(3.0), 5.0);
    }
}
