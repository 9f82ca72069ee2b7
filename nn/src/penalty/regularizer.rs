//! Regularizers: a penalty on a variable (or on a layer's output) added to the loss.

use weft_core::{Error, Result, Tensor};

/// A penalty added to the loss (Keras' `regularizers`): on a variable through a layer's
/// `kernel_regularizer` (and `bias_regularizer`, `embeddings_regularizer`), or on the layer's
/// output through `activity_regularizer` (divided by the batch size, as Keras 3 does).
///
/// ```
/// use weft_core::{Device, Tensor};
/// use weft_nn::Regularizer;
/// let w = Tensor::from_vec(vec![1f32, -2.0], &[2], &Device::Cpu)?;
/// assert_eq!(Regularizer::L2(0.1).penalty(&w)?.to_scalar::<f32>()?, 0.5);
/// assert_eq!(Regularizer::L1(0.1).penalty(&w)?.to_scalar::<f32>()?, 0.3);
/// # Ok::<(), weft_core::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Regularizer {
    /// `l1 * sum(|w|)`
    L1(f32),
    /// `l2 * sum(w^2)`
    L2(f32),
    /// `l1 * sum(|w|) + l2 * sum(w^2)`
    L1L2 {
        /// The weight of the absolute values.
        l1: f32,
        /// The weight of the squares.
        l2: f32,
    },
}

impl Regularizer {
    /// The penalty of `w`, a 0-dimensional tensor; an `Err` for a negative or non-finite factor.
    pub fn penalty(&self, w: &Tensor) -> Result<Tensor> {
        let (l1, l2) = match *self {
            Regularizer::L1(l1) => (l1, 0.0),
            Regularizer::L2(l2) => (0.0, l2),
            Regularizer::L1L2 { l1, l2 } => (l1, l2),
        };
        if !(l1 >= 0.0 && l1.is_finite() && l2 >= 0.0 && l2.is_finite()) {
            return Err(Error::invalid("regularizer", format!("{self:?}: factors must be finite and at least 0")));
        }
        let mut p: Option<Tensor> = None;
        if l1 > 0.0 || l2 == 0.0 {
            p = Some(w.abs()?.sum_all()?.mul_scalar(l1)?);
        }
        if l2 > 0.0 {
            let sq = w.square()?.sum_all()?.mul_scalar(l2)?;
            p = Some(match p {
                Some(p) => p.add(&sq)?,
                None => sq,
            });
        }
        Ok(p.expect("l1 or l2 was taken"))
    }
}
