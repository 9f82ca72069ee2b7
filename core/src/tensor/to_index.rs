//! Checked conversion of labels and ids to `u32` indices.

use super::Tensor;
use crate::backprop::Op;
use crate::{DType, Device, Error, Result};

impl Tensor {
    /// The values as `u32` indices, checked: every value must be a whole number, not negative,
    /// finite, below 2^32, and below `bound` when one is given. Any other value is an `Err` naming
    /// `what`, the value, its flat (row-major) position and the bound; nothing is clamped or
    /// truncated (-1 never becomes 0, 2.7 never becomes 2). Takes f32, f16, i32 or u32.
    ///
    /// The check runs where the data is: on a GPU it is one kernel that checks and converts, and
    /// one read-back of a 16-byte verdict (so this call waits for the device). On the Meta device,
    /// which holds no values, only the dtype changes.
    ///
    /// [`to_dtype`](Tensor::to_dtype) with `DType::U32` is the plain, unchecked cast.
    ///
    /// ```
    /// # use weft_core::{Device, Tensor};
    /// let labels = Tensor::from_vec(vec![0f32, 2., 1.], &[3], &Device::Cpu)?;
    /// assert_eq!(labels.to_index("labels", Some(3))?.to_vec::<u32>()?, vec![0, 2, 1]);
    /// let bad = Tensor::from_vec(vec![0f32, -1., 1.], &[3], &Device::Cpu)?;
    /// let err = bad.to_index("labels", Some(3)).unwrap_err().to_string();
    /// assert!(err.contains("labels") && err.contains("-1") && err.contains("position 1"), "{err}");
    /// # Ok::<(), weft_core::Error>(())
    /// ```
    pub fn to_index(&self, what: &str, bound: Option<usize>) -> Result<Tensor> {
        self.index_checked(what, bound, false)
    }

    /// [`to_index`](Tensor::to_index) without waiting for the device: on a GPU the check runs in
    /// the same kernel, but a bad value is an `Err` (the same message) from the first read of the
    /// result or of anything computed from it, as a bad index of `index_select` is. What a
    /// training step uses for its labels, so that the device runs the whole step before the host
    /// waits. On the Cpu and the Meta device it is `to_index`.
    ///
    /// ```
    /// # use weft_core::{Device, Tensor};
    /// let bad = Tensor::from_vec(vec![0f32, 7., 1.], &[3], &Device::Cpu)?;
    /// let err = bad.to_index_later("labels", Some(3)).unwrap_err().to_string();
    /// assert!(err.contains("labels: value 7 at flat position 1"), "{err}");
    /// # Ok::<(), weft_core::Error>(())
    /// ```
    pub fn to_index_later(&self, what: &str, bound: Option<usize>) -> Result<Tensor> {
        self.index_checked(what, bound, true)
    }

    fn index_checked(&self, what: &str, bound: Option<usize>, later: bool) -> Result<Tensor> {
        let from = match self.dtype() {
            // The kernels read 32-bit values; f16 holds every index it can exactly as f32.
            DType::F16 if !matches!(self.device(), Device::Meta) => {
                return self.to_dtype(DType::F32)?.index_checked(what, bound, later);
            }
            d @ (DType::F32 | DType::F16 | DType::I32 | DType::U32) => d,
        };
        let (storage, bad) = self.storage().index_check(self.layout(), from, bound, (what, later))?;
        if let Some(at) = bad {
            return Err(not_an_index(what, &self.show_at(at)?, at, bound));
        }
        Ok(Tensor::from_storage(storage, self.dims(), DType::U32, self.device().clone(), Some(Op::Cast(self.clone()))))
    }

    /// The element at flat position `at`, written out (for error messages).
    fn show_at(&self, at: usize) -> Result<String> {
        let one = self.flatten_all()?.narrow(0, at, 1)?;
        Ok(match self.dtype() {
            DType::F32 => one.to_vec::<f32>()?[0].to_string(),
            DType::F16 => one.to_vec::<half::f16>()?[0].to_string(),
            DType::I32 => one.to_vec::<i32>()?[0].to_string(),
            DType::U32 => one.to_vec::<u32>()?[0].to_string(),
        })
    }
}

/// The `Err` for `value` at flat position `at` of `what`, which is not an index below `bound`
/// (`to_index` at once, or a GPU's fault slot for `to_index_later`: the same words).
pub(crate) fn not_an_index(what: &str, value: &str, at: usize, bound: Option<usize>) -> Error {
    let range = match bound {
        Some(b) => format!("whole numbers in 0..{b}"),
        None => format!("whole numbers in 0..={}", u32::MAX),
    };
    Error::invalid(
        "to_index",
        format!("{what}: value {value} at flat position {at} is not a valid index: indices must be {range}"),
    )
}
