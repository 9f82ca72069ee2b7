//! Pooling over the time axis and normalisation to unit length: the head of a sentence encoder.

use crate::{Ctx, Layer};
use weft_core::{DType, Error, Result, Tensor, Var, trace};

/// Mean over the time axis of `[batch, time, features]`, counting only unmasked steps when the
/// input carries a mask (Keras' `GlobalAveragePooling1D`; with a mask, the mean pooling of
/// sentence-transformers).
///
/// ```
/// use weft_core::{Device, Tensor};
/// use weft_nn::{layers::GlobalAveragePooling1D, Ctx, Layer};
/// let x = Tensor::from_vec(vec![1f32, 2., 3., 4., 100., 100.], &[1, 3, 2], &Device::Cpu)?;
/// let keep = Tensor::from_vec(vec![1f32, 1., 0.], &[1, 3], &Device::Cpu)?;
/// let pool = GlobalAveragePooling1D::new();
/// let y = pool.call_with(&[x], &[Some(keep)], &mut Ctx::inference())?;
/// assert_eq!(y.to_vec::<f32>()?, vec![2., 3.]);
/// # Ok::<(), weft_core::Error>(())
/// ```
#[derive(Default)]
pub struct GlobalAveragePooling1D {
    name: String,
}

impl GlobalAveragePooling1D {
    /// A pooling layer.
    pub fn new() -> Self {
        Self::default()
    }
    /// Give the layer a name.
    pub fn named(mut self, name: &str) -> Self {
        self.name = name.to_string();
        self
    }
}

impl Layer for GlobalAveragePooling1D {
    fn call(&self, x: &Tensor, ctx: &mut Ctx) -> Result<Tensor> {
        self.call_with(std::slice::from_ref(x), &[None], ctx)
    }
    fn call_with(&self, inputs: &[Tensor], masks: &[Option<Tensor>], _: &mut Ctx) -> Result<Tensor> {
        let _scope = crate::scope::enter(self);
        let [x] = inputs else {
            return Err(Error::invalid("GlobalAveragePooling1D", format!("takes one input, got {}", inputs.len())));
        };
        if x.rank() != 3 {
            return Err(Error::invalid(
                "GlobalAveragePooling1D",
                format!("{}: expects [batch, time, features], got shape {:?}", trace::current_scope(), x.dims()),
            ));
        }
        match masks.first().cloned().flatten() {
            None => x.mean(&[1], false),
            Some(m) => {
                if m.dims() != &x.dims()[..2] {
                    return Err(Error::invalid(
                        "GlobalAveragePooling1D",
                        format!(
                            "{}: a mask of shape {:?} for an input of shape {:?}",
                            trace::current_scope(),
                            m.dims(),
                            x.dims()
                        ),
                    ));
                }
                let m = m.to_device(x.device())?.to_dtype(DType::F32)?.unsqueeze(-1)?; // [b, t, 1]
                // Sum of the kept steps over their count (at least a tiny count, as
                // sentence-transformers clamps it, so an all-masked row gives 0, not NaN).
                x.mul(&m)?.sum(&[1], false)?.div(&m.sum(&[1], false)?.clamp(1e-9, f32::MAX)?)
            }
        }
    }
    fn output_mask(&self, _: &[Tensor], _: &[Option<Tensor>], _: &Tensor) -> Result<Option<Tensor>> {
        Ok(None)
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn set_name(&mut self, name: String) {
        self.name = name;
    }
    fn kind(&self) -> &'static str {
        "GlobalAveragePooling1D"
    }
    fn variables(&self) -> Vec<(String, Var)> {
        Vec::new()
    }
}

/// Scales each vector along the last axis to unit L2 length (Keras' `UnitNormalization`):
/// `x / max(||x||, 1e-12)`.
///
/// ```
/// use weft_core::{Device, Tensor};
/// use weft_nn::{layers::UnitNormalization, Ctx, Layer};
/// let x = Tensor::from_vec(vec![3f32, 4.], &[1, 2], &Device::Cpu)?;
/// let y = UnitNormalization::new().call(&x, &mut Ctx::inference())?;
/// assert_eq!(y.to_vec::<f32>()?, vec![0.6, 0.8]);
/// # Ok::<(), weft_core::Error>(())
/// ```
#[derive(Default)]
pub struct UnitNormalization {
    name: String,
}

impl UnitNormalization {
    /// A normalisation layer.
    pub fn new() -> Self {
        Self::default()
    }
    /// Give the layer a name.
    pub fn named(mut self, name: &str) -> Self {
        self.name = name.to_string();
        self
    }
}

impl Layer for UnitNormalization {
    fn call(&self, x: &Tensor, _: &mut Ctx) -> Result<Tensor> {
        let _scope = crate::scope::enter(self);
        // Clamped before the square root, so a zero vector (an all-masked row) has a finite
        // gradient: sqrt's backward at 0 would be infinite.
        let norm = x.square()?.sum(&[-1], true)?.clamp(1e-24, f32::MAX)?.sqrt()?;
        x.div(&norm)
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn set_name(&mut self, name: String) {
        self.name = name;
    }
    fn kind(&self) -> &'static str {
        "UnitNormalization"
    }
    fn variables(&self) -> Vec<(String, Var)> {
        Vec::new()
    }
}
