//! The Cpu's arithmetic ceiling: the rate of independent multiply-adds at the vector width
//! weft's product kernel runs (256-bit AVX2 and FMA; 512-bit where AVX-512 runs at full width),
//! on several threads at once. Benchmarks report products against it, as against a GPU
//! adapter's (`gpu::fma_peak`): a share of the machine's own limit, measured in the same run.
//! Like the products (best of several timed blocks), it is the best of several short windows, so
//! that a neighbour's burst lowers neither figure more than the other.
//!
//! Measured on a 2-core Zen 3 (AVX2): about 102 GFLOP/s on one core, 200 on both; a 1024 product
//! on one thread reached 89-91% of the one-core figure.

use std::time::{Duration, Instant};

/// Independent chains per thread: enough to keep two FMA pipes of 4 cycles' latency busy.
const CHAINS: usize = 12;
/// Iterations between looks at the clock.
const BURST: usize = 1 << 14;

/// FLOP/s of `threads` threads (at least one: the caller and `threads - 1` it starts), each
/// running independent multiply-adds in `windows` windows of about `window`, its best window's
/// rate; summed over the threads.
pub(crate) fn fma_peak(threads: usize, windows: usize, window: Duration) -> f64 {
    let one = || {
        let mut best = 0.0f64;
        for _ in 0..windows.max(1) {
            let start = Instant::now();
            let mut flops = 0.0;
            while start.elapsed() < window {
                flops += burst();
            }
            best = best.max(flops / start.elapsed().as_secs_f64());
        }
        best
    };
    std::thread::scope(|s| {
        let others: Vec<_> = (1..threads.max(1)).map(|_| s.spawn(one)).collect();
        let mine = one();
        // (A thread's panic is passed on, not counted as a rate of 0.)
        mine + others.into_iter().map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e))).sum::<f64>()
    })
}

/// Runs `BURST` iterations of `CHAINS` multiply-adds at the widest vectors the product kernel
/// uses; returns the floating-point operations done.
fn burst() -> f64 {
    #[cfg(target_arch = "x86_64")]
    {
        use super::gemm_engine::full_width_avx512;
        if full_width_avx512() {
            // SAFETY: the CPU runs AVX-512 F (checked).
            return unsafe { burst_avx512() };
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU has AVX2 and FMA (checked).
            return unsafe { burst_avx2() };
        }
    }
    // Elsewhere: vectors of the target's width, fused multiply-adds where it has them (Arm's
    // NEON, which the `gemm` crate's kernels use there), else a multiply and an add.
    let (a, b) = std::hint::black_box((0.999_999f32, 1e-7f32));
    let mut acc: [[f32; 8]; CHAINS] = std::array::from_fn(|c| [std::hint::black_box(0.5 + c as f32); 8]);
    for _ in 0..BURST {
        for lanes in acc.iter_mut() {
            for x in lanes.iter_mut() {
                #[cfg(any(target_arch = "aarch64", target_feature = "fma"))]
                {
                    *x = x.mul_add(a, b);
                }
                #[cfg(not(any(target_arch = "aarch64", target_feature = "fma")))]
                {
                    *x = *x * a + b;
                }
            }
        }
    }
    std::hint::black_box(acc);
    (BURST * CHAINS * 8 * 2) as f64
}

/// Defines a [`burst`] for one vector width: `CHAINS` accumulators, each its own start (a chain
/// the compiler could merge with another would count work not done).
macro_rules! burst_with {
    ($(#[$doc:meta])* $name:ident, $feature:literal, $lanes:literal, $set1:ident, $fma:ident) => {
        $(#[$doc])*
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $feature)]
        unsafe fn $name() -> f64 {
            use std::arch::x86_64::*;
            let (a, b) = std::hint::black_box((0.999_999f32, 1e-7f32));
            let (a, b) = ($set1(a), $set1(b));
            let mut acc: [_; CHAINS] = std::array::from_fn(|c| $set1(std::hint::black_box(0.5 + c as f32)));
            for _ in 0..BURST {
                for x in acc.iter_mut() {
                    *x = $fma(*x, a, b);
                }
            }
            std::hint::black_box(acc);
            (BURST * CHAINS * $lanes * 2) as f64
        }
    };
}

burst_with!(
    /// [`burst`] with 256-bit FMAs.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA.
    burst_avx2, "avx2,fma", 8, _mm256_set1_ps, _mm256_fmadd_ps
);

burst_with!(
    /// [`burst`] with 512-bit FMAs.
    ///
    /// # Safety
    /// The CPU has AVX-512 F.
    burst_avx512, "avx512f", 16, _mm512_set1_ps, _mm512_fmadd_ps
);

#[cfg(test)]
mod tests {
    use super::*;

    /// The ceiling is a rate between 0.1 GFLOP/s (any vector unit of this century) and 2 TFLOP/s
    /// a thread (no core comes near: a loop the compiler dropped would), for one thread and for
    /// two (whose sum is not below half of one thread's even when the tests around it take the
    /// cores; a NaN shows).
    #[test]
    fn measures_a_plausible_rate_on_any_threads() {
        let one = fma_peak(1, 3, Duration::from_millis(10));
        let two = fma_peak(2, 3, Duration::from_millis(10));
        assert!(one.is_finite() && one > 1e8 && one < 2e12, "one thread: {one} FLOP/s");
        assert!(two.is_finite() && two > one * 0.5 && two < 4e12, "two threads: {two} FLOP/s against {one}");
    }
}
