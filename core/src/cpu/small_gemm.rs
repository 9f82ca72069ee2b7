//! Small products on weft's micro-kernel, one tile walk each. An attention's scores and its
//! weighted values are many products of a few dozen rows, columns and `k` (MiniLM's forward: 96
//! of 32 x 32 x 32 per layer, twice). They are too small for `blocked_gemm`'s blocking (its
//! buffers, prefetches and loops cost about what the sums do), and on faer's kernels each took
//! about 2 us. Here a product packs its right matrix into its thread's packing room (`pack_room`:
//! kept between products, as `blocked_gemm`'s parts keep theirs), reads the left rows where they
//! lie (or packs them, when a row's values are not adjacent) and runs the 6 x 16 tiles over all of
//! `k` at once: `k` is at most one of `blocked_gemm`'s chunks, so each element is one multiply-add
//! chain, the bits `blocked_gemm` gives the same product.

use super::blocked_gemm::{Tile, isa, k_chunk, tile_rows};
use super::gemm_engine::Product;
use super::gemm_pack::{MR, NR, Strided, a_len, b_len, pack_a_tiles, pack_b, row_tile};
use super::pack_room::with_room;
use crate::Result;

/// Values in a cache line (the packed panels start on one).
const LINE: usize = 16;

/// Whether an `m x k` by `k x n` product runs here: small (under 2^18 multiply-adds, so the
/// buffers stay under 1 MiB), at least one whole tile of rows and columns, `k` from 16 and
/// within one chunk, on a CPU whose tiles are 256 bits (with 512-bit tiles the left panels are
/// laid out in pairs; such CPUs keep faer's AVX-512 kernels for these).
pub(crate) fn suits(m: usize, n: usize, k: usize) -> bool {
    !isa().wide() && m >= MR && n >= NR && k >= 16 && k_chunk(k) == k && m * n * k < 1 << 18
}

/// Runs `p` on the calling thread.
///
/// # Safety
/// The CPU has AVX2 and FMA; `suits(p.m, p.n, p.k)`; `p`'s left (`m x k`), right (`k x n`) and
/// output (`m x n`, row stride `p.dst_rs`, unit column stride) lie in live allocations, and
/// strides are non-negative.
pub(crate) unsafe fn run(p: &Product) -> Result<()> {
    let (m, n, k) = (p.m, p.n, p.k);
    let in_place = p.lhs_cs == 1;
    let (b_room, a_room) = (b_len(k, n), if in_place { 0 } else { a_len(m, k) });
    with_room(LINE + b_room + a_room, |base| {
        // SAFETY: the room holds a line's worth of alignment, the packed right matrix, then the
        // packed left one (each written before it is read); the caller's bounds for p's matrices.
        unsafe {
            let bp = base.add(base.align_offset(LINE * 4).min(LINE));
            let ap = bp.add(b_room);
            pack_b(Strided { ptr: p.rhs, rs: p.rhs_rs, cs: p.rhs_cs }, k, n, bp);
            let a = Strided { ptr: p.lhs, rs: p.lhs_rs, cs: p.lhs_cs };
            if !in_place {
                pack_a_tiles(a, m, k, ap);
            }
            for t in 0..m.div_ceil(MR) {
                let (i, rows) = row_tile(m, t);
                let (left, lda) =
                    if in_place { (a.at(i, 0).ptr, p.lhs_rs as usize) } else { (ap.add(t * MR * k).cast_const(), 0) };
                let out = p.dst.add(i * p.dst_rs as usize);
                for j in (0..n).step_by(NR) {
                    let t = Tile {
                        kc: k,
                        a: left,
                        lda,
                        b: bp.add((j / NR) * k * NR),
                        per: k * NR,
                        c: out.add(j),
                        ldc: p.dst_rs as usize,
                        nr: NR.min(n - j),
                        add: false,
                        next_b: std::ptr::null(),
                    };
                    if in_place { tile_rows::<true>(false, rows, t) } else { tile_rows::<false>(false, rows, t) }
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::super::blocked_gemm::tests::{has_kernel, strided_product};
    use super::*;
    use proptest::prelude::*;

    fn val(i: usize, s: u64) -> f32 {
        (((i as u64 * 2654435761 + s * 131) % 2003) as f32 / 1001.5) - 1.0
    }

    /// `a @ b` here and on `blocked_gemm`, for a left matrix in rows (`ta` false) or transposed,
    /// a right one in rows or transposed, each with rows `pad` values longer than needed (an
    /// attention's heads side by side), and an output with its rows `pad` longer too (its
    /// columns past `n` must stay untouched).
    fn both(
        m: usize,
        n: usize,
        k: usize,
        (ta, tb): (bool, bool),
        pad: usize,
        seed: u64,
    ) -> (Vec<f32>, Vec<f32>, Vec<f64>) {
        let (ars, acs) = if ta { (1, (m + pad) as isize) } else { ((k + pad) as isize, 1) };
        let (brs, bcs) = if tb { (1, (k + pad) as isize) } else { ((n + pad) as isize, 1) };
        let a: Vec<f32> = (0..(m + pad) * (k + pad)).map(|i| val(i, seed)).collect();
        let b: Vec<f32> = (0..(k + pad) * (n + pad)).map(|i| val(i, seed + 5)).collect();
        let ldc = n + pad;
        let go = |small: bool| {
            let mut out = vec![f32::NAN; m * ldc];
            let p = strided_product((m, n, k), (&a, ars, acs), (&b, brs, bcs), (out.as_mut_ptr(), ldc));
            // SAFETY: the kernel exists (has_kernel); every stride stays inside a, b and out.
            unsafe {
                if small {
                    run(&p).unwrap();
                } else {
                    super::super::blocked_gemm::run(&p, None, 1).unwrap();
                }
            }
            out
        };
        let at = |i: usize, q: usize| a[(i as isize * ars + q as isize * acs) as usize] as f64;
        let bt = |q: usize, j: usize| b[(q as isize * brs + j as isize * bcs) as usize] as f64;
        let want = (0..m * ldc).map(|e| (0..k).map(|q| at(e / ldc, q) * bt(q, e % ldc)).sum()).collect();
        (go(true), go(false), want)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        /// Matches the f64 sums, leaves the output's other columns alone, and gives the bits of
        /// `blocked_gemm` for every layout, edge rows (m not a multiple of 6) and edge columns.
        #[test]
        fn small_products_give_the_blocked_kernels_bits(m in 6usize..50, n in 16usize..70, k in 16usize..200,
                ta: bool, tb: bool, pad in 0usize..3, seed in 0u64..1000) {
            if !has_kernel() || !suits(m, n, k) {
                return Ok(());
            }
            let (small, blocked, want) = both(m, n, k, (ta, tb), pad, seed);
            let ldc = n + pad;
            for (e, (&got, &w)) in small.iter().zip(&want).enumerate() {
                let (i, j) = (e / ldc, e % ldc);
                if j >= n {
                    prop_assert!(got.is_nan(), "m{m} n{n} k{k}: ({i}, {j}) past the output's columns was written");
                } else {
                    prop_assert!((got as f64 - w).abs() <= 1e-5 * (k as f64).sqrt() * 4.0,
                        "m{m} n{n} k{k} layouts {ta} {tb} at ({i}, {j}): {got} vs {w}");
                }
            }
            prop_assert!(small.iter().zip(&blocked).all(|(x, y)| x.to_bits() == y.to_bits()),
                "m{m} n{n} k{k} layouts {ta} {tb}: other bits than blocked_gemm's");
        }
    }

    #[test]
    fn suits_small_products_in_one_chunk_only() {
        if isa().wide() {
            assert!(!suits(32, 32, 32));
            return;
        }
        assert!(suits(32, 32, 32));
        assert!(suits(6, 16, 16));
        assert!(!suits(5, 32, 32), "fewer rows than a tile");
        assert!(!suits(32, 15, 32), "fewer columns than a panel");
        assert!(!suits(32, 32, 15), "k under 16");
        assert!(!suits(6, 16, 257), "k over one chunk");
        assert!(!suits(64, 64, 64), "2^18 multiply-adds: blocked_gemm's");
    }
}
