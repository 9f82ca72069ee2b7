//! weft's own f32 product for AVX2+FMA CPUs, for products of few rows in inference (no gradient
//! recorded, outside a backward pass): batches of up to 32 rows ([`FEW_ROWS`]), or 64 to 128 where
//! weft's kernel suits the shape and every thread gets columns ([`max_rows`]): one request, a few
//! sentences, a small batch of images, the threads splitting the columns. The right
//! matrix (a layer's weights) is packed into 16-column panels; a storage keeps its packed copy
//! from its second use in the same layout on, so a model's weights are packed on their first two
//! calls and never again, as onnxruntime pre-packs its constant weights. This costs a second copy
//! of the weights while they live. (Products of more rows in inference use the same kept copy,
//! on `blocked_gemm`.)
//!
//! Why not faer's kernels here: with few rows they cannot amortise their own packing. Measured in
//! one process, best of 9 runs each (AMD EPYC Zen 3, AVX2), this kernel against faer's: 1 x 384
//! x 1536 1.8x, 4 rows 1.6x, 8 rows 1.25–1.35x, 16 rows 1.25x, 32 rows 1.15x on one thread; 1.8x
//! to 1.0x on two.
//!
//! The loops: `k` in chunks of at most 256 (`blocked_gemm::k_chunk`; a 16-column panel chunk,
//! 16 KiB, stays in L1 while every row passes over it), the rows read in place ([`Lhs`], in
//! `Isa::row_tile`'s tiles: with 256-bit tiles 8 rows as 4 + 4, not 6 + 2), and `blocked_gemm`'s
//! micro-kernel. Each output element is summed in the same order as in `blocked_gemm`, whatever
//! `m`, `n` and the thread count: splitting the columns over threads or devices changes no bit,
//! nor does a row more that sends the product to `blocked_gemm` (past [`max_rows`], or past
//! [`FEW_ROWS`] where the threads outnumber the panels: the engine is weft's, the shape `suits`
//! it, the rows' values adjacent). faer's kernels, which take narrow and small products with
//! gradients, may round differently.

#[cfg(target_arch = "x86_64")]
use super::blocked_gemm::{Isa, Tile};
pub(crate) use super::gemm_pack::NR;
use super::gemm_pack::{Strided, b_len, pack_b};
use crate::{Error, Result};
#[cfg(target_arch = "x86_64")]
use std::ops::Range;
use std::sync::{Arc, Mutex};

/// Rows of a product that always runs here (with a right matrix of at least one panel).
pub(crate) const FEW_ROWS: usize = 32;

/// Most rows of a product that runs here where weft's kernel suits its shape
/// (`gemm_engine::on_weft`) and every thread gets a panel (more run on `blocked_gemm`; see the
/// module doc): 128 where the tiles are 512 bits wide, 64 with 256-bit ones, [`FEW_ROWS`] where
/// AVX-512 is split into halves (Zen 4, where `blocked_gemm` runs these products on 512-bit
/// tiles and this kernel would not: not measured there). Here the threads split the columns, so
/// the kept weights are read once between them, where `blocked_gemm`'s parts split the rows and
/// each reads all of them; and the rows, read in place, stay in the cache over every panel.
/// Measured in one process, alternating (Intel Xeon with AVX-512), here against `blocked_gemm`,
/// inference through 784-512-512-10 and 784-1024-1024-10 MLPs on 2 threads: 48 rows 1.35x, 64
/// 1.32x, 96 1.17x, 128 1.16x, 256 level (1.02, noisy); one thread, 64 rows 1.06x, a
/// 384-1536-384 MLP's 128 rows 1.05x (1.09x on 2); with 256-bit tiles forced, 64 rows 1.09x,
/// 128 rows 1.01-1.03x.
#[cfg(target_arch = "x86_64")]
pub(crate) fn max_rows() -> usize {
    if super::gemm_engine::split_avx512() {
        FEW_ROWS
    } else if super::blocked_gemm::isa().wide() {
        MOST_ROWS
    } else {
        64
    }
}

/// The most rows [`max_rows`] gives on any CPU.
pub(crate) const MOST_ROWS: usize = 128;

/// Whether this CPU runs the kernel (AVX2 and FMA, where `gemm_engine` picks weft's engine or
/// faer's AVX2 one; its tiles are 512 bits wide where AVX-512 runs at full width).
pub(crate) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use super::gemm_engine::{Engine, engine};
        matches!(engine(), Engine::Weft | Engine::Avx2)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// A `k x n` right matrix in panels of 16 columns, the last padded with zeros: panel `j` holds `k`
/// rows of 16 values, columns `16 j ..`.
#[derive(Debug)]
pub(crate) struct PackedRhs {
    k: usize,
    n: usize,
    data: Vec<f32>,
    /// Where the panels start in `data` (on a cache line).
    start: usize,
}

impl PackedRhs {
    /// Packs `b[off + p * rs + j * cs]` for `p < k`, `j < n`; `Err` when an element lies outside
    /// `b` or memory runs out.
    pub fn pack(b: &[f32], off: usize, rs: usize, cs: usize, k: usize, n: usize) -> Result<PackedRhs> {
        let last = off + k.saturating_sub(1) * rs + n.saturating_sub(1) * cs;
        if k == 0 || n == 0 || last >= b.len() {
            return Err(Error::invalid(
                "matmul",
                format!("a {k}x{n} right matrix at {off} (strides {rs}, {cs}) does not lie in its {} values", b.len()),
            ));
        }
        // A line of room, so that the panels start on a cache line (see `blocked_gemm`).
        let len = b_len(k, n) + 16;
        let mut data = Vec::new();
        data.try_reserve_exact(len).map_err(|_| Error::OutOfMemory { bytes: len as u64 * 4, device: "cpu".into() })?;
        data.resize(len, 0.0);
        let start = data.as_ptr().align_offset(64).min(16);
        let m = Strided { ptr: b[off..].as_ptr(), rs: rs as isize, cs: cs as isize };
        // SAFETY: the last element lies inside b (checked above); data has b_len values from start.
        unsafe { pack_b(m, k, n, data.as_mut_ptr().add(start)) };
        Ok(PackedRhs { k, n, data, start })
    }

    /// Panels of the packed matrix.
    pub fn panels(&self) -> usize {
        self.n.div_ceil(NR)
    }

    /// Rows and columns.
    pub fn dims(&self) -> (usize, usize) {
        (self.k, self.n)
    }

    /// The first panel's first value (panel `j` starts `j * k * NR` values on).
    #[cfg(target_arch = "x86_64")]
    pub fn panels_ptr(&self) -> *const f32 {
        // SAFETY: start lies inside data (at most 16 of its extra values).
        unsafe { self.data.as_ptr().add(self.start) }
    }
}

/// Where a right matrix lies in its storage: offset, row and column strides, `k`, `n`.
pub(crate) type Key = (usize, usize, usize, usize, usize);

/// What a storage keeps of its uses as a right matrix: the layouts seen, each with its packed copy
/// once seen twice. Up to four layouts (a tied embedding used both ways, a fused projection cut
/// into three); a new one replaces the oldest layout seen only once, and only when every entry
/// holds a copy, the oldest copy.
#[derive(Debug, Default)]
pub(crate) struct RhsCache(Mutex<Vec<(Key, Option<Arc<PackedRhs>>)>>);

/// Layouts a storage remembers.
const LAYOUTS: usize = 4;

impl RhsCache {
    /// How many layouts are remembered (for tests).
    #[cfg(test)]
    pub fn layouts(&self) -> usize {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// How many packed copies are kept (for tests).
    #[cfg(test)]
    pub fn copies(&self) -> usize {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).iter().filter(|(_, p)| p.is_some()).count()
    }

    /// The packed matrix at `key`: kept from an earlier use, packed and kept on the second use, or
    /// packed for this use only on the first.
    pub fn get(&self, b: &[f32], key: Key) -> Result<Arc<PackedRhs>> {
        let pack = || {
            let (off, rs, cs, k, n) = key;
            PackedRhs::pack(b, off, rs, cs, k, n).map(Arc::new)
        };
        let mut seen = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, kept)) = seen.iter_mut().find(|(k, _)| *k == key) {
            return match kept {
                Some(p) => Ok(p.clone()),
                None => Ok(kept.insert(pack()?).clone()),
            };
        }
        if seen.len() == LAYOUTS {
            let once = seen.iter().position(|(_, p)| p.is_none()).unwrap_or(0);
            seen.remove(once);
        }
        seen.push((key, None));
        drop(seen);
        pack()
    }
}

/// The `m` rows of a small product's left matrix, read in place by [`run`]'s tiles at either
/// width (rows `lda` apart, each row's values adjacent), as `blocked_gemm` reads a row-major left
/// matrix where it does not pack it: the same sums in the same order as packed rows. They were
/// packed before, a pass on the calling thread alone while the other threads waited for the
/// columns to split.
/// Measured in one process, alternating (Intel Xeon with AVX-512, 2 threads), in place against
/// packed: a batch of 32 through a 784-256-10 MLP's inference 1.72x faster with 512-bit tiles and
/// 1.53x with 256-bit ones, a batch of 8 1.10x and 1.38x; a 384-1536-384 MLP's batches of 4 to
/// 32, whose weights' reads cost most, 1.06-1.12x and 1.01-1.07x.
#[cfg(target_arch = "x86_64")]
pub(crate) struct Lhs<'a> {
    a: &'a [f32],
    m: usize,
    lda: usize,
    k: usize,
}

#[cfg(target_arch = "x86_64")]
impl<'a> Lhs<'a> {
    /// The rows `a[i * lda + p]` for `i < m`, `p < k`; `Err` when there are none (`m` or `k` is
    /// 0) or a row does not lie in `a` (the tiles read every value up to `(m - 1) * lda + k`).
    pub fn new(a: &'a [f32], m: usize, lda: usize, k: usize) -> Result<Lhs<'a>> {
        let reach = m.checked_sub(1).and_then(|r| r.checked_mul(lda)).and_then(|r| r.checked_add(k));
        if k == 0 || reach.is_none_or(|r| r > a.len()) {
            return Err(Error::invalid(
                "matmul",
                format!("{m} rows of {k} values (row stride {lda}) do not lie in {} values", a.len()),
            ));
        }
        Ok(Lhs { a, m, lda, k })
    }
}

/// `c[i, j] = sum_p a[i, p] * b[p, j]` for the rows of `a` and the columns of `panels`.
///
/// # Safety
/// The CPU has AVX2 and FMA ([`available`]); `a` and `b` have the same `k`; `c` reaches
/// `(m - 1) * ldc + n - 1` inside a live allocation (m that of `a`, n that of `b`); no other
/// thread reads or writes the columns of `panels` in `c` meanwhile.
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn run(a: &Lhs, b: &PackedRhs, panels: Range<usize>, c: *mut f32, ldc: usize) {
    // SAFETY: the caller's contract; `isa` is a width this CPU runs.
    unsafe { run_at(super::blocked_gemm::isa(), a, b, panels, c, ldc) }
}

/// [`run`] with the tiles at `isa`'s width (tests run both where the CPU has AVX-512).
///
/// # Safety
/// As [`run`]; the CPU runs `isa`'s tiles.
#[cfg(target_arch = "x86_64")]
unsafe fn run_at(isa: Isa, a: &Lhs, b: &PackedRhs, panels: Range<usize>, c: *mut f32, ldc: usize) {
    let (m, k, lda) = (a.m, b.k, a.lda);
    debug_assert_eq!(a.k, k);
    let kc_len = super::blocked_gemm::k_chunk(k);
    // Columns up to the end of the last panel of this range (and of the matrix).
    let end = (panels.end * NR).min(b.n);
    for p0 in (0..k).step_by(kc_len) {
        let kc = kc_len.min(k - p0);
        // One or two panels per tile (see `blocked_gemm::Isa`), never past this range's own.
        for j in panels.clone().step_by(isa.cols() / NR) {
            let c0 = j * NR;
            let nr = isa.cols().min(end - c0);
            // SAFETY: panel j, rows p0.. lie inside the packed data (j < panels, p0 + kc <= k).
            let bp = unsafe { b.panels_ptr().add(j * k * NR + p0 * NR) };
            for it in 0..m.div_ceil(isa.rows()) {
                let (i, tile_rows) = isa.row_tile(m, it);
                // SAFETY: the tile's rows i.. (lda apart), values p0..p0 + kc lie inside a (the
                // reach checked by `Lhs::new`); rows i.., columns c0..c0 + nr of c inside the
                // caller's bounds; the tile's second panel (when nr > NR) is panel j + 1 <
                // panels.end.
                unsafe {
                    let (ap, cp, per) = (a.a.as_ptr().add(i * lda + p0), c.add(i * ldc + c0), k * NR);
                    let t = Tile { kc, a: ap, lda, b: bp, per, c: cp, ldc, nr, add: p0 > 0, next_b: std::ptr::null() };
                    super::blocked_gemm::tile_rows::<true>(isa.wide(), tile_rows, t);
                }
            }
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// The kernel equals an f64 loop for any rows up to `MOST_ROWS`, `k` across chunk edges,
        /// columns off the panel width, a right matrix read with any strides from inside a larger
        /// buffer, and the columns split over any number of parts (each part gives the same bits).
        #[test]
        fn kernel_matches_f64(m in 1usize..=MOST_ROWS, n in 1usize..70, k in 1usize..600, lda_pad in 0usize..3,
                              transposed in any::<bool>(), off in 0usize..5, parts in 1usize..4, seed in 0u64..1000) {
            if !available() {
                eprintln!("packed_gemm: this CPU has no AVX2 and FMA (or the engine is forced off weft's); nothing to test");
                return Ok(());
            }
            let val = |i: usize, s: u64| (((i as u64 * 2654435761 + s * 97) % 1999) as f32 / 999.5) - 1.0;
            let lda = k + lda_pad;
            let a: Vec<f32> = (0..m * lda).map(|i| val(i, seed)).collect();
            let b: Vec<f32> = (0..off + k * n).map(|i| val(i, seed + 5)).collect();
            // Row-major k x n, or the transpose of a row-major n x k.
            let (rs, cs) = if transposed { (1, k) } else { (n, 1) };
            let packed = PackedRhs::pack(&b, off, rs, cs, k, n).unwrap();
            let mut whole = vec![f32::NAN; m * n];
            // SAFETY: a holds m rows of lda >= k values, whole m x n; the kernel exists.
            let lhs = Lhs::new(&a, m, lda, k).unwrap();
            unsafe { run(&lhs, &packed, 0..packed.panels(), whole.as_mut_ptr(), n) };
            // Cut into parts, every other part with the 256-bit tiles where the CPU also runs
            // 512-bit ones (tiles of 1 to 6 rows, one panel; every width gives the same bits),
            // the others at the CPU's width (a range that may start on an odd panel and end
            // inside a wide tile's second one).
            let mut split = vec![f32::NAN; m * n];
            let per = packed.panels().div_ceil(parts);
            for p in 0..parts {
                let cols = (p * per).min(packed.panels())..((p + 1) * per).min(packed.panels());
                let isa = if (p + seed as usize).is_multiple_of(2) { Isa::Avx2 } else { super::super::blocked_gemm::isa() };
                // SAFETY: as above, each part its own columns; every CPU with the kernel runs
                // 256-bit tiles, and `isa()` is a width it runs.
                unsafe { run_at(isa, &lhs, &packed, cols, split.as_mut_ptr(), n) };
            }
            for i in 0..m {
                for j in 0..n {
                    let want: f64 = (0..k).map(|p| a[i * lda + p] as f64 * b[off + p * rs + j * cs] as f64).sum();
                    let got = whole[i * n + j];
                    prop_assert!((got as f64 - want).abs() <= 1e-5 * (k as f64).sqrt() * 4.0,
                        "m{m} n{n} k{k} at ({i},{j}): {got} vs {want}");
                    prop_assert_eq!(got.to_bits(), split[i * n + j].to_bits());
                }
            }
        }
    }

    /// A fused projection cut into three column blocks and used in turn keeps all three copies
    /// (a cache of two would evict each before its next use and pack on every call).
    #[test]
    fn three_layouts_used_in_turn_are_all_kept() {
        let b: Vec<f32> = (0..48 * 10).map(|i| i as f32).collect();
        let cache = RhsCache::default();
        let keys: Vec<Key> = (0..3).map(|i| (i * 16, 48, 1, 10, 16)).collect();
        let mut kept = Vec::new();
        for round in 0..4 {
            for (i, key) in keys.iter().enumerate() {
                let p = cache.get(&b, *key).unwrap();
                if round == 1 {
                    kept.push(p);
                } else if round > 1 {
                    assert!(Arc::ptr_eq(&p, &kept[i]), "layout {i} was packed again in round {round}");
                }
            }
        }
    }

    /// A backward pass records no gradients either, but its weights are new storage every
    /// training step: it leaves them no packed copies (nor remembered layouts).
    #[test]
    fn a_backward_pass_keeps_no_packed_copies() {
        use crate::{Device, Tensor, Var};
        let dev = Device::Cpu;
        let w = Var::new(Tensor::rand(-1.0, 1.0, &[64, 40], 1, &dev).unwrap()).unwrap();
        let x = Var::new(Tensor::rand(-1.0, 1.0, &[4, 64], 2, &dev).unwrap()).unwrap();
        for _ in 0..3 {
            // The backward's g @ w^T has 4 rows: the kernel's size, were it inference.
            // (A square, so that the gradient reaching the product is a real matrix, not a
            // broadcast of ones.)
            let y = x.as_tensor().matmul(w.as_tensor()).unwrap();
            y.mul(&y).unwrap().sum_all().unwrap().backward().unwrap();
        }
        let crate::storage::Storage::Cpu(super::super::CpuStorage::F32(buf)) = w.as_tensor().storage() else {
            panic!("a Cpu f32 variable")
        };
        assert_eq!(buf.rhs_layouts(), 0);
        crate::no_grad(|| x.as_tensor().matmul(w.as_tensor())).unwrap();
        assert_eq!(buf.rhs_layouts(), 1, "inference remembers the layout");
    }

    /// A matrix that does not lie in its buffer is an `Err` naming its size, not a read outside.
    #[test]
    fn packing_outside_the_buffer_is_an_err() {
        let err = PackedRhs::pack(&[1.0; 10], 2, 3, 1, 3, 3).unwrap_err().to_string();
        assert!(err.contains("3x3") && err.contains("10 values"), "{err}");
    }
}
