//! rustrec: a recommender-model trainer that reads EasyRec pipeline configs.
//!
//! Data flow (see DESIGN.md): `cli` -> `config` (parse, override, validate,
//! type) -> training, evaluation and export.

pub mod cli;
pub mod config;
