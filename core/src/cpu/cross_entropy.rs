//! Sparse cross-entropy's row work on the Cpu, one pass each way. Composed, it is a
//! log-softmax, a `gather` of each row's label, and for the gradient a `scatter_add` into zeros
//! and log-softmax's backward (`softmax_grad`): three `[rows, classes]` arrays made and walked,
//! and the log-softmax kept for the backward. Here the forward keeps three
//! numbers a row (its label, its maximum and the log of its exponentials' sum), and the backward
//! writes its one array in one pass, working each log-softmax value out again from them and the
//! logits.
//!
//! Both give the composed ops' bits: per value the same arithmetic in the same order (the row's
//! sums as `norm::softmax_rows` forms them; the gradient's row sum, which has one value that is
//! not 0, is that value plus 0), so a model trains the same whichever ran.

use super::norm::{RowIsa, TASK, row_isa, row_log_stats};
use super::{CpuStorage, f32_storage, strided, try_take};
use crate::{Error, Layout, Result};
use std::mem::MaybeUninit;

/// What the backward needs of the forward: each row's label, and its `(max, ln(sum))`.
pub struct Picked {
    labels: Vec<u32>,
    stats: Vec<(f32, f32)>,
}

/// Each row's log-softmax at its label, `[rows]`: `x` is `[rows, classes]` f32 in any layout,
/// `labels` `rows` indices (u32 or i32, any layout). A label outside `0..classes` is an `Err`
/// naming it and its row.
pub fn log_softmax_pick(s: &CpuStorage, l: &Layout, labels: &CpuStorage, li: &Layout) -> Result<(CpuStorage, Picked)> {
    let x = strided(s.f32s("cross_entropy")?, l)?;
    let c = l.shape().last().copied().unwrap_or(1);
    let rows: usize = l.shape()[..l.rank().saturating_sub(1)].iter().product();
    let labels = checked_labels(labels, li, rows, c)?;
    let mut out = Vec::new();
    out.try_reserve_exact(rows).map_err(|_| super::reduce::oom(rows * 12))?;
    out.resize(rows, (0f32, 0f32, 0f32));
    let per = (TASK / c.max(1)).max(1);
    // One scratch row per thread at work (a vocabulary's row is a few hundred KiB).
    super::share::try_par_chunks_mut(&mut out, per, |scratch: &mut Vec<f32>, t, out| {
        if scratch.len() < c {
            scratch.try_reserve_exact(c).map_err(|_| super::reduce::oom(c * 4))?;
            scratch.resize(c, 0.0);
        }
        let r0 = t * per;
        let (x, labels, scratch) = (&x[r0 * c..(r0 + out.len()) * c], &labels[r0..r0 + out.len()], &mut scratch[..c]);
        // The softmax's choice of loops (fused multiply-adds where it fuses them): its bits.
        match row_isa() {
            // SAFETY: row_isa saw AVX2 and FMA.
            #[cfg(target_arch = "x86_64")]
            RowIsa::Fma => unsafe { pick_rows_fma(x, labels, scratch, out) },
            // SAFETY: row_isa saw AVX2.
            #[cfg(target_arch = "x86_64")]
            RowIsa::Avx2 => unsafe { pick_rows_avx2(x, labels, scratch, out) },
            _ => pick_rows::<false>(x, labels, scratch, out),
        }
        Ok(())
    })?;
    let mut picked = try_take(rows)?;
    picked.extend(out.iter().map(|o| o.0));
    let stats = out.into_iter().map(|o| (o.1, o.2)).collect();
    Ok((f32_storage(picked), Picked { labels, stats }))
}

/// `rows` labels as indices below `c`: an `Err` names a label that is not one (negative, or
/// `c` or more) and its row.
fn checked_labels(labels: &CpuStorage, li: &Layout, rows: usize, c: usize) -> Result<Vec<u32>> {
    if li.numel() != rows {
        return Err(Error::invalid("cross_entropy", format!("{} labels for {rows} rows", li.numel())));
    }
    let bad = |r: usize, label: String| {
        Error::invalid("cross_entropy", format!("label {label} of row {r} is not one of the {c} classes"))
    };
    let out: Vec<u32> = match labels {
        CpuStorage::U32(v) => li.offsets().map(|o| v[o]).collect(),
        CpuStorage::I32(v) => li
            .offsets()
            .enumerate()
            .map(|(r, o)| u32::try_from(v[o]).map_err(|_| bad(r, v[o].to_string())))
            .collect::<Result<_>>()?,
        s => return Err(Error::DType { op: "cross_entropy", expected: "u32 or i32", got: s.dtype() }),
    };
    match out.iter().position(|&i| i as usize >= c) {
        Some(r) => Err(bad(r, out[r].to_string())),
        None => Ok(out),
    }
}

/// The rows' picks and stats, as the log-softmax would give them: `v - max - ln(sum)`.
#[inline(always)]
fn pick_rows<const FUSED: bool>(x: &[f32], labels: &[u32], scratch: &mut [f32], out: &mut [(f32, f32, f32)]) {
    let c = scratch.len();
    for ((r, &label), o) in x.chunks_exact(c).zip(labels).zip(out) {
        let (max, ls) = row_log_stats::<FUSED>(r, scratch);
        *o = (r[label as usize] - max - ls, max, ls);
    }
}

/// # Safety
/// The CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn pick_rows_fma(x: &[f32], labels: &[u32], scratch: &mut [f32], out: &mut [(f32, f32, f32)]) {
    pick_rows::<true>(x, labels, scratch, out)
}

/// # Safety
/// The CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn pick_rows_avx2(x: &[f32], labels: &[u32], scratch: &mut [f32], out: &mut [(f32, f32, f32)]) {
    pick_rows::<false>(x, labels, scratch, out)
}

/// The gradient of [`log_softmax_pick`] with respect to `x` (the same `s` and `l`), given `g`,
/// the gradient of its `rows` picks (any layout): `[rows, classes]`, value `j` of row `r` being
/// `(v if j is the label, else 0) - exp(x - max - ln(sum)) * v` with `v = 0 + g[r]`, as the
/// composed ops form it. The logits must be those the forward read.
pub fn log_softmax_pick_grad(
    s: &CpuStorage,
    l: &Layout,
    p: &Picked,
    g: &CpuStorage,
    lg: &Layout,
) -> Result<CpuStorage> {
    let x = strided(s.f32s("cross_entropy")?, l)?;
    let g = strided(g.f32s("cross_entropy")?, lg)?;
    let c = l.shape().last().copied().unwrap_or(1);
    let rows = p.labels.len();
    if x.len() != rows * c || g.len() != rows {
        let what = format!("{} logits and a gradient of {} values for {rows} rows of {c}", x.len(), g.len());
        return Err(Error::invalid("cross_entropy", what));
    }
    let mut d = try_take(rows * c)?;
    let out = &mut d.spare_capacity_mut()[..rows * c];
    let per = (TASK / c.max(1)).max(1) * c;
    let task = |t: usize, o: &mut [MaybeUninit<f32>]| {
        let r0 = t * per / c.max(1);
        #[cfg(target_arch = "x86_64")]
        if super::elementwise::avx2() {
            // SAFETY: the CPU has AVX2 (checked at run time).
            return unsafe { grad_rows_avx2(&x[r0 * c..], c, &g[r0..], p, r0, o) };
        }
        grad_rows(&x[r0 * c..], c, &g[r0..], p, r0, o)
    };
    if c > 0 {
        if rows * c <= TASK || super::one_thread() {
            out.chunks_mut(per).enumerate().for_each(|(t, o)| task(t, o));
        } else {
            super::par_chunks_mut(out, per, task);
        }
    }
    // SAFETY: the tasks wrote every value of every row.
    unsafe { d.set_len(rows * c) };
    Ok(f32_storage(d))
}

/// Rows `r0..` of the gradient, as many as `o` holds (rows of `c` values).
#[inline(always)]
fn grad_rows(x: &[f32], c: usize, g: &[f32], p: &Picked, r0: usize, o: &mut [MaybeUninit<f32>]) {
    for (i, (o, r)) in o.chunks_mut(c).zip(x.chunks(c)).enumerate() {
        let (max, ls) = p.stats[r0 + i];
        let label = p.labels[r0 + i] as usize;
        // The scatter's `0 + g` (a gradient of -0 lands as +0), which is also the row's sum.
        let v = 0.0 + g[i];
        for (j, (o, &x)) in o.iter_mut().zip(r).enumerate() {
            let e = crate::fast_exp::exp(x - max - ls);
            o.write(if j == label { v } else { 0.0 } - e * v);
        }
    }
}

/// # Safety
/// The CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn grad_rows_avx2(x: &[f32], c: usize, g: &[f32], p: &Picked, r0: usize, o: &mut [MaybeUninit<f32>]) {
    grad_rows(x, c, g, p, r0, o)
}
