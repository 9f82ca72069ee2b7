//! Losses: mean over the batch of a per-sample loss.

use std::sync::Arc;
use weft_core::{Error, Result, Tensor};

/// A loss function of `(y_pred, y_true)`. `Loss::custom` makes one of any function.
#[derive(Debug, Clone, PartialEq)]
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
    /// mean(|y_pred - y_true|)
    MeanAbsoluteError,
    /// 100 * mean(|(y_true - y_pred) / max(|y_true|, 1e-7)|)
    MeanAbsolutePercentageError,
    /// mean((log(max(y_pred, 1e-7) + 1) - log(max(y_true, 1e-7) + 1))^2)
    MeanSquaredLogarithmicError,
    /// Quadratic for errors up to `delta`, linear beyond: mean(0.5 min(|e|, delta)^2 +
    /// delta (|e| - min(|e|, delta))) with e = y_pred - y_true. Keras' default delta is 1.
    Huber {
        /// Where the loss turns from quadratic to linear.
        delta: f32,
    },
    /// mean(log(cosh(y_pred - y_true))), computed without overflow.
    LogCosh,
    /// Kullback-Leibler divergence of y_pred from y_true (both clipped to [1e-7, 1]), summed
    /// over the last axis.
    KlDivergence,
    /// mean(y_pred - y_true * log(y_pred + 1e-7))
    Poisson,
    /// Minus the cosine similarity of y_pred and y_true along the last axis (each normalised
    /// to unit length), so that minimising it aligns them.
    CosineSimilarity,
    /// mean(max(1 - y_true * y_pred, 0)); labels of only 0s and 1s are taken as -1 and 1.
    Hinge,
    /// mean(max(1 - y_true * y_pred, 0)^2); labels as in [`Loss::Hinge`].
    SquaredHinge,
    /// max(max((1 - y_true) * y_pred) - sum(y_true * y_pred) + 1, 0) per row, for one-hot y_true.
    CategoricalHinge,
    /// A loss of one's own (see [`Loss::custom`]).
    Custom(CustomLoss),
    /// A binary or categorical cross-entropy against smoothed targets (see
    /// [`Loss::with_label_smoothing`]).
    LabelSmoothing {
        /// The cross-entropy.
        loss: Box<Loss>,
        /// How much of each target moves to the uniform distribution, in [0, 1].
        smoothing: f32,
    },
}

/// The function of (y_true, y_pred) a custom loss computes (Keras' argument order).
pub type LossFn = dyn Fn(&Tensor, &Tensor) -> Result<Tensor> + Send + Sync;

/// A loss of one's own: a name (shown in errors) and a function of `(y_true, y_pred)`, in
/// Keras' order, giving a loss per sample (or any tensor), which `fit` averages, as Keras'
/// default reduction does. It is differentiated like any other tensor code.
#[derive(Clone)]
pub struct CustomLoss {
    name: String,
    f: Arc<LossFn>,
}

impl std::fmt::Debug for CustomLoss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Custom({:?})", self.name)
    }
}

/// Two custom losses are equal when they are the same function (copies of one `Loss`).
impl PartialEq for CustomLoss {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name && Arc::ptr_eq(&self.f, &other.f)
    }
}

impl CustomLoss {
    /// The name it was given.
    pub fn name(&self) -> &str {
        &self.name
    }
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

/// Labels for the hinge losses: when every label is 0 or 1, mapped to -1 and 1 (as Keras does),
/// else as they are. Decided on the device, without reading the labels back.
fn hinge_labels(y: &Tensor) -> Result<Tensor> {
    use weft_core::ops::BinaryOp;
    let binary = y.cmp_scalar(BinaryOp::Eq, 0.0)?.add(&y.cmp_scalar(BinaryOp::Eq, 1.0)?)?;
    let all = binary.flatten_all()?.min(&[0], false)?;
    y.add(&all.mul(&y.add_scalar(-1.0)?)?)
}

/// `x` divided by its length along the last axis (at least 1e-6, as Keras' `normalize`).
fn unit(x: &Tensor) -> Result<Tensor> {
    x.mul(&x.square()?.sum(&[-1], true)?.clamp(1e-12, f32::INFINITY)?.rsqrt()?)
}

impl Loss {
    /// A loss of one's own, `f(y_true, y_pred)` (Keras' order) giving a loss per sample, which
    /// is averaged. Inside a `ShardedModel` it runs on the whole (gathered) prediction.
    ///
    /// ```
    /// use weft_core::{Device, Tensor};
    /// use weft_nn::Loss;
    /// // Mean squared error with the positive errors counted twice.
    /// let loss = Loss::custom("asymmetric", |y_true, y_pred| {
    ///     let e = y_pred.sub(y_true)?;
    ///     e.square()?.mul(&e.relu()?.sign()?.add_scalar(1.0)?)
    /// });
    /// let (p, t) = (Tensor::from_vec(vec![1f32, -1.0], &[2], &Device::Cpu)?, Tensor::zeros(&[2], &Device::Cpu)?);
    /// assert_eq!(loss.compute(&p, &t)?.to_scalar::<f32>()?, 1.5);
    /// # Ok::<(), weft_core::Error>(())
    /// ```
    pub fn custom(name: &str, f: impl Fn(&Tensor, &Tensor) -> Result<Tensor> + Send + Sync + 'static) -> Loss {
        Loss::Custom(CustomLoss { name: name.to_string(), f: Arc::new(f) })
    }

    /// This cross-entropy against targets smoothed by `smoothing` (Keras' `label_smoothing`):
    /// binary targets become `y (1 - s) + s / 2`, one-hot targets `y (1 - s) + s / classes`.
    /// Any other loss, or `smoothing` outside [0, 1], is an `Err`.
    ///
    /// ```
    /// use weft_nn::Loss;
    /// let loss = Loss::CategoricalCrossentropy { from_logits: true }.with_label_smoothing(0.1)?;
    /// assert!(Loss::MeanSquaredError.with_label_smoothing(0.1).is_err());
    /// # let _ = loss;
    /// # Ok::<(), weft_core::Error>(())
    /// ```
    pub fn with_label_smoothing(self, smoothing: f32) -> Result<Loss> {
        if !(0.0..=1.0).contains(&smoothing) {
            return Err(Error::invalid("label_smoothing", format!("must be in [0, 1], got {smoothing}")));
        }
        match self {
            Loss::BinaryCrossentropy { .. } | Loss::CategoricalCrossentropy { .. } => {
                Ok(Loss::LabelSmoothing { loss: Box::new(self), smoothing })
            }
            other => Err(Error::invalid(
                "label_smoothing",
                format!("smooths binary and categorical cross-entropy targets, not those of {other:?}"),
            )),
        }
    }

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
        match self {
            Loss::LabelSmoothing { loss, smoothing } => {
                let share = match **loss {
                    Loss::BinaryCrossentropy { .. } => 0.5,
                    Loss::CategoricalCrossentropy { .. } => 1.0 / class_count("label smoothing", y_pred)? as f32,
                    ref other => {
                        return Err(Error::invalid(
                            "label_smoothing",
                            format!("cannot smooth the targets of {other:?}"),
                        ));
                    }
                };
                let y = y_true.to_dtype(weft_core::DType::F32)?.affine(1.0 - smoothing, smoothing * share)?;
                loss.compute(y_pred, &y)
            }
            Loss::Custom(c) => {
                let per = (c.f)(y_true, y_pred).map_err(|e| Error::invalid("loss", format!("{}: {e}", c.name)))?;
                if per.dtype() != weft_core::DType::F32 || per.numel() == 0 {
                    return Err(Error::invalid(
                        "loss",
                        format!(
                            "{} gave a {:?} tensor of shape {:?}; a loss is f32 values",
                            c.name,
                            per.dtype(),
                            per.dims()
                        ),
                    ));
                }
                per.mean_all()
            }
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
                let logp = if *from_logits { y_pred.log_softmax(-1)? } else { prob_log(y_pred)? };
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
                if *from_logits {
                    Tensor::cross_entropy(y_pred, &labels)
                } else {
                    let rows = y_pred.numel() / classes;
                    let logp = prob_log(y_pred)?.reshape(&[rows, classes])?;
                    logp.gather(1, &labels.reshape(&[rows, 1])?)?.mean_all()?.neg()
                }
            }
            Loss::MeanAbsoluteError => {
                same_shape()?;
                y_pred.sub(y_true)?.abs()?.mean_all()
            }
            Loss::MeanAbsolutePercentageError => {
                same_shape()?;
                let scale = y_true.abs()?.clamp(EPS, f32::INFINITY)?;
                y_true.sub(y_pred)?.div(&scale)?.abs()?.mean_all()?.mul_scalar(100.0)
            }
            Loss::MeanSquaredLogarithmicError => {
                same_shape()?;
                let log1 = |t: &Tensor| t.clamp(EPS, f32::INFINITY)?.add_scalar(1.0)?.log();
                log1(y_pred)?.sub(&log1(y_true)?)?.square()?.mean_all()
            }
            Loss::Huber { delta } => {
                same_shape()?;
                if !(*delta > 0.0 && delta.is_finite()) {
                    return Err(Error::invalid("Huber loss", format!("delta {delta} must be a positive number")));
                }
                let a = y_pred.sub(y_true)?.abs()?;
                let q = a.clamp(f32::NEG_INFINITY, *delta)?;
                q.square()?.mul_scalar(0.5)?.add(&a.sub(&q)?.mul_scalar(*delta)?)?.mean_all()
            }
            Loss::LogCosh => {
                same_shape()?;
                // log(cosh(x)) = x + softplus(-2x) - log(2): no overflow for large |x|.
                let x = y_pred.sub(y_true)?;
                x.add(&x.mul_scalar(-2.0)?.softplus()?)?.add_scalar(-std::f32::consts::LN_2)?.mean_all()
            }
            Loss::KlDivergence => {
                same_shape()?;
                let rows = (y_pred.numel() / class_count("KL divergence", y_pred)?) as f32;
                let (t, p) = (y_true.clamp(EPS, 1.0)?, y_pred.clamp(EPS, 1.0)?);
                t.mul(&t.div(&p)?.log()?)?.sum_all()?.mul_scalar(1.0 / rows)
            }
            Loss::Poisson => {
                same_shape()?;
                y_pred.sub(&y_true.mul(&y_pred.add_scalar(EPS)?.log()?)?)?.mean_all()
            }
            Loss::CosineSimilarity => {
                same_shape()?;
                let rows = (y_pred.numel() / class_count("cosine similarity", y_pred)?) as f32;
                unit(y_true)?.mul(&unit(y_pred)?)?.sum_all()?.mul_scalar(-1.0 / rows)
            }
            Loss::Hinge | Loss::SquaredHinge => {
                same_shape()?;
                let margin = hinge_labels(y_true)?.mul(y_pred)?.affine(-1.0, 1.0)?.relu()?;
                let m = if *self == Loss::SquaredHinge { margin.square()? } else { margin };
                m.mean_all()
            }
            Loss::CategoricalHinge => {
                same_shape()?;
                class_count("categorical hinge", y_pred)?;
                let pos = y_true.mul(y_pred)?.sum(&[-1], false)?;
                let neg = y_true.affine(-1.0, 1.0)?.mul(y_pred)?.max(&[-1], false)?;
                neg.sub(&pos)?.add_scalar(1.0)?.relu()?.mean_all()
            }
        }
    }

    /// The loss Keras calls `name` (with Keras' defaults: `from_logits` false, Huber's delta 1),
    /// e.g. from a Keras config: `"mse"`, `"mean_absolute_error"`, `"huber"`, `"kld"`, ...
    /// An unknown name is an `Err` listing the known ones.
    ///
    /// ```
    /// use weft_nn::Loss;
    /// assert_eq!(Loss::from_name("mae")?, Loss::MeanAbsoluteError);
    /// assert_eq!(Loss::from_name("huber")?, Loss::Huber { delta: 1.0 });
    /// # Ok::<(), weft_core::Error>(())
    /// ```
    pub fn from_name(name: &str) -> Result<Loss> {
        let known: &[(&[&str], Loss)] = &[
            (&["mse", "mean_squared_error"], Loss::MeanSquaredError),
            (&["mae", "mean_absolute_error"], Loss::MeanAbsoluteError),
            (&["mape", "mean_absolute_percentage_error"], Loss::MeanAbsolutePercentageError),
            (&["msle", "mean_squared_logarithmic_error"], Loss::MeanSquaredLogarithmicError),
            (&["huber", "huber_loss"], Loss::Huber { delta: 1.0 }),
            (&["log_cosh", "logcosh"], Loss::LogCosh),
            (&["kld", "kl_divergence", "kullback_leibler_divergence"], Loss::KlDivergence),
            (&["poisson"], Loss::Poisson),
            (&["cosine_similarity"], Loss::CosineSimilarity),
            (&["hinge"], Loss::Hinge),
            (&["squared_hinge"], Loss::SquaredHinge),
            (&["categorical_hinge"], Loss::CategoricalHinge),
            (&["binary_crossentropy", "bce"], Loss::BinaryCrossentropy { from_logits: false }),
            (&["categorical_crossentropy", "cce"], Loss::CategoricalCrossentropy { from_logits: false }),
            (&["sparse_categorical_crossentropy", "scce"], Loss::SparseCategoricalCrossentropy { from_logits: false }),
        ];
        known.iter().find(|(names, _)| names.contains(&name)).map(|(_, l)| l.clone()).ok_or_else(|| {
            let all: Vec<&str> = known.iter().map(|(n, _)| n[n.len().min(2) - 1]).collect();
            Error::invalid("Loss::from_name", format!("no loss {name:?}; known: {}", all.join(", ")))
        })
    }
}
