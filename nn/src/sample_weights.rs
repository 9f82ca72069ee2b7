//! Sample and class weights in `fit` and `evaluate`: made once per call, then carried with the
//! labels (under a name no output can have), so batching, shuffling, `validation_split` and a
//! data axis cut them as they cut the labels; each step takes them off again.

use crate::Inputs;
use std::collections::HashMap;
use weft_core::{DType, Device, Error, Result, Tensor};

/// The name the weights travel under among the labels.
const KEY: &str = "\u{0}sample_weight";

/// The labels with the weights among them.
pub(crate) fn attach(y: &Inputs, w: Tensor) -> Inputs {
    y.clone().with(KEY, w)
}

/// The labels without the weights, and the weights (if attached).
pub(crate) fn take(y: &Inputs) -> (Inputs, Option<Tensor>) {
    let mut labels = Inputs::new();
    let mut weights = None;
    for (n, t) in y.entries() {
        if n == KEY {
            weights = Some(t.clone());
        } else {
            labels = labels.with(n, t.clone());
        }
    }
    (labels, weights)
}

/// `w` as f32 weights for `n` samples: `[n]`, or `[n, ..]` matching the per-sample losses'
/// leading axes (checked against them at the loss). An `Err` names the shape.
pub(crate) fn check(op: &'static str, w: &Tensor, n: usize) -> Result<Tensor> {
    if w.rank() == 0 || w.dims()[0] != n {
        return Err(Error::invalid(
            op,
            format!("sample_weight of shape {:?} for {n} samples: give one weight per sample ([{n}])", w.dims()),
        ));
    }
    w.to_dtype(DType::F32)
}

/// One weight per sample from a weight per class (Keras' `class_weight`): the class of a sample
/// is its label, or the position of the largest value of a one-hot (or soft) label; a class
/// without a weight, and every sample from `train` on (the validation rows), weighs 1.
pub(crate) fn from_classes(y: &Tensor, class_weight: &HashMap<usize, f32>, train: usize) -> Result<Tensor> {
    if y.rank() == 0 || y.rank() > 2 {
        return Err(Error::invalid(
            "class_weight",
            format!("labels of shape {:?}: class weights take one label (or one-hot row) per sample", y.dims()),
        ));
    }
    let n = y.dims()[0];
    let y = y.to_dtype(DType::F32)?.to_device(&Device::Cpu)?;
    let per_row = y.numel() / n.max(1);
    let classes: Vec<f32> = if per_row > 1 {
        y.reshape(&[n, per_row])?.argmax(-1, false)?.to_dtype(DType::F32)?.to_vec::<f32>()?
    } else {
        y.to_vec::<f32>()?
    };
    let w: Vec<f32> = classes
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let c = c.round();
            if i < train && c >= 0.0 { class_weight.get(&(c as usize)).copied().unwrap_or(1.0) } else { 1.0 }
        })
        .collect();
    Tensor::from_vec(w, &[n], &Device::Cpu)
}
