//! Sizes from a config checked against the machine before anything is
//! allocated: a table of `hash_bucket_size` rows, a layer of `hidden_units`
//! or a `batch_size` that cannot fit in memory is refused naming its field,
//! instead of ending in an allocation failure. The walk is over field names,
//! so it covers every model's layers without knowing the models.

use prost_reflect::{DynamicMessage, ReflectMessage, Value};

use super::reflect::{self, join};
use super::ConfigError;

/// One allocation a config asks for: the field that sizes it and its bytes.
#[derive(Debug, Clone, PartialEq)]
struct Claim {
    field: String,
    what: String,
    bytes: u128,
    /// An embedding table, split across ranks when they shard tables.
    table: bool,
    /// Features naming the same `embedding_name` share one table.
    shared: Option<String>,
}

/// Slot vectors the optimizers keep beside each value: per table row (its
/// table's optimizer) and per dense weight (the dense optimizer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Slots {
    pub tables: usize,
    pub dense: usize,
}

/// What a config will allocate, by the field that sizes each part.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Claims(Vec<Claim>);

impl Claims {
    /// The allocations of `cfg`: tables and layer weights with their
    /// optimizer slots (and a dense weight's gradient), and per-batch buffers.
    pub fn of(cfg: &super::proto::EasyRecConfig, slots: Slots) -> Result<Self, ConfigError> {
        let msg = reflect::dynamic(cfg, "protos.EasyRecConfig")?;
        let batch = cfg.data_config.as_ref().map_or(1, |d| d.batch_size()) as u128;
        let columns = cfg.data_config.as_ref().map_or(1, |d| d.input_fields.len().max(1)) as u128;
        let mut claims = vec![Claim {
            field: "data_config.batch_size".into(),
            what: format!("batches of {batch} rows x {columns} input columns"),
            bytes: batch * columns * 8,
            table: false,
            shared: None,
        }];
        // Key-value tables (ev_params) grow with the keys they admit, up to
        // max_capacity: no rows are claimed up front (the start banner
        // gives each one's bound).
        let global_key_value = cfg.model_config.ev_params.is_some();
        reflect::visit(&msg, "", &mut |m, path| {
            claim(m, path, (batch, slots, global_key_value), &mut claims);
            Ok::<(), ConfigError>(())
        })?;
        // One claim per shared table: the largest of its features'.
        let mut seen: Vec<(String, usize)> = Vec::new();
        let mut unique: Vec<Claim> = Vec::new();
        for c in claims {
            match c.shared.as_ref().and_then(|k| seen.iter().find(|(s, _)| s == k)) {
                Some(&(_, at)) => {
                    if c.bytes > unique[at].bytes {
                        unique[at] = c;
                    }
                }
                None => {
                    if let Some(k) = &c.shared {
                        seen.push((k.clone(), unique.len()));
                    }
                    unique.push(c);
                }
            }
        }
        Ok(Claims(unique))
    }

    /// `check` against this machine's physical memory (when it is known).
    pub fn check_here(&self, table_shards: usize) -> Result<(), ConfigError> {
        match physical_memory() {
            Some(limit) => self.check(limit, table_shards),
            None => Ok(()),
        }
    }

    /// Refuses when the claims, with tables split over `table_shards`
    /// ranks, need more than `limit` bytes, naming the field of the largest.
    pub fn check(&self, limit: u64, table_shards: usize) -> Result<(), ConfigError> {
        let bytes = |c: &Claim| {
            if c.table {
                c.bytes / table_shards.max(1) as u128
            } else {
                c.bytes
            }
        };
        let total: u128 = self.0.iter().map(bytes).sum();
        if total <= limit as u128 {
            return Ok(());
        }
        let Some(big) = self.0.iter().max_by_key(|c| bytes(c)) else {
            return Ok(());
        };
        let per_rank = if table_shards > 1 {
            format!(" per rank of {table_shards}")
        } else {
            String::new()
        };
        Err(ConfigError::invalid(
            big.field.clone(),
            format!(
                "the model needs about {}{per_rank}, and this machine has {} of memory; the largest part: \
                 {} need {} (shard tables across ranks with EmbeddingParallelStrategy, or make it smaller)",
                human(total),
                human(limit as u128),
                big.what,
                human(bytes(big)),
            ),
        ))
    }
}

/// Fields that give a layer's width, whichever message holds them.
const WIDTHS: &[&str] = &[
    "num_class",
    "hidden_size",
    "intermediate_size",
    "output_dim",
    "output_size",
    "projection_dim",
    "project_dim",
    "num_output_units",
    "multi_head_size",
    "multi_head_num",
    "num_attention_heads",
    "num_expert",
    "text_head_size",
    "text_cross_head_size",
    "wide_output_dim",
    "units",
    "dims",
];

/// Copies of a batch's sequence values alive in a step (lookup, attention
/// inputs and outputs, their gradients): a bound, not an exact count.
const SEQUENCE_COPIES: u128 = 4;

/// The claims of one message: a table when it has rows, a DNN when it has
/// hidden_units, a layer per width field, a batch of sequences per length.
fn claim(
    msg: &DynamicMessage,
    path: &str,
    (batch, slots, global_key_value): (u128, Slots, bool),
    claims: &mut Vec<Claim>,
) {
    let get = |name: &str| -> Option<u128> {
        let fd = msg.descriptor().get_field_by_name(name)?;
        if !msg.has_field(&fd) {
            return None;
        }
        match &*msg.get_field(&fd) {
            Value::U32(v) => Some(*v as u128),
            Value::U64(v) => Some(*v as u128),
            Value::I32(v) => Some((*v).max(0) as u128),
            Value::I64(v) => Some((*v).max(0) as u128),
            _ => None,
        }
    };
    let at = |name: &str| join(path, name);
    // An embedding table: rows x embedding_dim floats, and as many again
    // per optimizer slot (row gradients are sparse: one batch's rows).
    let with_slots = |n: usize| match n {
        0 => String::new(),
        1 => " with its optimizer slot".to_string(),
        n => format!(" with its {n} optimizer slots"),
    };
    let table_copies = 1 + slots.tables as u128;
    let dim = get("embedding_dim").unwrap_or(1).max(1);
    let shared = msg
        .get_field_by_name("embedding_name")
        .and_then(|v| v.as_str().map(str::to_string))
        .filter(|n| !n.is_empty());
    let key_value = msg
        .descriptor()
        .get_field_by_name("ev_params")
        .is_some_and(|fd| global_key_value || msg.has_field(&fd));
    for rows_field in ["hash_bucket_size", "num_buckets"].into_iter().filter(|_| !key_value) {
        if let Some(rows) = get(rows_field) {
            claims.push(Claim {
                field: at(rows_field),
                what: format!("an embedding table of {rows} rows x {dim}{}", with_slots(slots.tables)),
                bytes: rows * dim * 4 * table_copies,
                table: true,
                shared: shared.clone(),
            });
        }
    }
    // A width a model layer takes from the config (output classes,
    // attention and backbone widths): at least a weight per unit with its
    // gradient and slots, and one batch's activations.
    for width_field in WIDTHS {
        if let Some(u) = get(width_field) {
            claims.push(Claim {
                field: at(width_field),
                what: format!("a layer {u} wide for a batch of {batch}"),
                bytes: u * 4 * (batch + 2 + slots.dense as u128),
                table: false,
                shared: None,
            });
        }
    }
    // A sequence: one batch's `len x embedding_dim` values, kept by the
    // lookup, the attention over it and their gradients.
    for len_field in [
        "max_seq_len",
        "sequence_length",
        "pad_sequence_length",
        "max_position_embeddings",
    ] {
        if let Some(len) = get(len_field) {
            claims.push(Claim {
                field: at(len_field),
                what: format!("sequences of {len} x {dim} values for a batch of {batch}"),
                bytes: len * dim * batch * 4 * SEQUENCE_COPIES,
                table: false,
                shared: None,
            });
        }
    }
    // A DNN: each layer's kernel and its activations for one batch.
    if let Some(fd) = msg.descriptor().get_field_by_name("hidden_units") {
        if let Value::List(units) = &*msg.get_field(&fd) {
            let units: Vec<u128> = units.iter().filter_map(|u| u.as_u32()).map(u128::from).collect();
            for (i, &u) in units.iter().enumerate() {
                let fan_in = if i > 0 { units[i - 1] } else { 1 };
                let field = format!("{}[{i}]", at("hidden_units"));
                claims.push(Claim {
                    field: field.clone(),
                    what: format!(
                        "the weights of a layer of {u} units, their gradient{}",
                        with_slots(slots.dense)
                    ),
                    bytes: u * fan_in * 4 * (2 + slots.dense as u128),
                    table: false,
                    shared: None,
                });
                // Its activations grow with both; the larger factor is named.
                claims.push(Claim {
                    field: if u >= batch {
                        field
                    } else {
                        "data_config.batch_size".into()
                    },
                    what: format!("the activations of {u} units for a batch of {batch}"),
                    bytes: u * batch * 4,
                    table: false,
                    shared: None,
                });
            }
        }
    }
}

fn human(bytes: u128) -> String {
    const GIB: f64 = (1u64 << 30) as f64;
    format!("{:.1} GiB", bytes as f64 / GIB)
}

/// This machine's physical memory in bytes (`MemTotal`), when it can be read.
/// The memory this process may use: the machine's physical memory
/// (`MemTotal`), or less where an address-space limit (`ulimit -v`) says
/// so; `None` when neither can be read.
pub fn physical_memory() -> Option<u64> {
    let total = std::fs::read_to_string("/proc/meminfo").ok().and_then(|text| {
        let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        kib.checked_mul(1024)
    });
    let limit = std::fs::read_to_string("/proc/self/limits").ok().and_then(|text| {
        let line = text.lines().find(|l| l.starts_with("Max address space"))?;
        // "Max address space  <soft>  <hard>  bytes"; soft may be "unlimited".
        line.split_whitespace().nth(3)?.parse::<u64>().ok()
    });
    match (total, limit) {
        (Some(t), Some(l)) => Some(t.min(l)),
        (t, l) => t.or(l),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> super::super::proto::EasyRecConfig {
        let msg = super::super::text_format::parse_text(&super::super::pipeline_descriptor(), text).unwrap();
        msg.transcode_to().unwrap()
    }

    #[test]
    fn names_the_field_of_the_largest_allocation() {
        let cfg = config(
            r#"
            data_config { batch_size: 1024 input_fields { input_name: "a" input_type: STRING } }
            feature_config { features { input_names: "a" feature_type: IdFeature embedding_dim: 16
                                        hash_bucket_size: 4000000000000 } }
            "#,
        );
        let claims = Claims::of(&cfg, Slots::default()).unwrap();
        let err = claims.check(8 << 30, 1).unwrap_err().to_string();
        assert!(
            err.starts_with("feature_config.features[0].hash_bucket_size: "),
            "{err}"
        );
        assert!(err.contains("this machine has 8.0 GiB"), "{err}");
        claims.check(u64::MAX, 1).unwrap();
        // Split over enough ranks, the table fits.
        claims.check(8 << 30, 100_000).unwrap();
    }

    #[test]
    fn features_sharing_an_embedding_claim_one_table() {
        let feature = |name: &str| {
            format!(
                r#"features {{ input_names: "{name}" feature_type: IdFeature embedding_dim: 32 num_buckets: 10000000
                               embedding_name: "shared" }}"#
            )
        };
        let cfg = config(&format!(
            "data_config {{ batch_size: 1 }} feature_config {{ {} {} {} }}",
            feature("a"),
            feature("b"),
            feature("c")
        ));
        let claims = Claims::of(&cfg, Slots::default()).unwrap();
        // 10M x 32 floats is 1.2 GiB once, not three times.
        claims.check(2 << 30, 1).unwrap();
        assert!(claims.check(1 << 30, 1).is_err());
        // Adam keeps two slots per row: the same table needs three times that.
        let adam = Claims::of(&cfg, Slots { tables: 2, dense: 2 }).unwrap();
        let err = adam.check(2 << 30, 1).unwrap_err().to_string();
        assert!(
            err.contains("10000000 rows x 32 with its 2 optimizer slots need 3.6 GiB"),
            "{err}"
        );
        adam.check(4 << 30, 1).unwrap();
    }

    #[test]
    fn a_huge_layer_or_batch_is_named() {
        let cfg = config(
            r#"
            data_config { batch_size: 4096 input_fields { input_name: "a" input_type: STRING } }
            model_config { dlrm { top_dnn { hidden_units: [64, 4000000000] } } }
            "#,
        );
        let err = Claims::of(&cfg, Slots::default())
            .unwrap()
            .check(8 << 30, 1)
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("model_config.dlrm.top_dnn.hidden_units[1]: "), "{err}");
        let cfg =
            config(r#"data_config { batch_size: 4294967295 input_fields { input_name: "a" input_type: STRING } }"#);
        let err = Claims::of(&cfg, Slots::default())
            .unwrap()
            .check(8 << 30, 1)
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("data_config.batch_size: "), "{err}");
    }
}
