//! How a layer runs when its model is split over several devices (tensor parallelism).
//!
//! nn never decides a split: weft-parallel's planner does, and hands every rank a [`TpCtx`]:
//! the collectives of its model axis (and data axis) and, by layer path, a [`LayerShard`] saying
//! which style the layer runs in and where each of its variables lives. A layer that finds itself
//! in the map builds only its own shard (the full tensor is drawn on the host from the same seed,
//! then cut, so every split starts from the weights one device would have) and calls the
//! collective ops its style needs. A layer not in the map runs as on one device: replicated.

use std::collections::HashMap;
use std::sync::Arc;
use weft_core::collectives::{Collectives, gather_from_parallel, reduce_from_parallel};
use weft_core::ops::UnaryOp;
use weft_core::{Device, Error, Result, Tensor, Var};

/// Where a variable's values live across the ranks of the model axis.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Placement {
    /// Every rank holds the whole tensor.
    Replicate,
    /// Rank r holds `sizes[r]` consecutive entries of `axis`.
    Shard {
        /// The split axis.
        axis: usize,
        /// Entries per rank (they sum to the axis' size).
        sizes: Vec<usize>,
    },
}

impl Placement {
    /// Rank `rank`'s part of the full tensor `full`.
    pub fn local(&self, full: &Tensor, rank: usize) -> Result<Tensor> {
        match self {
            Placement::Replicate => Ok(full.clone()),
            Placement::Shard { axis, sizes } => {
                if full.dims().get(*axis) != Some(&sizes.iter().sum()) || rank >= sizes.len() {
                    return Err(Error::invalid(
                        "Placement::local",
                        format!("cannot cut {sizes:?} (rank {rank}) from axis {axis} of shape {:?}", full.dims()),
                    ));
                }
                full.narrow(*axis as isize, split_start(sizes, rank), sizes[rank])
            }
        }
    }
    /// The local shape of rank `rank` for a full shape. A rank past the split, or an axis past
    /// the shape, holds nothing of it: its extent along the axis is 0 (never a panic).
    pub fn local_shape(&self, full: &[usize], rank: usize) -> Vec<usize> {
        let mut s = full.to_vec();
        if let Placement::Shard { axis, sizes } = self
            && let Some(d) = s.get_mut(*axis)
        {
            *d = sizes.get(rank).copied().unwrap_or(0);
        }
        s
    }
}

/// First entry of rank `rank` when an axis is split into `sizes`.
pub fn split_start(sizes: &[usize], rank: usize) -> usize {
    sizes[..rank].iter().sum()
}

/// Split `n` entries over `parts` ranks as evenly as possible, larger parts first:
/// 10 over 3 is `[4, 3, 3]`.
///
/// ```
/// assert_eq!(weft_nn::tp::split_sizes(10, 3), vec![4, 3, 3]);
/// ```
pub fn split_sizes(n: usize, parts: usize) -> Vec<usize> {
    (0..parts).map(|r| n / parts + usize::from(r < n % parts)).collect()
}

/// The way a layer runs on its shard.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Style {
    /// Whole weights on every rank; no communication.
    Replicated,
    /// The kernel's output axis is split (`sizes` per rank): the input arrives whole (Megatron's f:
    /// identity forward, all-reduce of its gradient backward), the output leaves split, or
    /// all-gathered when `gather`.
    Column {
        /// Output entries per rank.
        sizes: Vec<usize>,
        /// All-gather the output (when what follows needs it whole).
        gather: bool,
    },
    /// The kernel's input axis is split: the input arrives split (or whole, and each rank takes
    /// its part when `scatter`), and the partial outputs are summed by an all-reduce (Megatron's g).
    Row {
        /// Input entries per rank.
        sizes: Vec<usize>,
        /// The input arrives whole: take this rank's part.
        scatter: bool,
    },
    /// An embedding table split by vocabulary rows: each rank looks up the ids it holds, zeroes the
    /// rest, and an all-reduce sums the parts.
    Vocab {
        /// Rows per rank.
        sizes: Vec<usize>,
    },
    /// A layer without weights on a tensor that stays split along `axis` (dropout draws its mask
    /// for the whole tensor and keeps this rank's part, so masks match one device).
    Split {
        /// The split axis of the input.
        axis: usize,
        /// Entries per rank.
        sizes: Vec<usize>,
    },
}

impl Style {
    /// A short name for tables: `replicated`, `column`, `column+gather`, `row`, `row+scatter`, `vocab`, `split`.
    pub fn name(&self) -> &'static str {
        match self {
            Style::Replicated => "replicated",
            Style::Column { gather: false, .. } => "column",
            Style::Column { gather: true, .. } => "column+gather",
            Style::Row { scatter: false, .. } => "row",
            Style::Row { scatter: true, .. } => "row+scatter",
            Style::Vocab { .. } => "vocab",
            Style::Split { .. } => "split",
        }
    }
}

/// One layer's part of the plan, as the layer needs it at run time.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerShard {
    /// How the layer runs.
    pub style: Style,
    /// Placement of each of the layer's own variables, by relative path (`kernel`, `bias`).
    pub vars: HashMap<String, Placement>,
}

/// What a rank needs to run its part of a sharded model.
#[derive(Clone)]
pub struct TpCtx {
    /// The ranks that share this rank's data and split the weights (the model axis).
    pub model: Arc<dyn Collectives>,
    /// The ranks that hold the same shards and split the batch (the data axis).
    pub data: Arc<dyn Collectives>,
    /// By full layer path (`sequential/dense_1`).
    pub layers: HashMap<String, LayerShard>,
    /// When the model's output leaves split along its last axis: the entries per rank.
    pub output: Option<Vec<usize>>,
}

impl std::fmt::Debug for TpCtx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "TpCtx(model rank {}/{}, data rank {}/{}, {} layers)",
            self.model.rank(),
            self.model.world_size(),
            self.data.rank(),
            self.data.world_size(),
            self.layers.len()
        )
    }
}

/// A layer's shard and its model-axis collectives, when the layer at `path` is split.
pub(crate) fn shard_of<'a>(
    tp: &'a Option<Arc<TpCtx>>,
    path: &str,
) -> Option<(&'a LayerShard, &'a Arc<dyn Collectives>)> {
    let tp = tp.as_ref()?;
    tp.layers.get(path).map(|s| (s, &tp.model))
}

/// A variable for `name` of the layer at `path`, of whole shape `shape`, drawn by `init` from
/// `seed` and scaled by `fans` when given (EinsumDense's, from its axes; `None`: from the shape):
/// on a split, this rank draws only its part (the values one device would have there).
#[allow(clippy::too_many_arguments)]
pub(crate) fn new_var(
    shard: Option<(&LayerShard, &Arc<dyn Collectives>)>,
    path: &str,
    name: &str,
    device: &Device,
    init: crate::Initializer,
    shape: &[usize],
    fans: Option<(usize, usize)>,
    seed: u64,
) -> Result<Var> {
    match shard.and_then(|(s, c)| s.vars.get(name).map(|p| (p, c))) {
        Some((Placement::Shard { axis, sizes }, comm)) => {
            let r = comm.rank();
            let fits = shape.get(*axis) == Some(&sizes.iter().sum()) && r < sizes.len();
            if !fits {
                return Err(Error::invalid(
                    "sharded build",
                    format!(
                        "{path}/{name}: cannot cut {sizes:?} from axis {axis} of shape {shape:?}; was the plan made for this model?"
                    ),
                ));
            }
            Var::new(init.init_part_fans(shape, fans, *axis, split_start(sizes, r), sizes[r], seed, device)?)
        }
        _ => Var::new(init.init_fans(shape, fans, seed, device)?),
    }
}

/// The whole size of the split axis of `layer`'s input, whose local size here is `local`: a row
/// split that takes its input split hands this rank only its part, and a layer of one's own
/// builds its kernel for the whole (see [`variable`]).
pub fn input_size(layer: &dyn crate::Layer, ctx: &crate::Ctx, local: usize) -> usize {
    let _scope = crate::scope::enter(layer);
    full_input(shard_of(&ctx.tp, &weft_core::trace::current_scope()).map(|s| &s.0.style), local)
}

/// Where this rank's part of a tensor split along one axis lies: what a layer that declares
/// [`SplitRule::Pointwise`](crate::SplitRule) reads to act on its part exactly as it would on
/// the whole (a mask drawn for the whole and cut, a per-feature constant cut to its features).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// The split axis.
    pub axis: usize,
    /// This rank's first entry along it.
    pub start: usize,
    /// How many entries this rank holds.
    pub len: usize,
    /// The whole axis' size.
    pub whole: usize,
}

/// This rank's part of `layer`'s input, when the plan runs the layer on a tensor split along one
/// axis (`Style::Split`); `None` when it runs on the whole tensor.
///
/// ```
/// use weft_nn::{layers::Dropout, tp, Ctx};
/// // Outside a sharded model nothing is split.
/// assert_eq!(tp::part(&Dropout::new(0.5), &Ctx::inference()), None);
/// ```
pub fn part(layer: &dyn crate::Layer, ctx: &crate::Ctx) -> Option<Part> {
    let _scope = crate::scope::enter(layer);
    part_at(&ctx.tp, &weft_core::trace::current_scope())
}

/// [`part`] for the layer at `path`.
pub(crate) fn part_at(tp: &Option<Arc<TpCtx>>, path: &str) -> Option<Part> {
    match shard_of(tp, path) {
        Some((LayerShard { style: Style::Split { axis, sizes }, .. }, comm)) => {
            let r = comm.rank();
            Some(Part {
                axis: *axis,
                start: split_start(sizes, r.min(sizes.len())),
                len: sizes.get(r).copied().unwrap_or(0),
                whole: sizes.iter().sum(),
            })
        }
        _ => None,
    }
}

/// Rows `ids` of `table` (an embedding lookup: `[..ids] -> [..ids, width]`) under the split the
/// plan gives `layer`: split by vocabulary ([`SplitRule::Vocab`](crate::SplitRule)), this rank
/// holds rows `start..start + len` of the table, looks up the ids in that range, zeroes the rows
/// of the others, and an all-reduce sums the ranks' parts. Ids may be u32, i32 or f32 holding
/// whole numbers; one outside the whole vocabulary is an `Err` naming the layer, on one device
/// or several.
///
/// ```
/// use weft_core::{Device, Tensor};
/// use weft_nn::{layers::Embedding, tp, Ctx};
/// let table = Tensor::from_vec(vec![0.0f32, 1.0, 2.0, 3.0, 4.0, 5.0], &[3, 2], &Device::Cpu)?;
/// let ids = Tensor::from_vec(vec![2u32, 0], &[2], &Device::Cpu)?;
/// let rows = tp::lookup(&Embedding::new(3, 2), &Ctx::inference(), &table, &ids)?;
/// assert_eq!(rows.to_vec::<f32>()?, vec![4.0, 5.0, 0.0, 1.0]);
/// assert!(tp::lookup(&Embedding::new(3, 2), &Ctx::inference(), &table, &Tensor::from_vec(vec![3u32], &[1], &Device::Cpu)?).is_err());
/// # Ok::<(), weft_core::Error>(())
/// ```
pub fn lookup(layer: &dyn crate::Layer, ctx: &crate::Ctx, table: &Tensor, ids: &Tensor) -> Result<Tensor> {
    use weft_core::DType;
    use weft_core::ops::BinaryOp;
    let _scope = crate::scope::enter(layer);
    let path = weft_core::trace::current_scope();
    let shard = shard_of(&ctx.tp, &path);
    let rows = table.dims().first().copied().unwrap_or(0);
    let whole = match shard {
        Some((LayerShard { style: Style::Vocab { sizes }, .. }, _)) => sizes.iter().sum(),
        _ => rows,
    };
    // Every id must be a whole number in 0..whole: -1 or 2.5 is an error naming the layer,
    // never row 0 or row 2.
    let ids = ids.to_index(&format!("{path}: ids"), Some(whole))?;
    match shard {
        Some((LayerShard { style: Style::Vocab { sizes }, .. }, comm)) => {
            let r = comm.rank();
            if sizes.get(r) != Some(&rows) {
                return Err(Error::invalid(
                    "tensor parallel",
                    format!("{path}: this rank holds {rows} rows of the table, the plan gives it {sizes:?} (rank {r})"),
                ));
            }
            // The ids were checked against the whole vocabulary above, so the last rank needs no
            // upper bound.
            let start = split_start(sizes, r);
            let f = ids.to_dtype(DType::F32)?;
            let mut mask = f.cmp_scalar(BinaryOp::Ge, start as f32)?;
            if r + 1 < sizes.len() {
                mask = mask.mul(&f.cmp_scalar(BinaryOp::Lt, (start + rows) as f32)?)?;
            }
            let local = f.affine(1.0, -(start as f32))?.mul(&mask)?.to_dtype(DType::U32)?;
            let found = table.embedding(&local)?.mul(&mask.unsqueeze(-1)?)?;
            reduce_from_parallel(&found, comm.clone())
        }
        _ => table.embedding(&ids),
    }
}

/// The full size of an axis whose local size is `local`, under a style that may split it.
pub(crate) fn full_input(style: Option<&Style>, local: usize) -> usize {
    match style {
        Some(Style::Row { sizes, scatter: false }) => sizes.iter().sum(),
        _ => local,
    }
}

/// `layer`'s forward pass as a linear map, under the style the plan gives it: the one place
/// Megatron's protocol runs, for Dense, EinsumDense, a tied head and any linear layer of one's
/// own (which declares [`SplitRule::Linear`](crate::SplitRule) and builds its kernel with
/// [`variable`]).
///
/// Before the product: f for a column split (identity forward, all-reduce of the gradient
/// backward; column layers that take the very same tensor share one), or this rank's part of the
/// input for a row split that scatters it (along `axes.0`). `product` is the local
/// `x @ kernel` on whatever part of the kernel this rank holds. After it: g (the all-reduce of
/// the partial sums) for a row split, then `bias`, the activation, and for a column split that
/// gathers, the all-gather along `axes.1`. Unsplit, it is `activation(product(x) + bias)`.
///
/// ```
/// use weft_core::{Device, Tensor};
/// use weft_nn::{layers::Dense, tp, Activation, Ctx};
/// let x = Tensor::ones(&[2, 3], &Device::Cpu)?;
/// let w = Tensor::ones(&[3, 4], &Device::Cpu)?;
/// let layer = Dense::new(4); // any layer: it names the path whose split applies
/// let y = tp::linear(&layer, &Ctx::inference(), &x, (1, 1), |x| x.matmul(&w), None, Activation::Relu)?;
/// assert_eq!(y.to_vec::<f32>()?, vec![3.0; 8]);
/// # Ok::<(), weft_core::Error>(())
/// ```
pub fn linear(
    layer: &dyn crate::Layer,
    ctx: &crate::Ctx,
    x: &Tensor,
    axes: (usize, usize),
    product: impl FnOnce(&Tensor) -> Result<Tensor>,
    bias: Option<&Tensor>,
    activation: crate::Activation,
) -> Result<Tensor> {
    let product = |x: &Tensor, epilogue: Option<(&Tensor, UnaryOp)>| match epilogue {
        Some((b, op)) => product(x)?.add_unary(b, op),
        None => product(x),
    };
    linear_fused(layer, ctx, x, axes, product, bias, activation)
}

/// [`linear`], with `product` given the bias and activation to apply itself (`op(y + bias)`, the
/// identity for a linear activation) where the split allows (not after a row split's
/// all-reduce): a convolution applies them to its output blocks while in cache, and so does a
/// dense layer's product on the Cpu, or its kernel as it stores on a GPU where the product is one
/// dispatch ([`Tensor::matmul_add_unary`]: in training too, as one node, for an activation whose
/// gradient is read from its output). Given `None`, it returns the bare product.
pub fn linear_fused(
    layer: &dyn crate::Layer,
    ctx: &crate::Ctx,
    x: &Tensor,
    axes: (usize, usize),
    product: impl FnOnce(&Tensor, Option<(&Tensor, UnaryOp)>) -> Result<Tensor>,
    bias: Option<&Tensor>,
    activation: crate::Activation,
) -> Result<Tensor> {
    let _scope = crate::scope::enter(layer);
    let path = weft_core::trace::current_scope();
    let shard = shard_of(&ctx.tp, &path);
    let x = match shard {
        Some((LayerShard { style: Style::Column { .. }, .. }, c)) => {
            if !activation.is_elementwise() {
                return Err(Error::invalid(
                    "tensor parallel",
                    format!(
                        "{path}: a column split cannot apply {} to a slice of its outputs; split it by rows or replicate it",
                        activation.name()
                    ),
                ));
            }
            crate::scope::copy_once(x, c)
        }
        Some((LayerShard { style: Style::Row { sizes, scatter: true }, .. }, c)) => {
            weft_core::collectives::scatter_to_parallel(x, c.clone(), axes.0, sizes)?
        }
        _ => x.clone(),
    };
    let row_split = matches!(shard, Some((LayerShard { style: Style::Row { .. }, .. }, _)));
    // Bias and activation in one pass over the output (in the product itself where it can).
    let epilogue = match (bias, activation.as_unary()) {
        (Some(b), Some(op)) => Some((b, op)),
        _ => None,
    };
    let mut y = product(&x, epilogue.filter(|_| !row_split))?;
    if let Some((LayerShard { style: Style::Row { .. }, .. }, c)) = shard {
        y = reduce_from_parallel(&y, c.clone())?;
    }
    let y = match (epilogue, bias) {
        (Some(_), _) if !row_split => y,
        (Some((b, op)), _) => y.add_unary(b, op)?,
        (None, Some(b)) => activation.apply(&y.add(b)?)?,
        (None, None) => activation.apply(&y)?,
    };
    match shard {
        Some((LayerShard { style: Style::Column { sizes, gather: true }, .. }, c)) => {
            gather_from_parallel(&y, c.clone(), axes.1, sizes)
        }
        _ => Ok(y),
    }
}

/// A variable `name` of `layer`, of whole shape `shape`, drawn by `init` from `seed`: where the
/// plan splits it, this rank draws only its part (the values one device would have there). What
/// a layer of one's own builds its weights with.
pub fn variable(
    layer: &dyn crate::Layer,
    ctx: &crate::Ctx,
    name: &str,
    device: &Device,
    init: crate::Initializer,
    shape: &[usize],
    seed: u64,
) -> Result<Var> {
    let _scope = crate::scope::enter(layer);
    let path = weft_core::trace::current_scope();
    new_var(shard_of(&ctx.tp, &path), &path, name, device, init, shape, None, seed)
}

/// Mean cross-entropy of logits split over the vocabulary (`[.., sizes[rank]]` on each rank)
/// against whole integer labels `[..]`, without gathering the logits: each rank exponentiates its
/// part, an all-reduce sums the partition function, and the rank holding a row's label supplies
/// its logit (another all-reduce). The gradient each rank gets is `softmax - one_hot` on its own
/// part, as on one device.
///
/// The row maximum that keeps `exp` finite is all-gathered without a gradient (the loss does not
/// depend on it).
pub fn vocab_parallel_cross_entropy(
    logits: &Tensor,
    labels: &Tensor,
    sizes: &[usize],
    comm: &Arc<dyn Collectives>,
) -> Result<Tensor> {
    let r = comm.rank();
    if sizes.len() != comm.world_size() {
        return Err(Error::invalid(
            "vocab_parallel_cross_entropy",
            format!("vocabulary parts {sizes:?} do not name one part for each of {} ranks", comm.world_size()),
        ));
    }
    let (start, len) = (split_start(sizes, r), sizes[r]);
    let rank = logits.rank();
    if rank == 0 || logits.dims()[rank - 1] != len || labels.dims() != &logits.dims()[..rank - 1] {
        return Err(Error::ShapeMismatch {
            op: "vocab_parallel_cross_entropy",
            lhs: logits.dims().to_vec(),
            rhs: labels.dims().to_vec(),
        });
    }
    let last = rank as isize - 1;
    let m = weft_core::no_grad(|| comm.all_gather(&logits.max(&[last], true)?, rank - 1)?.max(&[last], true))?;
    let shifted = logits.sub(&m)?;
    let sum_exp = reduce_from_parallel(&shifted.exp()?.sum(&[last], false)?, comm.clone())?;
    let f = labels.to_index("labels", Some(sizes.iter().sum()))?.to_dtype(weft_core::DType::F32)?;
    let mut mine = f.cmp_scalar(weft_core::ops::BinaryOp::Ge, start as f32)?;
    if r + 1 < sizes.len() {
        // The last rank also takes labels past the end, so a bad label faults as on one device.
        mine = mine.mul(&f.cmp_scalar(weft_core::ops::BinaryOp::Lt, (start + len) as f32)?)?;
    }
    let local = f.affine(1.0, -(start as f32))?.mul(&mine)?.to_dtype(weft_core::DType::U32)?;
    let picked = shifted.gather(last, &local.unsqueeze(-1)?)?.squeeze(-1)?.mul(&mine)?;
    let picked = reduce_from_parallel(&picked, comm.clone())?;
    sum_exp.log()?.sub(&picked)?.mean_all()
}
