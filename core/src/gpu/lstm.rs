//! Launchers for one LSTM cell step and its backward (lstm_cell.wgsl, lstm_cell_grad.wgsl): an
//! invocation per (row, unit), every operand read through its strides.

use super::GpuStorage;
use crate::{DType, Layout, Result};

/// The info's head, `[rows, u, z offset, z row stride, z unit stride, c offset, c row stride,
/// c unit stride]` for `z` `[rows, 4u]` and `c` `[rows, u]`, and the invocations, `rows * u`.
fn info(lz: &Layout, lc: &Layout) -> (Vec<u32>, usize) {
    let (rows, u) = (lc.shape()[0], lc.shape()[1]);
    let mut info = vec![rows as u32, u as u32];
    for l in [lz, lc] {
        info.extend([l.offset() as u32, l.strides()[0] as u32, l.strides()[1] as u32]);
    }
    (info, rows * u)
}

/// `h` and the new state, `[rows, 2, u]`, from `z` (`[rows, 4u]`) and `c` (`[rows, u]`).
pub fn lstm_cell(z: &GpuStorage, lz: &Layout, c: &GpuStorage, lc: &Layout) -> Result<GpuStorage> {
    let (info, n) = info(lz, lc);
    let out = GpuStorage::alloc(&z.ctx, 2 * n, DType::F32)?;
    z.ctx.dispatch("lstm_cell", "main", &info, &[&z.buf, &c.buf, &out.buf], z.ctx.grid_1d(n))?;
    Ok(out)
}

/// The gradients of `z` and `c` side by side, `[rows, 5u]`, from the same `z` and `c` and the
/// output's gradient `g` (`[rows, 2, u]`).
pub fn lstm_cell_grad(
    (z, lz): (&GpuStorage, &Layout),
    (c, lc): (&GpuStorage, &Layout),
    (g, lg): (&GpuStorage, &Layout),
) -> Result<GpuStorage> {
    let (mut info, n) = info(lz, lc);
    let s = lg.strides();
    info.extend([lg.offset() as u32, s[1] as u32, s[0] as u32, s[2] as u32]);
    let out = GpuStorage::alloc(&z.ctx, 5 * n, DType::F32)?;
    z.ctx.dispatch("lstm_cell_grad", "main", &info, &[&z.buf, &c.buf, &g.buf, &out.buf], z.ctx.grid_1d(n))?;
    Ok(out)
}
