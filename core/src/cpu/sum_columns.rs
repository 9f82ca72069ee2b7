//! Sums of runs that lie side by side in memory: reducing axis 0 of `[rows, cols]` (a bias
//! gradient) gives every output a run with the stride of a row, but neighbouring outputs start
//! one element apart. Walking each run alone touches a new cache line per element; here a tile
//! of up to `TILE` neighbouring outputs walks its runs together, reading each row's slice of the
//! tile at once. The sums are blocked pairwise, as in `reduce.rs`: each output adds `BLOCK`
//! elements in order, and the block sums meet in a binary tree.

use super::reduce::{BLOCK, Run};
use std::ops::ControlFlow;

/// Shortest run (rows of a matrix reduced over its first axis) summed this way: shorter ones,
/// and single columns, are summed by `reduce.rs`'s pairwise loop, in another order.
pub(super) const MIN_RUN: usize = 8;

/// Outputs walked together.
const TILE: usize = 64;

/// Column sums fed a row at a time: each column adds `BLOCK` rows in order, and the block sums
/// meet in a binary tree (smallest partials first). Anything that sums columns this way gets the
/// bits of [`sum_columns`].
pub(super) struct ColumnSums {
    block: Vec<f32>,
    filled: usize,
    /// Block sums of every column, with their tree level; equal levels merge.
    levels: Vec<(Vec<f32>, u32)>,
    /// Rows of sums merged away, for the next block (no allocation per block).
    spare: Vec<Vec<f32>>,
}

impl ColumnSums {
    /// Sums of `width` columns.
    pub fn new(width: usize) -> Self {
        ColumnSums { block: vec![0.0; width], filled: 0, levels: Vec::new(), spare: Vec::new() }
    }

    /// Adds one row's values (`width` of them).
    #[inline(always)]
    pub fn add(&mut self, row: &[f32]) {
        for (b, &v) in self.block.iter_mut().zip(row) {
            *b += v;
        }
        self.filled += 1;
        if self.filled == BLOCK {
            self.push();
        }
    }

    fn push(&mut self) {
        let zeros = match self.spare.pop() {
            Some(mut v) => {
                v.fill(0.0);
                v
            }
            None => vec![0.0; self.block.len()],
        };
        let mut top = (std::mem::replace(&mut self.block, zeros), 0);
        self.filled = 0;
        while self.levels.last().is_some_and(|(_, level)| *level == top.1) {
            let (s, _) = self.levels.pop().expect("just seen");
            for (t, &v) in top.0.iter_mut().zip(&s) {
                *t += v;
            }
            top.1 += 1;
            self.spare.push(s);
        }
        self.levels.push(top);
    }

    /// The sums, into `out` (`width` of them).
    pub fn finish(mut self, out: &mut [f32]) {
        if self.filled > 0 {
            self.push();
        }
        out.fill(0.0);
        // Smallest partials first.
        for (s, _) in self.levels.iter().rev() {
            for (o, &v) in out.iter_mut().zip(s) {
                *o += v;
            }
        }
    }
}

/// The sums of the runs at `base, base + 1, .., base + out.len() - 1` (at most `TILE`), into `out`.
fn tile(run: &Run, base: usize, out: &mut [f32]) {
    let w = out.len();
    let mut sums = ColumnSums::new(w);
    let step = run.step();
    run.segments(base, 0, run.len(), |off, count| {
        for i in 0..count {
            sums.add(&run.data[off + i * step..off + i * step + w]);
        }
        ControlFlow::Continue(())
    });
    sums.finish(out);
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
