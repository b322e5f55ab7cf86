//! CL4SRec's sequence augmentation (EasyRec's `SeqAugment` layer,
//! `layers/keras/data_augment.py`) as a plan per row: where each output
//! position of an augmented sequence takes its value from. Every executor
//! draws the plans from its training generator in row order, so they agree.

use crate::util::Rng;

/// An output position left empty (zeros): past a crop.
pub const EMPTY: i32 = -1;
/// An output position holding the trainable mask embedding.
pub const MASKED: i32 = -2;

/// `seq_aug`'s rates. A crop keeps `⌊len · crop⌋` positions (only when
/// `crop < 1`), a mask covers `⌊len · mask⌋` of them (when `mask > 0`), a
/// reorder shuffles a run of `⌊len · reorder⌋` (when `reorder > 0`); each
/// row gets one of the enabled ones, drawn uniformly.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Augment {
    pub crop: f32,
    pub mask: f32,
    pub reorder: f32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Method {
    Crop,
    Mask,
    Reorder,
}

impl Augment {
    fn methods(&self) -> Vec<Method> {
        let mut m = Vec::new();
        if self.crop < 1.0 {
            m.push(Method::Crop);
        }
        if self.mask > 0.0 {
            m.push(Method::Mask);
        }
        if self.reorder > 0.0 {
            m.push(Method::Reorder);
        }
        m
    }

    /// One row's plan over `n` positions of which the first `len` are live:
    /// per output position its source position, `EMPTY` or `MASKED`; and
    /// the augmented length.
    pub fn plan(&self, len: f32, n: usize, rng: &mut Rng) -> (Vec<i32>, f32) {
        let live = super::live(len, n);
        let mut src: Vec<i32> = (0..n as i32).collect();
        let methods = self.methods();
        let method = match methods.len() {
            0 => return (src, live as f32),
            1 => methods[0],
            k => methods[rng.below(k as u64) as usize],
        };
        // A start drawn uniformly from [0, span) as tf.random.uniform's
        // (0 where the span is empty, which TensorFlow refuses).
        let start = |rng: &mut Rng, span: usize| if span == 0 { 0 } else { rng.below(span as u64) as usize };
        let count = |rate: f32| ((live as f32 * rate).floor() as usize).min(live);
        match method {
            Method::Crop => {
                let keep = count(self.crop);
                let begin = start(rng, live - keep);
                for (j, s) in src.iter_mut().enumerate() {
                    *s = if j < keep { (begin + j) as i32 } else { EMPTY };
                }
                (src, keep as f32)
            }
            Method::Mask => {
                // A random `masked` of the live positions (tf.random.shuffle
                // of a mask of that many).
                let masked = count(self.mask);
                let mut order: Vec<usize> = (0..live).collect();
                for i in 0..masked {
                    let j = i + rng.below((live - i) as u64) as usize;
                    order.swap(i, j);
                }
                for &p in &order[..masked] {
                    src[p] = MASKED;
                }
                (src, live as f32)
            }
            Method::Reorder => {
                let run = count(self.reorder);
                let begin = start(rng, live - run);
                let mut perm: Vec<usize> = (begin..begin + run).collect();
                for i in (1..perm.len()).rev() {
                    let j = rng.below(i as u64 + 1) as usize;
                    perm.swap(i, j);
                }
                // scatter_nd: position k's value lands at perm[k].
                for (k, &to) in perm.iter().enumerate() {
                    src[to] = (begin + k) as i32;
                }
                (src, live as f32)
            }
        }
    }

    /// Plans for every row of lengths `lens`, drawn in row order.
    pub fn plans(&self, lens: &[f32], n: usize, rng: &mut Rng) -> (Vec<i32>, Vec<f32>) {
        let mut all = Vec::with_capacity(lens.len() * n);
        let mut out = Vec::with_capacity(lens.len());
        for &l in lens {
            let (src, len) = self.plan(l, n, rng);
            all.extend(src);
            out.push(len);
        }
        (all, out)
    }
}

/// Rows `x` (`[r, n * d]`) rearranged by `plans` (`[r, n]`), the mask
/// embedding `mask` (`d` values) where masked; lengths `lens` appended as
/// each row's last column.
pub fn apply(x: &[f32], plans: &[i32], lens: &[f32], mask: &[f32], n: usize) -> Vec<f32> {
    let d = mask.len();
    let mut y = Vec::with_capacity(lens.len() * (n * d + 1));
    for ((xr, pr), len) in x.chunks_exact(n * d).zip(plans.chunks_exact(n)).zip(lens) {
        for &s in pr {
            match s {
                EMPTY => y.extend(std::iter::repeat_n(0.0, d)),
                MASKED => y.extend_from_slice(mask),
                s => y.extend_from_slice(&xr[s as usize * d..(s as usize + 1) * d]),
            }
        }
        y.push(*len);
    }
    y
}

#[cfg(test)]
mod tests {
    use super::*;

    fn aug(crop: f32, mask: f32, reorder: f32) -> Augment {
        Augment { crop, mask, reorder }
    }

    #[test]
    fn a_crop_keeps_a_run_of_the_live_positions_at_the_front() {
        let mut rng = Rng::new(5);
        for _ in 0..50 {
            let (src, len) = aug(0.5, 0.0, 0.0).plan(7.0, 10, &mut rng);
            assert_eq!(len, 3.0);
            let begin = src[0];
            assert!((0..=4).contains(&begin), "{src:?}");
            assert_eq!(&src[..3], &[begin, begin + 1, begin + 2]);
            assert!(src[3..].iter().all(|s| *s == EMPTY), "{src:?}");
        }
        // A short row keeps nothing: length 0, all empty.
        let (src, len) = aug(0.2, 0.0, 0.0).plan(3.0, 4, &mut rng);
        assert_eq!((src, len), (vec![EMPTY; 4], 0.0));
    }

    #[test]
    fn a_mask_covers_its_share_of_live_positions_and_a_reorder_permutes_a_run() {
        let mut rng = Rng::new(9);
        for _ in 0..50 {
            let (src, len) = aug(1.0, 0.6, 0.0).plan(5.0, 8, &mut rng);
            assert_eq!(len, 5.0);
            assert_eq!(src[..5].iter().filter(|s| **s == MASKED).count(), 3);
            for (j, s) in src.iter().enumerate() {
                assert!(*s == MASKED && j < 5 || *s == j as i32, "{src:?}");
            }
            let (src, len) = aug(1.0, 0.0, 0.6).plan(5.0, 8, &mut rng);
            assert_eq!(len, 5.0);
            let mut sorted = src.clone();
            sorted.sort();
            assert_eq!(sorted, (0..8).collect::<Vec<i32>>(), "a permutation: {src:?}");
            let moved: Vec<usize> = (0..8).filter(|&j| src[j] != j as i32).collect();
            assert!(moved.iter().all(|&j| j < 5), "only live positions move: {src:?}");
            if let (Some(a), Some(b)) = (moved.first(), moved.last()) {
                assert!(b - a < 3, "within one run of 3: {src:?}");
            }
        }
    }

    #[test]
    fn each_enabled_method_is_drawn() {
        let mut rng = Rng::new(2);
        let (mut cropped, mut masked, mut other) = (0, 0, 0);
        for _ in 0..300 {
            let (src, len) = aug(0.2, 0.6, 0.6).plan(10.0, 10, &mut rng);
            if len == 2.0 {
                cropped += 1;
            } else if src.contains(&MASKED) {
                masked += 1;
            } else {
                other += 1;
            }
        }
        for c in [cropped, masked, other] {
            assert!((60..140).contains(&c), "{cropped} {masked} {other}");
        }
        // Nothing enabled: the row as it is.
        let (src, len) = aug(1.0, 0.0, 0.0).plan(3.0, 4, &mut rng);
        assert_eq!((src, len), (vec![0, 1, 2, 3], 3.0));
    }

    #[test]
    fn apply_fills_from_the_plan() {
        let x: Vec<f32> = (0..6).map(|v| v as f32).collect(); // n 3, d 2
        let y = apply(&x, &[2, MASKED, EMPTY], &[1.0], &[9.0, 8.0], 3);
        assert_eq!(y, vec![4.0, 5.0, 9.0, 8.0, 0.0, 0.0, 1.0]);
    }
}
