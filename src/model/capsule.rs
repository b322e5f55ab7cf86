//! MIND's capsule layer as EasyRec's `CapsuleLayer` computes it: the
//! interest count of a sequence, the dynamic routing of its positions
//! into interest capsules, the squash of a capsule, and the fixed
//! routing logits EasyRec starts from in inference (NumPy's legacy
//! generator seeded with 28).

use super::graph::SQUASH_EPS;
use super::kernels;

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
        let live = kernels::live(len, self.positions);
        if live == 0 {
            return 1.0;
        }
        ((live as f32).ln().floor() as usize).clamp(1, self.max_k) as f32
    }
}

/// The settings one row's routing reads.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    pub max_k: usize,
    pub iters: usize,
    pub scale: f32,
}

/// One batch row's dynamic routing: `x` its `n` positions of width `e`
/// side by side, `live` of them in the sequence, `caps` capsules live,
/// `logits` the first routing logits `[n, max_k]` (consumed). Writes the
/// routing weights after the last iteration's softmax into `out`, `[max_k,
/// n]` (capsule by capsule).
///
/// Per iteration: the logits softmaxed over the live capsules (the others
/// and the positions past the sequence weigh 0); unless it is the last,
/// each capsule is the weighted sum of the positions, L2-normalised, and
/// the next logits are `scale · norm(x_s) · c_k` (`x_s · c_k` when `scale`
/// is 0).
pub fn route(x: &[f32], e: usize, (live, caps): (usize, usize), mut logits: Vec<f32>, r: Settings, out: &mut [f32]) {
    let k = r.max_k;
    let n = x.len().checked_div(e).unwrap_or(0);
    let caps = caps.min(k);
    let mut w = vec![0.0f32; n * k];
    let normed: Vec<f32> = if r.scale > 0.0 {
        x.chunks_exact(e.max(1)).flat_map(l2_normalized).collect()
    } else {
        x.to_vec()
    };
    let mut high = vec![0.0f32; k * e];
    for it in 0..r.iters {
        w.fill(0.0);
        for s in 0..live.min(n) {
            let row = &mut w[s * k..s * k + caps];
            row.copy_from_slice(&logits[s * k..s * k + caps]);
            kernels::softmax_in_place(row);
        }
        if it + 1 == r.iters {
            break;
        }
        high.fill(0.0);
        for s in 0..n {
            let xs = &x[s * e..(s + 1) * e];
            for c in 0..k {
                let ws = w[s * k + c];
                if ws != 0.0 {
                    high[c * e..(c + 1) * e]
                        .iter_mut()
                        .zip(xs)
                        .for_each(|(h, v)| *h += ws * v);
                }
            }
        }
        for c in 0..k {
            let hc = l2_normalized(&high[c * e..(c + 1) * e]);
            high[c * e..(c + 1) * e].copy_from_slice(&hc);
        }
        let by = if r.scale > 0.0 { r.scale } else { 1.0 };
        for s in 0..n {
            let xs = &normed[s * e..(s + 1) * e];
            for c in 0..k {
                let dot: f32 = xs.iter().zip(&high[c * e..(c + 1) * e]).map(|(a, b)| a * b).sum();
                logits[s * k + c] = by * dot;
            }
        }
    }
    for c in 0..k {
        for s in 0..n {
            out[c * n + s] = w[s * k + c];
        }
    }
}

/// `v / sqrt(max(Σ v², L2_EPS))`, TensorFlow's `l2_normalize`.
fn l2_normalized(v: &[f32]) -> Vec<f32> {
    let inv = kernels::l2_inv(v);
    v.iter().map(|a| a * inv).collect()
}

/// One row's `Op::InterestSimilarity` of its `max_k` interests `x` (each
/// `d` wide), `caps` of them live: `[(s + 1) / 2 · m, m]`, `m` whether
/// there are several; and the gradient of the first value with respect
/// to `x`, times `dy`.
pub fn interest_similarity(x: &[f32], d: usize, caps: f32) -> ([f32; 2], impl Fn(f32) -> Vec<f32> + '_) {
    let m = if caps > 1.0 { 1.0 } else { 0.0 };
    let den = (caps * (caps - 1.0)).max(1.0);
    let mut sum = vec![0.0f32; d];
    for blk in x.chunks_exact(d.max(1)) {
        sum.iter_mut().zip(blk).for_each(|(s, v)| *s += v);
    }
    let whole: f32 = sum.iter().map(|v| v * v).sum();
    let parts: f32 = x.iter().map(|v| v * v).sum();
    let s = (whole - parts) / den;
    let grad = move |dy: f32| -> Vec<f32> {
        // d/dx_k of (|S|² − Σ|x_k|²) / (2 den) is (S − x_k) / den.
        x.chunks_exact(d.max(1))
            .flat_map(|blk| {
                blk.iter()
                    .zip(&sum)
                    .map(|(v, s)| dy * m * (s - v) / den)
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    ([(s + 1.0) / 2.0 * m, m], grad)
}

/// The squash factor of a row whose squared norm is `sq`:
/// `(n / (1 + n))^pow · ratio / √n` with `n = max(sq, SQUASH_EPS)`, and
/// its slope in `sq` (0 where the floor holds).
pub fn squash_factor(sq: f32, pow: f32, ratio: f32) -> (f32, f32) {
    let n = sq.max(SQUASH_EPS);
    let f = (n / (1.0 + n)).powf(pow) * ratio / n.sqrt();
    let slope = if sq > SQUASH_EPS {
        f * (pow / (n * (1.0 + n)) - 0.5 / n)
    } else {
        0.0
    };
    (f, slope)
}

/// The gradient of a squashed row `y = f(Σ x²) · x` with respect to `x`,
/// from the gradient `dy`: `f · dy + 2 f' (dy · x) x`.
pub fn squash_grad(x: &[f32], dy: &[f32], pow: f32, ratio: f32) -> Vec<f32> {
    let sq: f32 = x.iter().map(|v| v * v).sum();
    let (f, slope) = squash_factor(sq, pow, ratio);
    let dot: f32 = dy.iter().zip(x).map(|(a, b)| a * b).sum();
    dy.iter().zip(x).map(|(d, v)| f * d + 2.0 * slope * dot * v).collect()
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

    #[test]
    fn routing_weights_are_softmaxes_over_live_capsules_and_positions() {
        let (n, e, k) = (4, 3, 3);
        let x: Vec<f32> = (0..n * e).map(|i| ((i * 7 % 5) as f32 - 2.0) * 0.3).collect();
        let init = eval_logits(n, k, 1.0);
        let mut out = vec![9.0f32; k * n];
        let r = Settings {
            max_k: k,
            iters: 3,
            scale: 20.0,
        };
        route(&x, e, (3, 2), init, r, &mut out);
        for s in 0..n {
            let col: Vec<f32> = (0..k).map(|c| out[c * n + s]).collect();
            if s < 3 {
                assert!((col[0] + col[1] - 1.0).abs() < 1e-6 && col[2] == 0.0, "{col:?}");
            } else {
                assert!(col.iter().all(|v| *v == 0.0), "{col:?}");
            }
        }
    }

    #[test]
    fn squash_gradient_matches_finite_differences() {
        let x = [0.3f32, -0.7, 0.2];
        let dy = [0.5f32, 0.1, -0.4];
        let g = squash_grad(&x, &dy, 0.5, 1.3);
        let obj = |x: &[f32]| -> f64 {
            let (f, _) = squash_factor(x.iter().map(|v| v * v).sum(), 0.5, 1.3);
            x.iter().zip(&dy).map(|(a, d)| (f * a * d) as f64).sum()
        };
        for j in 0..3 {
            let (mut up, mut down) = (x, x);
            up[j] += 1e-3;
            down[j] -= 1e-3;
            let num = (obj(&up) - obj(&down)) / 2e-3;
            assert!((num - g[j] as f64).abs() < 1e-3, "{j}: {num} vs {}", g[j]);
        }
    }
}
