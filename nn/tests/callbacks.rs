//! EarlyStopping (with restored weights), ModelCheckpoint, closure callbacks, the learning-rate
//! callbacks, CsvLogger, TerminateOnNaN, and fit's initial_epoch and steps_per_epoch.

use std::sync::{Arc, Mutex};
use weft_core::{Device, Result, Tensor};
use weft_nn::callback::{
    Callback, Control, CsvLogger, EarlyStopping, LambdaCallback, LearningRateScheduler, ModelCheckpoint,
    ReduceLROnPlateau, TerminateOnNaN,
};
use weft_nn::layers::Dense;
use weft_nn::optim::{Adam, LearningRate, Sgd};
use weft_nn::{FitOptions, History, Loss, Metric, Model, Sequential};

fn data() -> (Tensor, Tensor) {
    let x = Tensor::rand(-1.0, 1.0, &[16, 1], 3, &Device::Cpu).unwrap();
    (x.clone(), x)
}

fn model(lr: f32) -> Model {
    let mut m = Model::new(Sequential::new().add(Dense::new(1)), &Device::Cpu);
    m.compile(Sgd::new(lr), Loss::MeanSquaredError, &[]).unwrap();
    m
}

/// Records the weights after every epoch.
struct Snapshots(Arc<Mutex<Vec<Vec<Vec<f32>>>>>);

impl Callback for Snapshots {
    fn on_epoch_end(&mut self, _epoch: usize, _h: &History, model: &Model) -> Result<Control> {
        let w = model.variables().iter().map(|(_, v)| v.to_vec::<f32>()).collect::<Result<Vec<_>>>()?;
        self.0.lock().unwrap().push(w);
        Ok(Control::Continue)
    }
}

#[test]
fn early_stopping_stops_and_restores_the_best_weights() {
    // A learning rate far too high: the loss grows every epoch, so epoch 0 stays the best.
    let mut m = model(5.0);
    let (x, y) = data();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let opts = FitOptions {
        epochs: 10,
        batch_size: 8,
        shuffle: false,
        verbose: false,
        callbacks: vec![
            Box::new(Snapshots(seen.clone())),
            Box::new(EarlyStopping::new("loss", 2).restore_best_weights(true)),
        ],
        ..Default::default()
    };
    let h = m.fit(&x, &y, opts).unwrap();
    assert_eq!(h.loss.len(), 3, "stopped after two epochs without improvement: {:?}", h.loss);
    assert!(h.loss[2] > h.loss[1] && h.loss[1] > h.loss[0]);
    let now: Vec<Vec<f32>> = m.variables().iter().map(|(_, v)| v.to_vec::<f32>().unwrap()).collect();
    let snaps = seen.lock().unwrap();
    assert_eq!(now, snaps[0], "the weights of epoch 0 are back");
    assert_ne!(now, snaps[2]);
}

#[test]
fn model_checkpoint_saves_the_best_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("best.safetensors");
    let mut m = model(0.1);
    let (x, y) = data();
    let opts = FitOptions {
        epochs: 3,
        batch_size: 4,
        verbose: false,
        callbacks: vec![Box::new(ModelCheckpoint::new(&path).save_best_only("loss"))],
        ..Default::default()
    };
    m.fit(&x, &y, opts).unwrap();
    let other = model(0.1);
    other.build(&[1]).unwrap();
    other.load_weights(&path).unwrap();
    let a: Vec<Vec<f32>> = m.variables().iter().map(|(_, v)| v.to_vec::<f32>().unwrap()).collect();
    let b: Vec<Vec<f32>> = other.variables().iter().map(|(_, v)| v.to_vec::<f32>().unwrap()).collect();
    assert_eq!(a, b, "the loss fell every epoch, so the last epoch is the best");
}

#[test]
fn a_closure_can_stop_training_and_a_missing_monitor_is_an_err() {
    let mut m = model(0.1);
    let (x, y) = data();
    let stop_after_two =
        LambdaCallback(|epoch, _h: &History| Ok(if epoch == 1 { Control::Stop } else { Control::Continue }));
    let opts =
        FitOptions { epochs: 10, verbose: false, callbacks: vec![Box::new(stop_after_two)], ..Default::default() };
    assert_eq!(m.fit(&x, &y, opts).unwrap().loss.len(), 2);
    let opts = FitOptions {
        epochs: 2,
        verbose: false,
        callbacks: vec![Box::new(EarlyStopping::new("val_loss", 1))],
        ..Default::default()
    };
    let err = m.fit(&x, &y, opts).unwrap_err().to_string();
    assert!(err.contains("val_loss"), "{err}");
}

fn weights(m: &Model) -> Vec<Vec<f32>> {
    m.variables().iter().map(|(_, v)| v.to_vec::<f32>().unwrap()).collect()
}

fn quiet(epochs: usize, batch_size: usize, callbacks: Vec<Box<dyn Callback>>) -> FitOptions {
    FitOptions { epochs, batch_size, shuffle: false, verbose: false, callbacks, ..Default::default() }
}

#[test]
fn a_scheduler_sets_each_epochs_rate_as_a_recompiled_sgd_would() {
    let (x, y) = data();
    let rate = |epoch: usize, _lr: f32| 0.2 * 0.5f32.powi(epoch as i32);
    let mut a = model(0.7);
    a.fit(&x, &y, quiet(3, 8, vec![Box::new(LearningRateScheduler::new(rate))])).unwrap();
    assert_eq!(a.optimizer().unwrap().learning_rate(), rate(2, 0.0));
    // The same epochs, each compiled afresh at its rate (SGD keeps no state across them).
    let mut b = model(0.7);
    for e in 0..3 {
        b.compile(Sgd::new(rate(e, 0.0)), Loss::MeanSquaredError, &[]).unwrap();
        b.fit(&x, &y, quiet(1, 8, vec![])).unwrap();
    }
    assert_eq!(weights(&a), weights(&b));
    // A schedule's rate is not set by hand, as in Keras: fit says so and changes nothing.
    let mut c = Model::new(Sequential::new().add(weft_nn::layers::Dense::new(1)), &Device::Cpu);
    let decay = LearningRate::ExponentialDecay { initial: 0.1, decay_steps: 10, rate: 0.5, staircase: false };
    c.compile(Sgd::new(decay), Loss::MeanSquaredError, &[]).unwrap();
    let err = c.fit(&x, &y, quiet(2, 8, vec![Box::new(LearningRateScheduler::new(rate))])).unwrap_err().to_string();
    assert!(err.contains("schedule"), "{err}");
    assert_eq!(c.optimizer().unwrap().iterations(), 0);
}

#[test]
fn reduce_lr_on_plateau_lowers_the_rate_of_a_diverging_run() {
    // At this rate the loss grows every epoch: after each non-improving epoch the rate halves.
    let (x, y) = data();
    let mut m = model(5.0);
    let cb = ReduceLROnPlateau::new("loss").factor(0.5).patience(1).min_lr(1.0);
    m.fit(&x, &y, quiet(4, 8, vec![Box::new(cb)])).unwrap();
    assert_eq!(m.optimizer().unwrap().learning_rate(), 1.25, "5 -> 2.5 -> 1.25 after epochs 1 and 2");
    let err =
        m.fit(&x, &y, quiet(2, 8, vec![Box::new(ReduceLROnPlateau::new("loss").factor(1.5))])).unwrap_err().to_string();
    assert!(err.contains("factor"), "{err}");
    let err = m.fit(&x, &y, quiet(2, 8, vec![Box::new(ReduceLROnPlateau::new("mystery"))])).unwrap_err().to_string();
    assert!(err.contains("mystery"), "{err}");
}

#[test]
fn a_run_resumed_at_initial_epoch_ends_where_an_uninterrupted_one_does() {
    let x = Tensor::rand(-1.0, 1.0, &[40, 3], 5, &Device::Cpu).unwrap();
    let y = Tensor::rand(-1.0, 1.0, &[40, 1], 6, &Device::Cpu).unwrap();
    let make = || {
        let mut m = Model::new(Sequential::new().add(weft_nn::layers::Dense::new(1)), &Device::Cpu);
        m.compile(Adam::new(0.05), Loss::MeanSquaredError, &[]).unwrap();
        m
    };
    let opts = |epochs, initial_epoch| FitOptions {
        epochs,
        initial_epoch,
        batch_size: 8,
        shuffle: true,
        seed: 11,
        verbose: false,
        ..Default::default()
    };
    let mut whole = make();
    let h = whole.fit(&x, &y, opts(5, 0)).unwrap();
    let mut resumed = make();
    let first = resumed.fit(&x, &y, opts(2, 0)).unwrap();
    let rest = resumed.fit(&x, &y, opts(5, 2)).unwrap();
    assert_eq!(weights(&whole), weights(&resumed), "each epoch is shuffled as in the whole run");
    assert_eq!([first.loss, rest.loss].concat(), h.loss);
    // An EarlyStopping in the resumed run reads the epochs it recorded, not those before.
    let mut again = make();
    let stop = EarlyStopping::new("loss", 1);
    let h = again.fit(&x, &y, FitOptions { callbacks: vec![Box::new(stop)], ..opts(4, 3) }).unwrap();
    assert_eq!(h.loss.len(), 1);
}

#[test]
fn steps_per_epoch_walks_on_through_the_data_and_refuses_more_than_there_are() {
    let x = Tensor::rand(-1.0, 1.0, &[40, 3], 5, &Device::Cpu).unwrap();
    let y = Tensor::rand(-1.0, 1.0, &[40, 1], 6, &Device::Cpu).unwrap();
    let make = || {
        let mut m = Model::new(Sequential::new().add(weft_nn::layers::Dense::new(1)), &Device::Cpu);
        m.compile(Adam::new(0.05), Loss::MeanSquaredError, &[]).unwrap();
        m
    };
    let mut m = make();
    m.fit(&x, &y, FitOptions { steps_per_epoch: Some(2), ..quiet(3, 8, vec![]) }).unwrap();
    assert_eq!(m.optimizer().unwrap().iterations(), 6);
    // Five batches of 8, unshuffled: epochs of two take batches 0 1, 2 3, then 4 and, from a
    // new pass, 0 (as Keras' iterator goes on).
    let mut n = make();
    for b in [0, 1, 2, 3, 4, 0] {
        n.train_on_batch(x.narrow(0, 8 * b, 8).unwrap(), y.narrow(0, 8 * b, 8).unwrap()).unwrap();
    }
    assert_eq!(weights(&m), weights(&n));
    // Shuffled and resumed: epochs 2 and 3 after a stop at 2 are those of an uninterrupted run.
    let opts = |epochs, initial_epoch| FitOptions {
        epochs,
        initial_epoch,
        steps_per_epoch: Some(3),
        shuffle: true,
        seed: 4,
        ..quiet(epochs, 8, vec![])
    };
    let (mut whole, mut resumed) = (make(), make());
    whole.fit(&x, &y, opts(4, 0)).unwrap();
    resumed.fit(&x, &y, opts(2, 0)).unwrap();
    resumed.fit(&x, &y, opts(4, 2)).unwrap();
    assert_eq!(weights(&whole), weights(&resumed));
    let err = m.fit(&x, &y, FitOptions { steps_per_epoch: Some(6), ..quiet(1, 8, vec![]) }).unwrap_err().to_string();
    assert!(err.contains("steps_per_epoch 6") && err.contains("give 5"), "{err}");
}

#[test]
fn csv_logger_writes_a_header_and_a_row_per_epoch_and_appends() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.csv");
    let x = Tensor::rand(-1.0, 1.0, &[20, 2], 5, &Device::Cpu).unwrap();
    let y = Tensor::from_vec((0..20).map(|i| (i % 2) as f32).collect(), &[20, 1], &Device::Cpu).unwrap();
    let mut m = Model::new(Sequential::new().add(weft_nn::layers::Dense::new(1)), &Device::Cpu);
    m.compile(Sgd::new(0.1), Loss::BinaryCrossentropy { from_logits: true }, &[Metric::Accuracy]).unwrap();
    let opts = |epochs, initial_epoch, log: CsvLogger| FitOptions {
        epochs,
        initial_epoch,
        validation_split: 0.25,
        callbacks: vec![Box::new(log)],
        ..quiet(epochs, 5, vec![])
    };
    let h = m.fit(&x, &y, opts(3, 0, CsvLogger::new(&path))).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "epoch,accuracy,loss,val_accuracy,val_loss");
    assert_eq!(lines.len(), 4, "{text}");
    for (e, line) in lines[1..].iter().enumerate() {
        let cells: Vec<&str> = line.split(',').collect();
        assert_eq!(cells[0], e.to_string());
        let want = [h.metrics["accuracy"][e], h.loss[e], h.val_metrics["accuracy"][e], h.val_loss[e]];
        let got: Vec<f32> = cells[1..].iter().map(|c| c.parse().unwrap()).collect();
        assert_eq!(got, want, "row {e}");
    }
    m.fit(&x, &y, opts(5, 3, CsvLogger::new(&path).append(true))).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let epochs: Vec<&str> = text.lines().skip(1).map(|l| l.split(',').next().unwrap()).collect();
    assert_eq!(epochs, ["0", "1", "2", "3", "4"], "{text}");
    // Without append, the file starts afresh.
    m.fit(&x, &y, opts(1, 0, CsvLogger::new(&path).separator(';'))).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text.lines().count(), 2);
    assert!(text.starts_with("epoch;accuracy;loss;val_accuracy;val_loss\n0;"), "{text}");
    // A file that cannot be written is an Err naming it, before any training.
    let bad = dir.path().join("no/such/dir/log.csv");
    let before = weights(&m);
    let err = m.fit(&x, &y, opts(1, 0, CsvLogger::new(&bad))).unwrap_err().to_string();
    assert!(err.contains("no/such/dir"), "{err}");
    assert_eq!(weights(&m), before);
}

#[test]
fn terminate_on_nan_ends_fit_with_the_history_so_far() {
    // The third batch's target is NaN: its loss is NaN, and the step is not applied.
    let x = Tensor::rand(-1.0, 1.0, &[24, 1], 3, &Device::Cpu).unwrap();
    let mut yv = x.to_vec::<f32>().unwrap();
    yv[20] = f32::NAN;
    let y = Tensor::from_vec(yv, &[24, 1], &Device::Cpu).unwrap();
    let mut m = model(0.1);
    let err = m.fit(&x, &y, quiet(2, 8, vec![])).unwrap_err().to_string();
    assert!(err.contains("NaN"), "{err}");
    let mut m = model(0.1);
    let h = m.fit(&x, &y, quiet(2, 8, vec![Box::new(TerminateOnNaN)])).unwrap();
    assert!(h.loss.is_empty(), "the epoch it fell in is not recorded: {h:?}");
    // What was trained is the first two batches' steps.
    let mut n = model(0.1);
    n.fit(x.narrow(0, 0, 16).unwrap(), y.narrow(0, 0, 16).unwrap(), quiet(1, 8, vec![])).unwrap();
    assert_eq!(weights(&m), weights(&n));
}

#[test]
fn validation_freq_validates_every_nth_epoch_and_callbacks_skip_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.csv");
    let x = Tensor::rand(-1.0, 1.0, &[30, 2], 5, &Device::Cpu).unwrap();
    let y = Tensor::rand(-1.0, 1.0, &[30, 1], 6, &Device::Cpu).unwrap();
    let run = |freq: usize, callbacks: Vec<Box<dyn Callback>>| {
        let mut m = model(0.1);
        let opts = FitOptions { validation_split: 0.2, validation_freq: freq, callbacks, ..quiet(5, 8, vec![]) };
        m.fit(&x, &y, opts).unwrap()
    };
    let every = run(1, vec![]);
    let early = EarlyStopping::new("val_loss", 1).min_delta(10.0);
    let second = run(2, vec![Box::new(CsvLogger::new(&path)), Box::new(early)]);
    // Validation changes nothing in training; epochs 2 and 4 (1 and 3 from 0) are validated.
    // EarlyStopping skips epochs 0 and 2, which have no val_loss: the first validated epoch sets
    // the best, the second fails to beat it by min_delta and stops training.
    assert_eq!(second.loss, every.loss[..4]);
    assert_eq!(second.val_loss, [every.val_loss[1], every.val_loss[3]]);
    let text = std::fs::read_to_string(&path).unwrap();
    let rows: Vec<&str> = text.lines().collect();
    assert_eq!(rows[0], "epoch,loss,val_loss");
    assert!(rows[1].ends_with(",NA") && !rows[2].ends_with(",NA"), "{text}");
    let mut m = model(0.1);
    let err = m.fit(&x, &y, FitOptions { validation_freq: 0, ..quiet(1, 8, vec![]) }).unwrap_err().to_string();
    assert!(err.contains("validation_freq"), "{err}");
}

#[test]
fn a_verbose_resumed_run_prints_its_epochs() {
    // The per-epoch line reads the latest figures: a History that starts at initial_epoch (and
    // validation every other epoch) must not be indexed by the epoch number.
    let (x, y) = data();
    let mut m = model(0.1);
    let opts = FitOptions {
        epochs: 4,
        initial_epoch: 2,
        validation_split: 0.25,
        validation_freq: 2,
        verbose: true,
        ..Default::default()
    };
    let h = m.fit(&x, &y, opts).unwrap();
    assert_eq!((h.loss.len(), h.val_loss.len()), (2, 1));
}
