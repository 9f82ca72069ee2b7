//! The `Layer` trait: what every layer and model implements.

use crate::Ctx;
use weft_core::{Result, Tensor, Var};

/// One row of a model summary.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerInfo {
    /// Scope path, e.g. `sequential/dense_1`.
    pub path: String,
    /// Layer kind, e.g. `Dense`.
    pub kind: String,
    /// Output shape for a batch of one (the batch axis is shown as `?`).
    pub output_shape: Vec<usize>,
    /// Number of parameters of the layer itself (not its sublayers).
    pub params: usize,
}

/// A layer: a function of its input and its variables.
///
/// Layers build lazily: variables are created on the first call, from the input's last axis,
/// on the input's device. Each `call` opens a tracing scope named after the layer, so every op
/// it runs is recorded under its path (`sequential/dense_1`) and variable paths follow it
/// (`sequential/dense_1/kernel`).
pub trait Layer: Send + Sync {
    /// The forward pass.
    fn call(&self, x: &Tensor, ctx: &mut Ctx) -> Result<Tensor>;
    /// This layer's name: one segment of its path.
    fn name(&self) -> &str;
    /// Rename (Sequential gives unnamed layers unique Keras-style names).
    fn set_name(&mut self, name: String);
    /// The kind shown in summaries, e.g. `Dense`.
    fn kind(&self) -> &'static str;
    /// Variables with paths relative to this layer (`kernel`, `dense/kernel` ...); empty before the first call.
    fn variables(&self) -> Vec<(String, Var)>;
    /// Direct sublayers.
    fn sublayers(&self) -> Vec<&dyn Layer> {
        Vec::new()
    }
}

/// Join path segments with `/`.
pub(crate) fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() { name.to_string() } else { format!("{prefix}/{name}") }
}
