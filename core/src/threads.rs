//! How many threads the Cpu backend works on, and whether the calling thread is one of them.

use crate::{Error, Result};

/// Work on `n` threads (0: `RAYON_NUM_THREADS`, else one per core), the calling thread being one
/// of them, as onnxruntime's intra-op threads do (unlike `torch.set_num_threads`, once per
/// process).
///
/// Without it, the Cpu ops run on rayon's pool of `n` threads of its own: the thread that calls
/// an op hands it over and sleeps until the pool wakes it, a few microseconds per op that a model
/// of many small ops (a transformer's) feels. With it, the calling thread works on each op itself
/// with `n - 1` others (it may still wait for the last of them). With `n` = 1 nothing is adopted:
/// the ops run on the calling thread anyway.
///
/// Call it once, early, from the thread that drives the model (usually `main`), before anything
/// calls rayon (weft's Cpu ops do, even a small matmul). For `n` > 1 that thread becomes worker 0
/// of rayon's global pool, which has two consequences:
/// - it must live as long as anything uses the pool;
/// - it runs the pool's work only inside its own calls, so `rayon::broadcast` (which needs every
///   worker) waits while it is busy elsewhere, and threads that run ops while it waits outside
///   rayon (the ranks of a model split over in-host devices) share `n - 1` workers. Leave it out
///   of such programs.
///
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
    let builder = rayon::ThreadPoolBuilder::new().num_threads(n);
    // One thread: nothing is handed over anyway, and a pool whose only worker is this thread
    // would never run the work other threads send it.
    let builder = if n > 1 { builder.use_current_thread() } else { builder };
    builder.build_global().map_err(|e| {
        Error::invalid(
            "set_num_threads",
            format!("cannot make a pool of {n} threads ({e}): call it once, before any parallel work"),
        )
    })
}

/// rayon's own default: `RAYON_NUM_THREADS` when set to a positive number, else one per core.
fn default_threads() -> usize {
    std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}
