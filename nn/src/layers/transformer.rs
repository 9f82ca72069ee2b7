//! A pre-norm transformer block: LayerNorm -> MultiHeadAttention -> residual, then
//! LayerNorm -> Dense up (gelu) -> Dense down -> residual.

use super::{Dense, Dropout, LayerNormalization, MultiHeadAttention};
use crate::layer::sublayer_variables;
use crate::{Activation, Ctx, Layer};
use weft_core::{Result, Tensor, Var, trace};

/// One decoder (with `causal`) or encoder block of width `d_model`. Variable paths:
/// `ln_1/gamma`, `attention/query/kernel`, ..., `mlp/up/kernel`, `mlp/down/kernel`.
pub struct TransformerBlock {
    name: String,
    ln_1: LayerNormalization,
    attention: MultiHeadAttention,
    ln_2: LayerNormalization,
    up: std::sync::OnceLock<Dense>,
    down: std::sync::OnceLock<Dense>,
    mlp_dim: usize,
    dropout: Dropout,
}

impl TransformerBlock {
    /// `num_heads` heads of `key_dim` and an MLP of `mlp_dim` (its output width is set at the first call).
    pub fn new(num_heads: usize, key_dim: usize, mlp_dim: usize) -> Self {
        TransformerBlock {
            name: String::new(),
            ln_1: LayerNormalization::new().epsilon(1e-5).named("ln_1"),
            attention: MultiHeadAttention::new(num_heads, key_dim).named("attention"),
            ln_2: LayerNormalization::new().epsilon(1e-5).named("ln_2"),
            up: std::sync::OnceLock::new(),
            down: std::sync::OnceLock::new(),
            mlp_dim,
            dropout: Dropout::new(0.0).named("dropout"),
        }
    }
    /// Causal self-attention (a decoder block).
    pub fn causal(mut self, on: bool) -> Self {
        self.attention = self.attention.causal(on);
        self
    }
    /// Dropout after the attention and after the MLP.
    pub fn dropout(mut self, rate: f32) -> Self {
        self.dropout = Dropout::new(rate).named("dropout");
        self
    }
    /// Give the block a name.
    pub fn named(mut self, name: &str) -> Self {
        self.name = name.to_string();
        self
    }
}

impl Layer for TransformerBlock {
    fn call(&self, x: &Tensor, ctx: &mut Ctx) -> Result<Tensor> {
        let _scope = trace::scope(&self.name);
        let width = *x.dims().last().unwrap_or(&0);
        let a = self.attention.call(&self.ln_1.call(x, ctx)?, ctx)?;
        let x = x.add(&self.dropout.call(&a, ctx)?)?;
        let up = self.up.get_or_init(|| Dense::new(self.mlp_dim).activation(Activation::Gelu).named("mlp/up"));
        let down = self.down.get_or_init(|| Dense::new(width).named("mlp/down"));
        let h = down.call(&up.call(&self.ln_2.call(&x, ctx)?, ctx)?, ctx)?;
        x.add(&self.dropout.call(&h, ctx)?)
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn set_name(&mut self, name: String) {
        self.name = name;
    }
    fn kind(&self) -> &'static str {
        "TransformerBlock"
    }
    fn variables(&self) -> Vec<(String, Var)> {
        sublayer_variables(self.sublayers())
    }
    fn sublayers(&self) -> Vec<&dyn Layer> {
        let mut v: Vec<&dyn Layer> = vec![&self.ln_1, &self.attention, &self.ln_2];
        v.extend(self.up.get().map(|l| l as &dyn Layer));
        v.extend(self.down.get().map(|l| l as &dyn Layer));
        v
    }
}
