//! Launcher for the tiled, strided, batched matmul kernel.

use super::GpuStorage;
use crate::{DType, Error, Layout, Result};

/// Batch axes the kernel locates by their strides; more are folded by the caller.
const MAX_BATCH_RANK: usize = 4;

/// `a @ b` for `[batch.., m, k]` and `[batch.., k, n]` layouts with one batch shape.
pub fn matmul(a: &GpuStorage, la: &Layout, b: &GpuStorage, lb: &Layout) -> Result<GpuStorage> {
    let r = la.rank();
    let (m, k, n) = (la.shape()[r - 2], la.shape()[r - 1], lb.shape()[r - 1]);
    let batch_shape = &la.shape()[..r - 2];
    if batch_shape.len() > MAX_BATCH_RANK {
        return Err(Error::invalid(
            "matmul",
            format!(
                "at most {MAX_BATCH_RANK} batch axes on the GPU, got shape {:?}",
                la.shape()
            ),
        ));
    }
    let nb: usize = batch_shape.iter().product();
    let out = GpuStorage::alloc(&a.ctx, nb * m * n, DType::F32)?;
    if m * n == 0 {
        return Ok(out);
    }
    if k == 0 {
        return super::fill(&a.ctx, nb * m * n, 0);
    }
    let push4 = |info: &mut Vec<u32>, v: &[usize], pad: u32| {
        info.extend(v.iter().map(|&x| x as u32));
        info.extend(std::iter::repeat_n(pad, MAX_BATCH_RANK - v.len()));
    };
    let max_z = a.ctx.limits.max_compute_workgroups_per_dimension as usize;
    let groups_x = n.div_ceil(64) as u32;
    let groups_y = m.div_ceil(64) as u32;
    // Batches beyond the z limit go in further dispatches, each starting at `batch_start`.
    let mut start = 0;
    while start < nb {
        let count = (nb - start).min(max_z);
        let mut info = vec![
            m as u32,
            n as u32,
            k as u32,
            la.offset() as u32,
            lb.offset() as u32,
            la.strides()[r - 2] as u32,
            la.strides()[r - 1] as u32,
            lb.strides()[r - 2] as u32,
            lb.strides()[r - 1] as u32,
            start as u32,
        ];
        push4(&mut info, batch_shape, 1);
        push4(&mut info, &la.strides()[..r - 2], 0);
        push4(&mut info, &lb.strides()[..r - 2], 0);
        info.push(batch_shape.len() as u32);
        a.ctx.dispatch(
            "matmul/tiled",
            "main",
            &info,
            &[&a.buf, &b.buf, &out.buf],
            [groups_x, groups_y, count as u32],
        )?;
        start += count;
    }
    Ok(out)
}
