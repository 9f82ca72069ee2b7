//! Launchers for index_select, gather and their adjoints. Sources and indices are made contiguous
//! first. Each dispatch gets a fault slot of its own, and its output carries it: a bad index is
//! an `Err` when that output, or anything computed from it, is read (see `fault.rs`).

use super::fault::{FaultSlot, SLOT_BYTES};
use super::{GpuStorage, check_rank, contiguous, push_dims};
use crate::{DType, Layout, Result};
use std::sync::Arc;

fn split(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    (shape[..axis].iter().product(), shape[axis], shape[axis + 1..].iter().product())
}

/// `s` as it is where `l` is contiguous from its start, else a contiguous copy of `l`.
pub(super) fn contig(s: &GpuStorage, l: &Layout) -> Result<GpuStorage> {
    if l.is_contiguous() && l.offset() == 0 { Ok(s.clone()) } else { contiguous(s, l) }
}

fn run(
    entry: &'static str,
    src: &GpuStorage,
    ids: &GpuStorage,
    out: &mut GpuStorage,
    n: usize,
    info: [usize; 4],
) -> Result<()> {
    let kernel = if entry.ends_with("_add") { "index_add" } else { "index" };
    let info: Vec<u32> = std::iter::once(n).chain(info).map(|x| x as u32).collect();
    let ctx = &src.ctx;
    // A zeroed slot: the upload lands before any work submitted after it.
    let buf = ctx.upload(&[0; SLOT_BYTES as usize])?;
    let slot = Arc::new(FaultSlot::new(entry, info[2] as usize, buf.clone(), ids.buf.clone()));
    ctx.dispatch_faulting(kernel, entry, &info, &[&src.buf, &ids.buf, &out.buf, &buf], ctx.grid_1d(n), &slot)?;
    out.faults.push(slot);
    Ok(())
}

/// Entries `ids` (1-D) of `axis`.
pub fn index_select(s: &GpuStorage, l: &Layout, ids: &GpuStorage, li: &Layout, axis: usize) -> Result<GpuStorage> {
    let (outer, size, inner) = split(l.shape(), axis);
    let (src, ids) = (contig(s, l)?, contig(ids, li)?);
    let n = outer * li.numel() * inner;
    let mut out = GpuStorage::alloc(&s.ctx, n, DType::F32)?;
    run("index_select", &src, &ids, &mut out, n, [outer, size, inner, li.numel()])?;
    Ok(out)
}

/// torch.gather along `axis`: `ids` has the output's shape.
pub fn gather(s: &GpuStorage, l: &Layout, ids: &GpuStorage, li: &Layout, axis: usize) -> Result<GpuStorage> {
    let (outer, size, inner) = split(l.shape(), axis);
    let (src, ids) = (contig(s, l)?, contig(ids, li)?);
    let n = li.numel();
    let mut out = GpuStorage::alloc(&s.ctx, n, DType::F32)?;
    run("gather", &src, &ids, &mut out, n, [outer, size, inner, li.shape()[axis]])?;
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
    let mut out = super::fill(&src.ctx, outer * size * inner, 0)?;
    run(entry, &x, &ids, &mut out, ls.numel(), [outer, size, inner, n_ids])?;
    Ok(out)
}

/// Check that the values of `l` (of `dtype`: f32, i32 or u32) are valid u32 indices below `bound`
/// and convert them, in one pass on the device. `defer`: the output carries the check as a fault
/// slot, reported by the first read of anything computed from it, and nothing waits here;
/// otherwise the verdict (the first bad flat position) is read back now.
pub fn index_check(
    s: &GpuStorage,
    l: &Layout,
    dtype: DType,
    bound: Option<usize>,
    (what, defer): (&str, bool),
) -> Result<(GpuStorage, Option<usize>)> {
    check_rank("to_index", l)?;
    // A bound past u32 adds nothing: the kernel already refuses values from 2^32 up.
    let (bound32, has_bound) = match bound {
        Some(b) if b <= u32::MAX as usize => (b as u32, 1),
        _ => (0, 0),
    };
    let n = l.numel();
    let mut out = GpuStorage::alloc(&s.ctx, n, DType::U32)?.inherit(&[s]);
    let verdict = s.ctx.upload(&[0; SLOT_BYTES as usize])?;
    let mut info = vec![n as u32, l.rank() as u32, l.offset() as u32, bound32, has_bound];
    push_dims(&mut info, l.shape(), 1);
    push_dims(&mut info, l.strides(), 0);
    let kernel = format!("index_check/{}", dtype.name());
    let buffers = [&s.buf, &out.buf, &verdict];
    if defer {
        let slot = Arc::new(FaultSlot::values(what, dtype, bound, l, verdict.clone(), s.buf.clone()));
        s.ctx.dispatch_faulting(&kernel, "main", &info, &buffers, s.ctx.grid_1d(n), &slot)?;
        out.faults.push(slot);
        return Ok((out, None));
    }
    s.ctx.dispatch(&kernel, "main", &info, &buffers, s.ctx.grid_1d(n))?;
    let b = s.ctx.read(&verdict, 0, SLOT_BYTES, &s.faults)?;
    let word = |i: usize| u32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]]);
    Ok((out, (word(0) != 0).then(|| !word(2) as usize)))
}
