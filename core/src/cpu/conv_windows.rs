//! A convolution's product with its windows read where they lie ("implicit GEMM"), at the width
//! of the blocked kernel's tiles (256 bits, or 512). The unrolled windows (im2col, see `conv`)
//! are never written: each micro-kernel call takes its output positions' windows (up to six, or
//! twelve at 512 bits: a row tile, `blocked_gemm::Isa::row_tile`) from the input (or, with padding, from a padded copy of the few input
//! rows a band of output rows reads, in cache), as runs of adjacent values (a window row of `kw`
//! taps over every channel, adjacent in NHWC), against the kernel packed once per call (or kept,
//! in inference).
//!
//! The sums are those of the unrolled product on weft's kernel, in the same order: `k` is cut
//! into the same chunks (`blocked_gemm::k_chunk`), each chunk one multiply-add chain whose left
//! values come run after run, added to the last chunk's. So a convolution gives the same bits
//! either way, however its output is cut into bands or over threads.
//!
//! Measured on a 2-core Zen 3 (AVX2): building the unrolled rows was 14% of a CIFAR-sized CNN's
//! inference (`unroll_row` and its copies), and its first layer (k = 27) ran on faer's kernels
//! at a third of this speed (see [`suits`]).
#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code, unused_imports))]

#[cfg(target_arch = "x86_64")]
use super::blocked_gemm::{self, k_chunk};
use super::gemm_pack::{MR, NR};
use super::packed_gemm::PackedRhs;
use crate::conv::Window2d;
use crate::{Error, Result};
use std::mem::MaybeUninit;

/// Whether convolution `g` runs here: where weft's kernel takes products (`gemm_engine`: AVX2
/// and FMA, not set aside by `WEFT_CPU_MATMUL`), at the width of its tiles (`blocked_gemm::isa`:
/// 256 bits, or 512 where AVX-512 runs at full width), and a band's padded copy is no larger
/// than its unrolled windows would be (not so for a window dilated far past a small input). Any
/// window, channel count and size otherwise: measured on a 2-core Zen 3 against unrolling (3x3
/// "same" over 64 x 32 x 32 inputs, GFLOP/s), 1 -> 32 channels 16-28 -> 85-89 (the unrolled
/// product, k = 9, went to faer's kernels), 3 -> 32 40-60 -> 133-136, 16 -> 8 51 -> 61-78, 32 ->
/// 32 139 -> 185; 256 -> 256 over 16 x 16 130-138 -> 171-178.
pub(crate) fn suits(g: &Window2d) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let on_weft = super::gemm_engine::engine() == super::gemm_engine::Engine::Weft;
        on_weft && {
            let plan = Plan::new(g);
            plan.strip_len(g) <= plan.rows * plan.cols * plan.k
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = g;
        false
    }
}

/// Whether this CPU runs the tiles here (AVX2 and FMA).
fn has_tiles() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        super::elementwise::avx2_fma()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Where a window's values lie relative to its first one, in a source `width` pixels wide: its
/// runs of adjacent values in the order of its unrolled row (`ky`, `kx`, channel).
#[derive(Debug)]
struct Runs {
    /// `(offset, length)` of each run, adjacent runs merged.
    runs: Vec<(usize, usize)>,
}

impl Runs {
    fn new(g: &Window2d, width: usize) -> Runs {
        let c = g.channels;
        let mut runs: Vec<(usize, usize)> = Vec::new();
        for ky in 0..g.kernel[0] {
            for kx in 0..g.kernel[1] {
                let at = (ky * g.dilation[0] * width + kx * g.dilation[1]) * c;
                match runs.last_mut() {
                    Some((off, len)) if *off + *len == at => *len += c,
                    _ => runs.push((at, c)),
                }
            }
        }
        Runs { runs }
    }

    /// The pieces of values `from..from + len` of the unrolled row, as `(offset, length)`, into
    /// `out`.
    fn pieces(&self, from: usize, len: usize, out: &mut Vec<(usize, usize)>) {
        out.clear();
        let (mut at, end) = (0, from + len);
        for &(off, n) in &self.runs {
            let (lo, hi) = (from.max(at), end.min(at + n));
            if lo < hi {
                out.push((off + lo - at, hi - lo));
            }
            at += n;
        }
    }
}

/// How the output is cut into bands (the work of one task, in one sample), and where their
/// windows are read.
#[derive(Debug)]
struct Plan {
    /// Output rows and columns of a band: whole rows (`cols` = the output's width), or, for rows
    /// longer than a band, one row's piece.
    rows: usize,
    cols: usize,
    /// The window's length.
    k: usize,
    /// Whether the windows reach padding (before the input, or after it: "same" may pad after
    /// only), so that each band reads a padded copy of its source rows and columns.
    padded: bool,
    /// Pixels per source row: the padded copy's, or the input's.
    width: usize,
}

impl Plan {
    fn new(g: &Window2d) -> Plan {
        let k = g.kernel[0] * g.kernel[1] * g.channels;
        let [oh, ow] = g.output;
        // About as many output positions as `conv` unrolls at a time: a band's output and
        // source stay in L2.
        let most = super::conv::block_rows(k);
        let (rows, cols) = if ow <= most { ((most / ow).clamp(1, oh), ow) } else { (1, most) };
        let reach = |axis: usize, n: usize| (n - 1) * g.strides[axis] + (g.kernel[axis] - 1) * g.dilation[axis] + 1;
        let padded = g.pad != [0, 0] || reach(0, oh) > g.input[0] || reach(1, ow) > g.input[1];
        let width = if padded { reach(1, cols) } else { g.input[1] };
        Plan { rows, cols, k, padded, width }
    }

    /// Source rows a band of `rows` output rows reads.
    fn source_rows(&self, g: &Window2d, rows: usize) -> usize {
        (rows - 1) * g.strides[0] + (g.kernel[0] - 1) * g.dilation[0] + 1
    }

    /// Values of the largest band's padded copy (none when the windows are read in the input).
    fn strip_len(&self, g: &Window2d) -> usize {
        if self.padded { self.source_rows(g, self.rows) * self.width * g.channels } else { 0 }
    }
}

/// The values one band's windows read: the input itself, or a padded copy.
struct Source {
    /// The band's first window's first value.
    ptr: *const f32,
    /// Pixels per source row.
    width: usize,
}

/// `y = conv(x, kernel)` for `x` `[batch, h, w, c_in]` (contiguous, `xs`) and the kernel packed
/// as a `kk x c_out` right matrix, into `out` (`[batch, oh, ow, c_out]`, every value written),
/// in bands of output positions of one sample spread over the threads; `finish` is given each
/// band's rows of `out` right after their product, while they are in cache.
///
/// The caller checks `suits` (or, in tests, that the CPU has AVX2 and FMA).
pub(crate) fn conv2d(
    xs: &[f32],
    g: &Window2d,
    kernel: &PackedRhs,
    out: &mut [MaybeUninit<f32>],
    finish: &(dyn Fn(&mut [MaybeUninit<f32>]) + Sync),
) -> Result<()> {
    #[cfg(target_arch = "x86_64")]
    {
        conv2d_at(blocked_gemm::isa(), xs, g, kernel, out, finish)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (xs, g, kernel, out, finish);
        Err(Error::invalid("conv2d", "windows read in place need an x86-64 CPU"))
    }
}

/// [`conv2d`] with tiles of `isa`'s width (tests compare the two; either gives the same bits).
#[cfg(target_arch = "x86_64")]
fn conv2d_at(
    isa: blocked_gemm::Isa,
    xs: &[f32],
    g: &Window2d,
    kernel: &PackedRhs,
    out: &mut [MaybeUninit<f32>],
    finish: &(dyn Fn(&mut [MaybeUninit<f32>]) + Sync),
) -> Result<()> {
    let [h, w] = g.input;
    let [oh, ow] = g.output;
    let c = g.channels;
    let (kk, c_out) = kernel.dims();
    if kk != g.kernel[0] * g.kernel[1] * c || xs.len() != g.batch * h * w * c || out.len() != g.batch * oh * ow * c_out
    {
        return Err(Error::invalid(
            "conv2d",
            format!("windows of {g:?} times a {kk}x{c_out} kernel into {} values from {}", out.len(), xs.len()),
        ));
    }
    if !has_tiles() || (isa.wide() && !std::arch::is_x86_feature_detected!("avx512f")) {
        return Err(Error::invalid("conv2d", format!("windows read in place at {isa:?} need its instructions")));
    }
    if out.is_empty() {
        return Ok(());
    }
    let plan = Plan::new(g);
    let runs = Runs::new(g, plan.width);
    let strip = plan.strip_len(g);
    // Bands of whole rows, or pieces of one row: (sample, first row, first column, output).
    let mut tasks: Vec<(usize, usize, usize, &mut [MaybeUninit<f32>])> = Vec::new();
    for (n, sample) in out.chunks_mut(oh * ow * c_out).enumerate() {
        for (by, rows) in sample.chunks_mut(plan.rows * ow * c_out).enumerate() {
            let size = if plan.cols == ow { rows.len() } else { plan.cols * c_out };
            tasks.extend(rows.chunks_mut(size).enumerate().map(|(bx, y)| (n, by * plan.rows, bx * plan.cols, y)));
        }
    }
    let work = |scratch: &mut super::conv::Scratch,
                (n, oy0, ox0, y): (usize, usize, usize, &mut [MaybeUninit<f32>])| {
        let positions = y.len() / c_out;
        let (rows, cols) = if plan.cols == ow { (positions / ow, ow) } else { (1, positions) };
        let (py0, px0) = (oy0 * g.strides[0], ox0 * g.strides[1]);
        let src = if plan.padded {
            if scratch.0.capacity() < strip {
                scratch.0 = super::try_take(strip)?;
            }
            let buf = &mut scratch.0.spare_capacity_mut()[..plan.source_rows(g, rows) * plan.width * c];
            fill_strip(xs, g, n, (py0, px0), plan.width, buf);
            Source { ptr: buf.as_ptr().cast(), width: plan.width }
        } else {
            Source { ptr: xs[((n * h + py0) * w + px0) * c..].as_ptr(), width: w }
        };
        // SAFETY: the source holds every value the band's windows read (the input from row
        // py0, column px0 of sample n, whose windows all lie inside it, or the copy just
        // filled); y holds the band's rows * cols positions of c_out; the CPU has AVX2 and FMA,
        // and AVX-512 F for 512-bit tiles (checked above).
        unsafe {
            band_product(isa, &src, g, &runs, (rows * cols, cols), kernel, y.as_mut_ptr().cast());
        }
        finish(y);
        Ok(())
    };
    super::share::try_par_each(tasks, work)
}

/// Source rows and columns from padded row `py0`, column `px0` of sample `n` (padded row `py`
/// is input row `py - pad[0]`, padded column `px` input column `px - pad[1]`), `width` pixels
/// per row, zeros outside the input, into `dst` (a whole number of rows).
fn fill_strip(
    xs: &[f32],
    g: &Window2d,
    n: usize,
    (py0, px0): (usize, usize),
    width: usize,
    dst: &mut [MaybeUninit<f32>],
) {
    let [h, w] = g.input;
    let c = g.channels;
    // The input's columns in a row of the copy: from `first` to `last` (none when equal).
    let first = g.pad[1].saturating_sub(px0).min(width);
    let last = (g.pad[1] + w).saturating_sub(px0).min(width).max(first);
    for (r, row) in dst.chunks_mut(width * c).enumerate() {
        let iy = (py0 + r).checked_sub(g.pad[0]).filter(|&iy| iy < h);
        let Some(iy) = iy.filter(|_| first < last) else {
            super::conv::fill_zero(row);
            continue;
        };
        super::conv::fill_zero(&mut row[..first * c]);
        let at = ((n * h + iy) * w + px0 + first - g.pad[1]) * c;
        super::conv::write(&mut row[first * c..last * c], &xs[at..at + (last - first) * c]);
        super::conv::fill_zero(&mut row[last * c..]);
    }
}

/// The band's `m` output positions (position `q` at band row `q / cols`, column `q % cols`) into
/// `y` (rows of `c_out`), chunk of `k` by chunk, each group of positions (a row tile of `isa`:
/// up to six, or twelve at 512 bits) against every panel (or pair of panels, at 512 bits) of
/// the packed kernel.
///
/// # Safety
/// The CPU has AVX2 and FMA, and AVX-512 F where `isa` is wide; `src` holds every value the
/// band's windows read; `y` has room for `m * c_out` values.
#[cfg(target_arch = "x86_64")]
unsafe fn band_product(
    isa: blocked_gemm::Isa,
    src: &Source,
    g: &Window2d,
    runs: &Runs,
    (m, cols): (usize, usize),
    kernel: &PackedRhs,
    y: *mut f32,
) {
    let (k, n) = kernel.dims();
    let kc_len = k_chunk(k);
    let (panels, per) = (kernel.panels_ptr(), k * NR);
    let c = g.channels;
    let mut pieces = Vec::with_capacity(runs.runs.len() + 1);
    for pc in (0..k).step_by(kc_len) {
        let kc = kc_len.min(k - pc);
        runs.pieces(pc, kc, &mut pieces);
        for tile in 0..m.div_ceil(isa.rows()) {
            let (i, rows) = isa.row_tile(m, tile);
            let mut at = [src.ptr; 2 * MR];
            for (r, a) in at.iter_mut().enumerate().take(rows) {
                let (oy, ox) = ((i + r) / cols, (i + r) % cols);
                // SAFETY: the window of output (oy, ox) starts inside the source.
                *a = unsafe { src.ptr.add((oy * g.strides[0] * src.width + ox * g.strides[1]) * c) };
            }
            for jr in (0..n).step_by(isa.cols()) {
                // SAFETY: panel jr / NR's rows pc.. (and the next panel's, `per` on, where the
                // tile covers two) lie in the packed kernel; the tile's rows i.. and columns jr..
                // lie in y; the caller's contract for the rest.
                unsafe {
                    let b = panels.add((jr / NR) * per + pc * NR);
                    let t = Windows {
                        at: &at,
                        pieces: &pieces,
                        b,
                        per,
                        c: y.add(i * n + jr),
                        ldc: n,
                        nr: isa.cols().min(n - jr),
                        add: pc > 0,
                    };
                    if isa.wide() { windows_tile512(rows, t) } else { windows_tile(rows, t) }
                }
            }
        }
    }
}

/// One micro-kernel call over windows: rows `r` read their values at `at[r] + offset` for each
/// piece, the right panel `b` (and the next, `per` on, for a 512-bit tile of more than 16
/// columns) read on in order over every piece; into `c` as `blocked_gemm::Tile`.
#[cfg(target_arch = "x86_64")]
struct Windows<'a> {
    at: &'a [*const f32; 2 * MR],
    pieces: &'a [(usize, usize)],
    b: *const f32,
    per: usize,
    c: *mut f32,
    ldc: usize,
    nr: usize,
    add: bool,
}

/// [`windows_tile_r`] for `rows` rows (1 to `MR`).
///
/// # Safety
/// As [`windows_tile_r`].
#[cfg(target_arch = "x86_64")]
unsafe fn windows_tile(rows: usize, t: Windows) {
    // SAFETY: the caller's contract.
    unsafe {
        match rows {
            6 => windows_tile_r::<6>(t),
            5 => windows_tile_r::<5>(t),
            4 => windows_tile_r::<4>(t),
            3 => windows_tile_r::<3>(t),
            2 => windows_tile_r::<2>(t),
            _ => windows_tile_r::<1>(t),
        }
    }
}

/// `R` rows by 16 columns: `blocked_gemm::tile` with its left rows read piece by piece (one
/// multiply-add chain per element over all the pieces, then stored or added to `c`).
///
/// # Safety
/// The CPU has AVX2 and FMA; `at[r] + offset .. + length` lies in a live allocation for each
/// piece and row `r < R`; `b` holds the pieces' total length times `NR` values; rows `0..R`,
/// columns `0..nr` of `c` (row stride `ldc`) lie in a live allocation no other thread touches.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn windows_tile_r<const R: usize>(t: Windows) {
    use std::arch::x86_64::*;
    let Windows { at, pieces, b, c, ldc, nr, add, .. } = t;
    let mut lo = [_mm256_setzero_ps(); R];
    let mut hi = [_mm256_setzero_ps(); R];
    // SAFETY (this function): every pointer stays inside the bounds above.
    unsafe {
        blocked_gemm::fetch_tile(c, ldc, R, NR);
        let mut bp = b;
        macro_rules! step {
            ($s:expr, $a:ident, $p:ident) => {{
                let (b0, b1) = (_mm256_loadu_ps(bp.add($s * NR)), _mm256_loadu_ps(bp.add($s * NR + 8)));
                for r in 0..R {
                    let av = _mm256_broadcast_ss(&*$a[r].add($p + $s));
                    lo[r] = _mm256_fmadd_ps(av, b0, lo[r]);
                    hi[r] = _mm256_fmadd_ps(av, b1, hi[r]);
                }
            }};
        }
        over_pieces!(step, pieces, at, R, bp);
        blocked_gemm::store_rows!(lo, hi, R, c, ldc, nr, add);
    }
}

/// The windows tiles' walk over a chunk's pieces: for each piece, each row's values from
/// `$at[r]` plus the piece's offset, `$step!(s, a, p)` for each value (`a[r] + p + s` row `r`'s),
/// four per turn, moving the right panel pointer `$bp` on by `NR` per value: one multiply-add
/// chain per element over every piece, in order.
macro_rules! over_pieces {
    ($step:ident, $pieces:expr, $at:expr, $rows:ident, $bp:ident) => {
        for &(off, len) in $pieces {
            let a: [*const f32; $rows] = std::array::from_fn(|r| $at[r].add(off));
            let mut p = 0;
            for _ in 0..len / 4 {
                $step!(0, a, p);
                $step!(1, a, p);
                $step!(2, a, p);
                $step!(3, a, p);
                p += 4;
                $bp = $bp.add(4 * NR);
            }
            for _ in 0..len % 4 {
                $step!(0, a, p);
                p += 1;
                $bp = $bp.add(NR);
            }
        }
    };
}
use over_pieces;

/// [`windows_tile512_r`] for `rows` rows (1 to `2 * MR`), over two panels where `t.nr` passes
/// one.
///
/// # Safety
/// As [`windows_tile512_r`].
#[cfg(target_arch = "x86_64")]
unsafe fn windows_tile512(rows: usize, t: Windows) {
    macro_rules! by_rows {
        ($w:literal) => {
            match rows {
                12 => windows_tile512_r::<12, $w>(t),
                11 => windows_tile512_r::<11, $w>(t),
                10 => windows_tile512_r::<10, $w>(t),
                9 => windows_tile512_r::<9, $w>(t),
                8 => windows_tile512_r::<8, $w>(t),
                7 => windows_tile512_r::<7, $w>(t),
                6 => windows_tile512_r::<6, $w>(t),
                5 => windows_tile512_r::<5, $w>(t),
                4 => windows_tile512_r::<4, $w>(t),
                3 => windows_tile512_r::<3, $w>(t),
                2 => windows_tile512_r::<2, $w>(t),
                _ => windows_tile512_r::<1, $w>(t),
            }
        };
    }
    // SAFETY: the caller's contract.
    unsafe { if t.nr > NR { by_rows!(2) } else { by_rows!(1) } }
}

/// `R` rows by `W` panels of 16 columns at 512 bits: [`windows_tile_r`]'s sums (one multiply-add
/// chain per element over all the pieces, then stored or added to `c`), so the same bits, with
/// `blocked_gemm`'s 512-bit tile's layout: one vector per row and panel, the edge through masks.
///
/// # Safety
/// The CPU has AVX-512 F; `at[r] + offset .. + length` lies in a live allocation for each piece
/// and row `r < R`; `b` (and, with `W` = 2, `b + per`) holds the pieces' total length times
/// `NR` values; rows `0..R`, columns `0..nr` (`nr <= W * NR`) of `c` (row stride `ldc`) lie in a
/// live allocation no other thread touches.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn windows_tile512_r<const R: usize, const W: usize>(t: Windows) {
    use std::arch::x86_64::*;
    let Windows { at, pieces, b, per, c, ldc, nr, add } = t;
    debug_assert!(R <= 2 * MR && W <= 2 && nr <= W * NR);
    let mut acc = [[_mm512_setzero_ps(); 2]; R];
    // SAFETY (this function): every pointer stays inside the bounds above.
    unsafe {
        blocked_gemm::fetch_tile(c, ldc, R, W * NR);
        let mut bp = b;
        macro_rules! step {
            ($s:expr, $a:ident, $p:ident) => {{
                let b0 = _mm512_loadu_ps(bp.add($s * NR));
                let b1 = if W == 2 { _mm512_loadu_ps(bp.add(per + $s * NR)) } else { b0 };
                blocked_gemm::each_row!(R, r => {
                    let av = _mm512_set1_ps(*$a[r].add($p + $s));
                    acc[r][0] = _mm512_fmadd_ps(av, b0, acc[r][0]);
                    if W == 2 {
                        acc[r][1] = _mm512_fmadd_ps(av, b1, acc[r][1]);
                    }
                });
            }};
        }
        over_pieces!(step, pieces, at, R, bp);
        blocked_gemm::store_rows512!(acc, R, W, c, ldc, nr, add);
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use crate::conv::Padding;
    use crate::cpu::blocked_gemm::tests::has_kernel;
    use proptest::prelude::*;

    fn val(i: usize, s: u64) -> f32 {
        (((i as u64 * 2654435761 + s * 97) % 2001) as f32 - 1000.0) / 997.0
    }

    /// The convolution through the unrolled windows on weft's kernel (`conv::unroll_row`, then
    /// `blocked_gemm::run` with the packed kernel), and through windows read in place on
    /// `threads` threads at each tile width this CPU runs (one after the other), as bits.
    fn both(g: &Window2d, c_out: usize, seed: u64, threads: usize) -> (Vec<u32>, Vec<u32>) {
        let [h, w] = g.input;
        let kk = g.kernel[0] * g.kernel[1] * g.channels;
        let rows = g.batch * g.output[0] * g.output[1];
        let x: Vec<f32> = (0..g.batch * h * w * g.channels).map(|i| val(i, seed)).collect();
        let kernel: Vec<f32> = (0..kk * c_out).map(|i| val(i, seed + 1)).collect();
        let packed = PackedRhs::pack(&kernel, 0, c_out, 1, kk, c_out).unwrap();
        let mut cols = vec![MaybeUninit::new(0f32); rows * kk];
        for (r, dst) in cols.chunks_mut(kk).enumerate() {
            super::super::conv::unroll_row(&x, g, r, dst);
        }
        let cols: Vec<f32> = cols.iter().map(|v| unsafe { v.assume_init() }).collect();
        let mut want = vec![0f32; rows * c_out];
        let p = super::super::gemm_engine::Product {
            m: rows,
            n: c_out,
            k: kk,
            dst: want.as_mut_ptr(),
            dst_rs: c_out as isize,
            lhs: cols.as_ptr(),
            lhs_rs: kk as isize,
            lhs_cs: 1,
            rhs: kernel.as_ptr(),
            rhs_rs: c_out as isize,
            rhs_cs: 1,
        };
        unsafe { blocked_gemm::run(&p, Some(&packed), 1) }.unwrap();
        let want: Vec<u32> = want.iter().map(|v| v.to_bits()).collect();
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        let mut all = Vec::new();
        for isa in widths() {
            let mut got = vec![MaybeUninit::new(f32::NAN); rows * c_out];
            pool.install(|| conv2d_at(isa, &x, g, &packed, &mut got, &|_| {})).unwrap();
            all.extend(got.iter().map(|v| unsafe { v.assume_init() }.to_bits()));
        }
        (want.repeat(widths().len()), all)
    }

    /// The tile widths this CPU runs: 256 bits, and 512 where it has AVX-512 F (whether or not
    /// `blocked_gemm::isa` takes them), each to give the unrolled product's bits.
    fn widths() -> Vec<blocked_gemm::Isa> {
        let mut v = vec![blocked_gemm::Isa::Avx2];
        if std::arch::is_x86_feature_detected!("avx512f") {
            v.push(blocked_gemm::Isa::Avx512);
        }
        v
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]
        /// Every geometry (padding, strides, dilation, windows wider than the input, k in one
        /// chunk or several, outputs off the panels) gives the unrolled product's bits on one
        /// thread or several.
        #[test]
        fn windows_read_in_place_give_the_unrolled_products_bits(
            batch in 1usize..3, h in 1usize..11, w in 1usize..11, c in 1usize..40, kh in 1usize..4,
            kw in 1usize..4, sy in 1usize..3, sx in 1usize..3, dy in 1usize..3, dx in 1usize..3,
            pad in 0usize..3, c_out in 1usize..70, threads in 1usize..4, seed in 0u64..1000) {
            if !has_kernel() {
                return Ok(());
            }
            let padding = [Padding::Valid, Padding::Same, Padding::Causal][pad];
            let Ok(g) = Window2d::new("t", &[batch, h, w, c], [kh, kw], [sy, sx], [dy, dx], padding) else {
                return Ok(());
            };
            let (want, got) = both(&g, c_out, seed, threads);
            let bad = want.iter().zip(&got).position(|(a, b)| a != b);
            prop_assert!(bad.is_none(), "{g:?} -> {c_out} on {threads} threads: first difference at {bad:?}");
        }
    }

    /// A band of several image rows, k in several chunks (3x3 over 64 channels: 576 values in
    /// chunks of 192) whose pieces cross the window's rows, and an edge panel.
    #[test]
    fn chunks_cross_the_windows_rows() {
        if !has_kernel() {
            return;
        }
        for (padding, c_out) in [(Padding::Same, 40), (Padding::Valid, 64)] {
            let g = Window2d::new("t", &[2, 9, 13, 64], [3, 3], [1, 1], [1, 1], padding).unwrap();
            let (want, got) = both(&g, c_out, 5, 2);
            assert_eq!(want, got, "{padding:?}");
        }
    }

    /// Rows longer than a band are cut into pieces (a long sequence, 1 x 5 windows over 64
    /// channels: bands of 204 positions), each with its own padded copy or read in place.
    #[test]
    fn long_rows_are_cut_into_pieces() {
        if !has_kernel() {
            return;
        }
        for (padding, strides, c_out) in
            [(Padding::Same, [1, 1], 40), (Padding::Causal, [1, 2], 17), (Padding::Valid, [1, 3], 33)]
        {
            let g = Window2d::new("t", &[2, 1, 700, 64], [1, 5], strides, [1, 2], padding).unwrap();
            let plan = Plan::new(&g);
            assert!(plan.rows == 1 && plan.cols < g.output[1], "{plan:?}");
            let (want, got) = both(&g, c_out, 7, 2);
            assert_eq!(want, got, "{padding:?} {strides:?}");
        }
        // A window dilated far past a small input: its padded copy would outgrow the unrolled
        // windows, so the convolution keeps unrolling them.
        let g = Window2d::new("t", &[1, 10, 10, 4], [3, 3], [1, 1], [100, 100], Padding::Same).unwrap();
        let plan = Plan::new(&g);
        assert!(plan.strip_len(&g) > plan.rows * plan.cols * plan.k && !suits(&g));
    }

    #[test]
    fn pieces_cut_the_runs_at_the_chunks_edges() {
        let g = Window2d::new("t", &[1, 5, 5, 2], [2, 3], [1, 1], [1, 2], Padding::Valid).unwrap();
        let runs = Runs::new(&g, 5);
        // Taps 2 apart: a run of 2 channels each, but for the first row's last tap and the
        // second row's first (rows 5 pixels apart), adjacent.
        assert_eq!(runs.runs, vec![(0, 2), (4, 2), (8, 4), (14, 2), (18, 2)]);
        let mut out = Vec::new();
        runs.pieces(3, 6, &mut out);
        assert_eq!(out, vec![(5, 1), (8, 4), (14, 1)]);
        let dense = Runs::new(&Window2d::new("t", &[1, 4, 3, 2], [2, 3], [1, 1], [1, 1], Padding::Valid).unwrap(), 3);
        // A window as wide as its source: its rows' runs join.
        assert_eq!(dense.runs, vec![(0, 12)]);
    }
}
