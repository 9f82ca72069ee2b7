//! Learning-rate schedules, read at every step (never frozen to a number).

/// A learning rate as a function of the step (the optimizer's iteration count, from 0).
#[derive(Debug, Clone, PartialEq)]
pub enum LearningRate {
    /// The same rate every step.
    Constant(f32),
    /// `initial * rate^(step / decay_steps)` (with `staircase`, the exponent is floored).
    ExponentialDecay {
        /// Rate at step 0.
        initial: f32,
        /// Steps per factor of `rate`.
        decay_steps: u64,
        /// The factor.
        rate: f32,
        /// Decay in whole steps of `decay_steps`.
        staircase: bool,
    },
    /// Linear warmup from `initial` to `peak` over `warmup_steps`, then cosine decay from `peak`
    /// to `peak * alpha` over `decay_steps` (Keras' CosineDecay with a warmup target).
    CosineDecay {
        /// Rate at step 0.
        initial: f32,
        /// Rate at the end of warmup (equal to `initial` for no warmup).
        peak: f32,
        /// Steps of linear warmup.
        warmup_steps: u64,
        /// Steps of cosine decay after warmup.
        decay_steps: u64,
        /// Final rate as a fraction of `peak`.
        alpha: f32,
    },
    /// `values[0]` up to and including step `boundaries[0]`, `values[i]` for steps in
    /// `(boundaries[i-1], boundaries[i]]`, and the last value after the last boundary (Keras'
    /// `PiecewiseConstantDecay`).
    PiecewiseConstant {
        /// Increasing step boundaries.
        boundaries: Vec<u64>,
        /// One more value than boundaries.
        values: Vec<f32>,
    },
}

impl From<f32> for LearningRate {
    fn from(v: f32) -> Self {
        LearningRate::Constant(v)
    }
}

impl LearningRate {
    /// The rate at `step`.
    ///
    /// ```
    /// use weft_nn::optim::LearningRate;
    /// let lr = LearningRate::CosineDecay { initial: 0.0, peak: 1.0, warmup_steps: 10, decay_steps: 100, alpha: 0.0 };
    /// assert_eq!(lr.at(5), 0.5);      // half way through warmup
    /// assert_eq!(lr.at(10), 1.0);     // the peak
    /// assert!(lr.at(110).abs() < 1e-6); // fully decayed
    /// ```
    pub fn at(&self, step: u64) -> f32 {
        match self {
            LearningRate::Constant(v) => *v,
            LearningRate::ExponentialDecay { initial, decay_steps, rate, staircase } => {
                let p = step as f32 / (*decay_steps).max(1) as f32;
                initial * rate.powf(if *staircase { p.floor() } else { p })
            }
            LearningRate::CosineDecay { initial, peak, warmup_steps, decay_steps, alpha } => {
                if step < *warmup_steps {
                    return initial + (peak - initial) * step as f32 / *warmup_steps as f32;
                }
                let t = ((step - warmup_steps) as f32).min(*decay_steps as f32) / (*decay_steps).max(1) as f32;
                let cosine = 0.5 * (1.0 + (std::f32::consts::PI * t).cos());
                peak * ((1.0 - alpha) * cosine + alpha)
            }
            LearningRate::PiecewiseConstant { boundaries, values } => {
                let i = boundaries.iter().take_while(|&&b| step > b).count();
                // An empty list has no rate (`validate` refuses it): NaN, never a panic.
                values.get(i).or(values.last()).copied().unwrap_or(f32::NAN)
            }
        }
    }

    /// Check the schedule: every rate finite and non-negative, step counts positive, piecewise
    /// boundaries strictly increasing with one more value than boundaries. The `Err` names the
    /// field.
    ///
    /// ```
    /// use weft_nn::optim::LearningRate;
    /// let bad = LearningRate::PiecewiseConstant { boundaries: vec![10, 5], values: vec![1.0, 0.5, 0.1] };
    /// assert!(bad.validate().is_err());
    /// ```
    pub fn validate(&self) -> weft_core::Result<()> {
        use super::rules::check_range;
        let rate = |what: &str, v: f32| check_range(what, v, 0.0, f32::MAX, false);
        let steps = |what: &str, n: u64| {
            if n == 0 {
                return Err(weft_core::Error::invalid("optimizer", format!("{what} must be at least 1")));
            }
            Ok(())
        };
        match self {
            LearningRate::Constant(v) => rate("the learning rate", *v),
            LearningRate::ExponentialDecay { initial, decay_steps, rate: r, .. } => {
                rate("ExponentialDecay initial", *initial)?;
                steps("ExponentialDecay decay_steps", *decay_steps)?;
                check_range("ExponentialDecay rate", *r, 0.0, f32::MAX, false)
            }
            LearningRate::CosineDecay { initial, peak, decay_steps, alpha, .. } => {
                rate("CosineDecay initial", *initial)?;
                rate("CosineDecay peak", *peak)?;
                steps("CosineDecay decay_steps", *decay_steps)?;
                check_range("CosineDecay alpha", *alpha, 0.0, 1.0, false)
            }
            LearningRate::PiecewiseConstant { boundaries, values } => {
                if values.len() != boundaries.len() + 1 {
                    return Err(weft_core::Error::invalid(
                        "optimizer",
                        format!(
                            "PiecewiseConstant needs one more value than boundaries: {} boundaries, {} values",
                            boundaries.len(),
                            values.len()
                        ),
                    ));
                }
                if let Some(w) = boundaries.windows(2).find(|w| w[0] >= w[1]) {
                    return Err(weft_core::Error::invalid(
                        "optimizer",
                        format!("PiecewiseConstant boundaries must increase: {} then {} in {boundaries:?}", w[0], w[1]),
                    ));
                }
                values.iter().try_for_each(|v| rate("a PiecewiseConstant value", *v))
            }
        }
    }
}
