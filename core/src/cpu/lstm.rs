//! One step of an LSTM cell on the Cpu, one pass each way. Composed, a step was about ten tensor
//! ops forward (four activations of the gates, three products, a sum, a tanh) and twenty backward,
//! each a pass over `[rows, units]` with an array of its own; here the forward writes each row's
//! `h` and new state side by side, and the backward works the gates out again from `z` and `c`
//! and writes the gradients of both in one pass. The arithmetic is lstm_gates.wgsl's, term for
//! term (sigmoid as `1 / (1 + e^-x)`, weft's `tanh`), so the GPU's kernels follow the Cpu's.

use super::share::{CELL_TASK, par_rows};
use super::{CpuStorage, Rows, f32_storage, strided};
use crate::ops::{UnaryOp, tanh};
use crate::{Layout, Result};
use std::mem::MaybeUninit;

/// The gates' pre-activations: one tensor `z`, or two shares (`x W + b` and `h U`) whose sum it is.
pub struct Gates<'a> {
    z: Rows<'a>,
    second: Option<Rows<'a>>,
}

impl<'a> Gates<'a> {
    /// `z` (`[rows, 4u]`), plus `second` of the same shape where given, both in any layout.
    pub fn new((z, lz): (&'a CpuStorage, &Layout), second: Option<(&'a CpuStorage, &Layout)>) -> Result<Self> {
        let z = Rows::new(z.f32s("lstm_cell")?, lz)?;
        let second = second.map(|(s, l)| Rows::new(s.f32s("lstm_cell")?, l)).transpose()?;
        Ok(Gates { z, second })
    }

    /// `f` of row `r`'s pre-activations, summed into a room kept per thread where there are two
    /// shares (the bits of adding the two tensors).
    fn with_row<T>(&self, r: usize, f: impl FnOnce(&[f32]) -> T) -> T {
        thread_local! {
            static ROOM: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        match &self.second {
            None => f(self.z.row(r)),
            Some(h) => ROOM.with_borrow_mut(|room| {
                room.clear();
                room.extend(self.z.row(r).iter().zip(h.row(r)).map(|(a, b)| a + b));
                f(room)
            }),
        }
    }
}

/// `h` and the new state, `[rows, 2, u]`, from the gates' pre-activations `z` (`[rows, 4u]`,
/// gates in Keras' order i, f, g, o) and the state `c` (`[rows, u]`), both in any layout.
pub fn lstm_cell(z: &Gates, c: &CpuStorage, lc: &Layout) -> Result<CpuStorage> {
    let cs = Rows::new(c.f32s("lstm_cell")?, lc)?;
    let (rows, u) = (lc.shape()[0], lc.shape()[1]);
    let out = par_rows(2 * rows * u, 2 * u, CELL_TASK, |r, o| {
        let (h, c2) = o.split_at_mut(u);
        z.with_row(r, |z| forward_row(z, cs.row(r), h, c2));
    })?;
    Ok(f32_storage(out))
}

/// The gradients of [`lstm_cell`]'s `z` and `c` side by side, `[rows, 5u]` (each row's 4u values
/// of z's, then u of c's), from the same `z` and `c` and the output's gradient `g`
/// (`[rows, 2, u]`, any layout).
pub fn lstm_cell_grad(
    z: &Gates,
    (c, lc): (&CpuStorage, &Layout),
    (g, lg): (&CpuStorage, &Layout),
) -> Result<CpuStorage> {
    let cs = Rows::new(c.f32s("lstm_cell")?, lc)?;
    let gs = strided(g.f32s("lstm_cell")?, lg)?;
    let (rows, u) = (lc.shape()[0], lc.shape()[1]);
    let out = par_rows(5 * rows * u, 5 * u, CELL_TASK, |r, o| {
        z.with_row(r, |z| backward_row(z, cs.row(r), &gs[r * 2 * u..(r + 1) * 2 * u], o));
    })?;
    Ok(f32_storage(out))
}

/// A row's four gates' pre-activations, each `u` long (sliced once, so the loops over a unit
/// carry no bounds checks and vectorise).
fn split4(z: &[f32], u: usize) -> [&[f32]; 4] {
    let (i, rest) = z[..4 * u].split_at(u);
    let (f, rest) = rest.split_at(u);
    let (g, o) = rest.split_at(u);
    [i, f, g, o]
}

/// The four gates of unit `j`: `(i, f, g, o)`.
#[inline(always)]
fn gates(z: &[&[f32]; 4], j: usize) -> (f32, f32, f32, f32) {
    let s = |x: f32| UnaryOp::Sigmoid.apply(x);
    (s(z[0][j]), s(z[1][j]), tanh(z[2][j]), s(z[3][j]))
}

/// One row forward: `c' = f c + i g`, `h = o tanh(c')`.
#[inline(always)]
fn forward_row(z: &[f32], c: &[f32], h: &mut [MaybeUninit<f32>], c2: &mut [MaybeUninit<f32>]) {
    #[cfg(target_arch = "x86_64")]
    if super::elementwise::avx2() {
        // SAFETY: the CPU has AVX2 (checked at run time).
        return unsafe { forward_row_avx2(z, c, h, c2) };
    }
    forward_row_with(z, c, h, c2)
}

/// [`forward_row_with`] eight lanes wide; no multiply-adds are fused, so the bits are the
/// baseline's.
///
/// # Safety
/// The CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn forward_row_avx2(z: &[f32], c: &[f32], h: &mut [MaybeUninit<f32>], c2: &mut [MaybeUninit<f32>]) {
    forward_row_with(z, c, h, c2)
}

#[inline(always)]
fn forward_row_with(z: &[f32], c: &[f32], h: &mut [MaybeUninit<f32>], c2: &mut [MaybeUninit<f32>]) {
    let u = c.len();
    let (z, h, c2) = (split4(z, u), &mut h[..u], &mut c2[..u]);
    for j in 0..u {
        let (i, f, g, o) = gates(&z, j);
        let cn = f * c[j] + i * g;
        c2[j].write(cn);
        h[j].write(o * tanh(cn));
    }
}

/// One row backward: `out` is the row's gradient of z (4u), then of c (u).
#[inline(always)]
fn backward_row(z: &[f32], c: &[f32], g: &[f32], out: &mut [MaybeUninit<f32>]) {
    #[cfg(target_arch = "x86_64")]
    if super::elementwise::avx2() {
        // SAFETY: the CPU has AVX2 (checked at run time).
        return unsafe { backward_row_avx2(z, c, g, out) };
    }
    backward_row_with(z, c, g, out)
}

/// [`backward_row_with`] eight lanes wide, the same bits.
///
/// # Safety
/// The CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn backward_row_avx2(z: &[f32], c: &[f32], g: &[f32], out: &mut [MaybeUninit<f32>]) {
    backward_row_with(z, c, g, out)
}

#[inline(always)]
fn backward_row_with(z: &[f32], c: &[f32], g: &[f32], out: &mut [MaybeUninit<f32>]) {
    let u = c.len();
    let z = split4(z, u);
    let (gh, gc) = g[..2 * u].split_at(u);
    let (dz, dc) = out[..5 * u].split_at_mut(4 * u);
    let (di, rest) = dz.split_at_mut(u);
    let (df, rest) = rest.split_at_mut(u);
    let (dg, d_o) = rest.split_at_mut(u);
    for j in 0..u {
        let (i, f, g, o) = gates(&z, j);
        let cn = f * c[j] + i * g;
        let tc = tanh(cn);
        let dcn = gc[j] + gh[j] * o * (1.0 - tc * tc);
        di[j].write(dcn * g * (i * (1.0 - i)));
        df[j].write(dcn * c[j] * (f * (1.0 - f)));
        dg[j].write(dcn * i * (1.0 - g * g));
        d_o[j].write(gh[j] * tc * (o * (1.0 - o)));
        dc[j].write(dcn * f);
    }
}
