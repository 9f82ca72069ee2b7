//! Convolution and pooling on the Cpu. A convolution is a matrix product over "columns": each
//! output position's window, unrolled (im2col), times the kernel seen as a
//! `[kh * kw * c_in, c_out]` matrix, so the gemm engine does the work. The columns are built a
//! few samples at a time, so their memory stays bounded. Pooling is a plain loop.

use super::{CpuStorage, f32_storage, matmul, strided, try_zeros};
use crate::conv::{PoolKind, Window2d};
use crate::{Layout, Result};

/// Columns per chunk, in floats (16 MiB).
const CHUNK_FLOATS: usize = 1 << 22;

/// Output positions per sample, and the length of one unrolled window.
fn sizes(g: &Window2d) -> (usize, usize) {
    (g.output[0] * g.output[1], g.kernel[0] * g.kernel[1] * g.channels)
}

/// Samples per chunk of columns.
fn chunk(g: &Window2d) -> usize {
    let (per, k) = sizes(g);
    (CHUNK_FLOATS / (per * k).max(1)).clamp(1, g.batch.max(1))
}

/// Whether the columns are the input itself (a 1x1 window reading every position once).
fn identity_columns(g: &Window2d) -> bool {
    g.kernel == [1, 1] && g.strides == [1, 1] && g.pad == [0, 0]
}

/// The unrolled windows of samples `n0..n1`: one row per output position, `(ky, kx, ci)` along it.
fn im2col(x: &[f32], g: &Window2d, n0: usize, n1: usize) -> Vec<f32> {
    let (per, k) = sizes(g);
    let [h, w] = g.input;
    let c = g.channels;
    let mut cols = vec![0f32; (n1 - n0) * per * k];
    super::for_chunks(&mut cols, k, |row, dst| {
        let n = n0 + row / per;
        let (oh, ow) = ((row % per) / g.output[1], row % g.output[1]);
        for ky in 0..g.kernel[0] {
            let Some(iy) = g.source(0, oh, ky) else { continue };
            for kx in 0..g.kernel[1] {
                let Some(ix) = g.source(1, ow, kx) else { continue };
                let src = ((n * h + iy) * w + ix) * c;
                let at = (ky * g.kernel[1] + kx) * c;
                dst[at..at + c].copy_from_slice(&x[src..src + c]);
            }
        }
    });
    cols
}

/// `s` laid out contiguously from element 0: itself (shared) when it already is, else a copy.
/// Tensor-level callers pass packed operands, so for them nothing is copied.
fn packed(s: &CpuStorage, l: &Layout, op: &'static str) -> Result<CpuStorage> {
    if l.is_contiguous() && l.offset() == 0 {
        return Ok(s.clone());
    }
    Ok(f32_storage(strided(s.f32s(op)?, l)?.into_vec()?))
}

/// `a @ b` for row-major views given by shape and strides.
fn product(a: Vec<f32>, la: Layout, b: &CpuStorage, lb: &Layout) -> Result<Vec<f32>> {
    let out = matmul(&f32_storage(a), &la, b, lb)?;
    Ok(out.f32s("conv2d")?.to_vec())
}

/// `y = conv(x, kernel)`: `x` `[n, h, w, c_in]`, `kernel` `[kh, kw, c_in, c_out]`.
pub fn conv2d(x: &CpuStorage, lx: &Layout, k: &CpuStorage, lk: &Layout, g: &Window2d) -> Result<CpuStorage> {
    let xs = strided(x.f32s("conv2d")?, lx)?;
    let kernel = packed(k, lk, "conv2d")?;
    let (per, kk) = sizes(g);
    let c_out = lk.shape()[3];
    let lw = Layout::contiguous(&[kk, c_out]);
    if identity_columns(g) {
        let m = g.batch * per;
        return Ok(f32_storage(product(xs.into_vec()?, Layout::contiguous(&[m, kk]), &kernel, &lw)?));
    }
    let mut y = try_zeros(g.batch * per * c_out)?;
    let step = chunk(g);
    for n0 in (0..g.batch).step_by(step) {
        let n1 = (n0 + step).min(g.batch);
        let cols = im2col(&xs, g, n0, n1);
        let part = product(cols, Layout::contiguous(&[(n1 - n0) * per, kk]), &kernel, &lw)?;
        y[n0 * per * c_out..n1 * per * c_out].copy_from_slice(&part);
    }
    Ok(f32_storage(y))
}

/// The gradient of `conv2d` with respect to its input, from the output's `dy`.
pub fn conv2d_input_grad(
    dy: &CpuStorage,
    ldy: &Layout,
    k: &CpuStorage,
    lk: &Layout,
    g: &Window2d,
) -> Result<CpuStorage> {
    let d = packed(dy, ldy, "conv2d backward")?;
    let kernel = packed(k, lk, "conv2d backward")?;
    let (per, kk) = sizes(g);
    let c_out = lk.shape()[3];
    // The kernel transposed, `[c_out, kh * kw * c_in]`, read in place.
    let lwt = Layout::new([c_out, kk][..].into(), [1, c_out][..].into(), 0);
    let [h, w] = g.input;
    let c = g.channels;
    let per_sample = h * w * c;
    let mut dx = try_zeros(g.batch * per_sample)?;
    let step = chunk(g);
    for n0 in (0..g.batch).step_by(step) {
        let n1 = (n0 + step).min(g.batch);
        let ld = Layout::new([(n1 - n0) * per, c_out][..].into(), [c_out, 1][..].into(), n0 * per * c_out);
        let dcols = matmul(&d, &ld, &kernel, &lwt)?;
        let dcols = dcols.f32s("conv2d backward")?;
        if identity_columns(g) {
            dx[n0 * per_sample..n1 * per_sample].copy_from_slice(dcols);
            continue;
        }
        // col2im: each sample's input gradient is the sum of its windows' column gradients.
        super::for_chunks(&mut dx[n0 * per_sample..n1 * per_sample], per_sample, |s, dst| {
            for row in 0..per {
                let (oh, ow) = (row / g.output[1], row % g.output[1]);
                let src_row = &dcols[(s * per + row) * kk..(s * per + row + 1) * kk];
                for ky in 0..g.kernel[0] {
                    let Some(iy) = g.source(0, oh, ky) else { continue };
                    for kx in 0..g.kernel[1] {
                        let Some(ix) = g.source(1, ow, kx) else { continue };
                        let at = (ky * g.kernel[1] + kx) * c;
                        let to = (iy * w + ix) * c;
                        for (a, b) in dst[to..to + c].iter_mut().zip(&src_row[at..at + c]) {
                            *a += b;
                        }
                    }
                }
            }
        });
    }
    Ok(f32_storage(dx))
}

/// The gradient of `conv2d` with respect to its kernel (`[kh, kw, c_in, c_out]`).
pub fn conv2d_kernel_grad(
    x: &CpuStorage,
    lx: &Layout,
    dy: &CpuStorage,
    ldy: &Layout,
    g: &Window2d,
) -> Result<CpuStorage> {
    let xs = strided(x.f32s("conv2d backward")?, lx)?;
    let d = packed(dy, ldy, "conv2d backward")?;
    let (per, kk) = sizes(g);
    let c_out = ldy.shape()[3];
    let mut dw = vec![0f32; kk * c_out];
    let step = if identity_columns(g) { g.batch.max(1) } else { chunk(g) };
    for n0 in (0..g.batch).step_by(step) {
        let n1 = (n0 + step).min(g.batch);
        let m = (n1 - n0) * per;
        let cols = if identity_columns(g) { xs[n0 * per * kk..n1 * per * kk].to_vec() } else { im2col(&xs, g, n0, n1) };
        // columns transposed, `[kk, m]`, read in place.
        let lct = Layout::new([kk, m][..].into(), [1, kk][..].into(), 0);
        let ld = Layout::new([m, c_out][..].into(), [c_out, 1][..].into(), n0 * per * c_out);
        let part = product(cols, lct, &d, &ld)?;
        dw.iter_mut().zip(&part).for_each(|(a, b)| *a += b);
    }
    Ok(f32_storage(dw))
}

/// The taps of output `(oh, ow)` that lie inside the input, as input offsets of channel 0 of
/// sample `n`.
fn taps(g: &Window2d, n: usize, oh: usize, ow: usize) -> impl Iterator<Item = usize> + '_ {
    let [h, w] = g.input;
    (0..g.kernel[0]).filter_map(move |ky| g.source(0, oh, ky)).flat_map(move |iy| {
        (0..g.kernel[1]).filter_map(move |kx| g.source(1, ow, kx)).map(move |ix| ((n * h + iy) * w + ix) * g.channels)
    })
}

/// The first largest of a window's values (the first NaN if any), as an input offset.
fn argmax(x: &[f32], g: &Window2d, n: usize, oh: usize, ow: usize, ch: usize) -> usize {
    let mut best: Option<(usize, f32)> = None;
    for t in taps(g, n, oh, ow) {
        let v = x[t + ch];
        match best {
            Some((_, b)) if b.is_nan() || !(v > b || v.is_nan()) => {}
            _ => best = Some((t + ch, v)),
        }
    }
    best.map_or(0, |b| b.0)
}

/// Max or average pooling; every window has at least one tap inside the input.
pub fn pool2d(kind: PoolKind, x: &CpuStorage, lx: &Layout, g: &Window2d) -> Result<CpuStorage> {
    let xs = strided(x.f32s("pool2d")?, lx)?;
    let c = g.channels;
    let [oh_n, ow_n] = g.output;
    let mut y = try_zeros(g.batch * oh_n * ow_n * c)?;
    super::for_chunks(&mut y, c, |pos, dst| {
        let (n, oh, ow) = (pos / (oh_n * ow_n), (pos / ow_n) % oh_n, pos % ow_n);
        match kind {
            PoolKind::Max => {
                for (ch, d) in dst.iter_mut().enumerate() {
                    *d = xs[argmax(&xs, g, n, oh, ow, ch)];
                }
            }
            PoolKind::Avg => {
                let mut count = 0usize;
                for t in taps(g, n, oh, ow) {
                    count += 1;
                    dst.iter_mut().zip(&xs[t..t + c]).for_each(|(a, b)| *a += b);
                }
                let inv = 1.0 / count.max(1) as f32;
                dst.iter_mut().for_each(|a| *a *= inv);
            }
        }
    });
    Ok(f32_storage(y))
}

/// The gradient of `pool2d` with respect to its input, from the output's `dy`.
pub fn pool2d_grad(
    kind: PoolKind,
    x: &CpuStorage,
    lx: &Layout,
    dy: &CpuStorage,
    ldy: &Layout,
    g: &Window2d,
) -> Result<CpuStorage> {
    let xs = strided(x.f32s("pool2d backward")?, lx)?;
    let d = strided(dy.f32s("pool2d backward")?, ldy)?;
    let c = g.channels;
    let [h, w] = g.input;
    let [oh_n, ow_n] = g.output;
    let per_sample = h * w * c;
    let mut dx = try_zeros(g.batch * per_sample)?;
    super::for_chunks(&mut dx, per_sample, |n, dst| {
        let base = n * per_sample;
        for oh in 0..oh_n {
            for ow in 0..ow_n {
                let drow = &d[((n * oh_n + oh) * ow_n + ow) * c..][..c];
                match kind {
                    PoolKind::Max => {
                        for (ch, v) in drow.iter().enumerate() {
                            dst[argmax(&xs, g, n, oh, ow, ch) - base] += v;
                        }
                    }
                    PoolKind::Avg => {
                        let inv = 1.0 / taps(g, n, oh, ow).count().max(1) as f32;
                        for t in taps(g, n, oh, ow) {
                            dst[t - base..t - base + c].iter_mut().zip(drow).for_each(|(a, b)| *a += b * inv);
                        }
                    }
                }
            }
        }
    });
    Ok(f32_storage(dx))
}
