//! MultiHeadAttention, as Keras builds it: query, key and value projections to heads
//! (EinsumDense `abc,cde->abde`), scaled dot-product attention per head, and an output
//! projection from the heads back to the model width (`abcd,cde->abe`).
//!
//! Masks follow Keras: an attention mask `[batch, queries, keys]` (or a key padding mask
//! `[batch, keys]`) of 1 (attend) and 0 (do not), combined with the causal mask and with the
//! masks carried by the query and value inputs; a masked score is set to -1e9 before the softmax.

use super::{Dropout, EinsumDense};
use crate::layer::sublayer_variables;
use crate::split::{HeadSplit, SplitRule};
use crate::{Ctx, Layer};
use weft_core::ops::BinaryOp;
use weft_core::{Error, Result, Tensor, Var, no_grad, trace};

/// Attention over `[batch, time, width]` inputs: self-attention (`call`), or cross-attention of a
/// query over a value (and key) sequence (`attend`, or `call_with` in a functional model), with
/// optional masks.
///
/// ```
/// use weft_core::{Device, Tensor};
/// use weft_nn::{layers::{AttentionMasks, MultiHeadAttention}, Ctx, Layer};
/// let mha = MultiHeadAttention::new(2, 4).causal(true);
/// let x = Tensor::rand(-1.0, 1.0, &[1, 5, 8], 0, &Device::Cpu)?;
/// assert_eq!(mha.call(&x, &mut Ctx::inference())?.dims(), &[1, 5, 8]);
/// // Cross-attention of 5 queries over 3 values, the last value masked out, with the scores.
/// let cross = MultiHeadAttention::new(2, 4);
/// let v = Tensor::rand(-1.0, 1.0, &[1, 3, 6], 1, &Device::Cpu)?;
/// let keep = Tensor::from_vec(vec![1f32, 1., 0.], &[1, 3], &Device::Cpu)?;
/// let masks = AttentionMasks { attention: Some(&keep), ..Default::default() };
/// let (out, scores) = cross.attend(&x, &v, None, masks, &mut Ctx::inference())?;
/// assert_eq!(out.dims(), &[1, 5, 8]);
/// assert_eq!(scores.dims(), &[1, 2, 5, 3]); // [batch, heads, queries, keys]
/// assert!(scores.narrow(3, 2, 1)?.sum_all()?.to_scalar::<f32>()? < 1e-6); // nothing attends to the masked value
/// # Ok::<(), weft_core::Error>(())
/// ```
pub struct MultiHeadAttention {
    name: String,
    num_heads: usize,
    key_dim: usize,
    value_dim: usize,
    causal: bool,
    use_bias: bool,
    output_dim: Option<usize>,
    query: EinsumDense,
    key: EinsumDense,
    value: EinsumDense,
    output: std::sync::OnceLock<EinsumDense>,
    dropout: Dropout,
}

/// The masks of one attention call; each is 1 where attention is allowed and 0 where not.
#[derive(Default, Clone, Copy)]
pub struct AttentionMasks<'a> {
    /// `[batch, queries, keys]`, or `[batch, keys]` for a key padding mask.
    pub attention: Option<&'a Tensor>,
    /// `[batch, queries]`: padded queries (Keras' query mask, carried by the query input).
    pub query: Option<&'a Tensor>,
    /// `[batch, keys]`: padded values (Keras' value mask, carried by the value input).
    pub value: Option<&'a Tensor>,
}

fn projection(name: &str, heads: usize, dim: usize, bias: bool) -> EinsumDense {
    let p = EinsumDense::new("abc,cde->abde", &[0, heads, dim]).named(name);
    if bias { p.bias_axes("de") } else { p }
}

impl MultiHeadAttention {
    /// `num_heads` heads of `key_dim` (value_dim = key_dim, no dropout, no mask, with biases).
    pub fn new(num_heads: usize, key_dim: usize) -> Self {
        MultiHeadAttention {
            name: String::new(),
            num_heads,
            key_dim,
            value_dim: key_dim,
            causal: false,
            use_bias: true,
            output_dim: None,
            query: projection("query", num_heads, key_dim, true),
            key: projection("key", num_heads, key_dim, true),
            value: projection("value", num_heads, key_dim, true),
            output: std::sync::OnceLock::new(),
            dropout: Dropout::new(0.0).named("attention_dropout"),
        }
    }
    /// A different size for the values.
    pub fn value_dim(mut self, d: usize) -> Self {
        self.value_dim = d;
        self.value = projection("value", self.num_heads, d, self.use_bias);
        self
    }
    /// Mask each position from attending to later ones (for decoders).
    pub fn causal(mut self, on: bool) -> Self {
        self.causal = on;
        self
    }
    /// Biases on the four projections (default on, as Keras).
    pub fn use_bias(mut self, on: bool) -> Self {
        self.use_bias = on;
        self.query = projection("query", self.num_heads, self.key_dim, on);
        self.key = projection("key", self.num_heads, self.key_dim, on);
        self.value = projection("value", self.num_heads, self.value_dim, on);
        self
    }
    /// The output width (Keras' `output_shape`); by default the query's width.
    pub fn output_dim(mut self, d: usize) -> Self {
        self.output_dim = Some(d);
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

    /// Attention of `query` `[b, t, w]` over `value` `[b, s, w']` (keys from `key`, or from
    /// `value` when `None`), with `masks`. Returns the output `[b, t, output width]` and the
    /// attention probabilities `[b, heads, t, s]` (Keras' `return_attention_scores`).
    pub fn attend(
        &self,
        query: &Tensor,
        value: &Tensor,
        key: Option<&Tensor>,
        masks: AttentionMasks<'_>,
        ctx: &mut Ctx,
    ) -> Result<(Tensor, Tensor)> {
        let _scope = crate::scope::enter(self);
        let path = trace::current_scope();
        let key = key.unwrap_or(value);
        if self.num_heads == 0 || self.key_dim == 0 || self.value_dim == 0 {
            return Err(Error::invalid(
                "MultiHeadAttention",
                format!(
                    "{path}: {} heads of key size {} and value size {}: each must be at least 1",
                    self.num_heads, self.key_dim, self.value_dim
                ),
            ));
        }
        for (what, t) in [("query", query), ("value", value), ("key", key)] {
            if t.rank() != 3 {
                return Err(Error::invalid(
                    "MultiHeadAttention",
                    format!("{path}: the {what} must be [batch, time, width], got shape {:?}", t.dims()),
                ));
            }
        }
        let (b, t, s) = (query.dims()[0], query.dims()[1], value.dims()[1]);
        if value.dims()[0] != b || key.dims()[..2] != value.dims()[..2] {
            return Err(Error::invalid(
                "MultiHeadAttention",
                format!(
                    "{path}: query {:?}, value {:?} and key {:?} must share the batch, and key and value their length",
                    query.dims(),
                    value.dims(),
                    key.dims()
                ),
            ));
        }
        let mask = self.combined_mask(&path, (b, t, s), masks, query)?;
        let (q, k, v) = self.project(query, key, value, ctx)?;
        let q = q.mul_scalar(1.0 / (self.key_dim as f32).sqrt())?; // [b, t, h, k]
        let mut scores = Tensor::einsum("aecd,abcd->acbe", &[&k, &q])?; // [b, h, t, s]
        if let Some(keep) = mask {
            // Masked where keep == 0; one mask for every head.
            scores = scores.masked_fill(&keep.cmp_scalar(BinaryOp::Eq, 0.0)?.unsqueeze(1)?, -1e9)?;
        }
        let probs = scores.softmax(-1)?;
        let dropped = self.dropout.call(&probs, ctx)?;
        let heads = Tensor::einsum("acbe,aecd->abcd", &[&dropped, &v])?; // [b, t, h, v]
        let width = self.output_dim.unwrap_or(query.dims()[2]);
        let out = self.output.get_or_init(|| {
            let o = EinsumDense::new("abcd,cde->abe", &[0, width]).named("attention_output");
            if self.use_bias { o.bias_axes("e") } else { o }
        });
        Ok((out.call(&heads, ctx)?, probs))
    }

    /// The query, key and value projections. Split by heads, projections that take the same
    /// input share one f (see [`tp::linear`](crate::tp::linear)).
    fn project(&self, query: &Tensor, key: &Tensor, value: &Tensor, ctx: &mut Ctx) -> Result<(Tensor, Tensor, Tensor)> {
        Ok((self.query.call(query, ctx)?, self.key.call(key, ctx)?, self.value.call(value, ctx)?))
    }

    /// The keep-mask (`[b, t, s]`, or a shape that broadcasts to it) from the causal flag and
    /// `masks`, or `None` when there is nothing to apply: no causal flag, and no mask or (on the
    /// Cpu) only masks that hold no 0.
    fn combined_mask(
        &self,
        path: &str,
        (b, t, s): (usize, usize, usize),
        masks: AttentionMasks<'_>,
        like: &Tensor,
    ) -> Result<Option<Tensor>> {
        let bad = |what: &str, m: &Tensor, want: String| {
            Error::invalid(
                "MultiHeadAttention",
                format!("{path}: the {what} mask has shape {:?}, expected {want}", m.dims()),
            )
        };
        let mut keep: Option<Tensor> = None;
        let mut and = |m: Tensor| -> Result<()> {
            keep = Some(match keep.take() {
                Some(k) => k.mul(&m)?,
                None => m,
            });
            Ok(())
        };
        // A caller's mask that holds no 0 (a batch without padding) masks nothing: left out, so
        // that the scores are not filled, with the same values. (The causal mask always holds
        // one past a single query: it is not looked at.)
        let mut and_given = |m: Tensor| -> Result<()> { if keeps_everything(&m)? { Ok(()) } else { and(m) } };
        if let Some(m) = masks.attention {
            let m = m.to_device(like.device())?.to_dtype(weft_core::DType::F32)?;
            match m.dims() {
                [mb, ms] if (*mb, *ms) == (b, s) => and_given(m.unsqueeze(1)?)?,
                [mb, mt, ms] if (*mb, *mt, *ms) == (b, t, s) => and_given(m)?,
                _ => return Err(bad("attention", &m, format!("[{b}, {t}, {s}] or [{b}, {s}]"))),
            }
        }
        if let Some(m) = masks.value {
            if m.dims() != [b, s] {
                return Err(bad("value", m, format!("[{b}, {s}]")));
            }
            and_given(m.to_device(like.device())?.to_dtype(weft_core::DType::F32)?.unsqueeze(1)?)?;
        }
        if let Some(m) = masks.query {
            if m.dims() != [b, t] {
                return Err(bad("query", m, format!("[{b}, {t}]")));
            }
            and_given(m.to_device(like.device())?.to_dtype(weft_core::DType::F32)?.unsqueeze(2)?)?;
        }
        if self.causal {
            // keep[query, key] = key <= query, made on the device from one row of positions.
            let pos = Tensor::arange(0.0, t.max(s) as f32, 1.0, like.device())?;
            let (qp, kp) = (pos.narrow(0, 0, t)?.unsqueeze(1)?, pos.narrow(0, 0, s)?.unsqueeze(0)?);
            and(kp.binary(BinaryOp::Le, &qp)?.unsqueeze(0)?)?;
        }
        Ok(keep)
    }
}

impl Layer for MultiHeadAttention {
    fn call(&self, x: &Tensor, ctx: &mut Ctx) -> Result<Tensor> {
        Ok(self.attend(x, x, None, AttentionMasks::default(), ctx)?.0)
    }
    /// Inputs `[query]` (self-attention), `[query, value]` or `[query, value, key]`; the query's
    /// and the value's masks mask padded positions, as in Keras.
    fn call_with(&self, inputs: &[Tensor], masks: &[Option<Tensor>], ctx: &mut Ctx) -> Result<Tensor> {
        let mask = |i: usize| masks.get(i).and_then(|m| m.as_ref());
        let (q, v, k) = match inputs {
            [q] => (q, q, None),
            [q, v] => (q, v, None),
            [q, v, k] => (q, v, Some(k)),
            _ => {
                return Err(Error::invalid(
                    "MultiHeadAttention",
                    format!(
                        "{}: takes [query], [query, value] or [query, value, key], got {} inputs",
                        self.name,
                        inputs.len()
                    ),
                ));
            }
        };
        // The key's mask, when the key is its own input, masks the same positions as the value's.
        let value_mask = match (if inputs.len() == 1 { mask(0) } else { mask(1) }, mask(2)) {
            (Some(v), Some(k)) => Some(v.mul(k)?),
            (v, k) => v.or(k).cloned(),
        };
        let masks = AttentionMasks { attention: None, query: mask(0), value: value_mask.as_ref() };
        Ok(self.attend(q, v, k, masks, ctx)?.0)
    }
    fn output_mask(&self, _: &[Tensor], masks: &[Option<Tensor>], _: &Tensor) -> Result<Option<Tensor>> {
        Ok(masks.first().cloned().flatten())
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
    /// By heads: query, key and value by columns, the output projection by rows.
    fn split_rule(&self) -> SplitRule {
        SplitRule::Heads(HeadSplit {
            heads: self.num_heads,
            projections: vec!["query".into(), "key".into(), "value".into()],
            output: "attention_output".into(),
            inner_axis: 1,
        })
    }
    fn sublayers(&self) -> Vec<&dyn Layer> {
        let mut v: Vec<&dyn Layer> = vec![&self.query, &self.key, &self.value];
        if let Some(o) = self.output.get() {
            v.push(o);
        }
        v
    }
}

/// Whether `m`, a mask on the Cpu, holds no 0, so that alone it masks no position (judged mask
/// by mask: a NaN in one no longer spoils another's 0). A mask on a GPU is not read back to tell
/// (that would wait for the device mid-step), nor one on the Meta device, which has no values:
/// those are applied as they are.
fn keeps_everything(m: &Tensor) -> Result<bool> {
    if !matches!(m.device(), weft_core::Device::Cpu) {
        return Ok(false);
    }
    let zeros = no_grad(|| m.cmp_scalar(BinaryOp::Eq, 0.0)?.sum_all()?.to_scalar::<f32>())?;
    Ok(zeros == 0.0)
}
