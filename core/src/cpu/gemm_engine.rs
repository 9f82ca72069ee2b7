//! The engines one strided f32 matrix product can run on: weft's own blocked kernel
//! (`blocked_gemm`, AVX2+FMA CPUs without AVX-512), faer's x86-64 kernels (`private-gemm-x86`:
//! AVX2+FMA or AVX-512, chosen by what the CPU reports; on AVX2 CPUs for the products weft's
//! kernel does badly) and the portable `gemm` crate (every other CPU, and a reference the others
//! are tested against).
//!
//! Measured side by side on a 2-core AVX2 EPYC (2 threads, GFLOP/s): faer 2048³ 128–139 against
//! gemm's 85–106, 1024³ 118–122 against 94–100; on the MLP's 256x784x1024 they are level. weft's
//! kernel against faer: see `blocked_gemm`.

use std::sync::OnceLock;

/// Which engine multiplies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Engine {
    /// The `gemm` crate (SIMD kernels for x86, Arm and wasm, chosen at run time).
    Portable,
    /// faer's kernels with AVX2 and FMA.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// weft's own blocked kernel (AVX2 and FMA), faer's `Avx2` for the products it does badly.
    #[cfg(target_arch = "x86_64")]
    Weft,
    /// faer's kernels with AVX-512 (F, BW, CD, DQ, VL: the x86-64-v4 level).
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

/// The engine for this CPU, decided once. `WEFT_CPU_MATMUL=portable` forces the `gemm` crate (to
/// rule the engine out when a result looks wrong), `WEFT_CPU_MATMUL=faer` faer's kernels for
/// every product but inference's small batches (`packed_gemm`, which stays weft's).
pub(crate) fn engine() -> Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    *ENGINE.get_or_init(|| {
        let forced = std::env::var("WEFT_CPU_MATMUL").unwrap_or_default();
        match (forced.as_str(), detect()) {
            ("portable", _) => Engine::Portable,
            #[cfg(target_arch = "x86_64")]
            ("faer", Engine::Weft) => Engine::Avx2,
            (_, e) => e,
        }
    })
}

#[cfg(target_arch = "x86_64")]
fn detect() -> Engine {
    use std::arch::is_x86_feature_detected as has;
    if has!("avx512f") && has!("avx512bw") && has!("avx512cd") && has!("avx512dq") && has!("avx512vl") {
        Engine::Avx512
    } else if has!("avx2") && has!("fma") {
        Engine::Weft
    } else {
        Engine::Portable
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() -> Engine {
    Engine::Portable
}

/// Whether `engine` runs an `m x k` by `k x n` product on weft's own blocked kernel (the one
/// place that decides it: the product itself, matmul's copy of a transposed left matrix and
/// inference's kept weights all ask here).
pub(crate) fn on_weft(engine: Engine, m: usize, n: usize, k: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        engine == Engine::Weft && super::blocked_gemm::suits(m, n, k)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (engine, m, n, k);
        false
    }
}

/// One strided product, `dst[i, j] = sum_p lhs[i, p] * rhs[p, j]` for an `m x n` output with row
/// stride `dst_rs` and column stride 1, on `threads` threads (1: the caller's thread only).
pub(crate) struct Product {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub dst: *mut f32,
    pub dst_rs: isize,
    pub lhs: *const f32,
    pub lhs_rs: isize,
    pub lhs_cs: isize,
    pub rhs: *const f32,
    pub rhs_rs: isize,
    pub rhs_cs: isize,
}

impl Product {
    /// Runs the product, overwriting every element of `dst` (k must be at least 1). `Err` only
    /// when memory for weft's packed blocks runs out.
    ///
    /// # Safety
    /// Every element the strides reach from `lhs`, `rhs` and `dst` lies inside a live allocation,
    /// strides are non-negative, and no other thread touches the `dst` elements meanwhile.
    pub unsafe fn run(&self, engine: Engine, threads: usize) -> crate::Result<()> {
        debug_assert!(self.k > 0);
        #[cfg(target_arch = "x86_64")]
        if on_weft(engine, self.m, self.n, self.k) {
            // SAFETY: detect() saw AVX2 and FMA; the caller's contract.
            return unsafe { super::blocked_gemm::run(self, None, threads) };
        }
        match engine {
            Engine::Portable => unsafe {
                gemm::gemm(
                    self.m,
                    self.n,
                    self.k,
                    self.dst,
                    1,
                    self.dst_rs,
                    false,
                    self.lhs,
                    self.lhs_cs,
                    self.lhs_rs,
                    self.rhs,
                    self.rhs_cs,
                    self.rhs_rs,
                    0.0,
                    1.0,
                    false,
                    false,
                    false,
                    if threads > 1 { gemm::Parallelism::Rayon(threads) } else { gemm::Parallelism::None },
                )
            },
            #[cfg(target_arch = "x86_64")]
            Engine::Avx2 | Engine::Weft | Engine::Avx512 => unsafe { self.run_x86(engine == Engine::Avx512, threads) },
        }
        Ok(())
    }

    #[cfg(target_arch = "x86_64")]
    unsafe fn run_x86(&self, avx512: bool, threads: usize) {
        use private_gemm_x86::{Accum, DType, DstKind, IType, InstrSet, gemm};
        let alpha = 1.0f32;
        let instr = if avx512 { InstrSet::Avx512 } else { InstrSet::Avx256 };
        // SAFETY: the caller's contract; the index pointers are null (a full, dense destination)
        // and alpha outlives the call.
        unsafe {
            gemm(
                DType::F32,
                IType::U64,
                instr,
                self.m,
                self.n,
                self.k,
                self.dst.cast(),
                self.dst_rs,
                1,
                std::ptr::null(),
                std::ptr::null(),
                DstKind::Full,
                Accum::Replace,
                self.lhs.cast(),
                self.lhs_rs,
                self.lhs_cs,
                false,
                std::ptr::null(),
                0,
                self.rhs.cast(),
                self.rhs_rs,
                self.rhs_cs,
                false,
                (&raw const alpha).cast(),
                threads.max(1),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Strides of an `r x c` matrix: row-major, column-major (a transposed view), or with rows
    /// all one row (stride 0, a broadcast).
    fn strides(kind: u8, r: usize, c: usize) -> (isize, isize, usize) {
        match kind {
            0 => (c as isize, 1, r * c),
            1 => (1, r as isize, r * c),
            _ => (0, 1, c),
        }
    }

    fn engines() -> Vec<Engine> {
        let mut e = vec![Engine::Portable];
        if engine() != Engine::Portable {
            e.push(engine());
        }
        #[cfg(target_arch = "x86_64")]
        if engine() == Engine::Weft {
            // faer's kernels too: they take the products weft's kernel leaves.
            e.push(Engine::Avx2);
        }
        e
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        /// Each engine, on one thread and on two, equals an f64 loop on awkward shapes and strides.
        #[test]
        fn engines_match_f64(m in 1usize..70, n in 1usize..70, k in 1usize..300, big in 0usize..3,
                             ka in 0u8..3, kb in 0u8..3, seed in 0u64..1000) {
            // Now and then a product large enough for several kernel blocks and threads.
            let (m, n) = if big == 0 { (m + 200, n + 130) } else { (m, n) };
            let (ars, acs, alen) = strides(ka, m, k);
            let (brs, bcs, blen) = strides(kb, k, n);
            let val = |i: usize, s: u64| (((i as u64 * 2654435761 + s * 97) % 1999) as f32 / 999.5) - 1.0;
            let a: Vec<f32> = (0..alen).map(|i| val(i, seed)).collect();
            let b: Vec<f32> = (0..blen).map(|i| val(i, seed + 7)).collect();
            let at = |i: usize, p: usize| a[(i as isize * ars + p as isize * acs) as usize] as f64;
            let bt = |p: usize, j: usize| b[(p as isize * brs + j as isize * bcs) as usize] as f64;
            for e in engines() {
                for threads in [1, 2] {
                    let mut out = vec![f32::NAN; m * n];
                    let p = Product { m, n, k, dst: out.as_mut_ptr(), dst_rs: n as isize, lhs: a.as_ptr(),
                        lhs_rs: ars, lhs_cs: acs, rhs: b.as_ptr(), rhs_rs: brs, rhs_cs: bcs };
                    // SAFETY: the strides above reach only inside a, b and out.
                    unsafe { p.run(e, threads) }.unwrap();
                    for i in 0..m {
                        for j in 0..n {
                            let want: f64 = (0..k).map(|q| at(i, q) * bt(q, j)).sum();
                            let got = out[i * n + j] as f64;
                            prop_assert!((got - want).abs() <= 1e-5 * (k as f64).sqrt() * 4.0,
                                "{e:?} threads {threads} m{m} n{n} k{k} a{ka} b{kb} at ({i},{j}): {got} vs {want}");
                        }
                    }
                }
            }
        }
    }
}
