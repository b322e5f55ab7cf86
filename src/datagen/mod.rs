//! Data sets for samples, tests and benchmarks: Criteo-shaped synthetic data
//! with a planted model, a CTR table built from MovieLens-100k, and random
//! rows of any config's schema.

mod criteo;
mod movielens;
mod schema;

pub use criteo::{generate, schema, GenReport, GenSpec, KAGGLE_CARDINALITIES};
pub use movielens::{prepare_movielens, prepare_movielens_by_time, MovieLensReport};
pub use schema::{generate_for_plan, generate_sampler_tables};
