//! Which EasyRec model class a config names.

use crate::config::ConfigError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelKind {
    WideAndDeep,
    Dlrm,
    DeepFm,
    Fm,
    AutoInt,
    Dcn,
    MultiTower,
    /// MultiTower with DIN towers over `seq_att_groups`.
    MultiTowerDin,
    /// MultiTower with BST towers over `seq_att_groups`.
    MultiTowerBst,
    Mmoe,
    Dbmtl,
    /// A tower per task over the `all` group.
    SimpleMultiTask,
    Esmm,
    /// Progressive layered extraction.
    Ple,
    /// A `backbone` DAG with EasyRec's rank head.
    RankModel,
    /// A `backbone` DAG with task towers.
    MultiTaskModel,
    /// Two-tower retrieval.
    Dssm,
    /// Multi-interest retrieval: capsules over a behaviour sequence.
    Mind,
    /// Two-tower retrieval robust to missing preference features.
    DropoutNet,
    /// A `backbone` DAG whose two outputs are a match model's towers.
    MatchModel,
    /// A light network hinted by a booster.
    RocketLaunching,
    /// CMBF or Uniter: a multi-modal tower with EasyRec's rank head.
    Multimodal,
}

impl ModelKind {
    /// Whether the model ends in one output layer as wide as
    /// `model_config.num_class`, as EasyRec's single-task rank models do.
    pub fn has_class_head(self) -> bool {
        use ModelKind::*;
        matches!(
            self,
            WideAndDeep
                | Dlrm
                | DeepFm
                | AutoInt
                | Dcn
                | MultiTower
                | MultiTowerDin
                | MultiTowerBst
                | RankModel
                | Multimodal
        )
    }

    /// `model_config.model_class`.
    pub fn from_class(class: &str) -> Result<Self, ConfigError> {
        Ok(match class {
            "WideAndDeep" => ModelKind::WideAndDeep,
            "DLRM" => ModelKind::Dlrm,
            "DeepFM" => ModelKind::DeepFm,
            "FM" => ModelKind::Fm,
            "AutoInt" => ModelKind::AutoInt,
            "DCN" => ModelKind::Dcn,
            "MultiTower" => ModelKind::MultiTower,
            "MultiTowerDIN" => ModelKind::MultiTowerDin,
            "MultiTowerBST" => ModelKind::MultiTowerBst,
            "MMoE" => ModelKind::Mmoe,
            "ESMM" => ModelKind::Esmm,
            "DBMTL" => ModelKind::Dbmtl,
            "SimpleMultiTask" => ModelKind::SimpleMultiTask,
            "PLE" => ModelKind::Ple,
            "RankModel" => ModelKind::RankModel,
            "MultiTaskModel" => ModelKind::MultiTaskModel,
            // DSSM_SENet is DSSM with a SENet in each tower; DAT is DSSM
            // with augmented vectors.
            "DSSM" | "DSSM_SENet" | "DAT" => ModelKind::Dssm,
            "MIND" => ModelKind::Mind,
            "DropoutNet" => ModelKind::DropoutNet,
            "MatchModel" => ModelKind::MatchModel,
            "RocketLaunching" => ModelKind::RocketLaunching,
            "CMBF" | "Uniter" => ModelKind::Multimodal,
            other => {
                return Err(ConfigError::Unsupported {
                    path: "model_config.model_class".into(),
                    what: format!("model class `{other}`"),
                    hint: " (supported: WideAndDeep, DLRM, DeepFM, FM, AutoInt, DCN, MultiTower, MultiTowerDIN, MultiTowerBST, MMoE, ESMM, DBMTL, SimpleMultiTask, PLE, RankModel, MultiTaskModel, MatchModel, DSSM, DSSM_SENet, DAT, MIND, DropoutNet, RocketLaunching, CMBF, Uniter)".into(),
                })
            }
        })
    }
}
