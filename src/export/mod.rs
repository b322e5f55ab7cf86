//! Export for serving: the model as ONNX (`model::exec::onnx`) with the assets a
//! serving system needs (`spec`), the exporters train_eval runs
//! (`exporter`), and loading an export back to score data (`runtime`).
//!
//! An export is `<export_dir>/<unix seconds>/` holding `model.onnx`,
//! `model.onnx.data` (external data of large tables) and `assets/` with
//! `pipeline.config`, `feature_spec.json`, `export_info.json` and any
//! asset_files. It is written under a hidden name and renamed into place.

pub mod exporter;
mod onnx_bounds;
pub mod runtime;
pub mod spec;
pub mod updates;

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde_json::json;

use crate::config::typed::TrainingPlan;
use crate::inference::Bundle;
use crate::model::exec::onnx::{self as graph, proto as onnx};

pub const MODEL_FILE: &str = "model.onnx";
pub const DATA_FILE: &str = "model.onnx.data";
/// Initializers of at least this many bytes go to the external data file.
pub const EXTERNAL_MIN_BYTES: usize = 1 << 20;

/// What goes into an export besides the model.
pub struct ExportRequest<'a> {
    /// The effective pipeline config, saved as assets/pipeline.config.
    pub config_text: &'a str,
    pub asset_files: &'a [String],
    /// Evaluation metrics of the exported checkpoint, when known.
    pub metrics: &'a [(String, f64)],
    pub checkpoint: Option<&'a Path>,
    pub external_min_bytes: usize,
}

/// Exports a model (an inference bundle: plan, graph, parameters, whole
/// tables) into a new `<root>/<timestamp>/`; returns that directory.
pub fn export_bundle(t: &Bundle, root: &Path, req: &ExportRequest) -> anyhow::Result<PathBuf> {
    t.plan.export.check()?;
    // The output rule: an export never goes into a checkpoint (nor over a
    // file that is not a directory).
    crate::output::check(&root.join("export"), &[])?;
    if std::fs::metadata(root).is_ok_and(|m| !m.is_dir()) {
        return Err(crate::output::OutputError::NotDirectory {
            path: root.to_path_buf(),
        }
        .into());
    }
    let tables = t.tables();
    let batch = match t.plan.export.batch_size {
        Some(b) => onnx::Dim::Fixed(b),
        None => onnx::Dim::Named("batch".into()),
    };
    let (graph, inputs) = graph::build((&t.plan.features, &t.plan.model.tasks), &t.model, &tables, batch);
    std::fs::create_dir_all(root).with_context(|| format!("cannot create export dir {}", root.display()))?;
    let mut ts = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    while root.join(ts.to_string()).exists() {
        ts += 1;
    }
    let tmp = root.join(format!(".tmp-{ts}-{}", std::process::id()));
    let final_dir = root.join(ts.to_string());
    let result = (|| -> anyhow::Result<()> {
        let assets = tmp.join("assets");
        std::fs::create_dir_all(&assets).with_context(|| format!("cannot create {}", assets.display()))?;
        let files = graph.write(&tmp, DATA_FILE, req.external_min_bytes)?;
        let write = |name: &str, text: String| -> anyhow::Result<()> {
            let p = assets.join(name);
            std::fs::write(&p, text).with_context(|| format!("cannot write {}", p.display()))
        };
        write("pipeline.config", req.config_text.to_string())?;
        write(
            "feature_spec.json",
            serde_json::to_string_pretty(&spec::feature_spec(&t.plan, &t.model, &inputs))?,
        )?;
        let metrics: serde_json::Map<String, serde_json::Value> =
            req.metrics.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
        write(
            "export_info.json",
            serde_json::to_string_pretty(&json!({
                "global_step": t.step,
                "checkpoint": req.checkpoint.map(|c| c.display().to_string()),
                "metrics": metrics,
                "files": files_record(&files),
                "incremental_updates": incremental_updates(&t.plan),
            }))?,
        )?;
        for f in req.asset_files {
            let src = Path::new(f);
            let name = src
                .file_name()
                .with_context(|| format!("asset file `{f}` has no file name"))?;
            std::fs::copy(src, assets.join(name)).with_context(|| format!("cannot copy asset file {f}"))?;
        }
        std::fs::rename(&tmp, &final_dir)
            .with_context(|| format!("cannot rename {} to {}", tmp.display(), final_dir.display()))?;
        Ok(())
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    Ok(final_dir)
}

/// Where the job's incremental updates go (`train::incr`), when it writes
/// them: a consumer keeps this export current with the updates after its
/// global step.
fn incremental_updates(plan: &TrainingPlan) -> serde_json::Value {
    // A remote model_dir's updates are there, not in the job's copy.
    let model_dir = plan.published_model_dir();
    match &plan.train.incr_save {
        None => serde_json::Value::Null,
        Some(incr) => {
            let mut v = json!({
                "format": "EasyRec's: dense_update_<step> and sparse_update_<step>, each complete once its .done flag exists \
                           (in Kafka: all its parts, messages keyed by its name)",
                "dense_variables": crate::storage::join(model_dir, "DENSE_UPDATE_VARIABLES").display().to_string(),
                "sparse_variables": crate::storage::join(model_dir, "SPARSE_UPDATE_VARIABLES").display().to_string(),
            });
            if let Some(d) = &incr.dir {
                v["dir"] = json!(d.resolve(model_dir).display().to_string());
            }
            if let Some(k) = &incr.kafka {
                v["kafka"] = json!({
                    "servers": k.servers.join(","),
                    "topic": k.topic,
                    "offset": k.consumer_offset,
                    "properties": k.consumer_props,
                });
            }
            v
        }
    }
}

/// `export_info.json`'s record of the model's files: name -> size and CRC-32C.
fn files_record(files: &[onnx::WrittenFile]) -> serde_json::Value {
    files
        .iter()
        .map(|f| {
            (
                f.name.clone(),
                json!({"bytes": f.bytes, "crc32c": format!("{:08x}", f.crc32c)}),
            )
        })
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// The export in `dir`'s `assets/export_info.json` (read within the bound
/// of a config), or `None` for an export written before it existed.
pub fn read_info(dir: &Path) -> anyhow::Result<Option<serde_json::Value>> {
    let path = dir.join("assets/export_info.json");
    if !path.exists() {
        return Ok(None);
    }
    let text = crate::bounded::read_text(&path, crate::bounded::CONFIG_BYTES)?;
    let info = serde_json::from_str(&text).with_context(|| format!("{} is not valid JSON", path.display()))?;
    Ok(Some(info))
}

/// Checks the model's files of the export in `dir` against the sizes and
/// CRC-32C its `export_info.json` records (exports written before the record
/// existed carry none and are taken as they are).
pub fn verify_files(dir: &Path) -> anyhow::Result<()> {
    let info_path = dir.join("assets/export_info.json");
    let Some(info) = read_info(dir)? else {
        return Ok(());
    };
    let Some(files) = info.get("files").and_then(|f| f.as_object()) else {
        return Ok(());
    };
    for (name, want) in files {
        let path = dir.join(name);
        let (Some(bytes), Some(crc)) = (want["bytes"].as_u64(), want["crc32c"].as_str()) else {
            anyhow::bail!(
                "{}: the record of `{name}` lacks its bytes or crc32c",
                info_path.display()
            );
        };
        let data = std::fs::read(&path)
            .with_context(|| format!("{} is missing or unreadable: not a complete export", path.display()))?;
        let got = format!("{:08x}", crc32c::crc32c(&data));
        if data.len() as u64 != bytes || got != crc {
            anyhow::bail!(
                "{} is damaged: {} bytes with CRC-32C {got}, but the export wrote {bytes} bytes with CRC-32C {crc}; \
                 export the checkpoint again",
                path.display(),
                data.len()
            );
        }
    }
    Ok(())
}

/// Restores the weights of `checkpoint` (tables saved at any world size
/// come back whole) and exports them.
pub fn export_checkpoint(
    plan: &TrainingPlan,
    checkpoint: &Path,
    root: &Path,
    req: &ExportRequest,
) -> anyhow::Result<PathBuf> {
    let t = Bundle::restore(plan.clone(), checkpoint)?;
    export_bundle(
        &t,
        root,
        &ExportRequest {
            checkpoint: Some(checkpoint),
            ..*req
        },
    )
}

/// The exports under `root` (`<timestamp>/` directories), oldest first.
pub fn list_exports(root: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let Ok(rd) = std::fs::read_dir(root) else {
        return Ok(Vec::new());
    };
    let mut found: Vec<(u64, PathBuf)> = Vec::new();
    for e in rd {
        let e = e.with_context(|| format!("cannot list {}", root.display()))?;
        if let Some(ts) = e.file_name().to_str().and_then(|n| n.parse::<u64>().ok()) {
            if e.path().is_dir() {
                found.push((ts, e.path()));
            }
        }
    }
    found.sort();
    Ok(found.into_iter().map(|(_, p)| p).collect())
}

/// Removes the oldest exports under `root` beyond the newest `keep`.
pub fn prune(root: &Path, keep: usize) -> anyhow::Result<()> {
    let all = list_exports(root)?;
    for old in &all[..all.len().saturating_sub(keep)] {
        std::fs::remove_dir_all(old).with_context(|| format!("cannot remove old export {}", old.display()))?;
    }
    Ok(())
}
