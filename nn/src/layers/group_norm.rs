//! GroupNormalization: each sample's channels normalized in groups (instance normalization with
//! one channel per group).

use super::layer_norm::{axis_size, fits, norm_options};
use crate::{Ctx, Layer};
use std::sync::OnceLock;
use weft_core::{Error, Result, Tensor, Var, trace};

/// Keras' `GroupNormalization`: the channels (the `axis`, last by default) are cut into `groups`
/// contiguous groups, and each sample's group is normalized over its channels and every other
/// non-batch axis, then scaled by `gamma` and offset by `beta` per channel. `groups` -1 gives
/// one channel per group (instance normalization). Defaults as Keras': 32 groups, epsilon 1e-3.
/// It keeps no batch statistics: training and inference compute the same.
///
/// ```
/// use weft_core::{Device, Tensor};
/// use weft_nn::{layers::GroupNormalization, Ctx, Layer};
/// let gn = GroupNormalization::new(2);
/// let y = gn.call(&Tensor::rand(-1.0, 1.0, &[2, 5, 4], 0, &Device::Cpu)?, &mut Ctx::inference())?;
/// assert_eq!(y.dims(), &[2, 5, 4]);
/// assert!(gn.call(&Tensor::ones(&[2, 3], &Device::Cpu)?, &mut Ctx::inference()).is_err()); // 3 channels, 2 groups
/// # Ok::<(), weft_core::Error>(())
/// ```
pub struct GroupNormalization {
    name: String,
    groups: i64,
    axis: isize,
    epsilon: f32,
    center: bool,
    scale: bool,
    penalties: crate::penalty::Penalties,
    vars: OnceLock<(Option<Var>, Option<Var>)>,
}

impl Default for GroupNormalization {
    fn default() -> Self {
        GroupNormalization::new(32)
    }
}

impl GroupNormalization {
    /// Normalization in `groups` groups of the last axis (-1: one per channel).
    pub fn new(groups: i64) -> Self {
        GroupNormalization {
            name: String::new(),
            groups,
            axis: -1,
            epsilon: 1e-3,
            center: true,
            scale: true,
            penalties: crate::penalty::Penalties::default(),
            vars: OnceLock::new(),
        }
    }
    norm_options!(center scale);
}

impl Layer for GroupNormalization {
    fn call(&self, x: &Tensor, ctx: &mut Ctx) -> Result<Tensor> {
        let _scope = crate::scope::enter(self);
        const KIND: &str = "GroupNormalization";
        let path = trace::current_scope();
        let (a, c) = axis_size(KIND, x, self.axis)?;
        let groups = if self.groups == -1 { c } else { usize::try_from(self.groups).unwrap_or(0) };
        let bad = if a == 0 {
            Some("the channel axis cannot be the batch axis".to_string())
        } else if groups == 0 || c % groups != 0 {
            Some(format!("{c} channels cannot be cut into {} groups (groups must divide them, or be -1)", self.groups))
        } else if !(self.epsilon > 0.0 && self.epsilon.is_finite()) {
            Some(format!("epsilon must be a finite number above 0, got {}", self.epsilon))
        } else {
            None
        };
        if let Some(why) = bad {
            return Err(Error::invalid(KIND, format!("{path}: input of shape {:?}: {why}", x.dims())));
        }
        let (gamma, beta) = match self.vars.get() {
            Some(v) => v,
            None => {
                let g = if self.scale { Some(Var::new(Tensor::ones(&[c], x.device())?)?) } else { None };
                let b = if self.center { Some(Var::new(Tensor::zeros(&[c], x.device())?)?) } else { None };
                let _ = self.vars.set((g, b));
                self.vars.get().expect("just set")
            }
        };
        // Channels last, then [batch, positions, groups, channels per group]: each sample's
        // group is normalized over axes 1 and 3.
        let last = x.rank() - 1;
        let xt = if a == last { x.clone() } else { x.transpose(a as isize, last as isize)? };
        let dims = xt.dims().to_vec();
        let positions = dims[1..last].iter().product::<usize>();
        let g = xt.reshape(&[dims[0], positions, groups, c / groups])?;
        let mean = g.mean(&[1, 3], true)?;
        let variance = g.var(&[1, 3], true)?;
        let mut y = g.sub(&mean)?.mul(&variance.add_scalar(self.epsilon)?.rsqrt()?)?.reshape(&dims)?;
        if let Some(gm) = gamma {
            y = y.mul(fits(KIND, gm, c, x)?.as_tensor())?;
        }
        if let Some(b) = beta {
            y = y.add(fits(KIND, b, c, x)?.as_tensor())?;
        }
        let y = if a == last { y } else { y.transpose(a as isize, last as isize)? };
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
        "GroupNormalization"
    }
    fn split_rule(&self) -> crate::SplitRule {
        crate::SplitRule::Whole { why: "normalizes over groups of the whole width".into() }
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
