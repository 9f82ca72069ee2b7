//! Embedding: integer ids to rows of a trainable table.

use crate::{Ctx, Initializer, Layer};
use std::sync::OnceLock;
use weft_core::{DType, Result, Tensor, Var, trace};

/// Maps ids of any shape to vectors: `[..ids] -> [..ids, output_dim]`. Ids may be u32, i32, or
/// f32 holding whole numbers. An id of `input_dim` or more is an `Err`.
pub struct Embedding {
    name: String,
    input_dim: usize,
    output_dim: usize,
    init: Initializer,
    table: OnceLock<Var>,
}

impl Embedding {
    /// A table of `input_dim` rows (the vocabulary) of `output_dim` values, uniform in ±0.05 as in Keras.
    pub fn new(input_dim: usize, output_dim: usize) -> Self {
        Embedding {
            name: String::new(),
            input_dim,
            output_dim,
            init: Initializer::Uniform(0.05),
            table: OnceLock::new(),
        }
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
    /// The table (after the first call).
    pub fn table(&self) -> Option<&Var> {
        self.table.get()
    }
}

impl Layer for Embedding {
    fn call(&self, ids: &Tensor, ctx: &mut Ctx) -> Result<Tensor> {
        let _scope = trace::scope(&self.name);
        let table = match self.table.get() {
            Some(t) => t,
            None => {
                let path = trace::current_scope();
                let t =
                    Var::new(self.init.init(&[self.input_dim, self.output_dim], ctx.seed_for(&path), ids.device())?)?;
                let _ = self.table.set(t);
                self.table.get().expect("just set")
            }
        };
        let ids = if ids.dtype() == DType::F32 { ids.to_dtype(DType::U32)? } else { ids.clone() };
        table.embedding(&ids)
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
    fn variables(&self) -> Vec<(String, Var)> {
        self.table.get().map(|t| vec![("embeddings".to_string(), t.clone())]).unwrap_or_default()
    }
}
