//! Each optimizer against its formula over several steps, schedules at chosen steps, and
//! clipping by global norm.

mod common;

use weft_core::{Device, GradStore, Tensor, Var};
use weft_nn::optim::{Adam, AdamW, LearningRate, Optimizer, RMSprop, Sgd};

/// Run `opt` for `grads.len()` steps on one scalar variable starting at `w0`, feeding the given
/// gradients; return the weight after each step.
fn run(mut opt: impl Optimizer, w0: f32, grads: &[f32]) -> Vec<f32> {
    let w = Var::new(Tensor::from_vec(vec![w0], &[1], &Device::Cpu).unwrap()).unwrap();
    let params = vec![("w".to_string(), w.clone())];
    grads
        .iter()
        .map(|&g| {
            let mut store = GradStore::default();
            store.insert(w.as_tensor(), Tensor::from_vec(vec![g], &[1], &Device::Cpu).unwrap());
            opt.apply(&params, &store).unwrap();
            w.to_vec::<f32>().unwrap()[0]
        })
        .collect()
}

fn close(got: &[f32], want: &[f32]) {
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() <= 1e-6 * w.abs().max(1.0), "got {got:?}, want {want:?}");
    }
}

const GRADS: [f32; 4] = [0.5, -1.0, 2.0, 0.25];

#[test]
fn sgd_plain_momentum_and_nesterov() {
    let (lr, m) = (0.1f32, 0.9f32);
    let mut w = 1.0f32;
    let plain: Vec<f32> = GRADS
        .iter()
        .map(|g| {
            w -= lr * g;
            w
        })
        .collect();
    close(&run(Sgd::new(lr), 1.0, &GRADS), &plain);

    let (mut w, mut v) = (1.0f32, 0.0f32);
    let mom: Vec<f32> = GRADS
        .iter()
        .map(|g| {
            v = m * v - lr * g;
            w += v;
            w
        })
        .collect();
    close(&run(Sgd::new(lr).momentum(m), 1.0, &GRADS), &mom);

    let (mut w, mut v) = (1.0f32, 0.0f32);
    let nest: Vec<f32> = GRADS
        .iter()
        .map(|g| {
            v = m * v - lr * g;
            w += m * v - lr * g;
            w
        })
        .collect();
    close(&run(Sgd::new(lr).momentum(m).nesterov(true), 1.0, &GRADS), &nest);
}

#[test]
fn adam_with_bias_correction() {
    let (lr, b1, b2, eps) = (0.01f32, 0.9f32, 0.999f32, 1e-7f32);
    let (mut w, mut m, mut v) = (1.0f32, 0.0f32, 0.0f32);
    let want: Vec<f32> = GRADS
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let t = (i + 1) as i32;
            m = b1 * m + (1.0 - b1) * g;
            v = b2 * v + (1.0 - b2) * g * g;
            let lr_t = lr * (1.0 - b2.powi(t)).sqrt() / (1.0 - b1.powi(t));
            w -= lr_t * m / (v.sqrt() + eps);
            w
        })
        .collect();
    close(&run(Adam::new(lr), 1.0, &GRADS), &want);
    // The first step moves by about lr whatever the gradient's size: the bias correction at work.
    assert!((1.0 - want[0] - lr).abs() < 1e-4);
}

#[test]
fn adamw_decays_weights_before_the_adam_step() {
    let (lr, wd) = (0.01f32, 0.1f32);
    let adam = run(Adam::new(lr), 1.0, &[0.0]);
    let adamw = run(AdamW::new(lr).weight_decay(wd), 1.0, &[0.0]);
    // With a zero gradient, Adam stays put and AdamW only decays.
    close(&adam, &[1.0]);
    close(&adamw, &[1.0 - lr * wd]);
}

#[test]
fn rmsprop_formula() {
    let (lr, rho, eps) = (0.01f32, 0.9f32, 1e-7f32);
    let (mut w, mut v) = (1.0f32, 0.0f32);
    let want: Vec<f32> = GRADS
        .iter()
        .map(|g| {
            v = rho * v + (1.0 - rho) * g * g;
            // Keras: epsilon inside the square root.
            w -= lr * g / (v + eps).sqrt();
            w
        })
        .collect();
    close(&run(RMSprop::new(lr), 1.0, &GRADS), &want);
}

#[test]
fn schedules_are_read_every_step() {
    let exp = LearningRate::ExponentialDecay { initial: 1.0, decay_steps: 10, rate: 0.5, staircase: false };
    assert!((exp.at(10) - 0.5).abs() < 1e-6 && (exp.at(5) - 0.5f32.sqrt()).abs() < 1e-6);
    let stair = LearningRate::ExponentialDecay { initial: 1.0, decay_steps: 10, rate: 0.5, staircase: true };
    assert_eq!((stair.at(9), stair.at(10), stair.at(25)), (1.0, 0.5, 0.25));
    let cos = LearningRate::CosineDecay { initial: 0.1, peak: 1.0, warmup_steps: 10, decay_steps: 20, alpha: 0.1 };
    assert!((cos.at(0) - 0.1).abs() < 1e-6 && (cos.at(5) - 0.55).abs() < 1e-6);
    assert!((cos.at(20) - (0.1 + 0.9 * 0.5)).abs() < 1e-6, "half way through the decay: {}", cos.at(20));
    assert!((cos.at(30) - 0.1).abs() < 1e-6 && (cos.at(1000) - 0.1).abs() < 1e-6);
    let pw = LearningRate::PiecewiseConstant { boundaries: vec![3, 6], values: vec![1.0, 0.5, 0.1] };
    // Keras' PiecewiseConstantDecay: a boundary step still takes the value before it.
    assert_eq!((pw.at(0), pw.at(3), pw.at(4), pw.at(6), pw.at(7), pw.at(100)), (1.0, 1.0, 0.5, 0.5, 0.1, 0.1));

    // The optimizer follows the schedule step by step.
    let sched = LearningRate::PiecewiseConstant { boundaries: vec![2], values: vec![0.1, 0.01] };
    let got = run(Sgd::new(sched), 0.0, &[1.0, 1.0, 1.0, 1.0]);
    close(&got, &[-0.1, -0.2, -0.3, -0.31]);
}

#[test]
fn clipping_scales_every_gradient_by_the_global_norm() {
    let a = Var::new(Tensor::zeros(&[2], &Device::Cpu).unwrap()).unwrap();
    let b = Var::new(Tensor::zeros(&[1], &Device::Cpu).unwrap()).unwrap();
    let params = vec![("a".to_string(), a.clone()), ("b".to_string(), b.clone())];
    let mut store = GradStore::default();
    // Global norm sqrt(3^2 + 4^2 + 12^2) = 13, clipped to 1.3: every gradient shrinks tenfold.
    store.insert(a.as_tensor(), Tensor::from_vec(vec![3.0f32, 4.0], &[2], &Device::Cpu).unwrap());
    store.insert(b.as_tensor(), Tensor::from_vec(vec![12.0f32], &[1], &Device::Cpu).unwrap());
    let mut opt = Sgd::new(1.0).clip_global_norm(1.3);
    opt.apply(&params, &store).unwrap();
    close(&a.to_vec::<f32>().unwrap(), &[-0.3, -0.4]);
    close(&b.to_vec::<f32>().unwrap(), &[-1.2]);
    assert_eq!(opt.iterations(), 1);
    assert!(opt.slot("a", "momentum").is_none());
}

/// A global norm within the bound (or at it) leaves every gradient exactly as it is, on every
/// device: the factor is chosen on the device, never worked out as clip / clip.
#[test]
fn clipping_within_the_bound_changes_no_gradient_by_a_bit() {
    for dev in [Some(Device::Cpu), common::gpu()].into_iter().flatten() {
        for clip in [13.0f32, 13.5, 1e6] {
            let run = |clip: Option<f32>| {
                let a = Var::new(Tensor::zeros(&[3], &dev).unwrap()).unwrap();
                let params = vec![("a".to_string(), a.clone())];
                let mut store = GradStore::default();
                // Norm sqrt(3^2 + 4^2 + 12^2) = 13.
                store.insert(a.as_tensor(), Tensor::from_vec(vec![3.0f32, 4.0, 12.0], &[3], &dev).unwrap());
                let opt = Sgd::new(0.37);
                let mut opt = match clip {
                    Some(c) => opt.clip_global_norm(c),
                    None => opt,
                };
                opt.apply(&params, &store).unwrap();
                a.to_vec::<f32>().unwrap()
            };
            assert_eq!(run(Some(clip)), run(None), "{dev:?}, clip {clip}");
        }
    }
}

#[test]
fn adam_state_is_held_in_named_slots_per_path() {
    let w = Var::new(Tensor::zeros(&[3], &Device::Cpu).unwrap()).unwrap();
    let params = vec![("dense/kernel".to_string(), w.clone())];
    let mut store = GradStore::default();
    store.insert(w.as_tensor(), Tensor::ones(&[3], &Device::Cpu).unwrap());
    let mut opt = Adam::new(0.1);
    opt.apply(&params, &store).unwrap();
    let m = opt.slot("dense/kernel", "m").expect("first moment").to_vec::<f32>().unwrap();
    close(&m, &[0.1, 0.1, 0.1]);
    assert!(opt.slot("dense/kernel", "v").is_some() && opt.slot("other", "m").is_none());
}

/// A run stopped part way through an accumulation (and its EMA) and resumed from a checkpoint
/// continues exactly as the run that never stopped.
#[test]
fn accumulation_and_ema_resume_from_a_checkpoint_mid_cycle() {
    use weft_nn::layers::Dense;
    use weft_nn::{Loss, Model, Sequential};
    let make = || {
        let mut m = Model::new(Sequential::new().add(Dense::new(2)), &Device::Cpu);
        let opt = Adam::new(0.05).gradient_accumulation_steps(3).ema(0.9);
        m.compile(opt, Loss::MeanSquaredError, &[]).unwrap();
        m.build(&[1, 3]).unwrap();
        m
    };
    let x = Tensor::rand(-1.0, 1.0, &[4, 3], 1, &Device::Cpu).unwrap();
    let y = Tensor::rand(-1.0, 1.0, &[4, 2], 2, &Device::Cpu).unwrap();
    let weights =
        |m: &Model| -> Vec<Vec<f32>> { m.variables().iter().map(|(_, v)| v.to_vec::<f32>().unwrap()).collect() };
    let mut whole = make();
    let mut first = make(); // the same initial weights: drawn from the same seed
    for _ in 0..2 {
        whole.train_on_batch(&x, &y).unwrap();
        first.train_on_batch(&x, &y).unwrap();
    }
    // Two calls of three: nothing applied yet, the gradients wait.
    assert_eq!(first.optimizer().unwrap().iterations(), 2);
    let dir = std::env::temp_dir().join(format!("weft-accumulate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    first.save_checkpoint(dir.join("c.safetensors")).unwrap();
    let mut resumed = make();
    resumed.load_checkpoint(dir.join("c.safetensors")).unwrap();
    for _ in 0..4 {
        whole.train_on_batch(&x, &y).unwrap();
        resumed.train_on_batch(&x, &y).unwrap();
    }
    assert_eq!(weights(&resumed), weights(&whole));
    let slots = |m: &Model| -> Vec<(String, String, Vec<f32>)> {
        m.optimizer().unwrap().slots().into_iter().map(|(p, n, t)| (p, n, t.to_vec::<f32>().unwrap())).collect()
    };
    assert_eq!(slots(&resumed), slots(&whole));
    assert!(
        slots(&whole).iter().any(|(_, n, _)| n == "ema")
            && slots(&whole).iter().any(|(_, n, _)| n == "accumulated_gradient")
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_accumulation_and_ema_settings_are_an_err_at_compile() {
    use weft_nn::layers::Dense;
    use weft_nn::{Loss, Model, Sequential};
    let mut m = Model::new(Sequential::new().add(Dense::new(2)), &Device::Cpu);
    let e = m.compile(Adam::new(0.1).gradient_accumulation_steps(1), Loss::MeanSquaredError, &[]).unwrap_err();
    assert!(e.to_string().contains("gradient_accumulation_steps"), "{e}");
    let e = m.compile(Adam::new(0.1).ema(1.5), Loss::MeanSquaredError, &[]).unwrap_err();
    assert!(e.to_string().contains("ema_momentum"), "{e}");
    let e = m.compile(Adam::new(0.1).ema_overwrite_frequency(0), Loss::MeanSquaredError, &[]).unwrap_err();
    assert!(e.to_string().contains("ema_overwrite_frequency"), "{e}");
}

/// Adam lists its own check of each gradient it used as given (0 when finite, NaN when not),
/// and none when the step clipped or accumulated the gradients first, since its check would
/// then be of other values than the ones the training step must refuse.
#[test]
fn adam_reports_the_gradient_checks_of_its_own_pass_only_for_gradients_used_as_given() {
    let dev = Device::Cpu;
    let a = Var::new(Tensor::ones(&[3, 5], &dev).unwrap()).unwrap();
    let b = Var::new(Tensor::ones(&[7], &dev).unwrap()).unwrap();
    let params = vec![("a".to_string(), a.clone()), ("b".to_string(), b.clone())];
    let checks = |mut opt: Box<dyn Optimizer>, bad: f32| {
        let mut store = GradStore::default();
        store.insert(a.as_tensor(), Tensor::full(0.5, &[3, 5], &dev).unwrap());
        let mut gb = vec![0.25f32; 7];
        gb[6] = bad;
        store.insert(b.as_tensor(), Tensor::from_vec(gb, &[7], &dev).unwrap());
        opt.apply(&params, &store).unwrap();
        let mut got: Vec<(String, f32)> =
            opt.gradient_checks().into_iter().map(|(p, t)| (p, t.to_vec::<f32>().unwrap()[0])).collect();
        got.sort_by(|x, y| x.0.cmp(&y.0));
        got
    };
    let got = checks(Box::new(Adam::new(1e-3)), 1.0);
    assert_eq!(got, vec![("a".to_string(), 0.0), ("b".to_string(), 0.0)]);
    for bad in [f32::INFINITY, f32::NEG_INFINITY, f32::NAN] {
        let got = checks(Box::new(AdamW::new(1e-3)), bad);
        assert_eq!(got[0], ("a".to_string(), 0.0));
        assert!(got[1].0 == "b" && got[1].1.is_nan(), "{bad}: {got:?}");
    }
    for opt in [
        Box::new(Adam::new(1e-3).clip_value(0.1)) as Box<dyn Optimizer>,
        Box::new(Adam::new(1e-3).clip_norm(0.1)),
        Box::new(Adam::new(1e-3).clip_global_norm(0.1)),
        Box::new(Adam::new(1e-3).gradient_accumulation_steps(2)),
        Box::new(Adam::new(1e-3).amsgrad(true)),
        Box::new(Sgd::new(0.1)),
    ] {
        assert!(checks(opt, 1.0).is_empty());
    }
}

/// AdamW over several steps against its formula (the weights decayed by `1 - lr * wd` first,
/// then Adam's step), with and without AMSGrad: the fused update decays the weights in its own
/// pass, AMSGrad's path decays them apart, and both must give the same numbers.
#[test]
fn adamw_over_several_steps_matches_its_formula_with_and_without_amsgrad() {
    let (lr, wd, b1, b2, eps) = (0.01f32, 0.1f32, 0.9f32, 0.999f32, 1e-7f32);
    for amsgrad in [false, true] {
        let (mut w, mut m, mut v, mut vhat) = (1.0f32, 0.0f32, 0.0f32, 0.0f32);
        let want: Vec<f32> = GRADS
            .iter()
            .enumerate()
            .map(|(i, g)| {
                let t = (i + 1) as i32;
                w *= 1.0 - lr * wd;
                m = b1 * m + (1.0 - b1) * g;
                v = b2 * v + (1.0 - b2) * g * g;
                vhat = vhat.max(v);
                let lr_t = lr * (1.0 - b2.powi(t)).sqrt() / (1.0 - b1.powi(t));
                w -= lr_t * m / ((if amsgrad { vhat } else { v }).sqrt() + eps);
                w
            })
            .collect();
        close(&run(AdamW::new(lr).weight_decay(wd).amsgrad(amsgrad), 1.0, &GRADS), &want);
        // A variable excluded by name is not decayed (the run's variable is called `w`).
        let plain = run(Adam::new(lr).amsgrad(amsgrad), 1.0, &GRADS);
        close(
            &run(AdamW::new(lr).weight_decay(wd).amsgrad(amsgrad).exclude_from_weight_decay(&["w"]), 1.0, &GRADS),
            &plain,
        );
    }
}

/// On the Cpu, Adam takes dense layers' weight gradients as products (`x^T @ dy`) and sums each
/// inside its own pass (`Tensor::adam_step_of_product`). Trained so, a model ends with the bits
/// of one whose Adam gets every gradient worked out (`clip_value(f32::MAX)` changes no finite
/// value, but makes Adam take the gradients as tensors): with and without weight decay, on rows
/// and on 3-D sequences; a batch summed in one chunk (64 rows) and in two (300 rows of a
/// 1024-wide layer), one too long to defer (the 48-wide layer's), and products of few rows.
#[test]
fn adam_fed_products_trains_to_the_bits_of_adam_fed_gradients() {
    use weft_nn::layers::Dense;
    use weft_nn::{Activation, Loss, Model, Sequential};
    let dev = Device::Cpu;
    let cases = [
        (0.0, vec![64, 128], 256),
        (0.05, vec![4, 16, 128], 256),
        (0.0, vec![300, 1024], 1024),
        (0.0, vec![8, 16], 64),
    ];
    for (wd, shape, width) in cases {
        let train = |opt: Adam| -> Vec<Vec<u32>> {
            let net = Sequential::new().add(Dense::new(width).activation(Activation::Relu)).add(Dense::new(48));
            let mut m = Model::new(net, &dev);
            m.compile(opt, Loss::MeanSquaredError, &[]).unwrap();
            m.build(&shape[1..]).unwrap();
            for (i, (_, v)) in m.variables().iter().enumerate() {
                v.set(&Tensor::rand(-0.5, 0.5, v.dims(), 10 + i as u64, &dev).unwrap()).unwrap();
            }
            let mut y_shape = shape.clone();
            *y_shape.last_mut().unwrap() = 48;
            for step in 0..3 {
                let x = Tensor::rand(-1.0, 1.0, &shape, 100 + step, &dev).unwrap();
                let y = Tensor::rand(-1.0, 1.0, &y_shape, 200 + step, &dev).unwrap();
                m.train_on_batch(&x, &y).unwrap();
            }
            let slots = m.optimizer().unwrap().slots().into_iter().map(|(_, _, t)| t);
            let all = m.variables().into_iter().map(|(_, v)| v.as_tensor().clone()).chain(slots);
            all.map(|t| t.to_vec::<f32>().unwrap().iter().map(|v| v.to_bits()).collect()).collect()
        };
        let adam = |clip: bool| {
            let a = Adam::new(1e-2).weight_decay(wd);
            if clip { a.clip_value(f32::MAX) } else { a }
        };
        assert!(adam(false).fuses_products() && !adam(true).fuses_products());
        assert!(!adam(false).amsgrad(true).fuses_products());
        let (fused, apart) = (train(adam(false)), train(adam(true)));
        assert_eq!(fused.len(), apart.len());
        for (i, (f, a)) in fused.iter().zip(&apart).enumerate() {
            assert!(f == a, "weight decay {wd}, input {shape:?}: array {i} differs");
        }
    }
}

/// A moment whose gradient stays 0 decays toward 0 by a factor a step (Adam's m by 0.9, RMSprop's
/// average by rho, SGD's velocity by its momentum): within a few hundred steps it would be
/// subnormal (kept, each would stop a few units above 0, where a tenth of it rounds back to a
/// unit), and every later update through it many times slower on x86. The optimizers' steps
/// flush such values to 0 (as XLA does): after 900 steps none is left in any slot or weight.
/// Outside an optimizer's step the same op keeps its subnormal result.
#[test]
fn moments_decaying_past_the_normal_floats_leave_no_subnormals() {
    let n = 50_000;
    let subnormal = |v: &f32| *v != 0.0 && v.abs() < f32::MIN_POSITIVE;
    let optimizers: Vec<(&str, Box<dyn Optimizer>, &str)> = vec![
        ("adam", Box::new(Adam::new(1e-3)), "m"),
        ("rmsprop", Box::new(RMSprop::new(1e-3)), "velocity"),
        ("sgd", Box::new(Sgd::new(1e-3).momentum(0.9)), "momentum"),
    ];
    for (name, mut opt, slot) in optimizers {
        let w = Var::new(Tensor::from_vec(vec![0.5f32; n], &[n], &Device::Cpu).unwrap()).unwrap();
        let params = vec![("w".to_string(), w.clone())];
        for step in 0..900 {
            let g = if step == 0 { 1e-2 } else { 0.0 };
            let mut store = GradStore::default();
            store.insert(w.as_tensor(), Tensor::from_vec(vec![g; n], &[n], &Device::Cpu).unwrap());
            opt.apply(&params, &store).unwrap();
        }
        let state: Vec<(String, String, Tensor)> = opt.slots();
        assert!(
            state.iter().any(|(_, s, _)| s == slot),
            "{name}: no slot {slot} in {:?}",
            state.iter().map(|s| &s.1).collect::<Vec<_>>()
        );
        if !cfg!(target_arch = "x86_64") {
            eprintln!("note: subnormals are flushed on x86-64 only; {name}'s slots not checked here");
            continue;
        }
        for (_, s, t) in state.iter().chain([(String::new(), "weight".to_string(), w.as_tensor().clone())].iter()) {
            let values = t.to_vec::<f32>().unwrap();
            let kept = values.iter().filter(|v| subnormal(v)).count();
            assert_eq!(kept, 0, "{name}: {kept} subnormal values in {s}");
        }
    }
    // (Large enough that weft's helper threads run pieces of it.)
    let tiny = Tensor::from_vec(vec![1.2e-38f32; 1 << 20], &[1 << 20], &Device::Cpu).unwrap();
    assert!(tiny.mul_scalar(0.9).unwrap().to_vec::<f32>().unwrap().iter().all(subnormal));
}
