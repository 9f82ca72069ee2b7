//! Launchers for one step of a recurrent cell and its backward: an LSTM's (lstm_cell.wgsl,
//! lstm_cell_grad.wgsl) and a GRU's (gru_cell.wgsl, gru_cell_grad.wgsl), an invocation per
//! (row, unit), every operand read through its strides.

use super::GpuStorage;
use crate::{DType, Layout, Result};

/// The info's head, `[rows, u]` for a state `[rows, u]`, then each rank-2 operand's offset, row
/// stride and unit stride; and the invocations, `rows * u`.
fn info(state: &Layout, operands: &[&Layout]) -> (Vec<u32>, usize) {
    let (rows, u) = (state.shape()[0], state.shape()[1]);
    let mut info = vec![rows as u32, u as u32];
    for l in operands {
        info.extend([l.offset() as u32, l.strides()[0] as u32, l.strides()[1] as u32]);
    }
    (info, rows * u)
}

/// An LSTM's gate pre-activations `z` (`[rows, 4u]`), or one share of them and the other.
pub type LstmGates<'a> = ((&'a GpuStorage, &'a Layout), Option<(&'a GpuStorage, &'a Layout)>);

/// The second share's info (at 12: whether there is one, its offset and strides) and buffer, bound
/// after the kernel's own (z's again where there is none: bound, never read).
fn second_share<'a>(((z, _), second): &LstmGates<'a>) -> ([u32; 4], &'a GpuStorage) {
    match second {
        Some((h, l)) => ([1, l.offset() as u32, l.strides()[0] as u32, l.strides()[1] as u32], h),
        None => ([0; 4], z),
    }
}

/// `h` and the new state, `[rows, 2, u]`, from the gates (`[rows, 4u]`) and `c` (`[rows, u]`).
pub fn lstm_cell(gates: LstmGates, (c, lc): (&GpuStorage, &Layout)) -> Result<GpuStorage> {
    let (z, lz) = gates.0;
    let (mut info, n) = info(lc, &[lz, lc]);
    let (more, z2) = second_share(&gates);
    info.extend([0; 4].into_iter().chain(more));
    let out = GpuStorage::alloc(&z.ctx, 2 * n, DType::F32)?;
    let buffers = [&z.buf, &c.buf, &out.buf, &z2.buf];
    z.ctx.dispatch("lstm_cell", "main", &info, &buffers, z.ctx.grid_1d(n))?;
    Ok(out)
}

/// The gradients of `z` and `c` side by side, `[rows, 5u]`, from the same gates and `c` and the
/// output's gradient `g` (`[rows, 2, u]`).
pub fn lstm_cell_grad(
    gates: LstmGates,
    (c, lc): (&GpuStorage, &Layout),
    (g, lg): (&GpuStorage, &Layout),
) -> Result<GpuStorage> {
    let (z, lz) = gates.0;
    let (mut info, n) = info(lc, &[lz, lc]);
    let s = lg.strides();
    info.extend([lg.offset() as u32, s[1] as u32, s[0] as u32, s[2] as u32]);
    let (more, z2) = second_share(&gates);
    info.extend(more);
    let out = GpuStorage::alloc(&z.ctx, 5 * n, DType::F32)?;
    let buffers = [&z.buf, &c.buf, &g.buf, &out.buf, &z2.buf];
    z.ctx.dispatch("lstm_cell_grad", "main", &info, &buffers, z.ctx.grid_1d(n))?;
    Ok(out)
}

/// A GRU's new state, `[rows, u]`, from the gates' input share `x` and state share `hr`
/// (`[rows, 3u]` each) and the state `h` (`[rows, u]`).
pub fn gru_cell(
    (x, lx): (&GpuStorage, &Layout),
    (hr, lr): (&GpuStorage, &Layout),
    (h, lh): (&GpuStorage, &Layout),
) -> Result<GpuStorage> {
    let (info, n) = info(lh, &[lx, lr, lh]);
    let out = GpuStorage::alloc(&x.ctx, n, DType::F32)?;
    x.ctx.dispatch("gru_cell", "main", &info, &[&x.buf, &hr.buf, &h.buf, &out.buf], x.ctx.grid_1d(n))?;
    Ok(out)
}

/// The gradients of `x`, `hr` and `h` side by side, `[rows, 7u]`, from the same inputs and the
/// new state's gradient `g` (`[rows, u]`).
pub fn gru_cell_grad(
    (x, lx): (&GpuStorage, &Layout),
    (hr, lr): (&GpuStorage, &Layout),
    (h, lh): (&GpuStorage, &Layout),
    (g, lg): (&GpuStorage, &Layout),
) -> Result<GpuStorage> {
    let (info, n) = info(lh, &[lx, lr, lh, lg]);
    let out = GpuStorage::alloc(&x.ctx, 7 * n, DType::F32)?;
    x.ctx.dispatch("gru_cell_grad", "main", &info, &[&x.buf, &hr.buf, &h.buf, &g.buf, &out.buf], x.ctx.grid_1d(n))?;
    Ok(out)
}
