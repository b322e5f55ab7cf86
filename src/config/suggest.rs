//! Did-you-mean suggestions and the names of EasyRec options that exist in
//! EasyRec's schema but not in ours, so users get "not supported" rather
//! than "unknown field" for them.

/// EasyRec fields this trainer's schema leaves out on purpose.
const EASYREC_ONLY_FIELDS: &[&str] = &[
    // model_config oneof members for models not implemented here
    "cmbf",
    "uniter",
    "multi_tower_recall",
    "dssm",
    "mind",
    "dropoutnet",
    "metric_learning",
    "pdn",
    "dssm_senet",
    "dat",
    "esmm",
    "dbmtl",
    "simple_multi_task",
    "ple",
    "rocket_launching",
    "variational_dropout",
    // backbone layers needing TensorFlow-specific parameters
    "st_params",
    "din",
    "bst",
    "seq_aug",
];

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
    if EASYREC_ONLY_FIELDS.contains(&name) {
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
    fn suggestion_only_when_close() {
        let c = vec!["num_steps".to_string(), "sync_replicas".to_string()];
        assert_eq!(did_you_mean("num_step", &c), "; did you mean `num_steps`?");
        assert_eq!(did_you_mean("completely_else", &c), "");
        assert_eq!(did_you_mean("sync", &c), "; did you mean `sync_replicas`?");
    }
}
