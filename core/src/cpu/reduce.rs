//! Reductions on the Cpu over any set of axes; the result keeps reduced axes as size 1.
//!
//! Each output element reduces one run of the reduced ("inner") index space. The run is walked in
//! row-major order as segments of its last (coalesced) axis, so no list of offsets is ever built
//! (for `sum_all` of 2^24 elements that list alone was 128 MB).
//!
//! Sums are blocked pairwise: 8 lanes add up blocks of 128 elements, and block sums meet in a
//! binary tree, so the rounding error grows with the log of the length instead of the length (a
//! running f32 sum of 2^24 threes stops growing at 2^24 and gives 61,516,456). Long runs are cut
//! into pieces of a fixed size, reduced in parallel and combined pairwise in order: the result
//! does not depend on the number of threads. Max, min and argmax propagate NaN as NumPy does:
//! the first NaN wins; argmax keeps the first index on ties.

use super::{CpuStorage, f32_storage};
use crate::layout::{Dims, coalesce};
use crate::ops::ReduceOp;
use crate::{Error, Layout, Result};
use smallvec::SmallVec;
use std::ops::ControlFlow;
use std::sync::Arc;

/// Elements summed by the 8 lanes before a block joins the pairwise tree.
pub(super) const BLOCK: usize = 128;
/// Elements per parallel piece of one long run (a whole number of blocks).
const PIECE: usize = 1 << 16;
/// Work below this many elements stays on the calling thread.
const PAR_MIN: usize = 1 << 15;

/// The reduced index space of one output element: a coalesced shape and its strides (in the
/// source), walked from a base offset.
pub(super) struct Run<'a> {
    pub(super) data: &'a [f32],
    shape: Dims,
    strides: Dims,
}

impl Run<'_> {
    pub(super) fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Visit elements `lo..hi` of the run at `base` in row-major order, as segments
    /// `(first offset, count)` along the last axis (whose stride is `self.step()`).
    pub(super) fn segments(
        &self,
        base: usize,
        lo: usize,
        hi: usize,
        mut f: impl FnMut(usize, usize) -> ControlFlow<()>,
    ) {
        let r = self.shape.len();
        let (last, step) = (self.shape[r - 1], self.strides[r - 1]);
        if lo >= hi || last == 0 {
            return;
        }
        // The row index of `lo` over the leading axes, and that row's offset.
        let mut idx: Dims = Dims::from_elem(0, r - 1);
        let mut row = lo / last;
        for d in (0..r - 1).rev() {
            idx[d] = row % self.shape[d];
            row /= self.shape[d];
        }
        let mut row_off: usize = (0..r - 1).map(|d| idx[d] * self.strides[d]).sum();
        let (mut i, mut col) = (lo, lo % last);
        while i < hi {
            let take = (last - col).min(hi - i);
            if f(base + row_off + col * step, take).is_break() {
                return;
            }
            i += take;
            col = 0;
            for d in (0..r - 1).rev() {
                idx[d] += 1;
                row_off += self.strides[d];
                if idx[d] < self.shape[d] {
                    break;
                }
                row_off -= self.strides[d] * self.shape[d];
                idx[d] = 0;
            }
        }
    }

    pub(super) fn step(&self) -> usize {
        self.strides[self.shape.len() - 1]
    }
}

/// A blocked pairwise sum fed in order.
#[derive(Default)]
struct Pairwise {
    lanes: [f32; 8],
    filled: usize,
    /// Partial sums with their tree level; equal levels merge, like carries of a binary counter.
    /// Inline: one output's sum allocates nothing (32 levels cover 2^39 elements).
    levels: SmallVec<[(f32, u32); 32]>,
}

impl Pairwise {
    fn add(&mut self, data: &[f32], off: usize, count: usize, step: usize) {
        let mut k = 0;
        // Whole blocks, four at a time: each block's lanes are a chain of adds that waits on the
        // last, so four side by side keep the adder busy; each block sums exactly as alone.
        if step == 1 && self.filled == 0 {
            for quad in data[off..off + count].chunks_exact(4 * BLOCK) {
                let mut lanes = [[0f32; 8]; 4];
                for i in (0..BLOCK).step_by(8) {
                    for (b, l) in lanes.iter_mut().enumerate() {
                        for (x, &v) in l.iter_mut().zip(&quad[b * BLOCK + i..b * BLOCK + i + 8]) {
                            *x += v;
                        }
                    }
                }
                for l in lanes {
                    self.lanes = l;
                    self.close_block();
                }
                k += 4 * BLOCK;
            }
        }
        while k < count {
            let take = (BLOCK - self.filled).min(count - k);
            if step == 1 && self.filled.is_multiple_of(8) {
                let mut chunks = data[off + k..off + k + take].chunks_exact(8);
                for c in &mut chunks {
                    for (l, &v) in self.lanes.iter_mut().zip(c) {
                        *l += v;
                    }
                }
                for (l, &v) in self.lanes.iter_mut().zip(chunks.remainder()) {
                    *l += v;
                }
            } else {
                for j in 0..take {
                    self.lanes[(self.filled + j) % 8] += data[off + (k + j) * step];
                }
            }
            self.filled += take;
            k += take;
            if self.filled == BLOCK {
                self.close_block();
            }
        }
    }

    fn close_block(&mut self) {
        let l = self.lanes;
        self.push(((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7])));
        self.lanes = [0.0; 8];
        self.filled = 0;
    }

    fn push(&mut self, v: f32) {
        let mut top = (v, 0);
        while let Some(&(s, level)) = self.levels.last() {
            if level != top.1 {
                break;
            }
            self.levels.pop();
            top = (s + top.0, level + 1);
        }
        self.levels.push(top);
    }

    fn finish(mut self) -> f32 {
        if self.filled > 0 {
            self.close_block();
        }
        // Smallest partials first.
        self.levels.iter().rev().fold(0.0, |acc, &(s, _)| acc + s)
    }
}

/// The blocked pairwise sum of `values`, in order (for row ops: softmax, layer norm): eight
/// lanes at a time, so it vectorises.
pub(crate) fn pairwise_sum(values: &[f32]) -> f32 {
    if values.len() <= BLOCK {
        // One block (a short row: attention's keys, a small layer): the lanes' sum as
        // `Pairwise` forms it, without its bookkeeping, which cost more than the adds.
        let mut l = [0f32; 8];
        let mut chunks = values.chunks_exact(8);
        for c in &mut chunks {
            for (x, &v) in l.iter_mut().zip(c) {
                *x += v;
            }
        }
        for (x, &v) in l.iter_mut().zip(chunks.remainder()) {
            *x += v;
        }
        return close_lanes(&l);
    }
    let mut p = Pairwise::default();
    p.add(values, 0, values.len(), 1);
    p.finish()
}

/// A short row's sum from its eight lanes, as `Pairwise` pairs them. (`finish` adds the block's
/// sum to 0.0: kept, so a -0.0 becomes 0.0 as there.)
#[inline(always)]
fn close_lanes(l: &[f32; 8]) -> f32 {
    0.0 + (((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7])))
}

/// [`pairwise_sum`] of each row of `n` values of `rows` (as many as `out` holds), into `out`, with
/// its bits. Rows of one block at most are summed four at a time, their lanes side by side: each
/// row's eight lanes are one chain of dependent adds, as long as the row is in eighths, and four
/// rows' chains overlap where one row's would wait (a layer norm's or softmax's rows of 64 to
/// 128 values).
#[inline(always)]
pub(crate) fn pairwise_sums(rows: &[f32], n: usize, out: &mut [f32]) {
    debug_assert_eq!(rows.len(), out.len() * n, "{} rows of {n} values", out.len());
    let count = out.len();
    if n == 0 {
        // (Empty rows sum to pairwise_sum's 0.)
        out.fill(pairwise_sum(&[]));
        return;
    }
    let mut done = 0;
    if n <= BLOCK {
        let whole = n / 8 * 8;
        while done + 4 <= count {
            let r: [&[f32]; 4] = std::array::from_fn(|q| &rows[(done + q) * n..(done + q + 1) * n]);
            let mut l = [[0f32; 8]; 4];
            let [l0, l1, l2, l3] = &mut l;
            let chunks =
                r[0].chunks_exact(8).zip(r[1].chunks_exact(8)).zip(r[2].chunks_exact(8)).zip(r[3].chunks_exact(8));
            for (((a, b), c), d) in chunks {
                for x in 0..8 {
                    l0[x] += a[x];
                    l1[x] += b[x];
                    l2[x] += c[x];
                    l3[x] += d[x];
                }
            }
            for q in 0..4 {
                for (x, &v) in l[q].iter_mut().zip(&r[q][whole..]) {
                    *x += v;
                }
                out[done + q] = close_lanes(&l[q]);
            }
            done += 4;
        }
    }
    for (o, row) in out[done..].iter_mut().zip(rows[done * n..].chunks(n)) {
        *o = pairwise_sum(row);
    }
}

/// The sum of elements `lo..hi` of a run.
fn sum_range(run: &Run, base: usize, lo: usize, hi: usize) -> f32 {
    let mut p = Pairwise::default();
    let step = run.step();
    run.segments(base, lo, hi, |off, count| {
        p.add(run.data, off, count, step);
        ControlFlow::Continue(())
    });
    p.finish()
}

/// Pairwise sum of a short list (the pieces of a long run).
fn pairwise(v: &[f32]) -> f32 {
    match v.len() {
        0 => 0.0,
        1 => v[0],
        n => pairwise(&v[..n / 2]) + pairwise(&v[n / 2..]),
    }
}

/// The largest value of elements `lo..hi` and its index (counted from the run's start), for
/// argmax: the first on ties; stops at the first NaN.
fn argmax_range(run: &Run, base: usize, lo: usize, hi: usize) -> (f32, u32) {
    let (mut best, mut at) = (f32::NEG_INFINITY, lo);
    let (mut i, step) = (lo, run.step());
    run.segments(base, lo, hi, |off, count| {
        for j in 0..count {
            let v = run.data[off + j * step];
            if v.is_nan() {
                (best, at) = (v, i + j);
                return ControlFlow::Break(());
            }
            // The first element always counts, so a run of infinities finds its first one.
            if v > best || i + j == lo {
                (best, at) = (v, i + j);
            }
        }
        i += count;
        ControlFlow::Continue(())
    });
    (best, at as u32)
}

/// Max or min of elements `lo..hi` (no index): 8 lanes side by side, so the loop vectorises, and
/// NaN noted on the way (any NaN makes the result NaN, as NumPy's).
fn extreme_value(op: ReduceOp, run: &Run, base: usize, lo: usize, hi: usize) -> f32 {
    let max = op == ReduceOp::Max;
    let init = if max { f32::NEG_INFINITY } else { f32::INFINITY };
    let mut lanes = [init; 8];
    let mut nan = false;
    let step = run.step();
    let pick = |l: &mut f32, v: f32| {
        *l = if max {
            if v > *l { v } else { *l }
        } else if v < *l {
            v
        } else {
            *l
        }
    };
    run.segments(base, lo, hi, |off, count| {
        if step == 1 {
            let mut chunks = run.data[off..off + count].chunks_exact(8);
            for c in &mut chunks {
                for (l, &v) in lanes.iter_mut().zip(c) {
                    nan |= v.is_nan();
                    pick(l, v);
                }
            }
            for (l, &v) in lanes.iter_mut().zip(chunks.remainder()) {
                nan |= v.is_nan();
                pick(l, v);
            }
        } else {
            for j in 0..count {
                let v = run.data[off + j * step];
                nan |= v.is_nan();
                pick(&mut lanes[j % 8], v);
            }
        }
        ControlFlow::Continue(())
    });
    if nan {
        return f32::NAN;
    }
    lanes.into_iter().fold(init, |a, v| if max { a.max(v) } else { a.min(v) })
}

/// Combine the argmax of two consecutive pieces, `a` first: NaN wins, then the larger value,
/// then (on ties) the earlier one.
fn combine_argmax(a: (f32, u32), b: (f32, u32)) -> (f32, u32) {
    if a.0.is_nan() || (!b.0.is_nan() && b.0 <= a.0) { a } else { b }
}

/// `f(lo, hi)` over the pieces of a run of `n` elements, in order: one piece on this thread, or
/// several of PIECE elements in parallel (inline storage: one output's run allocates nothing).
fn over_pieces<T: Send>(n: usize, pieces: usize, f: impl Fn(usize, usize) -> T + Sync) -> SmallVec<[T; 1]> {
    if pieces == 1 {
        return smallvec::smallvec![f(0, n)];
    }
    if super::one_thread() {
        return (0..pieces).map(|p| f(p * PIECE, ((p + 1) * PIECE).min(n))).collect();
    }
    let mut parts: Vec<Option<T>> = (0..pieces).map(|_| None).collect();
    super::share::par_chunks_mut(&mut parts, 1, |p, slot| slot[0] = Some(f(p * PIECE, ((p + 1) * PIECE).min(n))));
    parts.into_iter().flatten().collect()
}

/// Reduce one output's run: split into parallel pieces when it is long and `split` allows. The
/// pieces meet in order (pairwise for sums), so the result does not depend on the threads.
fn reduce_run(op: ReduceOp, run: &Run, base: usize, split: bool) -> (f32, u32) {
    let n = run.len();
    if op == ReduceOp::Sum && n <= BLOCK && run.shape.len() == 1 && run.step() == 1 {
        // One block of adjacent values (a short last axis: a softmax's gradient over 10
        // classes): `pairwise_sum` gives `Pairwise`'s bits without its bookkeeping, which cost
        // about 50 ns an output, five times the adds.
        return (pairwise_sum(&run.data[base..base + n]), 0);
    }
    let pieces = if split && n >= 2 * PIECE { n.div_ceil(PIECE) } else { 1 };
    match op {
        ReduceOp::Sum => (pairwise(&over_pieces(n, pieces, |lo, hi| sum_range(run, base, lo, hi))), 0),
        ReduceOp::Max | ReduceOp::Min => {
            let parts = over_pieces(n, pieces, |lo, hi| extreme_value(op, run, base, lo, hi));
            let pick = |a: f32, b: f32| {
                if a.is_nan() || b.is_nan() {
                    f32::NAN
                } else if op == ReduceOp::Max {
                    a.max(b)
                } else {
                    a.min(b)
                }
            };
            (parts.into_iter().reduce(pick).unwrap_or(0.0), 0)
        }
        ReduceOp::ArgMax => over_pieces(n, pieces, |lo, hi| argmax_range(run, base, lo, hi))
            .into_iter()
            .reduce(combine_argmax)
            .unwrap_or((0.0, 0)),
    }
}

/// Reduce `axes` of a layout. The output is contiguous with the input's shape, reduced axes set to 1.
pub fn reduce(op: ReduceOp, s: &CpuStorage, l: &Layout, axes: &[usize]) -> Result<CpuStorage> {
    let data = s.f32s(op.name())?;
    let kept: Vec<usize> = (0..l.rank()).filter(|a| !axes.contains(a)).collect();
    let pick = |of: &[usize], which: &[usize]| -> Vec<usize> { which.iter().map(|&a| of[a]).collect() };
    let (inner_shape, inner_strides) = (pick(l.shape(), axes), pick(l.strides(), axes));
    let (shape, strides) = coalesce(&inner_shape, &[&inner_strides]);
    let run = Run { data, shape, strides: strides.into_iter().next().unwrap_or_default() };
    if op == ReduceOp::ArgMax && run.len() > u32::MAX as usize {
        return Err(Error::invalid(
            "argmax",
            format!("an axis of {} elements has indices past u32, which argmax returns", run.len()),
        ));
    }
    let (outer_shape, outer_strides) = (pick(l.shape(), &kept), pick(l.strides(), &kept));
    let total = outer_shape.iter().product::<usize>().saturating_mul(run.len());
    // Neighbouring outputs one element apart, each with a strided run: sum them side by side.
    let (cs, cst) = coalesce(&outer_shape, &[&outer_strides]);
    let (len, stride) = (cs[cs.len() - 1], cst[0][cs.len() - 1]);
    if op == ReduceOp::Sum && stride == 1 && len > 1 && run.step() != 1 && run.len() >= super::sum_columns::MIN_RUN {
        let rows = Layout::new(cs[..cs.len() - 1].into(), cst[0][..cs.len() - 1].into(), l.offset());
        let row_bases: Vec<usize> = rows.offsets().collect();
        let mut out = super::try_zeros(rows.numel() * len)?;
        super::sum_columns::sum_columns(&run, &row_bases, len, &mut out, total >= PAR_MIN && !super::one_thread());
        return Ok(f32_storage(out));
    }
    let outer = Layout::new(outer_shape.into(), outer_strides.into(), l.offset());
    let n_out = outer.numel();
    let mut bases: Vec<usize> = Vec::new();
    bases.try_reserve_exact(n_out).map_err(|_| oom(n_out * 8))?;
    bases.extend(outer.offsets());
    // Many outputs: in parallel over outputs, each run whole; few: each long run in pieces. The
    // pieces follow the shape alone, so one thread or many give the same bits.
    let many = n_out >= 64;
    let results: Vec<(f32, u32)> = if many && total >= PAR_MIN && !super::one_thread() {
        let mut results = vec![(0.0, 0); n_out];
        // About four pieces per thread.
        let per = n_out.div_ceil(4 * rayon::current_num_threads());
        super::share::par_chunks_mut(&mut results, per, |c, out| {
            for (r, &b) in out.iter_mut().zip(&bases[c * per..]) {
                *r = reduce_run(op, &run, b, false);
            }
        });
        results
    } else {
        bases.iter().map(|&b| reduce_run(op, &run, b, !many && total >= PAR_MIN)).collect()
    };
    Ok(match op {
        ReduceOp::ArgMax => CpuStorage::U32(Arc::new(results.into_iter().map(|r| r.1).collect())),
        _ => {
            let mut out = super::try_take(n_out)?;
            out.extend(results.into_iter().map(|r| r.0));
            f32_storage(out)
        }
    })
}

/// The Err for `bytes` the allocator refused.
pub(super) fn oom(bytes: usize) -> Error {
    Error::OutOfMemory { bytes: bytes as u64, device: "cpu".into() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The blocked pairwise sum by its definition, one element at a time: element `i` of a block
    /// goes to lane `i % 8`.
    fn by_definition(values: &[f32]) -> f32 {
        let mut p = Pairwise::default();
        for &v in values {
            p.lanes[p.filled % 8] += v;
            p.filled += 1;
            if p.filled == BLOCK {
                p.close_block();
            }
        }
        p.finish()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Whole, or fed in segments of any sizes (so blocks start mid-segment and the four-block
        /// path starts and stops), the sum has the definition's bits.
        #[test]
        fn any_feeding_gives_the_definitions_bits(n in 0usize..3000, cuts in proptest::collection::vec(1usize..700, 0..6),
                                                  seed in 0u64..1000) {
            let values: Vec<f32> = (0..n)
                .map(|i| ((i as u64 * 2654435761 + seed * 97) % 1999) as f32 / 7.0 * if i % 5 == 0 { 1e3 } else { -1.0 })
                .collect();
            let want = by_definition(&values).to_bits();
            prop_assert_eq!(pairwise_sum(&values).to_bits(), want, "whole, n {}", n);
            let mut p = Pairwise::default();
            let mut at = 0;
            for c in cuts.iter().chain(std::iter::once(&n)) {
                let take = (*c).min(n - at);
                p.add(&values, at, take, 1);
                at += take;
            }
            prop_assert_eq!(p.finish().to_bits(), want, "in segments {:?}, n {}", cuts, n);
        }

        /// A short row (one block at most: `pairwise_sum`'s own loop) has the definition's bits,
        /// with negative zeros, infinities and NaN among the values.
        #[test]
        fn a_short_row_gives_the_definitions_bits(values in proptest::collection::vec(
                prop_oneof![-1e3f32..1e3, Just(-0.0f32), Just(f32::INFINITY), Just(f32::NEG_INFINITY), Just(f32::NAN)],
                0..=BLOCK + 1)) {
            let (got, want) = (pairwise_sum(&values), by_definition(&values));
            prop_assert!(got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()), "{:?}: {} vs {}", values, got, want);
        }

        /// Rows summed side by side (`pairwise_sums`: short ones four at a time) have
        /// `pairwise_sum`'s bits row by row, with negative zeros, infinities and NaN among the
        /// values, whatever the count of rows (the last few one at a time) and their length.
        #[test]
        fn rows_side_by_side_give_pairwise_sums_bits(rows in 0usize..=16, n in 1usize..=2 * BLOCK + 3, seed in 0u64..1000,
                                                     special in proptest::collection::vec((0usize..5000, 0usize..4), 0..4)) {
            let mut values: Vec<f32> = (0..rows * n)
                .map(|i| ((i as u64 * 2654435761 + seed * 97) % 1999) as f32 / 7.0 * if i % 5 == 0 { 1e3 } else { -1.0 })
                .collect();
            for (at, kind) in &special {
                if !values.is_empty() {
                    let len = values.len();
                    values[at % len] = [-0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN][*kind];
                }
            }
            let mut got = vec![7.5e37f32; rows];
            pairwise_sums(&values, n, &mut got);
            for (r, got) in got.iter().enumerate() {
                let want = pairwise_sum(&values[r * n..(r + 1) * n]);
                prop_assert!(got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                             "row {} of {}, n {}: {} vs {}", r, rows, n, got, want);
            }
        }

        /// Rows of one block and one more value, and of no value, side by side: `pairwise_sum`'s
        /// bits (where the four-row path starts and stops).
        #[test]
        fn rows_at_the_blocks_edges_give_pairwise_sums_bits(seed in 0u64..1000) {
            for n in [0, 1, 7, 8, 9, BLOCK - 1, BLOCK, BLOCK + 1] {
                for rows in [4, 5, 8, 11] {
                    let values: Vec<f32> = (0..rows * n)
                        .map(|i| ((i as u64 * 2654435761 + seed * 97) % 1999) as f32 / 7.0 * if i % 3 == 0 { 1e3 } else { -1.0 })
                        .collect();
                    let mut got = vec![7.5e37f32; rows];
                    pairwise_sums(&values, n, &mut got);
                    for (r, got) in got.iter().enumerate() {
                        let want = pairwise_sum(&values[r * n..(r + 1) * n]);
                        prop_assert_eq!(got.to_bits(), want.to_bits(), "row {} of {}, n {}", r, rows, n);
                    }
                }
            }
        }

        /// Rows summed over their last axis (short ones take `pairwise_sum`'s loop, long ones
        /// `Pairwise`), adjacent or with a gap after each: each output has the definition's bits
        /// of its row.
        #[test]
        fn row_sums_give_the_definitions_bits(rows in 1usize..9, cols in 1usize..=2 * BLOCK + 3, gap in 0usize..3,
                                              seed in 0u64..1000, special in proptest::option::of((0usize..4000, 0usize..4))) {
            let mut values: Vec<f32> = (0..rows * cols)
                .map(|i| ((i as u64 * 2654435761 + seed * 97) % 1999) as f32 / 7.0 * if i % 5 == 0 { 1e3 } else { -1.0 })
                .collect();
            if let Some((at, kind)) = special {
                values[at % (rows * cols)] = [-0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN][kind];
            }
            // Row r's values lie at r * (cols + gap) + c.
            let mut data = vec![7.0; rows * (cols + gap)];
            for r in 0..rows {
                data[r * (cols + gap)..][..cols].copy_from_slice(&values[r * cols..(r + 1) * cols]);
            }
            let layout = Layout::new([rows, cols][..].into(), [cols + gap, 1][..].into(), 0);
            let out = reduce(ReduceOp::Sum, &f32_storage(data), &layout, &[1]).unwrap();
            let out = out.f32s("test").unwrap();
            for r in 0..rows {
                let (got, want) = (out[r], by_definition(&values[r * cols..(r + 1) * cols]));
                prop_assert!(got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                             "row {} of {}x{} (gap {}): {} vs {}", r, rows, cols, gap, got, want);
            }
        }
    }
}
