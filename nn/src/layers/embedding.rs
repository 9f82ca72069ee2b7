//! Embedding: integer ids to rows of a trainable table.

use crate::penalty::{Penalties, penalty_options};
use crate::split::SplitRule;
use crate::tp;
use crate::{Ctx, Initializer, Layer};
use std::sync::{Arc, OnceLock};
use weft_core::ops::BinaryOp;
use weft_core::{DType, Error, Result, Tensor, Var, trace};

/// Maps ids of any shape to vectors: `[..ids] -> [..ids, output_dim]`. Ids may be u32, i32, or
/// f32 holding whole numbers. An id of `input_dim` or more is an `Err`.
pub struct Embedding {
    name: String,
    input_dim: usize,
    output_dim: usize,
    init: Initializer,
    mask_zero: bool,
    penalties: Penalties,
    table: Arc<OnceLock<Var>>,
}

impl Embedding {
    /// A table of `input_dim` rows (the vocabulary) of `output_dim` values, uniform in ±0.05 as in Keras.
    pub fn new(input_dim: usize, output_dim: usize) -> Self {
        Embedding {
            name: String::new(),
            input_dim,
            output_dim,
            init: Initializer::Uniform(0.05),
            mask_zero: false,
            penalties: Penalties::default(),
            table: Arc::new(OnceLock::new()),
        }
    }
    /// Id 0 is padding (Keras' `mask_zero`): the output carries a mask, 0 where the id is 0, that
    /// flows to the layers that read one (attention, pooling) in a functional model.
    pub fn mask_zero(mut self, on: bool) -> Self {
        self.mask_zero = on;
        self
    }
    /// The table's initializer.
    pub fn initializer(mut self, i: Initializer) -> Self {
        self.init = i;
        self
    }
    /// Give the layer a name.
    pub fn named(mut self, name: &str) -> Self {
        self.name = name.to_string();
        self
    }
    penalty_options!(embeddings: embeddings_regularizer, embeddings_constraint);
    fn penalties_mut(&mut self) -> &mut Penalties {
        &mut self.penalties
    }
    /// The table (after the first call).
    pub fn table(&self) -> Option<&Var> {
        self.table.get()
    }
    /// An output projection that shares this table (weight tying): `logits = x @ table^T`.
    /// Place it after the embedding has run (later in the same model).
    pub fn tied_head(&self) -> TiedHead {
        TiedHead { name: String::new(), table: self.table.clone() }
    }
}

impl Layer for Embedding {
    fn call(&self, ids: &Tensor, ctx: &mut Ctx) -> Result<Tensor> {
        let _scope = crate::scope::enter(self);
        let path = trace::current_scope();
        let shard = tp::shard_of(&ctx.tp, &path);
        let table = match self.table.get() {
            Some(t) => t,
            None => {
                let (shape, seed) = ([self.input_dim, self.output_dim], ctx.init_seed(&path));
                let t = tp::new_var(shard, &path, "embeddings", ids.device(), self.init, &shape, None, seed)?;
                let _ = self.table.set(t);
                self.table.get().expect("just set")
            }
        };
        let y = tp::lookup(self, ctx, table.as_tensor(), ids)?;
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
        "Embedding"
    }
    fn split_rule(&self) -> SplitRule {
        SplitRule::Vocab { table: "embeddings".into() }
    }
    fn variables(&self) -> Vec<(String, Var)> {
        self.table.get().map(|t| vec![("embeddings".to_string(), t.clone())]).unwrap_or_default()
    }
    fn regularizers(&self) -> Vec<(String, crate::Regularizer)> {
        self.penalties.regularizers_of(|_| true)
    }
    fn constraints(&self) -> Vec<(String, crate::Constraint)> {
        self.penalties.constraints_of(|_| true)
    }
    fn output_mask(&self, inputs: &[Tensor], masks: &[Option<Tensor>], _: &Tensor) -> Result<Option<Tensor>> {
        match (self.mask_zero, inputs.first()) {
            (true, Some(ids)) => Ok(Some(ids.to_dtype(DType::F32)?.cmp_scalar(BinaryOp::Ne, 0.0)?)),
            _ => Ok(masks.first().cloned().flatten()),
        }
    }
}

/// The output projection of a tied embedding: `logits = x @ table^T`, sharing the embedding's
/// table (it has no variables of its own). Made by [`Embedding::tied_head`].
///
/// ```
/// use weft_core::{Device, Tensor};
/// use weft_nn::{layers::Embedding, Ctx, Layer};
/// let emb = Embedding::new(10, 4).named("tokens");
/// let head = emb.tied_head().named("head");
/// let ids = Tensor::from_vec(vec![1u32, 2, 3], &[1, 3], &Device::Cpu)?;
/// let logits = head.call(&emb.call(&ids, &mut Ctx::inference())?, &mut Ctx::inference())?;
/// assert_eq!(logits.dims(), &[1, 3, 10]);
/// # Ok::<(), weft_core::Error>(())
/// ```
pub struct TiedHead {
    name: String,
    table: Arc<OnceLock<Var>>,
}

impl TiedHead {
    /// Give the layer a name.
    pub fn named(mut self, name: &str) -> Self {
        self.name = name.to_string();
        self
    }
}

impl Layer for TiedHead {
    fn call(&self, x: &Tensor, ctx: &mut Ctx) -> Result<Tensor> {
        let _scope = crate::scope::enter(self);
        let path = trace::current_scope();
        let table = self.table.get().ok_or_else(|| {
            Error::invalid("TiedHead", format!("{path}: its embedding has not run yet; put the head after it"))
        })?;
        if x.dims().last() != table.dims().get(1) {
            return Err(Error::invalid(
                "TiedHead",
                format!("{path}: input of shape {:?} does not fit a table of shape {:?}", x.dims(), table.dims()),
            ));
        }
        let last = x.rank() - 1;
        tp::linear(self, ctx, x, (last, last), |x| x.matmul(&table.transpose(0, 1)?), None, crate::Activation::Linear)
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn set_name(&mut self, name: String) {
        self.name = name;
    }
    fn kind(&self) -> &'static str {
        "TiedHead"
    }
    fn split_rule(&self) -> SplitRule {
        SplitRule::Tied
    }
    fn variables(&self) -> Vec<(String, Var)> {
        Vec::new()
    }
}
