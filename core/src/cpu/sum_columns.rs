//! Sums of runs that lie side by side in memory: reducing axis 0 of `[rows, cols]` (a bias
//! gradient) gives every output a run with the stride of a row, but neighbouring outputs start
//! one element apart. Walking each run alone touches a new cache line per element; here a tile
//! of up to `TILE` neighbouring outputs walks its runs together, reading each row's slice of the
//! tile at once. The sums are blocked pairwise, as in `reduce.rs`: each output adds `BLOCK`
//! elements in order, and the block sums meet in a binary tree.

use super::reduce::{BLOCK, Run};
use std::ops::ControlFlow;

/// Outputs walked together.
const TILE: usize = 64;

/// The sums of the runs at `base, base + 1, .., base + out.len() - 1` (at most `TILE`), into `out`.
fn tile(run: &Run, base: usize, out: &mut [f32]) {
    let w = out.len();
    let mut block = [0f32; TILE];
    let mut filled = 0;
    // Block sums of every output, with their tree level; equal levels merge.
    let mut levels: Vec<([f32; TILE], u32)> = Vec::new();
    let push = |levels: &mut Vec<([f32; TILE], u32)>, mut top: ([f32; TILE], u32)| {
        while let Some((s, level)) = levels.last() {
            if *level != top.1 {
                break;
            }
            for (t, &v) in top.0.iter_mut().zip(s) {
                *t += v;
            }
            top.1 += 1;
            levels.pop();
        }
        levels.push(top);
    };
    let step = run.step();
    run.segments(base, 0, run.len(), |off, count| {
        for i in 0..count {
            let row = &run.data[off + i * step..off + i * step + w];
            for (b, &v) in block.iter_mut().zip(row) {
                *b += v;
            }
            filled += 1;
            if filled == BLOCK {
                push(&mut levels, (block, 0));
                block = [0.0; TILE];
                filled = 0;
            }
        }
        ControlFlow::Continue(())
    });
    if filled > 0 {
        push(&mut levels, (block, 0));
    }
    out.fill(0.0);
    // Smallest partials first.
    for (s, _) in levels.iter().rev() {
        for (o, &v) in out.iter_mut().zip(s) {
            *o += v;
        }
    }
}

/// Sum the runs of `n_out` outputs laid out as rows of `len` neighbours (stride 1 between
/// neighbours); `row_bases` holds the base offset of each row's first output.
pub(super) fn sum_columns(run: &Run, row_bases: &[usize], len: usize, out: &mut [f32], parallel: bool) {
    let one_row = |(r, o): (usize, &mut [f32])| {
        for (t, chunk) in o.chunks_mut(TILE).enumerate() {
            tile(run, row_bases[r] + t * TILE, chunk);
        }
    };
    if parallel {
        // Tiles of every row in parallel: a single row of many columns is the common case.
        super::share::par_row_pieces(out, len, TILE, |r, start, chunk| tile(run, row_bases[r] + start, chunk));
    } else {
        out.chunks_mut(len).enumerate().for_each(one_row);
    }
}
