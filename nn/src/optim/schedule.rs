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
    /// `(initial - end) * (1 - step / decay_steps)^power + end`, holding `end` after
    /// `decay_steps` (Keras' `PolynomialDecay`; defaults end 1e-4, power 1). With `cycle`,
    /// `decay_steps` grows to the next multiple of itself past the step instead.
    PolynomialDecay {
        /// Rate at step 0.
        initial: f32,
        /// Steps to reach `end`.
        decay_steps: u64,
        /// The final rate.
        end: f32,
        /// The polynomial's power.
        power: f32,
        /// Restart the decay each `decay_steps` (from a lower height each time).
        cycle: bool,
    },
    /// `initial / (1 + rate * step / decay_steps)` (with `staircase`, the ratio is floored).
    InverseTimeDecay {
        /// Rate at step 0.
        initial: f32,
        /// Steps per unit of `rate`.
        decay_steps: u64,
        /// How fast the rate falls.
        rate: f32,
        /// Decay in whole steps of `decay_steps`.
        staircase: bool,
    },
    /// Cosine decay with warm restarts (SGDR, Keras' `CosineDecayRestarts`; defaults t_mul 2,
    /// m_mul 1, alpha 0): each period is `t_mul` times longer than the one before and starts at
    /// `m_mul` times its height.
    CosineDecayRestarts {
        /// Rate at step 0.
        initial: f32,
        /// Steps in the first period.
        first_decay_steps: u64,
        /// Each period's length over the one before.
        t_mul: f32,
        /// Each period's starting height over the one before.
        m_mul: f32,
        /// The floor, as a fraction of each period's height.
        alpha: f32,
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
            LearningRate::PolynomialDecay { initial, decay_steps, end, power, cycle } => {
                let (s, d) = (step as f64, (*decay_steps).max(1) as f64);
                let (s, d) = if *cycle { (s, d * if step == 0 { 1.0 } else { (s / d).ceil() }) } else { (s.min(d), d) };
                ((initial - end) as f64 * (1.0 - s / d).powf(*power as f64) + *end as f64) as f32
            }
            LearningRate::InverseTimeDecay { initial, decay_steps, rate, staircase } => {
                let p = step as f64 / (*decay_steps).max(1) as f64;
                let p = if *staircase { p.floor() } else { p };
                (*initial as f64 / (1.0 + *rate as f64 * p)) as f32
            }
            LearningRate::CosineDecayRestarts { initial, first_decay_steps, t_mul, m_mul, alpha } => {
                let (t_mul, m_mul) = (*t_mul as f64, *m_mul as f64);
                let mut done = step as f64 / (*first_decay_steps).max(1) as f64;
                let restart = if t_mul == 1.0 {
                    let r = done.floor();
                    done -= r;
                    r
                } else {
                    let r = ((1.0 - done * (1.0 - t_mul)).ln() / t_mul.ln()).floor();
                    let before = (1.0 - t_mul.powf(r)) / (1.0 - t_mul);
                    done = (done - before) / t_mul.powf(r);
                    r
                };
                let cosine = 0.5 * m_mul.powf(restart) * (1.0 + (std::f64::consts::PI * done).cos());
                (*initial as f64 * ((1.0 - *alpha as f64) * cosine + *alpha as f64)) as f32
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
            LearningRate::PolynomialDecay { initial, decay_steps, end, power, .. } => {
                rate("PolynomialDecay initial", *initial)?;
                steps("PolynomialDecay decay_steps", *decay_steps)?;
                rate("PolynomialDecay end", *end)?;
                check_range("PolynomialDecay power", *power, 0.0, f32::MAX, false)
            }
            LearningRate::InverseTimeDecay { initial, decay_steps, rate: r, .. } => {
                rate("InverseTimeDecay initial", *initial)?;
                steps("InverseTimeDecay decay_steps", *decay_steps)?;
                check_range("InverseTimeDecay rate", *r, 0.0, f32::MAX, false)
            }
            LearningRate::CosineDecayRestarts { initial, first_decay_steps, t_mul, m_mul, alpha } => {
                rate("CosineDecayRestarts initial", *initial)?;
                steps("CosineDecayRestarts first_decay_steps", *first_decay_steps)?;
                check_range("CosineDecayRestarts t_mul", *t_mul, f32::MIN_POSITIVE, f32::MAX, false)?;
                check_range("CosineDecayRestarts m_mul", *m_mul, 0.0, f32::MAX, false)?;
                check_range("CosineDecayRestarts alpha", *alpha, 0.0, 1.0, false)
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
