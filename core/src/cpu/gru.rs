//! One step of a GRU cell (Keras' `reset_after`, its default) on the Cpu, one pass each way.
//! Composed, a step was about ten tensor ops forward (two sums and two sigmoids for the update
//! and reset gates, a product, a sum and a tanh for the candidate, three for the blend) and eighteen
//! backward; here the forward writes the new state and the backward works the gates out again
//! from the inputs and writes every gradient in one pass. The arithmetic is gru_gates.wgsl's,
//! term for term.

use super::share::{CELL_TASK, par_rows};
use super::{CpuStorage, Rows, f32_storage};
use crate::ops::{UnaryOp, tanh};
use crate::{Layout, Result};
use std::mem::MaybeUninit;

/// The new state `h' = hh + z (h - hh)`, `[rows, u]`, from the input's share of the gates `x`
/// (`[rows, 3u]`: `x W + b`, gates in Keras' order z, r, h), the state's `hr` (`[rows, 3u]`:
/// `h U + b_r`) and the state `h` (`[rows, u]`), any layouts; `z = sigmoid(x_z + hr_z)`,
/// `r = sigmoid(x_r + hr_r)`, `hh = tanh(x_h + r hr_h)`.
pub fn gru_cell(
    x: (&CpuStorage, &Layout),
    hr: (&CpuStorage, &Layout),
    h: (&CpuStorage, &Layout),
) -> Result<CpuStorage> {
    let [xs, rs, hs] = [x, hr, h].map(|(s, l)| s.f32s("gru_cell").and_then(|v| Rows::new(v, l)));
    let (xs, rs, hs) = (xs?, rs?, hs?);
    let (rows, u) = (h.1.shape()[0], h.1.shape()[1]);
    let out = par_rows(rows * u, u, CELL_TASK, |r, o| {
        forward_row(&Row::of(&xs, &rs, &hs, r), o);
    })?;
    Ok(f32_storage(out))
}

/// The gradients of [`gru_cell`]'s `x`, `hr` and `h` side by side, `[rows, 7u]` (each row's 3u
/// values of x's, 3u of hr's, u of h's), from the same inputs and the output's gradient `g`
/// (`[rows, u]`, any layout).
pub fn gru_cell_grad(
    x: (&CpuStorage, &Layout),
    hr: (&CpuStorage, &Layout),
    h: (&CpuStorage, &Layout),
    g: (&CpuStorage, &Layout),
) -> Result<CpuStorage> {
    let [xs, rs, hs, gs] = [x, hr, h, g].map(|(s, l)| s.f32s("gru_cell").and_then(|v| Rows::new(v, l)));
    let (xs, rs, hs, gs) = (xs?, rs?, hs?, gs?);
    let (rows, u) = (h.1.shape()[0], h.1.shape()[1]);
    let out = par_rows(7 * rows * u, 7 * u, CELL_TASK, |r, o| {
        backward_row(&Row::of(&xs, &rs, &hs, r), gs.row(r), o);
    })?;
    Ok(f32_storage(out))
}

/// One row's inputs, each gate's `u` values sliced apart.
struct Row<'a> {
    x: [&'a [f32]; 3],
    hr: [&'a [f32]; 3],
    h: &'a [f32],
}

impl<'a> Row<'a> {
    fn of(xs: &'a Rows, rs: &'a Rows, hs: &'a Rows, r: usize) -> Self {
        let h = hs.row(r);
        let u = h.len();
        let three = |v: &'a [f32]| -> [&'a [f32]; 3] { [&v[..u], &v[u..2 * u], &v[2 * u..3 * u]] };
        Row { x: three(xs.row(r)), hr: three(rs.row(r)), h }
    }

    /// The same row, every slice cut to the state's length where the loop can see it (so the
    /// loops over a unit carry no bounds checks and vectorise).
    #[inline(always)]
    fn exact(&self) -> Row<'a> {
        let u = self.h.len();
        Row { x: self.x.map(|s| &s[..u]), hr: self.hr.map(|s| &s[..u]), h: &self.h[..u] }
    }

    /// Unit `j`'s update gate, reset gate, the state's candidate share `hr_h`, and the candidate.
    #[inline(always)]
    fn gates(&self, j: usize) -> (f32, f32, f32, f32) {
        let s = |v: f32| UnaryOp::Sigmoid.apply(v);
        let (z, r) = (s(self.x[0][j] + self.hr[0][j]), s(self.x[1][j] + self.hr[1][j]));
        let hn = self.hr[2][j];
        (z, r, hn, tanh(self.x[2][j] + r * hn))
    }
}

fn forward_row(row: &Row, out: &mut [MaybeUninit<f32>]) {
    #[cfg(target_arch = "x86_64")]
    if super::elementwise::avx2() {
        // SAFETY: the CPU has AVX2 (checked at run time).
        return unsafe { forward_row_avx2(row, out) };
    }
    forward_row_with(row, out)
}

/// [`forward_row_with`] compiled for AVX2; no multiply-adds are fused, so the bits are the
/// baseline's.
///
/// # Safety
/// The CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn forward_row_avx2(row: &Row, out: &mut [MaybeUninit<f32>]) {
    forward_row_with(row, out)
}

#[inline(always)]
fn forward_row_with(row: &Row, out: &mut [MaybeUninit<f32>]) {
    let (out, row) = (&mut out[..row.h.len()], row.exact());
    for (j, o) in out.iter_mut().enumerate() {
        let (z, _, _, hh) = row.gates(j);
        o.write(hh + z * (row.h[j] - hh));
    }
}

fn backward_row(row: &Row, g: &[f32], out: &mut [MaybeUninit<f32>]) {
    #[cfg(target_arch = "x86_64")]
    if super::elementwise::avx2() {
        // SAFETY: the CPU has AVX2 (checked at run time).
        return unsafe { backward_row_avx2(row, g, out) };
    }
    backward_row_with(row, g, out)
}

/// [`backward_row_with`] compiled for AVX2, the same bits.
///
/// # Safety
/// The CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn backward_row_avx2(row: &Row, g: &[f32], out: &mut [MaybeUninit<f32>]) {
    backward_row_with(row, g, out)
}

/// `out`: the row's gradient of x (z, r, h gates), of hr (the same two, then `hr_h`'s), of h.
#[inline(always)]
fn backward_row_with(row: &Row, g: &[f32], out: &mut [MaybeUninit<f32>]) {
    let u = row.h.len();
    let (g, row) = (&g[..u], row.exact());
    let mut parts = out[..7 * u].chunks_exact_mut(u);
    let mut next = || parts.next().expect("seven parts of u");
    let (xz, xr, xh, rz, rr, rh, dh) = (next(), next(), next(), next(), next(), next(), next());
    for j in 0..u {
        let (z, r, hn, hh) = row.gates(j);
        let gn = g[j];
        // h' = hh + z (h - hh): dz = g (h - hh), dhh = g - g z, dh = g z.
        let dz = gn * (row.h[j] - hh) * (z * (1.0 - z));
        let da = (gn - gn * z) * (1.0 - hh * hh);
        let dr = da * hn * (r * (1.0 - r));
        xz[j].write(dz);
        xr[j].write(dr);
        xh[j].write(da);
        rz[j].write(dz);
        rr[j].write(dr);
        rh[j].write(da * r);
        dh[j].write(gn * z);
    }
}
