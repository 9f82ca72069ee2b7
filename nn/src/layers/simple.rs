//! Layers without variables: Activation, Dropout, Flatten.

use crate::{Activation, Ctx, Layer};
use weft_core::{Error, Result, Tensor, Var, trace};

macro_rules! stateless {
    ($t:ident, $kind:literal) => {
        stateless!($t, $kind, crate::SplitRule::undeclared($kind));
    };
    ($t:ident, $kind:literal, $rule:expr) => {
        impl $t {
            /// Give the layer a name.
            pub fn named(mut self, name: &str) -> Self {
                self.name = name.to_string();
                self
            }
        }
        impl Layer for $t {
            fn call(&self, x: &Tensor, ctx: &mut Ctx) -> Result<Tensor> {
                let _scope = crate::scope::enter(self);
                self.forward(x, ctx)
            }
            fn name(&self) -> &str {
                &self.name
            }
            fn set_name(&mut self, name: String) {
                self.name = name;
            }
            fn kind(&self) -> &'static str {
                $kind
            }
            fn variables(&self) -> Vec<(String, Var)> {
                Vec::new()
            }
            fn split_rule(&self) -> crate::SplitRule {
                $rule
            }
        }
    };
}

/// Applies an activation function.
pub struct ActivationLayer {
    name: String,
    activation: Activation,
}

impl ActivationLayer {
    /// A layer applying `activation`.
    pub fn new(activation: Activation) -> Self {
        ActivationLayer { name: String::new(), activation }
    }
    fn forward(&self, x: &Tensor, _ctx: &mut Ctx) -> Result<Tensor> {
        self.activation.apply(x)
    }
}
stateless!(ActivationLayer, "Activation");

/// Zeroes a fraction `rate` of its input during training (and scales the rest by 1/(1-rate)).
pub struct Dropout {
    name: String,
    rate: f32,
}

impl Dropout {
    /// Dropout with `rate` in [0, 1).
    pub fn new(rate: f32) -> Self {
        Dropout { name: String::new(), rate }
    }
    fn forward(&self, x: &Tensor, ctx: &mut Ctx) -> Result<Tensor> {
        let path = trace::current_scope();
        let seed = ctx.seed_for(&path);
        if !ctx.training || self.rate == 0.0 {
            return Ok(x.clone());
        }
        // On a split tensor (a model axis splits `axis`, a data axis splits the batch): draw the
        // mask of the whole tensor and keep this rank's part, so every element is dropped
        // exactly as on one device.
        let split = crate::tp::part_at(&ctx.tp, &path);
        if split.is_none() && ctx.batch_part.is_none() {
            return x.dropout(self.rate, seed, true);
        }
        let mut full = x.dims().to_vec();
        if let Some(part) = &split {
            if part.axis >= full.len() {
                return Err(Error::invalid(
                    "Dropout",
                    format!("{path}: the plan splits axis {} of an input of shape {:?}", part.axis, x.dims()),
                ));
            }
            full[part.axis] = part.whole;
        }
        if let Some((_, total)) = ctx.batch_part {
            full[0] = total;
        }
        let mut mask = Tensor::ones(&full, x.device())?.dropout(self.rate, seed, true)?;
        if let Some((start, _)) = ctx.batch_part {
            mask = mask.narrow(0, start, x.dims()[0])?;
        }
        if let Some(part) = split {
            mask = mask.narrow(part.axis as isize, part.start, part.len)?;
        }
        x.mul(&mask)
    }
}
stateless!(Dropout, "Dropout", crate::SplitRule::Pointwise);

/// Flattens every axis after the batch axis.
#[derive(Default)]
pub struct Flatten {
    name: String,
}

impl Flatten {
    /// A flatten layer.
    pub fn new() -> Self {
        Flatten::default()
    }
    fn forward(&self, x: &Tensor, _ctx: &mut Ctx) -> Result<Tensor> {
        if x.rank() < 1 {
            return Err(Error::invalid("Flatten", format!("{}: input has no batch axis", trace::current_scope())));
        }
        let batch = x.dims()[0];
        x.reshape(&[batch, x.numel() / batch.max(1)])
    }
}
stateless!(Flatten, "Flatten");

/// Reshapes every axis after the batch axis to `target` (one entry may be -1).
pub struct Reshape {
    name: String,
    target: Vec<isize>,
}

impl Reshape {
    /// Reshape to `[batch, target..]`.
    pub fn new(target: &[isize]) -> Self {
        Reshape { name: String::new(), target: target.to_vec() }
    }
    fn forward(&self, x: &Tensor, ctx: &mut Ctx) -> Result<Tensor> {
        let path = trace::current_scope();
        let batch =
            *x.dims().first().ok_or_else(|| Error::invalid("Reshape", format!("{path}: input has no batch axis")))?;
        let mut target = self.target.clone();
        // On a tensor split along its last axis (a reshape between a column-split layer and its
        // row partner that keeps that axis), this rank holds only its part of it.
        if let Some(part) = crate::tp::part_at(&ctx.tp, &path)
            && part.axis + 1 == x.rank()
            && let Some(last) = target.last_mut()
            && *last == part.whole as isize
        {
            *last = part.len as isize;
        }
        let shape: Vec<isize> = std::iter::once(batch as isize).chain(target).collect();
        x.reshape_infer(&shape).map_err(|e| Error::invalid("Reshape", format!("{path}: {e}")))
    }
}
stateless!(Reshape, "Reshape", crate::SplitRule::Pointwise);

/// Crops a sequence: drops `begin` steps at the start and `end` at the end of axis 1
/// (`[batch, time, ..] -> [batch, time - begin - end, ..]`), as Keras' Cropping1D.
pub struct Cropping1D {
    name: String,
    begin: usize,
    end: usize,
}

impl Cropping1D {
    /// Drop `begin` leading and `end` trailing steps.
    pub fn new(begin: usize, end: usize) -> Self {
        Cropping1D { name: String::new(), begin, end }
    }
    fn forward(&self, x: &Tensor, _ctx: &mut Ctx) -> Result<Tensor> {
        let t = x.dims().get(1).copied().unwrap_or(0);
        if x.rank() < 2 || self.begin + self.end >= t {
            return Err(Error::invalid(
                "Cropping1D",
                format!(
                    "{}: cannot crop {} + {} steps from axis 1 of shape {:?}",
                    trace::current_scope(),
                    self.begin,
                    self.end,
                    x.dims()
                ),
            ));
        }
        x.narrow(1, self.begin, t - self.begin - self.end)
    }
}
stateless!(Cropping1D, "Cropping1D");
