//! A sharded model has the single-device API and gives its answers: `fit` (shuffled batches,
//! a validation split, metrics), `evaluate`, `predict` and `summary`.

use weft_core::{Device, Tensor};
use weft_nn::layers::{Dense, Dropout};
use weft_nn::optim::Adam;
use weft_nn::{Activation, FitOptions, History, Loss, Metric, Model, Reduction, Sequential};
use weft_parallel::{AutoConfig, DeviceMesh, ShardedModel};

fn net() -> Sequential {
    Sequential::new().add(Dense::new(24).activation(Activation::Relu)).add(Dropout::new(0.1)).add(Dense::new(3))
}

const LOSS: Loss = Loss::SparseCategoricalCrossentropy { from_logits: true };

fn opts() -> FitOptions {
    FitOptions {
        epochs: 3,
        batch_size: 8,
        shuffle: true,
        seed: 7,
        validation_split: 0.2,
        verbose: false,
        ..Default::default()
    }
}

fn data() -> (Tensor, Tensor) {
    let x = Tensor::rand(-1.0, 1.0, &[40, 6], 11, &Device::Cpu).unwrap();
    let v = x.to_vec::<f32>().unwrap();
    let y: Vec<u32> = v
        .chunks(6)
        .map(|r| {
            if r[0] + r[1] > 0.3 {
                0
            } else if r[2] > 0.0 {
                1
            } else {
                2
            }
        })
        .collect();
    (x, Tensor::from_vec(y, &[40], &Device::Cpu).unwrap())
}

fn close(a: &[f32], b: &[f32], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}");
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() <= 1e-4 * x.abs().max(1.0), "{what}: {a:?} against {b:?}");
    }
}

fn same_history(a: &History, b: &History) {
    close(&a.loss, &b.loss, "loss");
    close(&a.val_loss, &b.val_loss, "val_loss");
    assert_eq!(a.metrics.keys().collect::<Vec<_>>(), b.metrics.keys().collect::<Vec<_>>());
    for (k, v) in &a.metrics {
        close(v, &b.metrics[k], k);
    }
    for (k, v) in &a.val_metrics {
        close(v, &b.val_metrics[k], k);
    }
}

#[test]
fn fit_evaluate_and_predict_match_one_device() {
    let (x, y) = data();
    let mut one = Model::new(net(), &Device::Cpu);
    one.compile(Adam::new(1e-2), LOSS, &[Metric::SparseCategoricalAccuracy]).unwrap();
    // A ShardedModel is built when it is made, as `build` builds a Model: the same weights.
    one.build(&[6]).unwrap();
    let h1 = one.fit(&x, &y, opts()).unwrap();
    let (l1, m1) = one.evaluate(&x, &y, 16).unwrap();
    let p1 = one.predict(&x, 16).unwrap().to_vec::<f32>().unwrap();
    let meshes = [
        DeviceMesh::cpus(2).unwrap(),
        DeviceMesh::cpus(3).unwrap(),
        DeviceMesh::cpus(4).unwrap().reshape(&[2, 2], &["data", "model"]).unwrap(),
    ];
    for mesh in meshes {
        let plan =
            AutoConfig::new().min_params(0).plan(&net(), &[8, 6], mesh.size("model"), mesh.size("data")).unwrap();
        let mut m = ShardedModel::new(net, &mesh, &plan).unwrap();
        m.compile(Adam::new(1e-2), LOSS, &[Metric::SparseCategoricalAccuracy]).unwrap();
        let h2 = m.fit(&x, &y, opts()).unwrap();
        same_history(&h1, &h2);
        let (l2, m2) = m.evaluate(&x, &y, 16).unwrap();
        close(&[l1], &[l2], "evaluate loss");
        close(&[m1[0].1], &[m2[0].1], "evaluate accuracy");
        close(&p1, &m.predict(&x, 16).unwrap().to_vec::<f32>().unwrap(), "predict");
        // Fewer rows than the data axis has ranks: every rank takes them all, counted once.
        let (x1, y1) = (x.narrow(0, 0, 1).unwrap(), y.narrow(0, 0, 1).unwrap());
        let (l1_one, _) = one.evaluate(&x1, &y1, 4).unwrap();
        close(&[l1_one], &[m.evaluate(&x1, &y1, 4).unwrap().0], "evaluate on one row");
        let summary = m.summary(&[6]).unwrap();
        assert!(
            summary.contains("Sharding plan") && summary.contains(&format!("Rank 0 of {}", mesh.len())),
            "{summary}"
        );
    }
}

/// Sample weights with each reduction, and `ignore_class`: on a data axis every rank divides its
/// weighted sum by the whole batch's divisor, so training equals one device.
#[test]
fn weighted_losses_train_split_as_on_one_device() {
    let (x, y) = data();
    let w = Tensor::rand(0.0, 2.0, &[40], 5, &Device::Cpu).unwrap();
    let losses = [
        LOSS,
        LOSS.with_reduction(Reduction::Sum),
        LOSS.with_reduction(Reduction::MeanWithSampleWeight),
        LOSS.with_ignore_class(2).unwrap(),
    ];
    for loss in losses {
        let opts = || FitOptions { sample_weight: Some(w.clone()), ..opts() };
        let mut one = Model::new(net(), &Device::Cpu);
        one.compile(Adam::new(1e-2), loss.clone(), &[]).unwrap();
        one.build(&[6]).unwrap();
        let h1 = one.fit(&x, &y, opts()).unwrap();
        let p1 = one.predict(&x, 16).unwrap().to_vec::<f32>().unwrap();
        for shape in [[2, 1], [2, 2]] {
            let mesh = DeviceMesh::cpus(shape[0] * shape[1]).unwrap().reshape(&shape, &["data", "model"]).unwrap();
            let plan =
                AutoConfig::new().min_params(0).plan(&net(), &[8, 6], mesh.size("model"), mesh.size("data")).unwrap();
            let mut m = ShardedModel::new(net, &mesh, &plan).unwrap();
            m.compile(Adam::new(1e-2), loss.clone(), &[]).unwrap();
            let h2 = m.fit(&x, &y, opts()).unwrap();
            same_history(&h1, &h2);
            close(&p1, &m.predict(&x, 16).unwrap().to_vec::<f32>().unwrap(), &format!("{loss:?}: predict"));
        }
    }
}

/// AUC's running counts (a histogram of thresholds, not a ratio) add up over a data axis: the
/// sharded History and evaluate give one device's figures.
#[test]
fn auc_reports_as_on_one_device() {
    use weft_nn::{Auc, AucCurve};
    let (x, y) = data();
    let y = y
        .to_dtype(weft_core::DType::F32)
        .unwrap()
        .cmp_scalar(weft_core::ops::BinaryOp::Eq, 0.0)
        .unwrap()
        .unsqueeze(-1)
        .unwrap();
    let bin = || {
        Sequential::new()
            .add(Dense::new(8).activation(Activation::Relu))
            .add(Dense::new(1).activation(Activation::Sigmoid))
    };
    let metrics = [Metric::Auc(Auc::new().curve(AucCurve::Pr).num_thresholds(50))];
    let bce = Loss::BinaryCrossentropy { from_logits: false };
    let mut one = Model::new(bin(), &Device::Cpu);
    one.compile(Adam::new(1e-2), bce.clone(), &metrics).unwrap();
    one.build(&[6]).unwrap();
    let h1 = one.fit(&x, &y, opts()).unwrap();
    let (_, m1) = one.evaluate(&x, &y, 16).unwrap();
    let mesh = DeviceMesh::cpus(4).unwrap().reshape(&[2, 2], &["data", "model"]).unwrap();
    let plan = AutoConfig::new().min_params(0).plan(&bin(), &[8, 6], 2, 2).unwrap();
    let mut m = ShardedModel::new(bin, &mesh, &plan).unwrap();
    m.compile(Adam::new(1e-2), bce, &metrics).unwrap();
    let h2 = m.fit(&x, &y, opts()).unwrap();
    same_history(&h1, &h2);
    let (_, m2) = m.evaluate(&x, &y, 16).unwrap();
    close(&[m1[0].1], &[m2[0].1], "evaluate auc");
    assert!(h1.metrics["auc"].iter().all(|a| (0.0..=1.0).contains(a)), "{:?}", h1.metrics);
    // A bad row of thresholds is refused at compile.
    let e = m.compile(Adam::new(1e-2), Loss::MeanSquaredError, &[Metric::Auc(Auc::new().num_thresholds(1))]);
    assert!(e.unwrap_err().to_string().contains("num_thresholds"));
}

/// Gradient accumulation, an EMA of the weights and weight decay that leaves the biases out:
/// every rank keeps its shards' accumulators and averages, and the result is one device's.
#[test]
fn optimizer_options_train_split_as_on_one_device() {
    use weft_nn::optim::AdamW;
    let (x, y) = data();
    let opt = || {
        AdamW::new(1e-2).weight_decay(0.1).exclude_from_weight_decay(&["bias"]).gradient_accumulation_steps(2).ema(0.8)
    };
    let mut one = Model::new(net(), &Device::Cpu);
    one.compile(opt(), LOSS, &[]).unwrap();
    one.build(&[6]).unwrap();
    let h1 = one.fit(&x, &y, opts()).unwrap();
    let p1 = one.predict(&x, 16).unwrap().to_vec::<f32>().unwrap();
    let mesh = DeviceMesh::cpus(4).unwrap().reshape(&[2, 2], &["data", "model"]).unwrap();
    let plan = AutoConfig::new().min_params(0).plan(&net(), &[8, 6], 2, 2).unwrap();
    let mut m = ShardedModel::new(net, &mesh, &plan).unwrap();
    // Global clipping would clip each call's gradients, not the accumulated mean: refused.
    let e = m.compile(opt().clip_global_norm(1.0), LOSS, &[]).unwrap_err().to_string();
    assert!(e.contains("gradient_accumulation_steps"), "{e}");
    m.compile(opt(), LOSS, &[]).unwrap();
    let h2 = m.fit(&x, &y, opts()).unwrap();
    same_history(&h1, &h2);
    close(&p1, &m.predict(&x, 16).unwrap().to_vec::<f32>().unwrap(), "predict");
}

#[test]
fn early_stopping_and_checkpoints_run_on_every_rank_as_on_one_device() {
    use weft_nn::callback::{Callback, Control, EarlyStopping, LambdaCallback, ModelCheckpoint};
    let (x, y) = data();
    let dir = tempfile::tempdir().unwrap();
    let callbacks = |file: &str| -> Vec<Box<dyn Callback>> {
        vec![
            Box::new(EarlyStopping::new("val_loss", 2).restore_best_weights(true)),
            Box::new(ModelCheckpoint::new(dir.path().join(file)).save_best_only("val_loss")),
        ]
    };
    let fit = |file: &str| FitOptions { epochs: 12, callbacks: callbacks(file), ..opts() };
    let mut one = Model::new(net(), &Device::Cpu);
    one.compile(Adam::new(5e-2), LOSS, &[]).unwrap();
    one.build(&[6]).unwrap();
    let h1 = one.fit(&x, &y, fit("one.safetensors")).unwrap();

    let plan = AutoConfig::new().min_params(0).plan(&net(), &[8, 6], 2, 1).unwrap();
    let mut m = ShardedModel::new(net, &DeviceMesh::cpus(2).unwrap(), &plan).unwrap();
    m.compile(Adam::new(5e-2), LOSS, &[]).unwrap();
    let h2 = m.fit(&x, &y, fit("two.safetensors")).unwrap();
    assert!(h1.loss.len() < 12, "early stopping should have stopped: {:?}", h1.val_loss);
    same_history(&h1, &h2);
    // The best weights were put back on every rank: predictions agree with one device.
    close(
        &one.predict(&x, 40).unwrap().to_vec::<f32>().unwrap(),
        &m.predict(&x, 40).unwrap().to_vec::<f32>().unwrap(),
        "restored",
    );
    // The sharded checkpoint holds whole tensors, equal to one device's.
    let (a, b) = (
        weft_nn::checkpoint::load(dir.path().join("one.safetensors")).unwrap(),
        weft_nn::checkpoint::load(dir.path().join("two.safetensors")).unwrap(),
    );
    assert_eq!(a.len(), b.len());
    for (k, (shape, v)) in &a {
        assert_eq!(shape, &b[k].0, "{k}");
        close(v, &b[k].1, k);
    }
    // A closure cannot be copied to every rank: refused up front, naming it.
    let mut o = opts();
    o.callbacks.push(Box::new(LambdaCallback(|_, _: &History| Ok(Control::Continue))));
    let e = m.fit(&x, &y, o).unwrap_err().to_string();
    assert!(e.contains("callback 0") && e.contains("copied"), "{e}");
}

/// Stops after `stop_after` epochs in the original only; its copies never stop.
struct StopsOnOneRank {
    stop_after: Option<usize>,
}

impl weft_nn::callback::Callback for StopsOnOneRank {
    fn on_epoch_end(&mut self, epoch: usize, _: &History, _: &Model) -> weft_core::Result<weft_nn::callback::Control> {
        Ok(if Some(epoch + 1) == self.stop_after {
            weft_nn::callback::Control::Stop
        } else {
            weft_nn::callback::Control::Continue
        })
    }
    fn clone_box(&self) -> Option<Box<dyn weft_nn::callback::Callback>> {
        Some(Box::new(StopsOnOneRank { stop_after: None }))
    }
}

#[test]
fn ranks_stop_together_when_only_one_rank_asks_to() {
    let (x, y) = data();
    let plan = AutoConfig::new().min_params(0).plan(&net(), &[8, 6], 2, 1).unwrap();
    let mut m = ShardedModel::new(net, &DeviceMesh::cpus(2).unwrap(), &plan).unwrap();
    m.compile(Adam::new(1e-2), LOSS, &[]).unwrap();
    let o = FitOptions { epochs: 5, callbacks: vec![Box::new(StopsOnOneRank { stop_after: Some(2) })], ..opts() };
    let h = m.fit(&x, &y, o).unwrap();
    assert_eq!(h.loss.len(), 2);
    let steps: Vec<u64> = m.ranks().iter().map(|r| r.optimizer().unwrap().iterations()).collect();
    assert_eq!(steps[0], steps[1]);
}

/// Keras' per-variable `clipnorm` would clip each shard by its own norm on a split model: refused
/// at compile, naming a split variable and the options that work.
#[test]
fn clip_norm_is_refused_on_a_split_model() {
    use weft_nn::optim::Adam;
    let net = || weft_nn::Sequential::new().add(weft_nn::layers::Dense::new(8)).add(weft_nn::layers::Dense::new(2));
    let mesh = weft_parallel::DeviceMesh::cpus(2).unwrap();
    let mut m = weft_parallel::ShardedModel::auto(net, &mesh, &[4, 3], &weft_parallel::AutoConfig::new().min_params(0))
        .unwrap();
    let err = m.compile(Adam::new(0.01).clip_norm(1.0), weft_nn::Loss::MeanSquaredError, &[]).unwrap_err().to_string();
    assert!(err.contains("clip_norm") && err.contains("clip_global_norm") && err.contains("sequential/dense"), "{err}");
    m.compile(Adam::new(0.01).clip_value(1.0), weft_nn::Loss::MeanSquaredError, &[]).unwrap();
}

/// The learning-rate callbacks, a CSV log, `initial_epoch` and `steps_per_epoch` run on every rank
/// of a sharded model as on one device: the same histories, rates and predictions.
#[test]
fn rate_callbacks_and_resumed_epochs_match_one_device() {
    use weft_nn::callback::{Callback, CsvLogger, LearningRateScheduler, ReduceLROnPlateau};
    let (x, y) = data();
    let dir = tempfile::tempdir().unwrap();
    let callbacks = |file: &str| -> Vec<Box<dyn Callback>> {
        vec![
            Box::new(LearningRateScheduler::new(|e, lr| if e == 2 { lr * 0.5 } else { lr })),
            Box::new(ReduceLROnPlateau::new("val_loss").factor(0.5).patience(1)),
            Box::new(CsvLogger::new(dir.path().join(file))),
        ]
    };
    let fit = |file: &str, initial_epoch| FitOptions {
        epochs: 5,
        initial_epoch,
        steps_per_epoch: Some(3),
        callbacks: callbacks(file),
        ..opts()
    };
    let mut one = Model::new(net(), &Device::Cpu);
    one.compile(Adam::new(5e-2), LOSS, &[]).unwrap();
    one.build(&[6]).unwrap();
    let plan = AutoConfig::new().min_params(0).plan(&net(), &[8, 6], 2, 1).unwrap();
    let mut m = ShardedModel::new(net, &DeviceMesh::cpus(2).unwrap(), &plan).unwrap();
    m.compile(Adam::new(5e-2), LOSS, &[]).unwrap();
    for initial in [0, 3] {
        let h1 = one.fit(&x, &y, fit("one.csv", initial)).unwrap();
        let h2 = m.fit(&x, &y, fit("two.csv", initial)).unwrap();
        same_history(&h1, &h2);
    }
    close(
        &one.predict(&x, 40).unwrap().to_vec::<f32>().unwrap(),
        &m.predict(&x, 40).unwrap().to_vec::<f32>().unwrap(),
        "after both runs",
    );
    let (a, b) = (
        std::fs::read_to_string(dir.path().join("one.csv")).unwrap(),
        std::fs::read_to_string(dir.path().join("two.csv")).unwrap(),
    );
    assert_eq!(a.lines().count(), 3, "the resumed run's epochs 3 and 4: {a}");
    assert_eq!(a.lines().next(), b.lines().next());
}

/// A metric of one's own is counted over every data rank's rows as on one device.
#[test]
fn a_custom_metric_reports_as_on_one_device() {
    let (x, y) = data();
    let top = || {
        Metric::custom("label_logit", |y_true, y_pred| {
            let ids = y_true.to_index("labels", Some(3))?.reshape(&[y_true.numel(), 1])?;
            y_pred.gather(1, &ids)
        })
    };
    let mut one = Model::new(net(), &Device::Cpu);
    one.compile(Adam::new(1e-2), LOSS, &[top()]).unwrap();
    one.build(&[6]).unwrap();
    let h1 = one.fit(&x, &y, opts()).unwrap();
    let mesh = DeviceMesh::cpus(4).unwrap().reshape(&[2, 2], &["data", "model"]).unwrap();
    let plan = AutoConfig::new().min_params(0).plan(&net(), &[8, 6], 2, 2).unwrap();
    let mut m = ShardedModel::new(net, &mesh, &plan).unwrap();
    m.compile(Adam::new(1e-2), LOSS, &[top()]).unwrap();
    let h2 = m.fit(&x, &y, opts()).unwrap();
    assert!(h1.metrics.contains_key("label_logit"));
    same_history(&h1, &h2);
}
