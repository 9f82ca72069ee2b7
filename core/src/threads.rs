//! How many threads the Cpu backend works on.

use crate::{Error, Result};

/// Work on `n` threads (0: `RAYON_NUM_THREADS`, else one per core), the calling thread being one
/// of them, as onnxruntime's intra-op threads do (unlike `torch.set_num_threads`, once per
/// process).
///
/// The Cpu ops cut their work into pieces that the thread calling the op works on itself, beside
/// `n - 1` helper threads of weft's own that stay awake a moment between ops (so that a model of
/// many small ops, a transformer's, does not wait for threads to wake). This sets `n`: the size
/// of rayon's global pool, which weft's helpers are counted from and which a library product
/// too narrow to cut into blocks still runs on. Without it, `n` is rayon's default, the same
/// as `set_num_threads(0)`. Any number of threads may run ops at once (the ranks of a model
/// split over in-host devices do): each works on its own ops, and the helpers join whichever
/// op came last.
///
/// Call it once, early, before anything calls rayon (weft's Cpu ops do, even a small matmul).
/// `Err`, changing nothing, when this thread already belongs to a pool or rayon's global pool
/// already exists.
///
/// ```no_run
/// fn main() -> weft_core::Result<()> {
///     weft_core::set_num_threads(2)?;
///     assert_eq!(rayon::current_num_threads(), 2);
///     // ... build and run the model on this thread ...
///     Ok(())
/// }
/// ```
pub fn set_num_threads(n: usize) -> Result<()> {
    if let Some(i) = rayon::current_thread_index() {
        // Checked here: rayon would fail too, but only after marking its global pool as made.
        return Err(Error::invalid(
            "set_num_threads",
            format!("this thread is already worker {i} of a rayon pool: call it once, before any parallel work"),
        ));
    }
    let n = if n > 0 { n } else { default_threads() };
    // (The calling thread stays out of the pool: a loop it runs goes to weft's helpers, with
    // which it measured faster than as rayon's worker 0, e.g. 6% on the MLP's training step.)
    rayon::ThreadPoolBuilder::new().num_threads(n).build_global().map_err(|e| {
        Error::invalid(
            "set_num_threads",
            format!("cannot make a pool of {n} threads ({e}): call it once, before any parallel work"),
        )
    })
}

/// `f(i, chunk)` for each `size`-element chunk of `dst` (the last may be shorter), on the calling
/// thread and weft's helper threads, as the Cpu ops run their loops: for crates built on
/// weft-core (the in-host collectives sum their deposits with it), so that every Cpu loop shares
/// one set of threads. Which thread runs a chunk does not change what `f` is given.
///
/// ```
/// let mut v = vec![0usize; 10];
/// weft_core::par_chunks_mut(&mut v, 4, |i, chunk| chunk.iter_mut().for_each(|x| *x = i));
/// assert_eq!(v, [0, 0, 0, 0, 1, 1, 1, 1, 2, 2]);
/// ```
pub fn par_chunks_mut<T: Send>(dst: &mut [T], size: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    crate::cpu::par_chunks_mut(dst, size, f)
}

/// rayon's own default: `RAYON_NUM_THREADS` when set to a positive number, else one per core.
fn default_threads() -> usize {
    std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}
