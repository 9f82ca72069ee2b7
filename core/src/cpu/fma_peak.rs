//! The Cpu's arithmetic ceiling: the rate of independent multiply-adds at the vector width
//! weft's product kernel runs (256-bit AVX2 and FMA; 512-bit where AVX-512 runs at full width),
//! on several threads at once. Benchmarks report products against it, as against a GPU
//! adapter's (`gpu::fma_peak`): a share of the machine's own limit, measured in the same run,
//! moves less with the clock and the neighbours than a bare figure does.
//!
//! Measured on a 2-core Zen 3 (AVX2): about 102 GFLOP/s a core, 200 on both; a 1024 product on
//! one thread reached 89-91% of it.

use std::time::{Duration, Instant};

/// Independent chains per thread: enough to keep two FMA pipes of 4 cycles' latency busy.
const CHAINS: usize = 12;
/// Iterations between looks at the clock.
const BURST: usize = 1 << 16;

/// FLOP/s of `threads` threads (at least one), each running independent multiply-adds for about
/// `time`, summed over the threads.
pub(crate) fn fma_peak(threads: usize, time: Duration) -> f64 {
    let one = || {
        let start = Instant::now();
        let mut flops = 0.0;
        while start.elapsed() < time {
            flops += burst();
        }
        flops / start.elapsed().as_secs_f64()
    };
    std::thread::scope(|s| {
        let others: Vec<_> = (1..threads.max(1)).map(|_| s.spawn(one)).collect();
        let mine = one();
        mine + others.into_iter().map(|h| h.join().unwrap_or(0.0)).sum::<f64>()
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
    // Elsewhere: plain multiplies and adds, which the compiler vectorises at the target's width.
    let mut acc = [[0.5f32; 8]; CHAINS];
    for _ in 0..BURST {
        for lanes in acc.iter_mut() {
            for x in lanes.iter_mut() {
                *x = *x * 0.999_999 + 1e-7;
            }
        }
    }
    std::hint::black_box(acc);
    (BURST * CHAINS * 8 * 2) as f64
}

/// [`burst`] with 256-bit FMAs.
///
/// # Safety
/// The CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn burst_avx2() -> f64 {
    use std::arch::x86_64::*;
    let (a, b) = (_mm256_set1_ps(0.999_999), _mm256_set1_ps(1e-7));
    let mut acc = [_mm256_set1_ps(0.5); CHAINS];
    for _ in 0..BURST {
        for x in acc.iter_mut() {
            *x = _mm256_fmadd_ps(*x, a, b);
        }
    }
    std::hint::black_box(acc);
    (BURST * CHAINS * 8 * 2) as f64
}

/// [`burst`] with 512-bit FMAs.
///
/// # Safety
/// The CPU has AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn burst_avx512() -> f64 {
    use std::arch::x86_64::*;
    let (a, b) = (_mm512_set1_ps(0.999_999), _mm512_set1_ps(1e-7));
    let mut acc = [_mm512_set1_ps(0.5); CHAINS];
    for _ in 0..BURST {
        for x in acc.iter_mut() {
            *x = _mm512_fmadd_ps(*x, a, b);
        }
    }
    std::hint::black_box(acc);
    (BURST * CHAINS * 16 * 2) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ceiling is a finite rate of at least 0.1 GFLOP/s (any vector unit of this century),
    /// for one thread and for two (whose figure, summed over both, is not below half of one
    /// thread's even when the tests around it take the cores: a lost or NaN share shows).
    #[test]
    fn measures_a_finite_rate_on_any_threads() {
        let one = fma_peak(1, Duration::from_millis(30));
        let two = fma_peak(2, Duration::from_millis(30));
        assert!(one.is_finite() && one > 1e8, "one thread: {one} FLOP/s");
        assert!(two.is_finite() && two > one * 0.5, "two threads: {two} FLOP/s against {one}");
    }
}
