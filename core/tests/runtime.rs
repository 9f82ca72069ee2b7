//! The GPU runtime: bounded memory over many steps, dispatches over the per-dimension workgroup
//! limit, and errors instead of panics (bad shapes, bad indices, oversized tensors).

mod common;

use common::{assert_close, gpu, vals};
use weft_core::{Device, Error, Tensor, Var, no_grad};

/// One SGD step of a 2-layer MLP; returns the loss.
fn step(w1: &Var, w2: &Var, x: &Tensor, labels: &Tensor) -> f32 {
    let h = x.matmul(w1).unwrap().gelu().unwrap();
    let logits = h.matmul(w2).unwrap();
    let loss = Tensor::cross_entropy(&logits, labels).unwrap();
    let grads = loss.backward().unwrap();
    no_grad(|| {
        for w in [w1, w2] {
            let g = grads.get(w).unwrap();
            w.set(&w.as_tensor().sub(&g.mul_scalar(0.1).unwrap()).unwrap()).unwrap();
        }
    });
    loss.to_scalar::<f32>().unwrap()
}

#[test]
fn a_thousand_training_steps_leave_gpu_memory_flat() {
    let Some(dev) = gpu() else { return };
    let w1 = Var::new(Tensor::randn(0.0, 0.3, &[8, 16], 1, &dev).unwrap()).unwrap();
    let w2 = Var::new(Tensor::randn(0.0, 0.3, &[16, 4], 2, &dev).unwrap()).unwrap();
    let x = Tensor::randn(0.0, 1.0, &[32, 8], 3, &dev).unwrap();
    let labels = Tensor::from_vec((0..32u32).map(|i| i % 4).collect(), &[32], &dev).unwrap();
    let first = step(&w1, &w2, &x, &labels);
    for _ in 0..10 {
        step(&w1, &w2, &x, &labels);
    }
    dev.synchronize().unwrap();
    let warm = dev.memory_stats();
    let mut last = first;
    for _ in 0..1000 {
        last = step(&w1, &w2, &x, &labels);
    }
    dev.synchronize().unwrap();
    let end = dev.memory_stats();
    assert_eq!(end.in_use, warm.in_use, "in-use bytes grew: {warm:?} -> {end:?}");
    assert!(end.peak <= warm.peak + 4096, "peak grew: {warm:?} -> {end:?}");
    assert!(last < first * 0.5, "the loss should fall: {first} -> {last}");
}

#[test]
fn large_grids_are_covered() {
    let Some(dev) = gpu() else { return };
    // One-dimensional kernels loop over more elements than their grid has invocations.
    let n = 65_537 * 256;
    let y = Tensor::full(1.0, &[n], &dev).unwrap().affine(2.0, 1.0).unwrap();
    assert_eq!(vals(&y.narrow(0, n - 3, 3).unwrap()), vec![3.0; 3]);
    assert_eq!(vals(&y.narrow(0, 0, 2).unwrap()), vec![3.0; 2]);
    // One workgroup per row, 65,539 rows: more than one grid dimension allows, so x and y are used.
    let rows = 65_539;
    let x = Tensor::arange(0.0, (2 * rows) as f32, 1.0, &dev).unwrap().reshape(&[rows, 2]).unwrap();
    let s = x.softmax(-1).unwrap();
    let tail = vals(&s.narrow(0, rows - 2, 2).unwrap());
    let want = 1.0 / (1.0 + 1f32.exp());
    assert_close(&tail, &[want, 1.0 - want, want, 1.0 - want], 1e-6, "softmax of the last rows");
}

#[test]
fn a_tensor_larger_than_the_binding_limit_is_an_err() {
    let Some(dev) = gpu() else { return };
    let limit = weft_core::devices()[0].max_storage_binding as usize;
    let err = Tensor::zeros(&[limit / 4 + 1024], &dev).unwrap_err();
    assert!(matches!(err, Error::TooLarge { .. }), "{err}");
    assert!(err.to_string().contains("bytes"), "{err}");
}

#[test]
fn an_index_out_of_range_is_an_err_on_every_device() {
    let mut devs = vec![Device::Cpu];
    devs.extend(gpu());
    for dev in devs {
        let table = Tensor::ones(&[4, 3], &dev).unwrap();
        let ids = Tensor::from_vec(vec![1u32, 9], &[2], &dev).unwrap();
        // On the GPU the kernel flags the fault, and the read-back reports it.
        let err = table.index_select(&ids, 0).and_then(|t| t.to_vec::<f32>()).unwrap_err();
        assert!(err.to_string().contains("index"), "{dev:?}: {err}");
        // The device stays usable afterwards.
        assert_eq!(table.sum_all().unwrap().to_scalar::<f32>().unwrap(), 12.0);
    }
}

#[test]
fn shape_errors_name_the_op_and_both_shapes() {
    let a = Tensor::zeros(&[2, 3], &Device::Cpu).unwrap();
    let b = Tensor::zeros(&[4, 5], &Device::Cpu).unwrap();
    let e = a.matmul(&b).unwrap_err().to_string();
    assert!(e.contains("matmul") && e.contains("[2, 3]") && e.contains("[4, 5]"), "{e}");
    let e = a.add(&b).unwrap_err().to_string();
    assert!(e.contains("add") && e.contains("[2, 3]") && e.contains("[4, 5]"), "{e}");
    let e = a.reshape(&[7]).unwrap_err().to_string();
    assert!(e.contains("reshape") && e.contains("[7]"), "{e}");
    let e = a.narrow(1, 2, 5).unwrap_err().to_string();
    assert!(e.contains("narrow"), "{e}");
    let e = Tensor::einsum("ab,bc->ac", &[&a, &b]).unwrap_err().to_string();
    assert!(e.contains("'b'") && e.contains('3') && e.contains('4'), "{e}");
    let ids = Tensor::zeros(&[2], &Device::Cpu).unwrap();
    let e = a.index_select(&ids, 0).unwrap_err().to_string();
    assert!(e.contains("u32 or i32"), "{e}");
}

#[test]
fn operands_on_different_devices_are_an_err() {
    let Some(dev) = gpu() else { return };
    let a = Tensor::zeros(&[2], &Device::Cpu).unwrap();
    let b = Tensor::zeros(&[2], &dev).unwrap();
    let e = a.add(&b).unwrap_err();
    assert!(matches!(e, Error::DeviceMismatch { .. }), "{e}");
    // Moving is explicit, and gradients flow back across it.
    let w = Var::new(Tensor::ones(&[2], &Device::Cpu).unwrap()).unwrap();
    let loss = w.to_device(&dev).unwrap().mul(&b.add_scalar(3.0).unwrap()).unwrap().sum_all().unwrap();
    let g = loss.backward().unwrap();
    assert_eq!(g.get(&w).unwrap().to_vec::<f32>().unwrap(), vec![3.0, 3.0]);
    assert!(g.get(&w).unwrap().device() == &Device::Cpu);
}

#[test]
fn two_devices_on_one_adapter_are_independent() {
    let Some(_) = gpu() else { return };
    let (d0, d1) = (Device::best_gpu().unwrap(), Device::best_gpu().unwrap());
    assert!(d0 != d1, "each call opens its own device");
    let a = Tensor::arange(0.0, 4.0, 1.0, &d0).unwrap();
    let b = a.to_device(&d1).unwrap().mul_scalar(2.0).unwrap();
    assert_eq!(vals(&b), vec![0.0, 2.0, 4.0, 6.0]);
    assert!(a.add(&b).is_err());
}

#[test]
fn threads_sharing_a_device_each_read_their_own_results() {
    // A read-back must never overtake the dispatches it reads, whichever thread submits them.
    let Some(dev) = gpu() else { return };
    std::thread::scope(|s| {
        for t in 0..4 {
            let dev = dev.clone();
            s.spawn(move || {
                for i in 0..40 {
                    let v = (t * 100 + i) as f32;
                    let x = Tensor::full(v, &[3, 70], &dev).unwrap();
                    let y = x.affine(2.0, 1.0).unwrap().t().unwrap().sum(&[0], false).unwrap();
                    assert_eq!(vals(&y), vec![(2.0 * v + 1.0) * 70.0; 3], "thread {t} step {i}");
                }
            });
        }
    });
}

/// Runs `ops` ops on `s` ([8, 5]) without reading anything: affines with parameters of their
/// own, concats of 13 parts (three dispatches, each with six parts' views in its info, the
/// largest infos weft writes) and products with `t`.
fn chain(dev: &Device, ops: usize) -> Tensor {
    let mut s = Tensor::arange(0.0, 40.0, 1.0, dev).unwrap().reshape(&[8, 5]).unwrap();
    let t = Tensor::arange(0.0, 40.0, 1.0, dev).unwrap().affine(0.005, 1.0).unwrap().reshape(&[8, 5]).unwrap();
    for i in 0..ops {
        s = match i % 3 {
            0 => s.affine(1.0 + i as f32 * 1e-3, i as f32 * 0.01).unwrap(),
            1 => {
                let parts: Vec<Tensor> = (0..13).map(|j| s.narrow(0, (j * 5 + i) % 8, 1).unwrap()).collect();
                Tensor::concat(&parts, 0).unwrap().narrow(0, i % 5, 8).unwrap()
            }
            _ => s.mul(&t).unwrap(),
        };
    }
    s
}

#[test]
fn every_dispatch_of_a_batch_reads_its_own_info() {
    let Some(_) = gpu() else { return };
    // A device of its own, so the count of dispatches is this test's. 300 ops are 500 dispatches
    // recorded before the one read: many batches, and arenas that fill with the concats' infos
    // before their batch does, so some batches are submitted early.
    let g = Device::best_gpu().unwrap();
    let Device::Gpu(ctx) = &g else { unreachable!() };
    let before = ctx.activity();
    let got = chain(&g, 300);
    let recorded = ctx.activity().dispatches - before.dispatches;
    assert!(recorded >= 450, "{recorded} dispatches");
    assert_eq!(ctx.activity().waits, before.waits);
    // More batches than one per 64 dispatches: arenas filled first (a concat's info is 168
    // words, so about 47 dispatches fill one at 16-byte alignment, 35 at 256).
    let batches = ctx.activity().submits - before.submits;
    assert!(batches > recorded / 64 + 1, "{batches} batches for {recorded} dispatches");
    assert_close(&vals(&got), &vals(&chain(&Device::Cpu, 300)), 1e-4, "the chain's values");
}
