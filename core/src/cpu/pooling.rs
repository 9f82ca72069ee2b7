//! Max and average pooling on the Cpu (NHWC: a window's taps are each `channels` adjacent
//! values). The forward pass goes a row of output positions at a time, tap by tap: each tap of
//! the window is one strided pass over the whole row (the positions whose tap lies inside the
//! input), so the work per value is a vector operation, not a walk over each window's taps.
//! The gradient walks each window (max pooling needs the winning tap of each channel, found
//! with the running maximum in registers).

use super::conv::written_mut;
use super::{CpuStorage, f32_storage, strided, try_take, try_zeros};
use crate::conv::{PoolKind, Window2d};
use crate::{Layout, Result};
use std::ops::Range;

/// The output positions along `axis` whose tap `k` lies inside the input (those for which
/// `g.source(axis, o, k)` is some): a range, since taps move on with the output.
fn inside(g: &Window2d, axis: usize, k: usize) -> Range<usize> {
    let (s, at, pad, n) = (g.strides[axis], k * g.dilation[axis], g.pad[axis], g.input[axis]);
    let lo = pad.saturating_sub(at).div_ceil(s);
    let hi = (n + pad).saturating_sub(at).div_ceil(s).min(g.output[axis]);
    lo..hi.max(lo)
}

/// The taps of output `(oh, ow)` that lie inside the input, in window order, as input offsets of
/// channel 0 of sample `n`, into `out`.
fn taps(g: &Window2d, n: usize, oh: usize, ow: usize, out: &mut Vec<usize>) {
    let [h, w] = g.input;
    out.clear();
    for iy in (0..g.kernel[0]).filter_map(|ky| g.source(0, oh, ky)) {
        for ix in (0..g.kernel[1]).filter_map(|kx| g.source(1, ow, kx)) {
            out.push(((n * h + iy) * w + ix) * g.channels);
        }
    }
}

/// Whether `v`, met after `best` in a window, takes its place: the first NaN stays, else the
/// first largest value (a NaN met later wins over numbers).
#[inline(always)]
fn replaces(best: f32, v: f32) -> bool {
    !best.is_nan() && (v > best || v.is_nan())
}

/// For each window in `best` (`c` channels each), its next tap: window `p`'s values at
/// `src[p * stride..][..c]`, each taking its place in `best` where it `replaces` it.
fn take_larger(best: &mut [f32], src: &[f32], (c, stride): (usize, usize)) {
    #[cfg(target_arch = "x86_64")]
    if super::elementwise::avx2() {
        // SAFETY: the CPU has AVX2.
        unsafe { take_larger_avx2(best, src, (c, stride)) };
        return;
    }
    for (p, b) in best.chunks_mut(c).enumerate() {
        take_each(b, &src[p * stride..][..c]);
    }
}

/// Each `b[i]` replaced by `s[i]` where it takes its place (`replaces`): one window, one by one.
#[inline(always)]
fn take_each(b: &mut [f32], s: &[f32]) {
    for (b, &v) in b.iter_mut().zip(s) {
        if replaces(*b, v) {
            *b = v;
        }
    }
}

/// The larger of `old` and a later tap's `v` as `replaces` decides, eight values at a time:
/// `v` where it is NaN and `old` is not, else the larger, `old` on ties and where `old` is NaN
/// (`max_ps` gives its second operand then); and whether `v` took the place. Not a blend of `v`
/// into `old`: LLVM stores that as a masked move when `old` was just loaded from where the
/// result goes, and masked stores are microcoded on AMD (they were 80% of a max pooling's time).
///
/// # Safety
/// The CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn larger8(
    old: std::arch::x86_64::__m256,
    v: std::arch::x86_64::__m256,
) -> (std::arch::x86_64::__m256, std::arch::x86_64::__m256) {
    use std::arch::x86_64::*;
    let nan = _mm256_andnot_ps(_mm256_cmp_ps::<_CMP_UNORD_Q>(old, old), _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
    let new = _mm256_blendv_ps(_mm256_max_ps(v, old), v, nan);
    (new, _mm256_or_ps(_mm256_cmp_ps::<_CMP_GT_OQ>(v, old), nan))
}

/// `take_larger` eight channels at a time, without branches (on random data a branch per value
/// mispredicts half the time), the last `c % 8` one by one.
///
/// # Safety
/// The CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn take_larger_avx2(best: &mut [f32], src: &[f32], (c, stride): (usize, usize)) {
    use std::arch::x86_64::*;
    let body = c / 8 * 8;
    for (p, b) in best.chunks_mut(c).enumerate() {
        let s = &src[p * stride..][..c];
        for i in (0..body).step_by(8) {
            // SAFETY: i + 8 <= body <= c, both slices' length.
            unsafe {
                let (new, _) = larger8(_mm256_loadu_ps(b.as_ptr().add(i)), _mm256_loadu_ps(s.as_ptr().add(i)));
                _mm256_storeu_ps(b.as_mut_ptr().add(i), new);
            }
        }
        take_each(&mut b[body..], &s[body..]);
    }
}

/// Each channel's winning tap (`replaces`, taps in window order) over a window whose taps'
/// channel-0 values are at `taps` in `xs`, into `won` (`c` values).
fn window_max(xs: &[f32], taps: &[usize], won: &mut [u32]) {
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if super::elementwise::avx2() {
        // SAFETY: the CPU has AVX2.
        done = unsafe { window_max_avx2(xs, taps, won) };
    }
    for (ch, w) in won.iter_mut().enumerate().skip(done) {
        let mut best = (xs[taps[0] + ch], 0);
        for (i, &t) in taps.iter().enumerate().skip(1) {
            if replaces(best.0, xs[t + ch]) {
                best = (xs[t + ch], i as u32);
            }
        }
        *w = best.1;
    }
}

/// `window_max` eight channels at a time, the running maximum and its tap kept in registers
/// over the window's taps; returns how many channels it did (a multiple of 8).
///
/// # Safety
/// The CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn window_max_avx2(xs: &[f32], taps: &[usize], won: &mut [u32]) -> usize {
    use std::arch::x86_64::*;
    let c = won.len();
    let body = c / 8 * 8;
    for j in (0..body).step_by(8) {
        let load = |t: usize| {
            let s = &xs[t + j..][..8];
            // SAFETY: 8 values.
            unsafe { _mm256_loadu_ps(s.as_ptr()) }
        };
        let (mut best, mut tap) = (load(taps[0]), _mm256_setzero_si256());
        for (i, &t) in taps.iter().enumerate().skip(1) {
            // SAFETY: the CPU has AVX2.
            let (new, take) = unsafe { larger8(best, load(t)) };
            best = new;
            tap = _mm256_blendv_epi8(tap, _mm256_set1_epi32(i as i32), _mm256_castps_si256(take));
        }
        // SAFETY: j + 8 <= body <= c.
        unsafe { _mm256_storeu_si256(won.as_mut_ptr().add(j).cast(), tap) };
    }
    body
}

/// Max or average pooling; every window has at least one tap inside the input.
pub fn pool2d(kind: PoolKind, x: &CpuStorage, lx: &Layout, g: &Window2d) -> Result<CpuStorage> {
    let xs = strided(x.f32s("pool2d")?, lx)?;
    let c = g.channels;
    let [h, w] = g.input;
    let [oh_n, ow_n] = g.output;
    let len = g.batch * oh_n * ow_n * c;
    let mut y = try_take(len)?;
    // Each window starts from its reduction's identity, so that its first tap inside gives
    // itself, as a copy would: -inf for the maximum (any number or NaN replaces it; -inf stays
    // -inf), -0.0 for the average's sum (-0.0 + v is v, signed zeros too).
    let start = match kind {
        PoolKind::Max => f32::NEG_INFINITY,
        PoolKind::Avg => -0.0,
    };
    // One output row (all of its positions and channels) per task, tap by tap in window order.
    super::par_chunks_mut(&mut y.spare_capacity_mut()[..len], ow_n * c, |r, dst| {
        let (n, oy) = (r / oh_n, r % oh_n);
        dst.iter_mut().for_each(|d| {
            d.write(start);
        });
        // SAFETY: just written.
        let dst = unsafe { written_mut(dst) };
        for iy in (0..g.kernel[0]).filter_map(|ky| g.source(0, oy, ky)) {
            let row = &xs[(n * h + iy) * w * c..][..w * c];
            for kx in 0..g.kernel[1] {
                let cols = inside(g, 1, kx);
                let Some(ix) = g.source(1, cols.start, kx).filter(|_| !cols.is_empty()) else { continue };
                let (best, src) = (&mut dst[cols.start * c..cols.end * c], &row[ix * c..]);
                let stride = g.strides[1] * c;
                match kind {
                    PoolKind::Max => take_larger(best, src, (c, stride)),
                    PoolKind::Avg => {
                        for (p, b) in best.chunks_mut(c).enumerate() {
                            b.iter_mut().zip(&src[p * stride..][..c]).for_each(|(b, v)| *b += v);
                        }
                    }
                }
            }
        }
        if kind == PoolKind::Avg {
            let rows = (0..g.kernel[0]).filter(|&ky| g.source(0, oy, ky).is_some()).count();
            for (ox, d) in dst.chunks_mut(c).enumerate() {
                let taps = rows * (0..g.kernel[1]).filter(|&kx| g.source(1, ox, kx).is_some()).count();
                let inv = 1.0 / taps as f32;
                d.iter_mut().for_each(|d| *d *= inv);
            }
        }
    });
    // SAFETY: every row wrote its values.
    unsafe { y.set_len(len) };
    Ok(f32_storage(y))
}

/// The gradient of `pool2d` with respect to its input, from the output's `dy`.
pub fn pool2d_grad(
    kind: PoolKind,
    x: &CpuStorage,
    lx: &Layout,
    dy: &CpuStorage,
    ldy: &Layout,
    g: &Window2d,
) -> Result<CpuStorage> {
    let xs = strided(x.f32s("pool2d backward")?, lx)?;
    let d = strided(dy.f32s("pool2d backward")?, ldy)?;
    let c = g.channels;
    let [h, w] = g.input;
    let [oh_n, ow_n] = g.output;
    let per_sample = h * w * c;
    let mut dx = try_zeros(g.batch * per_sample)?;
    super::par_chunks_mut(&mut dx, per_sample, |n, dst| {
        let base = n * per_sample;
        let mut at = Vec::with_capacity(g.kernel[0] * g.kernel[1]);
        // Max: each channel's winning tap, found over the window in order.
        let mut won = vec![0u32; c];
        for oh in 0..oh_n {
            for ow in 0..ow_n {
                let drow = &d[((n * oh_n + oh) * ow_n + ow) * c..][..c];
                taps(g, n, oh, ow, &mut at);
                match kind {
                    PoolKind::Max => {
                        window_max(&xs, &at, &mut won);
                        for (ch, (&wi, v)) in won.iter().zip(drow).enumerate() {
                            dst[at[wi as usize] - base + ch] += v;
                        }
                    }
                    PoolKind::Avg => {
                        let inv = 1.0 / at.len() as f32;
                        for &t in &at {
                            dst[t - base..t - base + c].iter_mut().zip(drow).for_each(|(a, b)| *a += b * inv);
                        }
                    }
                }
            }
        }
    });
    Ok(f32_storage(dx))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conv::Padding;

    /// `inside` gives exactly the positions whose tap `source` finds, for every padding, stride
    /// and dilation.
    #[test]
    fn inside_is_where_the_source_is() {
        for padding in [Padding::Valid, Padding::Same, Padding::Causal] {
            for (n, k, s, d) in [(7, 3, 1, 1), (7, 3, 2, 1), (9, 2, 3, 2), (5, 4, 1, 3), (1, 3, 1, 1), (6, 1, 2, 1)] {
                let Ok(g) = Window2d::new("t", &[1, n, n, 1], [k, k], [s, s], [d, d], padding) else { continue };
                for tap in 0..k {
                    let want: Vec<usize> = (0..g.output[1]).filter(|&o| g.source(1, o, tap).is_some()).collect();
                    assert_eq!(inside(&g, 1, tap).collect::<Vec<_>>(), want, "{g:?} tap {tap}");
                }
            }
        }
    }
}
