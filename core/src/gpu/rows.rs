//! Launchers for kernels that give a workgroup a run of elements: reductions, softmax, layer norm.

use super::{GpuStorage, check_rank, push_dims};
use crate::ops::ReduceOp;
use crate::{DType, Layout, Result};

/// Runs shorter than this are reduced by one invocation each (`main_small`); longer runs get a
/// workgroup each (`main`).
const SMALL_RUN: usize = 64;

/// Reduce `axes` (output: the input shape with reduced axes of size 1, contiguous).
pub fn reduce(op: ReduceOp, s: &GpuStorage, l: &Layout, axes: &[usize]) -> Result<GpuStorage> {
    check_rank(op.name(), l)?;
    let kept: Vec<usize> = (0..l.rank()).filter(|a| !axes.contains(a)).collect();
    let outer_shape: Vec<usize> = kept.iter().map(|&a| l.shape()[a]).collect();
    let outer_strides: Vec<usize> = kept.iter().map(|&a| l.strides()[a]).collect();
    let inner_shape: Vec<usize> = axes.iter().map(|&a| l.shape()[a]).collect();
    let inner_strides: Vec<usize> = axes.iter().map(|&a| l.strides()[a]).collect();
    let n_out: usize = outer_shape.iter().product();
    let n_red: usize = inner_shape.iter().product();
    let dtype = if op == ReduceOp::ArgMax { DType::U32 } else { DType::F32 };
    let out = GpuStorage::alloc(&s.ctx, n_out, dtype)?;
    let mut info = vec![n_out as u32, n_red as u32, kept.len() as u32, axes.len() as u32, l.offset() as u32];
    push_dims(&mut info, &outer_shape, 1);
    push_dims(&mut info, &outer_strides, 0);
    push_dims(&mut info, &inner_shape, 1);
    push_dims(&mut info, &inner_strides, 0);
    let kernel = format!("reduce/{}", op.name());
    if n_red < SMALL_RUN {
        s.ctx.dispatch(&kernel, "main_small", &info, &[&s.buf, &out.buf], s.ctx.grid_1d(n_out))?;
    } else {
        s.ctx.dispatch(&kernel, "main", &info, &[&s.buf, &out.buf], s.ctx.grid_for(n_out))?;
    }
    Ok(out)
}

/// `info` head shared by the row kernels: rows, row length, outer rank, offset, last stride.
fn row_info(l: &Layout) -> (Vec<u32>, usize) {
    let r = l.rank();
    let n = l.shape()[r - 1];
    let rows = l.numel() / n.max(1);
    let info = vec![rows as u32, n as u32, (r - 1) as u32, l.offset() as u32, l.strides()[r - 1] as u32];
    (info, rows)
}

fn push_outer(info: &mut Vec<u32>, l: &Layout) {
    let r = l.rank();
    push_dims(info, &l.shape()[..r - 1], 1);
    push_dims(info, &l.strides()[..r - 1], 0);
}

/// Softmax or log-softmax over the last axis.
pub fn softmax(s: &GpuStorage, l: &Layout, log: bool) -> Result<GpuStorage> {
    check_rank("softmax", l)?;
    let out = GpuStorage::alloc(&s.ctx, l.numel(), DType::F32)?;
    let (mut info, rows) = row_info(l);
    push_outer(&mut info, l);
    let kernel = if log { "softmax/log" } else { "softmax/softmax" };
    s.ctx.dispatch(kernel, "main", &info, &[&s.buf, &out.buf], s.ctx.grid_for(rows))?;
    Ok(out)
}

/// Layer norm over the last axis; `gamma` and `beta` must be contiguous vectors.
pub fn layer_norm(s: &GpuStorage, l: &Layout, gamma: &GpuStorage, beta: &GpuStorage, eps: f32) -> Result<GpuStorage> {
    check_rank("layer_norm", l)?;
    let out = GpuStorage::alloc(&s.ctx, l.numel(), DType::F32)?;
    let (mut info, rows) = row_info(l);
    info.push(eps.to_bits());
    push_outer(&mut info, l);
    s.ctx.dispatch("layer_norm", "main", &info, &[&s.buf, &gamma.buf, &beta.buf, &out.buf], s.ctx.grid_for(rows))?;
    Ok(out)
}
