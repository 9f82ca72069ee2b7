//! `Tensor`: an immutable, cheaply cloned handle to data on a device, with a runtime shape (a
//! variable's buffer is written over only where no other handle can see it:
//! `Var::adam_step_in_place`).
//!
//! A tensor is a `Layout` over shared `Storage`, so views share memory. Each tensor made by an op
//! remembers the op and its inputs (when gradients are being tracked), which is all
//! `backward()` needs.

mod arith;
mod conv;
mod create;
mod host;
mod index;
mod linalg;
mod nn;
mod recurrent;
mod reduce;
mod to_index;
mod views;
pub use host::HostF32;
pub(crate) use to_index::not_an_index;

use crate::backprop::Op;
use crate::storage::Storage;
use crate::{DType, Device, Error, Layout, Result, WithDType};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

/// A tensor's identity: stable for its lifetime, and the key of gradient stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TensorId(u64);

impl TensorId {
    pub(crate) fn new() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        TensorId(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

pub(crate) struct TensorInner {
    pub(crate) id: TensorId,
    /// Shared by all views; replaced in place only by `Var::set`. Its buffer is written only
    /// where no other cell holds it (`Var::adam_step_in_place`).
    pub(crate) storage: Arc<RwLock<Storage>>,
    pub(crate) layout: Layout,
    pub(crate) dtype: DType,
    pub(crate) device: Device,
    /// How this tensor was made; `None` for leaves and when gradients are not tracked.
    pub(crate) op: Option<Op>,
    pub(crate) is_var: bool,
}

/// An n-dimensional array on a device.
///
/// ```
/// use weft_core::{Device, Tensor};
/// let a = Tensor::from_vec(vec![1f32, 2., 3., 4., 5., 6.], &[2, 3], &Device::Cpu)?;
/// let b = a.t()?.matmul(&a)?; // [3, 2] @ [2, 3]
/// assert_eq!(b.dims(), &[3, 3]);
/// assert_eq!(b.to_vec::<f32>()?[0], 17.0);
/// # Ok::<(), weft_core::Error>(())
/// ```
#[derive(Clone)]
pub struct Tensor(pub(crate) Arc<TensorInner>);

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tensor[{:?}, {:?}, {}]", self.dims(), self.dtype(), self.device().describe())
    }
}

impl Tensor {
    /// Build a tensor from parts; records the op for tracing and, if gradients are tracked, for backward.
    pub(crate) fn make(
        storage: Arc<RwLock<Storage>>,
        layout: Layout,
        dtype: DType,
        device: Device,
        op: Option<Op>,
    ) -> Tensor {
        let id = TensorId::new();
        if let Some(op) = &op {
            crate::trace::record(id, op, layout.shape(), dtype);
        }
        let op = op.filter(|op| crate::backprop::grad_enabled() && op.inputs().iter().any(|t| t.tracks_grad()));
        Tensor(Arc::new(TensorInner { id, storage, layout, dtype, device, op, is_var: false }))
    }

    /// A fresh contiguous tensor holding `storage`, made by `op`.
    pub(crate) fn from_storage(
        storage: Storage,
        shape: &[usize],
        dtype: DType,
        device: Device,
        op: Option<Op>,
    ) -> Tensor {
        Tensor::make(Arc::new(RwLock::new(storage)), Layout::contiguous(shape), dtype, device, op)
    }

    /// A view of this tensor's storage with another layout, made by `op`.
    pub(crate) fn view(&self, layout: Layout, op: Op) -> Tensor {
        Tensor::make(self.0.storage.clone(), layout, self.dtype(), self.device().clone(), Some(op))
    }

    /// A copy of the storage handle (not the data), released from the lock.
    pub(crate) fn storage(&self) -> Storage {
        self.0.storage.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// This tensor's id.
    pub fn id(&self) -> TensorId {
        self.0.id
    }
    /// The shape.
    pub fn dims(&self) -> &[usize] {
        self.0.layout.shape()
    }
    /// The shape (alias of `dims`).
    pub fn shape(&self) -> &[usize] {
        self.0.layout.shape()
    }
    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.0.layout.rank()
    }
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.0.layout.numel()
    }
    /// Size of one axis (negative counts from the end).
    pub fn dim(&self, axis: isize) -> Result<usize> {
        Ok(self.dims()[crate::layout::resolve_axis("dim", axis, self.rank())?])
    }
    /// The element type.
    pub fn dtype(&self) -> DType {
        self.0.dtype
    }
    /// The device holding the data.
    pub fn device(&self) -> &Device {
        &self.0.device
    }
    /// The layout (shape, strides, offset).
    pub fn layout(&self) -> &Layout {
        &self.0.layout
    }
    /// Whether the elements are row-major without gaps.
    pub fn is_contiguous(&self) -> bool {
        self.0.layout.is_contiguous()
    }
    /// Whether this tensor is a trainable variable.
    pub fn is_var(&self) -> bool {
        self.0.is_var
    }
    /// Whether gradients flow to or through this tensor.
    pub fn tracks_grad(&self) -> bool {
        self.0.is_var || self.0.op.is_some()
    }
    pub(crate) fn op(&self) -> Option<&Op> {
        self.0.op.as_ref()
    }

    /// The same data, cut off from the graph: gradients do not flow through the result.
    pub fn detach(&self) -> Tensor {
        Tensor(Arc::new(TensorInner {
            id: TensorId::new(),
            storage: self.0.storage.clone(),
            layout: self.0.layout.clone(),
            dtype: self.0.dtype,
            device: self.0.device.clone(),
            op: None,
            is_var: false,
        }))
    }

    /// A tensor holding this one's current values. Storage is replaced (by `Var::set`), and
    /// written in place only where nothing else holds its buffer (an optimizer's update:
    /// `Var::adam_step_in_place`), which a snapshot does: so this costs no copy, and later
    /// updates of a variable do not reach the snapshot. Used to keep the best weights seen
    /// during training.
    pub fn snapshot(&self) -> Tensor {
        Tensor(Arc::new(TensorInner {
            id: TensorId::new(),
            storage: Arc::new(RwLock::new(self.storage())),
            layout: self.0.layout.clone(),
            dtype: self.0.dtype,
            device: self.0.device.clone(),
            op: None,
            is_var: false,
        }))
    }

    /// Identities of what this tensor reads: its storage cell (shared by its views, `detach` and
    /// the variable it may be) and the cell's buffer on the Cpu (shared by snapshots), else 0.
    /// Two tensors with no identity in common read different memory. An optimizer that updates
    /// variables in place asks this of the gradients it has yet to read.
    ///
    /// ```
    /// use weft_core::{Device, Tensor};
    /// let a = Tensor::zeros(&[2, 3], &Device::Cpu)?;
    /// let [cell, buffer] = a.buffer_ids();
    /// assert_eq!(a.t()?.buffer_ids()[0], cell);
    /// assert_eq!(a.snapshot().buffer_ids()[1], buffer);
    /// assert_ne!(a.snapshot().buffer_ids()[0], cell);
    /// # Ok::<(), weft_core::Error>(())
    /// ```
    pub fn buffer_ids(&self) -> [usize; 2] {
        let cell = Arc::as_ptr(&self.0.storage) as *const () as usize;
        let buffer = match &*self.0.storage.read().unwrap_or_else(|p| p.into_inner()) {
            Storage::Cpu(crate::cpu::CpuStorage::F32(b)) => Arc::as_ptr(b) as *const () as usize,
            _ => 0,
        };
        [cell, buffer]
    }

    /// The elements in row-major order, copied to the host. `T` must match the dtype.
    pub fn to_vec<T: WithDType>(&self) -> Result<Vec<T>> {
        if T::DTYPE != self.dtype() {
            return Err(Error::DType { op: "to_vec", expected: T::DTYPE.name(), got: self.dtype() });
        }
        let bytes = self.storage().read_bytes(self.layout(), self.dtype())?;
        Ok(bytemuck::pod_collect_to_vec(&bytes))
    }

    /// The value of a one-element tensor.
    pub fn to_scalar<T: WithDType>(&self) -> Result<T> {
        if self.numel() != 1 {
            return Err(Error::invalid(
                "to_scalar",
                format!("tensor of shape {:?} has {} elements, not 1", self.dims(), self.numel()),
            ));
        }
        Ok(self.to_vec::<T>()?[0])
    }

    /// Copy to another device (a no-op when already there). Gradients flow back across the copy.
    pub fn to_device(&self, device: &Device) -> Result<Tensor> {
        if device == self.device() {
            return Ok(self.clone());
        }
        let storage = match device {
            Device::Meta => Storage::Meta,
            _ => {
                let bytes = self.storage().read_bytes(self.layout(), self.dtype())?;
                create::storage_from_bytes(self.dtype(), &bytes, device)?
            }
        };
        Ok(Tensor::from_storage(storage, self.dims(), self.dtype(), device.clone(), Some(Op::ToDevice(self.clone()))))
    }

    /// Check that `other` is on the same device, naming `op` if not.
    pub(crate) fn same_device(&self, other: &Tensor, op: &'static str) -> Result<()> {
        if self.device() != other.device() {
            return Err(Error::DeviceMismatch { op, lhs: self.device().describe(), rhs: other.device().describe() });
        }
        Ok(())
    }

    /// Check the dtype is f32, naming `op` if not.
    pub(crate) fn expect_f32(&self, op: &'static str) -> Result<()> {
        if self.dtype() != DType::F32 {
            return Err(Error::DType { op, expected: "f32", got: self.dtype() });
        }
        Ok(())
    }
}

/// The element count of a new tensor of `shape` on `device`, checked: a count that overflows
/// `usize`, or (on a GPU, whose kernels index with u32) exceeds `u32::MAX`, is an `Err` naming
/// `op` and the shape, never a count that wraps.
pub(crate) fn check_shape(op: &'static str, shape: &[usize], device: &Device) -> Result<usize> {
    let n = crate::layout::checked_numel(op, shape)?;
    if device.is_gpu() && n > u32::MAX as usize {
        return Err(Error::invalid(
            op,
            format!("shape {shape:?} has {n} elements; GPU kernels index with u32, so at most {} fit", u32::MAX),
        ));
    }
    Ok(n)
}
