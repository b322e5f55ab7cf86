//! Scoring with an export directory: its pipeline.config turns raw columns
//! into ids, and an independent ONNX runtime (tract) runs model.onnx.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context};
use tract_onnx::prelude::*;

use super::{list_exports, MODEL_FILE};
use crate::config::feature_plan::FeaturePlan;
use crate::config::typed::TrainingPlan;
use crate::config::{load_pipeline, Overrides};
use crate::data::RawBatch;
use crate::features::{Batch, Encoded, Encoder, Jagged};
use crate::model::TaskScores;

/// Where a graph input's values come from.
#[derive(Clone)]
enum Source {
    Ids(usize),
    Lens(usize),
    Weights(usize),
    /// A multi-valued sequence's position of each id, and its rows' counts
    /// of positions.
    Positions(usize),
    SeqLens(usize),
    Dense(usize),
}

/// A packed serving row's layout (`export_config.multi_placeholder: false`).
#[derive(Debug, Clone, PartialEq)]
pub struct PackedInput {
    pub separator: String,
    pub fields: Vec<String>,
}

pub struct ExportedModel {
    pub dir: PathBuf,
    pub plan: TrainingPlan,
    pub enc: Encoder,
    /// Set when the export takes one packed string per row.
    pub packed: Option<PackedInput>,
    /// Inputs a request may give as a list per row, with the separator
    /// that joins the list into the text their feature reads
    /// (`export_config.multi_value_fields`).
    pub multi_value: HashMap<String, String>,
    sources: Vec<Source>,
    input_names: Vec<String>,
    runnable: Arc<TypedRunnableModel>,
}

/// An export directory itself, or the newest `<timestamp>/` under it.
pub fn resolve_export_dir(path: &Path) -> anyhow::Result<PathBuf> {
    if path.join(MODEL_FILE).exists() {
        return Ok(path.to_path_buf());
    }
    if !path.is_dir() {
        bail!("export directory {} does not exist", path.display());
    }
    match list_exports(path)?.pop() {
        Some(newest) => Ok(newest),
        None => bail!(
            "{} is not an export: it has no {MODEL_FILE} and no <timestamp>/ export inside",
            path.display()
        ),
    }
}

/// An export's `assets/feature_spec.json`, parsed once for every check of it.
fn read_feature_spec(path: &Path) -> anyhow::Result<serde_json::Value> {
    let text = crate::bounded::read_text(path, crate::bounded::table_bytes())
        .with_context(|| format!("{} is missing: not a complete export", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not valid JSON", path.display()))
}

/// Refuses exports whose feature spec this version cannot honour: those of
/// the first format hashed ids with FNV-1a, so their tables answer other
/// ids than the ones computed now; those of the second encode features
/// otherwise than EasyRec does, as this version does.
fn check_feature_spec(path: &Path, spec: &serde_json::Value) -> anyhow::Result<()> {
    match spec["format"].as_str() {
        Some(super::spec::FORMAT) => Ok(()),
        Some("rustrec-feature-spec-1") => bail!(
            "{}: this export hashes ids with the FNV-1a hash of earlier versions; ids are now hashed as \
             TensorFlow and EasyRec hash them (FarmHash Fingerprint64), so its tables do not match them: \
             train the model again and export it",
            path.display()
        ),
        Some("rustrec-feature-spec-2") => bail!(
            "{}: this export was written by an earlier version, which encoded some features otherwise than \
             EasyRec (vocabulary misses, raw features with embedding_dim, tag weights) and ordered a group's \
             columns as the config lists them: train the model again and export it",
            path.display()
        ),
        other => bail!("{}: unknown feature spec format {other:?}", path.display()),
    }
}

/// Exports of this feature-spec format written before raw values of
/// `raw_input_dim` > 1 were split by the feature's `separator` (as EasyRec
/// splits them) recorded ","; such an export would now read its rows
/// otherwise than it was trained, so it is refused.
fn check_raw_separators(path: &Path, spec: &serde_json::Value, features: &FeaturePlan) -> anyhow::Result<()> {
    for f in spec["features"].as_array().into_iter().flatten() {
        let t = &f["transform"];
        let (Some(name), Some(dim), Some(sep)) = (f["name"].as_str(), t["dim"].as_u64(), t["separator"].as_str())
        else {
            continue;
        };
        let now = features.iter().find_map(|p| match &p.kind {
            crate::config::feature_plan::FeatureKind::Raw { separator, .. } if p.name == name => {
                Some(separator.as_str())
            }
            _ => None,
        });
        if dim > 1 && now.is_some_and(|now| now != sep) {
            bail!(
                "{}: feature `{name}` was exported splitting its {dim} values by `{sep}`, but its config's separator \
                 is `{}` (EasyRec's rule, which this version follows): export the checkpoint again",
                path.display(),
                now.unwrap_or_default()
            );
        }
    }
    Ok(())
}

/// The packed serving layout the feature spec records, if any.
fn packed_input(path: &Path, spec: &serde_json::Value) -> anyhow::Result<Option<PackedInput>> {
    let s = &spec["serving_input"];
    if s["kind"].as_str() != Some("packed") {
        return Ok(None);
    }
    let fields = s["fields"]
        .as_array()
        .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect())
        .with_context(|| format!("{}: serving_input lacks its fields", path.display()))?;
    let separator = s["separator"]
        .as_str()
        .with_context(|| format!("{}: serving_input lacks its separator", path.display()))?
        .to_string();
    Ok(Some(PackedInput { separator, fields }))
}

impl ExportedModel {
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let dir = resolve_export_dir(path)?;
        let config = dir.join("assets/pipeline.config");
        if !config.exists() {
            bail!(
                "{} is not a complete export: assets/pipeline.config is missing",
                dir.display()
            );
        }
        let spec_path = dir.join("assets/feature_spec.json");
        let spec = read_feature_spec(&spec_path)?;
        check_feature_spec(&spec_path, &spec)?;
        let loaded = load_pipeline(&config, &Overrides::default())
            .with_context(|| format!("reading the export's config {}", config.display()))?;
        let plan = TrainingPlan::from_config(&loaded.config)?;
        check_raw_separators(&spec_path, &spec, &plan.features)?;
        let packed = packed_input(&spec_path, &spec)?;
        let enc = Encoder::for_inference(&plan)?;
        super::verify_files(&dir)?;
        let model_path = dir.join(MODEL_FILE);
        super::onnx_bounds::check(&dir, &model_path)?;
        let model = tract_onnx::onnx()
            .model_for_path(&model_path)
            .with_context(|| format!("cannot load ONNX model {}", model_path.display()))?;
        let by_name: HashMap<&str, usize> = plan
            .features
            .iter()
            .enumerate()
            .map(|(i, f)| (f.name.as_str(), i))
            .collect();
        let mut sources = Vec::new();
        let mut input_names = Vec::new();
        for outlet in model.input_outlets()? {
            let name = model.node(outlet.node).name.as_str();
            input_names.push(name.to_string());
            let feature = |base: &str| {
                by_name.get(base).copied().with_context(|| {
                    format!(
                        "{}: graph input `{name}` names no feature of assets/pipeline.config",
                        model_path.display()
                    )
                })
            };
            sources.push(match name.rsplit_once('/') {
                Some((base, "ids")) if by_name.contains_key(base) => Source::Ids(feature(base)?),
                Some((base, "lens")) if by_name.contains_key(base) => Source::Lens(feature(base)?),
                Some((base, "weights")) if by_name.contains_key(base) => Source::Weights(feature(base)?),
                Some((base, "positions")) if by_name.contains_key(base) => Source::Positions(feature(base)?),
                Some((base, "seq_lens")) if by_name.contains_key(base) => Source::SeqLens(feature(base)?),
                _ => Source::Dense(feature(name)?),
            });
        }
        let runnable = model
            .into_optimized()
            .and_then(|m| m.into_runnable())
            .with_context(|| format!("cannot prepare ONNX model {}", model_path.display()))?;
        let multi_value = plan.multi_value_inputs()?.into_iter().collect();
        Ok(ExportedModel {
            dir,
            plan,
            enc,
            packed,
            multi_value,
            sources,
            input_names,
            runnable,
        })
    }

    /// The same export scored by another prepared graph (the export's
    /// model with incremental updates applied: `updates::LiveModel`).
    pub fn with_runnable(&self, runnable: Arc<TypedRunnableModel>) -> Self {
        ExportedModel {
            dir: self.dir.clone(),
            plan: self.plan.clone(),
            enc: self.enc.clone(),
            packed: self.packed.clone(),
            multi_value: self.multi_value.clone(),
            sources: self.sources.clone(),
            input_names: self.input_names.clone(),
            runnable,
        }
    }

    /// Each task's scores of packed rows, as a server receives them from
    /// EasyRec's clients when `export_config.multi_placeholder` is false:
    /// per row one string, the input fields of `packed.fields` joined by
    /// `packed.separator`. Refused for an export with one input per feature.
    pub fn score_packed(&self, rows: &[&str]) -> anyhow::Result<Vec<TaskScores>> {
        let raw = self.unpack(rows)?;
        self.score(&self.enc.encode(&raw)?)
    }

    /// The input columns of packed rows (see `score_packed`).
    pub fn unpack(&self, rows: &[&str]) -> anyhow::Result<RawBatch> {
        let Some(p) = &self.packed else {
            bail!(
                "{} takes one input per feature (export_config.multi_placeholder is true), not packed rows",
                self.dir.display()
            );
        };
        if let Some((i, _)) = rows.iter().enumerate().find(|(_, r)| r.contains('\n')) {
            bail!("packed row {i} holds a line break");
        }
        let text = rows.join("\n") + "\n";
        let mut chunks = crate::data::csv::CsvChunks::from_text(
            "packed features",
            text,
            &p.separator,
            &p.fields,
            &self.enc.projection,
            rows.len().max(1),
        )?;
        let raw = match chunks.next() {
            Some(r) => r?,
            None => bail!("no packed rows to score"),
        };
        if raw.num_rows != rows.len() {
            bail!(
                "{} packed rows given, {} read: an empty row has no fields",
                rows.len(),
                raw.num_rows
            );
        }
        Ok(raw)
    }

    /// Each task's scores of an encoded batch (in `plan.model.tasks` order):
    /// probabilities (classification) or values (regression), and logits.
    pub fn score(&self, batch: &Batch) -> anyhow::Result<Vec<TaskScores>> {
        // Per task, its logits, its scores and ZILN's values (see
        // `model::exec::onnx`).
        let mut out = self.outputs(batch)?.into_iter();
        self.plan
            .model
            .tasks
            .iter()
            .map(|t| {
                let mut next = || out.next().context("the export has fewer outputs than tasks");
                let mut s = TaskScores {
                    logits: next()?,
                    scores: next()?,
                    values: None,
                    logit_width: t.logit_width(),
                    score_width: t.classes(),
                };
                if t.export_outputs().len() > 2 {
                    s.values = Some(next()?);
                }
                // Sampled items are no examples to score.
                s.truncate(batch.examples());
                Ok(s)
            })
            .collect()
    }

    /// The values of the export's outputs after the tasks' (a match model's
    /// tower embeddings, `[batch, d]` row-major), in the graph's order.
    pub fn embeddings(&self, batch: &Batch) -> anyhow::Result<Vec<Vec<f32>>> {
        let mut all = self.outputs(batch)?;
        let tasks: usize = self.plan.model.tasks.iter().map(|t| t.export_outputs().len()).sum();
        Ok(all.split_off(tasks.min(all.len())))
    }

    /// Every output of the graph on an encoded batch, flat, in order.
    fn outputs(&self, batch: &Batch) -> anyhow::Result<Vec<Vec<f32>>> {
        let inputs: TVec<TValue> = self.graph_inputs(batch)?.into_iter().map(|t| t.into_tvalue()).collect();
        let out = self
            .runnable
            .run(inputs)
            .with_context(|| format!("running {}", self.dir.join(MODEL_FILE).display()))?;
        out.iter()
            .map(|o| Ok(o.to_plain_array_view::<f32>()?.iter().copied().collect()))
            .collect()
    }

    /// The graph's input tensors for an encoded batch, in the graph's input
    /// order (see `input_names`).
    pub fn graph_inputs(&self, batch: &Batch) -> anyhow::Result<Vec<Tensor>> {
        let b = batch.size;
        let mut inputs = Vec::new();
        for s in &self.sources {
            let t = match (s, s.feature_of(batch)) {
                (Source::Ids(_), Encoded::Sparse(j)) => {
                    let ids: Vec<i64> = j.ids.iter().map(|&i| i as i64).collect();
                    Tensor::from_shape(&[ids.len()], &ids)
                }
                (Source::Lens(_), Encoded::Sparse(j)) => {
                    let lens: Vec<i64> = j.offsets.windows(2).map(|w| (w[1] - w[0]) as i64).collect();
                    Tensor::from_shape(&[b], &lens)
                }
                (Source::Weights(_), Encoded::Sparse(Jagged { weights: Some(w), .. })) => {
                    Tensor::from_shape(&[w.len()], w)
                }
                (Source::Positions(_), Encoded::Sparse(Jagged { positions: Some(p), .. })) => {
                    let of_id: Vec<i64> = p.of_id.iter().map(|&x| x as i64).collect();
                    Tensor::from_shape(&[of_id.len()], &of_id)
                }
                (Source::SeqLens(_), Encoded::Sparse(Jagged { positions: Some(p), .. })) => {
                    let lens: Vec<i64> = p.lens.iter().map(|&x| x as i64).collect();
                    Tensor::from_shape(&[b], &lens)
                }
                (Source::Dense(_), Encoded::Dense { dim, values }) => Tensor::from_shape(&[b, *dim], values),
                _ => bail!("the export's graph inputs do not match its pipeline.config features"),
            }?;
            inputs.push(t);
        }
        Ok(inputs)
    }

    /// The graph's input names, in order.
    pub fn input_names(&self) -> &[String] {
        &self.input_names
    }
}

impl Source {
    fn feature_of<'a>(&self, batch: &'a Batch) -> &'a Encoded {
        let (Source::Ids(f)
        | Source::Lens(f)
        | Source::Weights(f)
        | Source::Positions(f)
        | Source::SeqLens(f)
        | Source::Dense(f)) = self;
        &batch.features[*f]
    }
}
