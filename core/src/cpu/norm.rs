//! Row-wise ops over the last axis on the Cpu: softmax, log-softmax, layer norm.

use super::{CpuStorage, f32_storage, strided, zeros};
use crate::{Layout, Result};
use rayon::prelude::*;

/// Softmax (or log-softmax) over the last axis, numerically stable (the row max is subtracted first).
pub fn softmax(s: &CpuStorage, l: &Layout, log: bool) -> Result<CpuStorage> {
    let x = strided(s.f32s("softmax")?, l);
    let n = *l.shape().last().unwrap_or(&1);
    let mut out = zeros(x.len());
    if n == 0 {
        return Ok(f32_storage(out));
    }
    out.par_chunks_mut(n).zip(x.par_chunks(n)).for_each(|(o, r)| {
        let max = r.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum: f32 = r.iter().map(|&v| (v - max).exp()).sum();
        for (o, &v) in o.iter_mut().zip(r) {
            *o = if log { v - max - sum.ln() } else { (v - max).exp() / sum };
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
    let x = strided(s.f32s("layer_norm")?, l);
    let g = strided(gamma.f32s("layer_norm")?, lg);
    let b = strided(beta.f32s("layer_norm")?, lb);
    let n = *l.shape().last().unwrap_or(&1);
    let mut out = zeros(x.len());
    if n == 0 {
        return Ok(f32_storage(out));
    }
    out.par_chunks_mut(n).zip(x.par_chunks(n)).for_each(|(o, r)| {
        let mean = r.iter().sum::<f32>() / n as f32;
        let var = r.iter().map(|&v| (v - mean) * (v - mean)).sum::<f32>() / n as f32;
        let rstd = 1.0 / (var + eps).sqrt();
        for i in 0..n {
            o[i] = (r[i] - mean) * rstd * g[i] + b[i];
        }
    });
    Ok(f32_storage(out))
}
