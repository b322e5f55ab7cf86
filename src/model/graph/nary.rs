//! EasyRec's N-ary encoding of numbers (`NaryDisEmbedding`, after "Numerical
//! Feature Representation with Hybrid N-ary Encoding", CIKM 2022): each raw
//! value, truncated to an integer, is written in every base of `carries`;
//! each digit, at its position, picks a row of the layer's table, and the
//! rows of one base are summed (or averaged) into that base's embedding.
//!
//! The table holds, per input feature, per base `c`, per digit position `j`
//! (least significant first) `c` rows, one per digit: EasyRec's
//! `max_length(c) = (floor(log_c(2^32 - 1)) + 1) * c` rows a base, so every
//! 32-bit value has room. A value has as many digits as it is written
//! with (0 has one), which is what EasyRec's `nary_carry` op hands its
//! segment pooling as each value's split. That op's source is not
//! published; its row order within a feature's block is ours
//! (`row = feature * vocab + offset(base) + j * c + digit`).

/// A layer's bases and pooling.
#[derive(Debug, Clone, PartialEq)]
pub struct Nary {
    pub carries: Vec<u32>,
    /// `intra_ary_pooling: "mean"` (else the sum).
    pub mean: bool,
    /// Each base's first row within a feature's block.
    offsets: Vec<usize>,
    /// Rows per feature.
    vocab: usize,
}

impl Nary {
    /// The encoding in `carries` (each at least 2).
    pub fn new(carries: Vec<u32>, mean: bool) -> Self {
        assert!(carries.iter().all(|&c| c >= 2), "N-ary bases are 2 or more");
        let mut offsets = Vec::with_capacity(carries.len());
        let mut vocab = 0;
        for &c in &carries {
            offsets.push(vocab);
            vocab += Self::length(c);
        }
        Nary {
            carries,
            mean,
            offsets,
            vocab,
        }
    }

    /// Digit positions of base `c`: those of the largest 32-bit value.
    pub fn positions(c: u32) -> usize {
        let mut v = u64::from(u32::MAX);
        let mut n = 0;
        while v > 0 {
            v /= u64::from(c);
            n += 1;
        }
        n
    }

    /// Rows of base `c` per feature (EasyRec's `max_length`).
    pub fn length(c: u32) -> usize {
        Self::positions(c) * c as usize
    }

    /// Table rows per feature (EasyRec's `vocab_size`).
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// The integer EasyRec encodes for raw value `x` (already times the
    /// layer's multiplier): truncated toward zero to 32 bits, as its
    /// `tf.to_int32`, and read as unsigned (negative values by their two's
    /// complement). TensorFlow leaves values outside 32 bits undefined;
    /// here they saturate, and NaN is 0.
    pub fn value(x: f32) -> u32 {
        (x as i32) as u32
    }

    /// Feature `f`'s row of digit 0 at position 0 in base `carries[b]`;
    /// digit `d` at position `j` is `j * c + d` rows on.
    pub fn first_row(&self, f: usize, b: usize) -> usize {
        f * self.vocab + self.offsets[b]
    }

    /// Feature `f`'s rows for value `u` in base `carries[b]`, each handed
    /// to `visit`; returns how many (the value's digits).
    pub fn rows(&self, f: usize, b: usize, u: u32, mut visit: impl FnMut(usize)) -> usize {
        let c = u64::from(self.carries[b]);
        let first = self.first_row(f, b);
        let (mut v, mut j) = (u64::from(u), 0);
        loop {
            visit(first + j * c as usize + (v % c) as usize);
            j += 1;
            v /= c;
            if v == 0 {
                return j;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_follow_easyrec_max_length() {
        // (floor(log_c(4294967295)) + 1) * c
        for c in [2u32, 3, 9, 10, 16, 255, 256, 65535, 65536] {
            let expected = ((4294967295f64).ln() / f64::from(c).ln()).floor() as usize + 1;
            assert_eq!(Nary::positions(c), expected, "base {c}");
        }
        let n = Nary::new(vec![2, 9], false);
        assert_eq!(n.vocab(), 32 * 2 + 11 * 9);
    }

    #[test]
    fn digits_pick_rows_by_position() {
        let n = Nary::new(vec![2, 9], false);
        let mut rows = Vec::new();
        // 6 = 110 in base 2: digits 0, 1, 1 at positions 0, 1, 2.
        assert_eq!(n.rows(0, 0, 6, |r| rows.push(r)), 3);
        assert_eq!(rows, vec![0, 2 + 1, 4 + 1]);
        rows.clear();
        // 82 = 101 in base 9, feature 1: after feature 0's block and base 2's rows.
        assert_eq!(n.rows(1, 1, 82, |r| rows.push(r)), 3);
        let first = n.vocab() + 64;
        assert_eq!(rows, vec![first + 1, first + 9, first + 18 + 1]);
        rows.clear();
        assert_eq!(n.rows(0, 1, 0, |r| rows.push(r)), 1);
        assert_eq!(rows, vec![64]);
        // The largest value uses every position, and stays in its block.
        rows.clear();
        assert_eq!(n.rows(0, 1, u32::MAX, |r| rows.push(r)), 11);
        assert!(rows.iter().all(|&r| (64..n.vocab()).contains(&r)));
    }

    #[test]
    fn values_truncate_to_32_bits() {
        assert_eq!(Nary::value(3.9), 3);
        assert_eq!(Nary::value(-0.5), 0);
        assert_eq!(Nary::value(-1.0), u32::MAX);
        assert_eq!(Nary::value(1e12), i32::MAX as u32);
        assert_eq!(Nary::value(f32::NAN), 0);
    }
}
