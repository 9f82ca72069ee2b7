//! Metrics, accumulated over an epoch (a running count, not a mean of batch means).

mod auc;

pub use auc::{Auc, AucCurve};
use std::sync::Arc;
use weft_core::ops::BinaryOp;
use weft_core::{DType, Error, Result, Tensor, no_grad};

/// A metric of `(y_pred, y_true)`. `Metric::custom` makes one of any function.
#[derive(Debug, Clone, PartialEq)]
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
    /// Fraction of values whose prediction `> threshold` equals the target (Keras'
    /// `BinaryAccuracy(threshold)`).
    BinaryAccuracyAt(f32),
    /// Fraction of rows whose one-hot target's class is among the `k` highest predictions
    /// (ties with the k-th count as in, as Keras). Keras' default k is 5.
    TopKCategoricalAccuracy(usize),
    /// As [`Metric::TopKCategoricalAccuracy`], against integer labels.
    SparseTopKCategoricalAccuracy(usize),
    /// Of the values predicted positive (`> threshold`), the fraction that are (Keras'
    /// `Precision(thresholds)`; its default threshold is 0.5). 0 when none is predicted positive.
    Precision(f32),
    /// Of the positive values, the fraction predicted positive (`> threshold`).
    Recall(f32),
    /// mean(|y_pred - y_true|)
    MeanAbsoluteError,
    /// mean((y_pred - y_true)^2)
    MeanSquaredError,
    /// The area under the ROC or precision-recall curve (Keras' `AUC`; see [`Auc`]).
    Auc(Auc),
    /// A metric of one's own (see [`Metric::custom`]).
    Custom(CustomMetric),
}

/// The function of (y_true, y_pred) a custom metric computes (Keras' argument order).
pub type MetricFn = dyn Fn(&Tensor, &Tensor) -> Result<Tensor> + Send + Sync;

/// A metric of one's own: a name (its History key) and a function of `(y_true, y_pred)` giving
/// a value per sample (or any tensor of values); the epoch's figure is the mean over every value
/// of every batch, as Keras' `MeanMetricWrapper`.
#[derive(Clone)]
pub struct CustomMetric {
    name: String,
    f: Arc<MetricFn>,
}

impl std::fmt::Debug for CustomMetric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Custom({:?})", self.name)
    }
}

/// Two custom metrics are equal when they are the same function (copies of one `Metric`).
impl PartialEq for CustomMetric {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name && Arc::ptr_eq(&self.f, &other.f)
    }
}

impl Metric {
    /// Name used in histories and progress lines (the name the user chose: `accuracy` stays
    /// `accuracy` whatever it resolves to).
    pub fn name(&self) -> &str {
        match self {
            Metric::Custom(c) => &c.name,
            Metric::Accuracy => "accuracy",
            Metric::BinaryAccuracy => "binary_accuracy",
            Metric::CategoricalAccuracy => "categorical_accuracy",
            Metric::SparseCategoricalAccuracy => "sparse_categorical_accuracy",
            Metric::BinaryAccuracyAt(_) => "binary_accuracy",
            Metric::TopKCategoricalAccuracy(_) => "top_k_categorical_accuracy",
            Metric::SparseTopKCategoricalAccuracy(_) => "sparse_top_k_categorical_accuracy",
            Metric::Precision(_) => "precision",
            Metric::Recall(_) => "recall",
            Metric::MeanAbsoluteError => "mean_absolute_error",
            Metric::MeanSquaredError => "mean_squared_error",
            Metric::Auc(_) => "auc",
        }
    }

    /// The metric Keras calls `name`, with Keras' defaults (`"top_k_categorical_accuracy"`:
    /// k 5; `"precision"`: threshold 0.5), e.g. from a Keras config. An unknown name is an `Err`
    /// listing the known ones.
    ///
    /// ```
    /// use weft_nn::Metric;
    /// assert_eq!(Metric::from_name("mae")?, Metric::MeanAbsoluteError);
    /// assert_eq!(Metric::from_name("precision")?, Metric::Precision(0.5));
    /// # Ok::<(), weft_core::Error>(())
    /// ```
    pub fn from_name(name: &str) -> Result<Metric> {
        let known: [(&[&str], Metric); 11] = [
            (&["accuracy", "acc"], Metric::Accuracy),
            (&["binary_accuracy"], Metric::BinaryAccuracy),
            (&["categorical_accuracy"], Metric::CategoricalAccuracy),
            (&["sparse_categorical_accuracy"], Metric::SparseCategoricalAccuracy),
            (&["top_k_categorical_accuracy"], Metric::TopKCategoricalAccuracy(5)),
            (&["sparse_top_k_categorical_accuracy"], Metric::SparseTopKCategoricalAccuracy(5)),
            (&["precision"], Metric::Precision(0.5)),
            (&["recall"], Metric::Recall(0.5)),
            (&["mae", "mean_absolute_error"], Metric::MeanAbsoluteError),
            (&["mse", "mean_squared_error"], Metric::MeanSquaredError),
            (&["auc"], Metric::Auc(Auc::new())),
        ];
        known.iter().find(|(names, _)| names.contains(&name)).map(|(_, m)| m.clone()).ok_or_else(|| {
            let all: Vec<&str> = known.iter().map(|(n, _)| n[0]).collect();
            Error::invalid("Metric::from_name", format!("no metric {name:?}; known: {}", all.join(", ")))
        })
    }

    /// A metric of one's own named `name` (its History key), `f(y_true, y_pred)` (Keras'
    /// order) giving a value per sample; the epoch's figure is their mean.
    ///
    /// ```
    /// use weft_core::{Device, Tensor};
    /// use weft_nn::Metric;
    /// let within = Metric::custom("within_0.5", |t, p| p.sub(t)?.abs()?.cmp_scalar(weft_core::ops::BinaryOp::Lt, 0.5));
    /// let (p, t) = (Tensor::from_vec(vec![0.1f32, 0.9], &[2], &Device::Cpu)?, Tensor::zeros(&[2], &Device::Cpu)?);
    /// assert_eq!(within.count(&p, &t)?, (1.0, 2.0));
    /// assert_eq!(within.name(), "within_0.5");
    /// # Ok::<(), weft_core::Error>(())
    /// ```
    pub fn custom(name: &str, f: impl Fn(&Tensor, &Tensor) -> Result<Tensor> + Send + Sync + 'static) -> Metric {
        Metric::Custom(CustomMetric { name: name.to_string(), f: Arc::new(f) })
    }

    /// The concrete metric `Accuracy` stands for, given the shapes.
    pub fn resolve(&self, y_pred: &Tensor, y_true: &Tensor) -> Metric {
        if *self != Metric::Accuracy {
            return self.clone();
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

    /// Check the metric's settings (`compile` calls this): an `Err` names a bad one.
    pub fn validate(&self) -> Result<()> {
        match self {
            Metric::Auc(a) => a.validate(),
            _ => Ok(()),
        }
    }

    /// How many numbers the metric's running state holds: 2 (what counts and of how many) for
    /// every metric but AUC.
    pub(crate) fn state_len(&self) -> usize {
        match self {
            Metric::Auc(a) => a.state_len(),
            _ => 2,
        }
    }

    /// One batch's addition to the running state (summed over batches, and over a data axis).
    /// `ignore`: the label the head's loss leaves out (`ignore_class`); a sparse accuracy counts
    /// such a label, when it is no class, as a miss (Keras compares it with the prediction).
    pub(crate) fn update(&self, y_pred: &Tensor, y_true: &Tensor, ignore: Option<i64>) -> Result<Vec<f64>> {
        if let Metric::Auc(a) = self {
            return a.update(y_pred, y_true);
        }
        let sparse = matches!(
            self.resolve(y_pred, y_true),
            Metric::SparseCategoricalAccuracy | Metric::SparseTopKCategoricalAccuracy(_)
        );
        let classes = y_pred.dims().last().copied().unwrap_or(0);
        match ignore {
            Some(c) if sparse && (c < 0 || c as usize >= classes) && classes > 0 => {
                let rows = y_pred.numel() / classes;
                let labels = y_true.to_dtype(DType::F32)?.to_vec::<f32>()?;
                if labels.len() != rows {
                    return self.count(y_pred, y_true).map(|(hit, total)| vec![hit, total]);
                }
                let kept: Vec<u32> = (0..rows as u32).filter(|&i| labels[i as usize] != c as f32).collect();
                if kept.is_empty() {
                    return Ok(vec![0.0, rows as f64]);
                }
                let ids = Tensor::from_vec(kept.clone(), &[kept.len()], y_pred.device())?;
                let p = y_pred.reshape(&[rows, classes])?.index_select(&ids, 0)?;
                let y =
                    y_true.to_dtype(DType::F32)?.reshape(&[rows])?.index_select(&ids.to_device(y_true.device())?, 0)?;
                let (hit, _) = self.count(&p, &y)?;
                Ok(vec![hit, rows as f64])
            }
            _ => self.count(y_pred, y_true).map(|(hit, total)| vec![hit, total]),
        }
    }

    /// The figure of a running state (a ratio of counts is 0 over nothing).
    pub(crate) fn result(&self, state: &[f64]) -> f32 {
        match self {
            Metric::Auc(a) => a.result(state),
            _ => (state[0] / state[1].max(1.0)) as f32,
        }
    }

    /// The metric's figure on one batch.
    ///
    /// ```
    /// use weft_core::{Device, Tensor};
    /// use weft_nn::Metric;
    /// let p = Tensor::from_vec(vec![0.9f32, 0.2, 0.7], &[3, 1], &Device::Cpu)?;
    /// let y = Tensor::from_vec(vec![1f32, 1.0, 0.0], &[3, 1], &Device::Cpu)?;
    /// assert_eq!(Metric::BinaryAccuracy.value(&p, &y)?, 1.0 / 3.0);
    /// # Ok::<(), weft_core::Error>(())
    /// ```
    pub fn value(&self, y_pred: &Tensor, y_true: &Tensor) -> Result<f32> {
        Ok(self.result(&self.update(y_pred, y_true, None)?))
    }

    /// (correct, total) for one batch. A label that is not a class (negative, fractional, too
    /// large) is an `Err`, and shapes that do not fit are an `Err` naming both. AUC, not a ratio
    /// of two counts, is an `Err` (see [`value`](Metric::value)).
    pub fn count(&self, y_pred: &Tensor, y_true: &Tensor) -> Result<(f64, f64)> {
        no_grad(|| {
            if let Metric::Auc(_) = self {
                return Err(Error::invalid("metric", "auc is not a ratio of two counts: use Metric::value"));
            }
            if let Metric::Custom(c) = self {
                let v = (c.f)(y_true, y_pred).map_err(|e| Error::invalid("metric", format!("{}: {e}", c.name)))?;
                let v = v.to_dtype(DType::F32)?;
                return Ok((v.sum_all()?.to_scalar::<f32>()? as f64, v.numel() as f64));
            }
            let misfit = || {
                Error::invalid(
                    "metric",
                    format!(
                        "{}: targets of shape {:?} do not fit predictions of shape {:?}",
                        self.name(),
                        y_true.dims(),
                        y_pred.dims()
                    ),
                )
            };
            let r = y_pred.rank();
            if r == 0 {
                return Err(misfit());
            }
            let classes = y_pred.dims()[r - 1];
            // Integer labels, one per row (a last axis of 1 squeezed, as Keras does).
            let sparse = || -> Result<Tensor> {
                let y =
                    if y_true.rank() == r && y_true.dims()[r - 1] == 1 { y_true.squeeze(-1)? } else { y_true.clone() };
                if y.dims() != &y_pred.dims()[..r - 1] {
                    return Err(misfit());
                }
                Ok(y)
            };
            let (hits, total) = match self.resolve(y_pred, y_true) {
                Metric::SparseCategoricalAccuracy => {
                    let labels = sparse()?.to_index("labels", Some(classes))?.to_dtype(DType::F32)?;
                    let pred = y_pred.argmax(-1, false)?.to_dtype(DType::F32)?;
                    (pred.eq(&labels)?, labels.numel())
                }
                Metric::BinaryAccuracy | Metric::BinaryAccuracyAt(_) => {
                    if y_true.dims() != y_pred.dims() {
                        return Err(misfit());
                    }
                    let threshold = if let Metric::BinaryAccuracyAt(t) = self { *t } else { 0.5 };
                    let y = y_true.to_dtype(DType::F32)?;
                    (y_pred.cmp_scalar(BinaryOp::Gt, threshold)?.eq(&y)?, y.numel())
                }
                Metric::TopKCategoricalAccuracy(k) | Metric::SparseTopKCategoricalAccuracy(k) => {
                    let labels = if matches!(self, Metric::TopKCategoricalAccuracy(_)) {
                        if y_true.dims() != y_pred.dims() {
                            return Err(misfit());
                        }
                        y_true.argmax(-1, false)?
                    } else {
                        sparse()?.to_index("labels", Some(classes))?
                    };
                    // In the top k when fewer than k predictions are strictly higher than the
                    // label's (so ties with the k-th count, as Keras' in_top_k).
                    let rows = y_pred.numel() / classes.max(1);
                    let p = y_pred.reshape(&[rows, classes])?;
                    let at = p.gather(1, &labels.reshape(&[rows, 1])?)?;
                    // A NaN at the label is never in the top k (Keras' in_top_k takes it as -inf).
                    let at = Tensor::where_cond(&at.ne(&at)?, &Tensor::scalar(f32::NEG_INFINITY, at.device())?, &at)?;
                    let higher = p.gt(&at)?.sum(&[-1], false)?;
                    (higher.cmp_scalar(BinaryOp::Lt, k as f32)?, rows)
                }
                Metric::Precision(t) | Metric::Recall(t) => {
                    if y_true.dims() != y_pred.dims() {
                        return Err(misfit());
                    }
                    // Any non-zero label is a positive (Keras casts the labels to bool).
                    let y = y_true.to_dtype(DType::F32)?.cmp_scalar(BinaryOp::Ne, 0.0)?;
                    let predicted = y_pred.cmp_scalar(BinaryOp::Gt, t)?;
                    let true_pos = predicted.mul(&y)?.sum_all()?.to_scalar::<f32>()? as f64;
                    let of = if matches!(self, Metric::Precision(_)) { predicted } else { y };
                    return Ok((true_pos, of.sum_all()?.to_scalar::<f32>()? as f64));
                }
                Metric::MeanAbsoluteError | Metric::MeanSquaredError => {
                    if y_true.dims() != y_pred.dims() {
                        return Err(misfit());
                    }
                    let e = y_pred.sub(&y_true.to_dtype(DType::F32)?)?;
                    let e = if *self == Metric::MeanAbsoluteError { e.abs()? } else { e.square()? };
                    return Ok((e.sum_all()?.to_scalar::<f32>()? as f64, e.numel() as f64));
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
