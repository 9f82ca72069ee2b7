//! Keras' `AUC`: the area under the ROC or the precision-recall curve, from how many of the
//! positives and of the negatives pass each of a row of thresholds.

use weft_core::{DType, Error, Result, Tensor, no_grad};

/// Which curve [`Auc`] takes the area under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AucCurve {
    /// True-positive rate against false-positive rate (Keras' default, `"ROC"`).
    #[default]
    Roc,
    /// Precision against recall (`"PR"`), interpolated as Keras does (Davis and Goadrich).
    Pr,
}

/// Keras' `AUC` with its defaults (200 thresholds, the ROC curve, the interpolated sum): the
/// predictions (probabilities clipped to [0, 1], or logits with `from_logits`) against labels where any non-zero
/// value is a positive, all values pooled (Keras' `multi_label=False`), accumulated over the
/// epoch. Used as [`Metric::Auc`](crate::Metric::Auc), reported as `auc`.
///
/// ```
/// use weft_core::{Device, Tensor};
/// use weft_nn::{Auc, Metric};
/// let auc = Metric::Auc(Auc::new());
/// let p = Tensor::from_vec(vec![0.1f32, 0.8, 0.4, 0.9], &[4, 1], &Device::Cpu)?;
/// let y = Tensor::from_vec(vec![0f32, 1.0, 0.0, 1.0], &[4, 1], &Device::Cpu)?;
/// assert!((auc.value(&p, &y)? - 1.0).abs() < 1e-6); // every positive above every negative
/// # Ok::<(), weft_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Auc {
    num_thresholds: usize,
    curve: AucCurve,
    from_logits: bool,
}

impl Default for Auc {
    fn default() -> Self {
        Auc::new()
    }
}

impl Auc {
    /// 200 thresholds, the ROC curve, probabilities.
    pub fn new() -> Self {
        Auc { num_thresholds: 200, curve: AucCurve::Roc, from_logits: false }
    }
    /// How many thresholds (at least 2; Keras' default 200): -1e-7, then evenly from
    /// `1 / (n - 1)` to `(n - 2) / (n - 1)`, then 1 + 1e-7.
    pub fn num_thresholds(mut self, n: usize) -> Self {
        self.num_thresholds = n;
        self
    }
    /// Which curve.
    pub fn curve(mut self, curve: AucCurve) -> Self {
        self.curve = curve;
        self
    }
    /// Whether the predictions are logits (a sigmoid is applied first).
    pub fn from_logits(mut self, on: bool) -> Self {
        self.from_logits = on;
        self
    }

    /// Keras' thresholds, computed in f64 and compared in f32 as Keras compares them.
    fn thresholds(&self) -> Vec<f32> {
        let n = self.num_thresholds;
        let mut t = vec![-1e-7f32];
        t.extend((0..n.saturating_sub(2)).map(|i| ((i + 1) as f64 / (n - 1) as f64) as f32));
        t.push((1.0f64 + 1e-7) as f32);
        t
    }

    /// An `Err` unless 2 <= `num_thresholds` <= 1,000,000.
    pub(crate) fn validate(&self) -> Result<()> {
        if (2..=1_000_000).contains(&self.num_thresholds) {
            return Ok(());
        }
        Err(Error::invalid("auc", format!("num_thresholds must be in [2, 1000000], got {}", self.num_thresholds)))
    }

    /// The length of the running state: how many positives, then how many negatives, pass
    /// exactly k thresholds, for k in 0..=n.
    pub(crate) fn state_len(&self) -> usize {
        2 * (self.num_thresholds + 1)
    }

    /// This batch's counts (added to the state over batches and over a data axis).
    pub(crate) fn update(&self, y_pred: &Tensor, y_true: &Tensor) -> Result<Vec<f64>> {
        self.validate()?;
        let squeezed = |d: &[usize]| d.iter().copied().filter(|&n| n != 1).collect::<Vec<_>>();
        if squeezed(y_pred.dims()) != squeezed(y_true.dims()) || y_pred.numel() != y_true.numel() {
            return Err(Error::invalid(
                "metric",
                format!(
                    "auc: targets of shape {:?} do not fit predictions of shape {:?}",
                    y_true.dims(),
                    y_pred.dims()
                ),
            ));
        }
        let (p, y) = no_grad(|| {
            let p = if self.from_logits { y_pred.sigmoid()? } else { y_pred.clone() };
            Ok::<_, Error>((p.to_dtype(DType::F32)?.to_vec::<f32>()?, y_true.to_dtype(DType::F32)?.to_vec::<f32>()?))
        })?;
        let t = self.thresholds();
        let n = self.num_thresholds + 1;
        let mut counts = vec![0f64; 2 * n];
        for (p, y) in p.iter().zip(&y) {
            // How many thresholds p is above, once clipped to [0, 1] as Keras clips it (none for
            // NaN).
            let p = if p.is_nan() { *p } else { p.clamp(0.0, 1.0) };
            let k = t.partition_point(|t| p > *t);
            counts[if *y != 0.0 { k } else { n + k }] += 1.0;
        }
        Ok(counts)
    }

    /// The area from the accumulated counts.
    pub(crate) fn result(&self, state: &[f64]) -> f32 {
        let n = self.num_thresholds;
        let (pos, neg) = state.split_at(n + 1);
        // Passing threshold i: passing more than i of them.
        let above = |h: &[f64]| -> Vec<f64> { (0..n).map(|i| h[i + 1..].iter().sum()).collect() };
        let (tp, fp) = (above(pos), above(neg));
        let (p_all, n_all): (f64, f64) = (pos.iter().sum(), neg.iter().sum());
        let fn_: Vec<f64> = tp.iter().map(|t| p_all - t).collect();
        let tn: Vec<f64> = fp.iter().map(|f| n_all - f).collect();
        let div = |a: f64, b: f64| if b == 0.0 { 0.0 } else { a / b };
        let area: f64 = match self.curve {
            AucCurve::Roc => {
                let tpr: Vec<f64> = (0..n).map(|i| div(tp[i], tp[i] + fn_[i])).collect();
                let fpr: Vec<f64> = (0..n).map(|i| div(fp[i], fp[i] + tn[i])).collect();
                (0..n - 1).map(|i| (fpr[i] - fpr[i + 1]) * (tpr[i] + tpr[i + 1]) / 2.0).sum()
            }
            AucCurve::Pr => (0..n - 1)
                .map(|i| {
                    let (pa, pb) = (tp[i] + fp[i], tp[i + 1] + fp[i + 1]);
                    let dtp = tp[i] - tp[i + 1];
                    let slope = div(dtp, (pa - pb).max(0.0));
                    let intercept = tp[i + 1] - slope * pb;
                    let ratio = if pa > 0.0 && pb > 0.0 { div(pa, pb.max(0.0)) } else { 1.0 };
                    div(slope * (dtp + intercept * ratio.ln()), (tp[i + 1] + fn_[i + 1]).max(0.0))
                })
                .sum(),
        };
        area as f32
    }
}
