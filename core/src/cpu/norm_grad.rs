//! Layer norm's backward on the Cpu, a row at a time in one op: the input's gradient and
//! `g * xhat` (whose column sums are gamma's gradient), from the input, gamma and the output's
//! gradient.
//!
//! Why: as tensor ops it was about twenty passes and reductions over the activations (the mean
//! and variance again, the normalised input, two row sums, five elementwise ops), each writing a
//! temporary as large as them; here each row's passes run while the row is in L1. The formulas
//! are the tensor ops' (two-pass mean and variance as the forward's, then
//! `dx = (dxhat - mean(dxhat) - xhat mean(dxhat xhat)) rstd` with `dxhat = g gamma`); the sums run
//! in another order, so the values agree to rounding.

use super::reduce::pairwise_sum;
use super::share::Ptr;
use super::{CpuStorage, f32_storage, strided, try_take};
use crate::{Layout, Result};
use std::mem::MaybeUninit;

/// Values per task of rows handed to a thread (whole rows, at least one).
const TASK: usize = 1 << 14;

/// `(dx, g * xhat)` of layer norm over the last axis of `x` (layout `lx`), with `gamma` (`n`
/// values) and the output's gradient `g` of `x`'s shape; both contiguous, `x`'s shape.
pub fn layer_norm_grad(
    (x, lx): (&CpuStorage, &Layout),
    (gamma, lgamma): (&CpuStorage, &Layout),
    (g, lg): (&CpuStorage, &Layout),
    eps: f32,
) -> Result<(CpuStorage, CpuStorage)> {
    let xs = strided(x.f32s("layer_norm_grad")?, lx)?;
    let gs = strided(g.f32s("layer_norm_grad")?, lg)?;
    let gamma = strided(gamma.f32s("layer_norm_grad")?, lgamma)?;
    let n = *lx.shape().last().unwrap_or(&1);
    let len = xs.len();
    if n == 0 || len == 0 {
        return Ok((f32_storage(Vec::new()), f32_storage(Vec::new())));
    }
    let gamma = &gamma[..n];
    let (mut dx, mut gx) = (try_take(len)?, try_take(len)?);
    let gx_at = Ptr(gx.spare_capacity_mut().as_mut_ptr());
    let per = (TASK / n).max(1) * n;
    let task = |i: usize, dxs: &mut [MaybeUninit<f32>]| {
        let start = i * per;
        // SAFETY: task i writes values start..start + dxs.len() of gx, as it does of dx; the
        // tasks' ranges are disjoint and inside gx's `len` spare values.
        let gxs = unsafe { std::slice::from_raw_parts_mut(gx_at.get().add(start), dxs.len()) };
        let rows = xs[start..start + dxs.len()].chunks(n).zip(gs[start..start + dxs.len()].chunks(n));
        for ((xr, gr), (dr, qr)) in rows.zip(dxs.chunks_mut(n).zip(gxs.chunks_mut(n))) {
            row(xr, gr, gamma, eps, dr, qr);
        }
    };
    if len <= per || super::one_thread() {
        task(0, &mut dx.spare_capacity_mut()[..len]);
    } else {
        super::par_chunks_mut(&mut dx.spare_capacity_mut()[..len], per, task);
    }
    // SAFETY: every row of both outputs was written (`row` writes all of its two rows).
    unsafe {
        dx.set_len(len);
        gx.set_len(len);
    }
    Ok((f32_storage(dx), f32_storage(gx)))
}

/// One row: `dx` and `q = g * xhat` written whole (`q` also holds the row's temporaries first).
/// A NaN or an infinity in `x` makes the mean or the variance NaN, and so both rows.
#[inline]
fn row(x: &[f32], g: &[f32], gamma: &[f32], eps: f32, dx: &mut [MaybeUninit<f32>], q: &mut [MaybeUninit<f32>]) {
    let len = x.len() as f32;
    let mean = pairwise_sum(x) / len;
    for (q, &v) in q.iter_mut().zip(x) {
        q.write((v - mean) * (v - mean));
    }
    // SAFETY: every element of q was written just above.
    let q = unsafe { written(q) };
    let rstd = 1.0 / (pairwise_sum(q) / len + eps).sqrt();
    for ((d, &gv), &w) in dx.iter_mut().zip(g).zip(gamma) {
        d.write(gv * w);
    }
    // SAFETY: every element of dx was written just above.
    let dx = unsafe { written(dx) };
    let m1 = pairwise_sum(dx) / len;
    for ((q, &d), &v) in q.iter_mut().zip(dx.iter()).zip(x) {
        *q = d * ((v - mean) * rstd);
    }
    let m2 = pairwise_sum(q) / len;
    for (((d, q), &v), &gv) in dx.iter_mut().zip(q.iter_mut()).zip(x).zip(g) {
        let xhat = (v - mean) * rstd;
        *d = (*d - m1 - xhat * m2) * rstd;
        *q = gv * xhat;
    }
}

/// # Safety
/// Every element of `o` was written.
unsafe fn written(o: &mut [MaybeUninit<f32>]) -> &mut [f32] {
    // SAFETY: the caller's; MaybeUninit<f32> has f32's layout.
    unsafe { &mut *(o as *mut [MaybeUninit<f32>] as *mut [f32]) }
}

#[cfg(test)]
mod tests {
    use crate::backprop::composed_layer_norm_grad;
    use crate::{Device, Result, Tensor};

    fn values(n: usize, seed: u64, scale: f32, offset: f32) -> Vec<f32> {
        (0..n).map(|i| ((((i as u64 * 2654435761 + seed * 97) % 1999) as f32 / 999.5) - 1.0) * scale + offset).collect()
    }

    /// The one op gives the tensor ops' dx, gamma's and beta's gradients to rounding: rows of 1,
    /// 3, 17, 64, 300 and 1,500 values (several threads' tasks, and a row alone in one), an input
    /// read transposed, rows far from 0 (values near 1,000, where the mean must be taken first),
    /// and a row holding a NaN (its dx all NaN, the others finite; gamma's gradient NaN).
    #[test]
    fn one_op_gives_the_tensor_ops_values() -> Result<()> {
        let dev = Device::Cpu;
        for (rows, n) in [(5, 1), (4, 3), (33, 17), (700, 64), (9, 300), (3, 1500)] {
            for (transposed, offset, nan) in
                [(false, 0.0, false), (true, 0.0, false), (false, 1000.0, false), (false, 0.0, true)]
            {
                let mut xs = values(rows * n, 1, 2.0, offset);
                if nan {
                    xs[n / 2] = f32::NAN;
                }
                let x = if transposed {
                    Tensor::from_vec(xs, &[n, rows], &dev)?.t()?
                } else {
                    Tensor::from_vec(xs, &[rows, n], &dev)?
                };
                let gamma = Tensor::from_vec(values(n, 2, 1.0, 1.0), &[n], &dev)?;
                let g = Tensor::from_vec(values(rows * n, 3, 1.5, 0.1), &[rows, n], &dev)?;
                let (dx, gxhat) = x.layer_norm_grad(&gamma, &g, 1e-5)?.expect("the Cpu's one op");
                let got = [dx, gxhat.sum(&[0], false)?, g.sum(&[0], false)?];
                let want = composed_layer_norm_grad(&x, &gamma, 1e-5, &g)?;
                for (what, (a, b)) in ["dx", "dgamma", "dbeta"].iter().zip(got.iter().zip(&want)) {
                    let (a, b) = (a.to_vec::<f32>()?, b.to_vec::<f32>()?);
                    let scale = b.iter().filter(|v| v.is_finite()).fold(1f32, |m, v| m.max(v.abs()));
                    for (i, (p, q)) in a.iter().zip(&b).enumerate() {
                        let close = (p - q).abs() <= 2e-4 * scale || (p.is_nan() && q.is_nan());
                        assert!(
                            close,
                            "{what} {rows}x{n} transposed {transposed} offset {offset} nan {nan} at {i}: {p} vs {q}"
                        );
                    }
                    if nan && *what == "dx" {
                        assert!(a[..n].iter().all(|v| v.is_nan()) && a[n..].iter().all(|v| v.is_finite()));
                    }
                }
            }
        }
        Ok(())
    }
}
