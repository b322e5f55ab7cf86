//! A key-value table in the graph: its rows `[n + 1, dim]` (ascending by
//! key, then the default row of zeros that unknown keys look up) and a
//! cuckoo hash table that maps a 64-bit key to its row with standard ONNX
//! operators, so any runtime does the lookup the trainer does.
//!
//! The layout (also described in the export's feature spec): `M` slots,
//! `<var>/slot_keys` int64 `[M]` (a key, or -1 for an empty slot) and
//! `<var>/slot_rows` int64 `[M]`, with `<var>/slot_count` (M) and
//! `<var>/default_row` (n) int64 scalars. Key `k` (non-negative, below 2^63) sits in
//! slot `k mod M` or slot `(k div M) mod M`; a key in neither is unknown and
//! looks up row `n`. Two Gathers, two Equals and two Wheres per lookup.

use std::borrow::Cow;

/// A table as the graph holds it, indexed like `Model::tables`.
#[derive(Debug, Clone)]
pub struct GraphTable<'a> {
    /// `[rows, dim]` row-major.
    pub values: Cow<'a, [f32]>,
    pub rows: usize,
    /// Present for a key-value table: where each key's row is.
    pub keys: Option<KeyLayout>,
}

impl<'a> GraphTable<'a> {
    /// An array table, rows indexed by id.
    pub fn array(values: &'a [f32], rows: usize) -> Self {
        GraphTable {
            values: Cow::Borrowed(values),
            rows,
            keys: None,
        }
    }

    /// A key-value table: `keys` ascending with their rows of `dim`
    /// values back to back in `values`; a default row of zeros is added.
    pub fn key_value(keys: &[u64], mut values: Vec<f32>, dim: usize) -> Self {
        debug_assert_eq!(values.len(), keys.len() * dim);
        values.extend(std::iter::repeat_n(0.0, dim));
        GraphTable {
            values: Cow::Owned(values),
            rows: keys.len() + 1,
            keys: Some(KeyLayout::build(keys)),
        }
    }
}

/// The cuckoo layout of a key-value table's keys.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyLayout {
    /// Per slot: its key, or -1.
    pub slot_keys: Vec<i64>,
    /// Per slot: its key's row (the default row for an empty slot).
    pub slot_rows: Vec<i64>,
}

impl KeyLayout {
    /// Slot candidates of key `k` among `m` slots.
    pub fn candidates(k: u64, m: usize) -> [usize; 2] {
        let m = m as u64;
        [(k % m) as usize, ((k / m) % m) as usize]
    }

    /// The layout of `keys` (distinct; key `keys[i]` has row `i`; row
    /// `keys.len()` is the default): about 2.2 slots per key, grown until
    /// every key has one of its two slots.
    pub fn build(keys: &[u64]) -> Self {
        let n = keys.len();
        let mut m = (2 * n + n / 5).max(1) | 1;
        loop {
            if let Some(layout) = Self::try_build(keys, m) {
                return layout;
            }
            m = m + m / 2 + 2;
        }
    }

    fn try_build(keys: &[u64], m: usize) -> Option<Self> {
        let default = keys.len() as i64;
        let mut slot_keys = vec![-1i64; m];
        let mut slot_rows = vec![default; m];
        // Evictions before giving up on `m` (a cycle).
        let limit = 64 + 8 * (usize::BITS - keys.len().leading_zeros()) as usize;
        for (row, &key) in keys.iter().enumerate() {
            let (mut key, mut row) = (key as i64, row as i64);
            let mut slot = Self::candidates(key as u64, m)[0];
            let mut placed = false;
            for _ in 0..limit {
                if slot_keys[slot] < 0 {
                    slot_keys[slot] = key;
                    slot_rows[slot] = row;
                    placed = true;
                    break;
                }
                // Take the slot; the evicted key goes to its other one.
                std::mem::swap(&mut slot_keys[slot], &mut key);
                std::mem::swap(&mut slot_rows[slot], &mut row);
                let [a, b] = Self::candidates(key as u64, m);
                slot = if slot == a { b } else { a };
            }
            if !placed {
                return None;
            }
        }
        Some(KeyLayout { slot_keys, slot_rows })
    }

    /// The row of `key` (the default row when it is unknown), as the
    /// graph computes it.
    pub fn row_of(&self, key: u64) -> i64 {
        let m = self.slot_keys.len();
        for s in Self::candidates(key, m) {
            if self.slot_keys[s] == key as i64 {
                return self.slot_rows[s];
            }
        }
        *self.slot_rows.iter().max().unwrap_or(&0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_finds_its_row_and_unknown_keys_the_default() {
        for keys in [
            vec![],
            vec![0u64],
            (0..1000u64).collect::<Vec<_>>(),
            (0..5000u64).map(|i| crate::util::mix64(i) >> 1).collect(),
            (0..3000u64).map(|i| i * 4099).collect(),
        ] {
            let mut keys = keys;
            keys.sort_unstable();
            keys.dedup();
            let l = KeyLayout::build(&keys);
            for (row, &k) in keys.iter().enumerate() {
                assert_eq!(l.row_of(k), row as i64);
            }
            let default = keys.len() as i64;
            let unknown = (1u64 << 62) + 12345;
            assert!(!keys.contains(&unknown));
            let m = l.slot_keys.len();
            let found = KeyLayout::candidates(unknown, m)
                .iter()
                .any(|&s| l.slot_keys[s] == unknown as i64);
            assert!(!found);
            assert!(l.slot_rows.iter().all(|&r| r <= default));
            assert!(m <= 4 * keys.len() + 8, "{m} slots for {} keys", keys.len());
        }
    }
}
