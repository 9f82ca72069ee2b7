//! EarlyStopping (with restored weights), ModelCheckpoint and closure callbacks.

use std::sync::{Arc, Mutex};
use weft_core::{Device, Result, Tensor};
use weft_nn::callback::{Callback, Control, EarlyStopping, LambdaCallback, ModelCheckpoint};
use weft_nn::layers::Dense;
use weft_nn::optim::Sgd;
use weft_nn::{FitOptions, History, Loss, Model, Sequential};

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
