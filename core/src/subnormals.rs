//! Subnormal floats flushed to zero while a scope runs ([`flushing_subnormals`]): an optimizer's
//! update on the Cpu runs in one, as XLA runs all of its Cpu code.
//!
//! Why: a moment whose gradient stays 0 (the weights of a ReLU unit that never fires, an
//! embedding row no batch holds) decays geometrically, Adam's first moment by 0.9 a step, and
//! within some hundreds of steps it sits a few units above 0 among the subnormals (under
//! 1.2e-38), where 0.9 of it rounds back to itself: it never leaves. On x86 every operation
//! that reads or makes a subnormal takes a microcode assist of about a hundred cycles, and the
//! update, which otherwise runs at the speed of memory, ran 10 to 25 times slower from then on.
//! Measured on a 2-core Xeon (MLPs on random data, Adam, a `jax.jit` step as the yardstick, in
//! one run): 784-256-10 at batch 32 ran 0.56 as fast as `jax.jit` (62% of its step in Adam's
//! pass) and 1.51 as fast with subnormals flushed; 784-512-512-10 at batch 64 0.54 and 1.01. A
//! value that small carries nothing a step could use: flushed, it is 0.
//!
//! How: on x86-64 the thread's MXCSR gets its flush-to-zero and denormals-are-zero bits for the
//! scope's length. Every loop of weft's (`cpu::share`) hands the pieces other threads run the
//! calling thread's mode, set or cleared, whatever mode those threads had; a library product,
//! whose own threads would not take it, runs on the calling thread when that thread flushes. So
//! what an op computes does not depend on which thread ran which piece. Threads weft starts from
//! a thread that flushes (rayon's pool, whose start the scope makes first; the in-host ranks of
//! a split model, started before any step) would flush for life, as on Linux a thread starts in
//! its parent's mode. Elsewhere than x86-64 (ARM cores handle subnormals at full speed) values
//! are kept as they are.
//!
//! (Formally, changing DAZ is undefined behaviour in Rust, which assumes the default mode: the
//! compiler may fold or move register-only float arithmetic across the change. XLA and crates
//! such as `no_denormals` rely on the same thing; here the mode changes only around whole loops,
//! whose values go through memory, which no operation moves across.)

use std::cell::Cell;
use std::marker::PhantomData;

thread_local! {
    /// Whether this thread is inside a scope (its own, or one a loop's caller passed on).
    static ON: Cell<bool> = const { Cell::new(false) };
}

/// MXCSR's flush-to-zero (bit 15: subnormal results become 0) and denormals-are-zero (bit 6:
/// subnormal inputs read as 0) bits; none elsewhere than x86-64.
const FLUSH: u32 = if cfg!(target_arch = "x86_64") { 0x8040 } else { 0 };

/// Runs `f` with subnormal inputs and results (f32 and f64) flushed to zero on x86-64: on this
/// thread, in every piece of weft's Cpu loops that other threads run for it, and in the
/// libraries' products (on this thread). The thread's mode is put back after, a panic included.
/// An optimizer's update of Cpu variables runs in such a scope; its results may differ from the
/// same ops outside it, and from another CPU's, wherever a subnormal input or result met (a value
/// under 1.2e-38 read as 0 can change a quotient or a comparison by much more). Rayon's global
/// pool is started first (on Linux a thread starts in its parent's mode), so call
/// `set_num_threads` before.
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
    #[cfg(target_arch = "x86_64")]
    let _ = rayon::current_num_threads();
    let _mode = Mode::FLUSHING.enter();
    f()
}

/// Whether this thread is inside a [`flushing_subnormals`] scope.
pub(crate) fn flushing() -> bool {
    ON.with(Cell::get)
}

/// A thread's mode: whether it is in a scope, and its MXCSR's flush bits (0 elsewhere than
/// x86-64).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Mode {
    on: bool,
    bits: u32,
}

impl Mode {
    const FLUSHING: Mode = Mode { on: true, bits: FLUSH };

    /// This thread's mode, for the pieces of a loop it hands to other threads.
    pub(crate) fn of_this_thread() -> Mode {
        #[cfg(target_arch = "x86_64")]
        let bits = x86::read() & FLUSH;
        #[cfg(not(target_arch = "x86_64"))]
        let bits = 0;
        Mode { on: flushing(), bits }
    }

    /// This mode on this thread until the guard drops, when the thread's own comes back.
    pub(crate) fn enter(self) -> Guard {
        let before = Mode::of_this_thread();
        ON.with(|c| c.set(self.on));
        #[cfg(target_arch = "x86_64")]
        if before.bits != self.bits {
            x86::set_flush_bits(self.bits);
        }
        Guard { before, _here: PhantomData }
    }

    /// Whether a thread in this mode flushes subnormals (never, elsewhere than x86-64).
    pub(crate) fn flushes(self) -> bool {
        self.bits != 0
    }
}

/// Puts a thread's mode back when dropped (on the thread that made it: not `Send`).
pub(crate) struct Guard {
    before: Mode,
    _here: PhantomData<*const ()>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        ON.with(|c| c.set(self.before.on));
        // (Whatever ran inside may have changed the bits too: compared with the register.)
        #[cfg(target_arch = "x86_64")]
        if x86::read() & FLUSH != self.before.bits {
            x86::set_flush_bits(self.before.bits);
        }
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

    /// Sets the thread's FTZ and DAZ bits to those of `bits` (`super::FLUSH` or 0), the rest of
    /// MXCSR as it is.
    pub(super) fn set_flush_bits(bits: u32) {
        let csr = (read() & !super::FLUSH) | (bits & super::FLUSH);
        // SAFETY: loads 4 bytes from a local holding the register with only FTZ and DAZ changed,
        // which every x86-64 CPU supports (SSE2); no reserved bit is set. (Not `preserves_flags`:
        // Rust counts MXCSR's exception flags as flags, and this rewrites them, with the values
        // just read.)
        unsafe { std::arch::asm!("ldmxcsr [{}]", in(reg) &csr, options(nostack)) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Device, Tensor};

    /// A subnormal product of two normal numbers, computed where the optimiser cannot see it nor
    /// move it past the mode's change.
    fn product(a: f32, b: f32) -> f32 {
        std::hint::black_box(std::hint::black_box(a) * std::hint::black_box(b))
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

    /// How many of a 1M-element op's results are 0 (each would be a subnormal kept).
    fn zeros_of_a_large_op() -> crate::Result<usize> {
        let n = 1 << 20;
        let tiny = Tensor::from_vec(vec![1.5e-38f32; n], &[n], &Device::Cpu)?;
        Ok(tiny.mul_scalar(0.25)?.to_vec::<f32>()?.iter().filter(|v| **v == 0.0).count())
    }

    /// The modes the pieces of one of weft's loops ran in, and how many pieces a thread other
    /// than the caller ran (each piece waits a little, so that the other threads take some): up
    /// to 8 loops, until another thread ran a piece (a helper that looked while another test's
    /// loop was on offer joined that one, and never sees this one), every loop's modes kept.
    fn modes_of_pieces() -> (Vec<Mode>, usize) {
        let mut all = (Vec::new(), 0);
        for _ in 0..8 {
            let (modes, others) = modes_of_one_loop();
            all.0.extend(modes);
            all.1 += others;
            if all.1 > 0 {
                break;
            }
        }
        all
    }

    fn modes_of_one_loop() -> (Vec<Mode>, usize) {
        let me = std::thread::current().id();
        let seen = std::sync::Mutex::new((Vec::new(), 0));
        crate::cpu::par_chunks_mut(&mut [0u8; 48], 1, |_, _| {
            let mut s = seen.lock().unwrap();
            s.0.push(Mode::of_this_thread());
            s.1 += usize::from(std::thread::current().id() != me);
            drop(s);
            std::thread::sleep(std::time::Duration::from_millis(2));
        });
        seen.into_inner().unwrap()
    }

    /// Every piece of a loop runs in its caller's mode, whatever mode the thread that runs it
    /// had: in a scope and out of it, from a thread outside any pool (weft's helpers run pieces)
    /// and from a rayon pool's (the pool's threads do), and for a caller that flushes by its own
    /// thread's mode outside any scope (as a library built with fast-math may leave it), then the
    /// next caller that does not. Each case has other threads run pieces (under CI; a machine of
    /// one thread has none to check). And a large op flushes all of its values in a scope.
    #[test]
    fn every_piece_of_a_loop_runs_in_the_callers_mode() -> crate::Result<()> {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().expect("a pool of 2 threads");
        let many = rayon::current_num_threads() > 1;
        assert!(many || std::env::var("CI").is_err(), "one thread under CI=true: no helper's mode was checked");
        let check = |what: &str, want: Mode, (modes, others): (Vec<Mode>, usize)| {
            assert!(modes.iter().all(|m| *m == want), "{what}: pieces ran in {modes:?}, the caller in {want:?}");
            assert!(others > 0 || !many, "{what}: no other thread ran a piece");
        };
        let normal = Mode::of_this_thread();
        check("in a scope", Mode::FLUSHING, flushing_subnormals(modes_of_pieces));
        check("after it", normal, modes_of_pieces());
        check("in a scope, in a pool", Mode::FLUSHING, pool.install(|| flushing_subnormals(modes_of_pieces)));
        check("in a pool, after it", normal, pool.install(modes_of_pieces));
        #[cfg(target_arch = "x86_64")]
        {
            let own = std::thread::spawn(|| {
                x86::set_flush_bits(FLUSH);
                (Mode::of_this_thread(), modes_of_pieces())
            })
            .join()
            .expect("the thread ran");
            assert_eq!(own.0, Mode { on: false, bits: FLUSH });
            check("a caller that flushes by its own mode", own.0, own.1);
            check("the next caller, which does not", normal, modes_of_pieces());
        }
        let all = if cfg!(target_arch = "x86_64") { 1 << 20 } else { 0 };
        assert_eq!(flushing_subnormals(zeros_of_a_large_op)?, all, "a large op in a scope");
        assert_eq!(zeros_of_a_large_op()?, 0, "a large op outside it");
        Ok(())
    }
}
