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

use super::conv::written_mut as written;
use super::norm::TASK;
use super::reduce::pairwise_sum;
use super::share::Ptr;
use super::{CpuStorage, f32_storage, strided, try_take};
use crate::{Layout, Result};
use std::mem::MaybeUninit;

/// `(dx, g * xhat)` of layer norm over the last axis of `x` (layout `lx`), with `gamma` (`n`
/// values) and the output's gradient `g` of `x`'s shape, any layouts; both returned contiguous,
/// of `x`'s shape.
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
    #[cfg(target_arch = "x86_64")]
    let avx2 = super::elementwise::avx2();
    let task = |i: usize, dxs: &mut [MaybeUninit<f32>]| {
        let start = i * per;
        // SAFETY: task i writes values start..start + dxs.len() of gx, as it does of dx; the
        // tasks' ranges are disjoint and inside gx's `len` spare values.
        let gxs = unsafe { std::slice::from_raw_parts_mut(gx_at.get().add(start), dxs.len()) };
        let rows = xs[start..start + dxs.len()].chunks(n).zip(gs[start..start + dxs.len()].chunks(n));
        for ((xr, gr), (dr, qr)) in rows.zip(dxs.chunks_mut(n).zip(gxs.chunks_mut(n))) {
            #[cfg(target_arch = "x86_64")]
            if avx2 {
                // SAFETY: the CPU has AVX2 (checked at run time).
                unsafe { row_avx2(xr, gr, gamma, eps, dr, qr) };
                continue;
            }
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
    // (Every loop below zips these: each writes all of its row only if they are one length.)
    assert!(g.len() == x.len() && gamma.len() == x.len() && dx.len() == x.len() && q.len() == x.len());
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

/// [`row`] compiled for AVX2, as the forward's rows are (the same bits: no fused multiply-adds).
///
/// # Safety
/// The CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn row_avx2(
    x: &[f32],
    g: &[f32],
    gamma: &[f32],
    eps: f32,
    dx: &mut [MaybeUninit<f32>],
    q: &mut [MaybeUninit<f32>],
) {
    row(x, g, gamma, eps, dx, q)
}

#[cfg(test)]
mod tests {
    use crate::backprop::composed_layer_norm_grad;
    use crate::{Device, Result, Tensor, Var};

    fn values(n: usize, seed: u64, scale: f32, offset: f32) -> Vec<f32> {
        (0..n).map(|i| ((((i as u64 * 2654435761 + seed * 97) % 1999) as f32 / 999.5) - 1.0) * scale + offset).collect()
    }

    /// Whether `a` is `b` within `tol` of each row's largest finite value (NaN where it is NaN).
    fn close_by_rows(a: &[f32], b: &[f32], n: usize, tol: f32) -> Option<usize> {
        for (r, (ra, rb)) in a.chunks(n).zip(b.chunks(n)).enumerate() {
            let scale = rb.iter().filter(|v| v.is_finite()).fold(1e-6f32, |m, v| m.max(v.abs()));
            for (j, (p, q)) in ra.iter().zip(rb).enumerate() {
                if !((p - q).abs() <= tol * scale || (p.is_nan() && q.is_nan())) {
                    return Some(r * n + j);
                }
            }
        }
        None
    }

    /// Autograd's gradients of a weighted layer norm (the one op) against the tensor ops': x's,
    /// gamma's and beta's, to rounding (1e-5 of each row's scale; 2e-4 for rows near 1,000, whose
    /// mean's rounding is larger). Rows of 1, 3, 17, 64, 300, 1,500 and 9,000 values (several
    /// threads' tasks, and tasks of one row each), an input read transposed, a rank-3 input, the
    /// output's gradient a row broadcast down the batch, and the non-finite cases: a NaN in x (its
    /// row's dx all NaN, the others finite), an infinity in x (the same), a NaN in gamma (every dx
    /// NaN, gamma's and beta's gradients finite).
    #[test]
    fn autograd_gives_the_tensor_ops_gradients() -> Result<()> {
        let dev = Device::Cpu;
        for (rows, n) in [(5, 1), (4, 3), (33, 17), (700, 64), (9, 300), (3, 1500), (3, 9000)] {
            let cases = [
                (false, 0.0, None),
                (true, 0.0, None),
                (false, 1000.0, None),
                (false, 0.0, Some("x nan")),
                (false, 0.0, Some("x inf")),
                (false, 0.0, Some("gamma nan")),
                (false, 0.0, Some("rank 3")),
                (false, 0.0, Some("broadcast g")),
            ];
            for (transposed, offset, special) in cases {
                let mut xs = values(rows * n, 1, 2.0, offset);
                let mut gs = values(n, 2, 1.0, 1.0);
                match special {
                    Some("x nan") => xs[n / 2] = f32::NAN,
                    Some("x inf") => xs[n / 2] = f32::INFINITY,
                    Some("gamma nan") => gs[n / 3] = f32::NAN,
                    _ => {}
                }
                let x = if transposed {
                    Tensor::from_vec(xs, &[n, rows], &dev)?.t()?
                } else if special == Some("rank 3") {
                    Tensor::from_vec(xs, &[1, rows, n], &dev)?
                } else {
                    Tensor::from_vec(xs, &[rows, n], &dev)?
                };
                let shape = x.dims().to_vec();
                let weights = if special == Some("broadcast g") {
                    Tensor::from_vec(values(n, 3, 1.5, 0.1), &[n], &dev)?.broadcast_to(&shape)?
                } else {
                    Tensor::from_vec(values(rows * n, 3, 1.5, 0.1), &shape, &dev)?
                };
                let (xv, gamma, beta) = (
                    Var::new(x.clone())?,
                    Var::new(Tensor::from_vec(gs, &[n], &dev)?)?,
                    Var::new(Tensor::zeros(&[n], &dev)?)?,
                );
                let loss =
                    xv.as_tensor().layer_norm(gamma.as_tensor(), beta.as_tensor(), 1e-5)?.mul(&weights)?.sum_all()?;
                let grads = loss.backward()?;
                let got = [&xv, &gamma, &beta].map(|v| grads.get(v).expect("a gradient").to_vec::<f32>().unwrap());
                let g = weights.contiguous()?;
                let want = composed_layer_norm_grad(&x, gamma.as_tensor(), 1e-5, &g)?;
                let tol = if offset != 0.0 { 2e-4 } else { 1e-5 };
                let what = format!("{shape:?} transposed {transposed} offset {offset} {special:?}");
                for (i, name) in ["dx", "dgamma", "dbeta"].into_iter().enumerate() {
                    let w = want[i].to_vec::<f32>()?;
                    let row = if i == 0 { n } else { w.len() };
                    assert_eq!(
                        close_by_rows(&got[i], &w, row, tol),
                        None,
                        "{name} of {what}: {:?} vs {:?}",
                        &got[i][..4.min(got[i].len())],
                        &w[..4.min(w.len())]
                    );
                }
                match special {
                    Some("x nan") | Some("x inf") => {
                        assert!(
                            got[0][..n].iter().all(|v| v.is_nan()) && got[0][n..].iter().all(|v| v.is_finite()),
                            "{what}"
                        )
                    }
                    Some("gamma nan") => assert!(
                        got[0].iter().all(|v| v.is_nan()) && got[1].iter().chain(&got[2]).all(|v| v.is_finite()),
                        "{what}"
                    ),
                    _ => assert!(got.iter().flatten().all(|v| v.is_finite()), "{what}"),
                }
            }
        }
        Ok(())
    }
}
