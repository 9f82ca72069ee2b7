//! Bad input through the nn API: each case is a clear `Err` naming the problem (or the right
//! value), and a call that returns `Err` leaves weights, optimizer slots and counters unchanged.

mod common;
use common::gpu;
use weft_core::{Device, Error, Tensor};
use weft_nn::layers::{Dense, Dropout, Embedding, Flatten};
use weft_nn::optim::{Adam, LearningRate, Optimizer, RMSprop, Sgd};
use weft_nn::{Activation, FitOptions, Loss, Metric, Model, Sequential};

fn quiet() -> FitOptions {
    FitOptions { epochs: 1, batch_size: 4, verbose: false, ..Default::default() }
}

fn classifier() -> Model {
    let net = Sequential::new().add(Dense::new(6).activation(Activation::Relu)).add(Dense::new(3));
    let mut m = Model::new(net, &Device::Cpu);
    m.compile(Adam::new(0.01), Loss::SparseCategoricalCrossentropy { from_logits: true }, &[]).unwrap();
    m.build(&[4]).unwrap();
    m
}

fn x(n: usize, seed: u64) -> Tensor {
    Tensor::rand(-1.0, 1.0, &[n, 4], seed, &Device::Cpu).unwrap()
}

#[path = "common/state.rs"]
mod state;
use state::state;

fn err_text<T: std::fmt::Debug>(r: Result<T, Error>) -> String {
    match r {
        Ok(v) => panic!("expected an Err, got Ok({v:?})"),
        Err(e) => e.to_string(),
    }
}

/// Train one good step first so that slots exist, then check `bad` fails and changes nothing.
fn refused_without_change(bad: impl FnOnce(&mut Model) -> Result<String, Error>, expect: &[&str]) {
    let mut m = classifier();
    let y = Tensor::from_vec(vec![0u32, 1, 2, 1], &[4], &Device::Cpu).unwrap();
    m.train_on_batch(x(4, 1), &y).unwrap();
    let before = state(&m);
    let msg = err_text(bad(&mut m));
    for e in expect {
        assert!(msg.contains(e), "error {msg:?} should mention {e:?}");
    }
    assert_eq!(state(&m), before, "a failed call changed the model's state ({msg})");
}

#[test]
fn negative_integer_label_is_refused_and_nothing_changes() {
    refused_without_change(
        |m| {
            let y = Tensor::from_vec(vec![0i32, -1, 2, 1], &[4], &Device::Cpu)?;
            m.fit(x(4, 2), &y, quiet()).map(|h| format!("{h:?}"))
        },
        &["-1", "labels"],
    );
}

#[test]
fn fractional_and_negative_float_labels_are_refused() {
    for bad in [2.7f32, -3.0, 3.0, f32::NAN] {
        refused_without_change(
            |m| {
                let y = Tensor::from_vec(vec![0.0, bad, 1.0, 1.0], &[4], &Device::Cpu)?;
                m.train_on_batch(x(4, 2), &y).map(|l| l.to_string())
            },
            &["labels"],
        );
    }
}

#[test]
fn a_label_out_of_range_is_refused_by_evaluate_too() {
    let mut m = classifier();
    let y = Tensor::from_vec(vec![0u32, 1, 7, 1], &[4], &Device::Cpu).unwrap();
    let msg = err_text(m.evaluate(x(4, 3), &y, 2));
    assert!(msg.contains('7') && msg.contains('3'), "{msg}");
}

#[test]
fn embedding_ids_must_be_whole_numbers_in_range() {
    for bad in [-1.0f32, 2.5, 10.0] {
        let net = Sequential::new().add(Embedding::new(10, 4).named("tokens")).add(Flatten::new()).add(Dense::new(1));
        let m = Model::new(net, &Device::Cpu);
        let ids = Tensor::from_vec(vec![1.0, bad, 3.0], &[1, 3], &Device::Cpu).unwrap();
        let msg = err_text(m.predict(&ids, 1));
        assert!(msg.contains("tokens"), "the error should name the layer: {msg}");
    }
}

#[test]
fn a_step_whose_loss_is_not_finite_is_not_applied() {
    let mut m = classifier();
    let y = Tensor::from_vec(vec![0u32, 1, 2, 1], &[4], &Device::Cpu).unwrap();
    m.train_on_batch(x(4, 1), &y).unwrap();
    let before = state(&m);
    let mut bad = x(4, 2).to_vec::<f32>().unwrap();
    bad[5] = f32::INFINITY;
    let bx = Tensor::from_vec(bad, &[4, 4], &Device::Cpu).unwrap();
    let msg = err_text(m.fit(&bx, &y, quiet()));
    assert!(msg.contains("not applied"), "{msg}");
    assert_eq!(state(&m), before);
}

#[test]
fn a_metric_that_fails_leaves_the_step_unapplied() {
    let net = Sequential::new().add(Dense::new(3));
    let mut m = Model::new(net, &Device::Cpu);
    // MSE accepts [4, 3] targets; sparse accuracy does not: it fails after the loss.
    m.compile(Sgd::new(0.1), Loss::MeanSquaredError, &[Metric::SparseCategoricalAccuracy]).unwrap();
    m.build(&[4]).unwrap();
    let y = Tensor::rand(0.0, 1.0, &[4, 3], 9, &Device::Cpu).unwrap();
    let before = state(&m);
    err_text(m.fit(x(4, 1), &y, quiet()));
    assert_eq!(state(&m), before);
}

#[test]
fn empty_inputs_are_errors() {
    let mut m = classifier();
    let x0 = Tensor::zeros(&[0, 4], &Device::Cpu).unwrap();
    let y0 = Tensor::zeros(&[0], &Device::Cpu).unwrap();
    assert!(err_text(m.fit(&x0, &y0, quiet())).contains("no samples"));
    assert!(err_text(m.evaluate(&x0, &y0, 2)).contains("no samples"));
    assert!(err_text(m.predict(&x0, 2)).contains("no samples"));
    let y = Tensor::from_vec(vec![0u32, 1, 2, 1], &[4], &Device::Cpu).unwrap();
    assert!(err_text(m.evaluate(x(4, 1), &y, 0)).contains("batch_size"));
    assert!(err_text(m.predict(x(4, 1), 0)).contains("batch_size"));
    let msg = err_text(m.evaluate(x(5, 1), &y, 2));
    assert!(msg.contains("[5, 4]") && msg.contains("[4]"), "{msg}");
}

#[test]
fn validation_split_outside_zero_one_is_refused() {
    let y = Tensor::from_vec(vec![0u32, 1, 2, 1], &[4], &Device::Cpu).unwrap();
    for s in [1.0f32, -0.1, f32::NAN, 1.5] {
        let mut m = classifier();
        let msg = err_text(m.fit(x(4, 1), &y, FitOptions { validation_split: s, ..quiet() }));
        assert!(msg.contains("validation_split"), "{msg}");
    }
}

#[test]
fn validation_split_takes_rows_as_keras_does() {
    // Keras trains on floor(n * (1 - s)) rows: 10 rows at 0.25 train on 7 and validate on 3.
    let net = Sequential::new().add(Dense::new(1));
    let mut m = Model::new(net, &Device::Cpu);
    m.compile(Sgd::new(0.0), Loss::MeanSquaredError, &[]).unwrap();
    let xs = Tensor::from_vec((0..10).map(|i| i as f32).collect(), &[10, 1], &Device::Cpu).unwrap();
    let ys = Tensor::zeros(&[10, 1], &Device::Cpu).unwrap();
    let opts = FitOptions { validation_split: 0.25, shuffle: false, batch_size: 10, ..quiet() };
    let h = m.fit(&xs, &ys, opts).unwrap();
    // With lr 0 the weights stay put: the validation loss is that of rows 7, 8, 9 alone.
    let (val, _) = m.evaluate(xs.narrow(0, 7, 3).unwrap(), ys.narrow(0, 7, 3).unwrap(), 3).unwrap();
    assert!((h.val_loss[0] - val).abs() <= 1e-6 * val.abs().max(1.0), "{} vs {val}", h.val_loss[0]);
}

#[test]
fn bad_hyper_parameters_are_refused_at_compile() {
    let cases: Vec<(Box<dyn Optimizer>, &str)> = vec![
        (Box::new(Adam::new(-1e-3)), "learning rate"),
        (Box::new(Adam::new(f32::NAN)), "learning rate"),
        (Box::new(Adam::new(1e-3).betas(1.0, 0.999, 1e-7)), "beta_1"),
        (Box::new(Adam::new(1e-3).betas(0.9, 0.999, -1.0)), "epsilon"),
        (Box::new(Sgd::new(0.1).clip_global_norm(-1.0)), "clipping"),
        (Box::new(Sgd::new(0.1).momentum(1.5)), "momentum"),
        (Box::new(Sgd::new(0.1).weight_decay(f32::NAN)), "weight_decay"),
        (Box::new(RMSprop::new(0.1)), ""),
        (
            Box::new(Sgd::new(LearningRate::PiecewiseConstant {
                boundaries: vec![10, 5],
                values: vec![0.1, 0.2, 0.3],
            })),
            "increase",
        ),
        (Box::new(Sgd::new(LearningRate::PiecewiseConstant { boundaries: vec![], values: vec![] })), "one more value"),
        (
            Box::new(Sgd::new(LearningRate::ExponentialDecay {
                initial: 0.1,
                decay_steps: 0,
                rate: 0.5,
                staircase: false,
            })),
            "decay_steps",
        ),
    ];
    for (opt, expect) in cases {
        let mut m = Model::new(Sequential::new().add(Dense::new(1)), &Device::Cpu);
        let r = m.compile(opt, Loss::MeanSquaredError, &[]);
        if expect.is_empty() {
            r.unwrap();
        } else {
            let msg = err_text(r);
            assert!(msg.contains(expect), "{msg:?} should mention {expect:?}");
            assert!(m.optimizer().is_none(), "a refused compile must not install the optimizer");
        }
    }
}

#[test]
fn unnamed_layers_never_collide_with_named_ones() {
    let net = Sequential::new().add(Dense::new(3).named("dense_1")).add(Dense::new(3)).add(Dense::new(2));
    let mut m = Model::new(net, &Device::Cpu);
    m.compile(Sgd::new(0.1), Loss::MeanSquaredError, &[]).unwrap();
    m.build(&[4]).unwrap();
    let paths: Vec<String> = m.variables().into_iter().map(|(p, _)| p).collect();
    let unique: std::collections::HashSet<&String> = paths.iter().collect();
    assert_eq!(unique.len(), paths.len(), "{paths:?}");
    let dir = tempfile::tempdir().unwrap();
    m.save_weights(dir.path().join("w.safetensors")).unwrap();
}

#[test]
fn layers_named_alike_by_hand_are_refused() {
    let net =
        Sequential::new().add(Dense::new(3).named("same")).add(Dropout::new(0.1)).add(Dense::new(2).named("same"));
    let mut m = Model::new(net, &Device::Cpu);
    let msg = err_text(m.compile(Sgd::new(0.1), Loss::MeanSquaredError, &[]));
    assert!(msg.contains("sequential/same"), "{msg}");
    let msg = err_text(m.build(&[4]));
    assert!(msg.contains("same"), "{msg}");
    let msg = err_text(m.save_weights(std::env::temp_dir().join("weft-never-written.safetensors")));
    assert!(msg.contains("same"), "{msg}");
}

#[test]
fn accuracy_resolves_as_keras_does() {
    let probs = Tensor::from_vec(vec![0.1f32, 0.7, 0.2, 0.6, 0.3, 0.1], &[2, 3], &Device::Cpu).unwrap();
    // Integer labels against an arg-max: sparse.
    let labels = Tensor::from_vec(vec![1u32, 0], &[2], &Device::Cpu).unwrap();
    assert_eq!(Metric::Accuracy.count(&probs, &labels).unwrap(), (2.0, 2.0));
    let labels = Tensor::from_vec(vec![1.0f32, 2.0], &[2, 1], &Device::Cpu).unwrap();
    assert_eq!(Metric::Accuracy.count(&probs, &labels).unwrap(), (1.0, 2.0));
    // One-hot targets: categorical.
    let onehot = Tensor::from_vec(vec![0f32, 1., 0., 0., 0., 1.], &[2, 3], &Device::Cpu).unwrap();
    assert_eq!(Metric::Accuracy.count(&probs, &onehot).unwrap(), (1.0, 2.0));
    // Binary: strictly above 0.5, per value.
    let p = Tensor::from_vec(vec![0.5f32, 0.51, 0.2], &[3, 1], &Device::Cpu).unwrap();
    let t = Tensor::from_vec(vec![1.0f32, 1.0, 0.0], &[3, 1], &Device::Cpu).unwrap();
    assert_eq!(Metric::Accuracy.count(&p, &t).unwrap(), (2.0, 3.0));

    // A label that is no class is an error, not a miss.
    let bad = Tensor::from_vec(vec![1u32, 5], &[2], &Device::Cpu).unwrap();
    assert!(Metric::Accuracy.count(&probs, &bad).is_err());
}

#[test]
fn binary_cross_entropy_from_logits_is_exact_when_confidently_wrong() {
    let logits = Tensor::from_vec(vec![-40.0f32, 30.0], &[2, 1], &Device::Cpu).unwrap();
    let y = Tensor::from_vec(vec![1.0f32, 0.0], &[2, 1], &Device::Cpu).unwrap();
    let w = weft_core::Var::new(logits).unwrap();
    let loss = Loss::BinaryCrossentropy { from_logits: true }.compute(w.as_tensor(), &y).unwrap();
    // -log(sigmoid(-40)) = 40 (+ 4e-18) and -log(1 - sigmoid(30)) = 30: a mean of 35.
    assert!((loss.to_scalar::<f32>().unwrap() - 35.0).abs() < 1e-4);
    let g = loss.backward().unwrap().get(&w).unwrap().to_vec::<f32>().unwrap();
    // d/dx = (sigmoid(x) - y) / 2: -0.5 and 0.5, not 0.
    assert!((g[0] + 0.5).abs() < 1e-6 && (g[1] - 0.5).abs() < 1e-6, "{g:?}");
}

/// A GPU device (lavapipe included); `None` with a note on a machine without one, a failure
/// under `CI=true`.

#[test]
fn on_a_gpu_a_bad_label_or_id_fails_the_step_before_any_update() {
    let Some(dev) = gpu() else { return };
    let net = Sequential::new().add(Embedding::new(5, 4).named("ids")).add(Flatten::new()).add(Dense::new(3));
    let mut m = Model::new(net, &dev);
    m.compile(Adam::new(0.01), Loss::SparseCategoricalCrossentropy { from_logits: true }, &[]).unwrap();
    let ids = Tensor::from_vec(vec![0u32, 1, 2, 3, 4, 0], &[3, 2], &Device::Cpu).unwrap();
    let y = Tensor::from_vec(vec![0u32, 1, 2], &[3], &Device::Cpu).unwrap();
    m.train_on_batch(&ids, &y).unwrap();
    let before = state(&m);
    let bad_y = Tensor::from_vec(vec![0u32, 3, 2], &[3], &Device::Cpu).unwrap();
    let msg = err_text(m.train_on_batch(&ids, &bad_y));
    assert!(msg.contains("labels") && msg.contains("value 3"), "{msg}");
    assert_eq!(state(&m), before);
    let bad_ids = Tensor::from_vec(vec![0u32, 1, 2, 9, 4, 0], &[3, 2], &Device::Cpu).unwrap();
    let msg = err_text(m.train_on_batch(&bad_ids, &y));
    assert!(msg.contains("ids") && msg.contains('9'), "{msg}");
    assert_eq!(state(&m), before);
    // The model still trains after the refused steps.
    m.train_on_batch(&ids, &y).unwrap();
}

#[test]
fn a_bias_over_the_batch_axis_is_an_err_not_a_panic() {
    use weft_nn::layers::EinsumDense;
    use weft_nn::{Ctx, Layer};
    let x = Tensor::ones(&[2, 3, 4], &Device::Cpu).unwrap();
    for axes in ["a", "z"] {
        let l = EinsumDense::new("abc,cd->abd", &[3, 5]).bias_axes(axes).named("proj");
        let msg = err_text(l.call(&x, &mut Ctx::inference()).map(|t| t.dims().to_vec()));
        assert!(msg.contains(axes), "{msg}");
    }
}

#[test]
fn sparse_cross_entropy_of_a_scalar_or_zero_classes_is_an_err() {
    let y = Tensor::from_vec(vec![0u32], &[1], &Device::Cpu).unwrap();
    for pred in [Tensor::scalar(1.0, &Device::Cpu).unwrap(), Tensor::zeros(&[1, 0], &Device::Cpu).unwrap()] {
        let msg = err_text(
            Loss::SparseCategoricalCrossentropy { from_logits: true }.compute(&pred, &y).map(|t| t.dims().to_vec()),
        );
        assert!(msg.contains("class"), "{msg}");
    }
}

/// The step checks each gradient by its sum; a sum that overflows while every value is finite
/// must not refuse the step (the values are looked at then).
#[test]
fn huge_finite_gradients_whose_sum_overflows_still_train() {
    for dev in [Some(Device::Cpu), gpu()].into_iter().flatten() {
        let net = Sequential::new().add(Dense::new(1).use_bias(false).named("d"));
        let mut m = Model::new(net, &dev);
        m.compile(Sgd::new(1e-30), Loss::MeanSquaredError, &[]).unwrap();
        m.build(&[2]).unwrap();
        for (_, v) in m.variables() {
            v.set(&Tensor::zeros(v.dims(), &dev).unwrap()).unwrap();
        }
        // y = 0 against 1: dL/dy = -2, so the kernel's gradient is [-2e38, -2e38], whose sum
        // is -inf in f32.
        let x = Tensor::from_vec(vec![1e38f32, 1e38], &[1, 2], &dev).unwrap();
        let y = Tensor::ones(&[1, 1], &dev).unwrap();
        let loss = m.train_on_batch(&x, &y).unwrap();
        assert_eq!(loss, 1.0);
        let kernel = m.variables()[0].1.as_tensor().to_vec::<f32>().unwrap();
        assert!(kernel.iter().all(|&w| (w - 2e8).abs() < 1e3), "{kernel:?}");
    }
}

#[test]
fn a_non_finite_gradient_fails_the_step_before_any_update() {
    use weft_nn::layers::UnitNormalization;
    // sqrt at 0 has an infinite derivative: a gradient can be NaN or infinite while the loss is
    // finite.
    struct Sqrt(bool);
    impl weft_nn::Layer for Sqrt {
        fn call(&self, x: &Tensor, _: &mut weft_nn::Ctx) -> weft_core::Result<Tensor> {
            if self.0 { x.relu()?.sqrt() } else { x.sqrt() }
        }
        fn name(&self) -> &str {
            "sqrt"
        }
        fn set_name(&mut self, _: String) {}
        fn kind(&self) -> &'static str {
            "Sqrt"
        }
        fn variables(&self) -> Vec<(String, weft_core::Var)> {
            Vec::new()
        }
    }
    // Each optimizer (Adam checks the gradients in its own pass on the Cpu, except where it
    // clips them first; Sgd leaves the check to the step), each device.
    let optimizers: [fn() -> Box<dyn Optimizer>; 4] = [
        || Box::new(Sgd::new(0.1)),
        || Box::new(Adam::new(0.1)),
        || Box::new(Adam::new(0.1).clip_value(1.0)),
        || Box::new(Adam::new(0.1).gradient_accumulation_steps(2)),
    ];
    for (dev, opt) in [Some(Device::Cpu), gpu()].into_iter().flatten().flat_map(|d| optimizers.map(|o| (d.clone(), o)))
    {
        // relu then sqrt, normalized: NaN (an infinity times relu's 0 at 0). Plain sqrt of x @ 0
        // for x = [1, 1] against targets t: the kernel's gradient is -inf where t > 0 and +inf
        // where t < 0, so +inf alone, -inf alone, and both (whose sum is NaN).
        let cases: [(bool, [f32; 2], &str); 4] = [
            (true, [1.0, 1.0], "NaN"),
            (false, [-1.0, -1.0], "inf"),
            (false, [1.0, 1.0], "-inf"),
            (false, [1.0, -1.0], "inf"),
        ];
        for (relu, t, holds) in cases {
            let net = Sequential::new().add(Dense::new(2).named("d")).add(Sqrt(relu));
            let net = if relu { net.add(UnitNormalization::new()) } else { net };
            let mut m = Model::new(net, &dev);
            m.compile(opt(), Loss::MeanSquaredError, &[]).unwrap();
            m.build(&[2]).unwrap();
            for (_, v) in m.variables() {
                v.set(&Tensor::zeros(v.dims(), &dev).unwrap()).unwrap();
            }
            let before = state(&m);
            let y = Tensor::from_vec(t.to_vec(), &[1, 2], &dev).unwrap();
            let msg = err_text(m.train_on_batch(Tensor::ones(&[1, 2], &dev).unwrap(), &y));
            assert!(
                msg.contains(&format!("d/kernel holds {holds};")) && msg.contains("not applied"),
                "{dev:?} {t:?}: {msg}"
            );
            assert_eq!(state(&m), before);
        }
    }
    // A layer large enough that, on the Cpu, Adam sums its kernel's gradient inside its own pass
    // (never stored: `Tensor::adam_step_of_product`): refused and named the same way.
    for (relu, t, holds) in [(true, 1.0, "NaN"), (false, -1.0, "inf"), (false, 1.0, "-inf")] {
        let net = Sequential::new().add(Dense::new(256).named("d")).add(Sqrt(relu));
        let net = if relu { net.add(UnitNormalization::new()) } else { net };
        let mut m = Model::new(net, &Device::Cpu);
        m.compile(Adam::new(0.1), Loss::MeanSquaredError, &[]).unwrap();
        m.build(&[256]).unwrap();
        for (_, v) in m.variables() {
            v.set(&Tensor::zeros(v.dims(), &Device::Cpu).unwrap()).unwrap();
        }
        let before = state(&m);
        let y = Tensor::full(t, &[64, 256], &Device::Cpu).unwrap();
        let msg = err_text(m.train_on_batch(Tensor::ones(&[64, 256], &Device::Cpu).unwrap(), &y));
        assert!(msg.contains(&format!("d/kernel holds {holds};")) && msg.contains("not applied"), "{t}: {msg}");
        assert_eq!(state(&m), before);
    }
}

#[test]
fn a_placement_asked_for_a_rank_past_its_split_holds_nothing() {
    let p = weft_nn::tp::Placement::Shard { axis: 1, sizes: vec![2, 2] };
    assert_eq!(p.local_shape(&[3, 4], 1), vec![3, 2]);
    assert_eq!(p.local_shape(&[3, 4], 5), vec![3, 0]);
    assert_eq!(p.local_shape(&[3], 0), vec![3]);
    let full = Tensor::zeros(&[3, 4], &Device::Cpu).unwrap();
    assert!(p.local(&full, 5).is_err());
}
