//! Constraints: a projection put on a variable after every optimizer step.

use weft_core::{Error, Result, Tensor, no_grad};

/// A projection applied to a variable after each optimizer step (Keras' `constraints`), through a
/// layer's `kernel_constraint` (and `bias_constraint`, `embeddings_constraint`). The norms are
/// taken over `axes` (Keras' `axis`; 0 by default: each output unit's incoming weights of a
/// Dense kernel), with Keras' 1e-7 added to each norm.
///
/// ```
/// use weft_core::{Device, Tensor};
/// use weft_nn::Constraint;
/// let w = Tensor::from_vec(vec![3f32, -4.0], &[2, 1], &Device::Cpu)?;
/// let v = Constraint::max_norm(1.0).project(&w, &|t| Ok(t))?.to_vec::<f32>()?;
/// assert!((v[0] - 0.6).abs() < 1e-6 && (v[1] + 0.8).abs() < 1e-6);
/// assert_eq!(Constraint::NonNeg.project(&w, &|t| Ok(t))?.to_vec::<f32>()?, vec![3.0, 0.0]);
/// # Ok::<(), weft_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub enum Constraint {
    /// Norms above `max_value` are scaled down to it (Keras' `MaxNorm`).
    MaxNorm {
        /// The largest norm.
        max_value: f32,
        /// The axes the norm is taken over.
        axes: Vec<usize>,
    },
    /// Negative values become 0 (`NonNeg`).
    NonNeg,
    /// Every norm is scaled to 1 (`UnitNorm`).
    UnitNorm {
        /// The axes the norm is taken over.
        axes: Vec<usize>,
    },
    /// Norms are moved into `[min_value, max_value]` by `rate` (1: all the way) (`MinMaxNorm`).
    MinMaxNorm {
        /// The smallest norm.
        min_value: f32,
        /// The largest norm.
        max_value: f32,
        /// How far toward the interval each step moves a norm, in [0, 1].
        rate: f32,
        /// The axes the norm is taken over.
        axes: Vec<usize>,
    },
}

impl Constraint {
    /// Keras' `MaxNorm(max_value)`, over axis 0.
    pub fn max_norm(max_value: f32) -> Self {
        Constraint::MaxNorm { max_value, axes: vec![0] }
    }
    /// Keras' `UnitNorm()`, over axis 0.
    pub fn unit_norm() -> Self {
        Constraint::UnitNorm { axes: vec![0] }
    }
    /// Keras' `MinMaxNorm(min_value, max_value)` with rate 1, over axis 0.
    pub fn min_max_norm(min_value: f32, max_value: f32) -> Self {
        Constraint::MinMaxNorm { min_value, max_value, rate: 1.0, axes: vec![0] }
    }

    /// The axes a norm is taken over (none for `NonNeg`).
    pub fn axes(&self) -> &[usize] {
        match self {
            Constraint::MaxNorm { axes, .. } | Constraint::UnitNorm { axes } | Constraint::MinMaxNorm { axes, .. } => {
                axes
            }
            Constraint::NonNeg => &[],
        }
    }

    /// An `Err` naming an axis a variable of `shape` does not have, or a bad bound: checked
    /// before a step is applied, so a constraint that cannot run stops nothing half way.
    pub fn check(&self, shape: &[usize]) -> Result<()> {
        if let Some(a) = self.axes().iter().find(|&&a| a >= shape.len()) {
            return Err(Error::invalid(
                "constraint",
                format!("{self:?}: no axis {a} in a variable of shape {shape:?}"),
            ));
        }
        let ok = match self {
            Constraint::NonNeg | Constraint::UnitNorm { .. } => true,
            Constraint::MaxNorm { max_value, .. } => *max_value >= 0.0 && max_value.is_finite(),
            Constraint::MinMaxNorm { min_value, max_value, rate, .. } => {
                0.0 <= *min_value && min_value <= max_value && max_value.is_finite() && (0.0..=1.0).contains(rate)
            }
        };
        if !ok {
            return Err(Error::invalid(
                "constraint",
                format!("{self:?}: the bounds must be finite, 0 <= min_value <= max_value, and the rate in [0, 1]"),
            ));
        }
        Ok(())
    }

    /// `w` projected. `sum_parts` adds up a sum of squares over the parts of a variable split
    /// along one of the norm's axes (an all-reduce on a sharded model; `Ok` as it is otherwise).
    /// An `Err` names an axis `w` does not have or a bad bound.
    pub fn project(&self, w: &Tensor, sum_parts: &dyn Fn(Tensor) -> Result<Tensor>) -> Result<Tensor> {
        no_grad(|| {
            self.check(w.dims())?;
            let norms = || -> Result<Tensor> {
                let axes: Vec<isize> = self.axes().iter().map(|&a| a as isize).collect();
                sum_parts(w.square()?.sum(&axes, true)?)?.sqrt()
            };
            let scaled = |desired: Tensor, norms: &Tensor| w.mul(&desired.div(&norms.add_scalar(1e-7)?)?);
            match self {
                Constraint::NonNeg => w.relu(),
                Constraint::MaxNorm { max_value, .. } => {
                    let n = norms()?;
                    scaled(n.clamp(0.0, *max_value)?, &n)
                }
                Constraint::UnitNorm { .. } => w.div(&norms()?.add_scalar(1e-7)?),
                Constraint::MinMaxNorm { min_value, max_value, rate, .. } => {
                    let n = norms()?;
                    let desired =
                        n.clamp(*min_value, *max_value)?.mul_scalar(*rate)?.add(&n.mul_scalar(1.0 - rate)?)?;
                    scaled(desired, &n)
                }
            }
        })
    }
}
