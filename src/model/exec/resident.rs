//! Dense parameters and their optimizer slots kept on an executor's device
//! between training steps (`--device gpu`): uploaded once, trained there
//! (`train::device_dense` runs the update), read back when the host needs
//! them (checkpoints, evaluation, exports, incremental updates). A pass
//! over them slices each parameter out of the flat buffer as an autodiff
//! leaf, and its backward leaves the parameters' gradient on the device in
//! the same flat layout (`Tape::backward_dense`).

use burn::tensor::{Device, Tensor, TensorData};

use super::burn::{leaves, pass, shapes, FlatLayout};
use super::{Mode, Tape};
use crate::embedding::Gather;
use crate::model::graph::params::{read_all, ParamStore};
use crate::model::graph::Graph;

/// The dense parameters (`ParamStore` layout, flat) and each optimizer
/// slot (as long), on a device without autodiff.
pub struct Resident {
    /// The passes' device: the parameters' with autodiff.
    passes: Device,
    /// Where each parameter is, and the device that holds them.
    layout: FlatLayout,
    pub params: Tensor<1>,
    pub slots: Vec<Tensor<1>>,
}

impl std::fmt::Debug for Resident {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Resident({} values, {} slots)", self.layout.len, self.slots.len())
    }
}

impl Resident {
    /// `params`' values and the optimizer's `slots` (each as long) on
    /// `device` (an executor's `resident_device`), one transfer each.
    pub fn upload(device: &Device, params: &ParamStore, slots: &[Vec<f32>]) -> Self {
        let len = params.len();
        debug_assert!(params.values.len() == len && slots.iter().all(|s| s.len() == len));
        // A pass's gradient is its parameters' gradients one after another.
        let mut end = 0;
        for s in &params.specs {
            assert_eq!(s.offset, end, "`{}`: parameters are laid out one after another", s.name);
            end = s.range().end;
        }
        let flat = |v: &[f32]| Tensor::<1>::from_data(TensorData::new(v.to_vec(), [len]), device);
        Resident {
            passes: device.clone().autodiff(),
            layout: FlatLayout {
                shapes: shapes(params),
                len,
                device: device.clone(),
            },
            params: flat(&params.values),
            slots: slots.iter().map(|s| flat(s)).collect(),
        }
    }

    /// The device that holds them (without autodiff).
    pub fn device(&self) -> &Device {
        &self.layout.device
    }

    /// How many values each of them holds.
    pub fn len(&self) -> usize {
        self.layout.len
    }

    pub fn is_empty(&self) -> bool {
        self.layout.len == 0
    }

    /// The parameters and each slot read back, in one transfer.
    pub fn download(&self) -> (Vec<f32>, Vec<Vec<f32>>) {
        if self.is_empty() {
            return (Vec::new(), vec![Vec::new(); self.slots.len()]);
        }
        let all = read_all(std::iter::once(&self.params).chain(&self.slots).cloned().collect());
        let mut parts = all.chunks(self.layout.len).map(<[f32]>::to_vec);
        let params = parts.next().unwrap_or_default();
        (params, parts.collect())
    }

    /// `Executor::forward` on these parameters (`buffers`, the batch-norm
    /// statistics, from the host) over `inputs` of `rows` rows, into which
    /// `tables`' lookups are pooled here; the tape's `backward_dense`
    /// leaves the parameters' gradient here, and the tables'.
    pub fn forward<'a>(
        &self,
        graph: &'a Graph,
        buffers: &ParamStore,
        (inputs, rows, tables): (&'a [Vec<f32>], usize, Option<&TableLookups>),
        mode: Mode,
    ) -> Box<dyn Tape + 'a> {
        let p = leaves(Some(&self.params), &self.layout.shapes, &self.layout.device);
        let io = (inputs, rows);
        let resident = Some((self.layout.clone(), tables));
        Box::new(pass(&self.passes, graph, (p, buffers), io, mode, resident))
    }
}

/// Embedding tables kept on the device beside the dense parameters
/// (`train::device_tables`), with a batch's lookups in them: a pass pools
/// each gather's output into its group input's columns there (the host's
/// inputs hold zeros in them), and its backward leaves each table's
/// gradient there.
pub struct TableLookups<'a> {
    /// Per table of the collection: its rows `[rows, dim]` on the
    /// parameters' device (without autodiff), when it is kept there.
    pub tables: &'a [Option<Tensor<2>>],
    /// The lookups (`Gather::table` indexes `tables`).
    pub gathers: &'a [Gather],
    /// embedding_regularization (0 for none): `reg / 2 * Σ value²` of
    /// every pooled value joins the loss the backward starts from.
    pub reg: f32,
}
