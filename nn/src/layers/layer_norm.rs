//! LayerNormalization (over one axis, with or without its offset and scale) and
//! RMSNormalization.

use crate::{Ctx, Layer};
use std::sync::OnceLock;
use weft_core::layout::resolve_axis;
use weft_core::{Error, Result, Tensor, Var, trace};

/// The builder methods the normalization layers share: `axis`, `epsilon` and `named`, and with
/// `(center scale)` also `center` and `scale` and the regularizers and constraints of `gamma`
/// and `beta` (for a layer with a `penalties` field).
macro_rules! norm_options {
    () => {
        /// The layer's axis (negative counts from the end): the one normalized over, or the
        /// feature (channel) axis of a batch or group normalization.
        pub fn axis(mut self, axis: isize) -> Self {
            self.axis = axis;
            self
        }
        /// Added to the variance before its square root.
        pub fn epsilon(mut self, eps: f32) -> Self {
            self.epsilon = eps;
            self
        }
        /// Give the layer a name.
        pub fn named(mut self, name: &str) -> Self {
            self.name = name.to_string();
            self
        }
    };
    (center scale) => {
        norm_options!();
        crate::penalty::penalty_options!(gamma: gamma_regularizer, gamma_constraint; beta: beta_regularizer, beta_constraint);
        fn penalties_mut(&mut self) -> &mut crate::penalty::Penalties {
            &mut self.penalties
        }
        /// Whether to add the offset `beta`.
        pub fn center(mut self, on: bool) -> Self {
            self.center = on;
            self
        }
        /// Whether to multiply by the scale `gamma`.
        pub fn scale(mut self, on: bool) -> Self {
            self.scale = on;
            self
        }
    };
}
pub(crate) use norm_options;

/// `(x - mean) / sqrt(var + epsilon) * gamma + beta` over one axis (the last by default), as
/// Keras' `LayerNormalization`: epsilon 1e-3, `gamma` only with `scale`, `beta` only with
/// `center` (both on by default).
///
/// ```
/// use weft_core::{Device, Tensor};
/// use weft_nn::{layers::LayerNormalization, Ctx, Layer};
/// let ln = LayerNormalization::new().axis(1).center(false);
/// let y = ln.call(&Tensor::rand(-1.0, 1.0, &[2, 3, 4], 0, &Device::Cpu)?, &mut Ctx::inference())?;
/// assert_eq!(y.dims(), &[2, 3, 4]);
/// assert_eq!(ln.variables().len(), 1); // gamma [3] only
/// # Ok::<(), weft_core::Error>(())
/// ```
pub struct LayerNormalization {
    name: String,
    epsilon: f32,
    axis: isize,
    center: bool,
    scale: bool,
    penalties: crate::penalty::Penalties,
    vars: OnceLock<(Option<Var>, Option<Var>)>,
}

impl Default for LayerNormalization {
    fn default() -> Self {
        LayerNormalization::new()
    }
}

impl LayerNormalization {
    /// Layer norm over the last axis with epsilon 1e-3, gamma ones and beta zeros.
    pub fn new() -> Self {
        LayerNormalization {
            name: String::new(),
            epsilon: 1e-3,
            axis: -1,
            center: true,
            scale: true,
            penalties: crate::penalty::Penalties::default(),
            vars: OnceLock::new(),
        }
    }
    norm_options!(center scale);
}

/// The size of `axis` of `x`, or an `Err` naming the layer.
pub(crate) fn axis_size(kind: &'static str, x: &Tensor, axis: isize) -> Result<(usize, usize)> {
    let a = resolve_axis(kind, axis, x.rank()).map_err(|_| {
        Error::invalid(kind, format!("{}: no axis {axis} in shape {:?}", trace::current_scope(), x.dims()))
    })?;
    Ok((a, x.dims()[a]))
}

/// `v`, or an `Err` when a variable built for another input does not fit this one.
pub(crate) fn fits<'a>(kind: &'static str, v: &'a Var, n: usize, x: &Tensor) -> Result<&'a Var> {
    if v.dims() != [n] {
        return Err(Error::invalid(
            kind,
            format!(
                "{}: input of shape {:?} does not fit a variable of shape {:?}",
                trace::current_scope(),
                x.dims(),
                v.dims()
            ),
        ));
    }
    Ok(v)
}

impl Layer for LayerNormalization {
    fn call(&self, x: &Tensor, ctx: &mut Ctx) -> Result<Tensor> {
        let _scope = crate::scope::enter(self);
        const KIND: &str = "LayerNormalization";
        let (a, n) = axis_size(KIND, x, self.axis)?;
        let (gamma, beta) = match self.vars.get() {
            Some(v) => v,
            None => {
                let g = if self.scale { Some(Var::new(Tensor::ones(&[n], x.device())?)?) } else { None };
                let b = if self.center { Some(Var::new(Tensor::zeros(&[n], x.device())?)?) } else { None };
                let _ = self.vars.set((g, b));
                self.vars.get().expect("just set")
            }
        };
        let gamma = match gamma {
            Some(g) => fits(KIND, g, n, x)?.as_tensor().clone(),
            None => Tensor::ones(&[n], x.device())?,
        };
        let beta = match beta {
            Some(b) => fits(KIND, b, n, x)?.as_tensor().clone(),
            None => Tensor::zeros(&[n], x.device())?,
        };
        // The fused kernel normalizes the last axis: another axis is moved there and back.
        let last = x.rank() - 1;
        let y = if a == last {
            x.layer_norm(&gamma, &beta, self.epsilon)?
        } else {
            let (a, last) = (a as isize, last as isize);
            x.transpose(a, last)?.layer_norm(&gamma, &beta, self.epsilon)?.transpose(a, last)?
        };
        self.penalties.activity(&y, ctx)?;
        Ok(y)
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn set_name(&mut self, name: String) {
        self.name = name;
    }
    fn kind(&self) -> &'static str {
        "LayerNormalization"
    }
    fn split_rule(&self) -> crate::SplitRule {
        crate::SplitRule::Whole { why: "normalizes over the whole width".into() }
    }
    fn regularizers(&self) -> Vec<(String, crate::Regularizer)> {
        self.penalties.regularizers_of(|v| if v == "gamma" { self.scale } else { self.center })
    }
    fn constraints(&self) -> Vec<(String, crate::Constraint)> {
        self.penalties.constraints_of(|v| if v == "gamma" { self.scale } else { self.center })
    }
    fn variables(&self) -> Vec<(String, Var)> {
        let Some((g, b)) = self.vars.get() else { return Vec::new() };
        let named = |n: &str, v: &Option<Var>| v.as_ref().map(|v| (n.to_string(), v.clone()));
        named("gamma", g).into_iter().chain(named("beta", b)).collect()
    }
}

/// `x * rsqrt(mean(x^2) + epsilon) * scale` over one axis (the last by default), as Keras'
/// `RMSNormalization` (epsilon 1e-6, `scale` ones): the normalization of Llama and Gemma.
///
/// ```
/// use weft_core::{Device, Tensor};
/// use weft_nn::{layers::RMSNormalization, Ctx, Layer};
/// let x = Tensor::from_vec(vec![3f32, 4.], &[1, 2], &Device::Cpu)?;
/// let y = RMSNormalization::new().epsilon(0.0).call(&x, &mut Ctx::inference())?;
/// let rms = (12.5f32).sqrt();
/// assert_eq!(y.to_vec::<f32>()?, vec![3.0 / rms, 4.0 / rms]);
/// # Ok::<(), weft_core::Error>(())
/// ```
pub struct RMSNormalization {
    name: String,
    epsilon: f32,
    axis: isize,
    scale: OnceLock<Var>,
}

impl Default for RMSNormalization {
    fn default() -> Self {
        RMSNormalization::new()
    }
}

impl RMSNormalization {
    /// RMS normalization over the last axis, epsilon 1e-6.
    pub fn new() -> Self {
        RMSNormalization { name: String::new(), epsilon: 1e-6, axis: -1, scale: OnceLock::new() }
    }
    norm_options!();
}

impl Layer for RMSNormalization {
    fn call(&self, x: &Tensor, _ctx: &mut Ctx) -> Result<Tensor> {
        let _scope = crate::scope::enter(self);
        const KIND: &str = "RMSNormalization";
        let (a, n) = axis_size(KIND, x, self.axis)?;
        let scale = match self.scale.get() {
            Some(s) => s,
            None => {
                let _ = self.scale.set(Var::new(Tensor::ones(&[n], x.device())?)?);
                self.scale.get().expect("just set")
            }
        };
        let scale = fits(KIND, scale, n, x)?;
        // The scale lies along axis `a`: shaped [n, 1, ..] to broadcast there.
        let mut shape = vec![1; x.rank() - a];
        shape[0] = n;
        let s = scale.as_tensor().reshape(&shape)?;
        let ms = x.square()?.mean(&[a as isize], true)?.add_scalar(self.epsilon)?;
        x.mul(&ms.rsqrt()?)?.mul(&s)
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn set_name(&mut self, name: String) {
        self.name = name;
    }
    fn kind(&self) -> &'static str {
        "RMSNormalization"
    }
    fn split_rule(&self) -> crate::SplitRule {
        crate::SplitRule::Whole { why: "normalizes over the whole width".into() }
    }
    fn variables(&self) -> Vec<(String, Var)> {
        self.scale.get().map(|s| vec![("scale".to_string(), s.clone())]).unwrap_or_default()
    }
}
