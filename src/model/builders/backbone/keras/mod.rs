//! The Keras layers a backbone block runs, in one place: `parse` types a
//! block's `keras_layer` (its class, typed parameters or `st_params`,
//! refusing by name what is not honoured), `build` puts the typed layer
//! onto the model graph. A layer is added here: a `Keras` variant and its
//! arm in `parse::parse`, its arm in `build::keras`, both in the same
//! order. The config keeps a block's `keras_layer` as written
//! (`config::model::backbone::KerasLayer`), so its refusals name the
//! config path as they did.

mod build;
mod parse;

pub use build::*;
pub use parse::*;

#[cfg(test)]
mod tests {
    use crate::config::proto;

    #[test]
    fn a_class_not_built_here_is_refused_under_its_config_path() {
        let k = proto::KerasLayer {
            class_name: "Transformer".into(),
            params: None,
        };
        let e = super::parse(&k, "backbone.blocks[0].keras_layer")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("backbone.blocks[0].keras_layer.class_name: Keras layer `Transformer` is not supported"),
            "{e}"
        );
    }

    #[test]
    fn nary_dis_embedding_reads_easyrecs_defaults_and_refuses_what_it_cannot_encode() {
        use proto::keras_layer::Params;
        let layer = |p: proto::NaryDisEmbedding| proto::KerasLayer {
            class_name: "NaryDisEmbedding".into(),
            params: Some(Params::NaryDisEmbedding(p)),
        };
        let base = proto::NaryDisEmbedding {
            embedding_dim: 4,
            ..Default::default()
        };
        // No carries: EasyRec's default bases [2, 9], summed, one replica.
        match super::parse(&layer(base.clone()), "k").unwrap() {
            super::Keras::NaryDis {
                carries,
                mean,
                replicas,
                multiplier,
                ..
            } => assert_eq!((carries, mean, replicas, multiplier), (vec![2, 9], false, 1, 1.0)),
            other => panic!("{other:?}"),
        }
        let err = |p: proto::NaryDisEmbedding| super::parse(&layer(p), "k").unwrap_err().to_string();
        let e = err(proto::NaryDisEmbedding {
            carries: vec![2, 1],
            ..base.clone()
        });
        assert!(e.starts_with("k.carries:") && e.contains("at least 2"), "{e}");
        let e = err(proto::NaryDisEmbedding {
            intra_ary_pooling: Some("max".into()),
            ..base.clone()
        });
        assert!(e.starts_with("k.intra_ary_pooling:"), "{e}");
        // A base so large its table cannot be allocated names `carries`.
        let e = err(proto::NaryDisEmbedding {
            carries: vec![4_000_000_000],
            ..base.clone()
        });
        assert!(e.starts_with("k.carries:") && e.contains("rows"), "{e}");
        let e = err(proto::NaryDisEmbedding {
            embedding_dim: 0,
            ..base
        });
        assert!(e.starts_with("k.embedding_dim:"), "{e}");
    }
}
