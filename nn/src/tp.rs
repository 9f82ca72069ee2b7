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
use weft_core::collectives::{Collectives, copy_to_parallel, gather_from_parallel, reduce_from_parallel};
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
/// `seed`: on a split, this rank draws only its part (the values one device would have there).
pub(crate) fn new_var(
    shard: Option<(&LayerShard, &Arc<dyn Collectives>)>,
    path: &str,
    name: &str,
    device: &Device,
    init: crate::Initializer,
    shape: &[usize],
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
            Var::new(init.init_part(shape, *axis, split_start(sizes, r), sizes[r], seed, device)?)
        }
        _ => Var::new(init.init(shape, seed, device)?),
    }
}

/// The full size of an axis whose local size is `local`, under a style that may split it.
pub(crate) fn full_input(style: Option<&Style>, local: usize) -> usize {
    match style {
        Some(Style::Row { sizes, scatter: false }) => sizes.iter().sum(),
        _ => local,
    }
}

/// A column split applies its activation to its own slice: only elementwise activations may.
pub(crate) fn check_activation(
    shard: Option<(&LayerShard, &Arc<dyn Collectives>)>,
    activation: crate::Activation,
    path: &str,
) -> Result<()> {
    if let (Some((LayerShard { style: Style::Column { .. }, .. }, _)), crate::Activation::Softmax) = (shard, activation)
    {
        return Err(Error::invalid(
            "tensor parallel",
            format!(
                "{path}: a column split cannot apply softmax to a slice of its outputs; split it by rows or replicate it"
            ),
        ));
    }
    Ok(())
}

/// Input side of a split layer: f before a column split (unless the caller `copied` the input
/// already), the slice before a row split with scatter.
pub(crate) fn enter(
    x: &Tensor,
    shard: Option<(&LayerShard, &Arc<dyn Collectives>)>,
    axis: usize,
    copied: bool,
) -> Result<Tensor> {
    match shard {
        Some((LayerShard { style: Style::Column { .. }, .. }, _)) if copied => Ok(x.clone()),
        Some((LayerShard { style: Style::Column { .. }, .. }, c)) => Ok(copy_to_parallel(x, c.clone())),
        Some((LayerShard { style: Style::Row { sizes, scatter: true }, .. }, c)) => {
            weft_core::collectives::scatter_to_parallel(x, c.clone(), axis, sizes)
        }
        _ => Ok(x.clone()),
    }
}

/// The model-axis group, when every one of `paths` is a column split: the layers can share one f.
pub(crate) fn all_column(tp: &Option<Arc<TpCtx>>, paths: &[String]) -> Option<Arc<dyn Collectives>> {
    let all =
        paths.iter().all(|p| matches!(shard_of(tp, p), Some((LayerShard { style: Style::Column { .. }, .. }, _))));
    if all && !paths.is_empty() { tp.as_ref().map(|t| t.model.clone()) } else { None }
}

/// Output side before the bias: g after a row split.
pub(crate) fn reduce_partial(y: &Tensor, shard: Option<(&LayerShard, &Arc<dyn Collectives>)>) -> Result<Tensor> {
    match shard {
        Some((LayerShard { style: Style::Row { .. }, .. }, c)) => reduce_from_parallel(y, c.clone()),
        _ => Ok(y.clone()),
    }
}

/// Output side after the activation: the all-gather of a column split with `gather`.
pub(crate) fn leave(y: &Tensor, shard: Option<(&LayerShard, &Arc<dyn Collectives>)>, axis: usize) -> Result<Tensor> {
    match shard {
        Some((LayerShard { style: Style::Column { sizes, gather: true }, .. }, c)) => {
            gather_from_parallel(y, c.clone(), axis, sizes)
        }
        _ => Ok(y.clone()),
    }
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
