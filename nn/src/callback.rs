//! Callbacks run by `fit` after every epoch: early stopping, checkpointing, or any closure.

use crate::{History, Model};
use weft_core::{Error, Result, Tensor};

/// What a callback tells `fit` after an epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    /// Go on training.
    Continue,
    /// Stop after this epoch.
    Stop,
}

/// Something `fit` calls after each epoch and once at the end.
///
/// A sharded model runs a copy of each callback on every rank (each sees the same history, and
/// its own rank's model): a callback that can be copied says so in `clone_box`.
pub trait Callback: Send {
    /// After epoch `epoch` (from 0); `history` already holds its figures.
    fn on_epoch_end(&mut self, epoch: usize, history: &History, model: &Model) -> Result<Control>;
    /// When training ends (normally or stopped).
    fn on_train_end(&mut self, _history: &History, _model: &Model) -> Result<()> {
        Ok(())
    }
    /// A fresh copy for another rank of a sharded model (`None`: this callback cannot run there).
    fn clone_box(&self) -> Option<Box<dyn Callback>> {
        None
    }
}

/// The value of `monitor` (`loss`, `val_loss`, a metric name or `val_` + a metric name) at `epoch`.
fn monitored(history: &History, monitor: &str, epoch: usize) -> Result<f32> {
    let series = match monitor {
        "loss" => Some(&history.loss),
        "val_loss" => Some(&history.val_loss),
        m => match m.strip_prefix("val_") {
            Some(name) => history.val_metrics.get(name),
            None => history.metrics.get(m),
        },
    };
    series.and_then(|s| s.get(epoch)).copied().ok_or_else(|| {
        Error::invalid("callback", format!("nothing called {monitor:?} is recorded (is there validation data?)"))
    })
}

/// Losses improve downwards, accuracies upwards.
fn higher_is_better(monitor: &str) -> bool {
    monitor.contains("acc")
}

/// Stop when `monitor` has not improved by `min_delta` for `patience` epochs; optionally put back
/// the weights of the best epoch.
#[derive(Clone)]
pub struct EarlyStopping {
    monitor: String,
    patience: usize,
    min_delta: f32,
    restore_best_weights: bool,
    best: Option<f32>,
    best_weights: Vec<Tensor>,
    waited: usize,
    /// The epoch training stopped after, if it stopped early.
    pub stopped_epoch: Option<usize>,
}

impl EarlyStopping {
    /// Watch `monitor` (e.g. `val_loss`) with the given patience.
    pub fn new(monitor: &str, patience: usize) -> Self {
        EarlyStopping {
            monitor: monitor.to_string(),
            patience,
            min_delta: 0.0,
            restore_best_weights: false,
            best: None,
            best_weights: Vec::new(),
            waited: 0,
            stopped_epoch: None,
        }
    }
    /// Smallest change that counts as an improvement.
    pub fn min_delta(mut self, d: f32) -> Self {
        self.min_delta = d;
        self
    }
    /// At the end, put back the weights of the best epoch.
    pub fn restore_best_weights(mut self, on: bool) -> Self {
        self.restore_best_weights = on;
        self
    }
}

impl Callback for EarlyStopping {
    fn on_epoch_end(&mut self, epoch: usize, history: &History, model: &Model) -> Result<Control> {
        let v = monitored(history, &self.monitor, epoch)?;
        let better = match self.best {
            None => true,
            Some(b) if higher_is_better(&self.monitor) => v > b + self.min_delta,
            Some(b) => v < b - self.min_delta,
        };
        if better {
            self.best = Some(v);
            self.waited = 0;
            if self.restore_best_weights {
                self.best_weights = model.variables().iter().map(|(_, var)| var.as_tensor().snapshot()).collect();
            }
            return Ok(Control::Continue);
        }
        self.waited += 1;
        if self.waited >= self.patience {
            self.stopped_epoch = Some(epoch);
            return Ok(Control::Stop);
        }
        Ok(Control::Continue)
    }

    fn clone_box(&self) -> Option<Box<dyn Callback>> {
        Some(Box::new(self.clone()))
    }

    fn on_train_end(&mut self, _history: &History, model: &Model) -> Result<()> {
        if self.restore_best_weights && !self.best_weights.is_empty() {
            for ((_, var), best) in model.variables().iter().zip(&self.best_weights) {
                var.set(best)?;
            }
        }
        Ok(())
    }
}

/// Save the weights to `path` after every epoch, or only when `monitor` improved. On a sharded
/// model the whole tensors are gathered and one rank writes the file.
#[derive(Clone)]
pub struct ModelCheckpoint {
    path: std::path::PathBuf,
    monitor: String,
    save_best_only: bool,
    best: Option<f32>,
}

impl ModelCheckpoint {
    /// Save after every epoch.
    pub fn new(path: impl Into<std::path::PathBuf>) -> Self {
        ModelCheckpoint { path: path.into(), monitor: "val_loss".into(), save_best_only: false, best: None }
    }
    /// Save only when `monitor` is the best seen so far.
    pub fn save_best_only(mut self, monitor: &str) -> Self {
        self.monitor = monitor.to_string();
        self.save_best_only = true;
        self
    }
}

impl Callback for ModelCheckpoint {
    fn on_epoch_end(&mut self, epoch: usize, history: &History, model: &Model) -> Result<Control> {
        if self.save_best_only {
            let v = monitored(history, &self.monitor, epoch)?;
            let better = match self.best {
                None => true,
                Some(b) if higher_is_better(&self.monitor) => v > b,
                Some(b) => v < b,
            };
            if !better {
                return Ok(Control::Continue);
            }
            self.best = Some(v);
        }
        model.save_weights(&self.path)?;
        Ok(Control::Continue)
    }
    fn clone_box(&self) -> Option<Box<dyn Callback>> {
        Some(Box::new(self.clone()))
    }
}

/// A closure called after every epoch with the epoch and the history so far.
pub struct LambdaCallback<F: FnMut(usize, &History) -> Result<Control> + Send>(pub F);

impl<F: FnMut(usize, &History) -> Result<Control> + Send> Callback for LambdaCallback<F> {
    fn on_epoch_end(&mut self, epoch: usize, history: &History, _model: &Model) -> Result<Control> {
        (self.0)(epoch, history)
    }
}
