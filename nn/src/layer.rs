//! The `Layer` trait: what every layer and model implements.

use crate::Ctx;
use crate::split::SplitRule;
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
    /// Settings shown beyond shapes, e.g. `("equation", "abc,cd->abd")`.
    pub attributes: Vec<(String, String)>,
    /// How the layer may be split over devices: all the planner reads of it.
    pub split: SplitRule,
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
/// on the input's device. Each layer runs under its path in the model (`sequential/dense_1`),
/// given by the tree that [`sublayers`](Layer::sublayers) describes (see [`crate::scope`]): its
/// ops are recorded under it and its variables' paths follow it (`sequential/dense_1/kernel`).
/// A container of one's own lists its sublayers and returns their variables with
/// [`sublayer_variables`]; it opens no scope by hand.
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
    /// The forward pass on several inputs, each with an optional mask (1 keeps a position, 0
    /// masks it; shaped as its input without the feature axis), as a functional model calls a
    /// layer. The default takes exactly one input and runs [`call`](Layer::call); layers with
    /// several inputs (merges, cross-attention) or that read masks override it.
    fn call_with(&self, inputs: &[Tensor], masks: &[Option<Tensor>], ctx: &mut Ctx) -> Result<Tensor> {
        let _ = masks;
        match inputs {
            [x] => self.call(x, ctx),
            _ => Err(weft_core::Error::invalid(
                "call_with",
                format!("a {} layer ({}) takes one input, got {}", self.kind(), self.name(), inputs.len()),
            )),
        }
    }
    /// Every output, in the order of [`output_names`](Layer::output_names): a functional model
    /// of several outputs returns each; the default is the one output of `call_with`.
    fn call_outputs(&self, inputs: &[Tensor], masks: &[Option<Tensor>], ctx: &mut Ctx) -> Result<Vec<Tensor>> {
        Ok(vec![self.call_with(inputs, masks, ctx)?])
    }
    /// The names of the outputs `call_outputs` returns, in order; empty for a layer with one
    /// unnamed output.
    fn output_names(&self) -> Vec<String> {
        Vec::new()
    }
    /// The names of the inputs `call_with` takes, in order (a functional model's named inputs);
    /// empty for a layer that takes one input.
    fn input_names(&self) -> Vec<String> {
        Vec::new()
    }
    /// The mask of this layer's output, given its inputs' masks. The default passes the first
    /// input's mask on when the output keeps the input's leading axes (Dense, Dropout, layer
    /// normalisation, activations keep them), and drops it otherwise, as a Keras layer that
    /// supports masking does.
    fn output_mask(&self, inputs: &[Tensor], masks: &[Option<Tensor>], output: &Tensor) -> Result<Option<Tensor>> {
        let (Some(x), Some(Some(m))) = (inputs.first(), masks.first()) else { return Ok(None) };
        let r = m.rank();
        let keeps = output.rank() == x.rank() && output.dims().get(..r) == x.dims().get(..r);
        Ok(keeps.then(|| m.clone()))
    }
    /// Settings beyond variable shapes that describe the layer (EinsumDense: its equation).
    fn attributes(&self) -> Vec<(String, String)> {
        Vec::new()
    }
    /// How the layer may be split over the model axis of a mesh: the only thing the planner
    /// reads of it. The default keeps a layer with variables whole; a container's sublayers
    /// declare their own.
    fn split_rule(&self) -> SplitRule {
        SplitRule::undeclared(self.kind())
    }
    /// Penalties on variables, by path relative to this layer (Keras' `kernel_regularizer` and
    /// the like): `fit` and `evaluate` add them to the loss. The default gathers the
    /// sublayers'; a layer that takes regularizers adds its own.
    fn regularizers(&self) -> Vec<(String, crate::Regularizer)> {
        self.sublayers()
            .into_iter()
            .flat_map(|l| l.regularizers().into_iter().map(move |(p, r)| (join(l.name(), &p), r)))
            .collect()
    }
    /// Projections of variables after each optimizer step, by relative path (Keras'
    /// `kernel_constraint` and the like). The default gathers the sublayers'.
    fn constraints(&self) -> Vec<(String, crate::Constraint)> {
        self.sublayers()
            .into_iter()
            .flat_map(|l| l.constraints().into_iter().map(move |(p, c)| (join(l.name(), &p), c)))
            .collect()
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
            split: self.split_rule(),
        }
    }
}

/// The variables of `layers`, each path prefixed with its layer's name (what containers return).
///
/// A container of one's own implements `variables` with it: `sublayer_variables(self.sublayers())`.
pub fn sublayer_variables(layers: Vec<&dyn Layer>) -> Vec<(String, Var)> {
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

/// Refuse a model whose paths are not unique: two sublayers of one container with the same name
/// (or an empty one), or two variables with the same path. Such layers would share optimizer
/// slots and checkpoint entries silently. The `Err` names the colliding path.
pub fn check_paths(root: &dyn Layer) -> Result<()> {
    fn walk(l: &dyn Layer, path: &str) -> Result<()> {
        let mut seen = std::collections::HashSet::new();
        for s in l.sublayers() {
            if s.name().is_empty() {
                return Err(weft_core::Error::invalid(
                    "layer names",
                    format!(
                        "a {} layer inside {path} has no name: name it, or add it through a container that names it",
                        s.kind()
                    ),
                ));
            }
            if !seen.insert(s.name()) {
                return Err(weft_core::Error::invalid(
                    "layer names",
                    format!(
                        "two layers inside {path} are both named {:?} (path {}): give each layer a unique name",
                        s.name(),
                        join(path, s.name())
                    ),
                ));
            }
            walk(s, &join(path, s.name()))?;
        }
        Ok(())
    }
    walk(root, root.name())?;
    let mut seen = std::collections::HashSet::new();
    for (p, _) in root.variables() {
        if !seen.insert(p.clone()) {
            return Err(weft_core::Error::invalid(
                "layer names",
                format!("two variables have the path {}: give each layer a unique name", join(root.name(), &p)),
            ));
        }
    }
    Ok(())
}
