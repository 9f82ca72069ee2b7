//! A transformer block: attention and an MLP, each with a residual and a LayerNorm. Pre-norm
//! (GPT-2: LayerNorm -> attention -> residual) by default, or post-norm (BERT: attention ->
//! residual -> LayerNorm), with the epsilon and MLP activation chosen.

use super::{AttentionMasks, Dense, Dropout, LayerNormalization, MultiHeadAttention};
use crate::layer::sublayer_variables;
use crate::{Activation, Ctx, Layer};
use weft_core::{Result, Tensor, Var};

/// One decoder (with `causal`) or encoder block of width `d_model`. Variable paths:
/// `ln_1/gamma`, `attention/query/kernel`, ..., `mlp/up/kernel`, `mlp/down/kernel` (`ln_1` is the
/// attention's norm and `ln_2` the MLP's, in both orders). In a functional model the input's
/// padding mask reaches the attention.
///
/// ```
/// use weft_core::{Device, Tensor};
/// use weft_nn::{layers::TransformerBlock, Activation, Ctx, Layer};
/// // A BERT encoder layer: post-norm, epsilon 1e-12, exact GELU.
/// let bert = TransformerBlock::new(12, 32, 1536).post_norm(true).epsilon(1e-12).activation(Activation::Gelu);
/// let x = Tensor::rand(-1.0, 1.0, &[2, 5, 384], 0, &Device::Cpu)?;
/// assert_eq!(bert.call(&x, &mut Ctx::inference())?.dims(), &[2, 5, 384]);
/// # Ok::<(), weft_core::Error>(())
/// ```
pub struct TransformerBlock {
    name: String,
    ln_1: LayerNormalization,
    attention: MultiHeadAttention,
    ln_2: LayerNormalization,
    up: std::sync::OnceLock<Dense>,
    down: std::sync::OnceLock<Dense>,
    mlp_dim: usize,
    dropout: Dropout,
    post_norm: bool,
    activation: Activation,
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
            post_norm: false,
            activation: Activation::GeluTanh,
        }
    }
    /// Post-norm (BERT): the LayerNorm after each residual sum instead of before each branch.
    pub fn post_norm(mut self, on: bool) -> Self {
        self.post_norm = on;
        self
    }
    /// The LayerNorms' epsilon (default 1e-5; BERT uses 1e-12).
    pub fn epsilon(mut self, eps: f32) -> Self {
        self.ln_1 = LayerNormalization::new().epsilon(eps).named("ln_1");
        self.ln_2 = LayerNormalization::new().epsilon(eps).named("ln_2");
        self
    }
    /// The MLP's activation (default the tanh GELU of GPT-2; BERT uses the exact `Gelu`).
    pub fn activation(mut self, a: Activation) -> Self {
        self.activation = a;
        self
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

impl TransformerBlock {
    fn forward(&self, x: &Tensor, mask: Option<&Tensor>, ctx: &mut Ctx) -> Result<Tensor> {
        let _scope = crate::scope::enter(self);
        let width = *x.dims().last().unwrap_or(&0);
        let masks = AttentionMasks { attention: None, query: mask, value: mask };
        let attend = |h: &Tensor, ctx: &mut Ctx| -> Result<Tensor> {
            let a = self.attention.attend(h, h, None, masks, ctx)?.0;
            self.dropout.call(&a, ctx)
        };
        let up = self.up.get_or_init(|| Dense::new(self.mlp_dim).activation(self.activation).named("mlp/up"));
        let down = self.down.get_or_init(|| Dense::new(width).named("mlp/down"));
        let mlp = |h: &Tensor, ctx: &mut Ctx| -> Result<Tensor> {
            let m = down.call(&up.call(h, ctx)?, ctx)?;
            self.dropout.call(&m, ctx)
        };
        if self.post_norm {
            let x = self.ln_1.call(&x.add(&attend(x, ctx)?)?, ctx)?;
            self.ln_2.call(&x.add(&mlp(&x, ctx)?)?, ctx)
        } else {
            let x = x.add(&attend(&self.ln_1.call(x, ctx)?, ctx)?)?;
            x.add(&mlp(&self.ln_2.call(&x, ctx)?, ctx)?)
        }
    }
}

impl Layer for TransformerBlock {
    fn call(&self, x: &Tensor, ctx: &mut Ctx) -> Result<Tensor> {
        self.forward(x, None, ctx)
    }
    fn call_with(&self, inputs: &[Tensor], masks: &[Option<Tensor>], ctx: &mut Ctx) -> Result<Tensor> {
        match inputs {
            [x] => self.forward(x, masks.first().and_then(|m| m.as_ref()), ctx),
            _ => Err(weft_core::Error::invalid(
                "TransformerBlock",
                format!("{}: takes one input, got {}", self.name, inputs.len()),
            )),
        }
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
