//! Batch prediction: Parquet or CSV in, scores out (CSV or Parquet by the
//! output's extension), from a checkpoint or from an export directory, with
//! reserved input columns passed through.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context};
use arrow_array::{ArrayRef, Float32Array, Float64Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};

use crate::config::data_plan::InputFormat;
use crate::config::typed::TrainingPlan;
use crate::data::{expand_paths, Column, StreamSpec};
use crate::export::runtime::ExportedModel;
use crate::features::{Batch, Encoder};
use crate::inference::Bundle;
use crate::model::TaskScores;

/// What scores the rows.
pub enum Scorer {
    /// The CPU executor on a checkpoint's weights.
    Checkpoint(Box<Bundle>),
    /// The exported ONNX graph in an independent runtime.
    Export(Box<ExportedModel>),
}

impl Scorer {
    pub fn plan(&self) -> &TrainingPlan {
        match self {
            Scorer::Checkpoint(t) => &t.plan,
            Scorer::Export(e) => &e.plan,
        }
    }

    /// Each task's logits and scores (probabilities, or values for
    /// regression).
    pub fn score(&self, batch: &Batch) -> anyhow::Result<Vec<TaskScores>> {
        match self {
            Scorer::Checkpoint(b) => Ok(b.score(batch)),
            Scorer::Export(e) => e.score(batch),
        }
    }
}

/// A job predict cannot run as asked: the user's to fix.
#[derive(Debug, thiserror::Error)]
pub enum PredictError {
    #[error("--reserved_cols: `{0}` is not among data_config.input_fields")]
    UnknownColumn(String),
}

impl crate::error::Classified for PredictError {
    fn fault(&self) -> crate::error::Fault {
        crate::error::Fault::User
    }
}

pub struct PredictJob {
    pub inputs: Vec<String>,
    pub output: PathBuf,
    /// Input columns copied to the output; `ALL_COLUMNS` = every declared input field.
    pub reserved_cols: Vec<String>,
    pub batch_size: usize,
}

/// Scores every row of the inputs; returns the number of rows written.
pub fn predict(scorer: &Scorer, job: &PredictJob) -> anyhow::Result<usize> {
    let plan = scorer.plan();
    let enc = Encoder::for_inference(plan)?;
    let mut projection = enc.projection.clone();
    let reserved: Vec<String> = if job.reserved_cols.iter().any(|c| c == "ALL_COLUMNS") {
        plan.data.fields.iter().map(|f| f.name.clone()).collect()
    } else {
        job.reserved_cols.clone()
    };
    let reserved_idx = reserved
        .iter()
        .map(|c| {
            projection
                .add(c, &plan.data.fields, false)
                .ok_or_else(|| PredictError::UnknownColumn(c.clone()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let files = expand_paths(&job.inputs)?;
    if files.is_empty() {
        bail!("no input files given");
    }
    let format = if files.iter().all(|f| f.extension().is_some_and(|e| e == "parquet")) {
        InputFormat::Parquet { packed: false }
    } else {
        plan.data.format.clone()
    };
    let spec = StreamSpec {
        files,
        format,
        fields: plan.data.fields.clone(),
        projection,
        batch_size: job.batch_size.max(1),
        epochs: Some(1),
        shuffle: false,
        shuffle_buffer: 1,
        seed: 0,
        shard: (0, 1),
        skip_batches: 0,
        max_rows: 0,
    };
    // Per task its logits and scores, named as in the export.
    let score_cols: Vec<String> = plan.model.tasks.iter().flat_map(crate::model::score_columns).collect();
    let mut out = Output::new(&job.output, &reserved, &score_cols)?;
    let mut failure: Option<anyhow::Error> = None;
    spec.run(|raw| {
        let mut step = || -> anyhow::Result<()> {
            let batch = enc.encode(&raw)?;
            let scores = scorer.score(&batch)?;
            let cols: Vec<&Column> = reserved_idx.iter().map(|&i| &raw.columns[i]).collect();
            let columns: Vec<Vec<f32>> = scores.iter().flat_map(TaskScores::columns).collect();
            let values: Vec<&[f32]> = columns.iter().map(Vec::as_slice).collect();
            out.push(&cols, &values)
        };
        match step() {
            Ok(()) => true,
            Err(e) => {
                failure = Some(e);
                false
            }
        }
    })?;
    if let Some(e) = failure {
        return Err(e);
    }
    out.finish()
}

/// The output file, written under a temporary name and renamed at the end.
struct Output {
    path: PathBuf,
    tmp: crate::output::Temp,
    names: Vec<String>,
    rows: usize,
    kind: OutputKind,
}

enum OutputKind {
    Csv(std::io::BufWriter<std::fs::File>),
    Parquet(Option<Box<parquet::arrow::ArrowWriter<std::fs::File>>>),
}

fn text(c: &Column, r: usize) -> String {
    match c {
        Column::Float(v) => v[r].to_string(),
        Column::Int(v) => v[r].to_string(),
        Column::Str(s) => s.get(r).to_string(),
        Column::List { offsets, values } => (offsets[r]..offsets[r + 1])
            .map(|i| text(values, i))
            .collect::<Vec<_>>()
            .join(","),
    }
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

impl Output {
    fn new(path: &Path, reserved: &[String], score_cols: &[String]) -> anyhow::Result<Self> {
        path.file_name()
            .with_context(|| format!("output path {} has no file name", path.display()))?;
        crate::output::check(path, &[])?;
        let tmp = crate::output::Temp::beside(path);
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        }
        let mut names: Vec<String> = reserved.to_vec();
        names.extend(score_cols.iter().cloned());
        let kind = if path.extension().is_some_and(|e| e == "parquet") {
            OutputKind::Parquet(None)
        } else {
            let f =
                std::fs::File::create(&tmp.path).with_context(|| format!("cannot create {}", tmp.path.display()))?;
            let mut w = std::io::BufWriter::new(f);
            use std::io::Write;
            let header: Vec<String> = names.iter().map(|n| csv_field(n)).collect();
            writeln!(w, "{}", header.join(",")).with_context(|| format!("cannot write {}", tmp.path.display()))?;
            OutputKind::Csv(w)
        };
        Ok(Output {
            path: path.to_path_buf(),
            tmp,
            names,
            rows: 0,
            kind,
        })
    }

    /// Rows of the reserved columns and the score columns.
    fn push(&mut self, reserved: &[&Column], values: &[&[f32]]) -> anyhow::Result<()> {
        let n = values.first().map_or(0, |v| v.len());
        match &mut self.kind {
            OutputKind::Csv(w) => {
                use std::io::Write;
                for r in 0..n {
                    let mut fields: Vec<String> = reserved.iter().map(|c| csv_field(&text(c, r))).collect();
                    fields.extend(values.iter().map(|v| v[r].to_string()));
                    writeln!(w, "{}", fields.join(","))
                        .with_context(|| format!("cannot write {}", self.tmp.path.display()))?;
                }
            }
            OutputKind::Parquet(writer) => {
                let mut arrays: Vec<ArrayRef> = reserved
                    .iter()
                    .map(|c| -> ArrayRef {
                        match c {
                            Column::Float(v) => Arc::new(Float64Array::from(v.clone())),
                            Column::Int(v) => Arc::new(Int64Array::from(v.clone())),
                            c => Arc::new(StringArray::from((0..n).map(|r| text(c, r)).collect::<Vec<_>>())),
                        }
                    })
                    .collect();
                arrays.extend(
                    values
                        .iter()
                        .map(|v| -> ArrayRef { Arc::new(Float32Array::from(v.to_vec())) }),
                );
                let fields: Vec<Field> = self
                    .names
                    .iter()
                    .zip(&arrays)
                    .map(|(name, a)| Field::new(name, a.data_type().clone(), false))
                    .collect();
                let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays)?;
                if writer.is_none() {
                    let f = std::fs::File::create(&self.tmp.path)
                        .with_context(|| format!("cannot create {}", self.tmp.path.display()))?;
                    *writer = Some(Box::new(parquet::arrow::ArrowWriter::try_new(f, batch.schema(), None)?));
                }
                let w = writer.as_mut().expect("writer was just created");
                w.write(&batch)
                    .with_context(|| format!("cannot write {}", self.tmp.path.display()))?;
            }
        }
        self.rows += n;
        Ok(())
    }

    fn finish(self) -> anyhow::Result<usize> {
        match self.kind {
            OutputKind::Csv(mut w) => {
                use std::io::Write;
                w.flush()
                    .with_context(|| format!("cannot write {}", self.tmp.path.display()))?;
            }
            OutputKind::Parquet(Some(w)) => {
                w.close()
                    .with_context(|| format!("cannot write {}", self.tmp.path.display()))?;
            }
            OutputKind::Parquet(None) => {
                // No rows: an empty file with the score columns.
                let fields: Vec<Field> = self
                    .names
                    .iter()
                    .map(|n| Field::new(n, DataType::Float32, false))
                    .collect();
                let f = std::fs::File::create(&self.tmp.path)
                    .with_context(|| format!("cannot create {}", self.tmp.path.display()))?;
                parquet::arrow::ArrowWriter::try_new(f, Arc::new(Schema::new(fields)), None)?.close()?;
            }
        }
        let shown = format!("cannot rename {} to {}", self.tmp.path.display(), self.path.display());
        self.tmp.commit(&self.path).context(shown)?;
        Ok(self.rows)
    }
}
