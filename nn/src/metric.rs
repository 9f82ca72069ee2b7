//! Metrics, accumulated over an epoch (a running count, not a mean of batch means).

use weft_core::{DType, Result, Tensor, no_grad};

/// A metric of `(y_pred, y_true)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metric {
    /// Fraction of rows whose arg-max matches the arg-max of one-hot targets (or, for a single
    /// output, whose rounded prediction matches the target).
    Accuracy,
    /// Fraction of rows whose arg-max matches an integer label.
    SparseCategoricalAccuracy,
}

impl Metric {
    /// Name used in histories and progress lines.
    pub fn name(self) -> &'static str {
        match self {
            Metric::Accuracy => "accuracy",
            Metric::SparseCategoricalAccuracy => "sparse_categorical_accuracy",
        }
    }

    /// (correct, total) for one batch.
    pub fn count(self, y_pred: &Tensor, y_true: &Tensor) -> Result<(f64, f64)> {
        no_grad(|| {
            let rows = y_pred.numel() / y_pred.dims().last().copied().unwrap_or(1).max(1);
            let hits = match self {
                Metric::SparseCategoricalAccuracy => {
                    let pred = y_pred.argmax(-1, false)?.to_dtype(DType::F32)?;
                    pred.eq(&y_true.to_dtype(DType::F32)?.reshape(pred.dims())?)?
                }
                Metric::Accuracy if y_pred.dims().last() == Some(&1) => {
                    y_pred.cmp_scalar(weft_core::ops::BinaryOp::Ge, 0.5)?.eq(&y_true.to_dtype(DType::F32)?)?
                }
                Metric::Accuracy => {
                    let p = y_pred.argmax(-1, false)?.to_dtype(DType::F32)?;
                    p.eq(&y_true.argmax(-1, false)?.to_dtype(DType::F32)?)?
                }
            };
            Ok((hits.sum_all()?.to_scalar::<f32>()? as f64, rows as f64))
        })
    }
}
