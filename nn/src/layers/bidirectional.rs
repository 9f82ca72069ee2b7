//! Bidirectional: a recurrent layer run forwards and a copy of it run backwards, their outputs
//! merged.

use crate::{Ctx, Layer, layer::sublayer_variables};
use weft_core::{Error, Result, Tensor, Var};

/// A recurrent layer [`Bidirectional`] can wrap: it makes a fresh copy of itself (no weights)
/// that runs the other way, and says whether it returns every step.
pub trait Reversible: Layer {
    /// The backward copy.
    fn reversed(&self) -> Box<dyn Layer>;
    /// Whether the output has a time axis.
    fn returns_sequences(&self) -> bool;
    /// Give masked steps the output 0 (Keras' `zero_output_for_mask`).
    fn set_zero_output_for_mask(&mut self, on: bool);
}

/// How [`Bidirectional`] merges the two directions (Keras' `merge_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MergeMode {
    /// Side by side along the last axis (Keras' default).
    #[default]
    Concat,
    /// Added.
    Sum,
    /// Multiplied.
    Mul,
    /// Their mean.
    Ave,
}

/// Keras' `Bidirectional`: the layer on the sequence as it is (`forward_<name>`, the name being
/// the layer's, or its kind in snake case) and a copy of it on the sequence reversed
/// (`backward_<name>`, with weights of its own), the backward outputs
/// put back in time order when every step is returned, then merged. Masks pass to both (a
/// masked step's output is then 0, as Keras sets `zero_output_for_mask`).
///
/// ```
/// use weft_core::{Device, Tensor};
/// use weft_nn::{layers::{Bidirectional, LSTM}, Ctx, Layer};
/// let bi = Bidirectional::new(LSTM::new(4).return_sequences(true));
/// let y = bi.call(&Tensor::ones(&[2, 5, 3], &Device::Cpu)?, &mut Ctx::inference())?;
/// assert_eq!(y.dims(), &[2, 5, 8]);
/// assert_eq!(bi.variables()[0].0, "forward_lstm/kernel");
/// # Ok::<(), weft_core::Error>(())
/// ```
pub struct Bidirectional {
    name: String,
    forward: Box<dyn Layer>,
    backward: Box<dyn Layer>,
    sequences: bool,
    merge: MergeMode,
}

impl Bidirectional {
    /// `layer` forwards and a copy of it backwards, concatenated.
    pub fn new(mut layer: impl Reversible + 'static) -> Self {
        // As Keras: returning sequences, a masked step's output is 0 in both directions.
        layer.set_zero_output_for_mask(layer.returns_sequences());
        // As Keras: forward_<the layer's name>, the kind in snake case for an unnamed one.
        let kind = match layer.name() {
            "" => crate::sequential::to_snake(layer.kind()),
            name => name.to_string(),
        };
        let mut backward = layer.reversed();
        backward.set_name(format!("backward_{kind}"));
        let sequences = layer.returns_sequences();
        let mut forward: Box<dyn Layer> = Box::new(layer);
        forward.set_name(format!("forward_{kind}"));
        Bidirectional { name: String::new(), forward, backward, sequences, merge: MergeMode::Concat }
    }
    /// How the two directions merge.
    pub fn merge_mode(mut self, merge: MergeMode) -> Self {
        self.merge = merge;
        self
    }
    /// Give the layer a name.
    pub fn named(mut self, name: &str) -> Self {
        self.name = name.to_string();
        self
    }
}

impl Layer for Bidirectional {
    fn call(&self, x: &Tensor, ctx: &mut Ctx) -> Result<Tensor> {
        self.call_with(std::slice::from_ref(x), &[None], ctx)
    }
    fn call_with(&self, inputs: &[Tensor], masks: &[Option<Tensor>], ctx: &mut Ctx) -> Result<Tensor> {
        let _scope = crate::scope::enter(self);
        let f = self.forward.call_with(inputs, masks, ctx)?;
        let mut b = self.backward.call_with(inputs, masks, ctx)?;
        if self.sequences {
            // The backward layer gives its steps last to first: back into time order.
            let steps = b.dims().get(1).copied().ok_or_else(|| {
                Error::invalid(
                    "Bidirectional",
                    format!("{}: an output of shape {:?} has no time axis", self.name, b.dims()),
                )
            })?;
            let order: Vec<u32> = (0..steps as u32).rev().collect();
            b = b.index_select(&Tensor::from_vec(order, &[steps], b.device())?, 1)?;
        }
        match self.merge {
            MergeMode::Concat => Tensor::concat(&[f, b], -1),
            MergeMode::Sum => f.add(&b),
            MergeMode::Mul => f.mul(&b),
            MergeMode::Ave => f.add(&b)?.mul_scalar(0.5),
        }
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn set_name(&mut self, name: String) {
        self.name = name;
    }
    fn kind(&self) -> &'static str {
        "Bidirectional"
    }
    fn sublayers(&self) -> Vec<&dyn Layer> {
        vec![self.forward.as_ref(), self.backward.as_ref()]
    }
    fn variables(&self) -> Vec<(String, Var)> {
        sublayer_variables(self.sublayers())
    }
}
