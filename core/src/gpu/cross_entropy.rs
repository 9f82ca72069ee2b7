//! Launchers for sparse cross-entropy's two kernels: each row's log-softmax at its label
//! (cross_entropy.wgsl), and the logits' gradient (cross_entropy_grad.wgsl).

use super::fault::{FaultSlot, SLOT_BYTES};
use super::rows::{LONG_ROW, row_entry};
use super::{GpuStorage, check_layout};
use crate::{DType, Error, Layout, Result};
use std::sync::Arc;

/// How a bad label's message names the labels.
pub(crate) const LABELS: &str = "cross_entropy's labels";

/// What the backward needs of the forward: the labels (contiguous u32) and each row's max and
/// log of its exponentials' sum, `[rows, 2]`.
pub struct Picked {
    ids: GpuStorage,
    stats: GpuStorage,
}

/// `[rows]` picks, each row's log-softmax at its label, for `[rows, classes]` logits `x` and
/// `rows` u32 labels `ids` (any layouts), with what the backward needs; `None` for rows too long
/// for one workgroup (the caller composes them). A label past the row is an `Err` when the picks,
/// or anything computed from them, are read: `to_index_later`'s, naming [`LABELS`].
pub fn log_softmax_pick(
    x: &GpuStorage,
    lx: &Layout,
    ids: &GpuStorage,
    li: &Layout,
) -> Result<Option<(GpuStorage, Picked)>> {
    if lx.rank() != 2 || lx.shape()[1] > LONG_ROW || li.numel() != lx.shape()[0] {
        return Ok(None);
    }
    let (rows, classes) = (lx.shape()[0], lx.shape()[1]);
    check_layout("cross_entropy", lx)?;
    let ctx = &x.ctx;
    // (The fault slot reads a bad label back from its flat position in a contiguous buffer.)
    let ids = super::index::contig(ids, li)?;
    let mut picked = GpuStorage::alloc(ctx, rows, DType::F32)?;
    let stats = GpuStorage::alloc(ctx, 2 * rows, DType::F32)?;
    let info = [rows, classes, lx.offset(), lx.strides()[0], lx.strides()[1]].map(|v| v as u32);
    let buf = ctx.upload(&[0; SLOT_BYTES as usize])?;
    // (Named as `to_index_later` names labels, so that a caller need not check them first.)
    let contiguous = Layout::contiguous(&[rows]);
    let slot =
        Arc::new(FaultSlot::values(LABELS, DType::U32, Some(classes), &contiguous, buf.clone(), ids.buf.clone()));
    let (entry, grid) = row_entry(ctx, rows, classes);
    ctx.dispatch_faulting(
        "cross_entropy",
        entry,
        &info,
        &[&x.buf, &ids.buf, &picked.buf, &stats.buf, &buf],
        grid,
        &slot,
    )?;
    picked.faults.push(slot);
    let picked = picked.inherit(&[x, &ids]);
    let stats = stats.inherit(&[&picked]);
    Ok(Some((picked, Picked { ids, stats })))
}

/// The logits' gradient of [`log_softmax_pick`], contiguous, given `g` (`[rows]` or `[rows, 1]`
/// in any layout), the gradient of the picks: one pass.
pub fn log_softmax_pick_grad(
    x: &GpuStorage,
    lx: &Layout,
    p: &Picked,
    g: &GpuStorage,
    lg: &Layout,
) -> Result<GpuStorage> {
    let (rows, classes) = (lx.shape()[0], lx.shape()[1]);
    check_layout("cross_entropy", lg)?;
    if lg.numel() != rows || lg.rank() == 0 {
        return Err(Error::invalid(
            "cross_entropy",
            format!("the gradient of {rows} picks has shape {:?}", lg.shape()),
        ));
    }
    let dx = GpuStorage::alloc(&x.ctx, rows * classes, DType::F32)?;
    let info =
        [rows, classes, lx.offset(), lx.strides()[0], lx.strides()[1], lg.offset(), lg.strides()[0]].map(|v| v as u32);
    let buffers = [&x.buf, &p.ids.buf, &p.stats.buf, &g.buf, &dx.buf];
    x.ctx.dispatch("cross_entropy_grad", "main", &info, &buffers, x.ctx.grid_1d(rows * classes))?;
    Ok(dx.inherit(&[x, &p.stats, g]))
}
