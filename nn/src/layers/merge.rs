//! Merges: layers that combine several inputs of a functional model (Keras' `Add`, `Multiply`,
//! `Concatenate`). Their output mask keeps a position only where every input's mask does.

use crate::{Ctx, Layer};
use weft_core::{Error, Result, Tensor, Var, trace};

#[derive(Clone, Copy)]
enum Kind {
    Add,
    Multiply,
    Concatenate(isize),
}

macro_rules! merge_layer {
    ($t:ident, $kind:literal, $doc:literal) => {
        #[doc = $doc]
        pub struct $t {
            name: String,
            kind: Kind,
        }
        impl $t {
            /// Give the layer a name.
            pub fn named(mut self, name: &str) -> Self {
                self.name = name.to_string();
                self
            }
        }
        impl Layer for $t {
            fn call(&self, x: &Tensor, ctx: &mut Ctx) -> Result<Tensor> {
                self.call_with(std::slice::from_ref(x), &[], ctx)
            }
            fn call_with(&self, inputs: &[Tensor], _: &[Option<Tensor>], _: &mut Ctx) -> Result<Tensor> {
                let _scope = crate::scope::enter(self);
                merge(self.kind, $kind, inputs)
            }
            fn output_mask(&self, inputs: &[Tensor], masks: &[Option<Tensor>], _: &Tensor) -> Result<Option<Tensor>> {
                match self.kind {
                    Kind::Concatenate(axis) => concat_masks(inputs, masks, axis),
                    _ => and_masks(masks),
                }
            }
            fn name(&self) -> &str {
                &self.name
            }
            fn set_name(&mut self, name: String) {
                self.name = name;
            }
            fn kind(&self) -> &'static str {
                $kind
            }
            fn variables(&self) -> Vec<(String, Var)> {
                Vec::new()
            }
        }
    };
}

merge_layer!(Add, "Add", "The sum of two or more inputs of one shape (broadcasting as `Tensor::add`).");
merge_layer!(Multiply, "Multiply", "The elementwise product of two or more inputs of one shape.");
merge_layer!(Concatenate, "Concatenate", "The inputs joined along one axis (default: the last).");

impl Add {
    /// An addition layer.
    pub fn new() -> Self {
        Add { name: String::new(), kind: Kind::Add }
    }
}
impl Default for Add {
    fn default() -> Self {
        Self::new()
    }
}
impl Multiply {
    /// A multiplication layer.
    pub fn new() -> Self {
        Multiply { name: String::new(), kind: Kind::Multiply }
    }
}
impl Default for Multiply {
    fn default() -> Self {
        Self::new()
    }
}
impl Concatenate {
    /// Join along `axis` (negative counts from the end; Keras' default is -1).
    pub fn new(axis: isize) -> Self {
        Concatenate { name: String::new(), kind: Kind::Concatenate(axis) }
    }
}

fn merge(kind: Kind, op: &'static str, inputs: &[Tensor]) -> Result<Tensor> {
    let path = trace::current_scope();
    let [first, rest @ ..] = inputs else {
        return Err(Error::invalid(op, format!("{path}: needs at least one input")));
    };
    match kind {
        Kind::Concatenate(axis) => {
            let r = first.rank() as isize;
            let a = if axis < 0 { axis + r } else { axis };
            if a < 0 || a >= r {
                return Err(Error::invalid(op, format!("{path}: axis {axis} of inputs of rank {r}")));
            }
            Tensor::concat(inputs, a)
        }
        Kind::Add | Kind::Multiply => {
            let mut acc = first.clone();
            for t in rest {
                if t.dims() != first.dims() {
                    return Err(Error::invalid(
                        op,
                        format!("{path}: inputs of shapes {:?} and {:?} differ", first.dims(), t.dims()),
                    ));
                }
                acc = if matches!(kind, Kind::Add) { acc.add(t)? } else { acc.mul(t)? };
            }
            Ok(acc)
        }
    }
}

/// Keras' mask of a concatenation: each input's mask widened to the input's shape (all ones when
/// it has none), joined along the axis, then kept where any entry of the last axis is kept.
fn concat_masks(inputs: &[Tensor], masks: &[Option<Tensor>], axis: isize) -> Result<Option<Tensor>> {
    if masks.iter().all(Option::is_none) {
        return Ok(None);
    }
    let mut full = Vec::with_capacity(inputs.len());
    for (i, x) in inputs.iter().enumerate() {
        full.push(match masks.get(i).cloned().flatten() {
            None => Tensor::ones(x.dims(), x.device())?,
            Some(m) if m.rank() < x.rank() => m.unsqueeze(-1)?.broadcast_to(x.dims())?,
            Some(m) => m,
        });
    }
    let r = inputs[0].rank() as isize;
    let a = if axis < 0 { axis + r } else { axis };
    Ok(Some(Tensor::concat(&full, a)?.max(&[-1], false)?))
}

/// The product of the masks present (a position is kept only where every masked input keeps it).
fn and_masks(masks: &[Option<Tensor>]) -> Result<Option<Tensor>> {
    let mut out: Option<Tensor> = None;
    for m in masks.iter().flatten() {
        out = Some(match out {
            Some(o) => o.mul(m)?,
            None => m.clone(),
        });
    }
    Ok(out)
}
