//! Reductions over any set of axes, with or without keeping them as size-1 axes.

use super::Tensor;
use crate::backprop::Op;
use crate::layout::resolve_axis;
use crate::ops::ReduceOp;
use crate::{DType, Error, Result};

impl Tensor {
    fn resolve_axes(&self, op: &'static str, axes: &[isize]) -> Result<Vec<usize>> {
        let mut out = Vec::with_capacity(axes.len());
        for &a in axes {
            let a = resolve_axis(op, a, self.rank())?;
            if out.contains(&a) {
                return Err(Error::invalid(op, format!("axis {a} is listed twice")));
            }
            out.push(a);
        }
        out.sort_unstable();
        Ok(out)
    }

    /// The primitive reduction: output keeps reduced axes as size 1.
    fn reduce_keepdim(&self, op: ReduceOp, axes: &[usize]) -> Result<Tensor> {
        self.expect_f32(op.name())?;
        let mut shape = self.dims().to_vec();
        for &a in axes {
            shape[a] = 1;
        }
        if axes.iter().any(|&a| self.dims()[a] == 0) && op != ReduceOp::Sum {
            return Err(Error::invalid(op.name(), format!("cannot reduce an empty axis of shape {:?}", self.dims())));
        }
        let storage = self.storage().reduce(op, self.layout(), axes)?;
        let dtype = if op == ReduceOp::ArgMax { DType::U32 } else { DType::F32 };
        let rec = if op == ReduceOp::ArgMax { None } else { Some(Op::Reduce(self.clone(), op, axes.into())) };
        Ok(Tensor::from_storage(storage, &shape, dtype, self.device().clone(), rec))
    }

    fn reduce(&self, op: ReduceOp, axes: &[isize], keepdim: bool) -> Result<Tensor> {
        let axes = self.resolve_axes(op.name(), axes)?;
        let out = self.reduce_keepdim(op, &axes)?;
        if keepdim {
            return Ok(out);
        }
        let shape: Vec<usize> = (0..self.rank()).filter(|a| !axes.contains(a)).map(|a| self.dims()[a]).collect();
        out.reshape(&shape)
    }

    /// Sum over `axes` (negative counts from the end).
    ///
    /// ```
    /// # use weft_core::{Device, Tensor};
    /// let x = Tensor::from_vec(vec![1f32, 2., 3., 4.], &[2, 2], &Device::Cpu)?;
    /// assert_eq!(x.sum(&[0], false)?.to_vec::<f32>()?, vec![4., 6.]);
    /// assert_eq!(x.sum(&[-1], true)?.dims(), &[2, 1]);
    /// # Ok::<(), weft_core::Error>(())
    /// ```
    pub fn sum(&self, axes: &[isize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Sum, axes, keepdim)
    }
    /// Largest value over `axes`.
    pub fn max(&self, axes: &[isize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Max, axes, keepdim)
    }
    /// Smallest value over `axes`.
    pub fn min(&self, axes: &[isize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Min, axes, keepdim)
    }
    /// Mean over `axes`.
    pub fn mean(&self, axes: &[isize], keepdim: bool) -> Result<Tensor> {
        let resolved = self.resolve_axes("mean", axes)?;
        let n: usize = resolved.iter().map(|&a| self.dims()[a]).product();
        self.sum(axes, keepdim)?.mul_scalar(1.0 / n.max(1) as f32)
    }
    /// Population variance over `axes` (divides by n, as Keras and layer norm do).
    pub fn var(&self, axes: &[isize], keepdim: bool) -> Result<Tensor> {
        let mean = self.mean(axes, true)?;
        let d = self.sub(&mean)?;
        d.square()?.mean(axes, keepdim)
    }
    /// Index of the largest value along `axis` (u32; the first one on ties). Not differentiable.
    pub fn argmax(&self, axis: isize, keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::ArgMax, &[axis], keepdim)
    }
    /// Sum of every element, as a 0-dimensional tensor.
    pub fn sum_all(&self) -> Result<Tensor> {
        let axes: Vec<isize> = (0..self.rank() as isize).collect();
        self.sum(&axes, false)
    }
    /// Mean of every element, as a 0-dimensional tensor.
    pub fn mean_all(&self) -> Result<Tensor> {
        let axes: Vec<isize> = (0..self.rank() as isize).collect();
        self.mean(&axes, false)
    }
}
