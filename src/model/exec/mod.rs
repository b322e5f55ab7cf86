//! Executors: what runs a model graph. Every executor follows one
//! contract, `Executor`: run the graph forward over group input matrices
//! into a `Tape` (every node's value), then backward from gradient seeds
//! of some nodes (what `heads` gives for the outputs it read) into the
//! parameters' and the inputs' gradients. `Model` and `Trainer` hold a
//! `dyn Executor` and never name one; `ExecutorKind` picks one at run time.
//!
//! - `cpu`: the training path of every model (a tape, gemm, fused kernels);
//! - `burn`: the graph on burn tensors, differentiated by burn's autodiff:
//!   the oracle of the CPU executor's backward, on any burn device;
//! - `gpu` (cargo feature `gpu`): opens a GPU for `burn` (wgpu on Vulkan);
//! - `onnx`: not an executor that runs, but the emitter that writes the
//!   same graph as ONNX for exports (each op once there too).
//!
//! An op is added to `graph::Op`, then to each executor's match (`cpu`'s
//! forward and backward, `burn`'s forward, `onnx`'s emitter), and to
//! `op_tests`, which holds the executors to each other and to finite
//! differences.

pub mod burn;
pub mod cpu;
#[cfg(feature = "gpu")]
pub mod gpu;
pub mod onnx;
#[cfg(test)]
mod op_tests;
pub mod resident;

use std::fmt;
use std::sync::Arc;

use ::burn::tensor::{Device, Tensor};

use super::graph::params::ParamStore;
use super::graph::{BnStats, Graph, NodeId};
use crate::util::Rng;

/// What a forward pass runs in.
pub enum Mode<'a> {
    /// Batch statistics (reported into `stats`) and dropout masks from `rng`.
    Train {
        rng: &'a mut Rng,
        stats: &'a mut Vec<BnStats>,
        /// The leading rows that are examples (the rest sampled items).
        examples: usize,
    },
    /// Moving averages, no dropout.
    Infer,
}

/// Runs a model graph. `state` is the trained parameters and the buffers
/// (batch-norm moving statistics); `inputs` the group input matrices,
/// `[rows, width]` each, row-major.
pub trait Executor: fmt::Debug + Send + Sync {
    /// The executor's name, for logs.
    fn name(&self) -> &'static str;

    /// Runs `graph` forward. In `Mode::Train` dropout masks come from the
    /// mode's generator (in node order, the same draws on every executor)
    /// and batch norms report their batch statistics.
    fn forward<'a>(
        &self,
        graph: &'a Graph,
        state: (&ParamStore, &ParamStore),
        inputs: &'a [Vec<f32>],
        rows: usize,
        mode: Mode,
    ) -> Box<dyn Tape + 'a>;

    /// The device on which this executor can keep the dense parameters
    /// and their optimizer state between steps (`resident::Resident`),
    /// without autodiff; `None` where it reads the host's every pass (the
    /// CPU executor: they are in its memory already).
    fn resident_device(&self) -> Option<Device> {
        None
    }
}

/// The dense parameters' gradient of a backward pass, flat in
/// `ParamStore` layout: in host memory, or left on the device that holds
/// the parameters (`resident::Resident`), without autodiff.
pub enum DenseGrad {
    Host(Vec<f32>),
    /// (Boxed: a tensor's handle is large beside a `Vec`'s.)
    Device(Box<Tensor<1>>),
}

impl DenseGrad {
    /// In host memory (read back from the device if it is there).
    pub fn into_host(self) -> Vec<f32> {
        match self {
            DenseGrad::Host(g) => g,
            DenseGrad::Device(t) => super::graph::params::to_vec(*t),
        }
    }
}

/// The values of one forward pass, and the way back.
pub trait Tape {
    /// The value of node `n`, `[rows * node rows, width]` row-major.
    fn value(&self, n: NodeId) -> &[f32];

    /// Says `value` will be asked of each of `nodes`: an executor whose
    /// every read is a round trip (a GPU's) reads them in one.
    fn prefetch(&self, nodes: &[NodeId]) {
        let _ = nodes;
    }

    /// Backward from the gradients of some nodes (`seeds`, each shaped as
    /// the node's value): accumulates every parameter's gradient into
    /// `dense` (`ParamStore` layout) and returns the gradient of each
    /// group input, zeros where `needs` (per node, `Graph::needs_grad`)
    /// says none flows.
    fn backward(
        &self,
        params: &ParamStore,
        seeds: Vec<(NodeId, Vec<f32>)>,
        needs: &[bool],
        dense: &mut [f32],
    ) -> Vec<Vec<f32>>;

    /// `backward` into a fresh gradient, left where the pass's parameters
    /// were: on the device for a `Resident`'s pass, in host memory
    /// otherwise; with the gradient of each group input and, for a pass
    /// over tables on the device (`resident::TableLookups`), theirs.
    fn backward_dense(&self, params: &ParamStore, seeds: Vec<(NodeId, Vec<f32>)>, needs: &[bool]) -> Backward {
        backward_on_host(self, params, seeds, needs)
    }
}

/// What `Tape::backward_dense` gives.
pub struct Backward {
    pub dense: DenseGrad,
    /// Each group input's gradient, `[rows, width]` row-major.
    pub inputs: Vec<Vec<f32>>,
    /// Of a pass over tables on the device: per table of its lookups'
    /// `tables`, the gradient `[rows, dim]` there (`None` for a table not
    /// on the device); empty otherwise.
    pub tables: Vec<Option<Tensor<2>>>,
    /// Of such a pass: embedding_regularization's loss over its lookups,
    /// a scalar on the device.
    pub table_reg: Option<Tensor<1>>,
}

/// `Tape::backward` into a fresh gradient in host memory: what
/// `backward_dense` gives for a pass on the host's parameters.
pub fn backward_on_host<T: Tape + ?Sized>(
    tape: &T,
    params: &ParamStore,
    seeds: Vec<(NodeId, Vec<f32>)>,
    needs: &[bool],
) -> Backward {
    let mut dense = vec![0.0f32; params.len()];
    let inputs = tape.backward(params, seeds, needs, &mut dense);
    Backward {
        dense: DenseGrad::Host(dense),
        inputs,
        tables: Vec::new(),
        table_reg: None,
    }
}

/// The executors a model can run on, chosen at run time (`--device`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ExecutorKind {
    /// The CPU executor, the default.
    #[default]
    Cpu,
    /// burn's CPU backend with autodiff (the reference).
    Burn,
    /// The graph on a GPU through burn's wgpu runtime on Vulkan (cargo
    /// feature `gpu`): the adapter of this rank (`gpu::open`).
    Gpu,
}

impl ExecutorKind {
    /// `--device`'s values: `cpu`, `gpu`.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "cpu" => Ok(ExecutorKind::Cpu),
            "gpu" => Ok(ExecutorKind::Gpu),
            other => Err(format!("unknown device {other:?}: use cpu or gpu")),
        }
    }

    /// The executor, its device opened: on `local_rank` (the process's
    /// index among the ranks of its host) for a GPU. Fails where the build
    /// or the machine has no GPU.
    pub fn executor(self, local_rank: usize) -> Result<Arc<dyn Executor>, DeviceError> {
        match self {
            ExecutorKind::Cpu => Ok(Arc::new(cpu::Cpu::default())),
            ExecutorKind::Burn => Ok(Arc::new(burn::Burn::reference())),
            #[cfg(feature = "gpu")]
            ExecutorKind::Gpu => Ok(Arc::new(burn::Burn::gpu(local_rank)?)),
            #[cfg(not(feature = "gpu"))]
            ExecutorKind::Gpu => {
                let _ = local_rank;
                Err(DeviceError(
                    "--device gpu: this build has no GPU executor (build with `cargo build --features gpu`)".into(),
                ))
            }
        }
    }
}

/// A device that cannot be opened: the user's to fix (another device,
/// another build, a driver).
#[derive(Debug)]
pub struct DeviceError(pub String);

impl fmt::Display for DeviceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DeviceError {}

impl crate::error::Classified for DeviceError {
    fn fault(&self) -> crate::error::Fault {
        crate::error::Fault::User
    }
}
