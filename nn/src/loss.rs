//! Losses: mean over the batch of a per-sample loss.

use weft_core::{Error, Result, Tensor};

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

/// The size of the class axis (the last) of a prediction; an `Err` for a 0-d prediction or 0 classes.
fn class_count(op: &'static str, y_pred: &Tensor) -> Result<usize> {
    match y_pred.dims().last() {
        Some(&c) if c > 0 => Ok(c),
        _ => Err(Error::invalid(
            op,
            format!("predictions of shape {:?} have no class axis with at least one class", y_pred.dims()),
        )),
    }
}

/// Log-probabilities from probabilities as Keras takes them: each row divided by its sum, then
/// clipped to [EPS, 1 - EPS].
fn prob_log(p: &Tensor) -> Result<Tensor> {
    p.div(&p.sum(&[-1], true)?)?.clamp(EPS, 1.0 - EPS)?.log()
}

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
            Loss::BinaryCrossentropy { from_logits: true } => {
                same_shape()?;
                // The log-sigmoid form, as Keras: max(x, 0) - x y + log(1 + exp(-|x|)); exact for
                // confident logits of either sign (no clamped sigmoid, no vanishing gradient).
                // max(x, 0) is written (x + |x|) / 2 so that at x = 0 the kinks of max and |x|
                // cancel and the gradient is sigmoid(0) - y, as everywhere else.
                let x = y_pred;
                let soft = x.abs()?.neg()?.exp()?.add_scalar(1.0)?.log()?;
                let pos = x.add(&x.abs()?)?.mul_scalar(0.5)?;
                pos.sub(&x.mul(y_true)?)?.add(&soft)?.mean_all()
            }
            Loss::BinaryCrossentropy { from_logits: false } => {
                same_shape()?;
                // Keras: clip to [eps, 1 - eps], then eps inside each log.
                let p = y_pred.clamp(EPS, 1.0 - EPS)?;
                let pos = y_true.mul(&p.add_scalar(EPS)?.log()?)?;
                let neg = y_true.affine(-1.0, 1.0)?.mul(&p.affine(-1.0, 1.0 + EPS)?.log()?)?;
                pos.add(&neg)?.mean_all()?.neg()
            }
            Loss::CategoricalCrossentropy { from_logits } => {
                same_shape()?;
                let classes = class_count("categorical cross-entropy", y_pred)?;
                let logp = if from_logits { y_pred.log_softmax(-1)? } else { prob_log(y_pred)? };
                let rows = (y_pred.numel() / classes) as f32;
                y_true.mul(&logp)?.sum_all()?.mul_scalar(-1.0 / rows)
            }
            Loss::SparseCategoricalCrossentropy { from_logits } => {
                let classes = class_count("sparse categorical cross-entropy", y_pred)?;
                let r = y_pred.rank();
                // Labels of shape [.., 1] are accepted as Keras does.
                let y =
                    if y_true.rank() == r && y_true.dims()[r - 1] == 1 { y_true.squeeze(-1)? } else { y_true.clone() };
                if y.dims() != &y_pred.dims()[..r - 1] {
                    return Err(Error::invalid(
                        "sparse categorical cross-entropy",
                        format!(
                            "labels of shape {:?} do not fit predictions of shape {:?} (expected labels of shape {:?})",
                            y_true.dims(),
                            y_pred.dims(),
                            &y_pred.dims()[..r - 1]
                        ),
                    ));
                }
                // Every label must be a whole number in 0..classes: -1 or 2.7 is an error, never class 0 or 2.
                let labels = y.to_index("labels", Some(classes))?;
                if from_logits {
                    Tensor::cross_entropy(y_pred, &labels)
                } else {
                    let rows = y_pred.numel() / classes;
                    let logp = prob_log(y_pred)?.reshape(&[rows, classes])?;
                    logp.gather(1, &labels.reshape(&[rows, 1])?)?.mean_all()?.neg()
                }
            }
        }
    }
}
