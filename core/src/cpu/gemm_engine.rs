//! The engines one strided f32 matrix product can run on: weft's own blocked kernel
//! (`blocked_gemm`, AVX2+FMA), faer's x86-64 kernels (`private-gemm-x86`: AVX2+FMA or AVX-512; on
//! the CPUs where weft's kernel runs, faer takes the products it does badly) and the portable
//! `gemm` crate (every other CPU, and a reference the others are tested against). Small products
//! on weft's engine (an attention's, per head) run on its tiles alone (`small_gemm`).
//!
//! Measured side by side on a 2-core AVX2 EPYC (2 threads, GFLOP/s): faer 2048³ 128–139 against
//! gemm's 85–106, 1024³ 118–122 against 94–100; on the MLP's 256x784x1024 they are level. weft's
//! kernel against faer: see `blocked_gemm`.
//!
//! Which CPUs get weft's kernel: every one with AVX2 and FMA. Where AVX-512 runs at full width
//! (Intel's AVX-512 server cores, AMD's Zen 5: family 0x1a, two 512-bit FMA pipes) its tiles are
//! 512 bits wide (`blocked_gemm::Isa`); AMD's Zen 4 (family 0x19 with AVX-512) runs a 512-bit
//! FMA as two 256-bit halves on the pipes AVX2 uses, so it keeps the 256-bit tiles except on
//! products of at most 512 rows, where the 512-bit ones' fewer instructions pay
//! (`blocked_gemm::isa_for`). On a 2-core
//! Zen 5 EPYC (best of 3 alternated runs, 2 threads, GFLOP/s), weft's 512-bit tiles against
//! faer's AVX-512 kernels: 1024³ 492 / 481, 2048³ 452 / 457, the MLP's forward products level,
//! its weight gradients (a transposed left matrix) 491–498 / 443–453, its input gradients
//! 429–453 / 436–443. (That CPU's peak is about 486.)

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
/// every product but inference's small batches (`packed_gemm`, which stays weft's where the CPU
/// has it), with AVX-512 where the CPU has it; `WEFT_CPU_MATMUL=weft` weft's kernel on any CPU
/// with AVX2 and FMA (to compare it with faer's AVX-512 kernels on one machine).
pub(crate) fn engine() -> Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    *ENGINE.get_or_init(|| forced(&std::env::var("WEFT_CPU_MATMUL").unwrap_or_default(), detect()))
}

/// The engine `WEFT_CPU_MATMUL=name` asks for, given the one detected (an unknown name or one the
/// CPU cannot run leaves it).
fn forced(name: &str, detected: Engine) -> Engine {
    #[cfg(target_arch = "x86_64")]
    {
        let (avx512, avx2) = x86_levels();
        match name {
            "faer" if avx512 => return Engine::Avx512,
            "faer" if avx2 => return Engine::Avx2,
            "weft" if avx2 => return Engine::Weft,
            _ => {}
        }
    }
    if name == "portable" { Engine::Portable } else { detected }
}

/// Whether the CPU has the x86-64-v4 AVX-512 set (F, BW, CD, DQ, VL), and AVX2 with FMA.
#[cfg(target_arch = "x86_64")]
fn x86_levels() -> (bool, bool) {
    use std::arch::is_x86_feature_detected as has;
    let avx512 = has!("avx512f") && has!("avx512bw") && has!("avx512cd") && has!("avx512dq") && has!("avx512vl");
    (avx512, has!("avx2") && has!("fma"))
}

#[cfg(target_arch = "x86_64")]
fn detect() -> Engine {
    match x86_levels() {
        // weft's kernel, at 512 bits where AVX-512 runs at full width (`blocked_gemm::isa`), and
        // on Zen 4 for short products (`blocked_gemm::isa_for`).
        (_, true) => Engine::Weft,
        (true, false) => Engine::Avx512,
        (false, false) => Engine::Portable,
    }
}

/// Whether this CPU runs AVX-512 (the x86-64-v4 set) at full width: it has it and is not a
/// Zen 4 (see [`splits_512_bit_ops`]). weft's kernel then runs 512-bit tiles.
pub(crate) fn full_width_avx512() -> bool {
    avx512_split() == Some(false)
}

/// The fewest multiply-adds of a product that `matmul` shares over the threads: 2^21 where
/// weft's tiles are 512 bits wide at full speed (`blocked_gemm::isa`; not a Zen 4, whose 512-bit
/// operations take two halves), else 2^20, where a product takes about twice as long. Below
/// that, handing part of it to another core (and reading that part back from its cache in the
/// ops after it) costs more than the part takes, although the product alone, timed in a loop,
/// runs faster shared. Measured on a 2-core Xeon (family 6 model 167; more cores are not
/// measured), MLP training steps a second, three alternated rounds: at 512-bit tiles, from 2^18
/// to 2^21, 256 x 64-64-64-10 5,650 -> 6,380 (its products 2^20) and 128 x 64-64-64-10
/// 7,970 -> 9,710 (2^19), while 512 x 64-64-64-10 (2^21) ran 3% slower unshared and
/// 256 x 128-128-128-10 (2^22) 20%; with the tiles forced to 256 bits, 2^20 kept 256 x 64 at
/// 5,400 (2^21: 4,950) and raised 128 x 64 from 8,100 to 8,690. Shapes of 2^22 and more are
/// unchanged. (Convolutions keep their own rule, `conv.rs`.)
pub(crate) fn shared_from() -> usize {
    #[cfg(target_arch = "x86_64")]
    if super::blocked_gemm::isa().wide() {
        return 1 << 21;
    }
    1 << 20
}

/// Whether this CPU has AVX-512 (the x86-64-v4 set) but runs each 512-bit op as two 256-bit
/// halves (Zen 4): weft's kernel runs 512-bit tiles there on short products only
/// (`blocked_gemm::isa_for`).
pub(crate) fn split_avx512() -> bool {
    avx512_split() == Some(true)
}

/// `None` without the x86-64-v4 AVX-512 set, else whether its 512-bit ops run as two 256-bit
/// halves ([`splits_512_bit_ops`]); decided once.
fn avx512_split() -> Option<bool> {
    #[cfg(target_arch = "x86_64")]
    {
        static SPLIT: OnceLock<Option<bool>> = OnceLock::new();
        *SPLIT.get_or_init(|| x86_levels().0.then(splits_512_bit_ops))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        None
    }
}

/// Whether this is an AMD family 0x19 CPU (Zen 3 and Zen 4; only Zen 4 has AVX-512, and it runs
/// each 512-bit multiply-add as two 256-bit halves: no more arithmetic a cycle than AVX2).
#[cfg(target_arch = "x86_64")]
fn splits_512_bit_ops() -> bool {
    use std::arch::x86_64::__cpuid;
    let vendor = __cpuid(0);
    // "AuthenticAMD", spread over ebx, edx, ecx.
    let amd = (vendor.ebx, vendor.edx, vendor.ecx) == (0x6874_7541, 0x6974_6e65, 0x444d_4163);
    let eax = __cpuid(1).eax;
    let base = (eax >> 8) & 0xf;
    let family = if base == 0xf { base + ((eax >> 20) & 0xff) } else { base };
    amd && family == 0x19
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

/// Rows of a block `Product::run` cuts a library's product into are a multiple of this (each
/// block packs the right matrix again).
const CUT_ROWS: usize = 32;
/// Columns of a block, where the rows are too few to give every thread a block, are a multiple
/// of this (each block packs the left matrix again; the kernels' tiles are 16 by 6 and 8 by 6 on
/// x86).
const CUT_COLS: usize = 48;

/// How [`Product::run_cut`] cuts an `m x n` output over `threads`: `(rows, per_row, cols,
/// per_col)`, bands of `per_row` rows (a multiple of [`CUT_ROWS`]) cut into blocks of `per_col`
/// columns (a multiple of [`CUT_COLS`]) while the threads outnumber the bands, so that a machine
/// of many cores is not left at `m / CUT_ROWS` blocks; `rows` bands and `cols` blocks a band,
/// none empty (the last of each may be shorter).
fn cut_grid(m: usize, n: usize, threads: usize) -> (usize, usize, usize, usize) {
    let per_row = m.div_ceil(threads.min(m / CUT_ROWS).max(1)).div_ceil(CUT_ROWS) * CUT_ROWS;
    // (Counted after the rounding up, which may leave fewer bands for more columns.)
    let rows = m.div_ceil(per_row);
    let per_col = n.div_ceil((threads / rows).min(n / CUT_COLS).max(1)).div_ceil(CUT_COLS) * CUT_COLS;
    (rows, per_row, n.div_ceil(per_col), per_col)
}

/// A product shared by the threads that run its blocks.
#[derive(Clone, Copy)]
struct Shared<'a>(&'a Product);

// SAFETY: the blocks read the product's inputs and write disjoint parts of its output.
unsafe impl Send for Shared<'_> {}
unsafe impl Sync for Shared<'_> {}

impl<'a> Shared<'a> {
    /// (A method, so that closures take the whole value, which is Sync.)
    fn get(self) -> &'a Product {
        self.0
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
    /// The product of the matrices `la` (`m x k`) over `x` and `lb` (`k x n`) over `y`, its output
    /// not yet given (`dst` null, rows `n` apart); `None` where the layouts are not two matrices
    /// that multiply, none of whose sizes is 0, and an `Err` naming `op` where one reaches outside
    /// its buffer (the bound the kernels' reads rely on).
    pub(crate) fn of_matrices(
        op: &'static str,
        (x, la): (&[f32], &crate::Layout),
        (y, lb): (&[f32], &crate::Layout),
    ) -> crate::Result<Option<Product>> {
        let ([m, k], [k2, n]) = (la.shape(), lb.shape()) else { return Ok(None) };
        if k2 != k || [*m, *n, *k].contains(&0) {
            return Ok(None);
        }
        if la.extent() > x.len() || lb.extent() > y.len() {
            return Err(crate::Error::invalid(op, format!("layouts {la:?} and {lb:?} reach outside their buffers")));
        }
        let (ls, rs) = (la.strides(), lb.strides());
        Ok(Some(Product {
            m: *m,
            n: *n,
            k: *k,
            dst: std::ptr::null_mut(),
            dst_rs: *n as isize,
            // SAFETY: the offsets lie inside the buffers (the extent check above).
            lhs: unsafe { x.as_ptr().add(la.offset()) },
            lhs_rs: ls[0] as isize,
            lhs_cs: ls[1] as isize,
            rhs: unsafe { y.as_ptr().add(lb.offset()) },
            rhs_rs: rs[0] as isize,
            rhs_cs: rs[1] as isize,
        }))
    }

    /// The threads `matmul` shares a product of this size over: all of them from
    /// [`shared_from`] multiply-adds, else the calling thread.
    pub(crate) fn threads(&self) -> usize {
        if self.m * self.n * self.k >= shared_from() { rayon::current_num_threads() } else { 1 }
    }

    /// Runs the product, overwriting every element of `dst` (k must be at least 1). `Err` only
    /// when memory for weft's packed blocks runs out, and then `dst` may be partly written.
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
        #[cfg(target_arch = "x86_64")]
        if engine == Engine::Weft && super::small_gemm::suits(self.m, self.n, self.k) {
            // SAFETY: as above (one thread: a small product).
            return unsafe { super::small_gemm::run(self) };
        }
        if threads > 1 {
            // SAFETY: the caller's contract.
            unsafe { self.run_cut(engine, threads) };
        } else {
            // SAFETY: the caller's contract.
            unsafe { self.run_library(engine, 1) };
        }
        Ok(())
    }

    /// The product on the `gemm` crate's kernels, or faer's at the width weft's kernel would
    /// have run, on `threads` of the library's own threads (1: the calling thread).
    ///
    /// # Safety
    /// As [`Product::run`].
    unsafe fn run_library(&self, engine: Engine, threads: usize) {
        // The library's threads would not take this thread's mode where it flushes subnormals
        // (see `crate::subnormals`): this thread alone.
        let threads = if threads > 1 && crate::subnormals::Mode::of_this_thread().flushes() { 1 } else { threads };
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
            // (The products weft's kernel leaves go to faer's at the same width.)
            Engine::Avx2 | Engine::Weft | Engine::Avx512 => unsafe {
                self.run_x86(engine == Engine::Avx512 || (engine == Engine::Weft && full_width_avx512()), threads)
            },
        }
    }

    /// Runs the product as one single-threaded product per block of its output (bands of rows,
    /// cut into columns too where the threads outnumber the bands: [`cut_grid`]), the blocks
    /// shared by the calling thread and weft's helpers (`share::par_for`).
    ///
    /// Why not the library's own threads: both faer and `gemm` run theirs on rayon's global pool,
    /// which a thread outside it (a program's `main`) hands the product to and sleeps until woken,
    /// while weft's helpers, made for the caller to work beside, stay idle: three or four threads
    /// on as many cores as two would need. Measured on a 2-core Zen 4, where faer takes the
    /// products with fewer than 32 columns or a `k` under 32 (GFLOP/s, faer's threads -> cut
    /// here, medians of 3 runs): 256 x 10 x 1024 50 -> 105, 256 x 1024 x 10 (the MLP's last
    /// layer's input gradient) 27 -> 124, 1024 x 10 x 256 50 -> 79, 4096 x 16 x 512 148 -> 164,
    /// 8192 x 20 x 1024 97 -> 99; the MLP's training step, with weft's helpers already awake
    /// (`crew`), 2.4% more steps a second.
    ///
    /// # Safety
    /// As [`Product::run`].
    unsafe fn run_cut(&self, engine: Engine, threads: usize) {
        let (rows, per_row, cols, per_col) = cut_grid(self.m, self.n, threads);
        if rows * cols < 2 {
            // Too few rows and columns to cut (a narrow product with a long k): the library's
            // own threads, which share out k, are better than one.
            // SAFETY: the caller's contract.
            return unsafe { self.run_library(engine, threads) };
        }
        let (whole_m, whole_n) = (self.m, self.n);
        let me = Shared(self);
        super::share::par_for(rows * cols, &|t| {
            let (i0, j0) = (t / cols * per_row, t % cols * per_col);
            let (m, n) = (per_row.min(whole_m - i0), per_col.min(whole_n - j0));
            let p = me.get();
            // SAFETY (of the offsets): rows i0..i0 + m and columns j0..j0 + n lie inside the
            // product, so every pointer stays inside what the whole product reaches.
            let block = unsafe {
                Product {
                    m,
                    n,
                    dst: p.dst.offset(i0 as isize * p.dst_rs).add(j0),
                    lhs: p.lhs.offset(i0 as isize * p.lhs_rs),
                    rhs: p.rhs.offset(j0 as isize * p.rhs_cs),
                    ..*p
                }
            };
            // SAFETY: the block's elements lie inside the product's; no other block writes its
            // output.
            unsafe { block.run_library(engine, 1) }
        });
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
            if x86_levels().0 {
                e.push(Engine::Avx512);
            }
        }
        e
    }

    /// `WEFT_CPU_MATMUL` names an engine the CPU can run, or leaves the detected one.
    #[test]
    fn forced_engines() {
        assert_eq!(forced("portable", detect()), Engine::Portable);
        assert_eq!(forced("", detect()), detect());
        assert_eq!(forced("no-such-engine", detect()), detect());
        #[cfg(target_arch = "x86_64")]
        {
            let (avx512, avx2) = x86_levels();
            let faer = if avx512 {
                Engine::Avx512
            } else if avx2 {
                Engine::Avx2
            } else {
                detect()
            };
            assert_eq!(forced("faer", detect()), faer);
            assert_eq!(forced("weft", detect()), if avx2 { Engine::Weft } else { detect() });
            // Every CPU with AVX2 and FMA runs weft's kernel by default (at 512 bits where
            // AVX-512 runs at full width).
            if avx2 {
                assert_eq!(detect(), Engine::Weft);
            }
        }
    }

    /// The family decoded from CPUID agrees with the kernel's (Linux's /proc/cpuinfo).
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    #[test]
    fn cpuid_family_agrees_with_the_kernel() {
        let info = std::fs::read_to_string("/proc/cpuinfo").unwrap();
        let field = |name: &str| {
            info.lines().find(|l| l.starts_with(name)).and_then(|l| l.split(':').nth(1)).map(|v| v.trim().to_string())
        };
        let (Some(vendor), Some(family)) = (field("vendor_id"), field("cpu family")) else {
            panic!("/proc/cpuinfo names no vendor_id or cpu family");
        };
        let want = vendor == "AuthenticAMD" && family == "25";
        assert_eq!(splits_512_bit_ops(), want, "vendor {vendor}, family {family}");
    }

    /// A library's product is cut into bands of rows first, then columns while the threads
    /// outnumber the bands; into no block under `CUT_ROWS` rows or `CUT_COLS` columns but the
    /// last of each, and no empty one.
    #[test]
    fn cuts_use_the_threads() {
        for (m, n, threads, want) in [
            (256, 10, 2, (2, 1)),
            (256, 10, 16, (8, 1)),
            (256, 1024, 16, (8, 2)),
            (40, 1024, 16, (1, 11)),
            (40, 200, 2, (1, 2)),
            (20, 60, 4, (1, 1)),
            (4096, 4096, 16, (16, 1)),
            (201, 500, 16, (4, 4)),
            (70, 96, 3, (2, 1)),
        ] {
            let (rows, per_row, cols, per_col) = cut_grid(m, n, threads);
            assert_eq!((rows, cols), want, "{m} x {n} on {threads} threads");
            assert!(per_row % CUT_ROWS == 0 && per_col % CUT_COLS == 0);
            assert!(rows * cols <= threads.max(1), "{m} x {n}: {rows} x {cols} blocks on {threads} threads");
            // Every row and column in a block, the last band and block not empty.
            assert!((rows - 1) * per_row < m && rows * per_row >= m, "{m} rows: {rows} bands of {per_row}");
            assert!((cols - 1) * per_col < n && cols * per_col >= n, "{n} columns: {cols} blocks of {per_col}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        /// Each engine, on one, two, three and sixteen threads, equals an f64 loop on awkward
        /// shapes and strides, with the same bits on any threads (but the portable one).
        #[test]
        fn engines_match_f64(m in 1usize..70, n in 1usize..70, k in 1usize..600, big in 0usize..4,
                             ka in 0u8..3, kb in 0u8..3, seed in 0u64..1000) {
            // Now and then a product large enough for several kernel blocks and threads, or one
            // of few rows and many columns (cut by columns only).
            let (m, n) = match big { 0 => (m + 200, n + 130), 1 => (m, n + 130), _ => (m, n) };
            let (ars, acs, alen) = strides(ka, m, k);
            let (brs, bcs, blen) = strides(kb, k, n);
            let val = |i: usize, s: u64| (((i as u64 * 2654435761 + s * 97) % 1999) as f32 / 999.5) - 1.0;
            let a: Vec<f32> = (0..alen).map(|i| val(i, seed)).collect();
            let b: Vec<f32> = (0..blen).map(|i| val(i, seed + 7)).collect();
            let at = |i: usize, p: usize| a[(i as isize * ars + p as isize * acs) as usize] as f64;
            let bt = |p: usize, j: usize| b[(p as isize * brs + j as isize * bcs) as usize] as f64;
            let want: Vec<f64> = (0..m * n).map(|e| (0..k).map(|q| at(e / n, q) * bt(q, e % n)).sum()).collect();
            // An f32 sum's rounding grows with its terms' magnitudes, not its result's: correlated
            // values (seed 460: 158.03 over k = 409) sum far above sqrt(k).
            let size: Vec<f64> =
                (0..m * n).map(|e| (0..k).map(|q| (at(e / n, q) * bt(q, e % n)).abs()).sum()).collect();
            for e in engines() {
                let mut first: Option<Vec<f32>> = None;
                // (Sixteen threads cut a library's product into rows and columns: `cut_grid`.)
                for threads in [1, 2, 3, 16] {
                    let mut out = vec![f32::NAN; m * n];
                    let p = Product { m, n, k, dst: out.as_mut_ptr(), dst_rs: n as isize, lhs: a.as_ptr(),
                        lhs_rs: ars, lhs_cs: acs, rhs: b.as_ptr(), rhs_rs: brs, rhs_cs: bcs };
                    // SAFETY: the strides above reach only inside a, b and out.
                    unsafe { p.run(e, threads) }.unwrap();
                    for (at, ((&got, &want), &size)) in out.iter().zip(&want).zip(&size).enumerate() {
                        let tol = 4.0 * (k as f64).sqrt() * (1e-5 + f64::from(f32::EPSILON) * size);
                        prop_assert!((got as f64 - want).abs() <= tol,
                            "{e:?} threads {threads} m{m} n{n} k{k} a{ka} b{kb} at ({},{}): {got} vs {want}",
                            at / n, at % n);
                    }
                    // The bits do not depend on the threads, faer's products cut into blocks over
                    // them included (the `gemm` crate's are not promised: a block of one row
                    // takes another kernel there).
                    match &first {
                        None => first = Some(out),
                        Some(one) => prop_assert!(
                            e == Engine::Portable || one.iter().zip(&out).all(|(x, y)| x.to_bits() == y.to_bits()),
                            "{e:?}: {threads} threads changed bits, m{m} n{n} k{k} a{ka} b{kb}"),
                    }
                }
            }
        }
    }
}
