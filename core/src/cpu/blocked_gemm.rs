//! weft's own f32 product for AVX2+FMA CPUs, blocked for the caches as BLIS does: the right
//! matrix is packed `KC` rows by up to `NC` columns at a time (its 16-column panels, 16 KiB each,
//! stay in L1 while a block of the left matrix passes over them; when the parts of a product on
//! several threads share one packing, `shared_rhs`, it is packed whole, chunk by chunk), the left matrix `MC` rows by
//! `KC` columns at a time (about 150 KiB, in L2), and a 6 x 16 micro-kernel with 12
//! accumulators runs over the panels; where AVX-512 runs at full width, a 12 x 32 one with 24
//! (two left panels by two right ones: [`Isa`]), and where it runs as two 256-bit halves (Zen 4)
//! on products of few rows ([`isa_for`]).
//!
//! Why not faer's kernels, which weft used before: measured in one process, interleaved, best of
//! 9 (AMD EPYC Zen 3, AVX2), this kernel against faer's: 512–2048 square 1.06–1.19x on one
//! thread, level on two; the MLP's backward products with a transposed operand 1.06–1.5x (faer
//! packs a transposed left matrix slowly). faer keeps the products this one does badly: narrow
//! ones (fewer than 32 columns or a `k` under 32, where most of a 16-wide panel would be zeros or
//! the output's load and store outweigh the sums) and small ones (see [`suits`]); small ones
//! with a whole tile's rows and columns run on this kernel's tiles without its blocking
//! (`small_gemm`).
//!
//! Where the left matrix is read in place by 512-bit tiles (at full width; on Zen 4, products of
//! few rows: see [`isa_for`] and [`reads_left_in_place`]), the first group of rows
//! passes over the whole right block, whose panels a model's weights in inference bring from L3
//! or memory: each tile of that pass fetches the next tile's panels into L2 as it runs
//! (`Tile::next_b`). Measured in one process, alternating (an Intel Xeon with AVX-512, 2 MiB of
//! L2): MiniLM's six layers of dense products 1.025-1.03x faster on one thread (the same products
//! over one layer's weights, which stay in cache, had run 1.07x faster than over six without
//! the fetch), and its forward with the fetch alone 1.02-1.03x on one thread, 1.035x on two.
//!
//! Each output element is the sum over `k` in chunks of at most `KC` (sizes a function of `k`
//! alone), each chunk summed in order by one FMA chain and added to the last: so the bits do not
//! depend on `m`, `n`, the block sizes or how the work is cut over threads.

use super::gemm_engine::Product;
use super::gemm_pack::{MR, NR, Strided, a_len, b_len, pack_a, pack_a_tiles, pack_b, row_tile};
use super::pack_room::with_room;
use super::packed_gemm::PackedRhs;
use super::shared_rhs::{SharedRhs, View, shares_packing};
use crate::Result;

/// Most `k` values summed per pass (a 16-column panel of them is 16 KiB: half of L1).
const KC: usize = 256;
/// Most rows of the left matrix packed at a time (144 x 256 values: 144 KiB, in L2).
const MC: usize = 144;
/// Most columns of the right matrix packed at a time (4080 x 256 values: 4 MiB, in L3).
const NC: usize = 4080;

/// Values in a cache line.
const LINE: usize = 16;

/// The room the packed left block takes before the right one, whole lines so that the right one
/// starts on a line too.
fn a_room(mc: usize, kc: usize) -> usize {
    a_len(mc, kc).div_ceil(LINE) * LINE
}

/// Whether this kernel is the better one for an `m x k` by `k x n` product (see the module doc).
/// With 512-bit tiles, narrow products too: a layer of 10 outputs ran 1.5–2x faster here than on
/// faer's AVX-512 kernels (a 2-core Zen 5: 256 x 1024 x 10 at 182 against 117 GFLOP/s), while a
/// `k` under 32 stays faster there.
pub(crate) fn suits(m: usize, n: usize, k: usize) -> bool {
    let narrow_n = if isa().wide() { 1 } else { 32 };
    m >= 16 && n >= narrow_n && k >= 32 && m * n * k >= 1 << 18
}

/// The chunk of `k` each pass sums: equal sizes, at most `KC` (384 is 192 + 192, not 256 + 128).
pub(crate) fn k_chunk(k: usize) -> usize {
    k.div_ceil(k.div_ceil(KC))
}

/// Runs `p` (which must have `k >= 1`) on `threads` threads. With `packed`, the right matrix
/// already packed (a model's weights in inference, kept by their storage), `p.rhs` is not read
/// and the output is cut by rows (nothing is packed twice), or by columns when there are too few
/// rows for every thread. Otherwise the output is cut by columns when the left matrix is the
/// smaller (each part packs all of it, or reads it in place: `reads_left_in_place`, and its own
/// columns of the right), by rows otherwise (each part packs all of the right matrix, block by
/// block, and its own rows of the left); only a product finished from scratch by Adam's update
/// ([`run_finishing`]), where enough is at stake and the left matrix is not short, has its parts
/// pack the right matrix once between them (`shared_rhs::shares_packing`), cut by rows; a
/// finisher that takes each column's rows in order (`Finish::by_columns`) has it cut by columns
/// whatever the shape. `Err`
/// only when memory for a part's packing room runs out; the other parts may have written their
/// share of the output (and a finisher its blocks) by then, so the caller drops them.
///
/// # Safety
/// The CPU has AVX2 and FMA; `p`'s contract (`Product::run`); `packed` is `k x n`.
pub(crate) unsafe fn run(p: &Product, packed: Option<&PackedRhs>, threads: usize) -> Result<()> {
    // SAFETY: the caller's contract; `isa_for` gives a width this CPU runs (512 bits only where
    // it has AVX-512).
    unsafe { run_on(isa_for(p.m), p, packed, None, threads, None) }
}

/// What becomes of each block of output rows once its sums are complete, in place of storing it
/// (Adam's update of the weight whose gradient the product is: `matmul_adam`).
pub(crate) trait Finish: Sync {
    /// Whether the sums are stored in the output and finished there, in place (a bias and an
    /// activation), rather than handed over from a scratch block (Adam, whose product has no
    /// output). Finishers in place also take the rows of a left matrix read in place, a group of
    /// micro-kernel rows at a time.
    fn in_output(&self) -> bool {
        false
    }

    /// Whether the output must be cut by columns among the threads (whatever the shape), so
    /// that each part finishes every row of its own columns, in order (column sums): `blocked`
    /// finishes a block of columns only in the last chunk of `k`, its rows in increasing order.
    /// (Never with a shared packing, which is cut by rows: only scratch finishers share.)
    fn by_columns(&self) -> bool {
        false
    }

    /// Finish rows `i..i + rows`, columns `j..j + cols` of the output, whose values are at `g`
    /// (row stride `gs`). Each element is finished exactly once, by one thread.
    ///
    /// # Safety
    /// The rows and columns lie inside the output; `g` holds `rows` rows of `cols` values, `gs`
    /// apart.
    unsafe fn finish(&self, i: usize, j: usize, rows: usize, cols: usize, g: *const f32, gs: usize);
}

/// [`run`] with each block of finished output rows (up to `MC` rows by the part's columns) handed
/// to `fin`. A finisher `in_output` finishes the block in the output, where [`run`] stored it
/// (a bias and activation; `packed` may be given). Otherwise the block is not stored: the sums of
/// a `k` of one chunk go to a scratch block (in L2) and from there to `fin`, so the output is
/// never written and `p.dst` may be null; with several chunks the earlier chunks' sums wait in
/// `p.dst`. `fin` gets the bits [`run`] would store.
///
/// Measured in the MLP's training step (2-core Zen 3, same process, alternating): Adam finishing
/// blocks this way 1-3% more steps/s than a product then Adam's pass. Finishing each 6 x 16 tile
/// as it was summed ran slower than the two passes (16 values of 6 rows, 4 KiB apart: every line
/// on a new page), and so did bands of 6 rows over a right block kept in L2.
///
/// # Safety
/// As [`run`], with `p.dst` an `m x n` output (row stride `p.dst_rs`) whenever `fin` is
/// `in_output` or `k_chunk(p.k) < p.k`.
pub(crate) unsafe fn run_finishing(
    p: &Product,
    packed: Option<&PackedRhs>,
    fin: &dyn Finish,
    threads: usize,
) -> Result<()> {
    // SAFETY: the caller's contract; `isa_for` gives a width this CPU runs (512 bits only where
    // it has AVX-512).
    unsafe { run_on(isa_for(p.m), p, packed, Some(fin), threads, None) }
}

/// The micro-kernel's width on this CPU: 512 bits where AVX-512 runs at full width (see
/// `gemm_engine`), else 256.
pub(crate) fn isa() -> Isa {
    if super::gemm_engine::full_width_avx512() { Isa::Avx512 } else { Isa::Avx2 }
}

/// Most rows of a product that runs 512-bit tiles on a CPU that splits them into 256-bit halves
/// (`gemm_engine::split_avx512`). There each tile still takes half the instructions of two 256-bit
/// ones (a right panel pair's two loads and 12 broadcasts serve 24 multiply-adds), which pays on
/// short products; on long ones the pair of panels (32 KiB at k chunks of 256, all of a 32 KiB
/// L1) is evicted by the left tiles. Measured on a 2-core Zen 4 (AMD EPYC family 25 model 17),
/// in one process alternating 7 rounds, 512-bit / 256-bit tiles, one thread: right matrix
/// kept packed (inference) 128-256 rows times 384-1536 x 384-1536 1.00-1.05, 256 x 784 x 1024
/// 1.02, 512³ 1.01, 1024³ 0.97, 2048³ 0.97; MiniLM's forward (8 x 32 and 1 x 128 tokens)
/// 1.03 and 1.05 on one thread, 1.06 and 1.11 on two; the MLP's training step and inference
/// 1.01 and 1.02.
const SPLIT_WIDE_MAX_ROWS: usize = 512;

/// The micro-kernel's width for a product of `m` rows: [`isa`]'s, or 512 bits on a CPU that
/// splits them (Zen 4) when `m` is at most [`SPLIT_WIDE_MAX_ROWS`]. Either width gives the same
/// bits (`the_512_bit_tiles_give_the_256_bit_bits`), so the choice may differ product by product.
pub(crate) fn isa_for(m: usize) -> Isa {
    if super::gemm_engine::split_avx512() && m <= SPLIT_WIDE_MAX_ROWS { Isa::Avx512 } else { isa() }
}

/// [`run`] with the micro-kernel at `isa`'s width (tests compare the two).
///
/// # Safety
/// As [`run`], and the CPU runs `isa`.
unsafe fn run_on(
    isa: Isa,
    p: &Product,
    packed: Option<&PackedRhs>,
    fin: Option<&dyn Finish>,
    threads: usize,
    share: Option<bool>,
) -> Result<()> {
    let (m, n, k) = (p.m, p.n, p.k);
    debug_assert!(packed.is_none_or(|b| b.dims() == (k, n)));
    let a = Strided { ptr: p.lhs, rs: p.lhs_rs, cs: p.lhs_cs };
    let strided = Strided { ptr: p.rhs, rs: p.rhs_rs, cs: p.rhs_cs };
    // A finisher's block of sums (one chunk of k: none is stored in the output).
    let scratch_sums = fin.is_some_and(|f| !f.in_output());
    // The right matrix packed once for every part (kept, or packed here by the parts together:
    // `shared_rhs`), or block by block by each part.
    let share = share.unwrap_or_else(|| shares_packing((m, n, k), isa.rows(), threads, scratch_sums));
    let shared;
    let b = match packed {
        Some(b) => Rhs::Packed(b.panels_ptr(), k * NR),
        None if threads > 1 && share => {
            // SAFETY: the caller's contract: the k x n matrix lies in a live allocation.
            shared = unsafe { SharedRhs::new(strided, k, n, threads) }?;
            Rhs::Shared(shared.view())
        }
        None => Rhs::Strided(strided),
    };
    let is_packed = !matches!(b, Rhs::Strided(_));
    let by_cols = if fin.is_some_and(|f| f.by_columns()) {
        true
    } else if is_packed {
        m < 2 * MR * threads
    } else {
        m <= n
    };
    // Parts of at least two panels (or two row tiles) each.
    let most = if by_cols { n.div_ceil(2 * NR) } else { m.div_ceil(2 * MR) };
    let parts = threads.min(most).max(1);
    let (unit, len) = if by_cols { (isa.cols(), n) } else { (isa.rows(), m) };
    let per = len.div_ceil(parts).div_ceil(unit) * unit;
    let c = Out(p.dst, p.dst_rs as usize);
    // Each part's packing room, on the thread that runs it (`pack_room`).
    let (mcap, ncap) = if by_cols { (m, per) } else { (per, n) };
    let b_room = if is_packed { 0 } else { b_len(k_chunk(k), NC.min(ncap)) };
    let g_room = if scratch_sums { MC.min(mcap) * NC.min(ncap) } else { 0 };
    let room = LINE + a_room(MC.min(mcap), k_chunk(k)) + b_room + g_room;
    // (A part that is refused its room does no work, and the first refusal comes back: the
    // output is incomplete, and the caller drops it.)
    super::share::try_par_for(parts, |_: &mut (), t| {
        let start = (t * per).min(len);
        let size = per.min(len - start);
        if size == 0 {
            return Ok(());
        }
        // SAFETY: the part's rows or columns lie inside the product (start + size <= len); the
        // room holds `room` values; parts write disjoint outputs.
        with_room(room, |space| unsafe {
            // Panels start on a cache line (a 16-value row of a right panel split over two lines
            // costs about 3% in the kernel's loads).
            let space = space.add(space.align_offset(LINE * 4).min(LINE));
            // (A finisher's output may be null: never offset.)
            let c_at = |i, j| if c.0.is_null() { c } else { c.at(i, j) };
            if by_cols {
                let fin = fin.map(|f| (f, (0, start)));
                blocked(isa, (m, size, k), a, b.at(0, start), c_at(0, start), space, fin);
            } else {
                let fin = fin.map(|f| (f, (start, 0)));
                blocked(isa, (size, n, k), a.at(start, 0), b, c_at(start, 0), space, fin);
            }
        })
    })
}

/// The right matrix: to be packed block by block by each part, packed already (panel `t` at
/// `ptr + t * per`, its `k` rows of `NR` values in order), or packed once by the parts together.
#[derive(Clone, Copy)]
enum Rhs {
    Strided(Strided),
    Packed(*const f32, usize),
    Shared(View),
}

// SAFETY: only read, while the product's caller keeps it alive (a shared packing is written by
// the one part that claimed each group: see `shared_rhs::View`).
unsafe impl Send for Rhs {}
unsafe impl Sync for Rhs {}

impl Rhs {
    /// The matrix from row `p`, column `j` (for a packed one, `j` a multiple of `NR`; for a
    /// shared one, `p` also the first row of a chunk of `k`).
    ///
    /// # Safety
    /// `(p, j)` lies inside the matrix.
    unsafe fn at(self, p: usize, j: usize) -> Rhs {
        match self {
            Rhs::Strided(b) => Rhs::Strided(unsafe { b.at(p, j) }),
            Rhs::Packed(ptr, per) => Rhs::Packed(unsafe { ptr.add((j / NR) * per + p * NR) }, per),
            Rhs::Shared(v) => Rhs::Shared(v.at(p, j)),
        }
    }
}

/// The output: element `(i, j)` at `ptr + i * rs + j`.
#[derive(Clone, Copy)]
struct Out(*mut f32, usize);

// SAFETY: the parts that share it write disjoint elements.
unsafe impl Send for Out {}
unsafe impl Sync for Out {}

impl Out {
    /// # Safety
    /// `(i, j)` lies inside the output.
    unsafe fn at(self, i: usize, j: usize) -> Out {
        Out(unsafe { self.0.add(i * self.1 + j) }, self.1)
    }
}

/// One thread's share: the loops around the micro-kernel, over `NC` columns, `KC` values of `k`
/// and `MC` rows, packing each block once.
///
/// # Safety
/// The CPU runs `isa`; `a` (m x k), `b` (k x n) and `c` (m x n) lie in live allocations; `space`
/// has room for `a_room(MC.min(m), k_chunk(k))` values, and `b_len(k_chunk(k), NC.min(n))` more
/// unless `b` is packed. With `fin` (a finisher and where this part starts in the whole output)
/// that is not `in_output`, `space` has room for `MC.min(m) * NC.min(n)` more values, and `c`
/// need only be live when `k` takes several chunks. A shared `b` starts at the first row of the
/// product's `k` (the part's view of the whole matrix, whose `k` is this one).
unsafe fn blocked(
    isa: Isa,
    (m, n, k): (usize, usize, usize),
    a: Strided,
    b: Rhs,
    c: Out,
    space: *mut f32,
    fin: Option<(&dyn Finish, (usize, usize))>,
) {
    use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
    let kc_len = k_chunk(k);
    // Sums finished from a scratch block (not in the output) come in blocks of rows: the packed
    // loops make them.
    let scratch = fin.is_some_and(|(f, _)| !f.in_output());
    let direct = reads_left_in_place(isa, a, n) && !scratch;
    let (apack, bpack) = (space, unsafe { space.add(a_room(MC.min(m), kc_len)) });
    // A finisher's block of sums, after the right block packed here (no room is taken without one).
    let b_room = if matches!(b, Rhs::Strided(_)) { b_len(kc_len, NC.min(n)) } else { 0 };
    let sums = if scratch { unsafe { bpack.add(b_room) } } else { std::ptr::null_mut() };
    for jc in (0..n).step_by(NC) {
        let nc = NC.min(n - jc);
        for pc in (0..k).step_by(kc_len) {
            let kc = kc_len.min(k - pc);
            // Panel t of this block at bp0 + t * per; with a shared packing, the first column of
            // the panels this part packed (taken first, while the others' are packed).
            let (bp0, per, first, shared) = match unsafe { b.at(pc, jc) } {
                Rhs::Strided(block) => {
                    unsafe { pack_b(block, kc, nc, bpack) };
                    (bpack.cast_const(), kc * NR, 0, None)
                }
                Rhs::Packed(ptr, per) => (ptr, per, 0, None),
                Rhs::Shared(v) => {
                    // SAFETY: pc starts a chunk; the block's columns lie inside the matrix.
                    let first = unsafe { v.claim(nc) };
                    let (ptr, per) = v.panels();
                    // On a tile's edge: a block may start on an odd panel (4080 columns), and a
                    // 512-bit tile covers two.
                    (ptr, per, first - first % isa.cols(), Some(v))
                }
            };
            // The block's tiles' first columns, in the order this part takes them.
            let tiles = || (first..nc).step_by(isa.cols()).chain((0..first).step_by(isa.cols()));
            // Before a tile's panels are read: a shared one's may still be packing elsewhere.
            let ready = |jr: usize| {
                if let Some(v) = shared {
                    // SAFETY: the tile's columns lie inside the block, inside the matrix.
                    unsafe { v.wait(jr, isa.cols().min(nc - jr)) };
                }
            };
            if direct {
                // Left rows read in place: each group of rows (a row tile) against every right
                // panel while it is in L1, the next group fetched meanwhile (it comes from L3 or
                // memory).
                let groups = m.div_ceil(isa.rows());
                for g in 0..groups {
                    let (i, rows) = isa.row_tile(m, g);
                    // SAFETY: the group's rows and the next one's lie inside the left matrix,
                    // columns pc..pc + kc.
                    unsafe {
                        let ap = a.at(i, pc);
                        if g + 1 < groups {
                            let (ni, next_rows) = isa.row_tile(m, g + 1);
                            let next = a.at(ni, pc);
                            for r in 0..next_rows {
                                for q in (0..kc).step_by(16) {
                                    _mm_prefetch::<_MM_HINT_T0>(next.ptr.add(r * next.rs as usize + q).cast());
                                }
                            }
                        }
                        let first_pass = g == 0 && isa.wide();
                        for jr in tiles() {
                            ready(jr);
                            let bp = bp0.add((jr / NR) * per);
                            let cp = c.at(i, jc + jr);
                            let nr = isa.cols().min(nc - jr);
                            let (a, lda, ldc) = (ap.ptr, ap.rs as usize, cp.1);
                            let next = jr + isa.cols();
                            let next_b = if first_pass && next < nc && shared.is_none() {
                                bp0.add((next / NR) * per)
                            } else {
                                std::ptr::null()
                            };
                            let t = Tile { kc, a, lda, b: bp, per, c: cp.0, ldc, nr, add: pc > 0, next_b };
                            tile_rows::<true>(isa.wide(), rows, t);
                        }
                        if let Some((f, (r0, c0))) = fin.filter(|_| pc + kc == k) {
                            // SAFETY: the group's rows and the block's columns lie inside the
                            // output, whose sums are complete there.
                            let cp = c.at(i, jc);
                            f.finish(r0 + i, c0 + jc, rows, nc, cp.0, cp.1);
                        }
                    }
                }
                continue;
            }
            for ic in (0..m).step_by(MC) {
                let mc = MC.min(m - ic);
                unsafe { isa.pack_a(a.at(ic, pc), mc, kc, apack) };
                // Where this block's sums go: the output, or (a finisher's, k in one chunk) the
                // scratch block, rows `nc` apart.
                let to = if scratch && kc == k { Out(sums, nc) } else { unsafe { c.at(ic, jc) } };
                for jr in tiles() {
                    ready(jr);
                    let nr = isa.cols().min(nc - jr);
                    let bp = unsafe { bp0.add((jr / NR) * per) };
                    for it in 0..mc.div_ceil(isa.rows()) {
                        let (ir, rows) = isa.row_tile(mc, it);
                        // SAFETY: tile it's panels (at it * rows() * kc) and panel jr / NR of this
                        // block; the output tile rows ic + ir.., columns jc + jr.. lie inside c
                        // (or the scratch block).
                        unsafe {
                            let ap = apack.add(it * isa.rows() * kc);
                            let cp = to.at(ir, jr);
                            let t = Tile {
                                kc,
                                a: ap,
                                lda: 0,
                                b: bp,
                                per,
                                c: cp.0,
                                ldc: cp.1,
                                nr,
                                add: pc > 0,
                                next_b: std::ptr::null(),
                            };
                            tile_rows::<false>(isa.wide(), rows, t);
                        }
                    }
                }
                if let Some((f, (r0, c0))) = fin.filter(|_| pc + kc == k) {
                    // SAFETY: the block's rows and columns lie inside the output, its sums in `to`.
                    unsafe { f.finish(r0 + ic, c0 + jc, mc, nc, to.0, to.1) };
                }
            }
        }
    }
}

/// Whether the micro-kernel reads the left matrix in place rather than packed: when its values
/// are adjacent along k and the output is narrow (a convolution's columns times its kernel),
/// where a packed block would serve too few right panels to repay its packing.
///
/// Measured on one core (AMD EPYC Zen 3), a 2048 x 288 left matrix in cache, GFLOP/s packed ->
/// in place: 32 columns 57 -> 68, 64 columns 68 -> 75, 128 columns 74 -> 76; with 16384 rows
/// (from memory) 28 -> 34, 43 -> 54, 62 -> 68. A 256 x 1024 left matrix times 1024 columns (the
/// MLP's) ran 5-8% slower in place. With 512-bit tiles (12 rows in place, a 48 KiB L1: a 2-core
/// Zen 5) any width: in a warm loop level with packing (1024³ 482 / 484, 2048³ 454 / 454, the
/// MLP's products 440–474 / 432–473 GFLOP/s), and in the MLP's training step, whose left
/// matrices come from memory, the packing pass (about 3% of the step) is saved. Not where 512-bit
/// ops are split (Zen 4, a 32 KiB L1): there the MLP's step ran 4-6% slower in place.
fn reads_left_in_place(isa: Isa, a: Strided, n: usize) -> bool {
    let wide_in_place = isa.wide() && super::gemm_engine::full_width_avx512();
    a.cs == 1 && a.rs >= 0 && (n <= IN_PLACE_MAX_N || wide_in_place)
}

/// The widest output whose left matrix is read in place.
pub(crate) const IN_PLACE_MAX_N: usize = 128;

/// One call of the micro-kernel: `kc` values of `k` from the left panel `a` (rows `lda` apart
/// when read in place) and the right panel `b` (and, for more than `NR` columns, the next panel
/// `per` values on), into `c` (row stride `ldc`, first `nr` columns), overwriting it or adding to
/// it (`add`).
#[derive(Clone, Copy)]
pub(crate) struct Tile {
    pub kc: usize,
    pub a: *const f32,
    pub lda: usize,
    pub b: *const f32,
    pub per: usize,
    pub c: *mut f32,
    pub ldc: usize,
    pub nr: usize,
    pub add: bool,
    /// The right panels of the tile that runs next, fetched into L2 while this one runs (null:
    /// none); 512-bit tiles only. Only prefetched, never read: any address will do.
    pub next_b: *const f32,
}

/// The micro-kernel for `rows` rows (1 to 6, or to 12 with `wide`), of a packed left panel or
/// (`IN_PLACE`) read in place: row `r`'s values at `a + r * lda`, adjacent; with `wide` (a CPU
/// of [`Isa::Avx512`]) up to two right panels (`nr` up to `2 * NR`), else one.
///
/// # Safety
/// As [`tile`] (or, `wide`, [`tile512`]).
pub(crate) unsafe fn tile_rows<const IN_PLACE: bool>(wide: bool, rows: usize, t: Tile) {
    macro_rules! rows {
        ($f:ident $(, $w:literal)?) => {
            match rows {
                12 => $f::<12, IN_PLACE $(, $w)?>(t),
                11 => $f::<11, IN_PLACE $(, $w)?>(t),
                10 => $f::<10, IN_PLACE $(, $w)?>(t),
                9 => $f::<9, IN_PLACE $(, $w)?>(t),
                8 => $f::<8, IN_PLACE $(, $w)?>(t),
                7 => $f::<7, IN_PLACE $(, $w)?>(t),
                6 => $f::<6, IN_PLACE $(, $w)?>(t),
                5 => $f::<5, IN_PLACE $(, $w)?>(t),
                4 => $f::<4, IN_PLACE $(, $w)?>(t),
                3 => $f::<3, IN_PLACE $(, $w)?>(t),
                2 => $f::<2, IN_PLACE $(, $w)?>(t),
                _ => $f::<1, IN_PLACE $(, $w)?>(t),
            }
        };
    }
    // SAFETY: the caller's contract.
    unsafe {
        match (wide, t.nr > NR) {
            (false, _) => rows!(tile),
            (true, false) => rows!(tile512, 1),
            (true, true) => rows!(tile512, 2),
        }
    }
}

/// The vector width the micro-kernel runs at: the CPU's own ([`isa`]), or per product where
/// AVX-512 is split into halves ([`isa_for`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Isa {
    /// 256-bit vectors: AVX2 and FMA.
    Avx2,
    /// 512-bit vectors (AVX-512 F, on a CPU that runs them at full width, or on Zen 4 for short
    /// products: [`isa_for`]): two right panels per call, twice the multiply-adds per instruction.
    Avx512,
}

impl Isa {
    /// Whether tiles cover two right panels.
    pub(crate) fn wide(self) -> bool {
        self == Isa::Avx512
    }

    /// Columns one call of the micro-kernel covers.
    pub(crate) fn cols(self) -> usize {
        if self.wide() { 2 * NR } else { NR }
    }

    /// Most rows one call covers (two packed left panels with 512 bits); a block's tiles are
    /// [`Isa::row_tile`]'s.
    pub(crate) fn rows(self) -> usize {
        if self.wide() { 2 * MR } else { MR }
    }

    /// Row tile `t` of a block of `mc` rows: its first row and its rows (`mc.div_ceil(rows())`
    /// tiles; 256-bit tiles share a short last one with the one before: `gemm_pack::row_tile`).
    pub(crate) fn row_tile(self, mc: usize, t: usize) -> (usize, usize) {
        let rows = self.rows();
        if self.wide() { (t * rows, rows.min(mc - t * rows)) } else { row_tile(mc, t) }
    }

    /// Packs the `mc x kc` left block as the tiles read it ([`Isa::row_tile`]).
    ///
    /// # Safety
    /// As `gemm_pack::pack_a`.
    pub(crate) unsafe fn pack_a(self, a: Strided, mc: usize, kc: usize, dst: *mut f32) {
        // SAFETY: the caller's.
        unsafe { if self.wide() { pack_a(a, mc, kc, dst) } else { pack_a_tiles(a, mc, kc, dst) } }
    }
}

/// The micro-kernels' walk over `kc` values of `k`: `$step!(s)` for each, four per turn (the
/// loop's own cost spread out; the same sums in the same order), moving the left panel pointer
/// `$ap` (by `MR` values per `k`, or 1 read in place) and the right one `$bp` (by `NR`).
macro_rules! over_k {
    ($step:ident, $kc:expr, $ap:ident, $bp:ident, $in_place:expr) => {
        for _ in 0..$kc / 4 {
            $step!(0);
            $step!(1);
            $step!(2);
            $step!(3);
            $ap = $ap.add(if $in_place { 4 } else { 4 * MR });
            $bp = $bp.add(4 * NR);
        }
        for _ in 0..$kc % 4 {
            $step!(0);
            $ap = $ap.add(if $in_place { 1 } else { MR });
            $bp = $bp.add(NR);
        }
    };
}

/// `R` rows by 16 columns over `kc` values of `k`, from a packed left panel (`MR` values per `k`;
/// or, `IN_PLACE`, `R` rows of `kc` adjacent values `lda` apart) and a packed right panel (`NR`
/// values per `k`): `c` gets the sums, or has them added (`add`); only its first `nr` columns are
/// written. Either way each sum takes its products in the same order: the same bits.
///
/// # Safety
/// The CPU has AVX2 and FMA; `a` holds `kc * MR` values (in place: rows `0..R` of `kc` values),
/// `b` `kc * NR`; rows `0..R`, columns `0..nr` of `c` (row stride `ldc`) lie in a live
/// allocation no other thread touches.
#[target_feature(enable = "avx2,fma")]
unsafe fn tile<const R: usize, const IN_PLACE: bool>(t: Tile) {
    let Tile { kc, a, lda, b, c, ldc, nr, add, .. } = t;
    // One left panel (rows past MR belong to the 512-bit tiles, which read the next panel).
    debug_assert!(R <= MR && nr <= NR);
    use std::arch::x86_64::*;
    let mut lo = [_mm256_setzero_ps(); R];
    let mut hi = [_mm256_setzero_ps(); R];
    // SAFETY (this function): every pointer stays inside the bounds above.
    unsafe {
        fetch_tile(c, ldc, R, NR);
        let (mut ap, mut bp) = (a, b);
        // One value of k: two loads of the right panel, R broadcasts of the left, 2R FMAs.
        macro_rules! step {
            ($s:expr) => {{
                let (b0, b1) = (_mm256_loadu_ps(bp.add($s * NR)), _mm256_loadu_ps(bp.add($s * NR + 8)));
                for r in 0..R {
                    // Packed: MR values per k; in place: row r's values, adjacent along k.
                    let at = if IN_PLACE { r * lda + $s } else { $s * MR + r };
                    let av = _mm256_broadcast_ss(&*ap.add(at));
                    lo[r] = _mm256_fmadd_ps(av, b0, lo[r]);
                    hi[r] = _mm256_fmadd_ps(av, b1, hi[r]);
                }
            }};
        }
        over_k!(step, kc, ap, bp, IN_PLACE);
        store_rows!(lo, hi, R, c, ldc, nr, add);
    }
}

/// Starts fetching an output tile of `rows` rows and `cols` columns (row stride `ldc`), which a
/// micro-kernel reads or writes after its loop. Pointers wrap: at the edge a row's last value may
/// lie past the output (a prefetch never faults, but an out-of-bounds `add` is undefined).
#[inline(always)]
pub(crate) fn fetch_tile(c: *mut f32, ldc: usize, rows: usize, cols: usize) {
    use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
    for r in 0..rows {
        let row = c.wrapping_add(r * ldc);
        // SAFETY: SSE is part of x86-64; a prefetch reads nothing the program sees.
        unsafe {
            _mm_prefetch::<_MM_HINT_T0>(row.cast());
            _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(cols - 1).cast());
        }
    }
}

/// A 256-bit tile's sums (`$lo`: columns 0-7, `$hi`: 8-15, one pair per row, `$r` rows) into
/// `$c` (row stride `$ldc`, first `$nr` columns), stored or added to what it holds (`$add`).
/// A macro, so that the accumulators stay in registers (a function taking them by reference was
/// not always inlined). Used in an `unsafe` block of a function with AVX2 enabled, where rows
/// `0..$r`, columns `0..$nr` of `$c` lie in a live allocation no other thread touches.
macro_rules! store_rows {
    ($lo:expr, $hi:expr, $r:expr, $c:expr, $ldc:expr, $nr:expr, $add:expr) => {{
        use std::arch::x86_64::{_mm256_add_ps, _mm256_loadu_ps, _mm256_storeu_ps};
        for r in 0..$r {
            let cp = $c.add(r * $ldc);
            if $nr == NR {
                let (l, h) = if $add {
                    (_mm256_add_ps(_mm256_loadu_ps(cp), $lo[r]), _mm256_add_ps(_mm256_loadu_ps(cp.add(8)), $hi[r]))
                } else {
                    ($lo[r], $hi[r])
                };
                _mm256_storeu_ps(cp, l);
                _mm256_storeu_ps(cp.add(8), h);
            } else {
                let mut t = [0f32; NR];
                _mm256_storeu_ps(t.as_mut_ptr(), $lo[r]);
                _mm256_storeu_ps(t.as_mut_ptr().add(8), $hi[r]);
                for (q, v) in t[..$nr].iter().enumerate() {
                    *cp.add(q) = if $add { *cp.add(q) + v } else { *v };
                }
            }
        }
    }};
}
pub(crate) use store_rows;

/// `$body` once for each row `$r` below `$rows` (a const generic, at most 12), its statements
/// written out rather than looped, so that a 512-bit tile's accumulators stay in registers
/// (LLVM keeps an array it cannot index by constants in memory).
macro_rules! each_row {
    ($rows:ident, $r:ident => $body:block) => {
        $crate::cpu::blocked_gemm::each_row!(@ $rows, $r $body; 0 1 2 3 4 5 6 7 8 9 10 11)
    };
    (@ $rows:ident, $r:ident $body:block; $($i:literal)*) => {
        $(if $i < $rows {
            let $r: usize = $i;
            $body
        })*
    };
}
pub(crate) use each_row;

/// A 512-bit tile's sums (`$acc[r][w]`: row `r`, panel `w` of `$w`, `$rows` rows) into `$c` (row
/// stride `$ldc`, first `$nr` columns, the edge through masks), stored or added to what it
/// holds (`$add`). Used in an `unsafe` block of a function with AVX-512 F enabled and
/// `std::arch::x86_64::*` in scope, where rows `0..$rows`, columns `0..$nr` of `$c` lie in a
/// live allocation no other thread touches.
macro_rules! store_rows512 {
    ($acc:ident, $rows:ident, $w:ident, $c:expr, $ldc:expr, $nr:expr, $add:expr) => {{
        // The first panel's columns, then the second's (if any), each through a mask at the edge.
        let mask = |col: usize| -> __mmask16 { if $nr - col >= NR { !0 } else { (1u16 << ($nr - col)) - 1 } };
        let (m0, m1) = (mask(0), if $nr > NR { mask(NR) } else { 0 });
        $crate::cpu::blocked_gemm::each_row!($rows, r => {
            let cp = $c.add(r * $ldc);
            let v = if $add { _mm512_add_ps(_mm512_maskz_loadu_ps(m0, cp), $acc[r][0]) } else { $acc[r][0] };
            _mm512_mask_storeu_ps(cp, m0, v);
            if $w == 2 && m1 != 0 {
                let cp = cp.add(NR);
                let v = if $add { _mm512_add_ps(_mm512_maskz_loadu_ps(m1, cp), $acc[r][1]) } else { $acc[r][1] };
                _mm512_mask_storeu_ps(cp, m1, v);
            }
        });
    }};
}
pub(crate) use store_rows512;

/// [`tile`] at 512 bits: `R` rows (up to `2 * MR`: two packed left panels) by `W` right panels
/// (16 columns each, `per` values apart), one vector per row and panel. The same sums in the same
/// order as [`tile`] (one multiply-add chain per element over `k`, added to `c` last): the same
/// bits. Edges are written through masks.
///
/// # Safety
/// The CPU has AVX-512 F; as [`tile`], with `a` holding `R.div_ceil(MR)` packed panels of
/// `kc * MR` values one after the other, `b` `W` panels of `kc * NR` values `per` apart, and
/// `nr <= W * NR`.
#[target_feature(enable = "avx512f")]
unsafe fn tile512<const R: usize, const IN_PLACE: bool, const W: usize>(t: Tile) {
    let Tile { kc, a, lda, b, per, c, ldc, nr, add, next_b } = t;
    debug_assert!(R <= 2 * MR && W <= 2 && nr <= W * NR);
    use std::arch::x86_64::*;
    let mut acc = [[_mm512_setzero_ps(); 2]; R];
    // SAFETY (this function): every pointer stays inside the bounds above.
    unsafe {
        fetch_tile(c, ldc, R, W * NR);
        // Where row r's value of step s lies: its row (in place), or panel r / MR, slot r % MR.
        let second = MR * kc;
        let (mut ap, mut bp) = (a, b);
        // One value of k: W loads of the right panels, R broadcasts of the left, R * W FMAs.
        macro_rules! step {
            ($s:expr) => {{
                let b0 = _mm512_loadu_ps(bp.add($s * NR));
                let b1 = if W == 2 { _mm512_loadu_ps(bp.add(per + $s * NR)) } else { b0 };
                each_row!(R, r => {
                    let at = if IN_PLACE { r * lda + $s } else { (r / MR) * second + $s * MR + r % MR };
                    let av = _mm512_set1_ps(*ap.add(at));
                    acc[r][0] = _mm512_fmadd_ps(av, b0, acc[r][0]);
                    if W == 2 {
                        acc[r][1] = _mm512_fmadd_ps(av, b1, acc[r][1]);
                    }
                });
            }};
        }
        if next_b.is_null() {
            over_k!(step, kc, ap, bp, IN_PLACE);
        } else {
            // Four values of k read four lines of each right panel: the next tile's same lines
            // are fetched meanwhile (its panels come from L3 or memory on a first pass). (At the
            // fourth step, so that the few steps past a multiple of four, which `over_k` runs as
            // step 0, fetch nothing.)
            let mut nb = next_b;
            macro_rules! step_fetching {
                ($s:expr) => {{
                    if $s == 3 {
                        for l in 0..4 {
                            _mm_prefetch::<_MM_HINT_T1>(nb.wrapping_add(l * NR).cast());
                            if W == 2 {
                                _mm_prefetch::<_MM_HINT_T1>(nb.wrapping_add(per + l * NR).cast());
                            }
                        }
                        nb = nb.wrapping_add(4 * NR);
                    }
                    step!($s)
                }};
            }
            over_k!(step_fetching, kc, ap, bp, IN_PLACE);
        }
        store_rows512!(acc, R, W, c, ldc, nr, add);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Whether this CPU runs the 256-bit kernel (else the tests say so and check nothing).
    pub(crate) fn has_kernel() -> bool {
        let yes = std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma");
        if !yes {
            eprintln!("blocked_gemm: this CPU has no AVX2 and FMA; nothing to test");
        }
        yes
    }

    /// Whether products run on weft's engine (else the Tensor-level tests have nothing to test).
    fn on_weft_engine() -> bool {
        use super::super::gemm_engine::{Engine, engine};
        let yes = has_kernel() && engine() == Engine::Weft;
        if !yes {
            eprintln!("blocked_gemm: the engine is {:?}; nothing to test", engine());
        }
        yes
    }

    /// A tensor's values as bits.
    fn bits(t: &crate::Tensor) -> Vec<u32> {
        t.to_vec::<f32>().unwrap().iter().map(|v| v.to_bits()).collect()
    }

    fn val(i: usize, s: u64) -> f32 {
        (((i as u64 * 2654435761 + s * 97) % 1999) as f32 / 999.5) - 1.0
    }

    /// `a @ b` on `threads` threads for a row-major (`kind` 0), transposed (1) or broadcast (2)
    /// left matrix and a row-major or transposed right one.
    fn product(m: usize, n: usize, k: usize, (ka, kb): (u8, u8), seed: u64, threads: usize) -> (Vec<f32>, Vec<f64>) {
        product_with(isa(), (m, n, k), (ka, kb), seed, threads, Right::Auto)
    }

    /// How a test's right matrix is packed.
    #[derive(Clone, Copy, Debug)]
    enum Right {
        /// As `run` decides.
        Auto,
        /// Beforehand, as inference keeps it.
        Kept,
        /// Whole, shared by the parts (more than one thread).
        Shared,
        /// By each part, block by block.
        Own,
    }

    /// As [`product`], with the micro-kernel at `isa`'s width and the right matrix packed as
    /// `right` says.
    fn product_with(
        isa: Isa,
        (m, n, k): (usize, usize, usize),
        (ka, kb): (u8, u8),
        seed: u64,
        threads: usize,
        right: Right,
    ) -> (Vec<f32>, Vec<f64>) {
        let (ars, acs, alen) = match ka {
            0 => (k as isize, 1, m * k),
            1 => (1, m as isize, m * k),
            _ => (0, 1, k),
        };
        let (brs, bcs) = if kb == 0 { (n as isize, 1) } else { (1, k as isize) };
        let a: Vec<f32> = (0..alen).map(|i| val(i, seed)).collect();
        let b: Vec<f32> = (0..k * n).map(|i| val(i, seed + 3)).collect();
        let mut out = vec![f32::NAN; m * n];
        let p = strided_product((m, n, k), (&a, ars, acs), (&b, brs, bcs), (out.as_mut_ptr(), n));
        let kept = matches!(right, Right::Kept);
        let packed = kept.then(|| PackedRhs::pack(&b, 0, brs as usize, bcs as usize, k, n).unwrap());
        let share = match right {
            Right::Shared => Some(true),
            Right::Own => Some(false),
            _ => None,
        };
        // SAFETY: the kernel exists (has_kernel, and the caller's check for 512 bits), the
        // strides reach only inside a, b and out.
        unsafe { run_on(isa, &p, packed.as_ref(), None, threads, share) }.unwrap();
        let at = |i: usize, q: usize| a[(i as isize * ars + q as isize * acs) as usize] as f64;
        let bt = |q: usize, j: usize| b[(q as isize * brs + j as isize * bcs) as usize] as f64;
        let want = (0..m * n).map(|e| (0..k).map(|q| at(e / n, q) * bt(q, e % n)).sum()).collect();
        (out, want)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// Equals an f64 loop across the row blocks (144), the chunks of k (256) and the edges
        /// of both panels, for every layout; and one, two or three threads give the same bits.
        #[test]
        fn matches_f64_and_is_the_same_on_any_threads(m in 1usize..320, n in 1usize..90, k in 1usize..600,
                ka in 0u8..3, kb in 0u8..2, seed in 0u64..1000) {
            if !has_kernel() {
                return Ok(());
            }
            let (one, want) = product(m, n, k, (ka, kb), seed, 1);
            for (e, (&got, &w)) in one.iter().zip(&want).enumerate() {
                prop_assert!((got as f64 - w).abs() <= 1e-5 * (k as f64).sqrt() * 4.0,
                    "m{m} n{n} k{k} layouts {ka}{kb} at ({}, {}): {got} vs {w}", e / n, e % n);
            }
            // Each part packing its own blocks, or sharing one packing of the right matrix (cut
            // by rows, or by columns when rows are few).
            for (threads, right) in [(2, Right::Own), (3, Right::Own), (2, Right::Shared), (3, Right::Shared)] {
                let (more, _) = product_with(isa(), (m, n, k), (ka, kb), seed, threads, right);
                prop_assert!(one.iter().zip(&more).all(|(x, y)| x.to_bits() == y.to_bits()),
                    "m{m} n{n} k{k}: {threads} threads ({right:?}) changed bits");
            }
            // A right matrix packed beforehand (cut by rows, or by columns when rows are few).
            for threads in [1, 2, 3] {
                let (pre, _) = product_with(isa(), (m, n, k), (ka, kb), seed, threads, Right::Kept);
                prop_assert!(one.iter().zip(&pre).all(|(x, y)| x.to_bits() == y.to_bits()),
                    "m{m} n{n} k{k}: the packed right matrix on {threads} threads changed bits");
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]
        /// The 512-bit tiles (12 x 32) give the 256-bit tiles' bits (6 x 16) across the row
        /// blocks, the chunks of k, both tiles' edges (rows past one left panel, columns past one
        /// right panel), every layout, thread count, and a right matrix packed beforehand: the same
        /// sums in the same order. (Past 128 columns, where AVX-512 runs at full width, a
        /// row-major left matrix is read in place by the one and packed by the other.)
        #[test]
        fn the_512_bit_tiles_give_the_256_bit_bits(m in 1usize..200, n in 1usize..200, k in 1usize..600,
                ka in 0u8..3, kb in 0u8..2, threads in 1usize..4, right in 0usize..3, seed in 0u64..1000) {
            if !has_kernel() || !std::arch::is_x86_feature_detected!("avx512f") {
                eprintln!("blocked_gemm: this CPU has no AVX-512 F; the 512-bit tiles are not tested");
                return Ok(());
            }
            let right = [Right::Own, Right::Kept, Right::Shared][right];
            // (A shared packing needs two parts at least.)
            let threads = if matches!(right, Right::Shared) { threads.max(2) } else { threads };
            let run = |isa| product_with(isa, (m, n, k), (ka, kb), seed, threads, right).0;
            let (wide, narrow) = (run(Isa::Avx512), run(Isa::Avx2));
            for (e, (x, y)) in wide.iter().zip(&narrow).enumerate() {
                prop_assert_eq!(x.to_bits(), y.to_bits(), "m{} n{} k{} layouts {}{} threads {} {:?} at ({}, {}): {} vs {}",
                    m, n, k, ka, kb, threads, right, e / n, e % n, x, y);
            }
        }
    }

    /// Wider than one packed block of the right matrix (4080 columns, so the second block starts
    /// on an odd panel), over two chunks of `k`: the second block's columns are right too,
    /// however the threads cut the output and pack the right matrix.
    #[test]
    fn crosses_the_column_blocks() {
        if !has_kernel() {
            return;
        }
        // 7 rows: cut by columns, packed here or beforehand; 150 rows (more than one row block):
        // cut by columns when each part packs its own, by rows when packed beforehand or shared.
        for (m, right) in
            [(7, Right::Own), (7, Right::Kept), (150, Right::Own), (150, Right::Kept), (150, Right::Shared)]
        {
            let (n, k) = (NC + 37, 300);
            let (got, want) = product_with(isa(), (m, n, k), (0, 0), 5, 2, right);
            for (e, (&g, &w)) in got.iter().zip(&want).enumerate() {
                assert!((g as f64 - w).abs() <= 1e-3, "m{m} {right:?} at ({}, {}): {g} vs {w}", e / n, e % n);
            }
        }
    }

    /// The `m x k` row-major `a` times the `k x n` matrix `b` (row and column strides given), into
    /// the `m x n` row-major `dst`.
    fn rows_times(
        a: &[f32],
        (b, brs, bcs): (&[f32], isize, isize),
        (m, n, k): (usize, usize, usize),
        dst: *mut f32,
    ) -> Product {
        strided_product((m, n, k), (a, k as isize, 1), (b, brs, bcs), (dst, n))
    }

    /// The `m x k` matrix `a` times the `k x n` matrix `b` (each with its row and column
    /// strides) into `dst` (rows `ldc` apart).
    pub(crate) fn strided_product(
        (m, n, k): (usize, usize, usize),
        (a, ars, acs): (&[f32], isize, isize),
        (b, brs, bcs): (&[f32], isize, isize),
        (dst, ldc): (*mut f32, usize),
    ) -> Product {
        Product {
            m,
            n,
            k,
            dst,
            dst_rs: ldc as isize,
            lhs: a.as_ptr(),
            lhs_rs: ars,
            lhs_cs: acs,
            rhs: b.as_ptr(),
            rhs_rs: brs,
            rhs_cs: bcs,
        }
    }

    /// A finisher that copies each finished block into `out` (`m x n`, row-major): from a scratch
    /// block as Adam's takes its sums, or (`in_output`) from the output as a bias's does.
    struct CopyOut {
        out: *mut f32,
        n: usize,
        in_output: bool,
    }

    // SAFETY: each block is copied by the one thread that finishes it, into its own elements.
    unsafe impl Sync for CopyOut {}

    impl Finish for CopyOut {
        fn in_output(&self) -> bool {
            self.in_output
        }

        unsafe fn finish(&self, i: usize, j: usize, rows: usize, cols: usize, g: *const f32, gs: usize) {
            for r in 0..rows {
                for q in 0..cols {
                    // SAFETY: the block lies inside the output (the caller's contract), and so
                    // inside `out`, of the same shape.
                    unsafe { *self.out.add((i + r) * self.n + j + q) = *g.add(r * gs + q) };
                }
            }
        }
    }

    /// Blocks handed to a finisher hold the bits the product stores, whether each part packs its
    /// own right blocks or the parts share one packing (cut by rows, or by columns when rows are
    /// few; the right matrix row-major or transposed; the left one packed or read in place), for a
    /// `k` of one chunk or several; with the tiles of either width where the CPU has AVX-512 (a
    /// Zen 4 runs both, product by product: `isa_for`).
    #[test]
    fn finishers_get_the_stored_bits_with_a_shared_packing() {
        if !has_kernel() {
            return;
        }
        let mut isas = vec![Isa::Avx2];
        if std::arch::is_x86_feature_detected!("avx512f") {
            isas.push(Isa::Avx512);
        }
        for (isa, (m, n, k)) in isas
            .into_iter()
            .flat_map(|isa| [(150, 70, 40), (150, 300, 600), (20, 40, 300), (97, 130, 256)].map(|shape| (isa, shape)))
        {
            for kb in [0u8, 1] {
                let (want, _) = product(m, n, k, (0, kb), 4, 1);
                let a: Vec<f32> = (0..m * k).map(|i| val(i, 4)).collect();
                let b: Vec<f32> = (0..k * n).map(|i| val(i, 7)).collect();
                let (brs, bcs) = if kb == 0 { (n as isize, 1) } else { (1, k as isize) };
                for (threads, share, in_output) in [
                    (2, false, false),
                    (2, false, true),
                    (2, true, false),
                    (3, true, false),
                    (2, true, true),
                    (3, true, true),
                ] {
                    let mut sums = vec![f32::NAN; m * n];
                    let mut out = vec![f32::NAN; m * n];
                    let p = rows_times(&a, (&b, brs, bcs), (m, n, k), sums.as_mut_ptr());
                    let fin = CopyOut { out: out.as_mut_ptr(), n, in_output };
                    // SAFETY: the kernel exists; the strides stay inside a, b and sums.
                    unsafe { run_on(isa, &p, None, Some(&fin), threads, Some(share)) }.unwrap();
                    let bad = want.iter().zip(&out).position(|(x, y)| x.to_bits() != y.to_bits());
                    assert!(
                        bad.is_none(),
                        "{isa:?} {m}x{n}x{k} right {kb} on {threads} threads, shared {share}, in output {in_output}: first difference at {bad:?}"
                    );
                }
            }
        }
    }

    /// Where AVX-512 is split into 256-bit halves (Zen 4), products of few rows take 512-bit
    /// tiles and still pack a wide left matrix; longer products, and every product elsewhere,
    /// take the CPU's own width.
    #[test]
    fn short_products_take_512_bit_tiles_where_they_are_split() {
        let split = super::super::gemm_engine::split_avx512();
        assert_eq!(isa_for(1).wide(), split || isa().wide());
        assert_eq!(isa_for(SPLIT_WIDE_MAX_ROWS).wide(), split || isa().wide());
        assert_eq!(isa_for(SPLIT_WIDE_MAX_ROWS + 1), isa());
        let a = [0f32; 4];
        let rows = Strided { ptr: a.as_ptr(), rs: 2, cs: 1 };
        let full = super::super::gemm_engine::full_width_avx512();
        assert_eq!(reads_left_in_place(Isa::Avx512, rows, IN_PLACE_MAX_N + 1), full);
        assert!(reads_left_in_place(Isa::Avx512, rows, IN_PLACE_MAX_N));
    }

    /// A narrow product reads its left rows in place, a wider one packs them: each column's
    /// values are the same bits either way (the same sums in the same order).
    #[test]
    fn rows_read_in_place_give_the_packed_bits() {
        if !has_kernel() {
            return;
        }
        let (m, k, wide) = (151, 300, IN_PLACE_MAX_N + 40);
        let a: Vec<f32> = (0..m * k).map(|i| val(i, 4)).collect();
        let b: Vec<f32> = (0..k * wide).map(|i| val(i, 8)).collect();
        let run = |n: usize| {
            let mut out = vec![f32::NAN; m * n];
            let p = rows_times(&a, (&b, wide as isize, 1), (m, n, k), out.as_mut_ptr());
            // SAFETY: the kernel exists; the strides stay inside a, b and out. (256-bit tiles:
            // where AVX-512 runs at full width the 512-bit ones read a row-major left matrix in
            // place at any width; their bits against these are the proptest's above.)
            unsafe { run_on(Isa::Avx2, &p, None, None, 2, None) }.unwrap();
            out
        };
        let strided = |ptr| Strided { ptr, rs: k as isize, cs: 1 };
        assert!(reads_left_in_place(Isa::Avx2, strided(a.as_ptr()), IN_PLACE_MAX_N));
        assert!(!reads_left_in_place(Isa::Avx2, strided(a.as_ptr()), wide));
        let (narrow, packed) = (run(IN_PLACE_MAX_N), run(wide));
        for i in 0..m {
            for j in 0..IN_PLACE_MAX_N {
                let (x, y) = (narrow[i * IN_PLACE_MAX_N + j], packed[i * wide + j]);
                assert_eq!(x.to_bits(), y.to_bits(), "({i}, {j}): {x} in place, {y} packed");
            }
        }
    }

    /// The small-batch kernel (`packed_gemm`) and this one give the same bits, so a batch's rows
    /// do not change with its size.
    #[test]
    fn the_small_batch_kernel_gives_the_same_bits() {
        if !has_kernel() {
            return;
        }
        use super::super::packed_gemm::{Lhs, MOST_ROWS, PackedRhs, run as small};
        let (m, n, k) = (MOST_ROWS + 1, 70, 700);
        let (big, _) = product(m, n, k, (0, 0), 9, 2);
        let a: Vec<f32> = (0..m * k).map(|i| val(i, 9)).collect();
        let b: Vec<f32> = (0..k * n).map(|i| val(i, 12)).collect();
        let (lhs, rhs) = (Lhs::new(&a, m - 1, k, k).unwrap(), PackedRhs::pack(&b, 0, n, 1, k, n).unwrap());
        let mut out = vec![f32::NAN; (m - 1) * n];
        // SAFETY: the kernel exists; out holds m - 1 rows of n values.
        unsafe { small(&lhs, &rhs, 0..rhs.panels(), out.as_mut_ptr(), n) };
        assert!(
            out.iter().zip(&big).all(|(x, y)| x.to_bits() == y.to_bits()),
            "{} rows differ from {m}'s first",
            m - 1
        );
    }

    /// In inference, a batch at the small-batch kernel's limit (`max_rows`, with a panel of
    /// columns for every thread of the pool, so that it runs there) and one of a row more (on
    /// this kernel) give their common rows the same bits; so do 32 and 33 rows (`FEW_ROWS`),
    /// wherever the CPU and the pool's size send them.
    #[test]
    fn a_batch_one_row_past_the_small_kernel_keeps_its_rows_bits() {
        use super::super::packed_gemm::{FEW_ROWS, NR, max_rows};
        use crate::{Device, Tensor};
        if !on_weft_engine() {
            return;
        }
        let dev = Device::Cpu;
        let n = NR * rayon::current_num_threads().max(2) + 6;
        let w = Tensor::rand(-1.0, 1.0, &[300, n], 2, &dev).unwrap();
        for rows in [max_rows(), FEW_ROWS] {
            let x = Tensor::rand(-1.0, 1.0, &[rows + 1, 300], rows as u64, &dev).unwrap();
            let first = x.narrow(0, 0, rows).unwrap().contiguous().unwrap();
            // The third call of each reads the weights' kept packed copy.
            let (mut all, mut some) = (Vec::new(), Vec::new());
            for _ in 0..3 {
                all = bits(&crate::no_grad(|| x.matmul(&w)).unwrap());
                some = bits(&crate::no_grad(|| first.matmul(&w)).unwrap());
            }
            assert_eq!(all[..rows * n], some[..], "{rows} rows against {}", rows + 1);
        }
    }

    /// In inference a weight matrix is packed once and kept by its storage, and the product
    /// gives the bits it gives with gradients on (which packs it every time).
    #[test]
    fn inference_keeps_the_packed_weights_and_the_same_bits() {
        use crate::{Device, Tensor};
        if !on_weft_engine() {
            return;
        }
        let dev = Device::Cpu;
        let x = Tensor::rand(-1.0, 1.0, &[70, 100], 1, &dev).unwrap();
        let w = Tensor::rand(-1.0, 1.0, &[100, 90], 2, &dev).unwrap();
        let with_grads = bits(&x.matmul(&w).unwrap());
        let crate::storage::Storage::Cpu(super::super::CpuStorage::F32(buf)) = w.storage() else {
            panic!("a Cpu f32 tensor")
        };
        assert_eq!(buf.rhs_layouts(), 0, "with gradients on, nothing is kept");
        for call in 0..3 {
            let y = crate::no_grad(|| x.matmul(&w)).unwrap();
            assert_eq!(bits(&y), with_grads, "inference call {call}");
        }
        assert_eq!(buf.rhs_layouts(), 1, "one layout remembered");
        assert_eq!(buf.rhs_copies(), 1, "the weights' packed copy is kept");
    }
}
