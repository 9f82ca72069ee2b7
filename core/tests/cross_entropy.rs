//! `Tensor::cross_entropy` on the Cpu (its log-softmax at each label and that gradient fused, one
//! pass each) against the ops it stands for, `log_softmax`, `gather`, `mean_all` and `neg`: the
//! same loss and the same gradient, bit for bit, over awkward shapes, layouts and values.

use proptest::prelude::*;
use weft_core::{DType, Device, Tensor, Var};

/// The loss and the logits' gradient (after scaling the loss by `scale`), fused or composed; with
/// `transposed`, `x` is `[classes, rows]` and the loss reads its transpose (a variable is stored
/// contiguous, so the view is taken of it).
fn loss_and_grad(x: &Tensor, labels: &Tensor, scale: f32, fused: bool, transposed: bool) -> (Vec<u32>, Vec<u32>) {
    let v = Var::new(x.clone()).unwrap();
    let t = &if transposed { v.as_tensor().t().unwrap() } else { v.as_tensor().clone() };
    let labels = &if transposed { labels.reshape(&[t.dims()[0]]).unwrap() } else { labels.clone() };
    let loss = if fused {
        Tensor::cross_entropy(t, labels).unwrap()
    } else {
        let c = t.dims()[t.rank() - 1];
        let rows = t.numel() / c;
        let lsm = t.reshape(&[rows, c]).unwrap().log_softmax(-1).unwrap();
        lsm.gather(1, &labels.reshape(&[rows, 1]).unwrap()).unwrap().mean_all().unwrap().neg().unwrap()
    };
    let grads = loss.mul_scalar(scale).unwrap().backward().unwrap();
    let bits = |t: &Tensor| t.to_vec::<f32>().unwrap().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    (bits(&loss), bits(grads.get(&v).expect("a gradient for the logits")))
}

/// NaNs compare by being NaN (their payloads may differ), everything else by its bits.
fn same(a: &[u32], b: &[u32]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(&a, &b)| a == b || (f32::from_bits(a).is_nan() && f32::from_bits(b).is_nan()))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// Rows of 1 to 300 classes (past one pairwise block, and past one parallel task), logits
    /// read in rows or through a transposed view, labels u32 or i32, values from ordinary to a
    /// mask's -1e9 and non-finite, the loss scaled by any factor (a -0 among them).
    #[test]
    fn the_fused_loss_and_gradient_are_the_composed_ones_bits(
        batch in 1usize..5, steps in 1usize..20, classes in 1usize..300, transposed in any::<bool>(),
        signed in any::<bool>(), seed in 0u64..1000,
        special in proptest::option::of((0usize..100_000, 0usize..5)),
        scale in prop_oneof![-3.0f32..3.0, Just(-0.0f32), Just(1.0f32)],
    ) {
        let dev = Device::Cpu;
        let n = batch * steps * classes;
        let mut vals: Vec<f32> =
            (0..n).map(|i| (((i as u64 * 2654435761 + seed * 977) % 4001) as f32 / 200.0) - 10.0).collect();
        if let Some((at, kind)) = special {
            vals[at % n] = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -1e9, 88.0][kind];
        }
        let x = if transposed {
            // The same logical values, laid out with classes first (read back through a view).
            let mut t = vec![0f32; n];
            let rows = batch * steps;
            for r in 0..rows {
                for c in 0..classes {
                    t[c * rows + r] = vals[r * classes + c];
                }
            }
            Tensor::from_vec(t, &[classes, rows], &dev).unwrap()
        } else {
            Tensor::from_vec(vals, &[batch, steps, classes], &dev).unwrap()
        };
        let ids: Vec<u32> = (0..batch * steps).map(|i| ((i as u64 * 40503 + seed) % classes as u64) as u32).collect();
        let labels = Tensor::from_vec(ids, &[batch, steps], &dev).unwrap();
        let labels = if signed { labels.to_dtype(DType::I32).unwrap() } else { labels };
        let (fused, composed) =
            (loss_and_grad(&x, &labels, scale, true, transposed), loss_and_grad(&x, &labels, scale, false, transposed));
        prop_assert!(same(&fused.0, &composed.0), "loss {:?} vs {:?}", f32::from_bits(fused.0[0]), f32::from_bits(composed.0[0]));
        prop_assert!(same(&fused.1, &composed.1), "gradients differ ({}x{}x{}, transposed {})", batch, steps, classes, transposed);
    }
}

/// The fused op is the one that ran: the trace names it, not a log-softmax and a gather.
#[test]
fn the_cpu_runs_the_fused_node() {
    let dev = Device::Cpu;
    let x = Var::new(Tensor::rand(-1.0, 1.0, &[4, 6], 1, &dev).unwrap()).unwrap();
    let labels = Tensor::from_vec(vec![0u32, 5, 2, 3], &[4], &dev).unwrap();
    let (_, nodes) = weft_core::trace::trace(|| Tensor::cross_entropy(x.as_tensor(), &labels)).unwrap();
    let kinds: Vec<&str> = nodes.iter().map(|n| n.kind.as_str()).collect();
    assert!(kinds.contains(&"log_softmax_pick"), "{kinds:?}");
    assert!(!kinds.contains(&"log_softmax") && !kinds.contains(&"gather"), "{kinds:?}");
}

/// A label that is not a class is an `Err` naming it and its row, not a read past the row.
#[test]
fn a_label_past_the_classes_is_an_err_naming_it() {
    let dev = Device::Cpu;
    let x = Tensor::rand(-1.0, 1.0, &[3, 4], 1, &dev).unwrap();
    for (ids, bad, row) in [(vec![0i32, 4, 1], "label 4", "row 1"), (vec![0, 1, -1], "label -1", "row 2")] {
        let labels = Tensor::from_vec(ids, &[3], &dev).unwrap();
        let e = Tensor::cross_entropy(&x, &labels).unwrap_err().to_string();
        assert!(e.contains("cross_entropy") && e.contains(bad) && e.contains(row), "{e}");
    }
}

/// Shapes that the Cpu cuts into several tasks (many short rows, rows past a task's values, a
/// vocabulary's row per task): on one thread and on three, fused and composed give the same bits.
#[test]
fn every_thread_count_gives_the_composed_bits() {
    let dev = Device::Cpu;
    for (rows, classes) in [(3000, 10), (70, 300), (3, 20_000)] {
        let x = Tensor::rand(-8.0, 8.0, &[rows, classes], rows as u64, &dev).unwrap();
        let ids: Vec<u32> = (0..rows).map(|i| (i * 7919 % classes) as u32).collect();
        let labels = Tensor::from_vec(ids, &[rows], &dev).unwrap();
        let on = |threads: usize, fused: bool| {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            pool.install(|| loss_and_grad(&x, &labels, 1.5, fused, false))
        };
        let want = on(1, false);
        for threads in [1, 3] {
            let got = on(threads, true);
            assert!(same(&got.0, &want.0) && same(&got.1, &want.1), "{rows}x{classes} on {threads} threads");
        }
    }
}
