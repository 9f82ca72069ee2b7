//! Softmax and layer norm over rows too long for one workgroup, composed from the chunked
//! reductions and elementwise kernels. The fused kernels loop over a row three times in each
//! invocation; on a row of millions of elements that runs into llvmpipe's loop budget (65,535
//! iterations per invocation, then every loop silently stops) and leaves one workgroup doing the
//! work of the whole GPU. These rows are rare, so a few extra passes over memory cost little.

use super::{GpuStorage, binary, reduce, unary};
use crate::ops::{BinaryOp, ReduceOp, UnaryOp};
use crate::{Layout, Result};

/// The layout of a per-row value (contiguous `[.., 1]`) broadcast over rows of `shape`.
fn per_row(shape: &[usize]) -> Result<(Layout, Layout)> {
    let mut kept = shape.to_vec();
    if let Some(d) = kept.last_mut() {
        *d = 1;
    }
    let own = Layout::contiguous(&kept);
    let wide = own.broadcast_to(shape)?;
    Ok((own, wide))
}

/// Softmax or log-softmax over the last axis: `x - max`, its exp, the row sums, then a divide
/// (or a subtract of the log). A row holding a NaN has a NaN max, so it comes out all NaN.
pub(super) fn softmax(s: &GpuStorage, l: &Layout, log: bool) -> Result<GpuStorage> {
    let last = [l.rank() - 1];
    let c = Layout::contiguous(l.shape());
    let (own, wide) = per_row(l.shape())?;
    let max = reduce(ReduceOp::Max, s, l, &last)?;
    let d = binary(BinaryOp::Sub, s, l, &max, &wide)?;
    let e = unary(UnaryOp::Exp, &d, &c)?;
    let sum = reduce(ReduceOp::Sum, &e, &c, &last)?;
    if log {
        let log_sum = unary(UnaryOp::Log, &sum, &own)?;
        binary(BinaryOp::Sub, &d, &c, &log_sum, &wide)
    } else {
        binary(BinaryOp::Div, &e, &c, &sum, &wide)
    }
}

/// Layer norm over the last axis, two-pass as the fused kernel: mean, then the variance of the
/// deviations; `gamma` and `beta` are contiguous vectors.
pub(super) fn layer_norm(
    s: &GpuStorage,
    l: &Layout,
    gamma: &GpuStorage,
    beta: &GpuStorage,
    eps: f32,
) -> Result<GpuStorage> {
    let shape = l.shape();
    let n = shape[shape.len() - 1];
    let last = [l.rank() - 1];
    let c = Layout::contiguous(shape);
    let (own, wide) = per_row(shape)?;
    let vector = Layout::contiguous(&[n]).broadcast_to(shape)?;
    let inv_n = 1.0 / n as f32;
    let mean = unary(UnaryOp::Affine { mul: inv_n, add: 0.0 }, &reduce(ReduceOp::Sum, s, l, &last)?, &own)?;
    let xc = binary(BinaryOp::Sub, s, l, &mean, &wide)?;
    let sq = reduce(ReduceOp::Sum, &unary(UnaryOp::Square, &xc, &c)?, &c, &last)?;
    let rstd = unary(UnaryOp::Rsqrt, &unary(UnaryOp::Affine { mul: inv_n, add: eps }, &sq, &own)?, &own)?;
    let xhat = binary(BinaryOp::Mul, &xc, &c, &rstd, &wide)?;
    let scaled = binary(BinaryOp::Mul, &xhat, &c, gamma, &vector)?;
    binary(BinaryOp::Add, &scaled, &c, beta, &vector)
}
