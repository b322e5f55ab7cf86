//! Embedding tables outside autodiff: lookup + pooling into the model's
//! input buffer, and the reverse scatter of gradients into a sparse,
//! row-wise optimizer update of only the touched rows. `Collection` holds a
//! model's tables with their `Sharding`.

mod collection;
mod exchange;
mod gather;
mod sharding;
mod storage;
mod table_state;

use rayon::prelude::*;

pub use collection::Collection;
pub(crate) use exchange::{pack, unpack};
pub use gather::{gathers, touched, Gather};
pub use sharding::Sharding;
pub use storage::{Evictions, KeyState, KeyValue, RowInit, Storage};

use crate::config::feature_plan::{EmbeddingInit, KeyValueSpec};
use crate::config::train_plan::OptimizerKind;
use crate::features::Jagged;
use crate::optim::{Rule, SlotState};
use crate::util::{mix64, IdMap, Rng};

/// One table: rows of `dim` f32 weights with the optimizer slots of each
/// row, stored as `storage` says (an array, or a key-value table).
#[derive(Debug, Clone, PartialEq)]
pub struct Table {
    pub name: String,
    /// Rows of the whole table (an array's; a key-value table's most);
    /// an array on several ranks holds `sharding.local_rows(rows)` here.
    pub rows: usize,
    pub dim: usize,
    /// This rank's rows, `[local rows, dim]`, at the slots `storage` gives.
    pub weights: Vec<f32>,
    pub state: SlotState,
    /// Index into `train_config.optimizer_config`.
    pub optimizer: usize,
    /// Which of the rows this rank holds.
    pub sharding: Sharding,
    pub storage: Storage,
}

/// Deterministic initial value of row `row` of a `[rows, out.len()]` table,
/// seeded per row so any sharding of the table initialises identical rows.
/// The default is EasyRec's embedding_column one: truncated normal with
/// stddev 0.01/sqrt(dim) (a hundredth of TensorFlow's own default).
pub fn init_row(seed: u64, table: &str, rows: usize, row: u64, init: &EmbeddingInit, out: &mut [f32]) {
    let mut rng = Rng::new(seed ^ mix64(crate::util::hash_str(table) ^ mix64(row)));
    let dim = out.len() as f64;
    match init {
        EmbeddingInit::Default => out
            .iter_mut()
            .for_each(|x| *x = (rng.truncated_normal() * 0.01 / dim.sqrt()) as f32),
        EmbeddingInit::TruncatedNormal { mean, stddev } => out
            .iter_mut()
            .for_each(|x| *x = mean + (rng.truncated_normal() * *stddev as f64) as f32),
        EmbeddingInit::RandomNormal { mean, stddev } => out
            .iter_mut()
            .for_each(|x| *x = mean + (rng.normal() * *stddev as f64) as f32),
        EmbeddingInit::GlorotNormal => {
            // TF: truncated normal, stddev sqrt(2 / (fan_in + fan_out)) / .87962566
            let std = (2.0 / (rows as f64 + dim)).sqrt() / 0.879_625_661_034_239_8;
            out.iter_mut().for_each(|x| *x = (rng.truncated_normal() * std) as f32)
        }
        EmbeddingInit::Constant(c) if c.len() == 1 => out.fill(c[0]),
        EmbeddingInit::Constant(c) => out.copy_from_slice(c),
    }
}

impl Table {
    /// This rank's rows of a `[rows, dim]` table, initialised, trained by
    /// optimizer `optimizer` whose slots are created from `kind`.
    pub fn new(
        (name, rows, dim): (&str, usize, usize),
        init: &EmbeddingInit,
        seed: u64,
        (optimizer, kind): (usize, &OptimizerKind),
        sharding: Sharding,
    ) -> Self {
        let local_rows = sharding.local_rows(rows);
        let state = SlotState::new(kind, local_rows * dim);
        let mut weights = crate::util::table_buffer(0.0, local_rows * dim);
        weights
            .par_chunks_mut(dim)
            .enumerate()
            .for_each(|(l, out)| init_row(seed, name, rows, sharding.global(l), init, out));
        Table {
            name: name.to_string(),
            rows,
            dim,
            weights,
            state,
            optimizer,
            sharding,
            storage: Storage::Array,
        }
    }

    /// An empty key-value table of `dim`-wide rows under `spec`, whose
    /// rows are created from `init` seeded per key when keys are admitted.
    pub fn key_value(
        (name, dim): (&str, usize),
        spec: KeyValueSpec,
        (init, seed): (&EmbeddingInit, u64),
        (optimizer, kind): (usize, &OptimizerKind),
        sharding: Sharding,
    ) -> Self {
        let rows = usize::try_from(spec.max_capacity).unwrap_or(usize::MAX);
        // Sharded, each owner holds its share of max_capacity and evicts
        // among its own keys.
        let mut spec = spec;
        if let Some((_, owners)) = sharding.shard() {
            spec.max_capacity = spec.max_capacity.div_ceil(owners as u64);
        }
        let row_init = RowInit {
            seed,
            init: init.clone(),
            rows,
            slots: crate::optim::slot_inits(kind),
        };
        Table {
            name: name.to_string(),
            rows,
            dim,
            weights: Vec::new(),
            state: SlotState::new(kind, 0),
            optimizer,
            sharding,
            storage: Storage::KeyValue(Box::new(KeyValue::new(spec, row_init, dim))),
        }
    }

    /// A copy of the rows without optimizer slots, for scoring.
    pub fn for_inference(&self) -> Self {
        Table {
            state: SlotState::default(),
            optimizer: 0,
            ..self.clone()
        }
    }

    /// The slot index of global id `g`'s row on this rank: an array's
    /// local row, a key's row when it has one.
    #[inline]
    pub fn slot(&self, g: u64) -> Option<usize> {
        match &self.storage {
            Storage::Array => Some(self.sharding.local(g)),
            Storage::KeyValue(kv) => kv.slot(g),
        }
    }

    /// Counts a training step's sighting of `keys` (distinct ids of the
    /// global batch that this rank holds) at `step`, creating the rows of
    /// keys admitted now. An array has every row already.
    pub fn admit(&mut self, keys: &[u64], step: u64) {
        let Storage::KeyValue(kv) = &mut self.storage else {
            return;
        };
        let admitted = kv.see(keys, step);
        if admitted.is_empty() {
            return;
        }
        let before = kv.evicted.capacity;
        let freed = kv.make_room(admitted.len(), step);
        if freed > 0 && before == 0 {
            // Once per table; each save reports the totals.
            log::info!(
                "table `{}` is full: {freed} least recently seen rows evicted at step {step} to stay within \
                 max_capacity {} (it evicts a sixteenth whenever full; totals at each save)",
                self.name,
                kv.spec.max_capacity,
            );
        }
        let dim = self.dim;
        for key in admitted {
            if !kv.has_room() {
                log::warn!(
                    "table `{}`: full ({} rows, all seen at step {step}); key {key} waits for a row",
                    self.name,
                    kv.len()
                );
                break;
            }
            let slot = match kv.place(key, step) {
                Ok(slot) => slot,
                Err(slot) => {
                    self.weights.resize((slot + 1) * dim, 0.0);
                    for (s, v) in self.state.slots.iter_mut().zip(&kv.init.slots) {
                        s.resize((slot + 1) * dim, *v);
                    }
                    slot
                }
            };
            let range = slot * dim..(slot + 1) * dim;
            let i = &kv.init;
            init_row(
                i.seed,
                &self.name,
                i.rows,
                key,
                &i.init,
                &mut self.weights[range.clone()],
            );
            for (s, v) in self.state.slots.iter_mut().zip(&i.slots) {
                s[range.clone()].fill(*v);
            }
        }
    }

    /// Evicts rows not seen for longer than `steps_to_live` before `step`
    /// (a key-value table, when a checkpoint is saved); returns how many.
    pub fn evict_stale(&mut self, step: u64) -> usize {
        match &mut self.storage {
            Storage::Array => 0,
            Storage::KeyValue(kv) => kv.evict_stale(step),
        }
    }

    /// Keeps the keys a key-value table evicts from now on (incremental
    /// updates report them); nothing for an array.
    pub fn track_evictions(&mut self) {
        if let Storage::KeyValue(kv) = &mut self.storage {
            kv.track_evictions();
        }
    }

    /// The keys evicted since the last call, ascending and distinct (with
    /// `track_evictions`; none for an array).
    pub fn take_evicted(&mut self) -> Vec<u64> {
        let Storage::KeyValue(kv) = &mut self.storage else {
            return Vec::new();
        };
        let mut keys = kv.take_evicted();
        keys.sort_unstable();
        keys.dedup();
        keys
    }

    /// Rows this rank holds now, and the bytes they take (values, slots
    /// and, for a key-value table, its index).
    pub fn held(&self) -> (usize, usize) {
        let slots = self.state.slots.len();
        match &self.storage {
            Storage::Array => {
                let rows = self.weights.len() / self.dim.max(1);
                (rows, rows * self.dim * 4 * (1 + slots))
            }
            Storage::KeyValue(kv) => (kv.len(), kv.capacity() * KeyValue::bytes_per_row(self.dim, slots)),
        }
    }
}

/// Where pooling reads embedding rows from: a local table, or rows fetched
/// from their owners for one step.
pub trait RowSource: Sync {
    fn dim(&self) -> usize;
    fn row(&self, g: u64) -> &[f32];
}

impl RowSource for Table {
    fn dim(&self) -> usize {
        self.dim
    }
    #[inline]
    fn row(&self, g: u64) -> &[f32] {
        match &self.storage {
            Storage::Array => {
                let l = self.sharding.local(g);
                &self.weights[l * self.dim..(l + 1) * self.dim]
            }
            Storage::KeyValue(kv) => match kv.slot(g) {
                Some(l) => &self.weights[l * self.dim..(l + 1) * self.dim],
                None => kv.default_row(),
            },
        }
    }
}

/// Rows fetched from other ranks, by global id.
#[derive(Debug, Clone, Default)]
pub struct FetchedRows {
    pub dim: usize,
    pub index: IdMap<usize>,
    pub data: Vec<f32>,
}

impl FetchedRows {
    /// No rows yet of a table of `dim` values per row.
    pub fn of_dim(dim: usize) -> Self {
        FetchedRows {
            dim,
            ..FetchedRows::default()
        }
    }

    /// Adds the rows `ids`, whose values lie back to back in `values`.
    pub fn extend(&mut self, ids: &[u64], values: &[f32]) {
        assert_eq!(values.len(), ids.len() * self.dim, "fetched rows of the wrong width");
        let first = self.data.len() / self.dim.max(1);
        for (k, id) in ids.iter().enumerate() {
            self.index.insert(*id, first + k);
        }
        self.data.extend_from_slice(values);
    }
}

impl RowSource for FetchedRows {
    fn dim(&self) -> usize {
        self.dim
    }
    fn row(&self, g: u64) -> &[f32] {
        let i = self.index[&g];
        &self.data[i * self.dim..(i + 1) * self.dim]
    }
}

/// Pools `ids` of every row of a batch (sum, or weighted mean) into
/// `out[b * stride + col .. + dim]`.
pub fn pool_into(table: &dyn RowSource, j: &Jagged, mean: bool, out: &mut [f32], stride: usize, col: usize) {
    out.par_chunks_mut(stride)
        .enumerate()
        .for_each(|(b, row_out)| pool_rows(table, j, mean, row_out, stride, col, b));
}

/// Asks the CPU to start loading `row` into the caches (a no-op off
/// x86-64). A batch's rows are scattered over tables far larger than the
/// caches; asking for a block's rows before summing them overlaps their
/// memory latencies instead of waiting on them one by one.
#[inline]
pub fn prefetch(row: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if let (Some(first), Some(last)) = (row.first(), row.last()) {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // A row may straddle two cache lines.
        for p in [first, last] {
            // SAFETY: a prefetch is a hint that reads nothing architecturally
            // and cannot fault; SSE is in x86-64's baseline.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(std::ptr::from_ref(p).cast::<i8>()) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = row;
}

/// Asks for the part `col..col + dim` of row `row + 8` of the `rows`-row
/// matrix `m` (`stride` wide), if there is one. A loop over one part of
/// each row of a wide matrix (a table's columns of a group input, or of
/// its gradient) touches a cache line or two a row, one row a stride
/// apart, which the hardware does not fetch ahead by itself: 8 rows ahead
/// the loop's loads and stores stop waiting on them.
#[inline]
fn prefetch_part_ahead(m: &[f32], (row, rows): (usize, usize), (stride, col, dim): (usize, usize, usize)) {
    const AHEAD: usize = 8;
    if row + AHEAD < rows {
        let at = (row + AHEAD) * stride + col;
        prefetch(&m[at..at + dim]);
    }
}

/// The weight id `i` of `j` is pooled with: its own, or 1 without weights.
/// A mean (any combiner but sum) leaves out ids of weight <= 0, as
/// TensorFlow's `safe_embedding_lookup_sparse` prunes them for EasyRec's
/// embedding columns (a raw feature's projection of a negative value, a
/// tag of weight 0): their weight is 0, and a row left with none is zeros.
fn pooled_weight(j: &Jagged, i: usize, mean: bool) -> f32 {
    let w = j.weights.as_ref().map_or(1.0, |w| w[i]);
    if mean {
        w.max(0.0)
    } else {
        w
    }
}

/// `pool_into` for the batch rows `first..` that `out` holds.
pub fn pool_rows(
    table: &dyn RowSource,
    j: &Jagged,
    mean: bool,
    out: &mut [f32],
    stride: usize,
    col: usize,
    first: usize,
) {
    let dim = table.dim();
    let rows = out.len() / stride.max(1);
    let (s, e) = (j.offsets[first] as usize, j.offsets[first + rows] as usize);
    for &id in &j.ids[s..e] {
        prefetch(table.row(id));
    }
    for k in 0..rows {
        // The stores waited on each row's part (DLRM's pooling 6.2-8.0 ms a
        // step; asked for ahead, 3.9-4.7).
        prefetch_part_ahead(out, (k, rows), (stride, col, dim));
        let b = first + k;
        let dst = &mut out[k * stride + col..k * stride + col + dim];
        let (s, e) = (j.offsets[b] as usize, j.offsets[b + 1] as usize);
        if s == e {
            dst.fill(0.0);
            continue;
        }
        // The first id's row written, not added to a zeroed row: a zeroing
        // pass (a call to memset for a few bytes), then loads of what it
        // had just stored, cost more than the sum (`0.0 + w * x` keeps a
        // zero's sign as the sum onto zeros did).
        let w = pooled_weight(j, s, mean);
        let mut wsum = w;
        for (d, x) in dst.iter_mut().zip(table.row(j.ids[s])) {
            *d = 0.0 + w * x;
        }
        for i in s + 1..e {
            let w = pooled_weight(j, i, mean);
            wsum += w;
            for (d, x) in dst.iter_mut().zip(table.row(j.ids[i])) {
                *d += w * x;
            }
        }
        if mean && wsum > 0.0 {
            for d in dst.iter_mut() {
                *d /= wsum;
            }
        }
    }
}

/// For the batch rows `first..` that `out` holds: each row's first `len`
/// ids' embeddings side by side at `col` (`len * dim` columns), zeros
/// past the row's ids. A sequence of several ids per position
/// (`Jagged::positions`) adds each position's ids' rows, weighted.
pub fn positions_rows(
    table: &dyn RowSource,
    j: &Jagged,
    len: usize,
    out: &mut [f32],
    (stride, col): (usize, usize),
    first: usize,
) {
    let dim = table.dim();
    for (k, row_out) in out.chunks_exact_mut(stride).enumerate() {
        let b = first + k;
        let dst = &mut row_out[col..col + len * dim];
        dst.fill(0.0);
        for (id, pos, w) in placed_ids(j, b, len) {
            for (a, x) in dst[pos * dim..(pos + 1) * dim].iter_mut().zip(table.row(id)) {
                *a += w * x;
            }
        }
    }
}

/// Row `b`'s ids with the position each goes to and its weight, the
/// positions below `len`: id `k` at position `k` with weight 1, or, for a
/// sequence of several ids per position, as `Jagged::positions` and the
/// weights say.
fn placed_ids(j: &Jagged, b: usize, len: usize) -> impl Iterator<Item = (u64, usize, f32)> + '_ {
    let s = j.offsets[b] as usize;
    (s..j.offsets[b + 1] as usize)
        .map(move |i| {
            let pos = j.positions.as_ref().map_or(i - s, |p| p.of_id[i] as usize);
            (j.ids[i], pos, j.weights.as_ref().map_or(1.0, |w| w[i]))
        })
        .filter(move |&(_, pos, _)| pos < len)
}

/// The row's number of ids, at most `len`, at `out[b * stride + col]`.
pub fn length_rows(j: &Jagged, len: usize, out: &mut [f32], (stride, col): (usize, usize), first: usize) {
    for (k, row_out) in out.chunks_exact_mut(stride).enumerate() {
        let b = first + k;
        let n = match &j.positions {
            None => j.offsets[b + 1] - j.offsets[b],
            Some(p) => p.lens[b],
        };
        row_out[col] = n.min(len as u32) as f32;
    }
}

/// Scatters the gradient of `positions_rows`' output back onto the ids.
pub fn scatter_positions(
    j: &Jagged,
    len: usize,
    grad: &[f32],
    (stride, col): (usize, usize),
    dim: usize,
    acc: &mut RowGrads,
) {
    for b in 0..j.offsets.len() - 1 {
        let g = &grad[b * stride + col..b * stride + col + len * dim];
        for (id, pos, w) in placed_ids(j, b, len) {
            for (a, x) in acc.slot(id, dim).iter_mut().zip(&g[pos * dim..(pos + 1) * dim]) {
                *a += w * x;
            }
        }
    }
}

/// Summed gradients of the rows one table received in a step.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RowGrads {
    pub rows: Vec<u64>,
    /// `rows.len() * dim`, aligned with `rows`.
    pub grads: Vec<f32>,
    index: IdMap<usize>,
}

impl RowGrads {
    /// Room for `rows` distinct rows of `dim` values (at most; a batch's
    /// ids repeat), so the index is not rebuilt as it grows.
    pub fn reserve(&mut self, rows: usize, dim: usize) {
        self.index.reserve(rows);
        self.rows.reserve(rows);
        self.grads.reserve(rows * dim);
    }

    pub fn slot(&mut self, row: u64, dim: usize) -> &mut [f32] {
        let i = self.index_of(row);
        self.grads.resize(self.rows.len() * dim, 0.0);
        &mut self.grads[i * dim..(i + 1) * dim]
    }

    /// Row `row`'s place in `rows`, added at the end when new; its
    /// gradient is left to the caller (`grads` resized).
    fn index_of(&mut self, row: u64) -> usize {
        *self.index.entry(row).or_insert_with(|| {
            self.rows.push(row);
            self.rows.len() - 1
        })
    }

    /// Adds `grad` to row `row`'s gradient.
    pub fn add(&mut self, row: u64, grad: &[f32]) {
        for (a, g) in self.slot(row, grad.len()).iter_mut().zip(grad) {
            *a += g;
        }
    }

    pub fn squared_norm(&self) -> f64 {
        crate::util::sum_of_squares(&self.grads)
    }
}

/// Scatters the gradient of the pooled output (`grad[b * stride + col..]`)
/// back onto the ids it was pooled from, summing duplicates.
///
/// The ids' places are found first, then the gradients added: each id's
/// hash lookup and its gradient's read-modify-write miss the caches, and
/// one after the other per id they wait on each other (alone, 26 tables of
/// 2048 ids on one thread: 8-10 ms interleaved, 2.5 ms in two passes).
pub fn scatter_grad(j: &Jagged, mean: bool, grad: &[f32], stride: usize, col: usize, dim: usize, acc: &mut RowGrads) {
    let places: Vec<usize> = j.ids.iter().map(|&id| acc.index_of(id)).collect();
    acc.grads.resize(acc.rows.len() * dim, 0.0);
    let batch = j.offsets.len() - 1;
    for b in 0..batch {
        // The sums waited on each row's gradient (DLRM's 26 tables on 2
        // threads: 4.3 ms a step; asked for ahead, 2.1).
        prefetch_part_ahead(grad, (b, batch), (stride, col, dim));
        let (s, e) = (j.offsets[b] as usize, j.offsets[b + 1] as usize);
        if s == e {
            continue;
        }
        let g = &grad[b * stride + col..b * stride + col + dim];
        let wsum: f32 = if mean {
            (s..e).map(|i| pooled_weight(j, i, mean)).sum()
        } else {
            1.0
        };
        for (i, &place) in places.iter().enumerate().take(e).skip(s) {
            let w = pooled_weight(j, i, mean) / if wsum > 0.0 { wsum } else { 1.0 };
            let at = place * dim;
            for (a, x) in acc.grads[at..at + dim].iter_mut().zip(g) {
                *a += w * x;
            }
        }
    }
}

/// Applies `rule` to the touched rows of `table` (rows scaled by `scale`
/// first, for gradient clipping).
///
/// Returns whether every updated row is finite, checked as it is updated
/// (while it is in cache: a pass over the rows afterwards costs as much
/// as the update).
pub fn apply_rows(table: &mut Table, grads: &RowGrads, rule: &Rule, scale: f32) -> bool {
    let dim = table.dim;
    let mut g = vec![0.0f32; dim];
    let mut finite = true;
    // Rows this far ahead are asked for while this one is updated (see
    // `prefetch`): its weights and its optimizer slots.
    const AHEAD: usize = 8;
    for (k, &r) in grads.rows.iter().enumerate() {
        if let Some(at) = grads.rows.get(k + AHEAD).and_then(|&next| table.slot(next)) {
            let at = at * dim;
            prefetch(&table.weights[at..at + dim]);
            for s in &table.state.slots {
                prefetch(&s[at..at + dim]);
            }
        }
        // A key without a row (below filter_freq) gets no update.
        let Some(l) = table.slot(r) else {
            continue;
        };
        let range = l * dim..(l + 1) * dim;
        for (d, s) in g.iter_mut().zip(&grads.grads[k * dim..(k + 1) * dim]) {
            *d = s * scale;
        }
        rule.apply_at(&mut table.weights[range.clone()], &g, &mut table.state, range.clone());
        finite &= table.weights[range].iter().fold(true, |ok, v| ok & v.is_finite());
    }
    if rule.kind.moves_untouched_rows() && matches!(table.storage, Storage::Array) {
        finite &= apply_untouched(table, grads, rule);
    }
    finite
}

/// The rows (global ids) of an array table that a dense-update rule
/// (`OptimizerKind::moves_untouched_rows`) still moves without a gradient:
/// those whose first moment is not zero. Incremental updates carry them.
pub fn moving_rows(table: &Table) -> Vec<u64> {
    let dim = table.dim.max(1);
    match (&table.storage, table.state.slots.first()) {
        (Storage::Array, Some(m)) => m
            .chunks_exact(dim)
            .enumerate()
            .filter(|(_, row)| row.iter().any(|x| *x != 0.0))
            .map(|(l, _)| table.sharding.global(l))
            .collect(),
        _ => Vec::new(),
    }
}

/// The rest of a dense-update rule's step on an array table: every row
/// the batch left alone takes the update of a zero gradient. TensorFlow's
/// `AdamOptimizer` (EasyRec's `adam_optimizer`, and the Adam part of its
/// `adamw_optimizer`) applies a sparse gradient so: every row's moments
/// decay and every row moves by them; LazyAdam and the other rules update
/// only the batch's rows. Returns whether those rows stay finite.
fn apply_untouched(table: &mut Table, grads: &RowGrads, rule: &Rule) -> bool {
    let rule = &Rule {
        kind: rule.kind.untouched_rows_rule(),
        ..rule.clone()
    };
    let dim = table.dim;
    let rows = table.weights.len() / dim.max(1);
    let mut touched: Vec<usize> = grads.rows.iter().filter_map(|&r| table.slot(r)).collect();
    touched.sort_unstable();
    touched.dedup();
    // Runs of untouched rows, updated in spans of at most this many values.
    const SPAN: usize = 1 << 14;
    let zeros = vec![0.0f32; SPAN.max(dim)];
    let span_rows = (SPAN / dim.max(1)).max(1);
    let mut finite = true;
    let mut start = 0;
    for end in touched.iter().copied().chain(std::iter::once(rows)) {
        let mut a = start;
        while a < end {
            let b = end.min(a + span_rows);
            let range = a * dim..b * dim;
            rule.apply_at(
                &mut table.weights[range.clone()],
                &zeros[..range.len()],
                &mut table.state,
                range.clone(),
            );
            finite &= table.weights[range].iter().fold(true, |ok, v| ok & v.is_finite());
            a = b;
        }
        start = end + 1;
    }
    finite
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jagged(ids: &[u64], offsets: &[u32]) -> Jagged {
        Jagged {
            ids: ids.to_vec(),
            offsets: offsets.to_vec(),
            weights: None,
            positions: None,
        }
    }

    /// A replicated table of `dim`-wide rows holding `weights`.
    fn table_of(dim: usize, weights: Vec<f32>) -> Table {
        let kind = OptimizerKind::Momentum { momentum: 0.0 };
        let rows = weights.len() / dim;
        let mut t = Table::new(
            ("t", rows, dim),
            &EmbeddingInit::Default,
            1,
            (0, &kind),
            Sharding::Replicated,
        );
        t.weights = weights;
        t
    }

    /// TensorFlow's `AdamOptimizer` on a sparse gradient moves every row
    /// by its momentum, trained in the step or not (one never trained stays
    /// put); so does EasyRec's AdamW, whose weight decay reaches only the
    /// step's rows; LazyAdam moves only the step's rows. Two steps on a
    /// 3-row table, row 0 trained in the first, row 1 in the second.
    #[test]
    fn adam_moves_rows_with_momentum_that_a_step_does_not_train_and_lazy_adam_does_not() {
        for (kind, dense) in [
            (
                OptimizerKind::AdamW {
                    beta1: 0.9,
                    beta2: 0.999,
                    weight_decay: 0.05,
                },
                true,
            ),
            (
                OptimizerKind::Adam {
                    beta1: 0.9,
                    beta2: 0.999,
                },
                true,
            ),
            (
                OptimizerKind::LazyAdam {
                    beta1: 0.9,
                    beta2: 0.999,
                },
                false,
            ),
        ] {
            assert_eq!(kind.moves_untouched_rows(), dense);
            let mut t = Table::new(
                ("t", 3, 2),
                &EmbeddingInit::Default,
                1,
                (0, &kind),
                Sharding::Replicated,
            );
            t.weights = vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
            let grads = |row: u64| {
                let mut g = RowGrads::default();
                g.add(row, &[0.5, -0.25]);
                g
            };
            let rule = |t: u64| Rule {
                kind: kind.clone(),
                lr: 0.1,
                t,
            };
            assert!(apply_rows(&mut t, &grads(0), &rule(1), 1.0));
            let after_one = t.weights.clone();
            assert_ne!(after_one[..2], [1.0, 2.0]);
            assert_eq!(after_one[2..], [3.0, 4.0, 5.0, 6.0]);
            assert!(apply_rows(&mut t, &grads(1), &rule(2), 1.0));
            // Row 0 in the second step: Adam's update of a zero gradient.
            let (mut w, mut m, mut v) = (after_one[..2].to_vec(), vec![0.0f32; 2], vec![0.0f32; 2]);
            let first = rule(1);
            first.apply(&mut [1.0, 2.0], &[0.5, -0.25], &mut [&mut m, &mut v]);
            let untouched = Rule {
                kind: kind.untouched_rows_rule(),
                ..rule(2)
            };
            untouched.apply(&mut w, &[0.0, 0.0], &mut [&mut m, &mut v]);
            if dense {
                assert_eq!(t.weights[..2], w[..]);
                assert_ne!(w, after_one[..2]);
                assert_eq!(moving_rows(&t), [0, 1]);
            } else {
                assert_eq!(t.weights[..2], after_one[..2]);
            }
            assert_ne!(t.weights[2..4], [3.0, 4.0]);
            assert_eq!(t.weights[4..], [5.0, 6.0], "a row never trained stays put");
        }
    }

    /// TensorFlow's safe embedding lookup: a sum keeps entries of weight
    /// <= 0, a mean leaves them out (a row left with none is zeros); the
    /// gradients follow.
    #[test]
    fn a_mean_leaves_out_weights_that_are_not_positive_and_a_sum_keeps_them() {
        let t = table_of(1, vec![1., 10., 100.]);
        // Row 0: ids 0 (weight -2), 1 (weight 3); row 1: id 2 (weight 0).
        let mut j = jagged(&[0, 1, 2], &[0, 2, 3]);
        j.weights = Some(vec![-2.0, 3.0, 0.0]);
        let mut out = vec![9.0f32; 2];
        pool_rows(&t, &j, false, &mut out, 1, 0, 0);
        assert_eq!(out, vec![-2.0 + 30.0, 0.0]);
        pool_rows(&t, &j, true, &mut out, 1, 0, 0);
        assert_eq!(out, vec![10.0, 0.0]);
        for (mean, want) in [(false, [-2.0, 3.0, 0.0]), (true, [0.0, 1.0, 0.0])] {
            let mut acc = RowGrads::default();
            scatter_grad(&j, mean, &[1.0, 1.0], 1, 0, 1, &mut acc);
            for (id, w) in want.iter().enumerate() {
                let at = acc.rows.iter().position(|r| *r == id as u64).unwrap();
                assert_eq!(acc.grads[at], *w, "mean {mean}, id {id}");
            }
        }
    }

    #[test]
    fn several_ids_of_one_position_add_up_weighted_and_so_do_their_gradients() {
        let t = table_of(2, vec![1., 2., 3., 4., 5., 6., 7., 8.]);
        // Row 0: position 0 holds ids {0, 1} (mean), position 1 id 3;
        // row 1: one position without ids, then id 2; row 2: none.
        let mut j = jagged(&[0, 1, 3, 2], &[0, 3, 4, 4]);
        j.weights = Some(vec![0.5, 0.5, 1.0, 1.0]);
        j.positions = Some(crate::features::SeqPositions {
            of_id: vec![0, 0, 1, 1],
            lens: vec![2, 2, 0],
        });
        let mut out = vec![9.0f32; 3 * 5];
        positions_rows(&t, &j, 2, &mut out, (5, 1), 0);
        length_rows(&j, 2, &mut out, (5, 0), 0);
        assert_eq!(out, vec![2., 2., 3., 7., 8., 2., 0., 0., 5., 6., 0., 0., 0., 0., 0.]);
        // A length capped at `len`.
        length_rows(&j, 1, &mut out, (5, 0), 0);
        assert_eq!(out[5], 1.0);
        let grad: Vec<f32> = (0..15).map(|x| x as f32).collect();
        let mut acc = RowGrads::default();
        scatter_positions(&j, 2, &grad, (5, 1), 2, &mut acc);
        let of = |id: u64| {
            acc.rows
                .iter()
                .position(|r| *r == id)
                .map(|i| acc.grads[2 * i..2 * i + 2].to_vec())
        };
        assert_eq!(of(0), Some(vec![0.5, 1.0]));
        assert_eq!(of(1), Some(vec![0.5, 1.0]));
        assert_eq!(of(3), Some(vec![3.0, 4.0]));
        assert_eq!(of(2), Some(vec![8.0, 9.0]));
    }

    #[test]
    fn pooling_and_hand_computed_sparse_sgd_step() {
        let kind = OptimizerKind::Momentum { momentum: 0.0 };
        let mut t = Table::new(
            ("t", 4, 2),
            &EmbeddingInit::Default,
            1,
            (0, &kind),
            Sharding::Replicated,
        );
        t.weights = vec![1., 2., 3., 4., 5., 6., 7., 8.];
        // row 0 pools ids {0, 2}, row 1 pools {2}, row 2 none.
        let j = jagged(&[0, 2, 2], &[0, 2, 3, 3]);
        let mut out = vec![9.0f32; 3 * 3];
        pool_into(&t, &j, false, &mut out, 3, 1);
        assert_eq!(out, vec![9., 6., 8., 9., 5., 6., 9., 0., 0.]);
        let mut mean = vec![0.0f32; 3 * 2];
        pool_into(&t, &j, true, &mut mean, 2, 0);
        assert_eq!(&mean[..2], &[3., 4.]);

        // d loss / d pooled: row 0 -> (1, 0), row 1 -> (0, 2); id 2 appears twice.
        let grad = vec![0., 1., 0., 0., 0., 2., 0., 0., 0.];
        let mut acc = RowGrads::default();
        scatter_grad(&j, false, &grad, 3, 1, 2, &mut acc);
        let rule = Rule { kind, lr: 0.5, t: 1 };
        apply_rows(&mut t, &acc, &rule, 1.0);
        // id 0: (1,2) - 0.5*(1,0); id 2: (5,6) - 0.5*((1,0)+(0,2)); others untouched.
        assert_eq!(t.weights, vec![0.5, 2., 3., 4., 4.5, 5., 7., 8.]);
    }

    #[test]
    fn init_is_per_row_deterministic() {
        let kind = OptimizerKind::Momentum { momentum: 0.0 };
        let a = Table::new(
            ("x", 10, 4),
            &EmbeddingInit::Default,
            3,
            (0, &kind),
            Sharding::Replicated,
        );
        let mut r7 = [0.0f32; 4];
        init_row(3, "x", 10, 7, &EmbeddingInit::Default, &mut r7);
        assert_eq!(a.row(7), &r7);
        assert!(a.weights.iter().all(|w| w.abs() <= 1.0));
    }

    #[test]
    fn configured_initializers_shape_the_rows() {
        let mut row = vec![0.0f32; 4];
        init_row(1, "t", 100, 3, &EmbeddingInit::Constant(vec![0.5]), &mut row);
        assert_eq!(row, vec![0.5; 4]);
        init_row(
            1,
            "t",
            100,
            3,
            &EmbeddingInit::Constant(vec![1.0, 2.0, 3.0, 4.0]),
            &mut row,
        );
        assert_eq!(row, vec![1.0, 2.0, 3.0, 4.0]);
        let mut big = vec![0.0f32; 20_000];
        let init = EmbeddingInit::TruncatedNormal {
            mean: 1.0,
            stddev: 0.05,
        };
        init_row(1, "t", 1, 0, &init, &mut big);
        let mean = big.iter().map(|v| *v as f64).sum::<f64>() / big.len() as f64;
        assert!((mean - 1.0).abs() < 0.002, "{mean}");
        // truncated at two standard deviations
        assert!(big.iter().all(|v| (v - 1.0).abs() <= 0.1 + 1e-6));
        let std = |init: &EmbeddingInit, rows| {
            let mut v = vec![0.0f32; 20_000];
            init_row(2, "u", rows, 0, init, &mut v);
            (v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>() / v.len() as f64).sqrt()
        };
        // default: stddev 0.01/sqrt(dim) before truncation (0.88 of it after)
        let d = std(&EmbeddingInit::Default, 1);
        assert!((d / (0.01 / (20_000f64).sqrt()) - 0.88).abs() < 0.03, "{d}");
        // Glorot normal over [rows, dim]: sqrt(2 / (rows + dim)) after truncation
        let g = std(&EmbeddingInit::GlorotNormal, 30_000);
        assert!((g / (2.0 / 50_000f64).sqrt() - 1.0).abs() < 0.03, "{g}");
    }
}
