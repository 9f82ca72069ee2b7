//! Metrics, accumulated over an epoch (a running count, not a mean of batch means).

use weft_core::ops::BinaryOp;
use weft_core::{DType, Error, Result, Tensor, no_grad};

/// A metric of `(y_pred, y_true)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metric {
    /// Keras' `"accuracy"`: resolved from the shapes alone, as Keras 3 does
    /// (`compile_utils.get_metric`): a single output is binary, integer labels (one fewer axis
    /// than the prediction, or a last axis of 1) are sparse, and one-hot targets are categorical.
    /// Reported under the name `accuracy`.
    Accuracy,
    /// Fraction of values whose prediction `> 0.5` equals the target.
    BinaryAccuracy,
    /// Fraction of rows whose arg-max matches the arg-max of one-hot targets.
    CategoricalAccuracy,
    /// Fraction of rows whose arg-max matches an integer label.
    SparseCategoricalAccuracy,
}

impl Metric {
    /// Name used in histories and progress lines (the name the user chose: `accuracy` stays
    /// `accuracy` whatever it resolves to).
    pub fn name(self) -> &'static str {
        match self {
            Metric::Accuracy => "accuracy",
            Metric::BinaryAccuracy => "binary_accuracy",
            Metric::CategoricalAccuracy => "categorical_accuracy",
            Metric::SparseCategoricalAccuracy => "sparse_categorical_accuracy",
        }
    }

    /// The concrete metric `Accuracy` stands for, given the shapes.
    pub fn resolve(self, y_pred: &Tensor, y_true: &Tensor) -> Metric {
        if self != Metric::Accuracy {
            return self;
        }
        let (p_last, t_last) = (y_pred.dims().last().copied(), y_true.dims().last().copied());
        if p_last == Some(1) {
            Metric::BinaryAccuracy
        } else if y_true.rank() < y_pred.rank() || (t_last == Some(1) && p_last > Some(1)) {
            Metric::SparseCategoricalAccuracy
        } else {
            Metric::CategoricalAccuracy
        }
    }

    /// (correct, total) for one batch. A label that is not a class (negative, fractional, too
    /// large) is an `Err`, and shapes that do not fit are an `Err` naming both.
    pub fn count(self, y_pred: &Tensor, y_true: &Tensor) -> Result<(f64, f64)> {
        no_grad(|| {
            let misfit = || {
                Error::invalid(
                    self.name(),
                    format!("targets of shape {:?} do not fit predictions of shape {:?}", y_true.dims(), y_pred.dims()),
                )
            };
            let r = y_pred.rank();
            if r == 0 {
                return Err(misfit());
            }
            let classes = y_pred.dims()[r - 1];
            let (hits, total) = match self.resolve(y_pred, y_true) {
                Metric::SparseCategoricalAccuracy => {
                    let y = if y_true.rank() == r && y_true.dims()[r - 1] == 1 {
                        y_true.squeeze(-1)?
                    } else {
                        y_true.clone()
                    };
                    if y.dims() != &y_pred.dims()[..r - 1] {
                        return Err(misfit());
                    }
                    let labels = y.to_index("labels", Some(classes))?.to_dtype(DType::F32)?;
                    let pred = y_pred.argmax(-1, false)?.to_dtype(DType::F32)?;
                    (pred.eq(&labels)?, labels.numel())
                }
                Metric::BinaryAccuracy => {
                    if y_true.dims() != y_pred.dims() {
                        return Err(misfit());
                    }
                    let y = y_true.to_dtype(DType::F32)?;
                    (y_pred.cmp_scalar(BinaryOp::Gt, 0.5)?.eq(&y)?, y.numel())
                }
                _ => {
                    if y_true.dims() != y_pred.dims() {
                        return Err(misfit());
                    }
                    let p = y_pred.argmax(-1, false)?.to_dtype(DType::F32)?;
                    (p.eq(&y_true.argmax(-1, false)?.to_dtype(DType::F32)?)?, y_pred.numel() / classes.max(1))
                }
            };
            Ok((hits.sum_all()?.to_scalar::<f32>()? as f64, total as f64))
        })
    }
}
