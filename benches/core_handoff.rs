//! How long two threads take to hand one cache line back and forth (ns per round trip): the cost
//! of one core reading what the other just wrote. On a 2-vCPU cloud machine it tells where the
//! hypervisor has put the two vCPUs: on a Zen 4 it read 50-75 ns while both sat on one core complex
//! (one L3) and 290-340 ns while they sat on two, flipping every few seconds to minutes, and a
//! Cpu training step that shares data between its threads runs slower in the second case
//! (`benches/peers/mlp_modes.sh` takes this figure before and after each side it measures).
//! `cargo bench --bench core_handoff`

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Round trips per burst.
const TRIPS: u64 = 50_000;

/// One burst: the main thread writes odd numbers, the other answers with the next even one.
fn burst() -> f64 {
    let line = Arc::new(AtomicU64::new(0));
    let other = Arc::clone(&line);
    let answer = std::thread::spawn(move || {
        for i in 0..TRIPS {
            while other.load(Ordering::Acquire) != 2 * i + 1 {
                std::hint::spin_loop();
            }
            other.store(2 * i + 2, Ordering::Release);
        }
    });
    let start = Instant::now();
    for i in 0..TRIPS {
        line.store(2 * i + 1, Ordering::Release);
        while line.load(Ordering::Acquire) != 2 * i + 2 {
            std::hint::spin_loop();
        }
    }
    let ns = start.elapsed().as_secs_f64() * 1e9 / TRIPS as f64;
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
