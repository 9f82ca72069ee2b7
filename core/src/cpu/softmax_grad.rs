//! Softmax's and log-softmax's backward on the Cpu, a row at a time in one op, from the forward's
//! output `y` and its gradient `g`:
//!
//! - softmax: `dx = y (g - sum(g y))`;
//! - log-softmax: `dx = g - exp(y) sum(g)`.
//!
//! Why: as tensor ops each was four passes (a product, a row sum, a difference, a product; an
//! exponential in log-softmax's), three writing a temporary as large as an attention's scores;
//! here each row is read twice and written once, and a short row stays in L1 between. softmax's
//! sum runs in another order than the reduction's, so the values agree with the tensor ops' to
//! rounding. A NaN in a row's `g`, or in softmax's `y`, makes its sum, and so the row, NaN; a NaN in
//! log-softmax's `y` makes its own value NaN; as the tensor ops would.

use super::norm::TASK;
use super::reduce::pairwise_sum;
use super::{CpuStorage, f32_storage, strided, try_take};
use crate::{Layout, Result};
use std::mem::MaybeUninit;

/// The input's gradient of softmax (`log`: log-softmax) over the last axis, from its output `y`
/// and the output's gradient `g` (one shape, any layouts); contiguous, of that shape.
pub fn softmax_grad((y, ly): (&CpuStorage, &Layout), (g, lg): (&CpuStorage, &Layout), log: bool) -> Result<CpuStorage> {
    let ys = strided(y.f32s("softmax_grad")?, ly)?;
    let gs = strided(g.f32s("softmax_grad")?, lg)?;
    let n = *ly.shape().last().unwrap_or(&1);
    let len = ys.len();
    if n == 0 || len == 0 {
        return Ok(f32_storage(Vec::new()));
    }
    let mut dx = try_take(len)?;
    let per = (TASK / n).max(1) * n;
    #[cfg(target_arch = "x86_64")]
    let avx2 = super::elementwise::avx2();
    let task = |i: usize, out: &mut [MaybeUninit<f32>]| {
        let start = i * per;
        let rows = ys[start..start + out.len()].chunks(n).zip(gs[start..start + out.len()].chunks(n));
        for ((yr, gr), dr) in rows.zip(out.chunks_mut(n)) {
            #[cfg(target_arch = "x86_64")]
            if avx2 {
                // SAFETY: the CPU has AVX2 (checked at run time).
                unsafe { row_avx2(yr, gr, log, dr) };
                continue;
            }
            row(yr, gr, log, dr);
        }
    };
    if len <= per || super::one_thread() {
        task(0, &mut dx.spare_capacity_mut()[..len]);
    } else {
        super::par_chunks_mut(&mut dx.spare_capacity_mut()[..len], per, task);
    }
    // SAFETY: every row was written (`row` writes all of its row).
    unsafe { dx.set_len(len) };
    Ok(f32_storage(dx))
}

/// One row of `dx`, written whole.
#[inline(always)]
fn row(y: &[f32], g: &[f32], log: bool, dx: &mut [MaybeUninit<f32>]) {
    // (The loops zip these: each writes all of its row only if they are one length.)
    assert!(g.len() == y.len() && dx.len() == y.len());
    if log {
        let s = pairwise_sum(g);
        for ((d, &y), &g) in dx.iter_mut().zip(y).zip(g) {
            d.write(g - crate::fast_exp::exp(y) * s);
        }
    } else {
        let s = dot(y, g);
        for ((d, &y), &g) in dx.iter_mut().zip(y).zip(g) {
            d.write(y * (g - s));
        }
    }
}

/// Values a [`dot`] adds in eight running sums before it halves its operands: past that, its
/// error grows with the log of the length, as `pairwise_sum`'s (a vocabulary's row of 50,000).
const DOT_BLOCK: usize = 1024;

/// `sum(a b)`: in eight lanes, so the loop vectorises, over halves of at most [`DOT_BLOCK`].
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    if a.len() > DOT_BLOCK {
        let half = a.len() / 2 / 8 * 8;
        return dot(&a[..half], &b[..half]) + dot(&a[half..], &b[half..]);
    }
    let mut lanes = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ca.zip(cb) {
        for ((l, x), y) in lanes.iter_mut().zip(x).zip(y) {
            *l += x * y;
        }
    }
    lanes.iter().sum::<f32>() + tail
}

/// [`row`] compiled for AVX2.
///
/// # Safety
/// The CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn row_avx2(y: &[f32], g: &[f32], log: bool, dx: &mut [MaybeUninit<f32>]) {
    row(y, g, log, dx)
}
