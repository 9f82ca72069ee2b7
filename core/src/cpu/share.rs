//! Parallel loops in which the calling thread takes part.
//!
//! A thread outside rayon's pool (a program's `main`) that runs a rayon loop hands the whole loop
//! to the pool and sleeps until the pool wakes it: two wake-ups of a sleeping thread per op, tens
//! of microseconds each on a loaded machine, against an op of a layer's activations (a ReLU's
//! gradient over 256 x 1024 values) that takes about as long. Here the caller claims pieces from
//! a shared counter and works on them itself while weft's helper threads (`crew`: one fewer than
//! rayon's pool, and most often still awake from the last loop) claim the rest; it then waits
//! only for pieces already claimed, never for a thread to wake. Every Cpu op's loops come here.
//! Which thread runs which piece does not change what each piece computes, so results keep their
//! bits.

use super::crew::Job;
use crate::Result;
use crate::subnormals::Mode;
use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Runs `f(i)` once for every `i` in `0..n`, on this thread and the helper threads.
///
/// On a rayon pool thread (a loop inside one of rayon's, or a program's own pool) rayon's own
/// loop runs it; a loop nested in a helper's piece is offered to the helpers like any other; with
/// a pool of one thread, or one piece, this thread alone. A panic in `f` is raised again here,
/// with its own message, once every claimed piece has finished.
pub(crate) fn par_for(n: usize, f: &(dyn Fn(usize) + Sync)) {
    let threads = rayon::current_num_threads();
    if n <= 1 || threads == 1 {
        (0..n).for_each(f);
        return;
    }
    // Every piece runs in the caller's floating-point mode (see `crate::subnormals`), whichever
    // thread runs it.
    let mode = Mode::of_this_thread();
    if rayon::current_thread_index().is_some() {
        use rayon::prelude::*;
        (0..n).into_par_iter().for_each(|i| {
            let _mode = mode.enter();
            f(i)
        });
        return;
    }
    // SAFETY: the pointer is dereferenced only by a thread that claimed a piece, and this
    // function returns only after every claimed piece has finished (`done` reaches `n`): a
    // helper that starts later finds nothing left and never touches `f`.
    let f: *const (dyn Fn(usize) + Sync + 'static) = unsafe { std::mem::transmute(f) };
    let shared = Arc::new(Shared {
        f,
        n,
        mode,
        next: AtomicUsize::new(0),
        done: AtomicUsize::new(0),
        panic: Mutex::new(None),
        caller: std::thread::current(),
    });
    // (Where the helpers could not be started, rayon's pool helps.)
    if !super::crew::offer(shared.clone(), threads.min(n) - 1) {
        for _ in 1..threads.min(n) {
            let s = shared.clone();
            rayon::spawn(move || s.work());
        }
    }
    shared.work();
    // The pieces still running were claimed by awake threads: spin a while, then sleep until the
    // last one ends.
    super::crew::wait_until(|| shared.done.load(Ordering::Acquire) >= n);
    let panic = shared.panic.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(payload) = panic {
        resume_unwind(payload);
    }
}

/// `f(i, chunk)` for each `size`-element chunk of `dst` (the last may be shorter), through
/// [`par_for`]: [`par_row_pieces`] with `dst` as one row.
pub(crate) fn par_chunks_mut<T: Send>(dst: &mut [T], size: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    let size = size.max(1);
    par_row_pieces(dst, dst.len(), size, |_, start, chunk| f(start / size, chunk));
}

/// Values a task of a recurrent cell's step writes (`par_rows`): each costs three or four
/// exponentials, about ten times a plain elementwise value, so a step of a small layer (64 rows of
/// 128 units) is still shared over the threads.
pub(crate) const CELL_TASK: usize = 1 << 11;

/// A new vector of `len` values (a whole number of rows of `n`), `f(r, row)` writing every value
/// of each row `r`, in tasks of whole rows, about `task` values each, through
/// [`par_chunks_mut`]; a single task runs on this thread.
pub(crate) fn par_rows(
    len: usize,
    n: usize,
    task: usize,
    f: impl Fn(usize, &mut [std::mem::MaybeUninit<f32>]) + Sync,
) -> Result<Vec<f32>> {
    let mut out = super::try_take(len)?;
    let rows = &mut out.spare_capacity_mut()[..len];
    if let Some(per) = task.checked_div(n) {
        let per = per.max(1);
        let run = |t: usize, o: &mut [std::mem::MaybeUninit<f32>]| {
            o.chunks_mut(n).enumerate().for_each(|(i, row)| f(t * per + i, row))
        };
        if len <= per * n || super::one_thread() {
            run(0, rows);
        } else {
            par_chunks_mut(rows, per * n, run);
        }
    }
    // SAFETY: `f` wrote every value of every row, and the rows cover `len` values (none when
    // `n` is 0, when `len` is 0 too).
    unsafe { out.set_len(len) };
    Ok(out)
}

/// `f(r, start, piece)` for each piece of at most `size` elements of each row `r` of `dst`
/// (rows of `row_len`, `dst` a whole number of them), the piece starting at `start` in its row,
/// through [`par_for`]: a single long row is cut too.
pub(crate) fn par_row_pieces<T: Send>(
    dst: &mut [T],
    row_len: usize,
    size: usize,
    f: impl Fn(usize, usize, &mut [T]) + Sync,
) {
    let (row_len, size) = (row_len.max(1), size.max(1));
    let per_row = row_len.div_ceil(size);
    let base = Ptr(dst.as_mut_ptr());
    par_for(dst.len() / row_len * per_row, &|t| {
        let (r, start) = (t / per_row, t % per_row * size);
        // SAFETY: piece t is elements start..start + its length of row r, inside `dst` (a whole
        // number of rows), disjoint from every other piece; `dst` is borrowed for the loop.
        let piece =
            unsafe { std::slice::from_raw_parts_mut(base.get().add(r * row_len + start), size.min(row_len - start)) };
        f(r, start, piece)
    });
}

/// `f(scratch, i)` for every `i` in `0..n`, through [`par_for`]: each piece borrows a scratch
/// `S` that an earlier piece gave back (at most one per thread at work, not one per piece). The
/// first `Err` comes back, and pieces not started by then are skipped.
pub(crate) fn try_par_for<S: Default + Send>(n: usize, f: impl Fn(&mut S, usize) -> Result<()> + Sync) -> Result<()> {
    let spare: Mutex<Vec<S>> = Mutex::new(Vec::new());
    let failed: Mutex<Option<crate::Error>> = Mutex::new(None);
    let stop = AtomicBool::new(false);
    par_for(n, &|i| {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let mut scratch = spare.lock().unwrap_or_else(|e| e.into_inner()).pop().unwrap_or_default();
        let out = f(&mut scratch, i);
        spare.lock().unwrap_or_else(|e| e.into_inner()).push(scratch);
        if let Err(e) = out {
            stop.store(true, Ordering::Relaxed);
            failed.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(e);
        }
    });
    match failed.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// `f(scratch, i, chunk)` for each `size`-element chunk of `dst` (the last may be shorter),
/// through [`try_par_for`].
pub(crate) fn try_par_chunks_mut<T: Send, S: Default + Send>(
    dst: &mut [T],
    size: usize,
    f: impl Fn(&mut S, usize, &mut [T]) -> Result<()> + Sync,
) -> Result<()> {
    let (size, len) = (size.max(1), dst.len());
    let base = Ptr(dst.as_mut_ptr());
    try_par_for(len.div_ceil(size), |s, i| {
        // SAFETY: chunk i is elements i * size.. of `dst`, disjoint from every other chunk;
        // `dst` is borrowed for the loop.
        let chunk = unsafe { std::slice::from_raw_parts_mut(base.get().add(i * size), size.min(len - i * size)) };
        f(s, i, chunk)
    })
}

/// `f(scratch, item)` for each of `items`, through [`try_par_for`].
pub(crate) fn try_par_each<T: Send, S: Default + Send>(
    items: Vec<T>,
    f: impl Fn(&mut S, T) -> Result<()> + Sync,
) -> Result<()> {
    // (Each item is taken once, by the piece of its index.)
    let items: Vec<Mutex<Option<T>>> = items.into_iter().map(|t| Mutex::new(Some(t))).collect();
    try_par_for(items.len(), |s, i| {
        let item = items[i].lock().unwrap_or_else(|e| e.into_inner()).take();
        item.map_or(Ok(()), |item| f(s, item))
    })
}

/// A pointer shared by pieces that each touch their own elements.
pub(crate) struct Ptr<T>(pub(crate) *mut T);

impl<T> Clone for Ptr<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Ptr<T> {}

impl<T> Ptr<T> {
    /// (A method, so that closures take the whole value, which is Sync, not its pointer.)
    pub(crate) fn get(self) -> *mut T {
        self.0
    }
}

// SAFETY: the pieces that share it write disjoint elements (see `par_chunks_mut`, `par_row_pieces`).
unsafe impl<T: Send> Send for Ptr<T> {}
unsafe impl<T: Send> Sync for Ptr<T> {}

/// The loop's state, shared with the helpers (which may start, or find it still offered, after
/// the loop is over: every piece is claimed by then, so they never call `f`).
struct Shared {
    f: *const (dyn Fn(usize) + Sync),
    n: usize,
    /// The caller's floating-point mode, which every piece runs in.
    mode: Mode,
    next: AtomicUsize,
    done: AtomicUsize,
    /// The first panic's payload, raised again by the caller.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    /// Woken by whoever finishes the last piece.
    caller: std::thread::Thread,
}

// SAFETY: `f` is `Sync` and called only while the loop that owns it waits (see `par_for`).
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

impl Job for Shared {
    fn work(&self) {
        let _mode = self.mode.enter();
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= self.n {
                return;
            }
            // SAFETY: piece i was claimed, so the loop is still waiting for it (see `par_for`).
            let f = unsafe { &*self.f };
            if let Err(payload) = catch_unwind(AssertUnwindSafe(|| f(i))) {
                self.panic.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(payload);
            }
            if self.done.fetch_add(1, Ordering::Release) + 1 == self.n {
                self.caller.unpark();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every index runs once, from a thread outside the pool and from inside it, and the
    /// chunks cover the slice exactly.
    #[test]
    fn every_piece_runs_once() {
        for n in [0, 1, 2, 3, 17, 1000] {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            par_for(n, &|i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1), "n {n}");
            let inside = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
            inside.install(|| {
                par_for(n, &|i| {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                })
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 2), "n {n} in a pool");
        }
        for (len, size) in [(0, 4), (10, 3), (12, 4), (1, 1000)] {
            let mut v = vec![0usize; len];
            par_chunks_mut(&mut v, size, |i, c| c.iter_mut().for_each(|x| *x += i + 1));
            let want: Vec<usize> = (0..len).map(|e| e / size + 1).collect();
            assert_eq!(v, want, "len {len} size {size}");
        }
        // Rows of 10 in pieces of 4: each element learns its row and its place in the row.
        let mut v = vec![(0, 0); 30];
        par_row_pieces(&mut v, 10, 4, |r, start, p| p.iter_mut().enumerate().for_each(|(j, x)| *x = (r, start + j)));
        assert_eq!(v, (0..30).map(|e| (e / 10, e % 10)).collect::<Vec<_>>());
    }

    /// From a thread outside any pool, the pieces run on the caller and weft's helpers only (as
    /// many threads as rayon's pool, not one more), and a caller that went to sleep waiting for a
    /// slow piece is woken when it ends.
    #[test]
    fn the_caller_and_its_helpers_run_the_pieces() {
        // On a thread of its own, so that a caller never woken fails the test instead of hanging it.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let me = std::thread::current().id();
            let names = Mutex::new(std::collections::BTreeSet::new());
            let slow = std::sync::atomic::AtomicBool::new(false);
            par_for(64, &|_| {
                let t = std::thread::current();
                let mut ms = 1;
                if t.id() != me {
                    names.lock().unwrap().insert(t.name().unwrap_or("").to_string());
                    // A helper's first piece outlasts all the caller's pieces and its spin, so the
                    // caller sleeps and must be woken.
                    if !slow.swap(true, Ordering::Relaxed) {
                        ms = 200;
                    }
                }
                std::thread::sleep(std::time::Duration::from_millis(ms));
            });
            tx.send(names.into_inner().unwrap()).unwrap();
        });
        let names = rx.recv_timeout(std::time::Duration::from_secs(20)).expect("the caller was woken");
        assert!(names.iter().all(|n| n.starts_with("weft-helper-")), "pieces ran on {names:?}");
        assert!(names.len() < rayon::current_num_threads().max(2), "{} helpers: {names:?}", names.len());
    }

    /// The fallible loops: every chunk or item once, a scratch lent to one piece at a time and
    /// no more of them than threads at work, and the first `Err` back with later pieces skipped.
    #[test]
    fn fallible_loops_lend_scratch_and_stop_at_an_error() {
        // A scratch counts the pieces it served; the sum of counts is the number of pieces.
        #[derive(Default)]
        struct Served(usize);
        let made = AtomicUsize::new(0);
        let mut v = vec![0usize; 1000];
        try_par_chunks_mut(&mut v, 7, |s: &mut Served, i, c| {
            if s.0 == 0 {
                made.fetch_add(1, Ordering::Relaxed);
            }
            s.0 += 1;
            c.iter_mut().for_each(|x| *x += i + 1);
            Ok(())
        })
        .unwrap();
        assert_eq!(v, (0..1000).map(|e| e / 7 + 1).collect::<Vec<_>>());
        let made = made.load(Ordering::Relaxed);
        assert!((1..=rayon::current_num_threads()).contains(&made), "{made} scratches for 143 pieces");
        let seen: Vec<AtomicUsize> = (0..50).map(|_| AtomicUsize::new(0)).collect();
        try_par_each((0..50).collect(), |_: &mut (), i: usize| {
            seen[i].fetch_add(1, Ordering::Relaxed);
            Ok(())
        })
        .unwrap();
        assert!(seen.iter().all(|s| s.load(Ordering::Relaxed) == 1));
        // Every piece fails: each thread runs at most one, the rest are skipped.
        let ran = AtomicUsize::new(0);
        let e = try_par_for(10_000, |_: &mut (), i| {
            ran.fetch_add(1, Ordering::Relaxed);
            Err(crate::Error::invalid("piece", format!("piece {i} failed")))
        })
        .unwrap_err();
        assert!(e.to_string().contains("failed"), "{e}");
        let ran = ran.load(Ordering::Relaxed);
        assert!(ran <= rayon::current_num_threads(), "{ran} pieces ran after an error");
    }

    /// A panicking piece is raised on the calling thread, with its message, after the others
    /// finish.
    #[test]
    fn a_panic_comes_back_to_the_caller() {
        let ran = AtomicUsize::new(0);
        let out = catch_unwind(AssertUnwindSafe(|| {
            par_for(64, &|i| {
                ran.fetch_add(1, Ordering::Relaxed);
                assert!(i != 40, "piece 40");
            })
        }));
        let payload = out.expect_err("the panic comes back");
        let msg = payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        assert!(msg.contains("piece 40"), "the piece's own message: {msg:?}");
        assert_eq!(ran.load(Ordering::Relaxed), 64, "every piece ran");
    }
}
