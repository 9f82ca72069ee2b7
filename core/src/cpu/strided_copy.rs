//! A row-major copy of any f32 layout: what `contiguous`, casts and the ops that need their input
//! in rows run through. Walking every element's offset one at a time costs about 2 ns an element
//! and, for a transposed view, reads memory in the worst order; this copies by rows instead:
//!
//! - rows whose elements are adjacent in the source (last stride 1) are copied as slices;
//! - a transpose at the innermost two axes (the source's stride 1 is on the second-to-last axis)
//!   reads its source rows in order, eight at a time, and turns 8 x 8 blocks in registers (AVX).
//!   The first version walked 16 x 16 tiles element by element, a page apart when a row is 1024
//!   values, where no prefetcher follows: 1.5–2 ms for the MLP backward's two `x^T` copies from
//!   memory not in cache, 0.5 ms now (AMD EPYC Zen 3);
//! - anything else reads each row with its one stride.
//!
//! Large copies are cut over the cores by output rows.

use super::try_take;
use crate::layout::coalesce;
use crate::{Layout, Result};
use std::mem::MaybeUninit;

/// Elements below which one thread copies (splitting costs more than it saves).
const PAR_MIN: usize = 1 << 16;
/// Rows of a transpose's output copied as one band: the band's 8-column strip stays in L1 while
/// its source rows are read in order.
const BAND: usize = 128;
/// A parallel chunk of a transpose is a multiple of this many rows, so the chunks of a matrix
/// whose rows are a multiple of 8 hold whole 8 x 8 blocks (elsewhere a block cut by a chunk's
/// edge is copied element by element).
const TILE: usize = 16;

/// The elements of `layout` over `data`, in row-major order, in a new vector.
pub fn to_contiguous(data: &[f32], layout: &Layout) -> Result<Vec<f32>> {
    let numel = layout.numel();
    let mut out = try_take(numel)?;
    if numel == 0 {
        return Ok(out);
    }
    if layout.is_contiguous() {
        out.extend_from_slice(&data[layout.offset()..layout.offset() + numel]);
        return Ok(out);
    }
    let (shape, strides) = coalesce(layout.shape(), &[layout.strides()]);
    let st = &strides[0];
    let r = shape.len();
    let cols = shape[r - 1];
    let step = st[r - 1];
    // A transpose: the source's adjacent elements run down the output's columns.
    let tiled = r >= 2 && st[r - 2] == 1 && step != 1;
    // Rows of `rows_in_block` output rows share one source offset table entry: for a transpose
    // a block is one matrix (its rows are `i + j * step` from that matrix's start), otherwise one
    // row each.
    let (rows_in_block, outer) = if tiled { (shape[r - 2], r - 2) } else { (1, r - 1) };
    let table = Layout::new(shape[..outer].into(), st[..outer].into(), layout.offset());
    // As large as the output for rows of two: refused memory is an Err, as for the output.
    let mut starts: Vec<usize> = Vec::new();
    starts.try_reserve_exact(table.numel()).map_err(|_| super::reduce::oom(table.numel().saturating_mul(8)))?;
    starts.extend(table.offsets());
    let dst = &mut out.spare_capacity_mut()[..numel];
    #[cfg(target_arch = "x86_64")]
    let avx = std::arch::is_x86_feature_detected!("avx");
    #[cfg(not(target_arch = "x86_64"))]
    let avx = false;
    // Output rows `first..first + chunk.len() / cols` into `chunk`.
    let copy_rows = |first: usize, chunk: &mut [MaybeUninit<f32>]| {
        if tiled {
            let rows = chunk.len() / cols;
            let mut q = 0;
            while q < rows {
                // Rows q.. of this chunk that lie in one matrix, at most BAND of them.
                let (mat, i0) = ((first + q) / rows_in_block, (first + q) % rows_in_block);
                let n = BAND.min(rows - q).min(rows_in_block - i0);
                transpose_band(data, starts[mat] + i0, step, &mut chunk[q * cols..(q + n) * cols], cols, avx);
                q += n;
            }
        } else {
            for (k, o) in chunk.chunks_mut(cols).enumerate() {
                let s = starts[first + k];
                if step == 1 {
                    for (o, &v) in o.iter_mut().zip(&data[s..s + cols]) {
                        o.write(v);
                    }
                } else {
                    for (j, o) in o.iter_mut().enumerate() {
                        o.write(data[s + j * step]);
                    }
                }
            }
        }
    };
    if numel >= PAR_MIN && !super::one_thread() {
        // Chunks of whole rows (for a transpose, a multiple of TILE rows).
        let rows_per = (PAR_MIN / cols).max(1);
        let rows_per = if tiled { rows_per.div_ceil(TILE) * TILE } else { rows_per };
        super::par_chunks_mut(dst, rows_per * cols, |t, c| copy_rows(t * rows_per, c));
    } else {
        copy_rows(0, dst);
    }
    // SAFETY: the chunks cover every output row once and each wrote all `cols` elements of it.
    unsafe { out.set_len(numel) };
    Ok(out)
}

/// `n = out.len() / cols` output rows of a transpose: `out[i * cols + j] = data[base + i + j * step]`.
/// Source rows (the output's columns) are read in order, eight at a time: in 8 x 8 blocks turned in
/// registers where the CPU has AVX, element by element at the edges.
fn transpose_band(data: &[f32], base: usize, step: usize, out: &mut [MaybeUninit<f32>], cols: usize, avx: bool) {
    let n = out.len() / cols;
    #[cfg(not(target_arch = "x86_64"))]
    let _ = avx;
    for j0 in (0..cols).step_by(8) {
        let jn = 8.min(cols - j0);
        // Rows 0..i0 of these eight columns done in blocks.
        #[cfg(target_arch = "x86_64")]
        let i0 = if avx && jn == 8 { blocks(data, base + j0 * step, step, &mut out[j0..], cols, n) } else { 0 };
        #[cfg(not(target_arch = "x86_64"))]
        let i0 = 0;
        for dj in 0..jn {
            let src = &data[base + i0 + (j0 + dj) * step..][..n - i0];
            for (di, &v) in src.iter().enumerate() {
                out[(i0 + di) * cols + j0 + dj].write(v);
            }
        }
    }
}

/// The whole 8 x 8 blocks of eight output columns, `out[i * cols + j] = data[base + i + j * step]`
/// for `j < 8` and `i` below `n` rounded down to 8 (`out` starts at the first column); returns
/// how many rows that is. The CPU must have AVX (the caller checked).
#[cfg(target_arch = "x86_64")]
fn blocks(data: &[f32], base: usize, step: usize, out: &mut [MaybeUninit<f32>], cols: usize, n: usize) -> usize {
    let mut i0 = 0;
    while i0 + 8 <= n {
        // Bounds checked here, once per block: the kernel reads 8 source rows of 8 values and
        // writes 8 output rows of 8 values.
        let src = &data[base + i0..][..7 * step + 8];
        let dst = &mut out[i0 * cols..][..7 * cols + 8];
        // SAFETY: the caller checked AVX; src and dst cover every element the kernel touches.
        unsafe {
            let rows = std::array::from_fn(|j| src.as_ptr().add(j * step));
            transpose8(rows, dst.as_mut_ptr().cast(), cols)
        };
        i0 += 8;
    }
    i0
}

/// `dst[i * dstride + j] = rows[j][i]` for `i, j < 8`: eight rows of eight turned into columns
/// (the stores go in order of `i`, so a `dstride` below 8 leaves each row's tail to the next).
///
/// # Safety
/// The CPU has AVX; each of `rows` reaches 8 values and `dst` `7 * dstride + 8`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
pub(super) unsafe fn transpose8(rows: [*const f32; 8], dst: *mut f32, dstride: usize) {
    use std::arch::x86_64::*;
    // SAFETY: the caller's bounds.
    unsafe {
        let r = |j: usize| _mm256_loadu_ps(rows[j]);
        let (r0, r1, r2, r3, r4, r5, r6, r7) = (r(0), r(1), r(2), r(3), r(4), r(5), r(6), r(7));
        // Pairs interleaved, then quads, then the two 128-bit halves swapped into place.
        let (t0, t1) = (_mm256_unpacklo_ps(r0, r1), _mm256_unpackhi_ps(r0, r1));
        let (t2, t3) = (_mm256_unpacklo_ps(r2, r3), _mm256_unpackhi_ps(r2, r3));
        let (t4, t5) = (_mm256_unpacklo_ps(r4, r5), _mm256_unpackhi_ps(r4, r5));
        let (t6, t7) = (_mm256_unpacklo_ps(r6, r7), _mm256_unpackhi_ps(r6, r7));
        let (u0, u1) = (_mm256_shuffle_ps::<0x44>(t0, t2), _mm256_shuffle_ps::<0xEE>(t0, t2));
        let (u2, u3) = (_mm256_shuffle_ps::<0x44>(t1, t3), _mm256_shuffle_ps::<0xEE>(t1, t3));
        let (u4, u5) = (_mm256_shuffle_ps::<0x44>(t4, t6), _mm256_shuffle_ps::<0xEE>(t4, t6));
        let (u6, u7) = (_mm256_shuffle_ps::<0x44>(t5, t7), _mm256_shuffle_ps::<0xEE>(t5, t7));
        let w = |i: usize, v| _mm256_storeu_ps(dst.add(i * dstride), v);
        w(0, _mm256_permute2f128_ps::<0x20>(u0, u4));
        w(1, _mm256_permute2f128_ps::<0x20>(u1, u5));
        w(2, _mm256_permute2f128_ps::<0x20>(u2, u6));
        w(3, _mm256_permute2f128_ps::<0x20>(u3, u7));
        w(4, _mm256_permute2f128_ps::<0x31>(u0, u4));
        w(5, _mm256_permute2f128_ps::<0x31>(u1, u5));
        w(6, _mm256_permute2f128_ps::<0x31>(u2, u6));
        w(7, _mm256_permute2f128_ps::<0x31>(u3, u7));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Transposes whose output rows cross 8 x 8 blocks, a band (128 rows) and the matrices of a
    /// batch within one parallel chunk, with rows a page apart (1024 values) and not, copy as
    /// the offset walk does: each block is a transpose in registers, so a wrong shuffle shows.
    #[test]
    fn transposes_across_blocks_bands_and_matrices() {
        for (batch, rows, cols, off) in
            [(1, 1024, 37, 0), (3, 133, 21, 5), (2, 300, 1024, 3), (5, 8, 8, 1), (1, 7, 9, 0)]
        {
            // Stored [batch, cols, rows]; viewed [batch, rows, cols]: the source's stride 1 is
            // on the view's second-to-last axis.
            let layout = Layout::new(vec![batch, rows, cols].into(), vec![rows * cols, 1, rows].into(), off);
            let data: Vec<f32> = (0..layout.extent()).map(|i| i as f32 * 0.25 - 7.0).collect();
            let want: Vec<f32> = layout.offsets().map(|o| data[o]).collect();
            assert_eq!(to_contiguous(&data, &layout).unwrap(), want, "{batch}x{rows}x{cols} at {off}");
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_avx_transpose_is_what_ci_checks() {
        let has = std::arch::is_x86_feature_detected!("avx");
        assert!(has || std::env::var("CI").is_err(), "no AVX under CI=true: the 8 x 8 transpose went untested");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Any permutation of an awkward shape, with an offset, and now and then a stride-2 slice or a
        /// broadcast axis, copies to the same elements as the offset walk.
        #[test]
        fn equals_the_offset_walk(dims in proptest::collection::vec(1usize..40, 1..5), perm_seed in 0usize..120,
                                  off in 0usize..7, odd in 0u8..4, big in 0u8..4) {
            let mut dims = dims;
            if big == 0 && dims.len() <= 2 {
                // Large enough for the parallel path (at rank 2: a few hundred thousand elements).
                dims[0] = dims[0].max(2) * 97;
                let last = dims.len() - 1;
                dims[last] = dims[last].max(2) * 11;
            }
            let base = Layout::contiguous(&dims);
            let mut perm: Vec<usize> = (0..dims.len()).collect();
            let mut s = perm_seed;
            for i in (1..perm.len()).rev() {
                perm.swap(i, s % (i + 1));
                s /= i + 1;
            }
            let shape: Vec<usize> = perm.iter().map(|&p| dims[p]).collect();
            let mut strides: Vec<usize> = perm.iter().map(|&p| base.strides()[p]).collect();
            match odd {
                // A broadcast axis anywhere (the innermost included).
                0 => {
                    let at = perm_seed % strides.len();
                    strides[at] = 0
                }
                1 => *strides.last_mut().unwrap() *= 2,
                _ => {}
            }
            let layout = Layout::new(shape.into(), strides.into(), off);
            let data: Vec<f32> = (0..layout.extent().max(1)).map(|i| i as f32 * 0.5 - 3.0).collect();
            let want: Vec<f32> = layout.offsets().map(|o| data[o]).collect();
            prop_assert_eq!(to_contiguous(&data, &layout).unwrap(), want);
        }
    }
}
