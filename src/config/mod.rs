//! Pipeline config: text proto / JSON -> `DynamicMessage` -> overrides ->
//! structural validation -> prost structs -> typed, trainer-ready values.

pub mod data_plan;
pub mod edit;
pub mod eval_plan;
pub mod export_plan;
pub mod expr;
pub mod feature_plan;
pub mod fg;
pub mod kafka_plan;
pub mod loader;
pub mod model;
pub mod overrides;
pub mod reflect;
pub mod sizes;
pub mod suggest;
pub mod text_format;
pub mod train_plan;
pub mod typed;
pub mod validate;

/// prost structs generated from `protos/easy_rec/*.proto` (package `protos`).
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/protos.rs"));
}

use std::path::PathBuf;

use prost_reflect::{DescriptorPool, MessageDescriptor};

pub use loader::{load_pipeline, render_text, LoadedConfig};
pub use overrides::Overrides;

/// Every way a config can be wrong. All of them are the user's to fix.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A parse error at a position of a config file.
    #[error("{file}:{line}:{col}: {message}")]
    Syntax {
        file: String,
        line: usize,
        col: usize,
        message: String,
    },
    /// A field (named by its path from the root) holds a wrong or conflicting value.
    #[error("{path}: {message}")]
    Invalid { path: String, message: String },
    /// Valid for EasyRec, but this trainer cannot do it.
    #[error("{path}: {what} is not supported by this trainer{hint}")]
    Unsupported { path: String, what: String, hint: String },
    /// Each section is valid, but no model can be built from them together
    /// (a sparse feature without embedding_dim in a deep group, DLRM's
    /// bot_dnn not ending at the embedding width, ...).
    #[error("{0}")]
    Unbuildable(String),
    /// A `--edit_config_json` key or an extend argument that cannot be applied.
    #[error("cannot apply edit `{key}`: {message}")]
    Edit { key: String, message: String },
}

/// Every way a config can be wrong is the user's to fix.
impl crate::error::Classified for ConfigError {
    fn fault(&self) -> crate::error::Fault {
        crate::error::Fault::User
    }
}

impl ConfigError {
    /// The error of building features or a model from a valid config.
    pub fn unbuildable(err: anyhow::Error) -> Self {
        ConfigError::Unbuildable(format!("{err:#}"))
    }

    pub fn invalid(path: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError::Invalid {
            path: path.into(),
            message: message.into(),
        }
    }

    pub fn unsupported(path: impl Into<String>, what: impl Into<String>) -> Self {
        ConfigError::Unsupported {
            path: path.into(),
            what: what.into(),
            hint: String::new(),
        }
    }
}

/// The compiled schema (descriptors of every message in protos/).
pub fn schema() -> DescriptorPool {
    DescriptorPool::decode(include_bytes!(concat!(env!("OUT_DIR"), "/easyrec_descriptor.bin")).as_ref())
        .expect("descriptor set produced by build.rs decodes")
}

/// Descriptor of the root message, `protos.EasyRecConfig`.
pub fn pipeline_descriptor() -> MessageDescriptor {
    schema()
        .get_message_by_name("protos.EasyRecConfig")
        .expect("EasyRecConfig is in the schema")
}
