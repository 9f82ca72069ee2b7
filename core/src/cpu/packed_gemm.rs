//! weft's own f32 product for AVX2+FMA CPUs, for products of few rows in inference (no gradient
//! recorded, outside a backward pass): small batches (one request, a few sentences). The right
//! matrix (a layer's weights) is packed into 16-column panels; a storage keeps its packed copy
//! from its second use in the same layout on, so a model's weights are packed on their first two
//! calls and never again, as onnxruntime pre-packs its constant weights. This costs a second copy
//! of the weights while they live. The left matrix is read in place.
//!
//! Why not faer's kernels here: with few rows they cannot amortise their own packing. Measured in
//! one process, best of 9 runs each (AMD EPYC Zen 3, AVX2), this kernel against faer's: 1 x 384 x
//! 1536 1.8x, 4 rows 1.6x, 8 rows 1.25–1.35x, 16 rows 1.25x, 32 rows 1.15x on one thread; 1.8x to
//! 1.0x on two. From 64 rows on faer is level or ahead on two threads (0.65–1.0), so it keeps them.
//!
//! The blocks: `k` in chunks of at most 256 (a 16-column panel chunk, 16 KiB, stays in L1 while
//! every row passes over it; the rows, at most 32 x 256 values, stay in L1 and L2), and a 6 x 16
//! micro-kernel with 12 accumulators. Within this kernel each output element is summed in the
//! same order whatever `m`, `n` and the thread count, so splitting the columns over threads or
//! devices changes no bit (a product of more rows, or with gradients, runs on faer's kernels and
//! may round differently).

use crate::{Error, Result};
use std::ops::Range;
use std::sync::{Arc, Mutex};

/// Columns per panel (two AVX registers).
pub(crate) const NR: usize = 16;
/// Rows per micro-kernel call.
const MR: usize = 6;
/// Most `k` values summed per pass over a panel.
const KC: usize = 256;
/// Products with more rows than this run on faer's kernels (see the module doc).
pub(crate) const MAX_ROWS: usize = 32;

/// Whether this CPU runs the kernel (AVX2 and FMA, without AVX-512: there faer's AVX-512 kernels
/// are twice as wide).
pub(crate) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        super::gemm_engine::engine() == super::gemm_engine::Engine::Avx2
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
}

impl PackedRhs {
    /// Packs `b[off + p * rs + j * cs]` for `p < k`, `j < n`; `Err` when an element lies outside
    /// `b` or memory runs out.
    pub fn pack(b: &[f32], off: usize, rs: usize, cs: usize, k: usize, n: usize) -> Result<PackedRhs> {
        let panels = n.div_ceil(NR);
        let last = off + k.saturating_sub(1) * rs + n.saturating_sub(1) * cs;
        if k == 0 || n == 0 || last >= b.len() {
            return Err(Error::invalid(
                "matmul",
                format!("a {k}x{n} right matrix at {off} (strides {rs}, {cs}) does not lie in its {} values", b.len()),
            ));
        }
        let len = panels * k * NR;
        let mut data = Vec::new();
        data.try_reserve_exact(len).map_err(|_| Error::OutOfMemory { bytes: len as u64 * 4, device: "cpu".into() })?;
        data.resize(len, 0.0);
        for (j, panel) in data.chunks_mut(k * NR).enumerate() {
            let c0 = j * NR;
            let w = NR.min(n - c0);
            for (p, row) in panel.chunks_mut(NR).enumerate() {
                let start = off + p * rs + c0 * cs;
                if cs == 1 {
                    row[..w].copy_from_slice(&b[start..start + w]);
                } else {
                    for (q, v) in row[..w].iter_mut().enumerate() {
                        *v = b[start + q * cs];
                    }
                }
            }
        }
        Ok(PackedRhs { k, n, data })
    }

    /// Panels of the packed matrix.
    pub fn panels(&self) -> usize {
        self.n.div_ceil(NR)
    }

    /// Rows and columns.
    pub fn dims(&self) -> (usize, usize) {
        (self.k, self.n)
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

/// `c[i, j] = sum_p a[i * lda + p] * b[p, j]` for rows `0..m` and the columns of `panels`.
///
/// # Safety
/// The CPU has AVX2 and FMA ([`available`]); `a` reaches `(m - 1) * lda + k - 1` and `c` reaches
/// `(m - 1) * ldc + n - 1` inside live allocations (k and n those of `b`); no other thread reads
/// or writes the columns of `panels` in `c` meanwhile.
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn run(
    m: usize,
    a: *const f32,
    lda: usize,
    b: &PackedRhs,
    panels: Range<usize>,
    c: *mut f32,
    ldc: usize,
) {
    let k = b.k;
    // Chunks of equal size: 384 is 192 + 192, not 256 + 128.
    let kc_len = k.div_ceil(k.div_ceil(KC));
    let mut p0 = 0;
    while p0 < k {
        let kc = kc_len.min(k - p0);
        for j in panels.clone() {
            let c0 = j * NR;
            let nr = NR.min(b.n - c0);
            // SAFETY: panel j, rows p0.. lie inside the packed data (j < panels, p0 + kc <= k).
            let bp = unsafe { b.data.as_ptr().add(j * k * NR + p0 * NR) };
            let mut i = 0;
            while i < m {
                let mr = MR.min(m - i);
                // SAFETY: rows i..i+mr < m and columns p0..p0+kc < k of a, columns c0..c0+nr of
                // c, all inside the caller's bounds.
                unsafe {
                    let (ap, cp) = (a.add(i * lda + p0), c.add(i * ldc + c0));
                    let first = p0 == 0;
                    match mr {
                        6 => micro::<6>(kc, ap, lda, bp, cp, ldc, nr, first),
                        5 => micro::<5>(kc, ap, lda, bp, cp, ldc, nr, first),
                        4 => micro::<4>(kc, ap, lda, bp, cp, ldc, nr, first),
                        3 => micro::<3>(kc, ap, lda, bp, cp, ldc, nr, first),
                        2 => micro::<2>(kc, ap, lda, bp, cp, ldc, nr, first),
                        _ => micro::<1>(kc, ap, lda, bp, cp, ldc, nr, first),
                    }
                }
                i += mr;
            }
        }
        p0 += kc;
    }
}

/// `R` rows by 16 columns over `kc` values of `k`: `c` gets the sums (`first`) or has them added;
/// only the first `nr` columns are written.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn micro<const R: usize>(
    kc: usize,
    a: *const f32,
    lda: usize,
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    nr: usize,
    first: bool,
) {
    use std::arch::x86_64::*;
    let mut lo = [_mm256_setzero_ps(); R];
    let mut hi = [_mm256_setzero_ps(); R];
    let (mut ap, mut bp) = (a, b);
    for _ in 0..kc {
        // SAFETY (this block): bp walks kc rows of one panel, ap kc columns of R rows (run's bounds).
        unsafe {
            let (b0, b1) = (_mm256_loadu_ps(bp), _mm256_loadu_ps(bp.add(8)));
            for r in 0..R {
                let av = _mm256_broadcast_ss(&*ap.add(r * lda));
                lo[r] = _mm256_fmadd_ps(av, b0, lo[r]);
                hi[r] = _mm256_fmadd_ps(av, b1, hi[r]);
            }
            bp = bp.add(NR);
            ap = ap.add(1);
        }
    }
    for r in 0..R {
        // SAFETY: row r < R of c, columns < nr (run's bounds).
        unsafe {
            let cp = c.add(r * ldc);
            if nr == NR {
                let (l, h) = if first {
                    (lo[r], hi[r])
                } else {
                    (_mm256_add_ps(_mm256_loadu_ps(cp), lo[r]), _mm256_add_ps(_mm256_loadu_ps(cp.add(8)), hi[r]))
                };
                _mm256_storeu_ps(cp, l);
                _mm256_storeu_ps(cp.add(8), h);
            } else {
                let mut t = [0f32; NR];
                _mm256_storeu_ps(t.as_mut_ptr(), lo[r]);
                _mm256_storeu_ps(t.as_mut_ptr().add(8), hi[r]);
                for (q, v) in t[..nr].iter().enumerate() {
                    *cp.add(q) = if first { *v } else { *cp.add(q) + v };
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
        /// The kernel equals an f64 loop for any rows up to `MAX_ROWS`, `k` across chunk edges,
        /// columns off the panel width, a right matrix read with any strides from inside a larger
        /// buffer, and the columns split over any number of parts (each part gives the same bits).
        #[test]
        fn kernel_matches_f64(m in 1usize..=MAX_ROWS, n in 1usize..70, k in 1usize..600, lda_pad in 0usize..3,
                              transposed in any::<bool>(), off in 0usize..5, parts in 1usize..4, seed in 0u64..1000) {
            if !available() {
                eprintln!("packed_gemm: this CPU has no AVX2 (or has AVX-512); nothing to test");
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
            unsafe { run(m, a.as_ptr(), lda, &packed, 0..packed.panels(), whole.as_mut_ptr(), n) };
            let mut split = vec![f32::NAN; m * n];
            let per = packed.panels().div_ceil(parts);
            for p in 0..parts {
                let cols = (p * per).min(packed.panels())..((p + 1) * per).min(packed.panels());
                // SAFETY: as above, each part its own columns.
                unsafe { run(m, a.as_ptr(), lda, &packed, cols, split.as_mut_ptr(), n) };
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
