//! The exporter train_eval runs (export_config.exporter_type): `final`
//! once at the end into model_dir/export/final, `latest` after every
//! evaluation into model_dir/export/latest, `best` after evaluations that
//! improve best_exporter_metric into model_dir/export/best, copying that
//! checkpoint into model_dir/best_ckpt. Each keeps exports_to_keep exports.

use std::path::{Path, PathBuf};

use anyhow::Context;

use super::{export_checkpoint, list_exports, prune, ExportRequest, EXTERNAL_MIN_BYTES};
use crate::checkpoint;
use crate::config::export_plan::Exporter;
use crate::config::typed::TrainingPlan;

/// Where the best exporter keeps copies of its best checkpoints, in model_dir.
pub const BEST_CKPT_DIR: &str = "best_ckpt";

pub struct TrainExporter {
    plan: TrainingPlan,
    config_text: String,
    /// Best metric value exported so far (read back from the newest best export on resume).
    best: Option<f64>,
}

impl TrainExporter {
    /// `None` for exporter_type "none"; an error, before any training, when
    /// export_config asks for something the exporter cannot write.
    pub fn new(plan: &TrainingPlan, config_text: String) -> anyhow::Result<Option<Self>> {
        if plan.export.exporter == Exporter::None {
            return Ok(None);
        }
        plan.export.check()?;
        Ok(Some(TrainExporter {
            plan: plan.clone(),
            config_text,
            best: None,
        }))
    }

    fn root(&self, kind: &str) -> PathBuf {
        self.plan.model_dir.join("export").join(kind)
    }

    /// Called after the evaluation of checkpoint `ckpt` (`last`: the one at
    /// the end of training, evaluated or not). Returns the new export, if any.
    pub fn after_eval(
        &mut self,
        ckpt: &Path,
        metrics: &[(String, f64)],
        last: bool,
    ) -> anyhow::Result<Option<PathBuf>> {
        let e = &self.plan.export;
        let kind = match e.exporter {
            Exporter::None => return Ok(None),
            Exporter::Final if !last => return Ok(None),
            Exporter::Final => "final",
            Exporter::Latest => "latest",
            Exporter::Best => {
                if metrics.is_empty() {
                    return Ok(None);
                }
                let value = e.best_value(metrics)?;
                if self.best.is_none() {
                    self.best = self.previous_best()?;
                }
                if !e.improves(value, self.best) {
                    return Ok(None);
                }
                self.best = Some(value);
                self.keep_best_checkpoint(ckpt)?;
                "best"
            }
        };
        let root = self.root(kind);
        let dir = export_checkpoint(
            &self.plan,
            ckpt,
            &root,
            &ExportRequest {
                config_text: &self.config_text,
                asset_files: &self.plan.export.asset_files,
                metrics,
                checkpoint: Some(ckpt),
                external_min_bytes: EXTERNAL_MIN_BYTES,
            },
        )?;
        prune(&root, e.exports_to_keep)?;
        Ok(Some(dir))
    }

    fn previous_best(&self) -> anyhow::Result<Option<f64>> {
        let Some(newest) = list_exports(&self.root("best"))?.pop() else {
            return Ok(None);
        };
        let info = super::read_info(&newest)?
            .with_context(|| format!("cannot read {}", newest.join("assets/export_info.json").display()))?;
        Ok(info["metrics"][&self.plan.export.best_metric].as_f64())
    }

    /// Copies checkpoint `ckpt` into model_dir/best_ckpt/, keeping the newest
    /// exports_to_keep there.
    fn keep_best_checkpoint(&self, ckpt: &Path) -> anyhow::Result<()> {
        let root = self.plan.model_dir.join(BEST_CKPT_DIR);
        let name = ckpt.file_name().context("checkpoint path has no name")?;
        let tmp = root.join(format!(".tmp-{}", name.to_string_lossy()));
        let dst = root.join(name);
        std::fs::create_dir_all(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
        for entry in std::fs::read_dir(ckpt).with_context(|| format!("cannot list {}", ckpt.display()))? {
            let entry = entry.with_context(|| format!("cannot list {}", ckpt.display()))?;
            std::fs::copy(entry.path(), tmp.join(entry.file_name()))
                .with_context(|| format!("cannot copy {}", entry.path().display()))?;
        }
        // Replaced and pruned copies leave the listing before they are
        // deleted, as in model_dir (`checkpoint::remove`).
        if dst.exists() {
            let step = checkpoint::step_of(&dst).context("a checkpoint's name holds its step")?;
            checkpoint::remove(&root, step).with_context(|| format!("cannot replace {}", dst.display()))?;
        }
        std::fs::rename(&tmp, &dst).with_context(|| format!("cannot rename {} to {}", tmp.display(), dst.display()))?;
        let kept = checkpoint::list(&root)?;
        for step in &kept[..kept.len().saturating_sub(self.plan.export.exports_to_keep)] {
            checkpoint::remove(&root, *step)
                .with_context(|| format!("cannot remove {}", root.join(checkpoint::ckpt_name(*step)).display()))?;
        }
        Ok(())
    }
}
