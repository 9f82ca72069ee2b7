//! Launchers of the convolution and pooling kernels (`conv.wgsl`, `pool.wgsl`,
//! `pool_grad.wgsl`): one invocation per output element, every operand contiguous from 0.

use super::{GpuStorage, check_layout, contiguous};
use crate::conv::{ConvPass, PoolKind, Window2d};
use crate::{DType, Layout, Result};

/// `s` as a contiguous buffer starting at element 0 (a copy only when it is not already).
fn packed(s: &GpuStorage, l: &Layout, op: &'static str) -> Result<GpuStorage> {
    check_layout(op, l)?;
    if l.is_contiguous() && l.offset() == 0 { Ok(s.clone()) } else { contiguous(s, l) }
}

/// One pass of a convolution: `a` and `b` are (x, kernel), (dy, kernel) or (x, dy) by `pass`.
pub fn conv2d(
    pass: ConvPass,
    a: &GpuStorage,
    la: &Layout,
    b: &GpuStorage,
    lb: &Layout,
    g: &Window2d,
) -> Result<GpuStorage> {
    let (a, b) = (packed(a, la, "conv2d")?, packed(b, lb, "conv2d")?);
    let c_out = lb.shape()[3];
    let total = match pass {
        ConvPass::Forward => g.batch * g.output[0] * g.output[1] * c_out,
        ConvPass::InputGrad => g.batch * g.input[0] * g.input[1] * g.channels,
        ConvPass::KernelGrad => g.kernel[0] * g.kernel[1] * g.channels * c_out,
    };
    let out = GpuStorage::alloc(&a.ctx, total, DType::F32)?;
    let mut info = g.info();
    info.extend([c_out as u32, total as u32]);
    a.ctx.dispatch("conv", pass.entry(), &info, &[&a.buf, &b.buf, &out.buf], a.ctx.grid_1d(total))?;
    Ok(out)
}

/// Max or average pooling.
pub fn pool2d(kind: PoolKind, x: &GpuStorage, lx: &Layout, g: &Window2d) -> Result<GpuStorage> {
    let x = packed(x, lx, "pool2d")?;
    let total = g.batch * g.output[0] * g.output[1] * g.channels;
    let out = GpuStorage::alloc(&x.ctx, total, DType::F32)?;
    let mut info = g.info();
    info.push(total as u32);
    let entry = match kind {
        PoolKind::Max => "max_pool",
        PoolKind::Avg => "avg_pool",
    };
    x.ctx.dispatch("pool", entry, &info, &[&x.buf, &out.buf], x.ctx.grid_1d(total))?;
    Ok(out)
}

/// The input gradient of pooling, from the output's `dy`.
pub fn pool2d_grad(
    kind: PoolKind,
    x: &GpuStorage,
    lx: &Layout,
    dy: &GpuStorage,
    ldy: &Layout,
    g: &Window2d,
) -> Result<GpuStorage> {
    let (x, dy) = (packed(x, lx, "pool2d backward")?, packed(dy, ldy, "pool2d backward")?);
    let total = g.batch * g.input[0] * g.input[1] * g.channels;
    let out = GpuStorage::alloc(&x.ctx, total, DType::F32)?;
    let mut info = g.info();
    info.push(total as u32);
    let entry = match kind {
        PoolKind::Max => "max_grad",
        PoolKind::Avg => "avg_grad",
    };
    x.ctx.dispatch("pool_grad", entry, &info, &[&x.buf, &dy.buf, &out.buf], x.ctx.grid_1d(total))?;
    Ok(out)
}
