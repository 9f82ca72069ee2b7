//! Row-wise ops over the last axis on the Cpu: softmax, log-softmax, layer norm. Row sums are
//! pairwise (`pairwise_sum`), so a long row is as accurate as a short one.
//!
//! Each row is a few plain loops over slices (maximum, exponentials, sum, scale) that vectorise;
//! where the CPU has AVX2 the same loops run compiled for it (no fused multiply-adds: the same
//! bits), and where it also has FMA a softmax's exponentials fuse theirs (within 2 ulp as well,
//! 1.26-1.35x faster softmaxes on a Zen 4; not the baseline's bits). Rows go to the cores in
//! groups, so short rows (attention's 32 keys) do not cost a task each, and short rows are taken
//! a few at a time, pass by pass (every row's maximum, then every row's exponentials, ...): one
//! short row's passes are each a short chain of dependent vector ops waiting on the one before,
//! while the rows of a group are independent and overlap.

use super::reduce::{pairwise_sum, pairwise_sums};
use super::{CpuStorage, f32_storage, strided, try_take};
use crate::{Layout, Result};
use std::mem::MaybeUninit;

/// Rows per task are grouped to about this many elements.
pub(super) const TASK: usize = 1 << 14;

/// Most rows taken side by side, pass by pass.
const SIDE: usize = 16;

/// How many rows of `n` values are taken side by side: about 1,024 values (4 KiB, in L1) at a
/// time, at most [`SIDE`]; rows of 1,024 values or more one at a time. Measured on one core of a
/// 2-core Zen 3, in cache, best of 6 alternated runs, row by row -> side by side (with no zero
/// fill of the output first): softmax over 12 x 32 x 32 scores 23.0 -> 20.7 us, layer norm over
/// 32 x 384 values 9.0 -> 7.6 us.
fn side_by_side(n: usize) -> usize {
    (1024 / n.max(1)).clamp(1, SIDE)
}

/// `f(out_rows, in_rows)` for groups of whole rows of `n` elements (at most
/// [`side_by_side`]`(n)` rows each), in parallel over tasks of rows; `f` writes every element of
/// its output rows. Returns the output, `x.len()` values written straight into a buffer's spare
/// room (no zero fill first).
fn for_rows(x: &[f32], n: usize, f: impl Fn(&mut [MaybeUninit<f32>], &[f32]) + Sync) -> Result<Vec<f32>> {
    let mut buf = try_take(x.len())?;
    let out = &mut buf.spare_capacity_mut()[..x.len()];
    let per = (TASK / n).max(1) * n;
    let side = side_by_side(n) * n;
    let group =
        |o: &mut [MaybeUninit<f32>], r: &[f32]| o.chunks_mut(side).zip(r.chunks(side)).for_each(|(o, r)| f(o, r));
    if out.len() <= per || super::one_thread() {
        group(out, x);
    } else {
        super::par_chunks_mut(out, per, |i, o| group(o, &x[i * per..i * per + o.len()]));
    }
    // SAFETY: `f` wrote every element of every group, and the groups cover `x.len()` values.
    unsafe { buf.set_len(x.len()) };
    Ok(buf)
}

/// A group's output rows once its first pass has written every element.
///
/// # Safety
/// Every element of `o` is initialised.
#[inline(always)]
unsafe fn written(o: &mut [MaybeUninit<f32>]) -> &mut [f32] {
    // SAFETY: the caller's; MaybeUninit<f32> has f32's layout.
    unsafe { &mut *(o as *mut [MaybeUninit<f32>] as *mut [f32]) }
}

/// How a softmax row's loops run on this CPU. One choice for every op that must give the
/// softmax's bits (`cross_entropy`'s fused pick): `Fma` changes them.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum RowIsa {
    /// Compiled for AVX2 and FMA, the exponentials' multiply-adds fused.
    Fma,
    /// Compiled for AVX2 (the baseline's bits).
    Avx2,
    /// The baseline.
    Plain,
}

/// This CPU's [`RowIsa`].
pub(super) fn row_isa() -> RowIsa {
    #[cfg(target_arch = "x86_64")]
    if super::elementwise::avx2_fma() {
        return RowIsa::Fma;
    }
    #[cfg(target_arch = "x86_64")]
    if super::elementwise::avx2() {
        return RowIsa::Avx2;
    }
    RowIsa::Plain
}

/// Softmax (or log-softmax) over the last axis, numerically stable (the row max is subtracted first).
pub fn softmax(s: &CpuStorage, l: &Layout, log: bool) -> Result<CpuStorage> {
    let x = strided(s.f32s("softmax")?, l)?;
    let n = *l.shape().last().unwrap_or(&1);
    if n == 0 || x.is_empty() {
        return Ok(f32_storage(Vec::new()));
    }
    let isa = row_isa();
    Ok(f32_storage(for_rows(&x, n, |o, r| match isa {
        // SAFETY: row_isa saw AVX2 and FMA.
        #[cfg(target_arch = "x86_64")]
        RowIsa::Fma => unsafe { softmax_rows_fma(o, r, n, log) },
        // SAFETY: row_isa saw AVX2.
        #[cfg(target_arch = "x86_64")]
        RowIsa::Avx2 => unsafe { softmax_rows_avx2(o, r, n, log) },
        _ => softmax_rows::<false>(o, r, n, log),
    })?))
}

/// The smallest difference from a row's maximum whose exponential a softmax computes: `exp(-87)`
/// is about 1.6e-38, just above the smallest normal float. An attention mask's -1e9 lands below
/// it: measured on a 2-core Zen 3, a softmax over 8 x 12 x 32 x 32 scores with a fifth of the keys
/// masked took about 1.4x as long as unmasked while its exponentials went through subnormals.
const FLOOR: f32 = -87.0;

/// Softmax over each row of `n` values of a group of at most [`SIDE`] rows, pass by pass.
#[inline(always)]
fn softmax_rows<const FUSED: bool>(o: &mut [MaybeUninit<f32>], r: &[f32], n: usize, log: bool) {
    let mut maxes = [0f32; SIDE];
    for (m, r) in maxes.iter_mut().zip(r.chunks(n)) {
        *m = row_max(r);
    }
    // The exponentials go to the output first: one vectorised pass, then a pairwise sum of them.
    // A NaN in the row makes its exponential NaN, so the sum and then every output NaN.
    for ((o, r), &max) in o.chunks_mut(n).zip(r.chunks(n)).zip(&maxes) {
        for (o, &v) in o.iter_mut().zip(r) {
            o.write(exp_below_max::<FUSED>(v - max));
        }
    }
    // SAFETY: the pass above wrote every element (`o` and `r` have one length).
    let o = unsafe { written(o) };
    let mut sums = [0f32; SIDE];
    pairwise_sums(o, n, &mut sums[..o.len() / n]);
    for (((o, r), &max), &sum) in o.chunks_mut(n).zip(r.chunks(n)).zip(&maxes).zip(&sums) {
        if log {
            let ls = sum.ln();
            for (o, &v) in o.iter_mut().zip(r) {
                *o = v - max - ls;
            }
        } else {
            // One division per row, then products (within an ulp and a half of a division per
            // value, which took an eighth of the softmax: 12 x 128 x 128 scores on one core of
            // a Zen 4, 0.90 -> 0.79 ns a value with the shortcut exponential below).
            let inv = 1.0 / sum;
            for o in o.iter_mut() {
                *o *= inv;
            }
        }
    }
}

/// A row's maximum and the log of its exponentials' sum, `(max, ln(sum))`, with
/// [`softmax_rows`]' arithmetic (its log-softmax is `v - max - ln(sum)`, bit for bit): the
/// exponentials go to `scratch` (as long as the row) to be summed pairwise.
#[inline(always)]
pub(super) fn row_log_stats<const FUSED: bool>(r: &[f32], scratch: &mut [f32]) -> (f32, f32) {
    let max = row_max(r);
    for (o, &v) in scratch.iter_mut().zip(r) {
        *o = exp_below_max::<FUSED>(v - max);
    }
    (max, pairwise_sum(&scratch[..r.len()]).ln())
}

/// `exp(x)` for `x = v - max <= 0` of a softmax row (or NaN): `fast_exp::exp`'s method without
/// its guards for large and subnormal results, which cannot occur here. Below [`FLOOR`] the weight
/// is 0 (under 2e-38 of the largest): computed, it would pass through subnormal floats, a slow
/// path of the CPU, once for every masked score. NaN stays NaN (every comparison is false).
#[inline(always)]
fn exp_below_max<const FUSED: bool>(x: f32) -> f32 {
    let c = if x < FLOOR { FLOOR } else { x };
    let e = crate::fast_exp::exp_normal_with::<FUSED>(c);
    if x < FLOOR { 0.0 } else { e }
}

/// # Safety
/// The CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn softmax_rows_avx2(o: &mut [MaybeUninit<f32>], r: &[f32], n: usize, log: bool) {
    softmax_rows::<false>(o, r, n, log)
}

/// [`softmax_rows`] with fused multiply-adds in the exponentials: their chain of dependent
/// operations, which bounds the pass, about half as long.
///
/// # Safety
/// The CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn softmax_rows_fma(o: &mut [MaybeUninit<f32>], r: &[f32], n: usize, log: bool) {
    softmax_rows::<true>(o, r, n, log)
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
    if n == 0 || x.is_empty() {
        return Ok(f32_storage(Vec::new()));
    }
    let (g, b) = (&g[..n], &b[..n]);
    #[cfg(target_arch = "x86_64")]
    if super::elementwise::avx2() {
        // SAFETY: the CPU has AVX2 (checked at run time).
        return Ok(f32_storage(for_rows(&x, n, |o, r| unsafe { layer_norm_rows_avx2(o, r, g, b, eps) })?));
    }
    Ok(f32_storage(for_rows(&x, n, |o, r| layer_norm_rows(o, r, g, b, eps))?))
}

/// Layer norm over each row (as long as `g`) of a group of at most [`SIDE`] rows, pass by pass. A
/// NaN (or an infinity, whose deviation is NaN) makes the mean or variance NaN, and so the row.
#[inline(always)]
fn layer_norm_rows(o: &mut [MaybeUninit<f32>], r: &[f32], g: &[f32], b: &[f32], eps: f32) {
    let n = g.len();
    let len = n as f32;
    let rows = r.len() / n;
    let mut means = [0f32; SIDE];
    pairwise_sums(r, n, &mut means[..rows]);
    for m in &mut means[..rows] {
        *m /= len;
    }
    // The squared deviations go to the output first, to be summed as a slice.
    for ((o, r), &mean) in o.chunks_mut(n).zip(r.chunks(n)).zip(&means) {
        for (o, &v) in o.iter_mut().zip(r) {
            o.write((v - mean) * (v - mean));
        }
    }
    // SAFETY: the pass above wrote every element (`o` and `r` have one length).
    let o = unsafe { written(o) };
    let mut rstds = [0f32; SIDE];
    pairwise_sums(o, n, &mut rstds[..rows]);
    for s in &mut rstds[..rows] {
        let var = *s / len;
        *s = 1.0 / (var + eps).sqrt();
    }
    for (((o, r), &mean), &rstd) in o.chunks_mut(n).zip(r.chunks(n)).zip(&means).zip(&rstds) {
        for (((o, &v), &g), &b) in o.iter_mut().zip(r).zip(g).zip(b) {
            *o = (v - mean) * rstd * g + b;
        }
    }
}

/// # Safety
/// The CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn layer_norm_rows_avx2(o: &mut [MaybeUninit<f32>], r: &[f32], g: &[f32], b: &[f32], eps: f32) {
    layer_norm_rows(o, r, g, b, eps)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows through both exponentials, the plain one and the fused one (a CPU takes one of them;
    /// both are checked on every CPU): within 4e-6 of the softmax in f64, relatively; masked
    /// scores (-1e9) weigh 0; a row of one value is 1; a row holding +inf, or only -inf, is NaN
    /// throughout (its `value - max` is NaN).
    #[test]
    fn plain_and_fused_exponentials_match_f64() {
        let rows: Vec<Vec<f32>> = vec![
            (0..37).map(|i| ((i * 7919) % 113) as f32 / 9.0 - 6.0).collect(),
            (0..128).map(|i| if i % 5 == 0 { -1e9 } else { (i as f32 * 0.37).sin() * 8.0 }).collect(),
            (0..300).map(|i| (i as f32 * 0.011).cos() * 30.0).collect(),
            vec![3.5],
            vec![-1e9; 9],
            vec![1.0, f32::INFINITY, 2.0],
            vec![f32::NEG_INFINITY; 4],
        ];
        for r in &rows {
            let n = r.len();
            for fused in [false, true] {
                let mut o = vec![MaybeUninit::<f32>::uninit(); n];
                if fused {
                    softmax_rows::<true>(&mut o, r, n, false);
                } else {
                    softmax_rows::<false>(&mut o, r, n, false);
                }
                // SAFETY: the softmax wrote every element of its row.
                let got = unsafe { written(&mut o) }.to_vec();
                let what = format!("fused {fused}, row of {n} from {:?}", &r[..n.min(3)]);
                if r.contains(&f32::INFINITY) || r.iter().all(|&v| v == f32::NEG_INFINITY) {
                    assert!(got.iter().all(|v| v.is_nan()), "{what}: {got:?}");
                    continue;
                }
                let max = r.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
                let e: Vec<f64> = r.iter().map(|&v| (v as f64 - max).exp()).collect();
                let sum: f64 = e.iter().sum();
                for (j, (&g, &e)) in got.iter().zip(&e).enumerate() {
                    let want = e / sum;
                    assert!((g as f64 - want).abs() <= 4e-6 * want, "{what}: [{j}] {g} against {want}");
                }
            }
        }
    }
}
