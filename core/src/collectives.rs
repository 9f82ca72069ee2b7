//! The collectives interface and the four autograd-aware collective ops that tensor-parallel
//! layers call (Megatron's f and g and their gather/scatter cousins). Each op's backward is the
//! conjugate collective: what is an identity forward is an all-reduce backward, and so on.
//!
//! The in-host implementation (one thread per device) lives in weft-parallel; [`SingleRank`] is
//! the trivial one-device implementation.

use crate::backprop::{BackwardFn, Op};
use crate::{Error, Result, Tensor};
use std::sync::Arc;

/// How `all_reduce` combines the ranks' tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceKind {
    /// Elementwise sum.
    Sum,
    /// Elementwise mean.
    Mean,
    /// Elementwise maximum.
    Max,
}

/// Collective communication among the ranks of one group. Every rank must call the same
/// collectives in the same order; a rank that fails makes the others return `Err`, never hang.
pub trait Collectives: Send + Sync {
    /// This rank's index in the group.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn world_size(&self) -> usize;
    /// Every rank gets the sum (or mean) of all ranks' `x` (same shape everywhere).
    fn all_reduce(&self, x: &Tensor, kind: ReduceKind) -> Result<Tensor>;
    /// Every rank gets all ranks' `x` joined along `axis` in rank order (sizes along `axis` may differ).
    fn all_gather(&self, x: &Tensor, axis: usize) -> Result<Tensor>;
    /// Reduce all ranks' `x`, then give rank r the part `sizes[r]` of it along `axis`.
    fn reduce_scatter(&self, x: &Tensor, axis: usize, sizes: &[usize], kind: ReduceKind) -> Result<Tensor>;
    /// Every rank gets rank `root`'s `x`.
    fn broadcast(&self, x: &Tensor, root: usize) -> Result<Tensor>;
    /// Wait until every rank arrives.
    fn barrier(&self) -> Result<()>;
}

/// The group of one: every collective is the identity.
#[derive(Debug, Clone, Copy, Default)]
pub struct SingleRank;

impl Collectives for SingleRank {
    fn rank(&self) -> usize {
        0
    }
    fn world_size(&self) -> usize {
        1
    }
    fn all_reduce(&self, x: &Tensor, _kind: ReduceKind) -> Result<Tensor> {
        Ok(x.clone())
    }
    fn all_gather(&self, x: &Tensor, _axis: usize) -> Result<Tensor> {
        Ok(x.clone())
    }
    fn reduce_scatter(&self, x: &Tensor, axis: usize, sizes: &[usize], _kind: ReduceKind) -> Result<Tensor> {
        if sizes.len() != 1 || x.dims().get(axis) != sizes.first() {
            return Err(Error::Collective(format!(
                "reduce_scatter: sizes {sizes:?} do not split axis {axis} of {:?} over 1 rank",
                x.dims()
            )));
        }
        Ok(x.clone())
    }
    fn broadcast(&self, x: &Tensor, root: usize) -> Result<Tensor> {
        if root != 0 {
            return Err(Error::Collective(format!("broadcast from rank {root} in a group of 1")));
        }
        Ok(x.clone())
    }
    fn barrier(&self) -> Result<()> {
        Ok(())
    }
}

impl Tensor {
    /// `value` recorded as the output of a custom op over `inputs`, whose backward is `backward`.
    /// This is how crates above core add differentiable ops (collectives, fused layers).
    pub fn from_custom_op(value: &Tensor, name: &'static str, inputs: Vec<Tensor>, backward: BackwardFn) -> Tensor {
        value.view(value.layout().clone(), Op::Custom { name, inputs, backward })
    }
}

/// Start of rank `rank`'s part when an axis is split into `sizes`.
fn start_of(sizes: &[usize], rank: usize) -> usize {
    sizes[..rank].iter().sum()
}

/// `sizes` must have one entry per rank, and `x` must hold the whole axis (`whole`) or this rank's part.
fn check_sizes(op: &str, x: &Tensor, axis: usize, sizes: &[usize], comm: &dyn Collectives, whole: bool) -> Result<()> {
    let ok = sizes.len() == comm.world_size()
        && axis < x.rank()
        && x.dims()[axis] == if whole { sizes.iter().sum() } else { sizes[comm.rank()] };
    if !ok {
        return Err(Error::Collective(format!(
            "{op}: sizes {sizes:?} do not split axis {axis} of shape {:?} over {} ranks (this is rank {})",
            x.dims(),
            comm.world_size(),
            comm.rank()
        )));
    }
    Ok(())
}

/// Megatron's f: identity forward, all-reduce (sum) of the gradient backward. Put before a
/// column-split layer whose input is replicated.
pub fn copy_to_parallel(x: &Tensor, comm: Arc<dyn Collectives>) -> Tensor {
    let c = comm.clone();
    Tensor::from_custom_op(
        x,
        "copy_to_parallel",
        vec![x.clone()],
        Arc::new(move |g| Ok(vec![Some(c.all_reduce(g, ReduceKind::Sum)?)])),
    )
}

/// Megatron's g: all-reduce (sum) forward, identity backward. Put after a row-split layer whose
/// partial outputs must be summed.
pub fn reduce_from_parallel(x: &Tensor, comm: Arc<dyn Collectives>) -> Result<Tensor> {
    let y = crate::no_grad(|| comm.all_reduce(x, ReduceKind::Sum))?;
    Ok(Tensor::from_custom_op(&y, "reduce_from_parallel", vec![x.clone()], Arc::new(|g| Ok(vec![Some(g.clone())]))))
}

/// All-gather forward along `axis` (each rank holding `sizes[rank]` entries), and backward the
/// slice of the gradient that belongs to this rank.
pub fn gather_from_parallel(x: &Tensor, comm: Arc<dyn Collectives>, axis: usize, sizes: &[usize]) -> Result<Tensor> {
    check_sizes("gather_from_parallel", x, axis, sizes, comm.as_ref(), false)?;
    let y = crate::no_grad(|| comm.all_gather(x, axis))?;
    let (start, len) = (start_of(sizes, comm.rank()), sizes[comm.rank()]);
    Ok(Tensor::from_custom_op(
        &y,
        "gather_from_parallel",
        vec![x.clone()],
        Arc::new(move |g| Ok(vec![Some(g.narrow(axis as isize, start, len)?)])),
    ))
}

/// Keep this rank's slice (`sizes[rank]` entries of `axis`) forward; all-gather the gradient backward.
pub fn scatter_to_parallel(x: &Tensor, comm: Arc<dyn Collectives>, axis: usize, sizes: &[usize]) -> Result<Tensor> {
    check_sizes("scatter_to_parallel", x, axis, sizes, comm.as_ref(), true)?;
    let y = crate::no_grad(|| x.narrow(axis as isize, start_of(sizes, comm.rank()), sizes[comm.rank()]))?;
    let c = comm.clone();
    Ok(Tensor::from_custom_op(
        &y,
        "scatter_to_parallel",
        vec![x.clone()],
        Arc::new(move |g| Ok(vec![Some(c.all_gather(g, axis)?)])),
    ))
}
