//! Where a table keeps its rows, apart from how they are sharded (TorchRec's
//! compute kernel beside its sharding type): a dense array of `rows` rows,
//! or a key-value table of 64-bit keys whose rows are created when a key is
//! admitted and dropped when it is evicted (EasyRec's `ev_params`, DeepRec's
//! EmbeddingVariable).
//!
//! Both keep this rank's rows in the table's flat `weights` and optimizer
//! slots, one slot index per row; the storage maps a global id (a row of
//! the array, a key of the key-value table) to that index. Pooling,
//! scatter, the sparse optimizers, checkpoints and the rank exchange ask
//! the table, which asks its storage, so none of them branches on it.
//!
//! A key-value table's rules, in training steps (global steps):
//! - **admission** (`filter_freq`): each step counts, for every key its
//!   global batch looks up, one sighting. A key gets its row the step its
//!   count reaches `filter_freq` (at once when it is 0 or 1); until then it
//!   looks up the default row (zeros) and gets no update. A step counts once
//!   however often the batch holds the key (DeepRec counts each lookup), so
//!   counts do not depend on how the batch is split over ranks.
//! - **capacity** (`max_capacity`): a key admitted into a full table first
//!   evicts the least recently seen sixteenth of its rows (ties by key), so
//!   eviction is amortised and deterministic; each eviction is logged. With
//!   sharded tables each owner holds its share of max_capacity and evicts
//!   among its own keys (so a run that fills its tables evicts otherwise
//!   than one process would).
//! - **time to live** (`steps_to_live`): rows not seen for more than that many
//!   steps are evicted when a checkpoint is saved, as DeepRec's
//!   GlobalStepEvict does.
//!
//! An evicted key loses its row and its count: seen again, it starts over.

use crate::config::feature_plan::{EmbeddingInit, KeyValueSpec};
use crate::util::IdMap;

/// How one table stores its rows.
#[derive(Debug, Clone, PartialEq)]
pub enum Storage {
    /// Rows `0..rows`, this rank's at `Sharding::local`.
    Array,
    KeyValue(Box<KeyValue>),
}

/// How a key-value table creates a row: the table's initializer, seeded per
/// key, and the optimizer slots' initial values.
#[derive(Debug, Clone, PartialEq)]
pub struct RowInit {
    pub seed: u64,
    pub init: EmbeddingInit,
    /// The fan-in Glorot's initializer uses: `max_capacity`.
    pub rows: usize,
    pub slots: Vec<f32>,
}

/// The keys of a key-value table with their slots, counts and the step each
/// was last seen in training.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyValue {
    pub spec: KeyValueSpec,
    pub init: RowInit,
    /// Key -> slot index of its row.
    index: IdMap<usize>,
    /// Slot -> its key; `None` for a free slot.
    keys: Vec<Option<u64>>,
    /// Slot -> the last step its key was seen in training.
    seen: Vec<u64>,
    free: Vec<usize>,
    /// Key -> sightings, for admitted keys and keys still below filter_freq.
    counts: IdMap<u64>,
    /// Zeros: what a key without a row looks up.
    default_row: Vec<f32>,
    /// Rows evicted so far, by rule.
    pub evicted: Evictions,
    /// Keys evicted since `take_evicted` last drained them, kept only while
    /// incremental updates follow the table (`track_evictions`).
    evicted_keys: Option<Vec<u64>>,
}

/// Rows a key-value table has evicted, by rule.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Evictions {
    pub capacity: u64,
    pub stale: u64,
}

/// One key's saved state (checkpoints): its row's values and slots sit at
/// the same position of the tensors beside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyState {
    pub key: u64,
    pub count: u64,
    pub seen: u64,
}

impl KeyValue {
    pub fn new(spec: KeyValueSpec, init: RowInit, dim: usize) -> Self {
        KeyValue {
            spec,
            init,
            index: IdMap::default(),
            keys: Vec::new(),
            seen: Vec::new(),
            free: Vec::new(),
            counts: IdMap::default(),
            default_row: vec![0.0; dim],
            evicted: Evictions::default(),
            evicted_keys: None,
        }
    }

    /// The slot of `key`'s row, when it has one.
    #[inline]
    pub fn slot(&self, key: u64) -> Option<usize> {
        self.index.get(&key).copied()
    }

    pub fn default_row(&self) -> &[f32] {
        &self.default_row
    }

    /// Keys with a row.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// Keys counted but below filter_freq.
    pub fn pending(&self) -> usize {
        self.counts.len() - self.index.len()
    }

    /// Slots allocated (rows and free slots).
    pub fn capacity(&self) -> usize {
        self.keys.len()
    }

    fn admits(&self, count: u64) -> bool {
        count >= self.spec.filter_freq.max(1)
    }

    /// Counts one sighting at `step` of each of `keys` (distinct, this
    /// rank's); returns the keys admitted now, which need a row, in order.
    /// A full table makes room first (`make_room`).
    pub fn see(&mut self, keys: &[u64], step: u64) -> Vec<u64> {
        let mut admitted = Vec::new();
        for &key in keys {
            if let Some(&slot) = self.index.get(&key) {
                self.seen[slot] = step;
                *self.counts.entry(key).or_insert(0) += 1;
                continue;
            }
            let count = self.counts.entry(key).or_insert(0);
            *count += 1;
            let count = *count;
            if self.admits(count) {
                admitted.push(key);
            }
        }
        admitted
    }

    /// Frees rows so that `more` keys fit under max_capacity: the least
    /// recently seen sixteenth of the table (at least `more`), never a key
    /// seen at `step`. Returns the freed slots' count.
    pub fn make_room(&mut self, more: usize, step: u64) -> usize {
        let cap = usize::try_from(self.spec.max_capacity).unwrap_or(usize::MAX);
        let live = self.index.len();
        if live + more <= cap {
            return 0;
        }
        let want = (live + more - cap).max(cap / 16).min(live);
        let mut old: Vec<(u64, u64, usize)> = self
            .keys
            .iter()
            .enumerate()
            .filter_map(|(slot, k)| k.map(|k| (self.seen[slot], k, slot)))
            .filter(|&(seen, _, _)| seen < step)
            .collect();
        let n = want.min(old.len());
        if n < old.len() {
            old.select_nth_unstable(n);
        }
        for &(_, key, slot) in &old[..n] {
            self.remove(key, slot);
        }
        self.evicted.capacity += n as u64;
        n
    }

    /// Keeps the keys evicted from now on for `take_evicted`.
    pub fn track_evictions(&mut self) {
        self.evicted_keys.get_or_insert_with(Vec::new);
    }

    /// The keys evicted since the last call (with `track_evictions`).
    pub fn take_evicted(&mut self) -> Vec<u64> {
        self.evicted_keys.as_mut().map(std::mem::take).unwrap_or_default()
    }

    fn remove(&mut self, key: u64, slot: usize) {
        if let Some(k) = &mut self.evicted_keys {
            k.push(key);
        }
        self.index.remove(&key);
        self.counts.remove(&key);
        self.keys[slot] = None;
        self.free.push(slot);
    }

    /// A slot for `key`'s new row (seen at `step`), reusing a free one;
    /// `Err(slot)` is a new slot past the end, which the table must grow to.
    pub fn place(&mut self, key: u64, step: u64) -> Result<usize, usize> {
        let cap = usize::try_from(self.spec.max_capacity).unwrap_or(usize::MAX);
        debug_assert!(self.index.len() < cap, "make_room before place");
        match self.free.pop() {
            Some(slot) => {
                self.keys[slot] = Some(key);
                self.seen[slot] = step;
                self.index.insert(key, slot);
                Ok(slot)
            }
            None => {
                let slot = self.keys.len();
                self.keys.push(Some(key));
                self.seen.push(step);
                self.index.insert(key, slot);
                Err(slot)
            }
        }
    }

    /// Whether a row can be placed (the table is below max_capacity).
    pub fn has_room(&self) -> bool {
        (self.index.len() as u64) < self.spec.max_capacity
    }

    /// Evicts rows not seen for more than steps_to_live steps before
    /// `step`; returns how many.
    pub fn evict_stale(&mut self, step: u64) -> usize {
        let ttl = self.spec.steps_to_live;
        if ttl == 0 {
            return 0;
        }
        let stale: Vec<(u64, usize)> = self
            .keys
            .iter()
            .enumerate()
            .filter_map(|(slot, k)| k.map(|k| (k, slot)))
            .filter(|&(_, slot)| step.saturating_sub(self.seen[slot]) > ttl)
            .collect();
        for &(key, slot) in &stale {
            self.remove(key, slot);
        }
        self.evicted.stale += stale.len() as u64;
        stale.len()
    }

    /// The rows' keys with their state, ascending by key, and the slot of
    /// each; then the counted keys without a row.
    pub fn state(&self) -> (Vec<(KeyState, usize)>, Vec<KeyState>) {
        let mut rows: Vec<(KeyState, usize)> = self
            .index
            .iter()
            .map(|(&key, &slot)| {
                let state = KeyState {
                    key,
                    count: self.counts.get(&key).copied().unwrap_or(0),
                    seen: self.seen[slot],
                };
                (state, slot)
            })
            .collect();
        rows.sort_unstable_by_key(|(s, _)| s.key);
        let mut pending: Vec<KeyState> = self
            .counts
            .iter()
            .filter(|(k, _)| !self.index.contains_key(k))
            .map(|(&key, &count)| KeyState { key, count, seen: 0 })
            .collect();
        pending.sort_unstable_by_key(|s| s.key);
        (rows, pending)
    }

    /// Empties the table (before a restore).
    pub fn clear(&mut self) {
        self.index.clear();
        self.keys.clear();
        self.seen.clear();
        self.free.clear();
        self.counts.clear();
    }

    /// Restores a key with a row at the next slot (`capacity()` before the
    /// call), which the table must grow to.
    pub fn restore_row(&mut self, s: KeyState) -> usize {
        let slot = self.keys.len();
        self.keys.push(Some(s.key));
        self.seen.push(s.seen);
        self.index.insert(s.key, slot);
        self.counts.insert(s.key, s.count);
        slot
    }

    /// Restores a counted key without a row.
    pub fn restore_pending(&mut self, s: KeyState) {
        self.counts.insert(s.key, s.count);
    }

    /// Bytes a row of `dim` values with `slots` optimizer slots takes,
    /// with its index entries, counts and step.
    pub fn bytes_per_row(dim: usize, slots: usize) -> usize {
        // values and slots; the key's index and count entries (key, value
        // and control byte of a hash map); the slot's key and step.
        4 * dim * (1 + slots) + 2 * 17 + 16 + 8
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::train_plan::OptimizerKind;
    use crate::embedding::{RowSource, Sharding, Table};

    fn table(filter_freq: u64, steps_to_live: u64, max_capacity: u64) -> Table {
        let spec = KeyValueSpec {
            filter_freq,
            steps_to_live,
            max_capacity,
        };
        let kind = OptimizerKind::Adagrad {
            initial_accumulator: 0.1,
        };
        Table::key_value(
            ("t", 2),
            spec,
            (&EmbeddingInit::Default, 7),
            (0, &kind),
            Sharding::Replicated,
        )
    }

    fn kv(t: &Table) -> &KeyValue {
        match &t.storage {
            Storage::KeyValue(kv) => kv,
            Storage::Array => unreachable!(),
        }
    }

    #[test]
    fn a_key_seen_fewer_than_filter_freq_times_has_no_row_and_reads_zeros() {
        let mut t = table(3, 0, 100);
        t.admit(&[5, 9], 0);
        t.admit(&[5], 1);
        assert_eq!(t.slot(5), None);
        assert_eq!(t.row(5), &[0.0, 0.0]);
        assert_eq!((kv(&t).len(), kv(&t).pending()), (0, 2));
        // An update of a key without a row changes nothing.
        let mut g = crate::embedding::RowGrads::default();
        g.add(5, &[1.0, 1.0]);
        let rule = crate::optim::Rule {
            kind: OptimizerKind::Adagrad {
                initial_accumulator: 0.1,
            },
            lr: 0.5,
            t: 1,
        };
        crate::embedding::apply_rows(&mut t, &g, &rule, 1.0);
        assert!(t.weights.is_empty());
        // The third sighting admits it, with its per-key initial row and
        // the optimizer's initial slot values.
        t.admit(&[5], 2);
        let slot = t.slot(5).expect("admitted");
        let mut want = [0.0f32; 2];
        crate::embedding::init_row(7, "t", 100, 5, &EmbeddingInit::Default, &mut want);
        assert_eq!(t.row(5), &want);
        assert_eq!(&t.state.slots[0][slot * 2..slot * 2 + 2], &[0.1, 0.1]);
        crate::embedding::apply_rows(&mut t, &g, &rule, 1.0);
        assert_ne!(t.row(5), &want);
        assert_eq!(t.slot(9), None);
    }

    #[test]
    fn rows_unseen_for_longer_than_steps_to_live_are_evicted_with_their_counts() {
        let mut t = table(0, 10, 100);
        t.admit(&[1, 2, 3], 0);
        t.admit(&[2], 5);
        t.admit(&[3], 12);
        assert_eq!(t.evict_stale(10), 0);
        // At step 12: key 1 last seen at 0 (12 > 10), key 2 at 5, key 3 at 12.
        assert_eq!(t.evict_stale(12), 1);
        assert_eq!(
            (t.slot(1), t.slot(2).is_some(), t.slot(3).is_some()),
            (None, true, true)
        );
        assert_eq!(kv(&t).evicted.stale, 1);
        // Seen again, it starts over (its count too) in the freed slot.
        let cap = kv(&t).capacity();
        t.admit(&[1], 13);
        assert!(t.slot(1).is_some());
        assert_eq!(kv(&t).capacity(), cap);
        let (rows, _) = kv(&t).state();
        assert_eq!(rows.iter().find(|(s, _)| s.key == 1).unwrap().0.count, 1);
    }

    #[test]
    fn a_full_table_evicts_its_least_recently_seen_rows() {
        let mut t = table(0, 0, 32);
        for step in 0..32u64 {
            t.admit(&[100 + step], step);
        }
        assert_eq!(kv(&t).len(), 32);
        // Key 100 seen again: the oldest are now 101, 102, ...
        t.admit(&[100], 32);
        t.admit(&[500], 33);
        // A sixteenth of 32 (two rows) made room: 101 and 102 went.
        assert_eq!((t.slot(101), t.slot(102)), (None, None));
        assert!(t.slot(100).is_some() && t.slot(103).is_some() && t.slot(500).is_some());
        assert_eq!(kv(&t).len(), 31);
        assert_eq!(kv(&t).evicted.capacity, 2);
        assert!(kv(&t).capacity() <= 32);
        // Never past max_capacity, whatever comes.
        for step in 34..200u64 {
            t.admit(&[1000 + step, 2000 + step], step);
            assert!(kv(&t).len() <= 32);
        }
    }
}
