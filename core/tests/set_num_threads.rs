//! `set_num_threads`: sets the thread count, the calling thread staying outside rayon's pool (it
//! works on its ops beside weft's helpers), ops give the bits of any other pool, other threads
//! still get their ops run, and a second call is an `Err`. One test in its own binary: rayon's
//! global pool is per process.

use std::sync::mpsc;
use std::time::Duration;
use weft_core::{Device, Tensor};

fn ops() -> Vec<Vec<u32>> {
    let x = Tensor::rand(-2.0, 2.0, &[300, 1030], 1, &Device::Cpu).unwrap();
    let g = Tensor::rand(0.5, 1.5, &[1030], 2, &Device::Cpu).unwrap();
    let outs = [
        x.exp().unwrap(),
        x.softmax(-1).unwrap(),
        x.layer_norm(&g, &g, 1e-5).unwrap(),
        x.sum(&[0], false).unwrap(),
        x.t().unwrap().contiguous().unwrap(),
        x.matmul(&x.t().unwrap()).unwrap(),
    ];
    // Bits: -0.0 and 0.0 differ.
    outs.iter().map(|t| t.to_vec::<f32>().unwrap().iter().map(|v| v.to_bits()).collect()).collect()
}

#[test]
fn set_num_threads_sets_the_count_once() {
    let pool = rayon::ThreadPoolBuilder::new().num_threads(3).build().unwrap();
    let reference = pool.install(ops);
    // From inside another pool: an Err that leaves the global pool to be made.
    let e = pool.install(|| weft_core::set_num_threads(2)).unwrap_err().to_string();
    assert!(e.contains("already worker"), "{e}");
    weft_core::set_num_threads(2).unwrap();
    assert_eq!(rayon::current_thread_index(), None, "this thread stays outside the pool");
    assert_eq!(rayon::current_num_threads(), 2);
    assert_eq!(ops(), reference, "ops on this thread and weft's helper");
    // Another thread's ops run too, while this one waits.
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || tx.send(ops()).unwrap());
    let theirs = rx.recv_timeout(Duration::from_secs(120)).expect("another thread's ops finish");
    assert_eq!(theirs, reference);
    let e = weft_core::set_num_threads(2).unwrap_err().to_string();
    assert!(e.contains("set_num_threads") && e.contains("once"), "{e}");
}
