//! weft against Keras 3 (golden values in `data/keras/golden.json`, from `scripts/keras_golden.py`
//! with keras 3.15.1 on CPU JAX): losses and gradients (1e-5 forward, 1e-4 gradients), optimizers
//! after 3 steps (1e-5), schedules, layers, truncated initializers, `validation_split`, what
//! "accuracy" resolves to, metric values with ties, and `fit`: its History (Keras' flat keys and
//! values) and final weights, alone and under `EarlyStopping` (min_delta, patience, mode,
//! baseline, start_from_epoch, restored weights).

mod common;
use common::gpu;
use serde_json::Value;
use weft_core::conv::Padding;
use weft_core::{Device, GradStore, Tensor, Var};
use weft_nn::callback::{Callback, EarlyStopping, Mode, ReduceLROnPlateau};
use weft_nn::layers::{
    ActivationLayer, AttentionMasks, AveragePooling1D, AveragePooling2D, BatchNormalization, Bidirectional, Conv1D,
    Conv2D, Dense, EinsumDense, GRU, GlobalAveragePooling2D, GlobalMaxPooling1D, GlobalMaxPooling2D,
    GroupNormalization, LSTM, LayerNormalization, MaxPooling1D, MaxPooling2D, MergeMode, MultiHeadAttention,
    RMSNormalization, SimpleRNN,
};
use weft_nn::optim::{Adagrad, Adam, AdamW, Adamax, LearningRate, Lion, Nadam, Optimizer, RMSprop, Sgd};
use weft_nn::{
    Activation, Auc, AucCurve, Constraint, Ctx, FitOptions, Initializer, Layer, Loss, Metric, Model, Reduction,
    Regularizer, Sequential,
};

fn golden() -> Value {
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../data/keras/golden.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Flatten nested JSON arrays of numbers, with the shape.
fn tensor(v: &Value) -> Tensor {
    fn walk(v: &Value, depth: usize, shape: &mut Vec<usize>, out: &mut Vec<f32>) {
        match v {
            Value::Array(a) => {
                if shape.len() == depth {
                    shape.push(a.len());
                }
                a.iter().for_each(|x| walk(x, depth + 1, shape, out));
            }
            x => out.push(x.as_f64().unwrap() as f32),
        }
    }
    let (mut shape, mut vals) = (Vec::new(), Vec::new());
    walk(v, 0, &mut shape, &mut vals);
    Tensor::from_vec(vals, &shape, &Device::Cpu).unwrap()
}

fn close(got: &[f32], want: &[f32], tol: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tol * w.abs().max(1.0), "{what}: element {i}: weft {g}, Keras {w}");
    }
}

fn vals(t: &Tensor) -> Vec<f32> {
    t.to_vec::<f32>().unwrap()
}

/// The loss a golden case names.
fn loss_of(name: &str) -> Loss {
    match name {
        "mse" => Loss::MeanSquaredError,
        "bce_logits" => Loss::BinaryCrossentropy { from_logits: true },
        "bce_probs" => Loss::BinaryCrossentropy { from_logits: false },
        "cce_logits" => Loss::CategoricalCrossentropy { from_logits: true },
        "cce_probs" => Loss::CategoricalCrossentropy { from_logits: false },
        "scce_logits" => Loss::SparseCategoricalCrossentropy { from_logits: true },
        "scce_probs" => Loss::SparseCategoricalCrossentropy { from_logits: false },
        "huber_0.3" => Loss::Huber { delta: 0.3 },
        "hinge_signs" | "hinge_bits" => Loss::Hinge,
        // Every other by its Keras name.
        other => Loss::from_name(other).unwrap_or_else(|e| panic!("{e}")),
    }
}

#[test]
fn losses_and_their_gradients_match_keras() {
    let g = golden();
    let cases = g["losses"].as_array().unwrap().iter().chain(g["losses_more"].as_array().unwrap());
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let loss = loss_of(name);
        let p = Var::new(tensor(&case["y_pred"])).unwrap();
        let y = tensor(&case["y_true"]);
        let value = loss.compute(p.as_tensor(), &y).unwrap();
        close(&[value.to_scalar::<f32>().unwrap()], &[case["value"].as_f64().unwrap() as f32], 1e-5, name);
        let grad = value.backward().unwrap().get(&p).unwrap().clone();
        close(&vals(&grad), &vals(&tensor(&case["grad"])), 1e-4, &format!("{name} gradient"));
    }
}

#[test]
fn optimizers_after_three_steps_match_keras() {
    let g = &golden()["optimizers"];
    let grads: Vec<Tensor> = g["grads"].as_array().unwrap().iter().map(tensor).collect();
    for case in g["after_3"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let mut opt: Box<dyn Optimizer> = match name {
            "sgd" => Box::new(Sgd::new(0.1)),
            "sgd_momentum" => Box::new(Sgd::new(0.1).momentum(0.9)),
            "sgd_nesterov" => Box::new(Sgd::new(0.1).momentum(0.9).nesterov(true)),
            "adam" => Box::new(Adam::new(0.01)),
            "adamw" => Box::new(AdamW::new(0.01)),
            "rmsprop" => Box::new(RMSprop::new(0.01)),
            "adam_clip" => Box::new(Adam::new(0.01).clip_global_norm(0.5)),
            other => panic!("unknown case {other}"),
        };
        let w = Var::new(tensor(&g["w0"])).unwrap();
        let params = vec![("w".to_string(), w.clone())];
        for gr in &grads {
            let mut store = GradStore::default();
            store.insert(w.as_tensor(), gr.clone());
            opt.apply(&params, &store).unwrap();
        }
        close(&vals(w.as_tensor()), &vals(&tensor(&case["w"])), 1e-5, name);
    }
}

/// The optimizer a golden case of `optimizers_more` names.
fn optimizer_named(name: &str) -> Box<dyn Optimizer> {
    match name {
        "adagrad" => Box::new(Adagrad::new(0.1)),
        "adamax" => Box::new(Adamax::new(0.01)),
        "nadam" => Box::new(Nadam::new(0.01)),
        "lion" => Box::new(Lion::new(0.01)),
        "adam_amsgrad" => Box::new(Adam::new(0.01).amsgrad(true)),
        "adamw_amsgrad" => Box::new(AdamW::new(0.01).amsgrad(true)),
        "rmsprop_momentum" => Box::new(RMSprop::new(0.01).momentum(0.9)),
        "rmsprop_centered" => Box::new(RMSprop::new(0.01).centered(true)),
        "rmsprop_centered_momentum" => Box::new(RMSprop::new(0.01).momentum(0.5).centered(true)),
        "sgd_clipnorm" => Box::new(Sgd::new(0.1).clip_norm(0.5)),
        "adam_clipvalue" => Box::new(Adam::new(0.01).clip_value(0.2)),
        other => panic!("unknown case {other}"),
    }
}

/// Five steps of each further optimizer (and the clipping options) from gradients large enough
/// to clip, as Keras takes them; and Keras' default learning rates.
#[test]
fn more_optimizers_after_five_steps_match_keras() {
    let g = &golden()["optimizers_more"];
    let grads: Vec<Tensor> = g["grads"].as_array().unwrap().iter().map(tensor).collect();
    for case in g["after_5"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let mut opt = optimizer_named(name);
        opt.validate().unwrap();
        // On the Cpu, then (a fresh optimizer) on a GPU.
        let mut devices = vec![Device::Cpu];
        devices.extend(gpu());
        for (i, dev) in devices.iter().enumerate() {
            if i > 0 {
                opt = optimizer_named(name);
            }
            let w = Var::new(tensor(&g["w0"]).to_device(dev).unwrap()).unwrap();
            let params = vec![("w".to_string(), w.clone())];
            for gr in &grads {
                let mut store = GradStore::default();
                store.insert(w.as_tensor(), gr.to_device(dev).unwrap());
                opt.apply(&params, &store).unwrap();
            }
            close(&vals(w.as_tensor()), &vals(&tensor(&case["w"])), 1e-5, &format!("{name} on {dev:?}"));
        }
    }
    let lr = &g["default_lr"];
    let ours: [(&str, f32); 7] = [
        ("sgd", Sgd::default().learning_rate()),
        ("adam", Adam::default().learning_rate()),
        ("rmsprop", RMSprop::default().learning_rate()),
        ("adagrad", Adagrad::default().learning_rate()),
        ("adamax", Adamax::default().learning_rate()),
        ("nadam", Nadam::default().learning_rate()),
        ("lion", Lion::default().learning_rate()),
    ];
    for (name, v) in ours {
        close(&[v], &[lr[name].as_f64().unwrap() as f32], 1e-7, &format!("{name}'s default learning rate"));
    }
}

#[test]
fn clipping_options_are_exclusive_and_checked() {
    for (what, opt) in [
        ("two clippings", Adam::new(0.01).clip_norm(1.0).clip_value(0.5)),
        ("a negative clip_norm", Adam::new(0.01).clip_norm(-1.0)),
        ("a NaN clip_value", Adam::new(0.01).clip_value(f32::NAN)),
    ] {
        assert!(opt.validate().is_err(), "{what} was accepted");
    }
}

#[test]
fn schedules_match_keras() {
    let g = golden();
    let cases = g["schedules"].as_array().unwrap().iter().chain(g["schedules_more"].as_array().unwrap());
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let lr = match name {
            "polynomial" => {
                LearningRate::PolynomialDecay { initial: 0.1, decay_steps: 10, end: 1e-4, power: 1.0, cycle: false }
            }
            "polynomial_power_cycle" => {
                LearningRate::PolynomialDecay { initial: 0.1, decay_steps: 7, end: 0.01, power: 2.0, cycle: true }
            }
            "inverse_time" => {
                LearningRate::InverseTimeDecay { initial: 0.1, decay_steps: 5, rate: 0.5, staircase: false }
            }
            "inverse_time_staircase" => {
                LearningRate::InverseTimeDecay { initial: 0.1, decay_steps: 5, rate: 0.5, staircase: true }
            }
            "cosine_restarts" => LearningRate::CosineDecayRestarts {
                initial: 0.1,
                first_decay_steps: 4,
                t_mul: 2.0,
                m_mul: 1.0,
                alpha: 0.0,
            },
            "cosine_restarts_t1_m" => LearningRate::CosineDecayRestarts {
                initial: 0.1,
                first_decay_steps: 5,
                t_mul: 1.0,
                m_mul: 0.5,
                alpha: 0.1,
            },
            "piecewise" => LearningRate::PiecewiseConstant { boundaries: vec![3, 6], values: vec![1.0, 0.5, 0.1] },
            "exponential" => {
                LearningRate::ExponentialDecay { initial: 0.1, decay_steps: 4, rate: 0.5, staircase: false }
            }
            "exponential_staircase" => {
                LearningRate::ExponentialDecay { initial: 0.1, decay_steps: 4, rate: 0.5, staircase: true }
            }
            "cosine_warmup" => {
                LearningRate::CosineDecay { initial: 0.0, peak: 1.0, warmup_steps: 3, decay_steps: 6, alpha: 0.1 }
            }
            other => panic!("unknown case {other}"),
        };
        let want: Vec<f32> = case["values"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
        let got: Vec<f32> = (0..want.len() as u64).map(|s| lr.at(s)).collect();
        close(&got, &want, 1e-5, name);
    }
}

/// Run `layer` once to build it, then set its variables in order.
fn with_weights(layer: &dyn Layer, x: &Tensor, weights: &[Tensor]) {
    layer.call(x, &mut Ctx::inference()).unwrap();
    let vars = layer.variables();
    assert_eq!(vars.len(), weights.len());
    for ((p, v), w) in vars.iter().zip(weights) {
        assert_eq!(v.dims(), w.dims(), "{p}");
        v.set(w).unwrap();
    }
}

#[test]
fn layers_match_keras() {
    let g = &golden()["layers"];
    let x = tensor(&g["x"]);
    let ctx = &mut Ctx::inference();
    let dense = Dense::new(5);
    with_weights(&dense, &x, &[tensor(&g["dense"]["kernel"]), tensor(&g["dense"]["bias"])]);
    close(&vals(&dense.call(&x, ctx).unwrap()), &vals(&tensor(&g["dense"]["y"])), 1e-5, "Dense");
    let ln = LayerNormalization::new().epsilon(1e-3);
    with_weights(&ln, &x, &[tensor(&g["layer_norm"]["gamma"]), tensor(&g["layer_norm"]["beta"])]);
    close(&vals(&ln.call(&x, ctx).unwrap()), &vals(&tensor(&g["layer_norm"]["y"])), 1e-5, "LayerNormalization");
    let ein = EinsumDense::new("abc,cde->abde", &[3, 2, 6]).bias_axes("de");
    with_weights(&ein, &x, &[tensor(&g["einsum_dense"]["kernel"]), tensor(&g["einsum_dense"]["bias"])]);
    close(&vals(&ein.call(&x, ctx).unwrap()), &vals(&tensor(&g["einsum_dense"]["y"])), 1e-5, "EinsumDense");

    let m = &g["mha"];
    let (q, v, keep) = (tensor(&m["query"]), tensor(&m["value"]), tensor(&m["key_mask"]));
    let mha = MultiHeadAttention::new(2, 3);
    mha.attend(&q, &v, None, AttentionMasks::default(), ctx).unwrap();
    let weights: Vec<Tensor> = m["weights"].as_array().unwrap().iter().map(tensor).collect();
    for ((p, var), w) in mha.variables().iter().zip(&weights) {
        assert_eq!(var.dims(), w.dims(), "{p}");
        var.set(w).unwrap();
    }
    let masks = AttentionMasks { attention: Some(&keep), ..Default::default() };
    let (y, scores) = mha.attend(&q, &v, None, masks, ctx).unwrap();
    close(&vals(&y), &vals(&tensor(&m["y"])), 1e-5, "MultiHeadAttention output");
    close(&vals(&scores), &vals(&tensor(&m["scores"])), 1e-5, "MultiHeadAttention scores");
}

#[test]
fn truncated_initializers_have_keras_statistics() {
    let g = golden();
    for case in g["initializers"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let shape: Vec<usize> =
            case["shape"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect();
        let init = if name.starts_with("he") { Initializer::HeNormal } else { Initializer::GlorotNormal };
        let w = vals(&init.init(&shape, 3, &Device::Cpu).unwrap());
        let n = w.len() as f64;
        let mean = w.iter().map(|&v| v as f64).sum::<f64>() / n;
        let std = (w.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n).sqrt();
        let max = w.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
        let (k_std, k_max) = (case["std"].as_f64().unwrap(), case["max_abs"].as_f64().unwrap());
        assert!((std - k_std).abs() < 0.03 * k_std, "{name}: std {std}, Keras {k_std}");
        // Both truncate at two (corrected) standard deviations: the same limit, nearly reached.
        assert!(max <= k_max * 1.01 && max >= k_max * 0.97, "{name}: max {max}, Keras {k_max}");
    }
}

/// LeCun, variance scaling, orthogonal and constant initializers: weft's draws differ from
/// Keras' (another generator), their distributions must not: the std within 3%, the limit of
/// a uniform within 1%, and an orthogonal matrix's rows or columns orthonormal times the gain.
#[test]
fn more_initializers_have_keras_statistics() {
    use weft_nn::{Distribution, FanMode};
    let g = golden();
    for case in g["initializers_more"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let shape: Vec<usize> =
            case["shape"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect();
        let init = match name {
            "lecun_normal" => Initializer::LecunNormal,
            "lecun_uniform" => Initializer::LecunUniform,
            "variance_scaling_fan_out_uniform" => {
                Initializer::VarianceScaling { scale: 2.0, mode: FanMode::FanOut, distribution: Distribution::Uniform }
            }
            "variance_scaling_fan_avg_normal" => Initializer::VarianceScaling {
                scale: 0.5,
                mode: FanMode::FanAvg,
                distribution: Distribution::UntruncatedNormal,
            },
            "orthogonal_tall" => Initializer::Orthogonal(1.5),
            "orthogonal_wide" | "orthogonal_3d" => Initializer::Orthogonal(1.0),
            "constant" => Initializer::Constant(0.25),
            other => panic!("unknown case {other}"),
        };
        init.validate().unwrap();
        let t = init.init(&shape, 3, &Device::Cpu).unwrap();
        let w = vals(&t);
        let n = w.len() as f64;
        let mean = w.iter().map(|&v| v as f64).sum::<f64>() / n;
        let std = (w.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n).sqrt();
        let max = w.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
        let (k_std, k_max, k_mean) =
            (case["std"].as_f64().unwrap(), case["max_abs"].as_f64().unwrap(), case["mean"].as_f64().unwrap());
        assert!((std - k_std).abs() <= 0.03 * k_std + 1e-9, "{name}: std {std}, Keras {k_std}");
        assert!((mean - k_mean).abs() <= 0.1 * k_std + 1e-9, "{name}: mean {mean}, Keras {k_mean}");
        if name.contains("uniform") {
            assert!(max <= k_max * 1.0001 && max >= k_max * 0.99, "{name}: limit {max}, Keras {k_max}");
        }
        if let Initializer::Orthogonal(gain) = init {
            // Flattened to [rows, cols]: the smaller side's Gram matrix is gain^2 I.
            let cols = *shape.last().unwrap();
            let m = t.reshape(&[w.len() / cols, cols]).unwrap();
            let gram = if m.dims()[0] >= cols { m.t().unwrap().matmul(&m) } else { m.matmul(&m.t().unwrap()) };
            let gram = gram.unwrap();
            let k = gram.dims()[0];
            let gv = vals(&gram);
            for i in 0..k {
                for j in 0..k {
                    let want = if i == j { gain * gain } else { 0.0 };
                    assert!((gv[i * k + j] - want).abs() < 1e-4, "{name}: Gram ({i}, {j}) = {}", gv[i * k + j]);
                }
            }
            // A part of a split layer is cut from the whole.
            let part = init.init_part(&shape, shape.len() - 1, 2, 3, 3, &Device::Cpu).unwrap();
            assert_eq!(vals(&part), vals(&t.narrow(shape.len() as isize - 1, 2, 3).unwrap()), "{name}: a part");
        }
    }
    assert!(
        Initializer::VarianceScaling { scale: 0.0, mode: FanMode::FanIn, distribution: Distribution::Uniform }
            .validate()
            .is_err()
    );
    assert!(Initializer::Orthogonal(f32::NAN).validate().is_err());
}

#[test]
fn validation_split_takes_the_rows_keras_takes() {
    let g = golden();
    for case in g["validation_split"].as_array().unwrap() {
        let (n, s, train) = (
            case["n"].as_u64().unwrap() as usize,
            case["split"].as_f64().unwrap() as f32,
            case["train"].as_u64().unwrap() as usize,
        );
        let mut m = Model::new(Sequential::new().add(Dense::new(1)), &Device::Cpu);
        m.compile(Sgd::new(0.0), Loss::MeanSquaredError, &[]).unwrap();
        let xs = Tensor::from_vec((0..n).map(|i| i as f32 + 1.0).collect(), &[n, 1], &Device::Cpu).unwrap();
        let ys = Tensor::zeros(&[n, 1], &Device::Cpu).unwrap();
        let opts =
            FitOptions { validation_split: s, shuffle: false, batch_size: n, verbose: false, ..Default::default() };
        let h = m.fit(&xs, &ys, opts).unwrap();
        // With lr 0 nothing moves: the validation loss is that of the rows Keras holds out.
        let (held, _) =
            m.evaluate(xs.narrow(0, train, n - train).unwrap(), ys.narrow(0, train, n - train).unwrap(), n).unwrap();
        assert!((h.val_loss[0] - held).abs() <= 1e-6 * held.max(1.0), "n {n}, split {s}: {} vs {held}", h.val_loss[0]);
    }
}

#[test]
fn accuracy_resolves_as_keras_does() {
    let g = golden();
    for case in g["accuracy"].as_array().unwrap() {
        let shape = |k: &str| -> Vec<usize> {
            case[k].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect()
        };
        let (t, p) = (
            Tensor::zeros(&shape("y_true"), &Device::Cpu).unwrap(),
            Tensor::zeros(&shape("y_pred"), &Device::Cpu).unwrap(),
        );
        let want = match case["metric"].as_str().unwrap() {
            "BinaryAccuracy" => Metric::BinaryAccuracy,
            "SparseCategoricalAccuracy" => Metric::SparseCategoricalAccuracy,
            "CategoricalAccuracy" => Metric::CategoricalAccuracy,
            other => panic!("unknown metric {other}"),
        };
        assert_eq!(Metric::Accuracy.resolve(&p, &t), want, "y_true {:?}, y_pred {:?}", t.dims(), p.dims());
    }
}

#[test]
fn metric_values_match_keras_ties_included() {
    let g = golden();
    for case in g["metric_values"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let metric = match name {
            "binary_accuracy" => Metric::BinaryAccuracy,
            "categorical_accuracy" => Metric::CategoricalAccuracy,
            "sparse_categorical_accuracy" => Metric::SparseCategoricalAccuracy,
            other => panic!("unknown metric {other}"),
        };
        let (right, all) = metric.count(&tensor(&case["y_pred"]), &tensor(&case["y_true"])).unwrap();
        close(&[(right / all) as f32], &[case["value"].as_f64().unwrap() as f32], 1e-6, name);
    }
}

/// The EarlyStopping a golden case was run with, built from its Keras arguments.
fn early_stopping(es: &serde_json::Map<String, Value>) -> EarlyStopping {
    let num = |k: &str| es.get(k).and_then(Value::as_f64);
    let mut cb = EarlyStopping::new(es["monitor"].as_str().unwrap(), num("patience").unwrap_or(0.0) as usize);
    if let Some(d) = num("min_delta") {
        cb = cb.min_delta(d as f32);
    }
    if let Some(b) = num("baseline") {
        cb = cb.baseline(b as f32);
    }
    if let Some(e) = num("start_from_epoch") {
        cb = cb.start_from_epoch(e as usize);
    }
    if let Some(m) = es.get("mode").and_then(Value::as_str) {
        cb = cb.mode(match m {
            "max" => Mode::Max,
            "min" => Mode::Min,
            _ => Mode::Auto,
        });
    }
    cb.restore_best_weights(es.get("restore_best_weights").and_then(Value::as_bool).unwrap_or(false))
}

#[test]
fn fit_history_and_early_stopping_match_keras() {
    let g = &golden()["fit"];
    let (x, y) = (tensor(&g["x"]), tensor(&g["y"]));
    let init: Vec<Tensor> = g["weights"].as_array().unwrap().iter().map(tensor).collect();
    for case in g["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let net = Sequential::new().add(Dense::new(4).activation(Activation::Relu)).add(Dense::new(3));
        let mut m = Model::new(net, &Device::Cpu);
        m.compile(Adam::new(0.05), Loss::SparseCategoricalCrossentropy { from_logits: true }, &[Metric::Accuracy])
            .unwrap();
        m.build(&[1, 5]).unwrap();
        for ((p, v), w) in m.variables().iter().zip(&init) {
            assert_eq!(v.dims(), w.dims(), "{p}");
            v.set(w).unwrap();
        }
        let es = case["early_stopping"].as_object().unwrap();
        let callbacks: Vec<Box<dyn Callback>> =
            if es.is_empty() { Vec::new() } else { vec![Box::new(early_stopping(es))] };
        let opts = FitOptions {
            epochs: case["epochs"].as_u64().unwrap() as usize,
            batch_size: 3,
            validation_split: 0.2,
            shuffle: false,
            verbose: false,
            callbacks,
            ..Default::default()
        };
        let h = m.fit(&x, &y, opts).unwrap().flat();
        let want = case["history"].as_object().unwrap();
        let keys = |it: Vec<&String>| it.into_iter().cloned().collect::<Vec<_>>();
        assert_eq!(keys(h.keys().collect()), keys(want.keys().collect()), "{name}: history keys");
        for (k, series) in want {
            let series: Vec<f32> = series.as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
            close(&h[k], &series, 1e-5, &format!("{name}: {k}"));
        }
        for ((p, v), w) in m.variables().iter().zip(case["weights"].as_array().unwrap()) {
            close(&vals(v.as_tensor()), &vals(&tensor(w)), 1e-5, &format!("{name}: final {p}"));
        }
    }
}

#[test]
fn a_monitor_of_unknown_direction_is_an_err_before_training() {
    let mut m = Model::new(Sequential::new().add(Dense::new(1)), &Device::Cpu);
    m.compile(Sgd::new(0.1), Loss::MeanSquaredError, &[]).unwrap();
    let x = Tensor::ones(&[4, 2], &Device::Cpu).unwrap();
    let y = Tensor::zeros(&[4, 1], &Device::Cpu).unwrap();
    m.build(&[1, 2]).unwrap();
    let before = vals(m.variables()[0].1.as_tensor());
    let opts = FitOptions {
        verbose: false,
        callbacks: vec![Box::new(EarlyStopping::new("my_score", 1))],
        ..Default::default()
    };
    let err = m.fit(&x, &y, opts).unwrap_err().to_string();
    assert!(err.contains("\"my_score\"") && err.contains("Mode::Max"), "{err}");
    assert_eq!(vals(m.variables()[0].1.as_tensor()), before, "nothing trained");
    // Told the direction, the same monitor is accepted (and then missing from the history: an Err naming it).
    let opts = FitOptions {
        verbose: false,
        callbacks: vec![Box::new(EarlyStopping::new("my_score", 1).mode(Mode::Max))],
        ..Default::default()
    };
    let err = m.fit(&x, &y, opts).unwrap_err().to_string();
    assert!(err.contains("nothing called \"my_score\""), "{err}");
}

#[test]
fn activations_and_their_gradients_match_keras() {
    let g = &golden()["activations"];
    let (x, w) = (tensor(&g["x"]), tensor(&g["w"]));
    for case in g["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let act = match name {
            "relu" => Activation::Relu,
            // Keras' "gelu" is the exact form: weft's Gelu must be too.
            "gelu" => Activation::Gelu,
            "gelu_tanh" => Activation::GeluTanh,
            "tanh" => Activation::Tanh,
            "sigmoid" => Activation::Sigmoid,
            "silu" => Activation::Silu,
            "softmax" => Activation::Softmax,
            "leaky_relu_0.1" => Activation::LeakyRelu(0.1),
            "elu_0.5" => Activation::Elu(0.5),
            // Every other by its Keras name, with Keras' defaults.
            other => Activation::from_name(other).unwrap_or_else(|e| panic!("{e}")),
        };
        let v = Var::new(x.clone()).unwrap();
        let y = act.apply(v.as_tensor()).unwrap();
        close(&vals(&y), &vals(&tensor(&case["y"])), 1e-5, name);
        let grad = y.mul(&w).unwrap().sum_all().unwrap().backward().unwrap().get(&v).unwrap().clone();
        close(&vals(&grad), &vals(&tensor(&case["grad"])), 1e-4, &format!("{name} gradient"));
    }
}

/// Every golden loss and activation, value and gradient, on a GPU as on the Cpu.
#[test]
fn losses_and_activations_run_on_the_gpu_as_on_the_cpu() {
    let Some(dev) = gpu() else { return };
    let g = golden();
    let run = |f: &dyn Fn(&Tensor) -> weft_core::Result<Tensor>, x: &Tensor, d: &Device| -> (Vec<f32>, Vec<f32>) {
        let v = Var::new(x.to_device(d).unwrap()).unwrap();
        let y = f(v.as_tensor()).unwrap();
        let s = y.sum_all().unwrap();
        let grad = s.backward().unwrap().get(&v).unwrap().clone();
        (vals(&y), vals(&grad))
    };
    let cases = g["losses"].as_array().unwrap().iter().chain(g["losses_more"].as_array().unwrap());
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let loss = loss_of(name);
        let y = tensor(&case["y_true"]);
        let (yc, yg) = (y.clone(), y.to_device(&dev).unwrap());
        let (want, want_grad) = run(&|p| loss.compute(p, &yc), &tensor(&case["y_pred"]), &Device::Cpu);
        let (got, got_grad) = run(&|p| loss.compute(p, &yg), &tensor(&case["y_pred"]), &dev);
        close(&got, &want, 1e-5, &format!("{name} on {dev:?}"));
        close(&got_grad, &want_grad, 1e-4, &format!("{name} gradient on {dev:?}"));
    }
    let a = &g["activations"];
    for case in a["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let act = match name {
            "leaky_relu_0.1" => Activation::LeakyRelu(0.1),
            "elu_0.5" => Activation::Elu(0.5),
            "gelu_tanh" => Activation::GeluTanh,
            other => Activation::from_name(other).unwrap(),
        };
        let x = tensor(&a["x"]);
        let (want, want_grad) = run(&|t| act.apply(t), &x, &Device::Cpu);
        let (got, got_grad) = run(&|t| act.apply(t), &x, &dev);
        close(&got, &want, 1e-5, &format!("{name} on {dev:?}"));
        close(&got_grad, &want_grad, 1e-4, &format!("{name} gradient on {dev:?}"));
    }
}

/// Top-k (ties with the k-th count in), thresholded accuracy, precision, recall, MAE and MSE,
/// counted over two batches as an epoch counts them: as Keras.
#[test]
fn more_metrics_match_keras() {
    let g = golden();
    for case in g["metrics_more"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let metric = match name {
            "top_2" => Metric::TopKCategoricalAccuracy(2),
            "top_1" => Metric::TopKCategoricalAccuracy(1),
            "sparse_top_2" => Metric::SparseTopKCategoricalAccuracy(2),
            "binary_accuracy_0.6" => Metric::BinaryAccuracyAt(0.6),
            "precision" => Metric::Precision(0.5),
            "recall" => Metric::Recall(0.5),
            "precision_0.7" => Metric::Precision(0.7),
            "recall_0.7" => Metric::Recall(0.7),
            other => Metric::from_name(other).unwrap(),
        };
        let (mut hit, mut total) = (0f64, 0f64);
        let batches = case["y_true"].as_array().unwrap().iter().zip(case["y_pred"].as_array().unwrap());
        for (yt, yp) in batches {
            let (h, t) = metric.count(&tensor(yp), &tensor(yt)).unwrap();
            hit += h;
            total += t;
        }
        let got = (hit / total.max(1.0)) as f32;
        close(&[got], &[case["value"].as_f64().unwrap() as f32], 1e-6, name);
    }
}

/// The new metrics go through `fit` and `evaluate` like accuracy does: named as Keras names
/// them, their epoch value a running count (here checked against counting the whole set at once).
#[test]
fn the_new_metrics_report_in_fit_and_evaluate() {
    let g = &golden()["fit"];
    let (x, y) = (tensor(&g["x"]), tensor(&g["y"]));
    let net = Sequential::new().add(Dense::new(4).activation(Activation::Relu)).add(Dense::new(3));
    let mut m = Model::new(net, &Device::Cpu);
    let metrics = [Metric::SparseTopKCategoricalAccuracy(2), Metric::Accuracy];
    m.compile(Adam::new(0.05), Loss::SparseCategoricalCrossentropy { from_logits: true }, &metrics).unwrap();
    let opts = FitOptions { epochs: 2, batch_size: 3, verbose: false, ..Default::default() };
    let h = m.fit(&x, &y, opts).unwrap();
    assert_eq!(h.metrics.keys().collect::<Vec<_>>(), ["accuracy", "sparse_top_k_categorical_accuracy"]);
    let (_, figures) = m.evaluate(&x, &y, 4).unwrap();
    let top2 = figures.iter().find(|(n, _)| n == "sparse_top_k_categorical_accuracy").unwrap().1;
    let pred = m.predict(&x, 100).unwrap();
    let (hit, total) = Metric::SparseTopKCategoricalAccuracy(2).count(&pred, &y).unwrap();
    close(&[top2], &[(hit / total) as f32], 1e-6, "top-2 over batches of 4 against all at once");
}

/// ReduceLROnPlateau lowers the rate after the same epochs as Keras' (patience, min_delta,
/// cooldown, min_lr, mode), fed the same series of monitored values.
#[test]
fn reduce_lr_on_plateau_matches_keras() {
    let probe = Model::new(Sequential::new().add(Dense::new(1)), &Device::Cpu);
    for case in golden()["reduce_lr_on_plateau"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let monitor = case["monitor"].as_str().unwrap();
        let args = &case["args"];
        let mut cb = ReduceLROnPlateau::new(monitor);
        if let Some(v) = args["factor"].as_f64() {
            cb = cb.factor(v as f32);
        }
        if let Some(v) = args["patience"].as_u64() {
            cb = cb.patience(v as usize);
        }
        if let Some(v) = args["cooldown"].as_u64() {
            cb = cb.cooldown(v as usize);
        }
        if let Some(v) = args["min_delta"].as_f64() {
            cb = cb.min_delta(v as f32);
        }
        if let Some(v) = args["min_lr"].as_f64() {
            cb = cb.min_lr(v as f32);
        }
        match args["mode"].as_str() {
            Some("max") => cb = cb.mode(Mode::Max),
            Some("min") => cb = cb.mode(Mode::Min),
            _ => {}
        }
        cb.on_train_begin(&["loss".into(), monitor.into()], &probe).unwrap();
        let mut history = weft_nn::History::default();
        let mut lr = 0.1f32;
        let mut got = Vec::new();
        for (e, v) in case["values"].as_array().unwrap().iter().enumerate() {
            let v = v.as_f64().unwrap() as f32;
            history.loss.push(0.0);
            match monitor.strip_prefix("val_") {
                Some("loss") => history.val_loss.push(v),
                Some(m) => history.val_metrics.entry(m.to_string()).or_default().push(v),
                None => unreachable!(),
            }
            if let Some(new) = cb.learning_rate(e + 1, lr, &history).unwrap() {
                lr = new;
            }
            got.push(lr);
        }
        let want: Vec<f32> = case["lr_after"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
        close(&got, &want, 1e-6, name);
    }
}

/// The weft layer a conv golden case names, set as the Keras one was.
fn conv_layer(name: &str) -> Box<dyn Layer> {
    match name {
        "conv2d_valid" => Box::new(Conv2D::new(3, [2, 3])),
        "conv2d_same_strided" => Box::new(Conv2D::new(4, [3, 3]).strides([2, 2]).padding(Padding::Same)),
        "conv2d_same_dilated" => Box::new(Conv2D::new(2, [3, 3]).dilation_rate([2, 2]).padding(Padding::Same)),
        "conv2d_pointwise_relu_no_bias" => {
            Box::new(Conv2D::new(3, [1, 1]).activation(Activation::Relu).use_bias(false))
        }
        "conv1d_causal_dilated" => Box::new(Conv1D::new(3, 3).padding(Padding::Causal).dilation_rate(2)),
        "conv1d_same_strided" => Box::new(Conv1D::new(2, 4).strides(2).padding(Padding::Same)),
        "max_pool2d" => Box::new(MaxPooling2D::new([2, 2])),
        "max_pool2d_same" => Box::new(MaxPooling2D::new([3, 3]).strides([2, 2]).padding(Padding::Same)),
        "avg_pool2d_same" => Box::new(AveragePooling2D::new([3, 3]).strides([2, 2]).padding(Padding::Same)),
        "avg_pool2d_valid_strided" => Box::new(AveragePooling2D::new([2, 3]).strides([1, 2])),
        "max_pool1d" => Box::new(MaxPooling1D::new(2)),
        "avg_pool1d_same" => Box::new(AveragePooling1D::new(3).strides(1).padding(Padding::Same)),
        "global_avg_pool2d" => Box::new(GlobalAveragePooling2D::new()),
        "global_max_pool2d" => Box::new(GlobalMaxPooling2D::new()),
        "global_max_pool1d" => Box::new(GlobalMaxPooling1D::new()),
        "conv2d_groups_same" => Box::new(Conv2D::new(4, [3, 3]).groups(2).padding(Padding::Same)),
        "conv1d_groups_3" => Box::new(Conv1D::new(6, 2).groups(3).activation(Activation::Relu)),
        other => panic!("no weft layer for golden case {other}"),
    }
}

/// Conv1D/Conv2D and the pooling layers match Keras 3 forward (1e-5) and in the gradients of
/// the input and every variable (1e-4), on the Cpu and on the GPU.
#[test]
fn conv_and_pooling_layers_match_keras() {
    layers_with_gradients_match_keras("conv_layers", conv_layer);
}

/// The weft layer a normalization golden case names.
fn norm_layer(name: &str) -> Box<dyn Layer> {
    match name {
        "layer_norm_axis_1" => Box::new(LayerNormalization::new().axis(1)),
        "layer_norm_no_center" => Box::new(LayerNormalization::new().center(false).epsilon(1e-5)),
        "layer_norm_no_scale" => Box::new(LayerNormalization::new().scale(false)),
        "layer_norm_plain" => Box::new(LayerNormalization::new().center(false).scale(false)),
        "rms_norm" => Box::new(RMSNormalization::new()),
        "rms_norm_eps" => Box::new(RMSNormalization::new().epsilon(1e-3)),
        other => panic!("no weft layer for golden case {other}"),
    }
}

/// LayerNormalization's axis, center and scale, and RMSNormalization, match Keras 3 as the
/// convolutions do.
#[test]
fn normalization_options_match_keras() {
    layers_with_gradients_match_keras("norm_layers", norm_layer);
}

/// Every case of golden section `section`: the layer `make` names, given Keras' weights, gives
/// Keras' output and gradients on the Cpu and on the GPU.
fn layers_with_gradients_match_keras(section: &str, make: fn(&str) -> Box<dyn Layer>) {
    let cases = golden()[section].as_array().unwrap().clone();
    let mut devices = vec![Device::Cpu];
    devices.extend(gpu());
    for dev in &devices {
        for case in &cases {
            let name = format!("{} on {}", case["name"].as_str().unwrap(), dev.describe());
            let layer = make(case["name"].as_str().unwrap());
            let x = Var::new(tensor(&case["x"]).to_device(dev).unwrap()).unwrap();
            let weights: Vec<Tensor> =
                case["weights"].as_array().unwrap().iter().map(|w| tensor(w).to_device(dev).unwrap()).collect();
            with_weights(layer.as_ref(), x.as_tensor(), &weights);
            let y = layer.call(x.as_tensor(), &mut Ctx::inference()).unwrap();
            close(&vals(&y), &vals(&tensor(&case["y"])), 1e-5, &name);
            let w = tensor(&case["w"]).to_device(dev).unwrap();
            let grads = y.mul(&w).unwrap().sum_all().unwrap().backward().unwrap();
            close(&vals(grads.get(&x).unwrap()), &vals(&tensor(&case["grad_x"])), 1e-4, &format!("{name}: dx"));
            let want = case["grad_weights"].as_array().unwrap();
            for ((p, var), g) in layer.variables().iter().zip(want) {
                close(&vals(grads.get(var).unwrap()), &vals(&tensor(g)), 1e-4, &format!("{name}: d{p}"));
            }
        }
    }
}

/// Label smoothing of binary and categorical cross-entropy matches Keras 3 in value (1e-5) and
/// gradient (1e-4), on the Cpu and the GPU.
#[test]
fn label_smoothing_matches_keras() {
    let mut devices = vec![Device::Cpu];
    devices.extend(gpu());
    for dev in &devices {
        for case in golden()["label_smoothing"].as_array().unwrap() {
            let name = case["name"].as_str().unwrap();
            let (base, s) = name.rsplit_once('_').unwrap();
            let loss = match base {
                "bce_logits" => Loss::BinaryCrossentropy { from_logits: true },
                "bce_probs" => Loss::BinaryCrossentropy { from_logits: false },
                "cce_logits" => Loss::CategoricalCrossentropy { from_logits: true },
                "cce_probs" => Loss::CategoricalCrossentropy { from_logits: false },
                other => panic!("no loss for {other}"),
            }
            .with_label_smoothing(s.parse().unwrap())
            .unwrap();
            let p = Var::new(tensor(&case["y_pred"]).to_device(dev).unwrap()).unwrap();
            let value = loss.compute(p.as_tensor(), &tensor(&case["y_true"]).to_device(dev).unwrap()).unwrap();
            let what = format!("{name} on {}", dev.describe());
            close(&vals(&value), &[case["value"].as_f64().unwrap() as f32], 1e-5, &what);
            let grads = value.backward().unwrap();
            close(&vals(grads.get(&p).unwrap()), &vals(&tensor(&case["grad"])), 1e-4, &format!("{what}: gradient"));
        }
    }
    let e = Loss::SparseCategoricalCrossentropy { from_logits: true }.with_label_smoothing(0.1).unwrap_err();
    assert!(e.to_string().contains("SparseCategoricalCrossentropy"), "{e}");
    let e = Loss::CategoricalCrossentropy { from_logits: true }.with_label_smoothing(1.5).unwrap_err();
    assert!(e.to_string().contains("1.5"), "{e}");
}

/// Keras casts the labels of Precision and Recall to bool (0.9 is one positive, not 0.9), and
/// in_top_k never counts a NaN prediction at the label as in the top k.
#[test]
fn precision_labels_are_booleans_and_a_nan_is_never_in_the_top_k() {
    let p = Tensor::from_vec(vec![0.9f32, 0.8, 0.2, 0.7], &[4], &Device::Cpu).unwrap();
    let t = Tensor::from_vec(vec![0.9f32, 0.0, 2.0, 1.0], &[4], &Device::Cpu).unwrap();
    assert_eq!(Metric::Precision(0.5).count(&p, &t).unwrap(), (2.0, 3.0));
    assert_eq!(Metric::Recall(0.5).count(&p, &t).unwrap(), (2.0, 3.0));
    let p = Tensor::from_vec(vec![f32::NAN, 0.1, 0.2, 0.5, 0.1, 0.2], &[2, 3], &Device::Cpu).unwrap();
    let labels = Tensor::from_vec(vec![0u32, 0], &[2], &Device::Cpu).unwrap();
    assert_eq!(Metric::SparseTopKCategoricalAccuracy(2).count(&p, &labels).unwrap(), (1.0, 2.0));
}

fn batch_norm_layer(name: &str) -> BatchNormalization {
    match name {
        "batch_norm" => BatchNormalization::new(),
        "batch_norm_axis_1" => BatchNormalization::new().axis(1).momentum(0.9).epsilon(1e-5),
        "batch_norm_no_center" => BatchNormalization::new().center(false),
        "batch_norm_no_scale" => BatchNormalization::new().scale(false).momentum(0.5),
        "batch_norm_masked" => BatchNormalization::new().momentum(0.8),
        other => panic!("no weft layer for golden case {other}"),
    }
}

/// BatchNormalization matches Keras 3 on the Cpu and the GPU: at inference (moving statistics),
/// and in training (batch statistics, masked or not) in output, gradients and the moving
/// statistics it leaves, which change only when the step's updates are committed.
#[test]
fn batch_normalization_matches_keras() {
    let mut devices = vec![Device::Cpu];
    devices.extend(gpu());
    for dev in &devices {
        for case in golden()["batch_norm"].as_array().unwrap() {
            let name = format!("{} on {}", case["name"].as_str().unwrap(), dev.describe());
            let layer = batch_norm_layer(case["name"].as_str().unwrap());
            let x = Var::new(tensor(&case["x"]).to_device(dev).unwrap()).unwrap();
            let mask = case["mask"].as_array().map(|_| tensor(&case["mask"]).to_device(dev).unwrap());
            let weights: Vec<Tensor> =
                case["weights"].as_array().unwrap().iter().map(|w| tensor(w).to_device(dev).unwrap()).collect();
            with_weights(&layer, x.as_tensor(), &weights);
            let names: Vec<String> = layer.variables().into_iter().map(|(p, _)| p).collect();
            let keras_names: Vec<String> =
                case["weight_names"].as_array().unwrap().iter().map(|n| n.as_str().unwrap().to_string()).collect();
            assert_eq!(names, keras_names, "{name}: variables");
            let call = |ctx: &mut Ctx| {
                layer.call_with(std::slice::from_ref(x.as_tensor()), std::slice::from_ref(&mask), ctx).unwrap()
            };
            close(
                &vals(&call(&mut Ctx::inference())),
                &vals(&tensor(&case["y_infer"])),
                1e-5,
                &format!("{name}: inference"),
            );
            let mut ctx = Ctx::training(0);
            let y = call(&mut ctx);
            close(&vals(&y), &vals(&tensor(&case["y_train"])), 1e-5, &format!("{name}: training"));
            let w = tensor(&case["w"]).to_device(dev).unwrap();
            let grads = y.mul(&w).unwrap().sum_all().unwrap().backward().unwrap();
            close(&vals(grads.get(&x).unwrap()), &vals(&tensor(&case["grad_x"])), 1e-4, &format!("{name}: dx"));
            let vars = layer.variables();
            let (trainable, state): (Vec<_>, Vec<_>) = vars.iter().partition(|(_, v)| v.is_trainable());
            for ((p, var), g) in trainable.iter().zip(case["grad_weights"].as_array().unwrap()) {
                close(&vals(grads.get(var).unwrap()), &vals(&tensor(g)), 1e-4, &format!("{name}: d{p}"));
            }
            assert_eq!(state.len(), 2, "{name}: moving statistics");
            for ((p, var), before) in state.iter().zip(&weights[trainable.len()..]) {
                assert!(grads.get(var).is_none(), "{name}: {p} has a gradient");
                assert_eq!(vals(var), vals(before), "{name}: {p} changed before the commit");
            }
            ctx.commit_updates().unwrap();
            for ((p, var), want) in state.iter().zip(case["moving_after"].as_array().unwrap()) {
                close(&vals(var), &vals(&tensor(want)), 1e-5, &format!("{name}: {p} after the step"));
            }
        }
    }
}

fn group_norm_layer(name: &str) -> Box<dyn Layer> {
    match name {
        "group_norm_2" => Box::new(GroupNormalization::new(2)),
        "group_norm_instance" => Box::new(GroupNormalization::new(-1).epsilon(1e-5)),
        "group_norm_axis_1" => Box::new(GroupNormalization::new(2).axis(1).center(false)),
        "group_norm_4_of_8" => Box::new(GroupNormalization::new(4).scale(false)),
        "group_norm_image" => Box::new(GroupNormalization::new(3)),
        other => panic!("no weft layer for golden case {other}"),
    }
}

/// GroupNormalization (groups, instance normalization, another axis, center and scale) matches
/// Keras 3 as the other normalizations do.
#[test]
fn group_normalization_matches_keras() {
    layers_with_gradients_match_keras("group_norm", group_norm_layer);
}

/// `fit` through a BatchNormalization matches Keras 3: the losses of 2 epochs, every weight
/// after them (moving statistics included: updated once per applied step) and `predict` (which
/// normalizes by the moving statistics).
#[test]
fn fit_through_batch_normalization_matches_keras() {
    let g = &golden()["batch_norm_fit"];
    let f = &golden()["fit"];
    let (x, y) = (tensor(&f["x"]), tensor(&f["y"]));
    let net = Sequential::new()
        .add(Dense::new(4))
        .add(BatchNormalization::new().momentum(0.7))
        .add(ActivationLayer::new(Activation::Relu))
        .add(Dense::new(3));
    let mut m = Model::new(net, &Device::Cpu);
    m.compile(Sgd::new(0.1), Loss::SparseCategoricalCrossentropy { from_logits: true }, &[]).unwrap();
    m.build(&[1, 5]).unwrap();
    for ((p, v), w) in m.variables().iter().zip(g["weights"].as_array().unwrap()) {
        assert_eq!(v.dims(), tensor(w).dims(), "{p}");
        v.set(&tensor(w)).unwrap();
    }
    assert_eq!(m.trainable_variables().len(), 6);
    let opts = FitOptions { epochs: 2, batch_size: 4, shuffle: false, verbose: false, ..Default::default() };
    let h = m.fit(&x, &y, opts).unwrap();
    let want: Vec<f32> = g["loss"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
    close(&h.get("loss").unwrap(), &want, 1e-5, "loss");
    for ((p, v), w) in m.variables().iter().zip(g["after"].as_array().unwrap()) {
        close(&vals(v.as_tensor()), &vals(&tensor(w)), 1e-5, &format!("final {p}"));
    }
    close(&vals(&m.predict(&x, 4).unwrap()), &vals(&tensor(&g["predict"])), 1e-5, "predict");
}

fn weighted_loss(name: &str) -> Loss {
    let scce = |from_logits| Loss::SparseCategoricalCrossentropy { from_logits };
    match name {
        "mse_weighted" => Loss::MeanSquaredError,
        "mae_sum" | "mae_sum_weighted" => Loss::MeanAbsoluteError.with_reduction(Reduction::Sum),
        "huber_mean_with_sample_weight" => Loss::Huber { delta: 1.0 }.with_reduction(Reduction::MeanWithSampleWeight),
        "cce_logits_weighted" => Loss::CategoricalCrossentropy { from_logits: true },
        "scce_logits_ignore" | "scce_logits_ignore_weighted" => scce(true).with_ignore_class(-1).unwrap(),
        "scce_probs_ignore_sum" => scce(false).with_reduction(Reduction::Sum).with_ignore_class(2).unwrap(),
        "bce_logits_temporal_weighted" => Loss::BinaryCrossentropy { from_logits: true },
        "kld_mean_with_sample_weight" => Loss::KlDivergence.with_reduction(Reduction::MeanWithSampleWeight),
        other => panic!("no loss for {other}"),
    }
}

/// Sample weights (per sample and per time step), the three reductions and `ignore_class`
/// match Keras 3 in value (1e-5) and gradient (1e-4), on the Cpu and the GPU.
#[test]
fn weighted_losses_and_reductions_match_keras() {
    let mut devices = vec![Device::Cpu];
    devices.extend(gpu());
    for dev in &devices {
        for case in golden()["weighted_losses"].as_array().unwrap() {
            let name = case["name"].as_str().unwrap();
            let what = format!("{name} on {}", dev.describe());
            let loss = weighted_loss(name);
            let p = Var::new(tensor(&case["y_pred"]).to_device(dev).unwrap()).unwrap();
            let y = tensor(&case["y_true"]).to_device(dev).unwrap();
            let w = case["sample_weight"].as_array().map(|_| tensor(&case["sample_weight"]).to_device(dev).unwrap());
            let value = loss.compute_weighted(p.as_tensor(), &y, w.as_ref()).unwrap();
            close(&vals(&value), &[case["value"].as_f64().unwrap() as f32], 1e-5, &what);
            let grads = value.backward().unwrap();
            close(&vals(grads.get(&p).unwrap()), &vals(&tensor(&case["grad"])), 1e-4, &format!("{what}: gradient"));
        }
    }
}

/// `fit` with `sample_weight` (split by `validation_split`, so the validation loss is weighted)
/// and with `class_weight`: Keras 3's History and final weights.
#[test]
fn fit_with_sample_and_class_weights_matches_keras() {
    let f = &golden()["fit"];
    let g = &golden()["weighted_fit"];
    let (x, y) = (tensor(&f["x"]), tensor(&f["y"]));
    let init: Vec<Tensor> = f["weights"].as_array().unwrap().iter().map(tensor).collect();
    let class_weight: std::collections::HashMap<usize, f32> = g["class_weight"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.parse().unwrap(), v.as_f64().unwrap() as f32))
        .collect();
    for (case, sample, classes, split) in [
        ("sample_weighted", Some(tensor(&g["sample_weight"])), None, 0.2),
        ("class_weighted", None, Some(class_weight), 0.2),
    ] {
        let net = Sequential::new().add(Dense::new(4).activation(Activation::Relu)).add(Dense::new(3));
        let mut m = Model::new(net, &Device::Cpu);
        m.compile(Sgd::new(0.2), Loss::SparseCategoricalCrossentropy { from_logits: true }, &[Metric::Accuracy])
            .unwrap();
        m.build(&[1, 5]).unwrap();
        for ((_, v), w) in m.variables().iter().zip(&init) {
            v.set(w).unwrap();
        }
        let opts = FitOptions {
            epochs: 3,
            batch_size: 4,
            shuffle: false,
            verbose: false,
            validation_split: split,
            sample_weight: sample,
            class_weight: classes,
            ..Default::default()
        };
        let h = m.fit(&x, &y, opts).unwrap().flat();
        let want = g[case]["history"].as_object().unwrap();
        assert_eq!(h.len(), want.len(), "{case}: history keys {:?}", h.keys().collect::<Vec<_>>());
        for (k, series) in want {
            let series: Vec<f32> = series.as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
            close(&h[k], &series, 1e-5, &format!("{case}: {k}"));
        }
        for ((p, v), w) in m.variables().iter().zip(g[case]["weights"].as_array().unwrap()) {
            close(&vals(v.as_tensor()), &vals(&tensor(w)), 1e-5, &format!("{case}: final {p}"));
        }
    }
}

/// AUC accumulated over two batches (ROC and precision-recall, 200 and 51 thresholds, a
/// prediction exactly at a threshold, logits) matches Keras 3 within 1e-5, on the Cpu and the
/// GPU; a model's History reports it under `auc`.
#[test]
fn auc_matches_keras() {
    let mut devices = vec![Device::Cpu];
    devices.extend(gpu());
    for dev in &devices {
        for case in golden()["auc"].as_array().unwrap() {
            let name = case["name"].as_str().unwrap();
            let auc = match name {
                "roc" => Auc::new(),
                "pr" => Auc::new().curve(AucCurve::Pr),
                "roc_51" => Auc::new().num_thresholds(51),
                "pr_51" => Auc::new().num_thresholds(51).curve(AucCurve::Pr),
                "roc_logits" => Auc::new().from_logits(true),
                other => panic!("no AUC for {other}"),
            };
            let batches = case["batches"].as_array().unwrap();
            let cat = |key: &str| {
                let parts: Vec<Tensor> = batches.iter().map(|b| tensor(&b[key]).to_device(dev).unwrap()).collect();
                Tensor::concat(&parts, 0).unwrap()
            };
            let (p, y) = (cat("y_pred"), cat("y_true"));
            let want = case["value"].as_f64().unwrap() as f32;
            let what = format!("{name} on {}", dev.describe());
            // The counts of two batches add up to those of both at once.
            close(&[Metric::Auc(auc.clone()).value(&p, &y).unwrap()], &[want], 1e-5, &what);
            // Through evaluate, batch by batch as Keras took them (the first is the larger).
            let first = tensor(&batches[0]["y_pred"]).dims()[0];
            let mut m = Model::new(Sequential::new().add(ActivationLayer::new(Activation::Linear)), dev);
            m.compile(Sgd::new(0.1), Loss::MeanSquaredError, &[Metric::Auc(auc)]).unwrap();
            let (_, figures) = m.evaluate(&p, &y, first).unwrap();
            assert_eq!(figures[0].0, "auc");
            close(&[figures[0].1], &[want], 1e-5, &format!("{what}: evaluate"));
        }
    }
}

/// Each regularizer's penalty and each constraint's projection (over the default axis, another
/// axis, and the three axes of a convolution kernel) match Keras 3.
#[test]
fn regularizers_and_constraints_match_keras() {
    let g = &golden()["regularizers"];
    let w = tensor(&g["w"]);
    for (name, r) in [
        ("l1", Regularizer::L1(0.03)),
        ("l2", Regularizer::L2(0.02)),
        ("l1l2", Regularizer::L1L2 { l1: 0.01, l2: 0.05 }),
    ] {
        let got = r.penalty(&w).unwrap().to_scalar::<f32>().unwrap();
        close(&[got], &[g["penalties"][name].as_f64().unwrap() as f32], 1e-5, name);
    }
    let same = |t: Tensor| Ok(t);
    for (name, c) in [
        ("max_norm", Constraint::max_norm(0.9)),
        ("max_norm_axis_1", Constraint::MaxNorm { max_value: 0.7, axes: vec![1] }),
        ("non_neg", Constraint::NonNeg),
        ("unit_norm", Constraint::unit_norm()),
        ("min_max_norm", Constraint::MinMaxNorm { min_value: 0.5, max_value: 0.8, rate: 0.7, axes: vec![0] }),
    ] {
        close(&vals(&c.project(&w, &same).unwrap()), &vals(&tensor(&g["constraints"][name])), 1e-5, name);
    }
    let conv = Constraint::MaxNorm { max_value: 1.0, axes: vec![0, 1, 2] };
    close(
        &vals(&conv.project(&tensor(&g["conv_w"]), &same).unwrap()),
        &vals(&tensor(&g["conv_max_norm"])),
        1e-5,
        "conv",
    );
    assert!(Constraint::MaxNorm { max_value: 1.0, axes: vec![2] }.project(&w, &same).is_err());
    assert!(Regularizer::L2(-1.0).penalty(&w).is_err());
}

/// `fit` through layers with kernel, bias and activity regularizers and kernel and bias
/// constraints: Keras 3's History (losses with the penalties, on training and validation data)
/// and final weights (projected after every step).
#[test]
fn fit_with_regularizers_and_constraints_matches_keras() {
    let f = &golden()["fit"];
    let g = &golden()["regularized_fit"];
    let (x, y) = (tensor(&f["x"]), tensor(&f["y"]));
    let net = Sequential::new()
        .add(
            Dense::new(4)
                .activation(Activation::Relu)
                .kernel_regularizer(Regularizer::L2(0.01))
                .bias_regularizer(Regularizer::L1(0.02))
                .activity_regularizer(Regularizer::L2(0.005))
                .kernel_constraint(Constraint::max_norm(0.8)),
        )
        .add(
            Dense::new(3)
                .kernel_regularizer(Regularizer::L1L2 { l1: 0.01, l2: 0.02 })
                .bias_constraint(Constraint::NonNeg),
        );
    let mut m = Model::new(net, &Device::Cpu);
    m.compile(Sgd::new(0.2), Loss::SparseCategoricalCrossentropy { from_logits: true }, &[Metric::Accuracy]).unwrap();
    m.build(&[1, 5]).unwrap();
    for ((_, v), w) in m.variables().iter().zip(f["weights"].as_array().unwrap()) {
        v.set(&tensor(w)).unwrap();
    }
    let opts = FitOptions {
        epochs: 3,
        batch_size: 4,
        shuffle: false,
        verbose: false,
        validation_split: 0.2,
        ..Default::default()
    };
    let h = m.fit(&x, &y, opts).unwrap().flat();
    let want = g["history"].as_object().unwrap();
    assert_eq!(h.len(), want.len());
    for (k, series) in want {
        let series: Vec<f32> = series.as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
        close(&h[k], &series, 1e-5, k);
    }
    for ((p, v), w) in m.variables().iter().zip(g["weights"].as_array().unwrap()) {
        close(&vals(v.as_tensor()), &vals(&tensor(w)), 1e-5, &format!("final {p}"));
    }
}

/// Weight decay that leaves the biases out, gradient accumulation (with Adam's bias correction
/// and SGD's momentum counting updates) and an EMA of the weights (taken at the end of `fit`,
/// or every 2 updates): Keras 3's losses and final weights after 9 calls.
#[test]
fn optimizer_options_match_keras() {
    let f = &golden()["fit"];
    let (x, y) = (tensor(&f["x"]), tensor(&f["y"]));
    let cases: Vec<(&str, Box<dyn Optimizer>)> = vec![
        ("adamw_exclude_bias", Box::new(AdamW::new(0.05).weight_decay(0.3).exclude_from_weight_decay(&["bias"]))),
        ("adam_accumulate_2", Box::new(Adam::new(0.05).gradient_accumulation_steps(2))),
        ("sgd_accumulate_3", Box::new(Sgd::new(0.3).momentum(0.5).gradient_accumulation_steps(3))),
        ("sgd_ema", Box::new(Sgd::new(0.3).momentum(0.9).ema(0.9))),
        ("adam_ema_overwrite_2", Box::new(Adam::new(0.05).ema(0.8).ema_overwrite_frequency(2))),
        // A schedule reads the count of calls, not of updates (Keras' `_iterations`).
        (
            "adam_accumulate_2_schedule",
            Box::new(
                Adam::new(LearningRate::ExponentialDecay {
                    initial: 0.05,
                    decay_steps: 2,
                    rate: 0.5,
                    staircase: false,
                })
                .gradient_accumulation_steps(2),
            ),
        ),
    ];
    for (name, opt) in cases {
        let g = &golden()["optimizer_options"][name];
        let net = Sequential::new().add(Dense::new(4).activation(Activation::Relu)).add(Dense::new(3));
        let mut m = Model::new(net, &Device::Cpu);
        m.compile(opt, Loss::SparseCategoricalCrossentropy { from_logits: true }, &[]).unwrap();
        m.build(&[1, 5]).unwrap();
        for ((_, v), w) in m.variables().iter().zip(f["weights"].as_array().unwrap()) {
            v.set(&tensor(w)).unwrap();
        }
        let opts = FitOptions { epochs: 3, batch_size: 4, shuffle: false, verbose: false, ..Default::default() };
        let h = m.fit(&x, &y, opts).unwrap();
        let want: Vec<f32> = g["loss"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
        close(&h.loss, &want, 1e-5, &format!("{name}: loss"));
        for ((p, v), w) in m.variables().iter().zip(g["weights"].as_array().unwrap()) {
            close(&vals(v.as_tensor()), &vals(&tensor(w)), 1e-5, &format!("{name}: final {p}"));
        }
        assert_eq!(m.optimizer().unwrap().iterations(), 9, "{name}: calls");
    }
}

fn recurrent_layer(name: &str) -> Box<dyn Layer> {
    match name {
        "simple_rnn" => Box::new(SimpleRNN::new(3)),
        "simple_rnn_relu_seq_backwards" => {
            Box::new(SimpleRNN::new(3).activation(Activation::Relu).return_sequences(true).go_backwards(true))
        }
        "gru_seq" => Box::new(GRU::new(3).return_sequences(true)),
        "gru_reset_before" => Box::new(GRU::new(3).reset_after(false)),
        "gru_masked" => Box::new(GRU::new(4).return_sequences(true)),
        "lstm" | "lstm_masked_last" => Box::new(LSTM::new(3)),
        "lstm_masked_seq" => Box::new(LSTM::new(3).return_sequences(true)),
        "lstm_backwards_no_bias" => Box::new(LSTM::new(2).go_backwards(true).use_bias(false)),
        "bidirectional_lstm_seq_masked" => Box::new(Bidirectional::new(LSTM::new(3).return_sequences(true))),
        "bidirectional_gru_sum" => Box::new(Bidirectional::new(GRU::new(2)).merge_mode(MergeMode::Sum)),
        "bidirectional_simple_rnn_ave_seq" => {
            Box::new(Bidirectional::new(SimpleRNN::new(2).return_sequences(true)).merge_mode(MergeMode::Ave))
        }
        other => panic!("no weft layer for golden case {other}"),
    }
}

/// SimpleRNN, GRU (reset after and before) and LSTM, with sequences returned or not, run
/// backwards, without biases and over masked steps (padding at either end, a gap): Keras 3's
/// outputs and gradients, on the Cpu and the GPU.
#[test]
fn recurrent_layers_match_keras() {
    let mut devices = vec![Device::Cpu];
    devices.extend(gpu());
    for dev in &devices {
        for case in golden()["recurrent_layers"].as_array().unwrap() {
            let name = format!("{} on {}", case["name"].as_str().unwrap(), dev.describe());
            let layer = recurrent_layer(case["name"].as_str().unwrap());
            let x = Var::new(tensor(&case["x"]).to_device(dev).unwrap()).unwrap();
            let mask = case["mask"].as_array().map(|_| tensor(&case["mask"]).to_device(dev).unwrap());
            let weights: Vec<Tensor> =
                case["weights"].as_array().unwrap().iter().map(|w| tensor(w).to_device(dev).unwrap()).collect();
            with_weights(layer.as_ref(), x.as_tensor(), &weights);
            // The last segment: a Bidirectional's are under forward_<kind>/ and backward_<kind>/.
            let names: Vec<String> =
                layer.variables().into_iter().map(|(p, _)| p.rsplit('/').next().unwrap().to_string()).collect();
            let keras: Vec<String> =
                case["weight_names"].as_array().unwrap().iter().map(|n| n.as_str().unwrap().to_string()).collect();
            assert_eq!(names, keras, "{name}: variables");
            let y = layer
                .call_with(std::slice::from_ref(x.as_tensor()), std::slice::from_ref(&mask), &mut Ctx::inference())
                .unwrap();
            close(&vals(&y), &vals(&tensor(&case["y"])), 1e-5, &name);
            let w = tensor(&case["w"]).to_device(dev).unwrap();
            let grads = y.mul(&w).unwrap().sum_all().unwrap().backward().unwrap();
            close(&vals(grads.get(&x).unwrap()), &vals(&tensor(&case["grad_x"])), 1e-4, &format!("{name}: dx"));
            for ((p, var), g) in layer.variables().iter().zip(case["grad_weights"].as_array().unwrap()) {
                close(&vals(grads.get(var).unwrap()), &vals(&tensor(g)), 1e-4, &format!("{name}: d{p}"));
            }
        }
    }
}
