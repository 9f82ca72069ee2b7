//! Callbacks that change the learning rate between epochs: `ReduceLROnPlateau` and
//! `LearningRateScheduler`, with Keras' rules.

use super::{Callback, Control, Mode, monitored, will_record};
use crate::{History, Model};
use std::sync::Arc;
use weft_core::{Error, Result};

/// Multiply the learning rate by `factor` when `monitor` has not improved (by more than
/// `min_delta`) for `patience` epochs, then wait `cooldown` epochs before counting again, never
/// going below `min_lr`. Keras' defaults: factor 0.1, patience 10, min_delta 1e-4, cooldown 0,
/// min_lr 0, and the direction from the monitor's name (a loss goes down, an accuracy up; set
/// [`Mode::Min`] or [`Mode::Max`] for any other).
///
/// ```
/// use weft_nn::callback::ReduceLROnPlateau;
/// let cb = ReduceLROnPlateau::new("val_loss").factor(0.5).patience(2).min_lr(1e-5);
/// # let _ = cb;
/// ```
#[derive(Clone)]
pub struct ReduceLROnPlateau {
    monitor: String,
    factor: f32,
    patience: usize,
    min_delta: f32,
    cooldown: usize,
    min_lr: f32,
    mode: Mode,
    best: Option<f32>,
    wait: usize,
    cooling: usize,
}

impl ReduceLROnPlateau {
    /// Watch `monitor` (a History key), with Keras' defaults.
    pub fn new(monitor: &str) -> Self {
        ReduceLROnPlateau {
            monitor: monitor.to_string(),
            factor: 0.1,
            patience: 10,
            min_delta: 1e-4,
            cooldown: 0,
            min_lr: 0.0,
            mode: Mode::Auto,
            best: None,
            wait: 0,
            cooling: 0,
        }
    }
    /// The factor the rate is multiplied by (in [0, 1)).
    pub fn factor(mut self, f: f32) -> Self {
        self.factor = f;
        self
    }
    /// Epochs without improvement before the rate falls.
    pub fn patience(mut self, p: usize) -> Self {
        self.patience = p;
        self
    }
    /// The least change that counts as an improvement.
    pub fn min_delta(mut self, d: f32) -> Self {
        self.min_delta = d.abs();
        self
    }
    /// Epochs to wait after a reduction before counting again.
    pub fn cooldown(mut self, c: usize) -> Self {
        self.cooldown = c;
        self
    }
    /// The lowest rate.
    pub fn min_lr(mut self, lr: f32) -> Self {
        self.min_lr = lr;
        self
    }
    /// Which way `monitor` improves (default: from its name).
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }
}

impl Callback for ReduceLROnPlateau {
    fn on_train_begin(&mut self, keys: &[String], _model: &Model) -> Result<()> {
        if !(0.0..1.0).contains(&self.factor) {
            return Err(Error::invalid("ReduceLROnPlateau", format!("factor must be in [0, 1), got {}", self.factor)));
        }
        if !(self.min_lr >= 0.0 && self.min_lr.is_finite()) {
            return Err(Error::invalid("ReduceLROnPlateau", format!("min_lr must be at least 0, got {}", self.min_lr)));
        }
        self.mode.higher_is_better(&self.monitor)?;
        will_record(&self.monitor, keys)?;
        (self.best, self.wait, self.cooling) = (None, 0, 0);
        Ok(())
    }

    fn on_epoch_end(&mut self, _epoch: usize, _history: &History, _model: &Model) -> Result<Control> {
        Ok(Control::Continue)
    }

    /// Keras' `on_epoch_end`, run before the next epoch with the last epoch's figure.
    fn learning_rate(&mut self, _epoch: usize, current: f32, history: &History) -> Result<Option<f32>> {
        let Some(value) = monitored(history, &self.monitor) else { return Ok(None) };
        if self.cooling > 0 {
            self.cooling -= 1;
            self.wait = 0;
        }
        if self.mode.improves(&self.monitor, value, self.best, self.min_delta)? {
            self.best = Some(value);
            self.wait = 0;
            return Ok(None);
        }
        if self.cooling > 0 {
            return Ok(None);
        }
        self.wait += 1;
        if self.wait < self.patience || current <= self.min_lr {
            return Ok(None);
        }
        (self.cooling, self.wait) = (self.cooldown, 0);
        Ok(Some((current * self.factor).max(self.min_lr)))
    }

    fn clone_box(&self) -> Option<Box<dyn Callback>> {
        Some(Box::new(self.clone()))
    }
}

/// The learning rate of each epoch from `schedule(epoch, current rate)` (Keras'
/// `LearningRateScheduler`; epochs count from 0).
///
/// ```
/// use weft_nn::callback::LearningRateScheduler;
/// let halve_after_5 = LearningRateScheduler::new(|epoch, lr| if epoch < 5 { lr } else { lr * 0.5 });
/// # let _ = halve_after_5;
/// ```
#[derive(Clone)]
pub struct LearningRateScheduler {
    schedule: Arc<dyn Fn(usize, f32) -> f32 + Send + Sync>,
}

impl LearningRateScheduler {
    /// Train epoch `e` at `schedule(e, rate before it)`.
    pub fn new(schedule: impl Fn(usize, f32) -> f32 + Send + Sync + 'static) -> Self {
        LearningRateScheduler { schedule: Arc::new(schedule) }
    }
}

impl Callback for LearningRateScheduler {
    fn on_epoch_end(&mut self, _epoch: usize, _history: &History, _model: &Model) -> Result<Control> {
        Ok(Control::Continue)
    }

    fn learning_rate(&mut self, epoch: usize, current: f32, _history: &History) -> Result<Option<f32>> {
        Ok(Some((self.schedule)(epoch, current)))
    }

    fn clone_box(&self) -> Option<Box<dyn Callback>> {
        Some(Box::new(self.clone()))
    }
}
