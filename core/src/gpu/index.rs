//! Launchers for index_select, gather and their adjoints. Sources and indices are made contiguous
//! first; a bad index raises the device's fault flag (an `Err` at the next read-back).

use super::{GpuStorage, contiguous};
use crate::{DType, Layout, Result};

fn split(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    (shape[..axis].iter().product(), shape[axis], shape[axis + 1..].iter().product())
}

fn contig(s: &GpuStorage, l: &Layout) -> Result<GpuStorage> {
    if l.is_contiguous() && l.offset() == 0 { Ok(s.clone()) } else { contiguous(s, l) }
}

fn run(
    entry: &'static str,
    src: &GpuStorage,
    ids: &GpuStorage,
    out: &GpuStorage,
    n: usize,
    info: [usize; 4],
) -> Result<()> {
    let kernel = if entry.ends_with("_add") { "index_add" } else { "index" };
    let info: Vec<u32> = std::iter::once(n).chain(info).map(|x| x as u32).collect();
    let ctx = &src.ctx;
    ctx.dispatch(kernel, entry, &info, &[&src.buf, &ids.buf, &out.buf, &ctx.fault], ctx.grid_1d(n))
}

/// Entries `ids` (1-D) of `axis`.
pub fn index_select(s: &GpuStorage, l: &Layout, ids: &GpuStorage, li: &Layout, axis: usize) -> Result<GpuStorage> {
    let (outer, size, inner) = split(l.shape(), axis);
    let (src, ids) = (contig(s, l)?, contig(ids, li)?);
    let n = outer * li.numel() * inner;
    let out = GpuStorage::alloc(&s.ctx, n, DType::F32)?;
    run("index_select", &src, &ids, &out, n, [outer, size, inner, li.numel()])?;
    Ok(out)
}

/// torch.gather along `axis`: `ids` has the output's shape.
pub fn gather(s: &GpuStorage, l: &Layout, ids: &GpuStorage, li: &Layout, axis: usize) -> Result<GpuStorage> {
    let (outer, size, inner) = split(l.shape(), axis);
    let (src, ids) = (contig(s, l)?, contig(ids, li)?);
    let n = li.numel();
    let out = GpuStorage::alloc(&s.ctx, n, DType::F32)?;
    run("gather", &src, &ids, &out, n, [outer, size, inner, li.shape()[axis]])?;
    Ok(out)
}

/// Zeros of `shape` with the rows of `src` added at `ids` along `axis`.
pub fn index_add(
    shape: &[usize],
    axis: usize,
    ids: &GpuStorage,
    li: &Layout,
    src: &GpuStorage,
    ls: &Layout,
) -> Result<GpuStorage> {
    accumulate("index_add", shape, axis, ids, li, src, ls, li.numel())
}

/// Zeros of `shape` with each `src[p]` added where `ids[p]` points along `axis`.
pub fn scatter_add(
    shape: &[usize],
    axis: usize,
    ids: &GpuStorage,
    li: &Layout,
    src: &GpuStorage,
    ls: &Layout,
) -> Result<GpuStorage> {
    accumulate("scatter_add", shape, axis, ids, li, src, ls, li.shape()[axis])
}

/// The adjoints share everything but the entry point and how many ids lie along the axis.
#[allow(clippy::too_many_arguments)]
fn accumulate(
    entry: &'static str,
    shape: &[usize],
    axis: usize,
    ids: &GpuStorage,
    li: &Layout,
    src: &GpuStorage,
    ls: &Layout,
    n_ids: usize,
) -> Result<GpuStorage> {
    let (outer, size, inner) = split(shape, axis);
    let (x, ids) = (contig(src, ls)?, contig(ids, li)?);
    let out = super::fill(&src.ctx, outer * size * inner, 0)?;
    run(entry, &x, &ids, &out, ls.numel(), [outer, size, inner, n_ids])?;
    Ok(out)
}
