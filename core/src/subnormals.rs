//! Subnormal floats flushed to zero while a scope runs ([`flushing_subnormals`]): an optimizer's
//! update runs in one, as XLA runs all of its Cpu code.
//!
//! Why: a moment whose gradient stays 0 (the weights of a ReLU unit that never fires, an
//! embedding row no batch holds) decays geometrically, Adam's first moment by 0.9 a step, and
//! within some hundreds of steps it is subnormal (under 1.2e-38). On x86 every operation that
//! reads or makes a subnormal then takes a microcode assist of about a hundred cycles, and the
//! update, which otherwise runs at the speed of memory, runs 10 to 25 times slower from then on.
//! Measured on a 2-core Xeon (MLPs on random data, Adam, `jax.jit`'s steps as the yardstick, in
//! one run): 784-256-10 at batch 32 ran 0.56 as fast as `jax.jit` (62% of its step in Adam's
//! pass), and 2.4 times as fast with subnormals flushed; 784-512-512-10 at batch 64 from 0.54
//! to 0.96. A value that small carries nothing a step could use: flushed, it is 0.
//!
//! How: on x86-64 the thread's MXCSR gets its flush-to-zero and denormals-are-zero bits for the
//! scope's length, and weft's own loops ([`cpu::share`](crate::cpu)) give the pieces that other
//! threads run the same mode, so what a loop computes does not depend on which thread ran it.
//! Elsewhere (ARM cores handle subnormals at full speed) values are kept as they are.

use std::cell::Cell;

thread_local! {
    /// Whether this thread is inside a scope (its own, or one a loop's caller passed on).
    static ON: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with weft's Cpu kernels flushing subnormal inputs and results to zero (on x86-64),
/// on this thread and on every thread that runs a piece of one of weft's loops for it; the
/// thread's mode is put back after, a panic included. The optimizers' updates run in such a
/// scope.
///
/// ```
/// use weft_core::{Device, Tensor, flushing_subnormals};
/// let tiny = Tensor::from_vec(vec![1.5e-38f32; 4], &[4], &Device::Cpu)?;
/// let kept = tiny.mul_scalar(0.25)?.to_vec::<f32>()?;
/// let flushed = flushing_subnormals(|| tiny.mul_scalar(0.25))?.to_vec::<f32>()?;
/// if cfg!(target_arch = "x86_64") {
///     assert_eq!(flushed, vec![0.0; 4]);
/// }
/// assert!(kept[0] > 0.0);
/// # Ok::<(), weft_core::Error>(())
/// ```
pub fn flushing_subnormals<R>(f: impl FnOnce() -> R) -> R {
    let _mode = Mode::flush();
    f()
}

/// Whether this thread is inside a [`flushing_subnormals`] scope.
pub(crate) fn flushing() -> bool {
    ON.with(Cell::get)
}

/// The flushing mode on this thread until dropped, when the thread's mode before comes back.
pub(crate) struct Mode {
    was_on: bool,
    #[cfg(target_arch = "x86_64")]
    csr: u32,
}

impl Mode {
    /// Flushing from now on this thread.
    pub(crate) fn flush() -> Mode {
        // A thread starts with its parent's mode: rayon's pool, were it started inside the scope,
        // would flush for its whole life (weft's helpers set their own mode when they start).
        let _ = rayon::current_num_threads();
        let was_on = ON.with(|c| c.replace(true));
        #[cfg(target_arch = "x86_64")]
        {
            let csr = x86::read();
            // FTZ (bit 15): subnormal results become 0; DAZ (bit 6): subnormal inputs read as 0.
            x86::write(csr | 0x8040);
            Mode { was_on, csr }
        }
        #[cfg(not(target_arch = "x86_64"))]
        Mode { was_on }
    }
}

/// Keeps subnormals on this thread from now on, whatever mode the thread that started it had:
/// for threads that weft starts and keeps (its helpers), which may be started inside a scope.
pub(crate) fn keep_on_this_thread() {
    #[cfg(target_arch = "x86_64")]
    x86::write(x86::read() & !0x8040);
}

impl Drop for Mode {
    fn drop(&mut self) {
        ON.with(|c| c.set(self.was_on));
        #[cfg(target_arch = "x86_64")]
        x86::write(self.csr);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    /// The thread's MXCSR (SSE and AVX floating-point control and status).
    pub(super) fn read() -> u32 {
        let mut csr = 0u32;
        // SAFETY: stores the 4-byte register into a local; every x86-64 CPU has SSE.
        unsafe { std::arch::asm!("stmxcsr [{}]", in(reg) &mut csr, options(nostack, preserves_flags)) };
        csr
    }

    /// Sets the thread's MXCSR (only from a value `read` gave, with mode bits changed).
    pub(super) fn write(csr: u32) {
        // SAFETY: loads 4 bytes from a local; the value has no reserved bit set (it is one
        // `read` returned with FTZ and DAZ set, which every x86-64 CPU with SSE2 supports).
        unsafe { std::arch::asm!("ldmxcsr [{}]", in(reg) &csr, options(nostack, preserves_flags)) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Device, Tensor};

    /// A subnormal product of two normal numbers, computed where the optimiser cannot see it.
    fn product(a: f32, b: f32) -> f32 {
        std::hint::black_box(a) * std::hint::black_box(b)
    }

    /// Inside the scope a subnormal result is 0, outside it is kept; the mode comes back after
    /// the scope, after nested scopes, and after a panic inside one.
    #[test]
    fn the_scope_flushes_and_puts_the_mode_back() {
        let (a, b) = (1.5e-38f32, 0.25f32);
        assert!(product(a, b) > 0.0 && !flushing());
        let inside = flushing_subnormals(|| {
            let nested = flushing_subnormals(|| product(a, b));
            (nested, product(a, b), flushing())
        });
        if cfg!(target_arch = "x86_64") {
            assert_eq!((inside.0, inside.1), (0.0, 0.0));
        }
        assert!(inside.2);
        assert!(product(a, b) > 0.0 && !flushing(), "the mode came back");
        let caught = std::panic::catch_unwind(|| flushing_subnormals(|| panic!("inside")));
        assert!(caught.is_err());
        assert!(product(a, b) > 0.0 && !flushing(), "the mode came back after a panic");
    }

    /// A Cpu op large enough to run on several threads flushes every element in the scope (the
    /// helpers' pieces too, or a rayon pool's where the scope runs on one of its threads) and
    /// keeps every one outside it; the helpers' own mode is not left changed for the next loop.
    #[test]
    fn loops_on_every_thread_flush_in_the_scope() -> crate::Result<()> {
        let n = 1 << 20;
        let tiny = Tensor::from_vec(vec![1.5e-38f32; n], &[n], &Device::Cpu)?;
        let out = flushing_subnormals(|| tiny.mul_scalar(0.25))?.to_vec::<f32>()?;
        if cfg!(target_arch = "x86_64") {
            let kept = out.iter().filter(|v| **v != 0.0).count();
            assert_eq!(kept, 0, "{kept} of {n} subnormals kept in the scope");
        }
        // From a rayon pool's thread the pool's threads run the pieces, in the same mode.
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().expect("a pool of 2 threads");
        let in_pool = pool.install(|| flushing_subnormals(|| tiny.mul_scalar(0.25)))?.to_vec::<f32>()?;
        if cfg!(target_arch = "x86_64") {
            let kept = in_pool.iter().filter(|v| **v != 0.0).count();
            assert_eq!(kept, 0, "{kept} of {n} subnormals kept in the scope, in a rayon pool");
        }
        let after = tiny.mul_scalar(0.25)?.to_vec::<f32>()?;
        let flushed = after.iter().filter(|v| **v == 0.0).count();
        assert_eq!(flushed, 0, "{flushed} of {n} subnormals flushed outside the scope");
        Ok(())
    }
}
