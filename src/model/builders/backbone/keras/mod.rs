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
}
