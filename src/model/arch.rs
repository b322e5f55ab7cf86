//! The five architectures, with EasyRec's wiring of feature groups.

use anyhow::{bail, Context};
use burn::tensor::{Int, Tensor, TensorData};

use super::layers::{Ctx, Dnn, Linear};
use super::params::{Init, ParamStore};
use super::GroupLayout;
use crate::config::model_plan::{Arch, DnnSpec, Interaction};
use crate::util::Rng;

/// Sum of the wide side: per-feature wide embeddings summed, plus a linear
/// map of raw values placed in a wide group.
#[derive(Debug, Clone)]
pub struct Wide {
    pub(crate) groups: Vec<(usize, usize, usize)>, // (group, sparse features, dense width)
    pub(crate) raw: Vec<Option<usize>>,            // per group: kernel for raw values
    pub(crate) dim: usize,
}

impl Wide {
    fn new(groups: &[GroupLayout], dim: usize, p: &mut ParamStore, rng: &mut Rng) -> Self {
        let mut gs = Vec::new();
        let mut raw = Vec::new();
        for (i, g) in groups.iter().enumerate().filter(|(_, g)| g.wide) {
            let n = g.sparse_parts().count();
            let dw = g.dense_width();
            gs.push((i, n, dw));
            raw.push((dw > 0).then(|| {
                p.add(
                    &format!("{}/raw_kernel", g.name),
                    dw,
                    dim,
                    Init::GlorotUniform,
                    true,
                    rng,
                )
            }));
        }
        Wide { groups: gs, raw, dim }
    }

    fn forward(&self, ctx: &Ctx, inputs: &[Tensor<2>]) -> Option<Tensor<2>> {
        let mut acc: Option<Tensor<2>> = None;
        for ((g, n, dw), raw) in self.groups.iter().zip(&self.raw) {
            let x = inputs[*g].clone();
            let b = x.dims()[0];
            if *n > 0 {
                let s: Tensor<2> = x
                    .clone()
                    .narrow(1, 0, n * self.dim)
                    .reshape([b, *n, self.dim])
                    .sum_dim(1)
                    .reshape([b, self.dim]);
                acc = Some(add(acc, s));
            }
            if let Some(k) = raw {
                acc = Some(add(acc, x.narrow(1, n * self.dim, *dw).matmul(ctx.p[*k].clone())));
            }
        }
        acc
    }
}

#[derive(Debug, Clone)]
pub enum Net {
    WideAndDeep {
        wide: Wide,
        deep: usize,
        dnn: Dnn,
        /// final_dnn + output layer, or the deep side's output layer.
        final_dnn: Option<Dnn>,
        out: Linear,
    },
    Dlrm {
        dense: usize,
        sparse: usize,
        n_sparse: usize,
        dim: usize,
        bot: Dnn,
        top: Dnn,
        out: Linear,
        interaction: Interaction,
        /// Flat indices of the kept upper-triangle entries of the `[n, n]` dot matrix.
        tri: Vec<i64>,
        with_dense: bool,
    },
    DeepFm {
        wide: Wide,
        deep: usize,
        /// (columns of FM features within the deep group, count, dim)
        fm: (usize, usize),
        dnn: Dnn,
        final_dnn: Option<Dnn>,
        out: Linear,
    },
    Dcn {
        deep_group: usize,
        cross_group: usize,
        deep: Dnn,
        cross: Vec<(usize, usize)>,
        final_dnn: Dnn,
        out: Linear,
    },
    MultiTower {
        towers: Vec<(usize, Dnn)>,
        final_dnn: Dnn,
        out: Linear,
    },
}

/// The logit head of WideAndDeep and DeepFM: with final_dnn, it runs over
/// the concatenated sides (`concat_width`) and ends in one output unit;
/// without it, the deep side gets its own output unit and the wide side is
/// added, which needs a wide side of width 1.
fn logit_head(
    model: &str,
    final_dnn: &Option<DnnSpec>,
    concat_width: usize,
    deep_width: usize,
    wide_dim: usize,
    (p, buffers, rng): (&mut ParamStore, &mut ParamStore, &mut Rng),
) -> anyhow::Result<(Option<Dnn>, Linear)> {
    Ok(match final_dnn {
        Some(f) => {
            let fd = Dnn::new(p, buffers, "final_dnn", f, concat_width, rng);
            let out = Linear::new(p, "output", fd.d_out, 1, true, rng);
            (Some(fd), out)
        }
        None => {
            if wide_dim != 1 {
                bail!("{model} without final_dnn needs wide_output_dim: 1 for one logit");
            }
            (None, Linear::new(p, "deep_output", deep_width, 1, true, rng))
        }
    })
}

/// `a + b`, where a missing `a` is zero.
fn add(a: Option<Tensor<2>>, b: Tensor<2>) -> Tensor<2> {
    match a {
        Some(a) => a + b,
        None => b,
    }
}

fn group(groups: &[GroupLayout], name: &str, model: &str) -> anyhow::Result<usize> {
    groups
        .iter()
        .position(|g| g.name == name && !g.wide)
        .with_context(|| format!("{model} needs a feature group named `{name}`"))
}

fn deep_group(groups: &[GroupLayout], model: &str) -> anyhow::Result<usize> {
    groups
        .iter()
        .position(|g| g.name == "deep" && !g.wide)
        .or_else(|| groups.iter().position(|g| !g.wide))
        .with_context(|| format!("{model} needs a deep feature group"))
}

/// The FM features of a deep group: its leading run of sparse parts of one dimension.
fn fm_parts(g: &GroupLayout) -> anyhow::Result<(usize, usize)> {
    let sparse: Vec<_> = g.sparse_parts().collect();
    let Some(first) = sparse.first() else {
        bail!("DeepFM: group `{}` has no embedded features for the FM part", g.name)
    };
    if sparse.iter().any(|p| p.dim != first.dim) {
        bail!(
            "DeepFM: every embedded feature of group `{}` needs the same embedding_dim",
            g.name
        );
    }
    Ok((sparse.len(), first.dim))
}

impl Net {
    pub fn new(
        arch: &Arch,
        groups: &[GroupLayout],
        p: &mut ParamStore,
        buffers: &mut ParamStore,
        rng: &mut Rng,
    ) -> anyhow::Result<Net> {
        Ok(match arch {
            Arch::WideAndDeep {
                wide_output_dim,
                dnn,
                final_dnn,
            } => {
                let wide = Wide::new(groups, *wide_output_dim, p, rng);
                let deep = deep_group(groups, "WideAndDeep")?;
                let d = Dnn::new(p, buffers, "dnn", dnn, groups[deep].width, rng);
                let (final_dnn, out) = logit_head(
                    "WideAndDeep",
                    final_dnn,
                    wide.dim + d.d_out,
                    d.d_out,
                    *wide_output_dim,
                    (p, buffers, rng),
                )?;
                Net::WideAndDeep {
                    wide,
                    deep,
                    dnn: d,
                    final_dnn,
                    out,
                }
            }
            Arch::Dlrm {
                bot,
                top,
                interaction,
                itself,
                with_dense,
            } => {
                let dense = group(groups, "dense", "DLRM")?;
                let sparse = group(groups, "sparse", "DLRM")?;
                let sg = &groups[sparse];
                if sg.parts.iter().any(|p| p.table.is_none()) {
                    bail!("DLRM: group `sparse` may only hold embedded features");
                }
                let n_sparse = sg.parts.len();
                let dim = sg.parts.first().map_or(0, |p| p.dim);
                if n_sparse == 0 || sg.parts.iter().any(|p| p.dim != dim) {
                    bail!("DLRM: group `sparse` needs features of one embedding_dim");
                }
                let bot = Dnn::new(p, buffers, "bot_dnn", bot, groups[dense].width, rng);
                let (tri, top_in) = match interaction {
                    Interaction::Dot => {
                        if bot.d_out != dim {
                            bail!(
                                "DLRM: bot_dnn must end with the embedding_dim ({dim}) for the dot interaction, it ends with {}",
                                bot.d_out
                            );
                        }
                        let n = n_sparse + 1;
                        let off = if *itself { 0 } else { 1 };
                        let tri: Vec<i64> = (0..n)
                            .flat_map(|i| (i + off..n).map(move |j| (i * n + j) as i64))
                            .collect();
                        let w = tri.len() + if *with_dense { bot.d_out } else { 0 };
                        (tri, w)
                    }
                    Interaction::Cat => (Vec::new(), bot.d_out + n_sparse * dim),
                };
                let top = Dnn::new(p, buffers, "top_dnn", top, top_in, rng);
                let out = Linear::new(p, "output", top.d_out, 1, true, rng);
                Net::Dlrm {
                    dense,
                    sparse,
                    n_sparse,
                    dim,
                    bot,
                    top,
                    out,
                    interaction: *interaction,
                    tri,
                    with_dense: *with_dense,
                }
            }
            Arch::DeepFm {
                wide_output_dim,
                dnn,
                final_dnn,
            } => {
                let wide = Wide::new(groups, *wide_output_dim, p, rng);
                let deep = deep_group(groups, "DeepFM")?;
                let fm = fm_parts(&groups[deep])?;
                let d = Dnn::new(p, buffers, "dnn", dnn, groups[deep].width, rng);
                let (final_dnn, out) = logit_head(
                    "DeepFM",
                    final_dnn,
                    wide.dim + fm.1 + d.d_out,
                    d.d_out,
                    *wide_output_dim,
                    (p, buffers, rng),
                )?;
                Net::DeepFm {
                    wide,
                    deep,
                    fm,
                    dnn: d,
                    final_dnn,
                    out,
                }
            }
            Arch::Dcn {
                deep_input,
                deep,
                cross_input,
                cross_num,
                final_dnn,
            } => {
                let deep_group = group(groups, deep_input, "DCN deep_tower")?;
                let cross_group = group(groups, cross_input, "DCN cross_tower")?;
                let d = groups[cross_group].width;
                let deep = Dnn::new(p, buffers, "deep_tower", deep, groups[deep_group].width, rng);
                let cross = (0..*cross_num)
                    .map(|i| {
                        (
                            p.add(&format!("cross/layer_{i}/kernel"), d, 1, Init::GlorotUniform, true, rng),
                            p.add(&format!("cross/layer_{i}/bias"), 1, d, Init::Zeros, false, rng),
                        )
                    })
                    .collect();
                let fd = Dnn::new(p, buffers, "final_dnn", final_dnn, deep.d_out + d, rng);
                let out = Linear::new(p, "output", fd.d_out, 1, true, rng);
                Net::Dcn {
                    deep_group,
                    cross_group,
                    deep,
                    cross,
                    final_dnn: fd,
                    out,
                }
            }
            Arch::MultiTower { towers, final_dnn } => {
                let mut ts = Vec::new();
                let mut width = 0;
                for (name, spec) in towers {
                    let g = group(groups, name, "MultiTower")?;
                    let dnn = Dnn::new(p, buffers, &format!("{name}_tower"), spec, groups[g].width, rng);
                    width += dnn.d_out;
                    ts.push((g, dnn));
                }
                if ts.is_empty() {
                    bail!("MultiTower needs at least one tower");
                }
                let fd = Dnn::new(p, buffers, "final_dnn", final_dnn, width, rng);
                let out = Linear::new(p, "output", fd.d_out, 1, true, rng);
                Net::MultiTower {
                    towers: ts,
                    final_dnn: fd,
                    out,
                }
            }
        })
    }

    pub fn forward(&self, ctx: &mut Ctx, x: &[Tensor<2>]) -> Tensor<2> {
        match self {
            Net::WideAndDeep {
                wide,
                deep,
                dnn,
                final_dnn,
                out,
            } => {
                let w = wide.forward(ctx, x);
                let h = dnn.forward(ctx, x[*deep].clone());
                match final_dnn {
                    Some(f) => {
                        let b = h.dims()[0];
                        let w = w.unwrap_or_else(|| ctx.constant(vec![0.0; b * wide.dim], b, wide.dim));
                        let h = f.forward(ctx, Tensor::cat(vec![w, h], 1));
                        out.forward(ctx, h)
                    }
                    None => add(w, out.forward(ctx, h)),
                }
            }
            Net::Dlrm {
                dense,
                sparse,
                n_sparse,
                dim,
                bot,
                top,
                out,
                interaction,
                tri,
                with_dense,
            } => {
                let d = bot.forward(ctx, x[*dense].clone());
                let s = x[*sparse].clone();
                let b = d.dims()[0];
                let z = match interaction {
                    Interaction::Cat => Tensor::cat(vec![d, s], 1),
                    Interaction::Dot => {
                        let n = n_sparse + 1;
                        let all: Tensor<3> = Tensor::cat(vec![d.clone(), s], 1).reshape([b, n, *dim]);
                        let dots: Tensor<2> = all.clone().matmul(all.swap_dims(1, 2)).reshape([b, n * n]);
                        let idx = Tensor::<1, Int>::from_data(TensorData::new(tri.clone(), [tri.len()]), ctx.device);
                        let inter = dots.select(1, idx);
                        if *with_dense {
                            Tensor::cat(vec![d, inter], 1)
                        } else {
                            inter
                        }
                    }
                };
                let h = top.forward(ctx, z);
                out.forward(ctx, h)
            }
            Net::DeepFm {
                wide,
                deep,
                fm,
                dnn,
                final_dnn,
                out,
            } => {
                let w = wide.forward(ctx, x);
                let xd = x[*deep].clone();
                let b = xd.dims()[0];
                let (n, d) = *fm;
                let v: Tensor<3> = xd.clone().narrow(1, 0, n * d).reshape([b, n, d]);
                let sum: Tensor<2> = v.clone().sum_dim(1).reshape([b, d]);
                let sq: Tensor<2> = (v.clone() * v).sum_dim(1).reshape([b, d]);
                let fm_out = (sum.clone() * sum - sq).mul_scalar(0.5);
                let h = dnn.forward(ctx, xd);
                match final_dnn {
                    Some(f) => {
                        let w = w.unwrap_or_else(|| ctx.constant(vec![0.0; b * wide.dim], b, wide.dim));
                        let h = f.forward(ctx, Tensor::cat(vec![w, fm_out, h], 1));
                        out.forward(ctx, h)
                    }
                    None => add(w, out.forward(ctx, h) + fm_out.sum_dim(1)),
                }
            }
            Net::Dcn {
                deep_group,
                cross_group,
                deep,
                cross,
                final_dnn,
                out,
            } => {
                let h = deep.forward(ctx, x[*deep_group].clone());
                let x0 = x[*cross_group].clone();
                let mut xl = x0.clone();
                for (w, bias) in cross {
                    let s = xl.clone().matmul(ctx.p[*w].clone()); // [b, 1]
                    xl = x0.clone() * s + ctx.p[*bias].clone() + xl;
                }
                let h = final_dnn.forward(ctx, Tensor::cat(vec![h, xl], 1));
                out.forward(ctx, h)
            }
            Net::MultiTower { towers, final_dnn, out } => {
                let hs = towers.iter().map(|(g, dnn)| dnn.forward(ctx, x[*g].clone())).collect();
                let h = final_dnn.forward(ctx, Tensor::cat(hs, 1));
                out.forward(ctx, h)
            }
        }
    }
}
