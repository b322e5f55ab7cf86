//! `assets/feature_spec.json`: how a serving system turns raw columns into
//! the graph's inputs, feature by feature, without reading our code.

use serde_json::{json, Value};

use crate::config::data_plan::DataPlan;
use crate::config::feature_plan::{Bucketing, FeatureKind};
use crate::config::typed::TrainingPlan;
use crate::model::exec::onnx::{FeatureInput, InputKind};

/// The id hash, as TensorFlow's string_to_hash_bucket_fast computes it.
pub const HASH_NAME: &str = "farmhash_fingerprint64";
const HASH: &str = "FarmHash Fingerprint64 of the UTF-8 text (integers as their decimal text), as TensorFlow's \
                    string_to_hash_bucket_fast; id = hash % buckets";
/// The feature spec's format. Version 1 hashed ids with FNV-1a and
/// splitmix64; version 2 encoded vocabulary misses, raw features with
/// embedding_dim and tag weights otherwise than EasyRec. Exports of either
/// are refused (their graphs expect other inputs and ids).
pub const FORMAT: &str = "rustrec-feature-spec-3";

/// The input fields a packed serving row holds, in `input_fields` order:
/// those the features read and GAUC's uid fields, as EasyRec's single
/// `features` placeholder takes them (labels left out); with
/// `filter_inputs: false` every field but the labels.
pub fn packed_fields(plan: &TrainingPlan) -> Vec<String> {
    let uid_fields: Vec<&str> = plan.model.gauc_uid_fields().collect();
    let read = |name: &str| {
        if plan.export.filter_inputs {
            plan.features.iter().any(|f| f.inputs.iter().any(|i| i == name)) || uid_fields.contains(&name)
        } else {
            !plan.data.label_fields.iter().any(|l| l == name)
        }
    };
    plan.data
        .fields
        .iter()
        .map(|f| f.name.as_str())
        .filter(|name| read(name))
        .map(str::to_string)
        .collect()
}

/// The separator of a packed serving row: the CSV separator the model was
/// trained on ("," for Parquet input, EasyRec's default).
fn packed_separator(data: &DataPlan) -> String {
    data.format.field_separator().to_string()
}

/// How a serving request carries a row: one input per feature (the graph's
/// inputs after the transforms below), or with `multi_placeholder: false`
/// one `features` string per row that a server splits into fields first.
fn serving_input(plan: &TrainingPlan) -> Value {
    if plan.export.packed_input {
        json!({
            "kind": "packed",
            "placeholder": "features",
            "separator": packed_separator(&plan.data),
            "fields": packed_fields(plan),
            "note": "one string per row: these input fields' values joined by the separator, as in the \
                     training data; then each feature's transform as below",
        })
    } else {
        let mut v = if plan.export.filter_inputs {
            json!({ "kind": "per_feature" })
        } else {
            json!({
                "kind": "per_feature",
                "note": "filter_inputs: false: a request may carry every input field but the labels; the model reads \
                         the features' columns below and ignores the others",
            })
        };
        let multi: Vec<Value> = plan
            .multi_value_inputs()
            .expect("checked when the plan was made")
            .into_iter()
            .map(|(field, sep)| json!({ "field": field, "joined_by": sep }))
            .collect();
        if !multi.is_empty() {
            v["multi_value_inputs"] = json!(multi);
            v["multi_value_note"] = json!(
                "each of these inputs may be a list of values per row (multi_value_fields), joined by its separator \
                 into the text its feature reads"
            );
        }
        v
    }
}

fn buckets(b: &Bucketing) -> Value {
    match b {
        Bucketing::Hash(n) => json!({ "type": "hash", "buckets": n, "hash": HASH }),
        Bucketing::Identity(n) => json!({ "type": "identity", "num_buckets": n }),
        Bucketing::Vocab(v) => json!({ "type": "vocab", "vocab": v, "oov_id": 0 }),
        Bucketing::Boundaries(b) => {
            json!({ "type": "boundaries", "boundaries": b, "id": "how many boundaries are <= the value" })
        }
        Bucketing::Scaled { min, max, buckets } => json!({
            "type": "scaled_boundaries",
            "min": min,
            "max": max,
            "buckets": buckets,
            "id": "v = float32((x - min) / (max - min)); id = how many of float32(k / buckets), k in 0..buckets, are <= v",
        }),
        Bucketing::RawPositions { dim } => json!({
            "type": "raw_positions",
            "raw_input_dim": dim,
            "ids": "every row has max_len positions; each value x > 0 at position t is id (t if t < raw_input_dim \
                    else 0) with weight x (x / the position's sum of positive values for a mean combiner)",
        }),
        Bucketing::VocabFile(p) => json!({
            "type": "vocab_file",
            "vocab_file": p.file_name().map(|n| n.to_string_lossy().to_string()),
            "note": "one value per non-empty line, trimmed; id = line index, unknown values get id 0",
        }),
    }
}

/// How the graph finds a key-value feature's rows (`onnx::KeyLayout`), so
/// another runtime can do the same lookup.
fn key_value(feature: usize, kv: &crate::config::feature_plan::KeyValueSpec, model: &crate::model::Model) -> Value {
    let tables: Vec<&String> = model
        .groups
        .iter()
        .flat_map(|g| {
            let plain = g.parts.iter().filter_map(|p| p.table.map(|t| (p.feature, t)));
            let seq = g
                .seq_parts
                .iter()
                .filter_map(|p| p.kind.table().map(|t| (p.feature, t)));
            plain.chain(seq).collect::<Vec<_>>()
        })
        .filter(|(fi, _)| *fi == feature)
        .map(|(_, t)| &model.table_variables[t])
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    json!({
        "tables": tables,
        "filter_freq": kv.filter_freq,
        "steps_to_live": kv.steps_to_live,
        "max_capacity": kv.max_capacity,
        "lookup": "the ids are keys: in each table `<var>` (rows ascending by key, then a default row of zeros), \
                   key k's row is `<var>/slot_rows[s]` for the slot s of `k mod M` and `(k div M) mod M` whose \
                   `<var>/slot_keys[s]` is k (M slots); a key in neither gets the default row, the table's last",
    })
}

pub fn feature_spec(plan: &TrainingPlan, model: &crate::model::Model, inputs: &[FeatureInput]) -> Value {
    let features: Vec<Value> = inputs
        .iter()
        .map(|fi| {
            let f = &plan.features[fi.feature];
            let mut v = json!({ "name": f.name, "columns": f.inputs });
            let (graph_inputs, transform) = match (&fi.kind, &f.kind) {
                (InputKind::Dense { .. }, FeatureKind::Raw { expr: Some(e), .. }) => (
                    vec![f.name.clone()],
                    json!({
                        "type": "expression",
                        "expression": e.text,
                        "value": "EasyRec's ExprFeature: the columns read as float64; + - * / with their usual precedence; \
                                  > >= < <= == (1 or 0), & and | (1 where both / either is not 0) from left to right; \
                                  parentheses group",
                    }),
                ),
                (
                    InputKind::Dense { dim },
                    FeatureKind::Raw {
                        min_max, separator, ..
                    },
                ) => (
                    vec![f.name.clone()],
                    json!({
                        "type": "raw",
                        "dim": dim,
                        "separator": separator,
                        "min_max": min_max.map(|(lo, hi)| json!({ "min": lo, "max": hi, "value": "(x - min) / (max - min)" })),
                    }),
                ),
                (InputKind::Ids { weighted, .. }, kind) => {
                    let mut names = vec![format!("{}/ids", f.name), format!("{}/lens", f.name)];
                    if *weighted {
                        names.push(format!("{}/weights", f.name));
                    }
                    if f.positioned_ids() {
                        names.push(format!("{}/positions", f.name));
                        names.push(format!("{}/seq_lens", f.name));
                    }
                    let t = match kind {
                        FeatureKind::Raw {
                            dim,
                            min_max,
                            separator,
                            ..
                        } if f.projected() => json!({
                            "type": "raw_projection",
                            "dim": dim,
                            "separator": separator,
                            "min_max": min_max.map(|(lo, hi)| json!({ "min": lo, "max": hi, "value": "(x - min) / (max - min)" })),
                            "ids": "the k-th value weights row k of the table, whatever its sign (a mean combiner leaves out weights not above 0)",
                        }),
                        FeatureKind::Raw {
                            boundaries, min_max, ..
                        } => json!({
                            "type": "boundaries",
                            "boundaries": boundaries,
                            "min_max": min_max,
                            "id": "number of boundaries <= value, in float32; the value first scaled to \
                                   (value - min) / (max - min) when min_max is set and max > min",
                        }),
                        FeatureKind::Id { buckets: b } => buckets(b),
                        FeatureKind::Tag {
                            buckets: b,
                            separator,
                            kv_separator,
                        } => json!({
                            "type": "tags",
                            "separator": separator,
                            "kv_separator": kv_separator,
                            "weights_column": f.inputs.get(1),
                            "weights": "each tag weights its row, whatever the sign; a mean combiner leaves out tags whose weight is not above 0",
                            "each": buckets(b),
                        }),
                        FeatureKind::Sequence {
                            buckets: b,
                            separator,
                            max_len,
                            multi: Some(m),
                            ..
                        } => json!({
                            "type": "sequence",
                            "separator": separator,
                            "max_len": max_len,
                            "value_separator": m.separator,
                            "ids": "per position of the row (split by separator, the first max_len kept; an empty \
                                    one keeps its place), its non-empty values split by value_separator, each \
                                    bucketed; positions: each id's position; seq_lens: up to the last position \
                                    holding a value",
                            "weights": "1 / the position's value count, for a mean combiner",
                            "each": buckets(b),
                        }),
                        FeatureKind::Sequence {
                            buckets: b,
                            separator,
                            max_len,
                            ..
                        } => json!({
                            "type": "sequence",
                            "separator": separator,
                            "max_len": max_len,
                            "ids": "the row's values in order, the first max_len kept; lens at most max_len; with \
                                    hashed or listed ids an empty part keeps its place as the id of \"\" and an \
                                    empty text is one such part (EasyRec's tf.strings.split)",
                            "each": buckets(b),
                        }),
                        FeatureKind::Lookup {
                            buckets: n,
                            separator,
                            kv_separator,
                            max_selected,
                        } => json!({
                            "type": "lookup",
                            "key_column": f.inputs.first(),
                            "map_column": f.inputs.get(1),
                            "separator": separator,
                            "kv_separator": kv_separator,
                            "max_selected": max_selected,
                            "ids": "per map entry `key<kv_separator>value` whose key is the row's key: \
                                    Fingerprint64(value) % buckets",
                            "buckets": n,
                        }),
                        FeatureKind::Combo {
                            buckets: n,
                            join_sep,
                            input_seps,
                        } => json!({
                            "type": "combo",
                            "input_separators": input_seps,
                            "join_separator": join_sep,
                            "buckets": n,
                            "cross": if join_sep.is_empty() {
                                "per element of the cartesian product of the columns' values: h = 0xDECAFCAFFE, \
                                 then h = FingerprintCat64(h, Fingerprint64(value)) per column; id = h % buckets \
                                 (TensorFlow's SparseCrossHashed)"
                            } else {
                                "per element of the cartesian product: the values joined by join_separator; \
                                 id = Fingerprint64(text) % buckets"
                            },
                        }),
                    };
                    (names, t)
                }
                (InputKind::Dense { .. }, _) => unreachable!("only raw features enter as dense inputs"),
            };
            v["graph_inputs"] = json!(graph_inputs);
            v["transform"] = transform;
            v["combiner"] = json!(if f.mean_combiner { "mean" } else { "sum" });
            if let Some(kv) = &f.key_value {
                v["key_value"] = key_value(fi.feature, kv, model);
            }
            v
        })
        .collect();
    json!({
        "format": FORMAT,
        "id_hash": HASH_NAME,
        "model_class": format!("{:?}", plan.model.kind),
        "outputs": plan
            .model.tasks
            .iter()
            .flat_map(|t| t.export_outputs())
            .chain(model.embedding_outputs().into_iter().map(|(n, _)| n.to_string()))
            .collect::<Vec<_>>(),
        "ids_layout": "per feature: `<name>/ids` int64 holds every row's ids back to back, `<name>/lens` int64 [batch] how many belong to each row",
        "empty_values": "an input a row leaves out, null or an empty string is its field's default_val, as EasyRec \
                         fills it; a text still empty then gives an id feature no id (lens 0: the row pools nothing, \
                         zeros) and is never hashed; empty parts of a tag split by its separator are dropped, those \
                         of a sequence of hashed or listed ids are the id of \"\" (see its `ids`); an empty number \
                         is 0 when its field has no default_val",
        "features": features,
        "serving_input": serving_input(plan),
    })
}
