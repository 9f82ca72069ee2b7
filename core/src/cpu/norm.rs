//! Row-wise ops over the last axis on the Cpu: softmax, log-softmax, layer norm. Row sums are
//! pairwise (`pairwise_sum`), so a long row is as accurate as a short one.

use super::reduce::pairwise_sum;
use super::{CpuStorage, f32_storage, strided, try_zeros};
use crate::fast_exp::exp;
use crate::{Layout, Result};
use rayon::prelude::*;

/// Softmax (or log-softmax) over the last axis, numerically stable (the row max is subtracted first).
pub fn softmax(s: &CpuStorage, l: &Layout, log: bool) -> Result<CpuStorage> {
    let x = strided(s.f32s("softmax")?, l)?;
    let n = *l.shape().last().unwrap_or(&1);
    let mut out = try_zeros(x.len())?;
    if n == 0 {
        return Ok(f32_storage(out));
    }
    // A row holding a NaN has a NaN max, so it comes out all NaN (f32::max would skip the NaN).
    let nan_max = |a: f32, b: f32| if a.is_nan() || b.is_nan() { f32::NAN } else { a.max(b) };
    out.par_chunks_mut(n).zip(x.par_chunks(n)).for_each(|(o, r)| {
        let max = r.iter().copied().fold(f32::NEG_INFINITY, nan_max);
        // The exponentials go to the output first: one vectorised pass, then a pairwise sum of them.
        for (o, &v) in o.iter_mut().zip(r) {
            *o = exp(v - max);
        }
        let sum = pairwise_sum(o.iter().copied());
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
    });
    Ok(f32_storage(out))
}

/// Layer norm over the last axis: `(x - mean) / sqrt(var + eps) * gamma + beta`.
/// Also returns the per-row mean and reciprocal standard deviation, which the backward pass uses.
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
    // A NaN (or an infinity, whose deviation is NaN) makes the mean or variance NaN, and so the row.
    out.par_chunks_mut(n).zip(x.par_chunks(n)).for_each(|(o, r)| {
        let mean = pairwise_sum(r.iter().copied()) / n as f32;
        let var = pairwise_sum(r.iter().map(|&v| (v - mean) * (v - mean))) / n as f32;
        let rstd = 1.0 / (var + eps).sqrt();
        for i in 0..n {
            o[i] = (r[i] - mean) * rstd * g[i] + b[i];
        }
    });
    Ok(f32_storage(out))
}
