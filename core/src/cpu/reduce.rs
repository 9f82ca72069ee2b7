//! Reductions on the Cpu over any set of axes; the result keeps reduced axes as size 1.

use super::{CpuStorage, f32_storage};
use crate::ops::ReduceOp;
use crate::{Layout, Result};
use rayon::prelude::*;
use std::sync::Arc;

/// Reduce `axes` of a layout. The output is contiguous with the input's shape, reduced axes set to 1.
pub fn reduce(op: ReduceOp, s: &CpuStorage, l: &Layout, axes: &[usize]) -> Result<CpuStorage> {
    let data = s.f32s(op.name())?;
    // Move kept axes first and reduced axes last: each output element then owns one run of the
    // reduced index space, read through the permuted strides.
    let kept: Vec<usize> = (0..l.rank()).filter(|a| !axes.contains(a)).collect();
    let order: Vec<usize> = kept.iter().chain(axes.iter()).copied().collect();
    let p = l.permute(&order)?;
    let n_out: usize = kept.iter().map(|&a| l.shape()[a]).product();
    let inner = Layout::new(p.shape()[kept.len()..].into(), p.strides()[kept.len()..].into(), 0);
    let outer = Layout::new(p.shape()[..kept.len()].into(), p.strides()[..kept.len()].into(), p.offset());
    let inner_offs: Vec<usize> = inner.offsets().collect();
    let outer_offs: Vec<usize> = outer.offsets().collect();
    debug_assert_eq!(outer_offs.len(), n_out);
    let run = |base: usize| -> (f32, u32) {
        let it = inner_offs.iter().map(|&o| data[base + o]);
        match op {
            ReduceOp::Sum => (it.sum(), 0),
            ReduceOp::Max => (it.fold(f32::NEG_INFINITY, f32::max), 0),
            ReduceOp::Min => (it.fold(f32::INFINITY, f32::min), 0),
            ReduceOp::ArgMax => {
                let (mut best, mut idx) = (f32::NEG_INFINITY, 0u32);
                for (i, v) in it.enumerate() {
                    if v > best || (i == 0) {
                        best = v;
                        idx = i as u32;
                    }
                }
                (best, idx)
            }
        }
    };
    let results: Vec<(f32, u32)> = if n_out >= 64 && inner_offs.len() * n_out >= 1 << 15 {
        outer_offs.par_iter().map(|&b| run(b)).collect()
    } else {
        outer_offs.iter().map(|&b| run(b)).collect()
    };
    Ok(match op {
        ReduceOp::ArgMax => CpuStorage::U32(Arc::new(results.into_iter().map(|r| r.1).collect())),
        _ => f32_storage(results.into_iter().map(|r| r.0).collect()),
    })
}
