//! Convolution on the Cpu (pooling is in `pooling`). A convolution is a matrix product over "columns": each
//! output position's window, unrolled (im2col), times the kernel seen as a
//! `[kh * kw * c_in, c_out]` matrix, so the gemm engine does the work. The columns are built a
//! block of rows at a time (about 256 KiB) and multiplied while they are still in the core's
//! cache, the blocks spread over the threads: they never travel through memory, and their
//! memory stays bounded. Each product writes straight into its rows of the result. Where weft's
//! kernel takes the product (256- or 512-bit tiles), the forward product reads the windows where they lie instead
//! (`conv_windows`: the same sums in the same order, nothing unrolled), and so does the input's
//! gradient with unit strides (a convolution of dy); the kernel's gradient still unrolls.

use super::gemm_engine::{Product, engine};
use super::packed_gemm::{NR, PackedRhs};
use super::{CpuStorage, HostBuf, f32_storage, strided, try_take, try_zeros};
use crate::conv::Window2d;
use crate::ops::UnaryOp;
use crate::{Error, Layout, Result};
use std::mem::MaybeUninit;
use std::sync::Arc;

/// Output positions per sample, and the length of one unrolled window.
fn sizes(g: &Window2d) -> (usize, usize) {
    (g.output[0] * g.output[1], g.kernel[0] * g.kernel[1] * g.channels)
}

/// Whether the columns are the input itself (a 1x1 window reading every position once).
fn identity_columns(g: &Window2d) -> bool {
    g.kernel == [1, 1] && g.strides == [1, 1] && g.pad == [0, 0]
}

pub(super) fn write(dst: &mut [MaybeUninit<f32>], src: &[f32]) {
    debug_assert_eq!(dst.len(), src.len());
    dst.iter_mut().zip(src).for_each(|(d, &s)| {
        d.write(s);
    });
}

pub(super) fn fill_zero(dst: &mut [MaybeUninit<f32>]) {
    dst.iter_mut().for_each(|d| {
        d.write(0.0);
    });
}

/// Row `row` of the unrolled windows (output position `row % per` of sample `row / per`): the
/// `(ky, kx, ci)` values of its window, zeros where a tap falls in the padding, every value
/// written once; a row of taps that lies inside the input is one copy.
pub(super) fn unroll_row(x: &[f32], g: &Window2d, row: usize, dst: &mut [MaybeUninit<f32>]) {
    let per = g.output[0] * g.output[1];
    let [h, w] = g.input;
    let (c, kw) = (g.channels, g.kernel[1]);
    let n = row / per;
    let (oh, ow) = ((row % per) / g.output[1], row % g.output[1]);
    for (ky, line) in dst.chunks_mut(kw * c).enumerate() {
        let Some(iy) = g.source(0, oh, ky) else {
            fill_zero(line);
            continue;
        };
        let at = (n * h + iy) * w;
        // Adjacent taps (no dilation), all inside the input: one run of the row.
        if g.dilation[1] == 1
            && let (Some(first), Some(_)) = (g.source(1, ow, 0), g.source(1, ow, kw - 1))
        {
            write(line, &x[(at + first) * c..(at + first + kw) * c]);
            continue;
        }
        for (kx, tap) in line.chunks_mut(c).enumerate() {
            match g.source(1, ow, kx) {
                Some(ix) => write(tap, &x[(at + ix) * c..(at + ix + 1) * c]),
                None => fill_zero(tap),
            }
        }
    }
}

/// Rows of unrolled windows per block when a block is unrolled and multiplied at once: about
/// 256 KiB of them, so they are still in the core's L2 cache when the product reads them (a
/// multiple of the micro-kernel's 6 rows).
pub(super) fn block_rows(k: usize) -> usize {
    ((1 << 16) / k.max(1)).clamp(6, 1536) / 6 * 6
}

/// `s` laid out contiguously from element 0: itself (shared) when it already is, else a copy.
/// Tensor-level callers pass packed operands, so for them nothing is copied.
fn packed(s: &CpuStorage, l: &Layout, op: &'static str) -> Result<CpuStorage> {
    if l.is_contiguous() && l.offset() == 0 {
        return Ok(s.clone());
    }
    Ok(f32_storage(strided(s.f32s(op)?, l)?.into_vec()?))
}

/// A scratch buffer that goes back to the buffer cache when dropped.
#[derive(Default)]
pub(super) struct Scratch(pub(super) Vec<f32>);

impl Drop for Scratch {
    fn drop(&mut self) {
        drop(HostBuf::new(std::mem::take(&mut self.0)));
    }
}

/// A matrix operand: its values and its row and column strides.
type Operand<'a> = (&'a [f32], usize, usize);

/// `dst = a @ b` for an `m x k` left and a `k x n` right matrix read with their strides, the
/// `m x n` result written row-major into every element of `dst`; `parallel`: on every thread
/// for a large product (as `matmul` runs a single matrix), else on this thread.
fn gemm(
    dst: &mut [MaybeUninit<f32>],
    (m, n, k): (usize, usize, usize),
    a: Operand,
    b: Operand,
    parallel: bool,
    kept: Option<&PackedRhs>,
) -> Result<()> {
    if dst.len() != m * n {
        return Err(Error::invalid("conv2d", format!("a {m}x{n} product into {} values", dst.len())));
    }
    if k == 0 || dst.is_empty() {
        // No sums to take (an empty batch): zeros.
        fill_zero(dst);
        return Ok(());
    }
    let reach = |(v, rs, cs): Operand, rows: usize, cols: usize| (rows - 1) * rs + (cols - 1) * cs < v.len();
    if !reach(a, m, k) || !reach(b, k, n) {
        return Err(Error::invalid("conv2d", format!("product {m}x{k} @ {k}x{n} does not fit its buffers")));
    }
    let threads = rayon::current_num_threads();
    let p = Product {
        m,
        n,
        k,
        dst: dst.as_mut_ptr().cast(),
        dst_rs: n as isize,
        lhs: a.0.as_ptr(),
        lhs_rs: a.1 as isize,
        lhs_cs: a.2 as isize,
        rhs: b.0.as_ptr(),
        rhs_rs: b.1 as isize,
        rhs_cs: b.2 as isize,
    };
    let threads = if parallel && m * n * k >= 1 << 18 && threads > 1 { threads } else { 1 };
    #[cfg(target_arch = "x86_64")]
    if let Some(rhs) = kept.filter(|r| r.dims() == (k, n) && super::gemm_engine::on_weft(engine(), m, n, k)) {
        // SAFETY: as below; weft's engine runs here (AVX2 and FMA), and `rhs` is b packed.
        return unsafe { super::blocked_gemm::run(&p, Some(rhs), threads) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = kept;
    // SAFETY: checked above: every element the strides reach lies inside its slice, and dst
    // holds the m x n output, which only this call writes.
    unsafe { p.run(engine(), threads) }
}

/// In inference (no gradient recorded, outside a backward pass), the `kk x c_out` kernel packed
/// for weft's product once for all the blocks of a call, and kept from its second use on by its
/// storage, as a dense layer's weights are (`matmul`): each block packed it again before, 2.6% of
/// a CIFAR-sized CNN's inference on a 2-core Zen 3. `None` elsewhere (in training a kernel is new
/// storage every step).
fn kept_kernel(kernel: &CpuStorage, kk: usize, c_out: usize) -> Result<Option<Arc<PackedRhs>>> {
    let inference = crate::backprop::inference();
    match kernel {
        CpuStorage::F32(buf) if inference && c_out >= NR && kk > 0 && super::packed_gemm::available() => {
            Ok(Some(buf.packed_rhs((0, c_out, 1, kk, c_out))?))
        }
        _ => Ok(None),
    }
}

/// `y = conv(x, kernel)`: `x` `[n, h, w, c_in]`, `kernel` `[kh, kw, c_in, c_out]`.
/// With `epilogue` (a bias over the output channels and an op), each block of output rows
/// becomes `op(rows + bias)` right after its product, while still in cache.
pub fn conv2d(
    x: &CpuStorage,
    lx: &Layout,
    k: &CpuStorage,
    lk: &Layout,
    g: &Window2d,
    epilogue: Option<(&[f32], UnaryOp)>,
) -> Result<CpuStorage> {
    let xs = strided(x.f32s("conv2d")?, lx)?;
    let kernel = packed(k, lk, "conv2d")?;
    let (per, kk) = sizes(g);
    let c_out = lk.shape()[3];
    let kept = kept_kernel(&kernel, kk, c_out)?;
    let kernel = kernel.f32s("conv2d")?;
    let len = g.batch * per * c_out;
    let mut y = try_take(len)?;
    let out = &mut y.spare_capacity_mut()[..len];
    // SAFETY (both uses): the product just wrote every value of the rows.
    let finish = |rows: &mut [MaybeUninit<f32>]| {
        if let Some((bias, op)) = epilogue {
            super::elementwise::add_unary_rows_in_place(unsafe { written_mut(rows) }, bias, op);
        }
    };
    if identity_columns(g) {
        gemm(out, (g.batch * per, c_out, kk), (&xs, kk, 1), (kernel, c_out, 1), true, kept.as_deref())?;
        if let Some((bias, op)) = epilogue {
            // SAFETY: the product just wrote every value.
            super::elementwise::add_unary_rows_par(unsafe { written_mut(out) }, bias, op);
        }
    } else if super::conv_windows::suits(g) {
        // The windows read where they lie, never unrolled: the kernel packed once for the call
        // (or kept, in inference).
        let fresh;
        let packed = match kept.as_deref() {
            Some(p) => p,
            None => {
                fresh = PackedRhs::pack(kernel, 0, c_out, 1, kk, c_out)?;
                &fresh
            }
        };
        super::conv_windows::conv2d(&xs, g, packed, out, &finish)?;
    } else {
        // Blocks of rows, each unrolled into a scratch buffer that stays in cache and multiplied
        // at once into its rows of y, the blocks spread over the threads (the unrolled windows
        // never travel through memory).
        let rows = block_rows(kk);
        let block = |scratch: &mut Scratch, (b, y_rows): (usize, &mut [MaybeUninit<f32>])| -> Result<()> {
            let m = y_rows.len() / c_out;
            if scratch.0.capacity() < m * kk {
                scratch.0 = try_take(rows * kk)?;
            }
            let cols = &mut scratch.0.spare_capacity_mut()[..m * kk];
            for (r, dst) in cols.chunks_mut(kk).enumerate() {
                unroll_row(&xs, g, b * rows + r, dst);
            }
            // SAFETY: unroll_row wrote every value of the m rows.
            let cols = unsafe { written(cols) };
            gemm(y_rows, (m, c_out, kk), (cols, kk, 1), (kernel, c_out, 1), false, kept.as_deref())?;
            finish(y_rows);
            Ok(())
        };
        super::share::try_par_chunks_mut(out, rows * c_out, |s, i, chunk| block(s, (i, chunk)))?;
    }
    // SAFETY: the products wrote every row: all len values.
    unsafe { y.set_len(len) };
    Ok(f32_storage(y))
}

/// With unit strides, the convolution whose output is `g`'s input's gradient: over `g`'s output
/// (`c_out` channels), the same window and dilation, padded so that input position `i` reads
/// the outputs whose windows held it (output `i + pad - k * d` at tap `k`, in turned order:
/// padding `(kernel - 1) * dilation - pad` before).
fn transposed(g: &Window2d, c_out: usize) -> Option<Window2d> {
    let reach = |a: usize| (g.kernel[a] - 1) * g.dilation[a];
    let pad = [reach(0).checked_sub(g.pad[0])?, reach(1).checked_sub(g.pad[1])?];
    (g.strides == [1, 1]).then_some(Window2d {
        batch: g.batch,
        input: g.output,
        channels: c_out,
        kernel: g.kernel,
        strides: [1, 1],
        dilation: g.dilation,
        pad,
        output: g.input,
    })
}

/// The gradient of `conv2d` with respect to its input, from the output's `dy`. With unit
/// strides and 8 input channels or more where windows are read in place, a convolution of dy
/// (`transposed`); otherwise per sample (in parallel), blocks of its rows' column gradients (dy's
/// rows times the kernel transposed), each added into the sample's input gradient (col2im) while
/// still in cache.
pub fn conv2d_input_grad(
    dy: &CpuStorage,
    ldy: &Layout,
    k: &CpuStorage,
    lk: &Layout,
    g: &Window2d,
) -> Result<CpuStorage> {
    let d = packed(dy, ldy, "conv2d backward")?;
    let d = d.f32s("conv2d backward")?;
    let kernel = packed(k, lk, "conv2d backward")?;
    let kernel = kernel.f32s("conv2d backward")?;
    let (per, kk) = sizes(g);
    let c_out = lk.shape()[3];
    let [h, w] = g.input;
    let c = g.channels;
    let per_sample = h * w * c;
    if let Some(t) = transposed(g, c_out).filter(|t| c >= 8 && super::conv_windows::suits(t)) {
        // With unit strides, the input's gradient is a convolution of dy (windows read where
        // they lie, nothing unrolled or scattered) by the kernel turned half a turn, its input
        // and output channels swapped. Measured on a 2-core Zen 3 (3x3 "same", batch 64),
        // unrolled -> in place: 32 x 32 x 32 <- 32 channels 10.5 -> 6.9 ms, 16 x 16 x 64 <- 64
        // 8.7 -> 6.5, 32 x 32 x 16 <- 32 6.3 -> 3.5, x 8 3.9 -> 3.6; with fewer than 8 input
        // channels most of each 16-wide tile idles (x 3 <- 64: 3.4 -> 7.2), so those unroll.
        let [kh, kw] = g.kernel;
        let mut turned = try_take(kk * c_out)?;
        for (ky, kx, co) in (0..kh).flat_map(|ky| (0..kw).flat_map(move |kx| (0..c_out).map(move |co| (ky, kx, co)))) {
            let tap = ((kh - 1 - ky) * kw + (kw - 1 - kx)) * c * c_out;
            turned.extend((0..c).map(|ci| kernel[tap + ci * c_out + co]));
        }
        let packed = PackedRhs::pack(&turned, 0, c, 1, kh * kw * c_out, c);
        drop(HostBuf::new(turned));
        // dy's own values: a compact dy may be the front of a longer storage (a concatenation's
        // gradient, narrowed).
        let dy_len = g.batch * per * c_out;
        let dy = d.get(..dy_len).ok_or_else(|| {
            Error::invalid("conv2d backward", format!("dy of {dy_len} values in a storage of {}", d.len()))
        })?;
        let len = g.batch * per_sample;
        let mut dx = try_take(len)?;
        super::conv_windows::conv2d(dy, &t, &packed?, &mut dx.spare_capacity_mut()[..len], &|_| {})?;
        // SAFETY: the convolution wrote all len values.
        unsafe { dx.set_len(len) };
        return Ok(f32_storage(dx));
    }
    let mut dx = try_zeros(g.batch * per_sample)?;
    if identity_columns(g) {
        // The columns are the input: their gradient is dx itself.
        let m = g.batch * per;
        let out = as_uninit(&mut dx);
        gemm(out, (m, kk, c_out), (d, c_out, 1), (kernel, 1, c_out), true, None)?;
        return Ok(f32_storage(dx));
    }
    let rows = block_rows(kk);
    let sample = |scratch: &mut Scratch, (n, dst): (usize, &mut [f32])| -> Result<()> {
        if scratch.0.capacity() < rows.min(per) * kk {
            scratch.0 = try_take(rows.min(per) * kk)?;
        }
        for r0 in (0..per).step_by(rows) {
            let m = rows.min(per - r0);
            let dcols = &mut scratch.0.spare_capacity_mut()[..m * kk];
            let dy_rows = &d[(n * per + r0) * c_out..(n * per + r0 + m) * c_out];
            gemm(dcols, (m, kk, c_out), (dy_rows, c_out, 1), (kernel, 1, c_out), false, None)?;
            // SAFETY: the product wrote all m * kk values.
            let dcols = unsafe { written(dcols) };
            for (i, src_row) in dcols.chunks(kk).enumerate() {
                let row = r0 + i;
                let (oh, ow) = (row / g.output[1], row % g.output[1]);
                for ky in 0..g.kernel[0] {
                    let Some(iy) = g.source(0, oh, ky) else { continue };
                    for kx in 0..g.kernel[1] {
                        let Some(ix) = g.source(1, ow, kx) else { continue };
                        let at = (ky * g.kernel[1] + kx) * c;
                        let to = (iy * w + ix) * c;
                        dst[to..to + c].iter_mut().zip(&src_row[at..at + c]).for_each(|(a, b)| *a += b);
                    }
                }
            }
        }
        Ok(())
    };
    super::share::try_par_chunks_mut(&mut dx, per_sample, |s, i, chunk| sample(s, (i, chunk)))?;
    Ok(f32_storage(dx))
}

/// Blocks of rows per group when the kernel's gradient is summed: a fixed count, whatever the
/// thread count, so the sums meet in the same order on any number of threads.
const GRAD_GROUPS: usize = 16;

/// The gradient of `conv2d` with respect to its kernel (`[kh, kw, c_in, c_out]`): the columns
/// transposed times dy's rows, a block of rows at a time (unrolled while in cache); each of a
/// fixed number of groups of blocks sums its blocks in order, and the groups meet in order.
pub fn conv2d_kernel_grad(
    x: &CpuStorage,
    lx: &Layout,
    dy: &CpuStorage,
    ldy: &Layout,
    g: &Window2d,
) -> Result<CpuStorage> {
    let xs = strided(x.f32s("conv2d backward")?, lx)?;
    let d = packed(dy, ldy, "conv2d backward")?;
    let d = d.f32s("conv2d backward")?;
    let (per, kk) = sizes(g);
    let c_out = ldy.shape()[3];
    let len = kk * c_out;
    let total = g.batch * per;
    if total == 0 {
        return Ok(f32_storage(try_zeros(len)?));
    }
    if identity_columns(g) {
        let mut dw = try_take(len)?;
        gemm(&mut dw.spare_capacity_mut()[..len], (kk, c_out, total), (&xs, 1, kk), (d, c_out, 1), true, None)?;
        // SAFETY: the product wrote all len values.
        unsafe { dw.set_len(len) };
        return Ok(f32_storage(dw));
    }
    let rows = block_rows(kk);
    let blocks = total.div_ceil(rows);
    let per_group = blocks.div_ceil(GRAD_GROUPS);
    // Group q: blocks q * per_group.. summed in order into its own partial gradient.
    let group = |q: usize, partial: &mut [f32]| -> Result<()> {
        let mut cols = Scratch(try_take(rows * kk)?);
        let mut part = Scratch(try_take(len)?);
        for b in (q * per_group..((q + 1) * per_group).min(blocks)).map(|b| b * rows) {
            let m = rows.min(total - b);
            let cs = &mut cols.0.spare_capacity_mut()[..m * kk];
            for (r, dst) in cs.chunks_mut(kk).enumerate() {
                unroll_row(&xs, g, b + r, dst);
            }
            // SAFETY: unroll_row wrote every value of the m rows.
            let cs = unsafe { written(cs) };
            let dy_rows = &d[b * c_out..(b + m) * c_out];
            let p = &mut part.0.spare_capacity_mut()[..len];
            gemm(p, (kk, c_out, m), (cs, 1, kk), (dy_rows, c_out, 1), false, None)?;
            // SAFETY: the product wrote all len values.
            let p = unsafe { written(p) };
            partial.iter_mut().zip(p).for_each(|(a, v)| *a += v);
        }
        Ok(())
    };
    let groups = blocks.div_ceil(per_group);
    let mut partials = try_zeros(groups * len)?;
    super::share::try_par_chunks_mut(&mut partials, len, |_: &mut (), q, p| group(q, p))?;
    let mut dw = try_zeros(len)?;
    for p in partials.chunks(len) {
        dw.iter_mut().zip(p).for_each(|(a, v)| *a += v);
    }
    drop(HostBuf::new(partials));
    Ok(f32_storage(dw))
}

/// Values a loop or a product has just written, seen as floats.
///
/// # Safety
/// Every element of `v` was written.
unsafe fn written(v: &[MaybeUninit<f32>]) -> &[f32] {
    // SAFETY: f32 and MaybeUninit<f32> share their layout; the caller's contract.
    unsafe { &*(v as *const [MaybeUninit<f32>] as *const [f32]) }
}

/// As `written`, for values to change in place.
///
/// # Safety
/// Every value of `v` has been written.
pub(super) unsafe fn written_mut(v: &mut [MaybeUninit<f32>]) -> &mut [f32] {
    // SAFETY: f32 and MaybeUninit<f32> share their layout; the caller's contract.
    unsafe { &mut *(v as *mut [MaybeUninit<f32>] as *mut [f32]) }
}

/// A zeroed buffer seen as the uninitialised output of a product that overwrites it all.
fn as_uninit(v: &mut [f32]) -> &mut [MaybeUninit<f32>] {
    // SAFETY: f32 and MaybeUninit<f32> share their layout, and the caller only writes floats.
    unsafe { &mut *(v as *mut [f32] as *mut [MaybeUninit<f32>]) }
}
