//! Row-wise ops over the last axis on the Cpu: softmax, log-softmax, layer norm. Row sums are
//! pairwise (`pairwise_sum`), so a long row is as accurate as a short one.
//!
//! Each row is a few plain loops over slices (maximum, exponentials, sum, scale) that vectorise;
//! where the CPU has AVX2 the same loops run compiled for it (no fused multiply-adds: the same
//! bits). Rows go to the cores in groups, so short rows (attention's 32 keys) do not cost a task
//! each.

use super::reduce::pairwise_sum;
use super::{CpuStorage, f32_storage, strided, try_zeros};
use crate::fast_exp::exp;
use crate::{Layout, Result};
use rayon::prelude::*;

/// Rows per task are grouped to about this many elements.
const TASK: usize = 1 << 14;

/// `f(out_row, in_row)` for every row of `n` elements, in parallel over groups of rows.
fn for_rows(out: &mut [f32], x: &[f32], n: usize, f: impl Fn(&mut [f32], &[f32]) + Sync) {
    let per = (TASK / n).max(1) * n;
    let group = |o: &mut [f32], r: &[f32]| o.chunks_mut(n).zip(r.chunks(n)).for_each(|(o, r)| f(o, r));
    if out.len() <= per || super::one_thread() {
        group(out, x);
    } else {
        out.par_chunks_mut(per).zip(x.par_chunks(per)).for_each(|(o, r)| group(o, r));
    }
}

/// Softmax (or log-softmax) over the last axis, numerically stable (the row max is subtracted first).
pub fn softmax(s: &CpuStorage, l: &Layout, log: bool) -> Result<CpuStorage> {
    let x = strided(s.f32s("softmax")?, l)?;
    let n = *l.shape().last().unwrap_or(&1);
    let mut out = try_zeros(x.len())?;
    if n == 0 {
        return Ok(f32_storage(out));
    }
    #[cfg(target_arch = "x86_64")]
    if super::elementwise::avx2() {
        // SAFETY: the CPU has AVX2 (checked at run time).
        for_rows(&mut out, &x, n, |o, r| unsafe { softmax_row_avx2(o, r, log) });
        return Ok(f32_storage(out));
    }
    for_rows(&mut out, &x, n, |o, r| softmax_row(o, r, log));
    Ok(f32_storage(out))
}

/// The smallest difference from a row's maximum whose exponential a softmax computes: `exp(-87)`
/// is about 1.6e-38, just above the smallest normal float. An attention mask's -1e9 lands below
/// it: measured on a 2-core Zen 3, a softmax over 8 x 12 x 32 x 32 scores with a fifth of the keys
/// masked took about 1.4x as long as unmasked while its exponentials went through subnormals.
const FLOOR: f32 = -87.0;

#[inline(always)]
fn softmax_row(o: &mut [f32], r: &[f32], log: bool) {
    let max = row_max(r);
    // The exponentials go to the output first: one vectorised pass, then a pairwise sum of them.
    // A NaN in the row makes its exponential NaN, so the sum and then every output NaN.
    for (o, &v) in o.iter_mut().zip(r) {
        let x = v - max;
        // Below FLOOR the weight is 0 (under 2e-38 of the largest): computed, it would pass
        // through subnormal floats, a slow path of the CPU, once for every masked score.
        let e = exp(if x < FLOOR { FLOOR } else { x });
        *o = if x < FLOOR { 0.0 } else { e };
    }
    let sum = pairwise_sum(o);
    if log {
        let ls = sum.ln();
        for (o, &v) in o.iter_mut().zip(r) {
            *o = v - max - ls;
        }
    } else {
        for o in o.iter_mut() {
            *o /= sum;
        }
    }
}

/// # Safety
/// The CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn softmax_row_avx2(o: &mut [f32], r: &[f32], log: bool) {
    softmax_row(o, r, log)
}

/// The largest value of a row, NaNs passed over (the caller's sum brings them back), in eight
/// lanes so the loop vectorises.
#[inline(always)]
fn row_max(r: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 8];
    let mut chunks = r.chunks_exact(8);
    for c in &mut chunks {
        for (l, &v) in lanes.iter_mut().zip(c) {
            *l = if v > *l { v } else { *l };
        }
    }
    let tail = chunks.remainder().iter().copied();
    lanes.into_iter().chain(tail).fold(f32::NEG_INFINITY, |m, v| if v > m { v } else { m })
}

/// Layer norm over the last axis: `(x - mean) / sqrt(var + eps) * gamma + beta`.
pub fn layer_norm(
    s: &CpuStorage,
    l: &Layout,
    gamma: &CpuStorage,
    lg: &Layout,
    beta: &CpuStorage,
    lb: &Layout,
    eps: f32,
) -> Result<CpuStorage> {
    let x = strided(s.f32s("layer_norm")?, l)?;
    let g = strided(gamma.f32s("layer_norm")?, lg)?;
    let b = strided(beta.f32s("layer_norm")?, lb)?;
    let n = *l.shape().last().unwrap_or(&1);
    let mut out = try_zeros(x.len())?;
    if n == 0 {
        return Ok(f32_storage(out));
    }
    let (g, b) = (&g[..n], &b[..n]);
    #[cfg(target_arch = "x86_64")]
    if super::elementwise::avx2() {
        // SAFETY: the CPU has AVX2 (checked at run time).
        for_rows(&mut out, &x, n, |o, r| unsafe { layer_norm_row_avx2(o, r, g, b, eps) });
        return Ok(f32_storage(out));
    }
    for_rows(&mut out, &x, n, |o, r| layer_norm_row(o, r, g, b, eps));
    Ok(f32_storage(out))
}

/// One row; a NaN (or an infinity, whose deviation is NaN) makes the mean or variance NaN, and so
/// the row.
#[inline(always)]
fn layer_norm_row(o: &mut [f32], r: &[f32], g: &[f32], b: &[f32], eps: f32) {
    let n = r.len() as f32;
    let mean = pairwise_sum(r) / n;
    // The squared deviations go to the output first, to be summed as a slice.
    for (o, &v) in o.iter_mut().zip(r) {
        *o = (v - mean) * (v - mean);
    }
    let var = pairwise_sum(o) / n;
    let rstd = 1.0 / (var + eps).sqrt();
    for (((o, &v), &g), &b) in o.iter_mut().zip(r).zip(g).zip(b) {
        *o = (v - mean) * rstd * g + b;
    }
}

/// # Safety
/// The CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn layer_norm_row_avx2(o: &mut [f32], r: &[f32], g: &[f32], b: &[f32], eps: f32) {
    layer_norm_row(o, r, g, b, eps)
}
