//! The values of f32 tensors as host slices, shared rather than copied where the data already
//! lives on the host: what code that works on the numbers directly (the in-host collectives of
//! weft-parallel) needs to move data at memory speed.

use crate::cpu::{CpuStorage, HostBuf};
use crate::storage::Storage;
use crate::{DType, Device, Error, Result, Tensor};
use std::sync::Arc;

/// Row-major f32 values on the host: a window into a Cpu tensor's buffer, or a copy.
#[derive(Debug, Clone)]
pub struct HostF32 {
    buf: Arc<HostBuf>,
    start: usize,
    len: usize,
}

impl std::ops::Deref for HostF32 {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        &self.buf[self.start..self.start + self.len]
    }
}

impl Tensor {
    /// The values, row-major. A contiguous Cpu tensor shares its buffer (no copy; the buffer is
    /// never written while this holds it, not even by an optimizer's update in place: see
    /// `Var::adam_step_in_place`); any other is copied to the host.
    pub fn host_f32(&self) -> Result<HostF32> {
        if self.dtype() != DType::F32 {
            return Err(Error::DType { op: "host_f32", expected: "f32", got: self.dtype() });
        }
        if matches!(self.device(), Device::Cpu)
            && self.is_contiguous()
            && let Storage::Cpu(CpuStorage::F32(buf)) = self.storage()
        {
            return Ok(HostF32 { buf, start: self.layout().offset(), len: self.numel() });
        }
        let v = self.to_vec::<f32>()?;
        let len = v.len();
        Ok(HostF32 { buf: Arc::new(HostBuf::new(v)), start: 0, len })
    }

    /// A tensor of `shape` owning `values`: on the Cpu the vector becomes the tensor's buffer
    /// (no copy), on other devices it is uploaded.
    pub fn from_host_vec(values: Vec<f32>, shape: &[usize], device: &Device) -> Result<Tensor> {
        if Some(values.len()) != crate::layout::checked_numel("from_host_vec", shape).ok() {
            return Err(Error::invalid(
                "from_host_vec",
                format!("{} values do not fill shape {shape:?}", values.len()),
            ));
        }
        match device {
            Device::Cpu => Ok(Tensor::from_storage(
                Storage::Cpu(CpuStorage::F32(Arc::new(HostBuf::new(values)))),
                shape,
                DType::F32,
                Device::Cpu,
                None,
            )),
            _ => Tensor::from_slice(&values, shape, device),
        }
    }

    /// An empty vector with room for `len` values, reused from the Cpu buffer cache when one of
    /// that size was freed (fresh pages fault on first write, which halves the speed of a copy).
    pub fn host_vec(len: usize) -> Vec<f32> {
        crate::cpu::take_host_vec(len)
    }
}
