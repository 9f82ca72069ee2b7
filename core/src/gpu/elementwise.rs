//! Launchers for the one-invocation-per-element kernels: unary, binary, where, copy, cast, fill, rand.

use super::{GpuContext, GpuStorage, MAX_RANK, check_rank, push_dims};
use crate::layout::coalesce;
use crate::ops::{BinaryOp, UnaryOp};
use crate::{DType, Error, Layout, Result};
use std::sync::Arc;

/// `head` (`[numel, rank, offsets.., params..]`) followed by the coalesced shape and each
/// operand's strides, padded to MAX_RANK: the `info` of the one-invocation-per-element kernels.
fn strided_info(mut head: Vec<u32>, layouts: &[&Layout]) -> Vec<u32> {
    let strides: Vec<&[usize]> = layouts.iter().map(|l| l.strides()).collect();
    let (shape, st) = coalesce(layouts[0].shape(), &strides);
    head[1] = shape.len() as u32;
    push_dims(&mut head, &shape, 1);
    for s in &st {
        push_dims(&mut head, s, 0);
    }
    head
}

/// The entry point of a unary or binary kernel for its `info` (`head` values before the
/// coalesced shape, `operands` operands): `contiguous` when every operand is one axis of stride 1,
/// `rows` (binary only) for two axes, else `main`, which works out every operand's offset axis
/// by axis.
fn entry(info: &[u32], head: usize, operands: usize) -> &'static str {
    let rank = info[1] as usize;
    let stride = |o: usize| info[head + MAX_RANK * (1 + o)];
    if rank == 1 && (0..operands).all(|o| stride(o) == 1) {
        "contiguous"
    } else if rank == 2 && operands == 2 {
        "rows"
    } else {
        "main"
    }
}

/// `op(x)`, contiguous output.
pub fn unary(op: UnaryOp, s: &GpuStorage, l: &Layout) -> Result<GpuStorage> {
    check_rank(op.name(), l)?;
    let out = GpuStorage::alloc(&s.ctx, l.numel(), DType::F32)?;
    let [p0, p1] = op.params();
    let info = strided_info(vec![l.numel() as u32, 0, l.offset() as u32, p0.to_bits(), p1.to_bits()], &[l]);
    let kernel = format!("unary/{}", op.name());
    s.ctx.dispatch(&kernel, entry(&info, 5, 1), &info, &[&s.buf, &out.buf], s.ctx.grid_1d(l.numel()))?;
    Ok(out)
}

/// `op(a, b)` for two layouts of one shape.
pub fn binary(op: BinaryOp, a: &GpuStorage, la: &Layout, b: &GpuStorage, lb: &Layout) -> Result<GpuStorage> {
    binary_kernel(&format!("binary/{}", op.name()), op.name(), a, la, b, lb, None)
}

/// `op(a + b)` for two layouts of one shape, in one pass (a layer's bias and activation).
pub fn add_unary(op: UnaryOp, a: &GpuStorage, la: &Layout, b: &GpuStorage, lb: &Layout) -> Result<GpuStorage> {
    binary_kernel(&format!("add_unary/{}", op.name()), "add_unary", a, la, b, lb, Some(op.params()))
}

/// `g * op'(v)` in one pass (see `cpu::unary_grad`): binary.wgsl as `unary_grad/<op>`.
pub fn unary_grad(op: UnaryOp, v: &GpuStorage, lv: &Layout, g: &GpuStorage, lg: &Layout) -> Result<GpuStorage> {
    binary_kernel(&format!("unary_grad/{}", op.name()), "unary_backward", v, lv, g, lg, Some(op.params()))
}

/// A dispatch of binary.wgsl as `kernel`; `params`: the unary op's of an `add_unary` or `unary_grad` kernel.
fn binary_kernel(
    kernel: &str,
    name: &'static str,
    a: &GpuStorage,
    la: &Layout,
    b: &GpuStorage,
    lb: &Layout,
    params: Option<[f32; 2]>,
) -> Result<GpuStorage> {
    check_rank(name, la)?;
    let out = GpuStorage::alloc(&a.ctx, la.numel(), DType::F32)?;
    let mut info = strided_info(vec![la.numel() as u32, 0, la.offset() as u32, lb.offset() as u32], &[la, lb]);
    let at = entry(&info, 4, 2);
    info.extend(params.into_iter().flatten().map(f32::to_bits));
    a.ctx.dispatch(kernel, at, &info, &[&a.buf, &b.buf, &out.buf], a.ctx.grid_1d(la.numel()))?;
    Ok(out)
}

/// `mask != 0 ? a : b`.
pub fn where_cond(
    m: &GpuStorage,
    lm: &Layout,
    a: &GpuStorage,
    la: &Layout,
    b: &GpuStorage,
    lb: &Layout,
) -> Result<GpuStorage> {
    check_rank("where_cond", la)?;
    let out = GpuStorage::alloc(&a.ctx, la.numel(), DType::F32)?;
    let head = vec![la.numel() as u32, 0, lm.offset() as u32, la.offset() as u32, lb.offset() as u32];
    let info = strided_info(head, &[lm, la, lb]);
    a.ctx.dispatch("where", "main", &info, &[&m.buf, &a.buf, &b.buf, &out.buf], a.ctx.grid_1d(la.numel()))?;
    Ok(out)
}

/// Copy the 32-bit elements of `src` (layout `ls`) to the positions of `ld` in `dst`.
pub fn copy_into(src: &GpuStorage, ls: &Layout, dst: &GpuStorage, ld: &Layout) -> Result<()> {
    check_rank("copy", ls)?;
    let info = copy_info(ls, ld);
    src.ctx.dispatch("copy", "main", &info, &[&src.buf, &dst.buf], src.ctx.grid_1d(ls.numel()))
}

/// copy.wgsl's `info` for a copy of `ls` into `ld` (one part's in concat.wgsl).
pub(super) fn copy_info(ls: &Layout, ld: &Layout) -> Vec<u32> {
    strided_info(vec![ls.numel() as u32, 0, ls.offset() as u32, ld.offset() as u32], &[ls, ld])
}

/// Convert a strided tensor to another dtype (contiguous output).
pub fn cast(s: &GpuStorage, l: &Layout, from: DType, to: DType) -> Result<GpuStorage> {
    check_rank("cast", l)?;
    if from == to {
        if from == DType::F16 {
            return Err(Error::invalid(
                "cast",
                "a strided f16 -> f16 copy is not supported on the GPU; cast to f32 first",
            ));
        }
        return super::contiguous(s, l);
    }
    let out = GpuStorage::alloc(&s.ctx, l.numel(), to)?;
    let mut info = vec![l.numel() as u32, l.rank() as u32, l.offset() as u32];
    push_dims(&mut info, l.shape(), 1);
    push_dims(&mut info, l.strides(), 0);
    let kernel = match (from, to) {
        (DType::F16, t) if t != DType::F32 => {
            return cast(&cast(s, l, from, DType::F32)?, &Layout::contiguous(l.shape()), DType::F32, to);
        }
        (f, DType::F16) if f != DType::F32 => {
            return cast(&cast(s, l, from, DType::F32)?, &Layout::contiguous(l.shape()), DType::F32, to);
        }
        _ => format!("cast/{}_{}", from.name(), to.name()),
    };
    s.ctx.dispatch(&kernel, "main", &info, &[&s.buf, &out.buf], s.ctx.grid_1d(l.numel()))?;
    Ok(out)
}

/// A buffer of `n` 32-bit elements all set to `bits`.
pub fn fill(ctx: &Arc<GpuContext>, n: usize, bits: u32) -> Result<GpuStorage> {
    let out = GpuStorage::alloc(ctx, n, DType::F32)?;
    ctx.dispatch("fill", "main", &[n as u32, bits], &[&out.buf], ctx.grid_1d(n))?;
    Ok(out)
}

/// `n` uniform values in [0, 1) of stream `key` from counter `start` (the Cpu's `rng::uniform`).
pub fn rand_uniform(ctx: &Arc<GpuContext>, n: usize, key: u32, start: u32) -> Result<GpuStorage> {
    let out = GpuStorage::alloc(ctx, n, DType::F32)?;
    ctx.dispatch("rand", "main", &[n as u32, key, start], &[&out.buf], ctx.grid_1d(n))?;
    Ok(out)
}
