//! MultiHeadAttention, as Keras builds it: query, key and value projections to heads
//! (EinsumDense `abc,cde->abde`), scaled dot-product attention per head, and an output
//! projection from the heads back to the model width (`abcd,cde->abe`).

use super::{Dropout, EinsumDense};
use crate::layer::sublayer_variables;
use crate::{Ctx, Layer};
use weft_core::{Error, Result, Tensor, Var, trace};

/// Self-attention over `[batch, time, width]` inputs, with an optional causal mask.
///
/// ```
/// use weft_core::{Device, Tensor};
/// use weft_nn::{layers::MultiHeadAttention, Ctx, Layer};
/// let mha = MultiHeadAttention::new(2, 4).causal(true);
/// let x = Tensor::rand(-1.0, 1.0, &[1, 5, 8], 0, &Device::Cpu)?;
/// assert_eq!(mha.call(&x, &mut Ctx::inference())?.dims(), &[1, 5, 8]);
/// # Ok::<(), weft_core::Error>(())
/// ```
pub struct MultiHeadAttention {
    name: String,
    num_heads: usize,
    key_dim: usize,
    value_dim: usize,
    causal: bool,
    query: EinsumDense,
    key: EinsumDense,
    value: EinsumDense,
    output: std::sync::OnceLock<EinsumDense>,
    dropout: Dropout,
}

impl MultiHeadAttention {
    /// `num_heads` heads of `key_dim` (value_dim = key_dim, no dropout, no mask).
    pub fn new(num_heads: usize, key_dim: usize) -> Self {
        let proj = |name: &str, dim: usize| {
            EinsumDense::new("abc,cde->abde", &[0, num_heads, dim]).bias_axes("de").named(name)
        };
        MultiHeadAttention {
            name: String::new(),
            num_heads,
            key_dim,
            value_dim: key_dim,
            causal: false,
            query: proj("query", key_dim),
            key: proj("key", key_dim),
            value: proj("value", key_dim),
            output: std::sync::OnceLock::new(),
            dropout: Dropout::new(0.0).named("attention_dropout"),
        }
    }
    /// A different size for the values.
    pub fn value_dim(mut self, d: usize) -> Self {
        self.value_dim = d;
        self.value = EinsumDense::new("abc,cde->abde", &[0, self.num_heads, d]).bias_axes("de").named("value");
        self
    }
    /// Mask each position from attending to later ones (for decoders).
    pub fn causal(mut self, on: bool) -> Self {
        self.causal = on;
        self
    }
    /// Dropout on the attention probabilities.
    pub fn dropout(mut self, rate: f32) -> Self {
        self.dropout = Dropout::new(rate).named("attention_dropout");
        self
    }
    /// Give the layer a name.
    pub fn named(mut self, name: &str) -> Self {
        self.name = name.to_string();
        self
    }
}

impl Layer for MultiHeadAttention {
    fn call(&self, x: &Tensor, ctx: &mut Ctx) -> Result<Tensor> {
        let _scope = trace::scope(&self.name);
        if x.rank() != 3 {
            return Err(Error::invalid(
                "MultiHeadAttention",
                format!("{}: expects [batch, time, width], got shape {:?}", trace::current_scope(), x.dims()),
            ));
        }
        let (t, width) = (x.dims()[1], x.dims()[2]);
        // Split by heads, the three projections take the same input: one f for all three (one
        // all-reduce of its gradient backward instead of three).
        let path = trace::current_scope();
        let parts = ["query", "key", "value"].map(|n| format!("{path}/{n}")).to_vec();
        let shared = crate::tp::all_column(&ctx.tp, &parts);
        let x_in = match &shared {
            Some(comm) => weft_core::collectives::copy_to_parallel(x, comm.clone()),
            None => x.clone(),
        };
        ctx.input_copied = shared.is_some();
        let qkv = (|| Ok((self.query.call(&x_in, ctx)?, self.key.call(&x_in, ctx)?, self.value.call(&x_in, ctx)?)))();
        ctx.input_copied = false;
        let (q, k, v): (Tensor, Tensor, Tensor) = qkv?;
        let q = q.mul_scalar(1.0 / (self.key_dim as f32).sqrt())?; // [b, t, h, k]
        let mut scores = Tensor::einsum("aecd,abcd->acbe", &[&k, &q])?; // [b, h, t, s]
        if self.causal {
            // mask[query, key] = key > query, made on the device from one row of positions.
            let pos = Tensor::arange(0.0, t as f32, 1.0, x.device())?;
            let mask = pos.unsqueeze(0)?.binary(weft_core::ops::BinaryOp::Gt, &pos.unsqueeze(1)?)?;
            scores = scores.masked_fill(&mask, -1e9)?;
        }
        let probs = self.dropout.call(&scores.softmax(-1)?, ctx)?;
        let heads = Tensor::einsum("acbe,aecd->abcd", &[&probs, &v])?; // [b, t, h, v]
        let out = self
            .output
            .get_or_init(|| EinsumDense::new("abcd,cde->abe", &[0, width]).bias_axes("e").named("attention_output"));
        out.call(&heads, ctx)
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn set_name(&mut self, name: String) {
        self.name = name;
    }
    fn kind(&self) -> &'static str {
        "MultiHeadAttention"
    }
    fn variables(&self) -> Vec<(String, Var)> {
        sublayer_variables(self.sublayers())
    }
    fn sublayers(&self) -> Vec<&dyn Layer> {
        let mut v: Vec<&dyn Layer> = vec![&self.query, &self.key, &self.value];
        if let Some(o) = self.output.get() {
            v.push(o);
        }
        v
    }
}
