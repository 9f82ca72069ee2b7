//! weft's helper threads: one fewer than rayon's pool has (the thread that runs a loop makes up
//! the count), each waiting for the next loop [`share::par_for`](super::share) offers by spinning
//! for [`SPIN`], then sleeping until one comes.
//!
//! Why they spin that long: a training step's loops come a little apart (between them the
//! calling thread runs the serial work: a small variable's update, the loss, the autograd
//! bookkeeping), and a thread that went to sleep in a gap takes tens of microseconds to wake on
//! a loaded machine, often longer than the loop that wakes it. A rayon pool's thread, which the
//! helpers were before, spins for about 30 yields (tens of microseconds) and then sleeps.
//! Measured in the MLP's training step (784-1024-1024-10, batch 256, Adam, 2-core Zen 4):
//! context switches from about 130 to 30 a step; steps a second, with the narrow products cut
//! over these threads (`gemm_engine`), 4-7% more in one process (alternated, 40 rounds each way)
//! and from a median of 62 to 65 in separate processes (24 pairs, alternated). While it spins a
//! helper yields now and then, so a thread that has work (rayon's pool, another program) gets
//! the core.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long a thread out of work spins before it sleeps.
pub(super) const SPIN: Duration = Duration::from_millis(1);

/// Turns of a spin between two looks at the clock (and yields).
const SPINS: u32 = 64;

/// A loop's pieces, which any helper may claim and run.
pub(super) trait Job: Send + Sync {
    /// Claims and runs pieces until none is left.
    fn work(&self);
}

/// The helpers' shared state.
struct Crew {
    /// The loop on offer, with the count of loops offered so far.
    slot: Mutex<(u64, Option<Arc<dyn Job>>)>,
    /// That count, read while spinning without the lock.
    offered: AtomicU64,
    /// Helpers asleep or about to sleep (whom an offer must wake).
    asleep: AtomicUsize,
    wake: Condvar,
}

/// Offers `job` to the helpers: any awake join it, and up to `wanted` asleep are woken for it
/// (a loop of few pieces on a machine of many cores need not wake them all); `false` where the
/// helpers could not be started (the caller then runs the job some other way).
pub(super) fn offer(job: Arc<dyn Job>, wanted: usize) -> bool {
    let Some(crew) = crew() else { return false };
    let mut slot = crew.slot.lock().unwrap_or_else(|e| e.into_inner());
    slot.0 += 1;
    slot.1 = Some(job);
    crew.offered.store(slot.0, Ordering::Release);
    // (Under the lock: a helper counts itself asleep under it too, so none is missed.)
    for _ in 0..wanted.min(crew.asleep.load(Ordering::SeqCst)) {
        crew.wake.notify_one();
    }
    true
}

/// Waits until `done()`: spinning (with a yield now and then) for [`SPIN`], then parking, to be
/// woken by whoever makes it true (with `Thread::unpark`).
pub(super) fn wait_until(done: impl Fn() -> bool) {
    let mut spin = Spin::new();
    while !done() {
        if !spin.turn() {
            std::thread::park();
        }
    }
}

/// A wait's spinning: a pause a turn, a yield every [`SPINS`] turns, for [`SPIN`].
struct Spin {
    start: Instant,
    turns: u32,
}

impl Spin {
    fn new() -> Self {
        Spin { start: Instant::now(), turns: 0 }
    }

    /// One more turn; `false` once the spin is over (time to sleep).
    fn turn(&mut self) -> bool {
        self.turns = self.turns.wrapping_add(1);
        if !self.turns.is_multiple_of(SPINS) {
            std::hint::spin_loop();
        } else if self.start.elapsed() < SPIN {
            std::thread::yield_now();
        } else {
            return false;
        }
        true
    }
}

/// The helpers, started on first use: as many as rayon's pool has threads, less one.
fn crew() -> Option<&'static Crew> {
    static CREW: OnceLock<Option<&'static Crew>> = OnceLock::new();
    *CREW.get_or_init(|| {
        // Leaked: the helpers live as long as the process.
        let crew: &'static Crew = Box::leak(Box::new(Crew {
            slot: Mutex::new((0, None)),
            offered: AtomicU64::new(0),
            asleep: AtomicUsize::new(0),
            wake: Condvar::new(),
        }));
        let n = rayon::current_num_threads().saturating_sub(1).max(1);
        for i in 0..n {
            std::thread::Builder::new().name(format!("weft-helper-{i}")).spawn(move || crew.help()).ok()?;
        }
        Some(crew)
    })
}

impl Crew {
    /// A helper's life: wait for a loop it has not seen, join it, again.
    fn help(&self) {
        let mut seen = 0;
        loop {
            let mut spin = Spin::new();
            while self.offered.load(Ordering::Acquire) == seen {
                if !spin.turn() {
                    let mut slot = self.slot.lock().unwrap_or_else(|e| e.into_inner());
                    self.asleep.fetch_add(1, Ordering::SeqCst);
                    while slot.0 == seen {
                        slot = self.wake.wait(slot).unwrap_or_else(|e| e.into_inner());
                    }
                    self.asleep.fetch_sub(1, Ordering::SeqCst);
                    break;
                }
            }
            let job = {
                let slot = self.slot.lock().unwrap_or_else(|e| e.into_inner());
                seen = slot.0;
                slot.1.clone()
            };
            if let Some(job) = job {
                job.work();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::share::par_for;
    use std::collections::BTreeSet;
    use std::sync::Mutex;

    /// Helpers that went to sleep (no loop for longer than they spin) wake for the next loop and
    /// take pieces of it.
    #[test]
    fn sleeping_helpers_wake_for_the_next_loop() {
        if rayon::current_num_threads() < 2 {
            eprintln!("skipped: one thread, no helpers");
            return;
        }
        // On a thread of its own, so that a helper never woken fails the test instead of hanging it.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let names = Mutex::new(BTreeSet::new());
            // A loop to start the helpers, if no test did yet.
            par_for(8, &|_| std::thread::sleep(std::time::Duration::from_millis(1)));
            // (A few tries: a loop another test offers meanwhile may take the helpers.)
            for _ in 0..5 {
                std::thread::sleep(super::SPIN * 20);
                par_for(64, &|_| {
                    if let Some(name) = std::thread::current().name().filter(|n| n.starts_with("weft-helper-")) {
                        names.lock().unwrap().insert(name.to_string());
                    }
                    std::thread::sleep(std::time::Duration::from_millis(1));
                });
                if !names.lock().unwrap().is_empty() {
                    break;
                }
            }
            tx.send(names.into_inner().unwrap()).unwrap();
        });
        let names = rx.recv_timeout(std::time::Duration::from_secs(30)).expect("every loop ended");
        assert!(!names.is_empty(), "no helper took a piece after sleeping");
    }
}
