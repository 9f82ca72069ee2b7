//! Callbacks run by `fit` after every epoch: early stopping, checkpointing, learning-rate
//! changes, logging, or any closure.

mod log;
mod rate;

pub use log::{CsvLogger, TerminateOnNaN};
pub use rate::{LearningRateScheduler, ReduceLROnPlateau};

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
    /// Before the first epoch, with the keys `fit` will record in the History (`loss`,
    /// `accuracy`, `val_loss`, ...): a callback that cannot run checks so here, before anything
    /// trains, and one reused for a second `fit` starts afresh here.
    fn on_train_begin(&mut self, _keys: &[String], _model: &Model) -> Result<()> {
        Ok(())
    }
    /// After epoch `epoch` (from 0); `history` already holds its figures.
    fn on_epoch_end(&mut self, epoch: usize, history: &History, model: &Model) -> Result<Control>;
    /// When training ends (normally or stopped).
    fn on_train_end(&mut self, _history: &History, _model: &Model) -> Result<()> {
        Ok(())
    }
    /// Before epoch `epoch`: a learning rate to train it at (`None`: leave the rate as it is).
    /// `current` is the rate the next step would use; `history` holds the epochs trained so far.
    /// The optimizer's rate must then be a number, not a schedule (as in Keras).
    fn learning_rate(&mut self, _epoch: usize, _current: f32, _history: &History) -> Result<Option<f32>> {
        Ok(None)
    }
    /// Whether a batch whose loss is not finite ends training, `fit` returning the History so
    /// far, rather than making `fit` return `Err`. Either way that step is not applied.
    fn stops_on_non_finite_loss(&self) -> bool {
        false
    }
    /// A fresh copy for another rank of a sharded model (`None`: this callback cannot run there).
    fn clone_box(&self) -> Option<Box<dyn Callback>> {
        None
    }
}

/// The value of `monitor` (a History key: `loss`, `val_loss`, a metric name or `val_` + a metric
/// name) at the latest epoch; `None` at an epoch that did not record it (validation under
/// `validation_freq`), which a callback skips, as Keras' do.
pub(crate) fn monitored(history: &History, monitor: &str) -> Option<f32> {
    history.latest(monitor)
}

/// `Err` unless `fit` will record `monitor`.
pub(crate) fn will_record(monitor: &str, keys: &[String]) -> Result<()> {
    if keys.iter().any(|k| k == monitor) {
        return Ok(());
    }
    let hint = if monitor.starts_with("val_") { " (is there validation data?)" } else { "" };
    Err(Error::invalid("callback", format!("nothing called {monitor:?} will be recorded{hint}: fit records {keys:?}")))
}

/// Which way a monitored figure improves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// From the name, as Keras does from the metric: a loss or an error (`loss`, `val_loss`,
    /// `{output}_loss`, `mean_absolute_error`, `mae`) goes down; an accuracy, `precision`,
    /// `recall` or `auc` goes up; any other name is an `Err` asking for `Min` or `Max`.
    #[default]
    Auto,
    /// Lower is better.
    Min,
    /// Higher is better.
    Max,
}

impl Mode {
    /// `true` when higher values of `monitor` are better.
    fn higher_is_better(self, monitor: &str) -> Result<bool> {
        match self {
            Mode::Min => Ok(false),
            Mode::Max => Ok(true),
            Mode::Auto => {
                // Keras reads the direction from the metric: losses and errors fall, accuracies,
                // precision, recall and AUC rise.
                let name = monitor.strip_prefix("val_").unwrap_or(monitor);
                let falls = name == "loss"
                    || name.ends_with("_loss")
                    || name.ends_with("error")
                    || ["mae", "mse", "mape", "msle"].contains(&name);
                let rises = name.ends_with("accuracy") || ["precision", "recall", "auc"].contains(&name);
                if falls {
                    Ok(false)
                } else if rises {
                    Ok(true)
                } else {
                    Err(Error::invalid(
                        "callback",
                        format!(
                            "cannot tell whether {monitor:?} should go up or down: set the mode to Mode::Min or Mode::Max"
                        ),
                    ))
                }
            }
        }
    }

    /// Keras' test: `value` improves on `best` by more than `min_delta` (any value improves on none).
    fn improves(self, monitor: &str, value: f32, best: Option<f32>, min_delta: f32) -> Result<bool> {
        let Some(b) = best else { return Ok(true) };
        Ok(if self.higher_is_better(monitor)? { value - min_delta > b } else { value + min_delta < b })
    }
}

/// Stop when `monitor` has not improved by `min_delta` for `patience` epochs; optionally put back
/// the weights of the best epoch. The rules are Keras' `EarlyStopping`: epochs before
/// `start_from_epoch` are ignored, an improvement that does not also beat `baseline` does not
/// reset the count, and training never stops after its first epoch.
///
/// ```
/// use weft_nn::callback::{EarlyStopping, Mode};
/// let stop = EarlyStopping::new("val_accuracy", 3).mode(Mode::Max).baseline(0.5).restore_best_weights(true);
/// # let _ = stop;
/// ```
#[derive(Clone)]
pub struct EarlyStopping {
    monitor: String,
    patience: usize,
    min_delta: f32,
    mode: Mode,
    baseline: Option<f32>,
    start_from_epoch: usize,
    restore_best_weights: bool,
    best: Option<f32>,
    best_weights: Option<Vec<Tensor>>,
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
            mode: Mode::Auto,
            baseline: None,
            start_from_epoch: 0,
            restore_best_weights: false,
            best: None,
            best_weights: None,
            waited: 0,
            stopped_epoch: None,
        }
    }
    /// Smallest change that counts as an improvement (its sign is ignored, as in Keras).
    pub fn min_delta(mut self, d: f32) -> Self {
        self.min_delta = d.abs();
        self
    }
    /// Which way `monitor` improves (default: from its name).
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }
    /// A value to beat: until `monitor` beats it, improvements do not reset the patience.
    pub fn baseline(mut self, value: f32) -> Self {
        self.baseline = Some(value);
        self
    }
    /// Ignore the epochs before this one (a warm-up).
    pub fn start_from_epoch(mut self, epoch: usize) -> Self {
        self.start_from_epoch = epoch;
        self
    }
    /// At the end, put back the weights of the best epoch.
    pub fn restore_best_weights(mut self, on: bool) -> Self {
        self.restore_best_weights = on;
        self
    }
}

fn snapshot(model: &Model) -> Vec<Tensor> {
    model.variables().iter().map(|(_, var)| var.as_tensor().snapshot()).collect()
}

impl Callback for EarlyStopping {
    fn on_train_begin(&mut self, keys: &[String], _model: &Model) -> Result<()> {
        // Check the monitor and its direction now, not after the first epoch's work.
        self.mode.higher_is_better(&self.monitor)?;
        will_record(&self.monitor, keys)?;
        (self.best, self.best_weights, self.waited, self.stopped_epoch) = (None, None, 0, None);
        Ok(())
    }

    fn on_epoch_end(&mut self, epoch: usize, history: &History, model: &Model) -> Result<Control> {
        let Some(v) = monitored(history, &self.monitor).filter(|_| epoch >= self.start_from_epoch) else {
            return Ok(Control::Continue);
        };
        if self.restore_best_weights && self.best_weights.is_none() {
            self.best_weights = Some(snapshot(model));
        }
        self.waited += 1;
        if self.mode.improves(&self.monitor, v, self.best, self.min_delta)? {
            self.best = Some(v);
            if self.restore_best_weights {
                self.best_weights = Some(snapshot(model));
            }
            let beats_baseline = match self.baseline {
                None => true,
                b => self.mode.improves(&self.monitor, v, b, self.min_delta)?,
            };
            if beats_baseline {
                self.waited = 0;
            }
            return Ok(Control::Continue);
        }
        if self.waited >= self.patience && epoch > 0 {
            self.stopped_epoch = Some(epoch);
            return Ok(Control::Stop);
        }
        Ok(Control::Continue)
    }

    fn clone_box(&self) -> Option<Box<dyn Callback>> {
        Some(Box::new(self.clone()))
    }

    fn on_train_end(&mut self, _history: &History, model: &Model) -> Result<()> {
        if let Some(best) = self.best_weights.as_ref().filter(|_| self.restore_best_weights) {
            for ((_, var), best) in model.variables().iter().zip(best) {
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
    mode: Mode,
    best: Option<f32>,
}

impl ModelCheckpoint {
    /// Save after every epoch.
    pub fn new(path: impl Into<std::path::PathBuf>) -> Self {
        ModelCheckpoint {
            path: path.into(),
            monitor: "val_loss".into(),
            save_best_only: false,
            mode: Mode::Auto,
            best: None,
        }
    }
    /// Save only when `monitor` is the best seen so far.
    pub fn save_best_only(mut self, monitor: &str) -> Self {
        self.monitor = monitor.to_string();
        self.save_best_only = true;
        self
    }
    /// Which way the monitored figure improves (default: from its name).
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }
}

impl Callback for ModelCheckpoint {
    fn on_train_begin(&mut self, keys: &[String], _model: &Model) -> Result<()> {
        if self.save_best_only {
            self.mode.higher_is_better(&self.monitor)?;
            will_record(&self.monitor, keys)?;
        }
        // A folder that is not there fails now, not after the first epoch has trained.
        let dir = self.path.parent().filter(|d| !d.as_os_str().is_empty());
        if let Some(d) = dir.filter(|d| !d.is_dir()) {
            return Err(Error::invalid(
                "ModelCheckpoint",
                format!("cannot save to {}: the folder {} does not exist", self.path.display(), d.display()),
            ));
        }
        Ok(())
    }
    fn on_epoch_end(&mut self, _epoch: usize, history: &History, model: &Model) -> Result<Control> {
        if self.save_best_only {
            let Some(v) = monitored(history, &self.monitor) else { return Ok(Control::Continue) };
            if !self.mode.improves(&self.monitor, v, self.best, 0.0)? {
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
