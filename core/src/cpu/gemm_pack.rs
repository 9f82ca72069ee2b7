//! Packing for weft's own f32 products (`blocked_gemm`; `packed_gemm`, the small batches', packs
//! only its right matrix and reads its rows in place): the micro-kernel reads both operands as
//! panels laid out in the order it consumes them, so every load is sequential and each panel fits
//! the cache it is meant to stay in (a left matrix may also be read in place, see
//! `blocked_gemm::reads_left_in_place`).
//!
//! - The left matrix in panels of `MR` rows: for each `p`, the `MR` values `a[r, p]`.
//! - The right matrix in panels of `NR` columns: for each `p`, the `NR` values `b[p, j]`.
//!
//! Rows or columns past the matrix's edge are packed as zeros, so the kernel always reads whole
//! panels. Where the source has its values adjacent along the other axis (a row-major left
//! matrix, a transposed right matrix), blocks of 8 x 8 are turned in registers.
//!
//! Off x86-64 only the right matrix's packing is used (the small-batch kernel's weights cache
//! exists everywhere; the kernels that read packed left matrices are x86-64 only).
#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]

/// Rows of a left panel (the micro-kernel's rows).
pub(crate) const MR: usize = 6;
/// Columns of a right panel (two AVX registers).
pub(crate) const NR: usize = 16;

/// A strided matrix: element `(i, j)` at `ptr + i * rs + j * cs`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Strided {
    pub ptr: *const f32,
    pub rs: isize,
    pub cs: isize,
}

// SAFETY: only read, and the products that share one read it while its owner keeps it alive.
unsafe impl Send for Strided {}
unsafe impl Sync for Strided {}

impl Strided {
    /// The matrix starting at element `(i, j)`.
    ///
    /// # Safety
    /// `(i, j)` lies inside the matrix's allocation.
    pub unsafe fn at(self, i: usize, j: usize) -> Strided {
        // SAFETY: the caller's bound.
        Strided { ptr: unsafe { self.ptr.offset(i as isize * self.rs + j as isize * self.cs) }, ..self }
    }

    /// Element `(i, j)`.
    ///
    /// # Safety
    /// As for [`Strided::at`].
    unsafe fn get(self, i: usize, j: usize) -> f32 {
        // SAFETY: the caller's bound.
        unsafe { *self.ptr.offset(i as isize * self.rs + j as isize * self.cs) }
    }
}

/// Values [`pack_a`] writes for `mc` rows and `kc` columns.
pub(crate) fn a_len(mc: usize, kc: usize) -> usize {
    mc.div_ceil(MR) * MR * kc
}

/// Values [`pack_b`] writes for `kc` rows and `nc` columns.
pub(crate) fn b_len(kc: usize, nc: usize) -> usize {
    nc.div_ceil(NR) * NR * kc
}

/// Row tile `t` of a block of `mc` rows on 6-row tiles: its first row and its rows. Tiles of
/// `MR` rows, except that where the last would hold 1 to 3 rows, the last two share the last
/// `MR + r` rows evenly (4 + 3, 4 + 4, 5 + 4). Why: a tile's accumulators are its independent
/// multiply-add chains, two per row, and the FMA unit takes two a cycle, each four cycles
/// long: 4 rows (8 chains) keep it full, 2 rows half. A product of 32 rows ran its sixth tile of
/// 2 rows as slowly as one of 4; as 4 + 4 the last eight rows take the time of eight. There are
/// `mc.div_ceil(MR)` tiles either way, tile `t` in packed panel `t` ([`pack_a_tiles`]); each
/// element is summed the same way whatever tile holds its row (the same bits).
pub(crate) fn row_tile(mc: usize, t: usize) -> (usize, usize) {
    let (full, r) = (mc / MR, mc % MR);
    if mc > MR && (1..=3).contains(&r) && t + 1 >= full {
        let (start, first) = ((full - 1) * MR, (MR + r).div_ceil(2));
        return if t + 1 == full { (start, first) } else { (start + first, MR + r - first) };
    }
    (t * MR, MR.min(mc - t * MR))
}

/// [`pack_a`] with row tile `t` ([`row_tile`]) in panel `t`, zero past its rows: the layout the
/// 6-row tiles read. Same room ([`a_len`]).
///
/// # Safety
/// As [`pack_a`].
pub(crate) unsafe fn pack_a_tiles(a: Strided, mc: usize, kc: usize, dst: *mut f32) {
    let tiles = mc.div_ceil(MR);
    // The tiles of MR rows from the first row, in one pass; the shared tail, a panel each.
    let even = (0..tiles).take_while(|&t| row_tile(mc, t) == (t * MR, MR)).count();
    // SAFETY (all three): the caller's bounds; each panel is one of a_len(mc, kc)'s.
    unsafe {
        pack_a(a, even * MR, kc, dst);
        for t in even..tiles {
            let (start, rows) = row_tile(mc, t);
            pack_a(a.at(start, 0), rows, kc, dst.add(t * MR * kc));
        }
    }
}

/// Rows `0..mc`, columns `0..kc` of `a` as panels of `MR` rows: panel `t`, value `p * MR + r` is
/// `a[t * MR + r, p]` (zero past row `mc`).
///
/// # Safety
/// Every element of the `mc x kc` matrix lies in a live allocation; `dst` has room for
/// [`a_len`]`(mc, kc)` values.
pub(crate) unsafe fn pack_a(a: Strided, mc: usize, kc: usize, dst: *mut f32) {
    let avx = avx();
    if a.rs == 1 && a.cs != 1 {
        // A transposed matrix: rows adjacent; read each column in order, six values per panel.
        let full = mc / MR;
        for p in 0..kc {
            let col = unsafe { a.at(0, p).ptr };
            for t in 0..full {
                // SAFETY: rows t * MR.. of column p lie in the matrix; panel t, value p * MR in a_len.
                unsafe { std::ptr::copy_nonoverlapping(col.add(t * MR), dst.add(t * MR * kc + p * MR), MR) };
            }
            for i in full * MR..mc.div_ceil(MR) * MR {
                let v = if i < mc { unsafe { *col.add(i) } } else { 0.0 };
                unsafe { *dst.add(full * MR * kc + p * MR + i % MR) = v };
            }
        }
        return;
    }
    for t in 0..mc.div_ceil(MR) {
        // SAFETY (this loop): panel t's values lie inside a_len; its rows inside the matrix.
        let panel = unsafe { dst.add(t * MR * kc) };
        let rows = MR.min(mc - t * MR);
        let mut p = 0;
        if avx && rows == MR && a.cs == 1 {
            // Eight columns of the six rows at a time, turned in registers (rows 6 and 7 repeat
            // row 5); each 8-wide store's last two values are overwritten by the next one or by
            // the scalar loop below, which always takes the last column or more: nothing is
            // written outside the panel, so panels can be packed by several threads at once.
            while p + 8 < kc {
                let src = std::array::from_fn(|j| unsafe { a.at(t * MR + j.min(MR - 1), p).ptr });
                unsafe { turn8(src, panel.add(p * MR), MR) };
                p += 8;
            }
        }
        for p in p..kc {
            for r in 0..MR {
                let v = if r < rows { unsafe { a.get(t * MR + r, p) } } else { 0.0 };
                unsafe { *panel.add(p * MR + r) = v };
            }
        }
    }
}

/// Rows `0..kc`, columns `0..nc` of `b` as panels of `NR` columns: panel `t`, value `p * NR + j`
/// is `b[p, t * NR + j]` (zero past column `nc`).
///
/// # Safety
/// Every element of the `kc x nc` matrix lies in a live allocation; `dst` has room for
/// [`b_len`]`(kc, nc)` values.
pub(crate) unsafe fn pack_b(b: Strided, kc: usize, nc: usize, dst: *mut f32) {
    let avx = avx();
    let mut first = 0;
    if b.cs == 1 {
        // Rows adjacent: eight panels at a time, each row's 128 values (eight lines side by side,
        // which the prefetcher follows) dealt to them. Panel by panel, each row gives one line, a
        // row apart: in the MLP step that packing took 7.4% of the time, this 4.6%.
        first = nc / NR;
        for t0 in (0..first).step_by(8) {
            for p in 0..kc {
                for t in t0..first.min(t0 + 8) {
                    // SAFETY: row p, columns t * NR.. lie in the matrix; panel t, row p in b_len.
                    unsafe { std::ptr::copy_nonoverlapping(b.at(p, t * NR).ptr, dst.add(t * NR * kc + p * NR), NR) };
                }
            }
        }
    }
    for t in first..nc.div_ceil(NR) {
        // SAFETY (this loop): panel t's values lie inside b_len; its columns inside the matrix.
        let panel = unsafe { dst.add(t * NR * kc) };
        let cols = NR.min(nc - t * NR);
        let mut p = 0;
        if avx && cols == NR && b.rs == 1 {
            // A transposed matrix: each column's values adjacent; 8 x 8 blocks turned in registers.
            while p + 8 <= kc {
                for h in 0..2 {
                    let src = std::array::from_fn(|j| unsafe { b.at(p, t * NR + h * 8 + j).ptr });
                    unsafe { turn8(src, panel.add(p * NR + h * 8), NR) };
                }
                p += 8;
            }
        }
        for j in 0..NR {
            for p in p..kc {
                let v = if j < cols { unsafe { b.get(p, t * NR + j) } } else { 0.0 };
                unsafe { *panel.add(p * NR + j) = v };
            }
        }
    }
}

/// `dst[i * dstride + j] = rows[j][i]` for `i, j < 8`, in registers (the caller checked AVX).
///
/// # Safety
/// Each of `rows` reaches 8 values, `dst` reaches `7 * dstride + 8`.
#[cfg(target_arch = "x86_64")]
unsafe fn turn8(rows: [*const f32; 8], dst: *mut f32, dstride: usize) {
    // SAFETY: the caller's bounds; only called where `avx()` said yes.
    unsafe { super::strided_copy::transpose8(rows, dst, dstride) }
}

/// Never called where there is no AVX (`avx()` is false there); kept so the loops need no cfg.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn turn8(rows: [*const f32; 8], dst: *mut f32, dstride: usize) {
    for i in 0..8 {
        for (j, r) in rows.iter().enumerate() {
            // SAFETY: the caller's bounds.
            unsafe { *dst.add(i * dstride + j) = *r.add(i) };
        }
    }
}

/// Whether the 8 x 8 blocks run in registers.
fn avx() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Both packings put every element where the kernel reads it and zeros past the edges,
        /// for row-major, transposed and broadcast sources, across the 8 x 8 blocks' edges.
        #[test]
        fn panels_hold_the_matrix_and_zeros(rows in 1usize..30, cols in 1usize..40, kind in 0u8..3, off in 0usize..4) {
            let (rs, cs, len) = match kind {
                0 => (cols as isize, 1, rows * cols),
                1 => (1, rows as isize, rows * cols),
                _ => (0, 1, cols),
            };
            let src: Vec<f32> = (0..off + len).map(|i| i as f32 + 0.5).collect();
            let m = Strided { ptr: src[off..].as_ptr(), rs, cs };
            let want = |i: usize, j: usize| src[off + (i as isize * rs + j as isize * cs) as usize];
            // As a left matrix: rows x cols.
            let mut a = vec![f32::NAN; a_len(rows, cols)];
            unsafe { pack_a(m, rows, cols, a.as_mut_ptr()) };
            for i in 0..rows.div_ceil(MR) * MR {
                for p in 0..cols {
                    let got = a[(i / MR) * MR * cols + p * MR + i % MR];
                    let w = if i < rows { want(i, p) } else { 0.0 };
                    prop_assert_eq!(got, w, "a[{}, {}] of {}x{} kind {}", i, p, rows, cols, kind);
                }
            }
            // As the 6-row tiles read it: tile t's rows in panel t, zeros past them.
            let mut a = vec![f32::NAN; a_len(rows, cols)];
            unsafe { pack_a_tiles(m, rows, cols, a.as_mut_ptr()) };
            for t in 0..rows.div_ceil(MR) {
                let (start, n) = row_tile(rows, t);
                for r in 0..MR {
                    for p in 0..cols {
                        let got = a[t * MR * cols + p * MR + r];
                        let w = if r < n { want(start + r, p) } else { 0.0 };
                        prop_assert_eq!(got, w, "tile {} row {} col {} of {}x{} kind {}", t, r, p, rows, cols, kind);
                    }
                }
            }
            // As a right matrix: rows x cols.
            let mut b = vec![f32::NAN; b_len(rows, cols)];
            unsafe { pack_b(m, rows, cols, b.as_mut_ptr()) };
            for p in 0..rows {
                for j in 0..cols.div_ceil(NR) * NR {
                    let got = b[(j / NR) * NR * rows + p * NR + j % NR];
                    let w = if j < cols { want(p, j) } else { 0.0 };
                    prop_assert_eq!(got, w, "b[{}, {}] of {}x{} kind {}", p, j, rows, cols, kind);
                }
            }
        }
    }

    /// The row tiles cover a block's rows once, in order, as many as panels of `MR`; a tile of
    /// 1 or 2 rows comes only where the block has no more rows.
    #[test]
    fn row_tiles_cover_the_rows_without_short_tiles() {
        for mc in 1usize..200 {
            let tiles: Vec<(usize, usize)> = (0..mc.div_ceil(MR)).map(|t| row_tile(mc, t)).collect();
            let mut next = 0;
            for &(start, rows) in &tiles {
                assert!(start == next && (1..=MR).contains(&rows), "mc {mc}: {tiles:?}");
                assert!(rows >= 3 || mc < 3, "mc {mc}: a tile of {rows} rows in {tiles:?}");
                next += rows;
            }
            assert_eq!(next, mc, "mc {mc}: {tiles:?}");
        }
        assert_eq!(
            (0..6).map(|t| row_tile(32, t)).collect::<Vec<_>>(),
            [(0, 6), (6, 6), (12, 6), (18, 6), (24, 4), (28, 4)]
        );
    }
}
