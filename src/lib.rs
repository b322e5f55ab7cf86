//! rustrec: a recommender-model trainer that reads EasyRec pipeline configs.
//!
//! Data flow (see DESIGN.md): `cli` -> `config` (parse, override, validate,
//! type) -> `data` (files to raw column batches) -> `features` (ids and dense
//! values) -> `embedding` (tables, pooling, sparse updates) + `model` (dense
//! network on burn) -> `optim` -> `train` (loop, `checkpoint`, `metrics`).

pub mod bounded;
pub mod checkpoint;
pub mod cli;
pub mod config;
pub mod data;
pub mod datagen;
pub mod dist;
pub mod embedding;
pub mod error;
pub mod export;
pub mod features;
pub mod inference;
pub mod logging;
pub mod metrics;
pub mod model;
pub mod optim;
pub mod output;
pub mod predict;
pub mod profile;
pub mod serve;
pub mod storage;
pub mod summary;
pub mod tf_proto;
pub mod train;
pub mod util;
