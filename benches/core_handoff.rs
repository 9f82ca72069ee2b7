//! How long two threads take to hand one cache line back and forth (ns per round trip: each way,
//! one core reads what the other just wrote). On a 2-vCPU cloud machine it tells where the
//! hypervisor has put the two vCPUs: on a Zen 4 it read 50-80 ns while both sat on one core
//! complex (one L3) and 290-350 ns while they sat on two, flipping every few seconds to minutes,
//! and a Cpu training step that shares data between its threads runs slower in the second case
//! (`benches/peers/mlp_modes.sh` takes this figure before and after each side it measures).
//! `cargo bench --bench core_handoff`

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Round trips per burst, at most.
const TRIPS: u64 = 50_000;
/// A burst's time, at most: where both threads share one CPU a round trip takes a switch of
/// threads (hundreds of microseconds), and the burst stops early rather than take minutes.
const BURST_SECS: f64 = 0.5;
/// Written instead of the next odd number to end a burst early.
const STOP: u64 = u64::MAX;

/// Spins a waiting thread makes before it also yields.
const SPINS: u32 = 1 << 12;

/// Waits until `line` holds `value` or [`STOP`]; whether it was `value`.
fn wait_for(line: &AtomicU64, value: u64) -> bool {
    let mut spins = 0u32;
    loop {
        match line.load(Ordering::Acquire) {
            v if v == value => return true,
            STOP => return false,
            _ if spins < SPINS => {
                spins += 1;
                std::hint::spin_loop();
            }
            _ => std::thread::yield_now(),
        }
    }
}

/// One burst: the main thread writes odd numbers, the other answers with the next even one;
/// ns per round trip.
fn burst() -> f64 {
    let line = Arc::new(AtomicU64::new(0));
    let other = Arc::clone(&line);
    let answer = std::thread::spawn(move || {
        for i in 0..TRIPS {
            if !wait_for(&other, 2 * i + 1) {
                return;
            }
            other.store(2 * i + 2, Ordering::Release);
        }
    });
    let start = Instant::now();
    let mut trips = 0;
    while trips < TRIPS {
        if trips % 256 == 0 && start.elapsed().as_secs_f64() > BURST_SECS {
            line.store(STOP, Ordering::Release);
            break;
        }
        line.store(2 * trips + 1, Ordering::Release);
        wait_for(&line, 2 * trips + 2);
        trips += 1;
    }
    let ns = start.elapsed().as_secs_f64() * 1e9 / trips.max(1) as f64;
    answer.join().expect("the answering thread");
    ns
}

fn main() {
    // The median of five bursts (a burst during which the scheduler put both threads on one
    // vCPU reads far higher).
    let mut ns: Vec<f64> = (0..5).map(|_| burst()).collect();
    ns.sort_by(f64::total_cmp);
    println!(
        "{{\"bench\":\"core_handoff\",\"device\":\"cpu\",\"size\":\"2 threads\",\"value\":{:.1},\"unit\":\"ns\"}}",
        ns[2]
    );
}
