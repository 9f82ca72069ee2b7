//! Losses: mean over the batch of a per-sample loss.

use weft_core::{DType, Error, Result, Tensor};

/// A loss function of `(y_pred, y_true)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Loss {
    /// mean((y_pred - y_true)^2)
    MeanSquaredError,
    /// Binary cross-entropy; `from_logits` when y_pred is a logit rather than a probability.
    BinaryCrossentropy {
        /// Whether y_pred is a logit.
        from_logits: bool,
    },
    /// Cross-entropy against one-hot (or soft) targets of the same shape as y_pred.
    CategoricalCrossentropy {
        /// Whether y_pred holds logits rather than probabilities.
        from_logits: bool,
    },
    /// Cross-entropy against integer class labels (u32 or i32), one per row of y_pred.
    SparseCategoricalCrossentropy {
        /// Whether y_pred holds logits rather than probabilities.
        from_logits: bool,
    },
}

/// Probabilities are clipped to [EPS, 1 - EPS] before a log, as Keras does.
const EPS: f32 = 1e-7;

impl Loss {
    /// The mean loss over the batch, as a 0-dimensional tensor.
    pub fn compute(&self, y_pred: &Tensor, y_true: &Tensor) -> Result<Tensor> {
        let same_shape = || {
            if y_pred.dims() != y_true.dims() {
                return Err(Error::ShapeMismatch {
                    op: "loss",
                    lhs: y_pred.dims().to_vec(),
                    rhs: y_true.dims().to_vec(),
                });
            }
            Ok(())
        };
        match *self {
            Loss::MeanSquaredError => {
                same_shape()?;
                y_pred.sub(y_true)?.square()?.mean_all()
            }
            Loss::BinaryCrossentropy { from_logits } => {
                same_shape()?;
                let p = if from_logits { y_pred.sigmoid()? } else { y_pred.clone() }.clamp(EPS, 1.0 - EPS)?;
                // -(y log p + (1 - y) log(1 - p))
                let pos = y_true.mul(&p.log()?)?;
                let neg = y_true.affine(-1.0, 1.0)?.mul(&p.affine(-1.0, 1.0)?.log()?)?;
                pos.add(&neg)?.mean_all()?.neg()
            }
            Loss::CategoricalCrossentropy { from_logits } => {
                same_shape()?;
                let logp = if from_logits { y_pred.log_softmax(-1)? } else { y_pred.clamp(EPS, 1.0)?.log()? };
                let rows = (y_pred.numel() / y_pred.dims().last().copied().unwrap_or(1).max(1)) as f32;
                y_true.mul(&logp)?.sum_all()?.mul_scalar(-1.0 / rows)
            }
            Loss::SparseCategoricalCrossentropy { from_logits } => {
                let labels = match y_true.dtype() {
                    DType::U32 | DType::I32 => y_true.clone(),
                    // Float labels (as read from a CSV) are converted.
                    _ => y_true.to_dtype(DType::U32)?,
                };
                if from_logits {
                    Tensor::cross_entropy(y_pred, &labels)
                } else {
                    let r = y_pred.rank();
                    let rows = y_pred.numel() / y_pred.dims()[r - 1].max(1);
                    let logp = y_pred.clamp(EPS, 1.0)?.log()?.reshape(&[rows, y_pred.dims()[r - 1]])?;
                    logp.gather(1, &labels.reshape(&[rows, 1])?)?.mean_all()?.neg()
                }
            }
        }
    }
}
