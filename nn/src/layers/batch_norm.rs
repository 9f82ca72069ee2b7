//! BatchNormalization: normalizes each feature by the batch's statistics while training and by
//! their moving averages at inference.

use super::layer_norm::{axis_size, fits, norm_options};
use crate::{Ctx, Layer};
use std::sync::{Arc, OnceLock};
use weft_core::collectives::{Collectives, ReduceKind, copy_to_parallel, reduce_from_parallel};
use weft_core::ops::BinaryOp;
use weft_core::{DType, Error, Result, Tensor, Var, no_grad, trace};

/// Keras' `BatchNormalization`: `(x - mean) / sqrt(var + epsilon) * gamma + beta` per feature
/// (the `axis`, last by default). While training, `mean` and `var` are the batch's (over every
/// other axis, counting only unmasked positions when the input carries a mask) and the moving
/// statistics move toward them by `1 - momentum`; at inference the moving statistics are used.
/// Defaults as Keras': momentum 0.99, epsilon 1e-3, `gamma` ones and `beta` zeros (only with
/// `scale` and `center`), moving mean zeros and moving variance ones.
///
/// The moving statistics are non-trainable variables: saved, loaded and split like any other,
/// never touched by an optimizer. A training call records their new values in the
/// [`Ctx`]; `fit` puts them in place only when the step is applied, so a step refused for a
/// non-finite loss leaves them as they were. On a data axis of a sharded model the batch
/// statistics are taken over the whole batch (summed over the axis), so sharded training
/// equals one device.
///
/// ```
/// use weft_core::{Device, Tensor};
/// use weft_nn::{layers::BatchNormalization, Ctx, Layer};
/// let bn = BatchNormalization::new().momentum(0.5);
/// let x = Tensor::from_vec(vec![1f32, 10., 3., 30.], &[2, 2], &Device::Cpu)?;
/// let mut ctx = Ctx::training(0);
/// let y = bn.call(&x, &mut ctx)?; // each column to mean 0, variance ~1
/// assert!((y.to_vec::<f32>()?[0] + 1.0).abs() < 1e-3);
/// ctx.commit_updates()?; // moving mean: 0.5 * 0 + 0.5 * [2, 20]
/// assert_eq!(bn.variables()[2].1.to_vec::<f32>()?, vec![1.0, 10.0]);
/// # Ok::<(), weft_core::Error>(())
/// ```
pub struct BatchNormalization {
    name: String,
    axis: isize,
    momentum: f32,
    epsilon: f32,
    center: bool,
    scale: bool,
    penalties: crate::penalty::Penalties,
    vars: OnceLock<Vars>,
}

struct Vars {
    gamma: Option<Var>,
    beta: Option<Var>,
    moving_mean: Var,
    moving_variance: Var,
}

impl Default for BatchNormalization {
    fn default() -> Self {
        BatchNormalization::new()
    }
}

impl BatchNormalization {
    /// Batch normalization of the last axis, with Keras' defaults.
    pub fn new() -> Self {
        BatchNormalization {
            name: String::new(),
            axis: -1,
            momentum: 0.99,
            epsilon: 1e-3,
            center: true,
            scale: true,
            penalties: crate::penalty::Penalties::default(),
            vars: OnceLock::new(),
        }
    }
    /// How much of the moving statistics each training step keeps, in [0, 1].
    pub fn momentum(mut self, momentum: f32) -> Self {
        self.momentum = momentum;
        self
    }
    norm_options!(center scale);

    fn build(&self, n: usize, x: &Tensor) -> Result<&Vars> {
        if let Some(v) = self.vars.get() {
            return Ok(v);
        }
        let dev = x.device();
        let vars = Vars {
            gamma: if self.scale { Some(Var::new(Tensor::ones(&[n], dev)?)?) } else { None },
            beta: if self.center { Some(Var::new(Tensor::zeros(&[n], dev)?)?) } else { None },
            moving_mean: Var::non_trainable(Tensor::zeros(&[n], dev)?)?,
            moving_variance: Var::non_trainable(Tensor::ones(&[n], dev)?)?,
        };
        let _ = self.vars.set(vars);
        Ok(self.vars.get().expect("just set"))
    }

    fn forward(&self, x: &Tensor, mask: Option<&Tensor>, ctx: &mut Ctx) -> Result<Tensor> {
        let _scope = crate::scope::enter(self);
        const KIND: &str = "BatchNormalization";
        let path = trace::current_scope();
        if !((0.0..=1.0).contains(&self.momentum) && self.epsilon > 0.0 && self.epsilon.is_finite()) {
            return Err(Error::invalid(
                KIND,
                format!(
                    "{path}: momentum must be in [0, 1] and epsilon a finite number above 0, got {} and {}",
                    self.momentum, self.epsilon
                ),
            ));
        }
        let (a, n) = axis_size(KIND, x, self.axis)?;
        let v = self.build(n, x)?;
        for var in
            [Some(&v.moving_mean), Some(&v.moving_variance), v.gamma.as_ref(), v.beta.as_ref()].into_iter().flatten()
        {
            fits(KIND, var, n, x)?;
        }
        // Per-feature values shaped to broadcast against x: [1, .., n, .., 1].
        let mut shape = vec![1; x.rank()];
        shape[a] = n;
        let (mean, variance) = if ctx.training {
            let keep = match mask {
                Some(m) => Some(keep_mask(&path, x, m)?),
                None => None,
            };
            let data = ctx.tp.as_ref().filter(|tp| tp.data.world_size() > 1).map(|tp| tp.data.clone());
            let (mean, variance) = moments(&path, x, a, keep.as_ref(), data)?;
            let kept = 1.0 - self.momentum;
            let (mean_n, var_n) = (mean.detach().reshape(&[n])?, variance.detach().reshape(&[n])?);
            // From the value a call earlier in this step left, if any (a shared layer).
            let base = |v: &Var| ctx.pending(v).cloned().unwrap_or_else(|| v.as_tensor().clone());
            let new_mean = base(&v.moving_mean).mul_scalar(self.momentum)?.add(&mean_n.mul_scalar(kept)?)?;
            let new_var = base(&v.moving_variance).mul_scalar(self.momentum)?.add(&var_n.mul_scalar(kept)?)?;
            ctx.record_update(&v.moving_mean, new_mean);
            ctx.record_update(&v.moving_variance, new_var);
            (mean, variance)
        } else {
            (v.moving_mean.reshape(&shape)?, v.moving_variance.reshape(&shape)?)
        };
        let mut inv = variance.add_scalar(self.epsilon)?.rsqrt()?;
        if let Some(g) = &v.gamma {
            inv = inv.mul(&g.reshape(&shape)?)?;
        }
        let mut y = x.sub(&mean)?.mul(&inv)?;
        if let Some(b) = &v.beta {
            y = y.add(&b.reshape(&shape)?)?;
        }
        self.penalties.activity(&y, ctx)?;
        Ok(y)
    }
}

/// The mask as 1 (kept) or 0 over x's shape, from a mask shaped as x without its last axis.
fn keep_mask(path: &str, x: &Tensor, m: &Tensor) -> Result<Tensor> {
    let r = x.rank();
    if r == 0 || m.dims() != &x.dims()[..r - 1] {
        return Err(Error::invalid(
            "BatchNormalization",
            format!(
                "{path}: a mask of shape {:?} for an input of shape {:?} (it must be the input's without its last axis)",
                m.dims(),
                x.dims()
            ),
        ));
    }
    let keep = m.to_device(x.device())?.to_dtype(DType::F32)?.cmp_scalar(BinaryOp::Ne, 0.0)?;
    keep.unsqueeze(-1)?.broadcast_to(x.dims())?.contiguous()
}

/// The batch mean and (biased) variance of every feature of x along axis `a`, kept as
/// `[1, .., n, .., 1]`: over the kept positions only when there is a mask (divided by their
/// count plus 1e-7, as Keras does), and over the whole batch on a data axis (sums all-reduced,
/// with the gradient flowing back to every rank's part).
fn moments(
    path: &str,
    x: &Tensor,
    a: usize,
    keep: Option<&Tensor>,
    data: Option<Arc<dyn Collectives>>,
) -> Result<(Tensor, Tensor)> {
    let axes: Vec<isize> = (0..x.rank()).filter(|&i| i != a).map(|i| i as isize).collect();
    let whole = |t: Tensor| -> Result<Tensor> {
        match &data {
            Some(c) => reduce_from_parallel(&copy_to_parallel(&t, c.clone()), c.clone()),
            None => Ok(t),
        }
    };
    let count = |t: Tensor| -> Result<Tensor> {
        no_grad(|| match &data {
            Some(c) => c.all_reduce(&t, ReduceKind::Sum),
            None => Ok(t),
        })
    };
    match keep {
        None => {
            let local = (x.numel() / x.dims()[a].max(1)) as f32;
            let n = count(Tensor::from_vec(vec![local], &[1], &weft_core::Device::Cpu)?)?.to_vec::<f32>()?[0];
            if n == 0.0 {
                return Err(Error::invalid(
                    "BatchNormalization",
                    format!("{path}: an input of shape {:?} has no values to take batch statistics over", x.dims()),
                ));
            }
            let mean = whole(x.sum(&axes, true)?)?.mul_scalar(1.0 / n)?;
            let variance = whole(x.sub(&mean)?.square()?.sum(&axes, true)?)?.mul_scalar(1.0 / n)?;
            Ok((mean, variance))
        }
        Some(k) => {
            let weight = count(k.sum(&axes, true)?)?.add_scalar(1e-7)?;
            let mean = whole(x.mul(k)?.sum(&axes, true)?)?.div(&weight)?;
            let variance = whole(x.sub(&mean)?.mul(k)?.square()?.sum(&axes, true)?)?.div(&weight)?;
            Ok((mean, variance))
        }
    }
}

impl Layer for BatchNormalization {
    fn call(&self, x: &Tensor, ctx: &mut Ctx) -> Result<Tensor> {
        self.forward(x, None, ctx)
    }
    fn call_with(&self, inputs: &[Tensor], masks: &[Option<Tensor>], ctx: &mut Ctx) -> Result<Tensor> {
        let [x] = inputs else {
            return Err(Error::invalid(
                "BatchNormalization",
                format!("{} takes one input, got {}", self.name, inputs.len()),
            ));
        };
        self.forward(x, masks.first().and_then(Option::as_ref), ctx)
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn set_name(&mut self, name: String) {
        self.name = name;
    }
    fn kind(&self) -> &'static str {
        "BatchNormalization"
    }
    fn split_rule(&self) -> crate::SplitRule {
        crate::SplitRule::Whole { why: "keeps per-feature statistics of the whole batch".into() }
    }
    fn regularizers(&self) -> Vec<(String, crate::Regularizer)> {
        self.penalties.regularizers_of(|v| if v == "gamma" { self.scale } else { self.center })
    }
    fn constraints(&self) -> Vec<(String, crate::Constraint)> {
        self.penalties.constraints_of(|v| if v == "gamma" { self.scale } else { self.center })
    }
    /// gamma and beta (as enabled), then moving_mean and moving_variance (non-trainable), in
    /// Keras' order.
    fn variables(&self) -> Vec<(String, Var)> {
        let Some(v) = self.vars.get() else { return Vec::new() };
        let named = |n: &str, v: Option<&Var>| v.map(|v| (n.to_string(), v.clone()));
        named("gamma", v.gamma.as_ref())
            .into_iter()
            .chain(named("beta", v.beta.as_ref()))
            .chain(named("moving_mean", Some(&v.moving_mean)))
            .chain(named("moving_variance", Some(&v.moving_variance)))
            .collect()
    }
}
