//! Losses: a per-sample loss, reduced over the batch (by default its mean; see [`Reduction`]).

use std::sync::Arc;
use weft_core::ops::BinaryOp;
use weft_core::{DType, Error, Result, Tensor};

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
    /// A loss with Keras' `reduction` or `ignore_class` (see [`Loss::with_reduction`] and
    /// [`Loss::with_ignore_class`]).
    Options {
        /// The loss.
        loss: Box<Loss>,
        /// How its per-sample values become one number.
        reduction: Reduction,
        /// Labels of this value (sparse categorical cross-entropy) count for nothing.
        ignore_class: Option<i64>,
    },
}

/// How a loss's per-sample values, weighted by the sample weights, become one number (Keras'
/// `reduction`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reduction {
    /// The weighted sum over the number of values (Keras' default, `"sum_over_batch_size"`);
    /// with `ignore_class`, over the number of values kept.
    #[default]
    SumOverBatchSize,
    /// The weighted sum (`"sum"`).
    Sum,
    /// The weighted sum over the sum of the weights (`"mean_with_sample_weight"`).
    MeanWithSampleWeight,
}

/// A loss before its reduction: values per element (averaged over the last axis to give one
/// per sample, as Keras' mean losses do) or already one per sample.
enum Terms {
    Elements(Tensor),
    Samples(Tensor),
}

/// The function of (y_true, y_pred) a custom loss computes (Keras' argument order).
pub type LossFn = dyn Fn(&Tensor, &Tensor) -> Result<Tensor> + Send + Sync;

/// A loss of one's own: a name (shown in errors) and a function of `(y_true, y_pred)`, in
/// Keras' order, giving a loss per sample (or any tensor), which `fit` reduces as the loss's
/// [`Reduction`] says (by default their mean, as Keras). It is differentiated like any other
/// tensor code.
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

/// One loss per sample: element terms averaged over the last axis (kept as they are for a
/// prediction of rank 0 or 1, whose elements are its samples).
fn samples(terms: Terms) -> Result<Tensor> {
    match terms {
        Terms::Elements(t) if t.rank() >= 2 => t.mean(&[-1], false),
        Terms::Elements(t) | Terms::Samples(t) => Ok(t),
    }
}

/// Sample weights shaped to multiply the per-sample losses `v`: `[batch]` (or any leading axes of
/// `v`) gains trailing axes of 1, as Keras expands them.
fn sample_weights(w: &Tensor, v: &Tensor) -> Result<Tensor> {
    // Trailing axes of 1 beyond the losses' rank go, as Keras squeezes them ([n, 1] for [n]).
    let mut w = w.clone();
    while w.rank() > v.rank().max(1) && w.dims().last() == Some(&1) {
        w = w.squeeze(-1)?;
    }
    let fits = w.rank() <= v.rank().max(1) && w.dims() == &v.dims()[..w.rank().min(v.rank())];
    if !fits || (v.rank() == 0 && w.numel() != 1) {
        return Err(Error::invalid(
            "sample_weight",
            format!(
                "weights of shape {:?} do not fit per-sample losses of shape {:?} (give one weight per sample)",
                w.dims(),
                v.dims()
            ),
        ));
    }
    let mut shape = w.dims().to_vec();
    shape.resize(v.rank().max(w.rank()), 1);
    w.to_dtype(DType::F32)?.to_device(v.device())?.reshape(&shape)
}

/// Sparse labels as the loss takes them (shape `[.., 1]` squeezed, as Keras does) and the class
/// count; an `Err` when they do not fit the predictions.
fn sparse_labels(y_pred: &Tensor, y_true: &Tensor) -> Result<(Tensor, usize)> {
    let classes = class_count("sparse categorical cross-entropy", y_pred)?;
    let r = y_pred.rank();
    let y = if y_true.rank() == r && y_true.dims()[r - 1] == 1 { y_true.squeeze(-1)? } else { y_true.clone() };
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
    Ok((y, classes))
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

    /// This loss with another `reduction` (Keras' `reduction=`).
    ///
    /// ```
    /// use weft_core::{Device, Tensor};
    /// use weft_nn::{Loss, Reduction};
    /// let loss = Loss::MeanAbsoluteError.with_reduction(Reduction::Sum);
    /// let (p, t) = (Tensor::from_vec(vec![1f32, -2.0], &[2, 1], &Device::Cpu)?, Tensor::zeros(&[2, 1], &Device::Cpu)?);
    /// assert_eq!(loss.compute(&p, &t)?.to_scalar::<f32>()?, 3.0);
    /// # Ok::<(), weft_core::Error>(())
    /// ```
    pub fn with_reduction(self, reduction: Reduction) -> Loss {
        match self {
            Loss::Options { loss, ignore_class, .. } => Loss::Options { loss, reduction, ignore_class },
            other => Loss::Options { loss: Box::new(other), reduction, ignore_class: None },
        }
    }

    /// This sparse categorical cross-entropy with the labels equal to `class` left out (Keras'
    /// `ignore_class`, e.g. -1 or a padding id): they count for nothing, and the default
    /// reduction averages over the labels kept. Any other loss is an `Err`.
    ///
    /// ```
    /// use weft_core::{Device, Tensor};
    /// use weft_nn::Loss;
    /// let loss = Loss::SparseCategoricalCrossentropy { from_logits: true }.with_ignore_class(-1)?;
    /// let logits = Tensor::from_vec(vec![0f32, 0.0, 5.0, -5.0], &[2, 2], &Device::Cpu)?;
    /// let labels = Tensor::from_vec(vec![0i32, -1], &[2], &Device::Cpu)?;
    /// assert!((loss.compute(&logits, &labels)?.to_scalar::<f32>()? - 2f32.ln()).abs() < 1e-6);
    /// # Ok::<(), weft_core::Error>(())
    /// ```
    pub fn with_ignore_class(self, class: i64) -> Result<Loss> {
        let (loss, reduction) = match self {
            Loss::Options { loss, reduction, .. } => (loss, reduction),
            other => (Box::new(other), Reduction::default()),
        };
        match *loss {
            Loss::SparseCategoricalCrossentropy { .. } => {
                Ok(Loss::Options { loss, reduction, ignore_class: Some(class) })
            }
            other => Err(Error::invalid(
                "ignore_class",
                format!("leaves out labels of sparse categorical cross-entropy, not of {other:?}"),
            )),
        }
    }

    /// The loss without its options, and the label it ignores (`Some` for a sparse
    /// categorical cross-entropy with `ignore_class`).
    pub(crate) fn base(&self) -> (&Loss, Option<i64>) {
        match self {
            Loss::Options { loss, ignore_class, .. } => (loss, *ignore_class),
            other => (other, None),
        }
    }

    /// Whether the loss takes weights, a reduction or ignored labels: then `fit` reduces it
    /// through [`weighted_parts`](Loss::weighted_parts).
    pub(crate) fn has_options(&self) -> bool {
        matches!(self, Loss::Options { .. })
    }

    /// The per-sample losses (Keras' `reduction=None`): one value per sample (and per time step,
    /// for a prediction of rank 3), the mean losses averaged over the last axis; for a
    /// prediction of rank 1, one per element.
    ///
    /// ```
    /// use weft_core::{Device, Tensor};
    /// use weft_nn::Loss;
    /// let p = Tensor::from_vec(vec![1f32, 3.0, 0.0, 0.0], &[2, 2], &Device::Cpu)?;
    /// let per = Loss::MeanSquaredError.per_sample(&p, &Tensor::zeros(&[2, 2], &Device::Cpu)?)?;
    /// assert_eq!(per.to_vec::<f32>()?, vec![5.0, 0.0]);
    /// # Ok::<(), weft_core::Error>(())
    /// ```
    pub fn per_sample(&self, y_pred: &Tensor, y_true: &Tensor) -> Result<Tensor> {
        let (loss, ignore) = self.base();
        let (terms, keep) = loss.terms(y_pred, y_true, ignore)?;
        let v = samples(terms)?;
        match keep {
            Some(k) => v.mul(&k),
            None => Ok(v),
        }
    }

    /// The loss of a batch with a weight per sample (Keras' `sample_weight`: of shape `[batch]`,
    /// or the leading axes of the per-sample losses), reduced as the loss's [`Reduction`] says.
    ///
    /// ```
    /// use weft_core::{Device, Tensor};
    /// use weft_nn::Loss;
    /// let p = Tensor::from_vec(vec![1f32, 3.0], &[2, 1], &Device::Cpu)?;
    /// let w = Tensor::from_vec(vec![1f32, 0.0], &[2], &Device::Cpu)?;
    /// let l = Loss::MeanSquaredError.compute_weighted(&p, &Tensor::zeros(&[2, 1], &Device::Cpu)?, Some(&w))?;
    /// assert_eq!(l.to_scalar::<f32>()?, 0.5); // (1 * 1 + 0 * 9) / 2 samples
    /// # Ok::<(), weft_core::Error>(())
    /// ```
    pub fn compute_weighted(&self, y_pred: &Tensor, y_true: &Tensor, sample_weight: Option<&Tensor>) -> Result<Tensor> {
        match self.weighted_parts(y_pred, y_true, sample_weight)? {
            (sum, Some(over)) => sum.div(&over),
            (sum, None) => Ok(sum),
        }
    }

    /// The weighted sum of the per-sample losses and what it is divided by (a 0-d tensor that
    /// carries no gradient; `None` for [`Reduction::Sum`]): on a data axis `fit` adds the
    /// divisors of the ranks up, so that each rank's part of the loss is its sum over the whole
    /// batch's divisor.
    pub(crate) fn weighted_parts(
        &self,
        y_pred: &Tensor,
        y_true: &Tensor,
        sample_weight: Option<&Tensor>,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let reduction = match self {
            Loss::Options { reduction, .. } => *reduction,
            _ => Reduction::default(),
        };
        let (loss, ignore) = self.base();
        let (terms, keep) = loss.terms(y_pred, y_true, ignore)?;
        let v = samples(terms)?;
        let dev = v.device().clone();
        let weight = match sample_weight {
            Some(w) => Some(sample_weights(w, &v)?),
            None => None,
        };
        // Keras folds the kept positions into the weights.
        let weight = match (weight, &keep) {
            (Some(w), Some(k)) => Some(w.mul(k)?),
            (None, Some(k)) => Some(k.clone()),
            (w, None) => w,
        };
        let sum = match &weight {
            Some(w) => v.mul(w)?.sum_all()?,
            None => v.sum_all()?,
        };
        let count = || Tensor::scalar(v.numel() as f32, &dev);
        let over = weft_core::no_grad(|| match (reduction, &keep, &weight) {
            (Reduction::Sum, _, _) => Ok(None),
            (Reduction::SumOverBatchSize, Some(k), _) => k.sum_all().map(Some),
            (Reduction::SumOverBatchSize, None, _) => count().map(Some),
            (Reduction::MeanWithSampleWeight, _, Some(w)) => w.sum_all().map(Some),
            (Reduction::MeanWithSampleWeight, _, None) => count().map(Some),
        })?;
        // Keras divides "no NaN": a batch of nothing kept (or of weights summing to 0) is 0.
        Ok((sum, over.map(|o| o.clamp(f32::MIN_POSITIVE, f32::INFINITY)).transpose()?))
    }

    /// The mean loss over the batch, as a 0-dimensional tensor. A sparse label that is not a
    /// class is an `Err` naming it: at once on the Cpu; on a GPU from the first read of the loss
    /// or of anything computed from it (the check does not wait for the device).
    pub fn compute(&self, y_pred: &Tensor, y_true: &Tensor) -> Result<Tensor> {
        match self {
            Loss::Options { .. } => self.compute_weighted(y_pred, y_true, None),
            Loss::SparseCategoricalCrossentropy { from_logits: true } => {
                // Log-softmax and the pick of each label: one node each way (on a GPU, one kernel,
                // which checks u32 labels itself: no dispatch of their own to check them first).
                let (y, classes) = sparse_labels(y_pred, y_true)?;
                let on_gpu = matches!(y.device(), weft_core::Device::Gpu(_)) && y.dtype() == DType::U32;
                let y = if on_gpu { y } else { y.to_index_later("labels", Some(classes))? };
                Tensor::cross_entropy(y_pred, &y)
            }
            _ => match self.terms(y_pred, y_true, None)?.0 {
                Terms::Elements(t) | Terms::Samples(t) => t.mean_all(),
            },
        }
    }

    /// The loss before its reduction, and, with `ignore` (sparse labels only), which labels are
    /// kept (1) or left out (0).
    fn terms(&self, y_pred: &Tensor, y_true: &Tensor, ignore: Option<i64>) -> Result<(Terms, Option<Tensor>)> {
        if ignore.is_some() && !matches!(self, Loss::SparseCategoricalCrossentropy { .. }) {
            return Err(Error::invalid(
                "ignore_class",
                format!("leaves out labels of sparse categorical cross-entropy, not of {self:?}"),
            ));
        }
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
        let terms = match self {
            Loss::Options { loss, ignore_class, .. } => return loss.terms(y_pred, y_true, *ignore_class),
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
                return loss.terms(y_pred, &y, None);
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
                Terms::Samples(per)
            }
            Loss::MeanSquaredError => {
                same_shape()?;
                Terms::Elements(y_pred.sub(y_true)?.square()?)
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
                Terms::Elements(pos.sub(&x.mul(y_true)?)?.add(&soft)?)
            }
            Loss::BinaryCrossentropy { from_logits: false } => {
                same_shape()?;
                // Keras: clip to [eps, 1 - eps], then eps inside each log.
                let p = y_pred.clamp(EPS, 1.0 - EPS)?;
                let pos = y_true.mul(&p.add_scalar(EPS)?.log()?)?;
                let neg = y_true.affine(-1.0, 1.0)?.mul(&p.affine(-1.0, 1.0 + EPS)?.log()?)?;
                Terms::Elements(pos.add(&neg)?.neg()?)
            }
            Loss::CategoricalCrossentropy { from_logits } => {
                same_shape()?;
                class_count("categorical cross-entropy", y_pred)?;
                let logp = if *from_logits { y_pred.log_softmax(-1)? } else { prob_log(y_pred)? };
                Terms::Samples(y_true.mul(&logp)?.sum(&[-1], false)?.neg()?)
            }
            Loss::SparseCategoricalCrossentropy { from_logits } => {
                let (y, classes) = sparse_labels(y_pred, y_true)?;
                // Left-out labels become class 0, and their losses are weighted by 0.
                let (y, keep) = match ignore {
                    Some(c) => {
                        let keep = y.to_dtype(DType::F32)?.cmp_scalar(BinaryOp::Ne, c as f32)?;
                        (y.to_dtype(DType::F32)?.mul(&keep)?, Some(keep))
                    }
                    None => (y, None),
                };
                // Every label must be a whole number in 0..classes: -1 or 2.7 is an error, never class 0 or 2.
                let labels = y.to_index_later("labels", Some(classes))?;
                let logp = if *from_logits { y_pred.log_softmax(-1)? } else { prob_log(y_pred)? };
                let picked = logp.gather(-1, &labels.unsqueeze(-1)?)?.squeeze(-1)?;
                return Ok((Terms::Samples(picked.neg()?), keep));
            }
            Loss::MeanAbsoluteError => {
                same_shape()?;
                Terms::Elements(y_pred.sub(y_true)?.abs()?)
            }
            Loss::MeanAbsolutePercentageError => {
                same_shape()?;
                let scale = y_true.abs()?.clamp(EPS, f32::INFINITY)?;
                Terms::Elements(y_true.sub(y_pred)?.div(&scale)?.abs()?.mul_scalar(100.0)?)
            }
            Loss::MeanSquaredLogarithmicError => {
                same_shape()?;
                let log1 = |t: &Tensor| t.clamp(EPS, f32::INFINITY)?.add_scalar(1.0)?.log();
                Terms::Elements(log1(y_pred)?.sub(&log1(y_true)?)?.square()?)
            }
            Loss::Huber { delta } => {
                same_shape()?;
                if !(*delta > 0.0 && delta.is_finite()) {
                    return Err(Error::invalid("Huber loss", format!("delta {delta} must be a positive number")));
                }
                let a = y_pred.sub(y_true)?.abs()?;
                let q = a.clamp(f32::NEG_INFINITY, *delta)?;
                Terms::Elements(q.square()?.mul_scalar(0.5)?.add(&a.sub(&q)?.mul_scalar(*delta)?)?)
            }
            Loss::LogCosh => {
                same_shape()?;
                // log(cosh(x)) = x + softplus(-2x) - log(2): no overflow for large |x|.
                let x = y_pred.sub(y_true)?;
                Terms::Elements(x.add(&x.mul_scalar(-2.0)?.softplus()?)?.add_scalar(-std::f32::consts::LN_2)?)
            }
            Loss::KlDivergence => {
                same_shape()?;
                class_count("KL divergence", y_pred)?;
                let (t, p) = (y_true.clamp(EPS, 1.0)?, y_pred.clamp(EPS, 1.0)?);
                Terms::Samples(t.mul(&t.div(&p)?.log()?)?.sum(&[-1], false)?)
            }
            Loss::Poisson => {
                same_shape()?;
                Terms::Elements(y_pred.sub(&y_true.mul(&y_pred.add_scalar(EPS)?.log()?)?)?)
            }
            Loss::CosineSimilarity => {
                same_shape()?;
                class_count("cosine similarity", y_pred)?;
                Terms::Samples(unit(y_true)?.mul(&unit(y_pred)?)?.sum(&[-1], false)?.neg()?)
            }
            Loss::Hinge | Loss::SquaredHinge => {
                same_shape()?;
                let margin = hinge_labels(y_true)?.mul(y_pred)?.affine(-1.0, 1.0)?.relu()?;
                Terms::Elements(if *self == Loss::SquaredHinge { margin.square()? } else { margin })
            }
            Loss::CategoricalHinge => {
                same_shape()?;
                class_count("categorical hinge", y_pred)?;
                let pos = y_true.mul(y_pred)?.sum(&[-1], false)?;
                let neg = y_true.affine(-1.0, 1.0)?.mul(y_pred)?.max(&[-1], false)?;
                Terms::Samples(neg.sub(&pos)?.add_scalar(1.0)?.relu()?)
            }
        };
        Ok((terms, None))
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
