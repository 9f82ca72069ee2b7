//! PositionEmbedding: learned positions added to a sequence of vectors.

use crate::{Ctx, Layer};
use std::sync::OnceLock;
use weft_core::{Error, Result, Tensor, Var, trace};

/// Adds row `t` of a learned `[max_len, width]` table to the vector at position `t` of a
/// `[batch, time, width]` input (GPT-2's positions). Sequences up to `max_len` long.
pub struct PositionEmbedding {
    name: String,
    max_len: usize,
    table: OnceLock<Var>,
}

impl PositionEmbedding {
    /// Positions for sequences of up to `max_len`, initialised normal with std 0.02.
    pub fn new(max_len: usize) -> Self {
        PositionEmbedding { name: String::new(), max_len, table: OnceLock::new() }
    }
    /// Give the layer a name.
    pub fn named(mut self, name: &str) -> Self {
        self.name = name.to_string();
        self
    }
}

impl Layer for PositionEmbedding {
    fn call(&self, x: &Tensor, ctx: &mut Ctx) -> Result<Tensor> {
        let _scope = crate::scope::enter(self);
        let path = trace::current_scope();
        if x.rank() != 3 || x.dims()[1] > self.max_len {
            return Err(Error::invalid(
                "PositionEmbedding",
                format!("{path}: expects [batch, time <= {}, width], got shape {:?}", self.max_len, x.dims()),
            ));
        }
        let (t, width) = (x.dims()[1], x.dims()[2]);
        let table = match self.table.get() {
            Some(v) => v,
            None => {
                let init = Tensor::randn(0.0, 0.02, &[self.max_len, width], ctx.init_seed(&path), x.device())?;
                let _ = self.table.set(Var::new(init)?);
                self.table.get().expect("just set")
            }
        };
        x.add(&table.narrow(0, 0, t)?)
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn set_name(&mut self, name: String) {
        self.name = name;
    }
    fn kind(&self) -> &'static str {
        "PositionEmbedding"
    }
    fn variables(&self) -> Vec<(String, Var)> {
        self.table.get().map(|v| vec![("embeddings".to_string(), v.clone())]).unwrap_or_default()
    }
}
