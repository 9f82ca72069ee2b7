//! Launchers for kernels that give a workgroup a run of elements: reductions (and a split
//! product's sum with a dense layer's bias and op), softmax and its backward, layer norm and its
//! backward. cross_entropy.rs picks its entry points with [`row_entry`] too.

use super::{GpuStorage, check_rank, push_dims};
use crate::ops::{ReduceOp, UnaryOp};
use crate::{DType, Layout, Result};

/// Runs shorter than this are reduced by one invocation each (`main_small`); longer runs get a
/// workgroup per chunk (`main`), except runs down columns (an invocation per chunk, see
/// [`COLUMN_CHUNK`]) and some on a software adapter (see [`SOFTWARE_RUN`]).
const SMALL_RUN: usize = 64;

/// On a software adapter (lavapipe: workgroups are CPU tasks, and each of `main`'s eight barriers
/// switches between its 256 invocations), runs up to this long are also reduced one invocation
/// each when there are at least `SOFTWARE_MIN_OUTPUTS` of them (256 outputs make one workgroup,
/// one CPU task, still far quicker than 256 workgroups with their barriers): a bias's gradient,
/// the sum over a batch of 256 rows of 1,024 columns, took 9.8 ms on lavapipe as 1,024
/// workgroups of `main` and 1.2 ms so (a 2-core Xeon). Real GPUs keep `main`, whose workgroups
/// fill their many cores.
const SOFTWARE_RUN: usize = 1024;

/// See [`SOFTWARE_RUN`].
const SOFTWARE_MIN_OUTPUTS: usize = 256;

/// The most elements one invocation of `main_small` sums down columns: a reduction whose kept
/// axes end in adjacent values (the outputs side by side in memory) while its own values lie
/// apart, as a bias's gradient over `[tokens, features]`. There a workgroup per output (`main`)
/// would read one value per row apart from its neighbours' and wait at eight barriers; an
/// invocation per output and chunk reads a row's values side by side, and chunks spread a long
/// column over the adapter: as many as give it [`GpuContext::parallel_width`] full workgroups,
/// of [`MIN_COLUMN_CHUNK`] to this many rows. (Lavapipe, 2 threads, a sum over 2,048 rows of
/// 128: 3.3 ms by `main`, 1.1 ms so.)
///
/// [`GpuContext::parallel_width`]: super::GpuContext::parallel_width
const COLUMN_CHUNK: usize = 256;

/// See [`COLUMN_CHUNK`].
const MIN_COLUMN_CHUNK: usize = 32;

/// Elements one workgroup of `main` reduces: 32 per invocation. A longer run is cut into chunks
/// whose partial results are reduced again (see reduce.wgsl), so no invocation loops long (error
/// and llvmpipe's loop budget) and a long run uses many workgroups.
const CHUNK: usize = 256 * 32;

/// Rows longer than this are not given to one workgroup (softmax and layer norm loop over the
/// row three times per invocation, layer norm's backward four, softmax's two: 16,384 iterations at this length,
/// well inside llvmpipe's budget of 65,535); `long_rows` composes them from chunked reductions
/// and elementwise kernels instead (and autograd the backward from tensor ops).
pub(super) const LONG_ROW: usize = 1 << 20;

/// One pass's input: where the runs are, and (after the first pass) the partials' indices.
struct Pass {
    values: GpuStorage,
    indices: Option<GpuStorage>,
    offset: usize,
    outer: (Vec<usize>, Vec<usize>),
    inner: (Vec<usize>, Vec<usize>),
}

/// Reduce `axes` (output: the input shape with reduced axes of size 1, contiguous).
pub fn reduce(op: ReduceOp, s: &GpuStorage, l: &Layout, axes: &[usize]) -> Result<GpuStorage> {
    reduce_finished(op, s, l, axes, None)
}

/// The sum over `axes`, each output `o` then stored as `op(v + bias[offset + o % columns])`
/// (`reduce/sum/<op>` on the last pass): a split product's slices summed into a dense layer's
/// output, with no pass of its own for the bias and op; the values `add_unary` gives the sum.
pub(super) fn sum_add_unary(
    s: &GpuStorage,
    l: &Layout,
    axes: &[usize],
    (bias, offset): (&GpuStorage, usize),
    columns: usize,
    op: UnaryOp,
) -> Result<GpuStorage> {
    reduce_finished(ReduceOp::Sum, s, l, axes, Some(Finish { bias, offset, columns, op }))
}

/// What the last pass of a sum applies to each output (see `sum_add_unary`).
struct Finish<'a> {
    bias: &'a GpuStorage,
    offset: usize,
    columns: usize,
    op: UnaryOp,
}

fn reduce_finished(
    op: ReduceOp,
    s: &GpuStorage,
    l: &Layout,
    axes: &[usize],
    finish: Option<Finish>,
) -> Result<GpuStorage> {
    // (`reduce/<op>/<unary>` exists for the sum alone: the bias takes argmax's binding 3.)
    debug_assert!(finish.is_none() || op == ReduceOp::Sum, "a finish on a reduction other than the sum");
    check_rank(op.name(), l)?;
    let kept: Vec<usize> = (0..l.rank()).filter(|a| !axes.contains(a)).collect();
    let pick = |of: &[usize], which: &[usize]| -> Vec<usize> { which.iter().map(|&a| of[a]).collect() };
    let n_out: usize = kept.iter().map(|&a| l.shape()[a]).product();
    let kernel = format!("reduce/{}", op.name());
    let arg = op == ReduceOp::ArgMax;
    let software = s.ctx.is_software();
    // Kept and reduced axes each merged where they walk as one run: every value's offset is
    // worked out by a division per axis (`strided_offset`), none for one axis.
    let merged = |which: &[usize]| -> (Vec<usize>, Vec<usize>) {
        let (shape, strides) = crate::layout::coalesce(&pick(l.shape(), which), &[&pick(l.strides(), which)]);
        (shape.to_vec(), strides[0].to_vec())
    };
    let mut pass =
        Pass { values: s.clone(), indices: None, offset: l.offset(), outer: merged(&kept), inner: merged(axes) };
    loop {
        let n_red: usize = pass.inner.0.iter().product();
        let small = n_red < SMALL_RUN || (software && n_red <= SOFTWARE_RUN && n_out >= SOFTWARE_MIN_OUTPUTS);
        let (entry, chunk) = match (small, down_columns(&pass)) {
            (_, true) => {
                let invocations = s.ctx.parallel_width() * 256;
                let rows = (n_red * n_out).div_ceil(invocations.max(1));
                ("main_small", rows.clamp(MIN_COLUMN_CHUNK, COLUMN_CHUNK))
            }
            (true, false) => ("main_small", n_red.max(1)),
            (false, false) => ("main", CHUNK),
        };
        let n_chunks = n_red.div_ceil(chunk).max(1);
        let groups = n_out * n_chunks;
        let out_v = GpuStorage::alloc(&s.ctx, groups, DType::F32)?;
        let out_i = if arg { GpuStorage::alloc(&s.ctx, groups, DType::U32)? } else { out_v.clone() };
        let mut info = vec![
            n_out as u32,
            n_red as u32,
            pass.outer.0.len() as u32,
            pass.inner.0.len() as u32,
            pass.offset as u32,
            chunk as u32,
            n_chunks as u32,
            u32::from(pass.indices.is_some()),
        ];
        push_dims(&mut info, &pass.outer.0, 1);
        push_dims(&mut info, &pass.outer.1, 0);
        push_dims(&mut info, &pass.inner.0, 1);
        push_dims(&mut info, &pass.inner.1, 0);
        // argmax binds the input indices (its own values on the first pass, where they are unread).
        let xi = pass.indices.as_ref().unwrap_or(&pass.values);
        let mut buffers = vec![&pass.values.buf, &out_v.buf];
        if arg {
            buffers.extend([&xi.buf, &out_i.buf]);
        }
        let grid = if entry == "main" { s.ctx.grid_for(groups) } else { s.ctx.grid_1d(groups) };
        match finish.as_ref().filter(|_| n_chunks == 1) {
            Some(f) => {
                info.extend([f.offset as u32, f.columns as u32]);
                info.extend(f.op.params().map(f32::to_bits));
                buffers.push(&f.bias.buf);
                s.ctx.dispatch(&format!("{kernel}/{}", f.op.name()), entry, &info, &buffers, grid)?;
            }
            None => s.ctx.dispatch(&kernel, entry, &info, &buffers, grid)?,
        }
        if n_chunks == 1 {
            return Ok(if arg { out_i } else { out_v });
        }
        pass = Pass {
            indices: if arg { Some(out_i) } else { None },
            values: out_v,
            offset: 0,
            outer: (vec![n_out], vec![n_chunks]),
            inner: (vec![n_chunks], vec![1]),
        };
    }
}

/// Whether a pass sums down columns (see [`COLUMN_CHUNK`]): its last kept axis holds adjacent
/// values and its last reduced axis does not (axes of one element aside).
fn down_columns(pass: &Pass) -> bool {
    let last = |(shape, strides): &(Vec<usize>, Vec<usize>)| {
        shape.iter().zip(strides).rev().find(|(d, _)| **d > 1).map(|(_, &s)| s)
    };
    last(&pass.outer) == Some(1) && last(&pass.inner).is_some_and(|s| s != 1)
}

/// Rows at most this long are worked by one invocation each (`main_short` of softmax.wgsl,
/// softmax_grad.wgsl, layer_norm.wgsl and layer_norm_grad.wgsl) on any adapter: a workgroup of
/// 256 per row would leave most of it idle through every barrier.
const SHORT_ROW: usize = 32;

/// On a software adapter (lavapipe), rows up to this long too, when there are at least
/// [`SOFTWARE_MIN_OUTPUTS`] of them: there each barrier is a context switch. A tiny decoder's
/// training step (rows of 11 scores and of 64 features) ran 1.3x as fast so, on a 2-core Xeon.
const SOFTWARE_SHORT_ROW: usize = 1024;

/// The entry point and grid for `rows` rows of `n` values on `ctx`: `main_short` (one invocation
/// per row) or `main` (one workgroup per row). An invocation of `main_short` runs about `3n + 12`
/// loop iterations per row (three passes, the row loop, the outer axes' offset), and rows stay
/// few enough per invocation for llvmpipe's loop budget (65,535 iterations, see `CHUNK`): at
/// most 2^15 counted so, half the budget.
pub(super) fn row_entry(ctx: &super::GpuContext, rows: usize, n: usize) -> (&'static str, [u32; 3]) {
    row_entry_passes(ctx, rows, n, 3)
}

/// [`row_entry`] for a kernel that walks each row `passes` times. Half the budget also covers
/// layer norm's backward, which reads two strided offsets a row (`4n + 15` iterations, counted
/// as `4n + 12`), and softmax's (`2n + 15`, counted as `2n + 12`).
fn row_entry_passes(ctx: &super::GpuContext, rows: usize, n: usize, passes: usize) -> (&'static str, [u32; 3]) {
    let software = ctx.is_software();
    let short = n <= SHORT_ROW || (software && n <= SOFTWARE_SHORT_ROW && rows >= SOFTWARE_MIN_OUTPUTS);
    let per_invocation = rows.div_ceil(256 * super::context::MAX_1D_GROUPS);
    if short && per_invocation * (passes * n + 12) <= 1 << 15 {
        ("main_short", ctx.grid_1d(rows))
    } else {
        ("main", ctx.grid_for(rows))
    }
}

/// `info` head shared by the row kernels: rows, row length, outer rank, offset, last stride.
fn row_info(l: &Layout) -> (Vec<u32>, usize) {
    let r = l.rank();
    let n = l.shape()[r - 1];
    let rows = l.numel() / n.max(1);
    let info = vec![rows as u32, n as u32, (r - 1) as u32, l.offset() as u32, l.strides()[r - 1] as u32];
    (info, rows)
}

fn push_outer(info: &mut Vec<u32>, l: &Layout) {
    let r = l.rank();
    push_dims(info, &l.shape()[..r - 1], 1);
    push_dims(info, &l.strides()[..r - 1], 0);
}

/// Softmax or log-softmax over the last axis.
pub fn softmax(s: &GpuStorage, l: &Layout, log: bool) -> Result<GpuStorage> {
    check_rank("softmax", l)?;
    if l.shape()[l.rank() - 1] > LONG_ROW {
        return super::long_rows::softmax(s, l, log);
    }
    let out = GpuStorage::alloc(&s.ctx, l.numel(), DType::F32)?;
    let (mut info, rows) = row_info(l);
    push_outer(&mut info, l);
    let kernel = if log { "softmax/log" } else { "softmax/softmax" };
    let n = l.shape()[l.rank() - 1];
    let (entry, grid) = row_entry(&s.ctx, rows, n);
    s.ctx.dispatch(kernel, entry, &info, &[&s.buf, &out.buf], grid)?;
    Ok(out)
}

/// Softmax's (`log`: log-softmax's) backward over the last axis in one dispatch
/// (softmax_grad.wgsl): the input's gradient, contiguous, from the forward's output `y` and the
/// output's gradient `g` (any layouts of one shape). `None` for rows too long for one workgroup
/// ([`LONG_ROW`]): autograd composes those.
pub fn softmax_grad(
    (y, ly): (&GpuStorage, &Layout),
    (g, lg): (&GpuStorage, &Layout),
    log: bool,
) -> Result<Option<GpuStorage>> {
    check_rank("softmax_grad", ly)?;
    let n = ly.shape()[ly.rank() - 1];
    if n > LONG_ROW || lg.shape() != ly.shape() {
        return Ok(None);
    }
    let dx = GpuStorage::alloc(&y.ctx, ly.numel(), DType::F32)?;
    let (mut info, rows) = row_info(ly);
    push_outer(&mut info, ly);
    // g's offset, last stride and outer strides (its shape is y's).
    let r = lg.rank();
    info.push(lg.offset() as u32);
    info.push(lg.strides()[r - 1] as u32);
    push_dims(&mut info, &lg.strides()[..r - 1], 0);
    let kernel = if log { "softmax_grad/log" } else { "softmax_grad/softmax" };
    let (entry, grid) = row_entry_passes(&y.ctx, rows, n, 2);
    y.ctx.dispatch(kernel, entry, &info, &[&y.buf, &g.buf, &dx.buf], grid)?;
    Ok(Some(dx))
}

/// Layer norm over the last axis; `gamma` and `beta` must be contiguous vectors.
pub fn layer_norm(s: &GpuStorage, l: &Layout, gamma: &GpuStorage, beta: &GpuStorage, eps: f32) -> Result<GpuStorage> {
    check_rank("layer_norm", l)?;
    if l.shape()[l.rank() - 1] > LONG_ROW {
        return super::long_rows::layer_norm(s, l, gamma, beta, eps);
    }
    let out = GpuStorage::alloc(&s.ctx, l.numel(), DType::F32)?;
    let (mut info, rows) = row_info(l);
    info.push(eps.to_bits());
    push_outer(&mut info, l);
    let n = l.shape()[l.rank() - 1];
    let (entry, grid) = row_entry(&s.ctx, rows, n);
    s.ctx.dispatch("layer_norm", entry, &info, &[&s.buf, &gamma.buf, &beta.buf, &out.buf], grid)?;
    Ok(out)
}

/// Layer norm's backward over the last axis in one dispatch (layer_norm_grad.wgsl): `(dx, g *
/// xhat)`, both contiguous of `x`'s shape, for the input `x`, gamma (`n` contiguous values from
/// its start) and the output's gradient `g` (any layout of `x`'s shape: a broadcast view too).
/// `None` for rows too long for one workgroup ([`LONG_ROW`]): autograd composes those.
pub fn layer_norm_grad(
    (x, lx): (&GpuStorage, &Layout),
    gamma: &GpuStorage,
    (g, lg): (&GpuStorage, &Layout),
    eps: f32,
) -> Result<Option<(GpuStorage, GpuStorage)>> {
    check_rank("layer_norm_grad", lx)?;
    let n = lx.shape()[lx.rank() - 1];
    if n > LONG_ROW || lg.shape() != lx.shape() {
        return Ok(None);
    }
    let dx = GpuStorage::alloc(&x.ctx, lx.numel(), DType::F32)?;
    let q = GpuStorage::alloc(&x.ctx, lx.numel(), DType::F32)?;
    let (mut info, rows) = row_info(lx);
    info.push(eps.to_bits());
    push_outer(&mut info, lx);
    // g's offset, last stride and outer strides (its shape is x's).
    let r = lg.rank();
    info.push(lg.offset() as u32);
    info.push(lg.strides()[r - 1] as u32);
    push_dims(&mut info, &lg.strides()[..r - 1], 0);
    let (entry, grid) = row_entry_passes(&x.ctx, rows, n, 4);
    x.ctx.dispatch("layer_norm_grad", entry, &info, &[&x.buf, &gamma.buf, &g.buf, &dx.buf, &q.buf], grid)?;
    Ok(Some((dx, q)))
}
