//! LayerNormalization over the last axis.

use crate::{Ctx, Layer};
use std::sync::OnceLock;
use weft_core::{Error, Result, Tensor, Var, trace};

/// `(x - mean) / sqrt(var + epsilon) * gamma + beta` over the last axis (Keras' default epsilon 1e-3).
pub struct LayerNormalization {
    name: String,
    epsilon: f32,
    vars: OnceLock<(Var, Var)>,
}

impl Default for LayerNormalization {
    fn default() -> Self {
        LayerNormalization::new()
    }
}

impl LayerNormalization {
    /// Layer norm with epsilon 1e-3, gamma ones and beta zeros.
    pub fn new() -> Self {
        LayerNormalization { name: String::new(), epsilon: 1e-3, vars: OnceLock::new() }
    }
    /// Set epsilon.
    pub fn epsilon(mut self, eps: f32) -> Self {
        self.epsilon = eps;
        self
    }
    /// Give the layer a name.
    pub fn named(mut self, name: &str) -> Self {
        self.name = name.to_string();
        self
    }
}

impl Layer for LayerNormalization {
    fn call(&self, x: &Tensor, _ctx: &mut Ctx) -> Result<Tensor> {
        let _scope = crate::scope::enter(self);
        let n = *x.dims().last().ok_or_else(|| {
            Error::invalid("LayerNormalization", format!("{}: input has no axes", trace::current_scope()))
        })?;
        let (gamma, beta) = match self.vars.get() {
            Some(v) => v,
            None => {
                let _ = self
                    .vars
                    .set((Var::new(Tensor::ones(&[n], x.device())?)?, Var::new(Tensor::zeros(&[n], x.device())?)?));
                self.vars.get().expect("just set")
            }
        };
        if gamma.dims() != [n] {
            return Err(Error::invalid(
                "LayerNormalization",
                format!(
                    "{}: input of shape {:?} does not fit gamma of shape {:?}",
                    trace::current_scope(),
                    x.dims(),
                    gamma.dims()
                ),
            ));
        }
        x.layer_norm(gamma, beta, self.epsilon)
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
    fn variables(&self) -> Vec<(String, Var)> {
        match self.vars.get() {
            Some((g, b)) => vec![("gamma".to_string(), g.clone()), ("beta".to_string(), b.clone())],
            None => Vec::new(),
        }
    }
}
