//! `train_config.freeze_gradient`: variables left out of training. As
//! EasyRec, a variable is frozen when a pattern matches anywhere in its
//! TensorFlow name (`input_layer_1/c1_embedding/embedding_weights:0`,
//! Python's `re.search`): its gradient takes no part in the global norm
//! and no optimizer updates it or its slots. Its regularization still
//! counts in the loss, as in TensorFlow, where it stays in the graph.

use std::ops::Range;

use regex::Regex;

use crate::embedding::RowGrads;
use crate::model::ParamSpec;

/// Which variables are frozen.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Frozen {
    /// Per dense parameter (`ParamStore::specs`).
    pub dense: Vec<bool>,
    /// Per embedding table.
    pub tables: Vec<bool>,
}

impl Frozen {
    /// The variables of `specs` and of the tables named `tables` that one of
    /// `patterns` (valid regular expressions) matches. A pattern that
    /// matches none is reported, as it freezes nothing.
    pub fn of(patterns: &[String], specs: &[ParamSpec], tables: &[String]) -> Self {
        let res: Vec<Regex> = patterns
            .iter()
            .map(|p| Regex::new(p).expect("freeze_gradient patterns are checked with the config"))
            .collect();
        let mut used = vec![false; res.len()];
        let mut frozen = |name: &str| {
            let tf_name = format!("{name}:0");
            let mut hit = false;
            for (r, u) in res.iter().zip(&mut used) {
                if r.is_match(&tf_name) {
                    *u = true;
                    hit = true;
                }
            }
            if hit {
                log::info!("freeze_gradient: {tf_name} is not trained");
            }
            hit
        };
        let f = Frozen {
            dense: specs.iter().map(|s| frozen(&s.name)).collect(),
            tables: tables.iter().map(|t| frozen(t)).collect(),
        };
        for (p, _) in patterns.iter().zip(&used).filter(|(_, u)| !**u) {
            log::warn!("train_config.freeze_gradient `{p}` matches no variable of this model");
        }
        f
    }

    pub fn any(&self) -> bool {
        self.dense.iter().chain(&self.tables).any(|f| *f)
    }

    /// Drops the frozen variables' gradients: dense ones become 0, tables'
    /// lose their rows.
    pub fn clear(&self, specs: &[ParamSpec], dense: &mut [f32], rows: &mut [RowGrads]) {
        for (s, _) in specs.iter().zip(&self.dense).filter(|(_, f)| **f) {
            dense[s.range()].iter_mut().for_each(|g| *g = 0.0);
        }
        self.clear_rows(rows);
    }

    /// `clear` of the tables' rows alone (the dense gradient is on a
    /// device, which clears its own: `DeviceDense::clear_frozen`).
    pub fn clear_rows(&self, rows: &mut [RowGrads]) {
        for (r, _) in rows.iter_mut().zip(&self.tables).filter(|(_, f)| **f) {
            *r = RowGrads::default();
        }
    }

    /// The runs of dense parameter values that are trained, in order.
    pub fn trained_ranges(&self, specs: &[ParamSpec]) -> Vec<Range<usize>> {
        let mut out: Vec<Range<usize>> = Vec::new();
        for (s, _) in specs.iter().zip(&self.dense).filter(|(_, f)| !**f) {
            match out.last_mut() {
                Some(last) if last.end == s.range().start => last.end = s.range().end,
                _ => out.push(s.range()),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str, offset: usize) -> ParamSpec {
        ParamSpec {
            name: name.into(),
            rows: 2,
            cols: 1,
            offset,
            l2: true,
        }
    }

    #[test]
    fn patterns_search_tensorflow_names() {
        let specs = [
            spec("dnn/dnn_0/kernel", 0),
            spec("dnn/dnn_0/bias", 2),
            spec("output/kernel", 4),
        ];
        let tables = [
            "input_layer/c1_embedding/embedding_weights".to_string(),
            "input_layer_1/c1_embedding/embedding_weights".to_string(),
        ];
        let f = Frozen::of(
            &["input_layer_1.*embedding_weights".into(), "dnn_0/bias:0$".into()],
            &specs,
            &tables,
        );
        assert_eq!(f.dense, [false, true, false]);
        assert_eq!(f.tables, [false, true]);
        assert_eq!(f.trained_ranges(&specs), [0..2, 4..6]);
        let mut dense = vec![1.0; 6];
        let mut rows = vec![RowGrads::default(); 2];
        rows[1].slot(3, 2)[0] = 1.0;
        f.clear(&specs, &mut dense, &mut rows);
        assert_eq!(dense, [1.0, 1.0, 0.0, 0.0, 1.0, 1.0]);
        assert!(rows[1].rows.is_empty());
        assert!(!Frozen::of(&["nothing".into()], &specs, &tables).any());
    }
}
