//! Views: new layouts over the same storage. None of these moves data (reshape copies only when
//! the strides make a view impossible).

use super::Tensor;
use crate::backprop::Op;
use crate::layout::resolve_axis;
use crate::{Error, Result};

impl Tensor {
    /// Swap two axes (negative counts from the end).
    pub fn transpose(&self, a: isize, b: isize) -> Result<Tensor> {
        let r = self.rank();
        let (a, b) = (resolve_axis("transpose", a, r)?, resolve_axis("transpose", b, r)?);
        let mut dims: Vec<usize> = (0..r).collect();
        dims.swap(a, b);
        self.permute(&dims)
    }

    /// Swap the last two axes.
    pub fn t(&self) -> Result<Tensor> {
        if self.rank() < 2 {
            return Err(Error::invalid("t", format!("needs at least 2 dimensions, got shape {:?}", self.dims())));
        }
        self.transpose(-2, -1)
    }

    /// Reorder axes: output axis i is input axis `dims[i]`.
    pub fn permute(&self, dims: &[usize]) -> Result<Tensor> {
        if dims.iter().enumerate().all(|(i, &d)| i == d) && dims.len() == self.rank() {
            return Ok(self.clone());
        }
        let layout = self.layout().permute(dims)?;
        Ok(self.view(layout, Op::Permute(self.clone(), dims.into())))
    }

    /// `len` entries of `axis` from `start`.
    pub fn narrow(&self, axis: isize, start: usize, len: usize) -> Result<Tensor> {
        let axis = resolve_axis("narrow", axis, self.rank())?;
        if start == 0 && len == self.dims()[axis] {
            return Ok(self.clone());
        }
        let layout = self.layout().narrow(axis, start, len)?;
        Ok(self.view(layout, Op::Narrow(self.clone(), axis, start)))
    }

    /// Broadcast to `shape` (NumPy rules): size-1 and missing leading axes repeat without copying.
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Tensor> {
        if shape == self.dims() {
            return Ok(self.clone());
        }
        let layout = self.layout().broadcast_to(shape)?;
        Ok(self.view(layout, Op::Broadcast(self.clone())))
    }

    /// Same data, new shape (see [`Tensor::reshape_infer`] for a -1 entry). A view when the
    /// strides allow, else a contiguous copy first.
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        // Checked: a product that wraps could equal the element count (`[2, 2^63]` "is" 0).
        let n = crate::layout::checked_numel("reshape", shape).map_err(|_| Error::ShapeMismatch {
            op: "reshape",
            lhs: self.dims().to_vec(),
            rhs: shape.to_vec(),
        })?;
        if n != self.numel() {
            return Err(Error::ShapeMismatch { op: "reshape", lhs: self.dims().to_vec(), rhs: shape.to_vec() });
        }
        if shape == self.dims() {
            return Ok(self.clone());
        }
        match self.layout().reshape(shape) {
            Some(layout) => Ok(self.view(layout, Op::Reshape(self.clone()))),
            None => self.contiguous()?.reshape(shape),
        }
    }

    /// Reshape where one entry may be -1, inferred from the others.
    pub fn reshape_infer(&self, shape: &[isize]) -> Result<Tensor> {
        let given: Vec<usize> = shape.iter().filter(|&&d| d >= 0).map(|&d| d as usize).collect();
        let known = crate::layout::checked_numel("reshape", &given)
            .map_err(|_| Error::invalid("reshape", format!("cannot reshape {:?} to {shape:?}", self.dims())))?;
        let holes = shape.iter().filter(|&&d| d < 0).count();
        // Only -1 means "infer": -2 is a mistake, not a second spelling.
        if shape.iter().any(|&d| d < -1)
            || holes > 1
            || (holes == 1 && (known == 0 || !self.numel().is_multiple_of(known)))
        {
            return Err(Error::invalid("reshape", format!("cannot reshape {:?} to {shape:?}", self.dims())));
        }
        let dims: Vec<usize> =
            shape.iter().map(|&d| if d < 0 { self.numel() / known.max(1) } else { d as usize }).collect();
        self.reshape(&dims)
    }

    /// Insert a size-1 axis (negative counts from the end of the result).
    pub fn unsqueeze(&self, axis: isize) -> Result<Tensor> {
        let axis = resolve_axis("unsqueeze", axis, self.rank() + 1)?;
        let layout = self.layout().unsqueeze(axis)?;
        Ok(self.view(layout, Op::Reshape(self.clone())))
    }

    /// Remove a size-1 axis.
    pub fn squeeze(&self, axis: isize) -> Result<Tensor> {
        let axis = resolve_axis("squeeze", axis, self.rank())?;
        let layout = self.layout().squeeze(axis)?;
        Ok(self.view(layout, Op::Reshape(self.clone())))
    }

    /// Merge all axes into one.
    pub fn flatten_all(&self) -> Result<Tensor> {
        self.reshape(&[self.numel()])
    }

    /// Merge axes `start..=end` into one.
    pub fn flatten(&self, start: usize, end: usize) -> Result<Tensor> {
        if start > end || end >= self.rank() {
            return Err(Error::invalid(
                "flatten",
                format!("axes {start}..={end} out of range for shape {:?}", self.dims()),
            ));
        }
        let d = self.dims();
        let mut shape: Vec<usize> = d[..start].to_vec();
        shape.push(d[start..=end].iter().product());
        shape.extend_from_slice(&d[end + 1..]);
        self.reshape(&shape)
    }

    /// A row-major copy, or this tensor itself when it is already contiguous.
    pub fn contiguous(&self) -> Result<Tensor> {
        if self.is_contiguous() { Ok(self.clone()) } else { self.copy() }
    }

    /// A row-major copy in fresh storage (differentiable: the gradient passes straight through).
    pub(crate) fn copy(&self) -> Result<Tensor> {
        let storage = self.storage().contiguous(self.layout(), self.dtype())?;
        Ok(Tensor::from_storage(
            storage,
            self.dims(),
            self.dtype(),
            self.device().clone(),
            Some(Op::Copy(self.clone())),
        ))
    }

    /// A layout-only check used by ops that need a contiguous vector from offset 0.
    pub(crate) fn is_compact(&self) -> bool {
        self.is_contiguous() && self.layout().offset() == 0
    }
}
