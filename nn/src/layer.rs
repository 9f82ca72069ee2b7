//! The `Layer` trait: what every layer and model implements.

use crate::Ctx;
use weft_core::{Result, Tensor, Var};

/// What a layer is, for summaries and the planner: its name and kind, the shapes of its own
/// variables (by relative path), and the same for each sublayer.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerInfo {
    /// The layer's name (one path segment).
    pub name: String,
    /// Layer kind, e.g. `Dense`.
    pub kind: String,
    /// The layer's own variables (not its sublayers'), as (relative path, shape).
    pub variables: Vec<(String, Vec<usize>)>,
    /// The sublayers, described the same way.
    pub sublayers: Vec<LayerInfo>,
    /// Settings the planner needs beyond shapes, e.g. `("equation", "abc,cd->abd")`.
    pub attributes: Vec<(String, String)>,
}

impl LayerInfo {
    /// Parameters of this layer and all its sublayers.
    pub fn total_params(&self) -> usize {
        self.variables.iter().map(|(_, s)| s.iter().product::<usize>()).sum::<usize>()
            + self.sublayers.iter().map(LayerInfo::total_params).sum::<usize>()
    }
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
    /// Settings beyond variable shapes that describe the layer (EinsumDense: its equation).
    fn attributes(&self) -> Vec<(String, String)> {
        Vec::new()
    }
    /// Kind, own variable shapes and sublayers (variables appear once built).
    fn describe(&self) -> LayerInfo {
        let subs = self.sublayers();
        let own = self
            .variables()
            .into_iter()
            .filter(|(p, _)| !subs.iter().any(|s| p.starts_with(&format!("{}/", s.name()))))
            .map(|(p, v)| (p, v.dims().to_vec()))
            .collect();
        LayerInfo {
            name: self.name().to_string(),
            kind: self.kind().to_string(),
            variables: own,
            sublayers: subs.iter().map(|s| s.describe()).collect(),
            attributes: self.attributes(),
        }
    }
}

/// The variables of `layers`, each path prefixed with its layer's name (what containers return).
pub(crate) fn sublayer_variables(layers: Vec<&dyn Layer>) -> Vec<(String, Var)> {
    layers.into_iter().flat_map(|l| l.variables().into_iter().map(move |(p, v)| (join(l.name(), &p), v))).collect()
}

/// `kernel` and, if present, `bias`, as a layer's variables.
pub(crate) fn kernel_and_bias(vars: Option<&(Var, Option<Var>)>) -> Vec<(String, Var)> {
    let Some((k, b)) = vars else { return Vec::new() };
    std::iter::once(("kernel".to_string(), k.clone()))
        .chain(b.iter().map(|b| ("bias".to_string(), b.clone())))
        .collect()
}

/// Join path segments with `/`.
pub(crate) fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() { name.to_string() } else { format!("{prefix}/{name}") }
}
