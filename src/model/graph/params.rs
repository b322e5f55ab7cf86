//! Dense parameters as one named, flat f32 buffer. burn sees them as leaf
//! tensors sliced from it each pass (`exec::burn::leaves`); their gradients come back into a buffer of
//! the same layout, so optimizers, clipping, all-reduce and checkpoints all
//! work on plain slices.

use burn::tensor::Tensor;

use crate::util::Rng;

#[derive(Debug, Clone, PartialEq)]
pub struct ParamSpec {
    pub name: String,
    pub rows: usize,
    pub cols: usize,
    pub offset: usize,
    /// Takes part in l2_regularization (dense kernels).
    pub l2: bool,
}

impl ParamSpec {
    pub fn len(&self) -> usize {
        self.rows * self.cols
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn range(&self) -> std::ops::Range<usize> {
        self.offset..self.offset + self.len()
    }
}

#[derive(Debug, Clone, Copy)]
pub enum Init {
    Zeros,
    Ones,
    /// Glorot (Xavier) uniform, TensorFlow's default kernel initializer.
    GlorotUniform,
    /// Glorot uniform of a 1-D TensorFlow variable of `n` values (fan in =
    /// fan out = n), whatever 2-D shape it is stored in here.
    GlorotUniformVector,
    /// He (Kaiming) uniform, limit `sqrt(6 / fan_in)`: Keras' `he_uniform`,
    /// EasyRec's MLP block default.
    HeUniform,
    /// Normal cut at two standard deviations: Keras' `truncated_normal`
    /// (stddev 0.05 by default).
    TruncatedNormal(f32),
    /// Uniform in `[-limit, limit]` (Keras' glorot_uniform of a variable
    /// whose fans are not its stored rows and columns).
    Uniform(f32),
    /// Normal with this standard deviation, uncut.
    Normal(f32),
}

/// Named 2-D parameters in one buffer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ParamStore {
    pub specs: Vec<ParamSpec>,
    pub values: Vec<f32>,
    /// While set, adding a parameter of a name already here returns that
    /// one (TensorFlow's `AUTO_REUSE`: a backbone package's layers called
    /// again share their variables).
    pub reuse: bool,
}

impl ParamStore {
    /// Adds a `[rows, cols]` parameter; returns its index.
    pub fn add(&mut self, name: &str, rows: usize, cols: usize, init: Init, l2: bool, rng: &mut Rng) -> usize {
        if self.reuse {
            // Of another shape, a second parameter of the name is added:
            // the builder reusing names refuses it (`reused_with_new_shape`).
            if let Some(i) = self
                .by_name(name)
                .filter(|&i| (self.specs[i].rows, self.specs[i].cols) == (rows, cols))
            {
                return i;
            }
        }
        let offset = self.values.len();
        match init {
            Init::Zeros => self.values.resize(offset + rows * cols, 0.0),
            Init::Ones => self.values.resize(offset + rows * cols, 1.0),
            Init::GlorotUniform => {
                let limit = (6.0 / (rows + cols) as f64).sqrt();
                self.values
                    .extend((0..rows * cols).map(|_| ((rng.uniform() * 2.0 - 1.0) * limit) as f32));
            }
            Init::GlorotUniformVector => {
                let limit = (3.0 / (rows * cols).max(1) as f64).sqrt();
                self.values
                    .extend((0..rows * cols).map(|_| ((rng.uniform() * 2.0 - 1.0) * limit) as f32));
            }
            Init::HeUniform => {
                let limit = (6.0 / rows.max(1) as f64).sqrt();
                self.values
                    .extend((0..rows * cols).map(|_| ((rng.uniform() * 2.0 - 1.0) * limit) as f32));
            }
            Init::Uniform(limit) => {
                self.values
                    .extend((0..rows * cols).map(|_| ((rng.uniform() * 2.0 - 1.0) * limit as f64) as f32));
            }
            Init::Normal(stddev) => {
                self.values
                    .extend((0..rows * cols).map(|_| (rng.normal() * stddev as f64) as f32));
            }
            Init::TruncatedNormal(stddev) => {
                self.values
                    .extend((0..rows * cols).map(|_| (rng.truncated_normal() * stddev as f64) as f32));
            }
        }
        self.specs.push(ParamSpec {
            name: name.to_string(),
            rows,
            cols,
            offset,
            l2,
        });
        self.specs.len() - 1
    }

    /// A parameter added from `from` on under a name an earlier one has
    /// (with another shape, which `reuse` does not share): its name.
    pub fn reused_with_new_shape(&self, from: usize) -> Option<&ParamSpec> {
        self.specs
            .iter()
            .skip(from)
            .find(|s| self.specs[..from].iter().any(|e| e.name == s.name))
    }

    /// The values the parameters hold (the extent of their ranges): the
    /// same while `values` is lent to a device (`exec::resident`).
    pub fn len(&self) -> usize {
        self.specs.iter().map(|s| s.range().end).max().unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn slice(&self, i: usize) -> &[f32] {
        &self.values[self.specs[i].range()]
    }

    pub fn slice_mut(&mut self, i: usize) -> &mut [f32] {
        let r = self.specs[i].range();
        &mut self.values[r]
    }

    pub fn by_name(&self, name: &str) -> Option<usize> {
        self.specs.iter().position(|s| s.name == name)
    }
}

/// Reads flat tensors back one after another, in one transfer (on a GPU
/// each read is a round trip); none, nothing.
pub fn read_all(parts: Vec<Tensor<1>>) -> Vec<f32> {
    match parts.is_empty() {
        true => Vec::new(),
        false => to_vec(Tensor::cat(parts, 0)),
    }
}

/// Reads a tensor back into a Vec.
pub fn to_vec<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data()
        .try_into_vec::<f32>()
        .expect("float tensors hold f32 on the CPU backend")
}
