//! Gradients that reach a tensor through slices of it (`narrow`), held apart until the tensor's
//! gradient is needed and then put together in one pass.
//!
//! Padding each slice's gradient with zeros to the full shape and adding the padded tensors up
//! costs a full-size fill and add per slice: an RNN that reads step `t` of `[batch, time, gates]`
//! pays `time` full passes over that tensor, quadratic in the sequence length (an LSTM over 64
//! steps spent 90% of its training step there). Slices that do not overlap, the usual case (time
//! steps, gates, heads), are instead joined with one `concat`, zeros filling the gaps; only
//! overlapping slices fall back to padding and adding.

use crate::{Result, Tensor};

/// The gradient `grad` of `source.narrow(axis, start, grad.dims()[axis])`.
pub(crate) struct SliceGrad {
    pub axis: usize,
    pub start: usize,
    pub grad: Tensor,
}

impl SliceGrad {
    fn len(&self) -> usize {
        self.grad.dims()[self.axis]
    }
}

/// The gradient of a tensor of `dims` on `like`'s device from the gradients of its slices, in the
/// order they arrived: the gradients of one slice are summed in that order, and each element's
/// value is the sum of the slices that cover it (zeros add nothing, so disjoint slices give the
/// bits of padding and adding).
pub(crate) fn assemble(dims: &[usize], mut slices: Vec<SliceGrad>) -> Result<Tensor> {
    // Sum the gradients of a slice seen more than once (a weight narrowed at every step).
    let mut merged: Vec<SliceGrad> = Vec::with_capacity(slices.len());
    for s in slices.drain(..) {
        match merged.iter_mut().find(|m| m.axis == s.axis && m.start == s.start && m.len() == s.len()) {
            Some(m) => m.grad = m.grad.add(&s.grad)?,
            None => merged.push(s),
        }
    }
    merged.sort_by_key(|s| (s.axis, s.start));
    let one_axis = merged.windows(2).all(|w| w[0].axis == w[1].axis && w[0].start + w[0].len() <= w[1].start);
    if one_axis {
        return join(dims, &merged);
    }
    let mut total: Option<Tensor> = None;
    for s in &merged {
        let padded = join(dims, std::slice::from_ref(s))?;
        total = Some(match total {
            Some(t) => t.add(&padded)?,
            None => padded,
        });
    }
    Ok(total.expect("at least one slice"))
}

/// Disjoint slices along one axis, sorted by start, joined into the full shape with zeros between.
fn join(dims: &[usize], slices: &[SliceGrad]) -> Result<Tensor> {
    let axis = slices[0].axis;
    let device = slices[0].grad.device();
    let zeros = |n: usize| -> Result<Tensor> {
        let mut s = dims.to_vec();
        s[axis] = n;
        Tensor::zeros(&s, device)
    };
    let mut parts = Vec::with_capacity(2 * slices.len() + 1);
    let mut at = 0;
    for s in slices {
        if s.start > at {
            parts.push(zeros(s.start - at)?);
        }
        parts.push(s.grad.clone());
        at = s.start + s.len();
    }
    if dims[axis] > at {
        parts.push(zeros(dims[axis] - at)?);
    }
    Tensor::concat(&parts, axis as isize)
}
