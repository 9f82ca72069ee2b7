//! How many threads the Cpu backend works on, and whether the calling thread is one of them.

use crate::{Error, Result};

/// Work on `n` threads (0: `RAYON_NUM_THREADS`, else one per core), the calling thread being one
/// of them, as `torch.set_num_threads` and onnxruntime's intra-op threads do.
///
/// Without it, the Cpu ops run on rayon's pool of `n` threads of its own: the thread that calls
/// an op hands it over and sleeps until the pool wakes it, a few microseconds per op that a model
/// of many small ops (a transformer's) feels. With it, the calling thread works on each op with
/// `n - 1` others and never waits to be woken. With `n` = 1 the ops run their serial loops on the
/// calling thread either way.
///
/// Call it once, early, from the thread that drives the model (usually `main`), which must live
/// as long as anything uses weft: for `n` > 1 it becomes worker 0 of rayon's global pool (and
/// runs the pool's work only inside its own calls). Other threads may still run ops: the `n - 1`
/// other workers take their work.
///
/// `Err` when rayon's global pool already exists (any parallel work, weft's or another crate's,
/// creates it) or this thread already belongs to a pool.
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
