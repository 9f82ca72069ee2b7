//! `CsvLogger` (one line of figures per epoch in a CSV file) and `TerminateOnNaN`.

use super::{Callback, Control};
use crate::{History, Model};
use std::io::Write;
use std::path::PathBuf;
use weft_core::{Error, Result};

/// Append each epoch's figures to a CSV file: a header `epoch,<key>,...` (the History's keys,
/// sorted, as Keras writes them), then one row per epoch. Written by one rank of a sharded model.
/// With `append`, rows go after an existing file's (its header kept); otherwise the file is
/// started afresh when training begins.
///
/// ```
/// use weft_nn::callback::CsvLogger;
/// let log = CsvLogger::new("training.csv").separator(';').append(true);
/// # let _ = log;
/// ```
#[derive(Clone)]
pub struct CsvLogger {
    path: PathBuf,
    separator: char,
    append: bool,
    keys: Vec<String>,
    header_due: bool,
}

impl CsvLogger {
    /// Log to `path`, separated by commas, starting the file afresh.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        CsvLogger { path: path.into(), separator: ',', append: false, keys: Vec::new(), header_due: true }
    }
    /// The field separator.
    pub fn separator(mut self, c: char) -> Self {
        self.separator = c;
        self
    }
    /// Add to an existing file rather than start it afresh.
    pub fn append(mut self, on: bool) -> Self {
        self.append = on;
        self
    }
    fn io(&self, what: &str, e: std::io::Error) -> Error {
        Error::Msg(format!("CsvLogger: {what} {}: {e}", self.path.display()))
    }
}

impl Callback for CsvLogger {
    fn on_train_begin(&mut self, keys: &[String], model: &Model) -> Result<()> {
        self.keys = keys.to_vec();
        self.keys.sort();
        let exists = std::fs::metadata(&self.path).is_ok_and(|m| m.len() > 0);
        self.header_due = !(self.append && exists);
        if model.writes() && !self.append {
            std::fs::File::create(&self.path).map_err(|e| self.io("creating", e))?;
        }
        Ok(())
    }

    fn on_epoch_end(&mut self, epoch: usize, history: &History, model: &Model) -> Result<Control> {
        if !model.writes() {
            return Ok(Control::Continue);
        }
        let sep = self.separator.to_string();
        let mut text = String::new();
        if self.header_due {
            text += &format!("epoch{sep}{}\n", self.keys.join(&sep));
            self.header_due = false;
        }
        // "NA" for a figure this epoch did not record (validation under validation_freq), as Keras.
        let values: Vec<String> =
            self.keys.iter().map(|k| history.latest(k).map_or("NA".to_string(), |v| v.to_string())).collect();
        text += &format!("{epoch}{sep}{}\n", values.join(&sep));
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .map_err(|e| self.io("opening", e))?;
        f.write_all(text.as_bytes()).map_err(|e| self.io("writing", e))?;
        Ok(Control::Continue)
    }

    fn clone_box(&self) -> Option<Box<dyn Callback>> {
        Some(Box::new(self.clone()))
    }
}

/// End training, `fit` returning the History so far, when a batch's loss is NaN or infinite
/// (without it `fit` returns `Err`). The batch's step is not applied either way (Keras applies
/// it, then stops), and the epoch it fell in is not recorded.
#[derive(Clone, Default)]
pub struct TerminateOnNaN;

impl Callback for TerminateOnNaN {
    fn on_epoch_end(&mut self, _epoch: usize, _history: &History, _model: &Model) -> Result<Control> {
        Ok(Control::Continue)
    }

    fn stops_on_non_finite_loss(&self) -> bool {
        true
    }

    fn clone_box(&self) -> Option<Box<dyn Callback>> {
        Some(Box::new(self.clone()))
    }
}
