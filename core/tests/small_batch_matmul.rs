//! Products of few rows without gradients (small-batch inference) run on weft's own kernel on
//! AVX2 CPUs, with the right matrix packed once per storage and kept: the results equal an f64
//! loop, repeat to the bit once the packed copy is kept, follow a variable that is set to new
//! values, and do not depend on the thread count. On other CPUs the same checks run on faer.

use weft_core::{Device, Tensor, Var, no_grad};

fn reference(a: &Tensor, b: &Tensor) -> Vec<f64> {
    let (m, k, n) = (a.dims()[0], a.dims()[1], b.dims()[1]);
    let (x, y) = (a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            out[i * n + j] = (0..k).map(|p| x[i * k + p] as f64 * y[p * n + j] as f64).sum();
        }
    }
    out
}

fn assert_close(got: &Tensor, want: &[f64], what: &str) {
    let k = 600f64;
    for (i, (g, w)) in got.to_vec::<f32>().unwrap().iter().zip(want).enumerate() {
        assert!((*g as f64 - w).abs() <= 4e-5 * k.sqrt(), "{what}: element {i} is {g}, expected {w}");
    }
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec::<f32>().unwrap().iter().map(|v| v.to_bits()).collect()
}

/// Rows on either side of the small-batch kernel's limits (32 rows, and where weft's kernel
/// suits the shape 64 with 256-bit tiles, 128 with 512-bit ones; past them the blocked kernel or
/// faer's), columns off the 16-wide panels, `k` across the kernel's 256-value chunks; the right
/// matrix as stored, transposed, and narrowed inside a larger one; the left one narrowed too
/// (rows with a stride longer than their length).
#[test]
fn few_rows_without_gradients_match_f64_and_repeat_to_the_bit() {
    let dev = Device::Cpu;
    let shapes = [
        (1, 384, 1536),
        (5, 600, 37),
        (8, 257, 16),
        (32, 100, 200),
        (33, 300, 50),
        (64, 130, 40),
        (65, 300, 50),
        (128, 100, 70),
        (129, 257, 33),
    ];
    for (m, k, n) in shapes {
        let a = Tensor::rand(-1.0, 1.0, &[m, k + 3], m as u64, &dev).unwrap().narrow(1, 2, k).unwrap();
        let stored = Tensor::rand(-1.0, 1.0, &[k, n], 7, &dev).unwrap();
        let transposed = Tensor::rand(-1.0, 1.0, &[n, k], 8, &dev).unwrap().t().unwrap();
        let inside = Tensor::rand(-1.0, 1.0, &[k + 2, n + 5], 9, &dev)
            .unwrap()
            .narrow(0, 1, k)
            .unwrap()
            .narrow(1, 3, n)
            .unwrap();
        for (name, b) in [("stored", &stored), ("transposed", &transposed), ("narrowed", &inside)] {
            let want = reference(&a.contiguous().unwrap(), &b.contiguous().unwrap());
            let what = format!("{m}x{k}x{n}, right matrix {name}");
            // The first call packs for itself, the second packs and keeps, the third reads the
            // kept copy: the same bits each time.
            let calls: Vec<Tensor> = (0..3).map(|_| no_grad(|| a.matmul(b)).unwrap()).collect();
            assert_close(&calls[0], &want, &what);
            for c in &calls[1..] {
                assert_eq!(bits(c), bits(&calls[0]), "{what}: a later call changed the bits");
            }
            // With gradients recorded the product is blocked or faer's: close, not necessarily equal
            // bits.
            assert_close(&a.matmul(b).unwrap(), &want, &format!("{what}, with gradients"));
        }
    }
}

/// A variable's packed copy belongs to the storage it held: after `set`, the product uses the new
/// values; a storage used both ways (a tied embedding) gives both right, and so do two halves of
/// one matrix of the same size (a fused projection cut in parts) and a square one used both ways.
#[test]
fn a_variable_set_to_new_values_is_packed_again() {
    let dev = Device::Cpu;
    let x = Tensor::rand(-1.0, 1.0, &[4, 64], 1, &dev).unwrap();
    let w = Var::new(Tensor::rand(-1.0, 1.0, &[64, 40], 2, &dev).unwrap()).unwrap();
    for _ in 0..3 {
        no_grad(|| x.matmul(w.as_tensor())).unwrap();
    }
    let fresh = Tensor::rand(-1.0, 1.0, &[64, 40], 3, &dev).unwrap();
    w.set(&fresh).unwrap();
    let got = no_grad(|| x.matmul(w.as_tensor())).unwrap();
    assert_close(&got, &reference(&x, &fresh), "after set");
    // The same storage as a [40, 64] right matrix (its transpose), alternating with the first use.
    let y = Tensor::rand(-1.0, 1.0, &[3, 40], 4, &dev).unwrap();
    let wt = w.as_tensor().t().unwrap();
    for _ in 0..3 {
        assert_close(&no_grad(|| x.matmul(w.as_tensor())).unwrap(), &reference(&x, &fresh), "as stored");
        assert_close(&no_grad(|| y.matmul(&wt)).unwrap(), &reference(&y, &wt.contiguous().unwrap()), "transposed");
    }
    let square = Tensor::rand(-1.0, 1.0, &[64, 64], 5, &dev).unwrap();
    let halves = [fresh.narrow(1, 0, 20).unwrap(), fresh.narrow(1, 20, 20).unwrap()];
    for _ in 0..3 {
        for (i, h) in halves.iter().enumerate() {
            let want = reference(&x, &h.contiguous().unwrap());
            assert_close(&no_grad(|| x.matmul(h)).unwrap(), &want, &format!("half {i}"));
        }
        for (name, b) in [("square", square.clone()), ("square transposed", square.t().unwrap())] {
            let want = reference(&x, &b.contiguous().unwrap());
            assert_close(&no_grad(|| x.matmul(&b)).unwrap(), &want, name);
        }
    }
}

/// The columns are split over the threads, so one thread and three give the same bits.
#[test]
fn the_thread_count_changes_no_bit() {
    let dev = Device::Cpu;
    let a = Tensor::rand(-1.0, 1.0, &[16, 700], 1, &dev).unwrap();
    let b = Tensor::rand(-1.0, 1.0, &[700, 900], 2, &dev).unwrap();
    let on = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        pool.install(|| bits(&no_grad(|| a.matmul(&b)).unwrap()))
    };
    assert_eq!(on(1), on(3));
}
