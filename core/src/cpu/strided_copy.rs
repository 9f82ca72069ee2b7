//! A row-major copy of any f32 layout: what `contiguous`, casts and the ops that need their input
//! in rows run through. Walking every element's offset one at a time costs about 2 ns an element
//! and, for a transposed view, reads memory in the worst order; this copies by rows instead:
//!
//! - rows whose elements are adjacent in the source (last stride 1) are copied as slices;
//! - a transpose at the innermost two axes (the source's stride 1 is on the second-to-last axis)
//!   is copied in 16 x 16 tiles, so each source cache line is used whole while it is loaded;
//! - anything else reads each row with its one stride.
//!
//! Large copies are cut over the cores by output rows.

use super::try_take;
use crate::layout::coalesce;
use crate::{Layout, Result};
use rayon::prelude::*;
use std::mem::MaybeUninit;

/// Elements below which one thread copies (splitting costs more than it saves).
const PAR_MIN: usize = 1 << 16;
/// Side of the square tiles a transpose is copied in.
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
    // Output rows `first..first + chunk.len() / cols` into `chunk`.
    let copy_rows = |first: usize, chunk: &mut [MaybeUninit<f32>]| {
        if tiled {
            let rows = chunk.len() / cols;
            let mut q = 0;
            while q < rows {
                // Rows q.. of this chunk that lie in one matrix, at most TILE of them.
                let (mat, i0) = ((first + q) / rows_in_block, (first + q) % rows_in_block);
                let n = TILE.min(rows - q).min(rows_in_block - i0);
                let base = starts[mat] + i0;
                for j0 in (0..cols).step_by(TILE) {
                    let jn = TILE.min(cols - j0);
                    // Source column j of the tile: rows base+j*step .. +n, adjacent in memory.
                    for dj in 0..jn {
                        let src = &data[base + (j0 + dj) * step..][..n];
                        for (di, &v) in src.iter().enumerate() {
                            chunk[(q + di) * cols + j0 + dj].write(v);
                        }
                    }
                }
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
        // Chunks of whole rows (for a transpose, a multiple of TILE rows, so tiles are not cut).
        let rows_per = (PAR_MIN / cols).max(1);
        let rows_per = if tiled { rows_per.div_ceil(TILE) * TILE } else { rows_per };
        dst.par_chunks_mut(rows_per * cols).enumerate().for_each(|(t, c)| copy_rows(t * rows_per, c));
    } else {
        copy_rows(0, dst);
    }
    // SAFETY: the chunks cover every output row once and each wrote all `cols` elements of it.
    unsafe { out.set_len(numel) };
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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
