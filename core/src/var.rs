//! `Var`: a trainable tensor. Its id never changes, so gradients keyed by id find it every step,
//! and an optimizer replaces its data in place with `set` (or, on the Cpu where nothing else holds
//! the buffer, writes over it: `Var::adam_step_in_place`).

use crate::tensor::{TensorId, TensorInner};
use crate::{DType, Error, Result, Tensor};
use std::sync::{Arc, RwLock};

/// An f32 variable: trainable (what an optimizer updates), or, made with
/// [`Var::non_trainable`], state a layer keeps that no gradient reaches (a batch norm's moving
/// statistics).
///
/// ```
/// use weft_core::{Device, Tensor, Var};
/// let w = Var::new(Tensor::zeros(&[2, 2], &Device::Cpu)?)?;
/// w.set(&Tensor::ones(&[2, 2], &Device::Cpu)?)?;
/// assert_eq!(w.as_tensor().to_vec::<f32>()?, vec![1.0; 4]);
/// # Ok::<(), weft_core::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Var(Tensor, bool);

impl Var {
    /// A variable holding a contiguous copy of `t`'s values (detached from any graph).
    pub fn new(t: Tensor) -> Result<Var> {
        Var::make(t, true)
    }

    /// A variable an optimizer never updates: state a layer sets itself (a batch norm's moving
    /// mean and variance). It is saved and split like any variable.
    ///
    /// ```
    /// use weft_core::{Device, Tensor, Var};
    /// let v = Var::non_trainable(Tensor::zeros(&[3], &Device::Cpu)?)?;
    /// assert!(!v.is_trainable());
    /// # Ok::<(), weft_core::Error>(())
    /// ```
    pub fn non_trainable(t: Tensor) -> Result<Var> {
        Var::make(t, false)
    }

    /// Whether an optimizer updates this variable.
    pub fn is_trainable(&self) -> bool {
        self.1
    }

    fn make(t: Tensor, trainable: bool) -> Result<Var> {
        if t.dtype() != DType::F32 {
            return Err(Error::DType { op: "Var::new", expected: "f32", got: t.dtype() });
        }
        let c = crate::no_grad(|| t.contiguous_from_zero())?;
        Ok(Var(
            Tensor(Arc::new(TensorInner {
                id: TensorId::new(),
                storage: Arc::new(RwLock::new(c.storage())),
                layout: c.layout().clone(),
                dtype: c.dtype(),
                device: c.device().clone(),
                op: None,
                is_var: true,
            })),
            trainable,
        ))
    }

    /// The variable as a tensor (for use in ops; gradients flow to it).
    pub fn as_tensor(&self) -> &Tensor {
        &self.0
    }

    /// Replace the values in place; `t` must have the same shape, dtype and device.
    pub fn set(&self, t: &Tensor) -> Result<()> {
        if t.dims() != self.0.dims() {
            return Err(Error::ShapeMismatch { op: "Var::set", lhs: self.0.dims().to_vec(), rhs: t.dims().to_vec() });
        }
        if t.dtype() != self.0.dtype() {
            return Err(Error::invalid(
                "Var::set",
                format!("the variable holds {:?} values, the new value is {:?}", self.0.dtype(), t.dtype()),
            ));
        }
        if t.device() != self.0.device() {
            return Err(Error::DeviceMismatch {
                op: "Var::set",
                lhs: self.0.device().describe(),
                rhs: t.device().describe(),
            });
        }
        let c = crate::no_grad(|| t.contiguous_from_zero())?;
        *self.0.0.storage.write().unwrap_or_else(|p| p.into_inner()) = c.storage();
        Ok(())
    }
}

impl std::ops::Deref for Var {
    type Target = Tensor;
    fn deref(&self) -> &Tensor {
        &self.0
    }
}
