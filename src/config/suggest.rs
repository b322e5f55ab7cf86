//! Did-you-mean suggestions and the names of EasyRec options that exist in
//! EasyRec's schema but not in ours, so users get "not supported" rather
//! than "unknown field" for them.

/// Fields of EasyRec's schema that ours leaves out, by message (EasyRec's
/// protos at the commit its model-zoo configs come from, compared message by
/// message). A message EasyRec has and we do not is only reached through one
/// of these fields, so every field of EasyRec's schema is either ours or
/// named here as not supported: no EasyRec config meets "unknown field".
const EASYREC_ONLY_FIELDS: &[(&str, &[&str])] = &[
    ("protos.EasyRecModel", &["metric_learning", "multi_tower_recall", "pdn"]),
    (
        "protos.TaskTower",
        &["task_space_indicator_name", "task_space_indicator_value"],
    ),
    (
        "protos.BayesTaskTower",
        &["task_space_indicator_name", "task_space_indicator_value"],
    ),
    (
        "protos.KerasLayer",
        &[
            "attention",
            "dot_product",
            "gate",
            "multi_head_attention",
            "overlap",
            "text_encoder",
            "transformer",
        ],
    ),
    (
        "protos.Loss",
        &["listwise_distill_loss", "listwise_rank_loss", "pairwise_hinge_loss"],
    ),
    (
        "protos.KD",
        &[
            "binary_focal_loss",
            "circle_loss",
            "f1_reweighted_loss",
            "jrc_loss",
            "listwise_distill_loss",
            "listwise_rank_loss",
            "multi_simi_loss",
            "pairwise_focal_loss",
            "pairwise_hinge_loss",
            "pairwise_logistic_loss",
            "pairwise_loss",
            "softmax_loss",
        ],
    ),
    ("protos.PairwiseLogisticLoss", &["use_label_margin"]),
];

/// Enum values of EasyRec's schema that ours leaves out, by enum.
const EASYREC_ONLY_ENUM_VALUES: &[(&str, &[&str])] = &[("protos.Similarity", &["EUCLID"])];

fn easyrec_only(table: &[(&str, &[&str])], owner: &str, name: &str) -> bool {
    table.iter().any(|(o, names)| *o == owner && names.contains(&name))
}

/// The error text for an enum value that EasyRec's enum has and ours does
/// not, or None for a value EasyRec does not know either.
pub fn easyrec_only_enum_value(value: &str, field: &str, enum_type: &str) -> Option<String> {
    easyrec_only(EASYREC_ONLY_ENUM_VALUES, enum_type, value).then(|| {
        format!("`{field}: {value}` is an EasyRec option (enum {enum_type}) that is not supported by this trainer")
    })
}

/// Edit distance between two short names.
pub fn levenshtein(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

/// `"; did you mean `x`?"` for the closest candidate, or "" when none is close.
pub fn did_you_mean(name: &str, candidates: &[String]) -> String {
    let lower = name.to_ascii_lowercase();
    if lower.len() >= 3 {
        if let Some(c) = candidates.iter().find(|c| c.to_ascii_lowercase().starts_with(&lower)) {
            return format!("; did you mean `{c}`?");
        }
    }
    let best = candidates
        .iter()
        .map(|c| (levenshtein(&lower, &c.to_ascii_lowercase()), c))
        .min_by_key(|(d, _)| *d);
    match best {
        Some((d, c)) if d <= (name.len() / 3).max(2) => format!("; did you mean `{c}`?"),
        _ => String::new(),
    }
}

/// The error text for a field name that the message type does not have.
pub fn unknown_field_message(name: &str, path: &[String], message_type: &str, candidates: &[String]) -> String {
    let full = if path.is_empty() {
        name.to_string()
    } else {
        format!("{}.{name}", path.join("."))
    };
    if easyrec_only(EASYREC_ONLY_FIELDS, message_type, name) {
        return format!("`{full}` is an EasyRec option that is not supported by this trainer");
    }
    let place = if path.is_empty() {
        "the pipeline config".to_string()
    } else {
        format!("`{}`", path.join("."))
    };
    format!(
        "unknown field `{name}` in {place} (message {message_type}){}",
        did_you_mean(name, candidates)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distance() {
        assert_eq!(levenshtein("num_step", "num_steps"), 1);
        assert_eq!(levenshtein("", "abc"), 3);
        assert_eq!(levenshtein("kitten", "sitting"), 3);
    }

    #[test]
    fn easyrec_options_are_named_by_their_message() {
        let path = vec![
            "model_config".to_string(),
            "backbone".into(),
            "blocks".into(),
            "keras_layer".into(),
        ];
        let m = unknown_field_message("transformer", &path, "protos.KerasLayer", &[]);
        assert_eq!(
            m,
            "`model_config.backbone.blocks.keras_layer.transformer` is an EasyRec option that is not supported by this trainer"
        );
        // The same name in another message is not EasyRec's.
        let m = unknown_field_message("transformer", &["train_config".to_string()], "protos.TrainConfig", &[]);
        assert!(m.starts_with("unknown field `transformer`"), "{m}");
        assert!(easyrec_only_enum_value("EUCLID", "simi_func", "protos.Similarity").is_some());
        assert!(easyrec_only_enum_value("EUCLIDEAN", "simi_func", "protos.Similarity").is_none());
    }

    /// Every field and enum value named as EasyRec's alone is missing from
    /// our schema (a stale entry would hide a field we accept).
    #[test]
    fn easyrec_only_names_are_not_in_our_schema() {
        let pool = crate::config::schema();
        let mut stale = Vec::new();
        for (owner, names) in EASYREC_ONLY_FIELDS {
            let m = pool
                .get_message_by_name(owner)
                .unwrap_or_else(|| panic!("no message {owner}"));
            stale.extend(
                names
                    .iter()
                    .filter(|n| m.get_field_by_name(n).is_some())
                    .map(|n| format!("{owner}.{n}")),
            );
        }
        for (owner, values) in EASYREC_ONLY_ENUM_VALUES {
            let e = pool
                .get_enum_by_name(owner)
                .unwrap_or_else(|| panic!("no enum {owner}"));
            stale.extend(
                values
                    .iter()
                    .filter(|v| e.get_value_by_name(v).is_some())
                    .map(|v| format!("{owner}.{v}")),
            );
        }
        assert!(stale.is_empty(), "in our schema now: {stale:?}");
    }

    #[test]
    fn suggestion_only_when_close() {
        let c = vec!["num_steps".to_string(), "sync_replicas".to_string()];
        assert_eq!(did_you_mean("num_step", &c), "; did you mean `num_steps`?");
        assert_eq!(did_you_mean("completely_else", &c), "");
        assert_eq!(did_you_mean("sync", &c), "; did you mean `sync_replicas`?");
    }
}
