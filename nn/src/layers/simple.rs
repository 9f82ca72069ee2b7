//! Layers without variables: Activation, Dropout, Flatten.

use crate::{Activation, Ctx, Layer};
use weft_core::{Error, Result, Tensor, Var, trace};

macro_rules! stateless {
    ($t:ident, $kind:literal) => {
        impl $t {
            /// Give the layer a name.
            pub fn named(mut self, name: &str) -> Self {
                self.name = name.to_string();
                self
            }
        }
        impl Layer for $t {
            fn call(&self, x: &Tensor, ctx: &mut Ctx) -> Result<Tensor> {
                let _scope = trace::scope(&self.name);
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
        x.dropout(self.rate, ctx.seed_for(&trace::current_scope()), ctx.training)
    }
}
stateless!(Dropout, "Dropout");

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
    fn forward(&self, x: &Tensor, _ctx: &mut Ctx) -> Result<Tensor> {
        let batch = *x
            .dims()
            .first()
            .ok_or_else(|| Error::invalid("Reshape", format!("{}: input has no batch axis", trace::current_scope())))?;
        let shape: Vec<isize> = std::iter::once(batch as isize).chain(self.target.iter().copied()).collect();
        x.reshape_infer(&shape).map_err(|e| Error::invalid("Reshape", format!("{}: {e}", trace::current_scope())))
    }
}
stateless!(Reshape, "Reshape");
