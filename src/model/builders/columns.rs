//! What an architecture asks of its groups' layout: the width of its wide
//! side, whether embedded features lead, and which groups keep EasyRec's
//! column order by name. `layout` reads these; the builders rely on them.

use crate::config::model::Arch;

/// The width of the wide side's embeddings, for the architectures that
/// have a wide side.
pub fn wide_dim(arch: &Arch) -> Option<usize> {
    match arch {
        Arch::WideAndDeep { wide_output_dim, .. } | Arch::DeepFm { wide_output_dim, .. } => Some(*wide_output_dim),
        Arch::Fm => Some(1),
        Arch::Backbone(b) | Arch::MultiTaskBackbone { backbone: b, .. } | Arch::MatchBackbone { backbone: b, .. } => {
            b.wide_output_dim
        }
        _ => None,
    }
}

/// Whether the architecture reads the embedded features of every group as
/// one leading block (DeepFM's FM part), so groups put them first.
pub fn embedded_first(arch: &Arch) -> bool {
    matches!(arch, Arch::DeepFm { .. } | Arch::Fm)
}

/// Whether `arch` reads its group `name` as EasyRec's input-layer tensor,
/// whose columns TensorFlow orders by feature-column name
/// (`FeatureSpec::easyrec_column`). Wide groups, WideAndDeep's deep side
/// and DLRM's sparse group read EasyRec's per-feature list instead, in
/// `feature_names` order.
pub fn columns_by_name(arch: &Arch, name: &str, wide: bool) -> bool {
    match arch {
        _ if wide => false,
        Arch::WideAndDeep { .. } => false,
        Arch::Dlrm { .. } => name != "sparse",
        _ => true,
    }
}
