//! Functional models, as in Keras: named symbolic inputs, layers applied to them (fan-out and
//! merges allowed), masks that flow from layer to layer, and one output or several named ones.

use crate::layer::{join, sublayer_variables};
use crate::{Ctx, Layer};
use std::collections::HashMap;
use weft_core::{DType, Error, Result, Tensor, Var};

/// A symbolic tensor of a [`Functional`] model being built: an input, or a layer's output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sym(usize);

enum Node {
    /// A layer applied to earlier values.
    Apply { layer: Box<dyn Layer>, args: Vec<Sym> },
    /// A value with a mask attached (1 keeps a position): how a model's `attention_mask` input
    /// reaches the layers that read masks.
    Mask { x: Sym, mask: Sym },
}

/// A model from named inputs to an output through a graph of layers. Layers are applied in the
/// order they were added; every value may feed several layers; masks travel with values
/// (`Layer::output_mask`) and reach attention and pooling.
///
/// ```
/// use weft_core::{Device, Tensor};
/// use weft_nn::layers::{Add, Dense, Embedding, GlobalAveragePooling1D};
/// use weft_nn::{Ctx, Functional, Inputs, Layer};
/// let mut g = Functional::new("encoder");
/// let ids = g.input("input_ids");
/// let keep = g.input("attention_mask");
/// let h = g.apply(Embedding::new(50, 8), &[ids]);
/// let h = g.mask(h, keep);
/// let a = g.apply(Dense::new(8), &[h]);
/// let sum = g.apply(Add::new(), &[h, a]); // a fan-out and a merge
/// let pooled = g.apply(GlobalAveragePooling1D::new(), &[sum]);
/// let model = g.output(pooled)?;
/// let x = Inputs::from([
///     ("input_ids", Tensor::from_vec(vec![3u32, 4, 0], &[1, 3], &Device::Cpu)?),
///     ("attention_mask", Tensor::from_vec(vec![1f32, 1., 0.], &[1, 3], &Device::Cpu)?),
/// ]);
/// let y = model.call_with(&x.ordered(&model.input_names())?, &[], &mut Ctx::inference())?;
/// assert_eq!(y.dims(), &[1, 8]);
/// # Ok::<(), weft_core::Error>(())
/// ```
pub struct Functional {
    name: String,
    inputs: Vec<String>,
    nodes: Vec<Node>,
    /// (name, value); one unnamed output has the name "".
    outputs: Vec<(String, Sym)>,
    counts: HashMap<&'static str, usize>,
    late_input: bool,
}

impl Functional {
    /// An empty graph named `name` (the first segment of every variable path).
    pub fn new(name: &str) -> Self {
        Functional {
            name: name.to_string(),
            inputs: Vec::new(),
            nodes: Vec::new(),
            outputs: Vec::new(),
            counts: HashMap::new(),
            late_input: false,
        }
    }

    /// A named input. Inputs must all be declared before the first layer is applied.
    pub fn input(&mut self, name: &str) -> Sym {
        self.late_input |= !self.nodes.is_empty();
        self.inputs.push(name.to_string());
        Sym(self.inputs.len() - 1)
    }

    /// Apply `layer` to `args` (one or several values); returns its output. Unnamed layers get
    /// Keras-style names (`dense`, `dense_1`, ...).
    pub fn apply(&mut self, mut layer: impl Layer + 'static, args: &[Sym]) -> Sym {
        if layer.name().is_empty() {
            let taken: Vec<String> = self.layers().map(|l| l.name().to_string()).collect();
            let taken: Vec<&str> = taken.iter().map(String::as_str).collect();
            let name = crate::sequential::auto_name(layer.kind(), &mut self.counts, &taken);
            layer.set_name(name);
        }
        self.nodes.push(Node::Apply { layer: Box::new(layer), args: args.to_vec() });
        Sym(self.inputs.len() + self.nodes.len() - 1)
    }

    /// `x` with `mask` attached (1 keeps a position, 0 masks it; `[batch, time]` for sequences).
    pub fn mask(&mut self, x: Sym, mask: Sym) -> Sym {
        self.nodes.push(Node::Mask { x, mask });
        Sym(self.inputs.len() + self.nodes.len() - 1)
    }

    /// Finish the graph with `out` as its output. An `Err` names a value that does not belong to
    /// this graph or is used before it is made, or an input declared after a layer.
    pub fn output(self, out: Sym) -> Result<Self> {
        self.outputs(&[("", out)])
    }

    /// Finish the graph with several named outputs (a model with two heads, say): `fit` then
    /// takes labels by these names, `compile_outputs` a loss for each, and `predict_outputs`
    /// returns them by name. An `Err` as for [`output`](Self::output), or for repeated or empty
    /// names among several.
    ///
    /// ```
    /// use weft_core::{Device, Tensor};
    /// use weft_nn::layers::Dense;
    /// use weft_nn::{Ctx, Functional, Layer};
    /// let mut g = Functional::new("two_heads");
    /// let x = g.input("x");
    /// let h = g.apply(Dense::new(8), &[x]);
    /// let price = g.apply(Dense::new(1).named("price"), &[h]);
    /// let kind = g.apply(Dense::new(3).named("kind"), &[h]);
    /// let model = g.outputs(&[("price", price), ("kind", kind)])?;
    /// assert_eq!(model.output_names(), ["price", "kind"]);
    /// let ys = model.call_outputs(&[Tensor::ones(&[2, 4], &Device::Cpu)?], &[], &mut Ctx::inference())?;
    /// assert_eq!((ys[0].dims(), ys[1].dims()), (&[2, 1][..], &[2, 3][..]));
    /// # Ok::<(), weft_core::Error>(())
    /// ```
    pub fn outputs(mut self, outs: &[(&str, Sym)]) -> Result<Self> {
        if outs.is_empty() {
            return Err(Error::invalid("Functional", format!("{}: a model needs at least one output", self.name)));
        }
        if outs.len() > 1 {
            for (i, (n, _)) in outs.iter().enumerate() {
                if n.is_empty() || outs[..i].iter().any(|(m, _)| m == n) {
                    return Err(Error::invalid(
                        "Functional",
                        format!("{}: several outputs need distinct names, got {n:?} at position {i}", self.name),
                    ));
                }
            }
        }
        if self.late_input {
            return Err(Error::invalid(
                "Functional",
                format!("{}: declare every input before applying the first layer", self.name),
            ));
        }
        if let Some((i, n)) = self.inputs.iter().enumerate().find(|(i, n)| self.inputs[..*i].contains(n)) {
            return Err(Error::invalid("Functional", format!("{}: input {i} repeats the name {n:?}", self.name)));
        }
        let n_in = self.inputs.len();
        for (i, node) in self.nodes.iter().enumerate() {
            let args: Vec<Sym> = match node {
                Node::Apply { args, .. } => args.clone(),
                Node::Mask { x, mask } => vec![*x, *mask],
            };
            if let Some(bad) = args.iter().find(|a| a.0 >= n_in + i) {
                let what = match node {
                    Node::Apply { layer, .. } => format!("layer {}", join(&self.name, layer.name())),
                    Node::Mask { .. } => "a mask".to_string(),
                };
                return Err(Error::invalid(
                    "Functional",
                    format!("{what} takes value {} which is not made before it in {}", bad.0, self.name),
                ));
            }
        }
        if let Some((n, out)) = outs.iter().find(|(_, o)| o.0 >= n_in + self.nodes.len()) {
            return Err(Error::invalid(
                "Functional",
                format!("the output {n:?} ({}) is not a value of {}", out.0, self.name),
            ));
        }
        self.outputs = outs.iter().map(|(n, o)| (n.to_string(), *o)).collect();
        Ok(self)
    }

    fn layers(&self) -> impl Iterator<Item = &dyn Layer> {
        self.nodes.iter().filter_map(|n| match n {
            Node::Apply { layer, .. } => Some(layer.as_ref()),
            Node::Mask { .. } => None,
        })
    }
}

impl Layer for Functional {
    fn call(&self, x: &Tensor, ctx: &mut Ctx) -> Result<Tensor> {
        self.call_with(std::slice::from_ref(x), &[], ctx)
    }
    fn call_with(&self, inputs: &[Tensor], masks: &[Option<Tensor>], ctx: &mut Ctx) -> Result<Tensor> {
        match self.outputs.len() {
            1 => Ok(self.call_outputs(inputs, masks, ctx)?.swap_remove(0)),
            _ => Err(Error::invalid(
                "Functional",
                format!(
                    "{} has the outputs {:?}: call it with call_outputs (a Model does), not as a one-output layer",
                    self.name,
                    self.output_names()
                ),
            )),
        }
    }
    fn call_outputs(&self, inputs: &[Tensor], masks: &[Option<Tensor>], ctx: &mut Ctx) -> Result<Vec<Tensor>> {
        let _scope = crate::scope::enter(self);
        if self.outputs.is_empty() {
            return Err(Error::invalid(
                "Functional",
                format!("{}: call output(..) to finish the graph first", self.name),
            ));
        }
        if inputs.len() != self.inputs.len() {
            return Err(Error::invalid(
                "Functional",
                format!("{} takes inputs {:?}, got {} tensors", self.name, self.inputs, inputs.len()),
            ));
        }
        let mut values: Vec<(Tensor, Option<Tensor>)> =
            inputs.iter().enumerate().map(|(i, t)| (t.clone(), masks.get(i).cloned().flatten())).collect();
        for node in &self.nodes {
            let v = match node {
                Node::Apply { layer, args } => {
                    let xs: Vec<Tensor> = args.iter().map(|a| values[a.0].0.clone()).collect();
                    let ms: Vec<Option<Tensor>> = args.iter().map(|a| values[a.0].1.clone()).collect();
                    // In the layer's scope, whether or not it opens one itself.
                    let _s = crate::scope::enter(layer.as_ref());
                    let y = layer.call_with(&xs, &ms, ctx)?;
                    let m = layer.output_mask(&xs, &ms, &y)?;
                    (y, m)
                }
                Node::Mask { x, mask } => {
                    let keep = &values[mask.0].0;
                    let keep = if keep.dtype() == DType::F32 { keep.clone() } else { keep.to_dtype(DType::F32)? };
                    (values[x.0].0.clone(), Some(keep))
                }
            };
            values.push(v);
        }
        Ok(self.outputs.iter().map(|(_, o)| values[o.0].0.clone()).collect())
    }
    fn output_names(&self) -> Vec<String> {
        match self.outputs.as_slice() {
            [(n, _)] if n.is_empty() => Vec::new(),
            outs => outs.iter().map(|(n, _)| n.clone()).collect(),
        }
    }
    fn input_names(&self) -> Vec<String> {
        self.inputs.clone()
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn set_name(&mut self, name: String) {
        self.name = name;
    }
    fn kind(&self) -> &'static str {
        "Functional"
    }
    fn variables(&self) -> Vec<(String, Var)> {
        sublayer_variables(self.sublayers())
    }
    fn sublayers(&self) -> Vec<&dyn Layer> {
        self.layers().collect()
    }
}
