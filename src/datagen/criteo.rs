//! Criteo-shaped synthetic data with a planted model: label, I1-I13 (int),
//! C1-C26 (hex strings) with Zipf-distributed ids and the Kaggle
//! cardinalities (optionally capped). Labels are drawn from a known logistic
//! model, so the best reachable AUC is the planted model's own AUC.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use arrow_array::{ArrayRef, Int32Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;

use crate::util::{hash_str, mix64, Rng};

/// Criteo Kaggle cardinalities of C1-C26.
pub const KAGGLE_CARDINALITIES: [u64; 26] = [
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27, 14992, 5461306, 10, 5652,
    2173, 4, 7046547, 18, 15, 286181, 105, 142572,
];

/// Ids at or past this frequency rank carry no signal (they are too rare to learn).
const SIGNAL_RANKS: u64 = 40;

#[derive(Debug, Clone)]
pub struct GenSpec {
    pub rows: usize,
    pub cap: u64,
    /// Seed of the rows drawn; train and eval files differ here.
    pub seed: u64,
    /// Seed of the planted model; train and eval files must share it.
    pub model_seed: u64,
    pub row_group_rows: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub struct GenReport {
    pub rows: usize,
    pub positive_rate: f64,
    /// AUC of the planted probabilities on the generated labels.
    pub planted_auc: f64,
}

fn weight(seed: u64, feature: usize, rank: u64) -> f64 {
    if rank >= SIGNAL_RANKS || feature % 2 == 1 {
        return 0.0; // half the features are pure noise
    }
    Rng::new(seed ^ mix64((feature as u64) << 40 ^ rank)).normal() * 0.8
}

fn zipf_rank(rng: &mut Rng, k: u64) -> u64 {
    // Continuous 1/x law over [1, k + 1): rank r has probability ~ 1/(r + 1).
    let r = ((k as f64 + 1.0).ln() * rng.uniform()).exp() as u64;
    r.saturating_sub(1).min(k - 1)
}

pub fn schema() -> Arc<Schema> {
    let mut fields = vec![Field::new("label", DataType::Int32, false)];
    fields.extend((1..=13).map(|i| Field::new(format!("I{i}"), DataType::Int64, false)));
    fields.extend((1..=26).map(|i| Field::new(format!("C{i}"), DataType::Utf8, false)));
    Arc::new(Schema::new(fields))
}

/// Writes `spec.rows` rows to `path` as Parquet (snappy).
pub fn generate(path: &Path, spec: &GenSpec) -> anyhow::Result<GenReport> {
    let file = File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    let props = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_max_row_group_row_count(Some(spec.row_group_rows.max(1)))
        .build();
    let schema = schema();
    let mut w = ArrowWriter::try_new(file, schema.clone(), Some(props))?;
    let cards: Vec<u64> = KAGGLE_CARDINALITIES.iter().map(|c| (*c).min(spec.cap.max(1))).collect();
    let dense_w: Vec<f64> = (0..13).map(|i| if i % 3 == 0 { 0.5 } else { 0.0 }).collect();
    let mut rng = Rng::new(spec.seed);
    let mut probs = Vec::with_capacity(spec.rows);
    let mut labels = Vec::with_capacity(spec.rows);
    let chunk = spec.row_group_rows.clamp(1, 1 << 16);
    let mut done = 0;
    while done < spec.rows {
        let n = chunk.min(spec.rows - done);
        let mut label = Vec::with_capacity(n);
        let mut dense: Vec<Vec<i64>> = (0..13).map(|_| Vec::with_capacity(n)).collect();
        let mut cats: Vec<Vec<String>> = (0..26).map(|_| Vec::with_capacity(n)).collect();
        for _ in 0..n {
            let mut logit = -1.3f64;
            for (i, col) in dense.iter_mut().enumerate() {
                // Uniform counts in [0, 1000): the planted effect is linear in
                // the min/max-normalised value the configs feed the model.
                let u = rng.uniform();
                col.push((u * 1000.0).floor() as i64);
                logit += dense_w[i] * (2.0 * u - 1.0);
            }
            for (f, col) in cats.iter_mut().enumerate() {
                let r = zipf_rank(&mut rng, cards[f]);
                logit += weight(spec.model_seed, f, r);
                col.push(format!("{:08x}", hash_str(&format!("{f}:{r}")) as u32));
            }
            let p = 1.0 / (1.0 + (-logit).exp());
            let y = (rng.uniform() < p) as i32;
            probs.push(p as f32);
            labels.push(y as f32);
            label.push(y);
        }
        let mut columns: Vec<ArrayRef> = vec![Arc::new(Int32Array::from(label))];
        columns.extend(dense.into_iter().map(|c| Arc::new(Int64Array::from(c)) as ArrayRef));
        columns.extend(cats.into_iter().map(|c| Arc::new(StringArray::from(c)) as ArrayRef));
        w.write(&RecordBatch::try_new(schema.clone(), columns)?)?;
        done += n;
    }
    w.close()?;
    Ok(GenReport {
        rows: spec.rows,
        positive_rate: labels.iter().map(|l| *l as f64).sum::<f64>() / spec.rows.max(1) as f64,
        planted_auc: crate::metrics::auc(&probs, &labels).unwrap_or(f64::NAN),
    })
}
