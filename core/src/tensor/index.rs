//! Indexing: index_select / embedding lookup, gather, their adjoints, concat and stack.

use super::Tensor;
use crate::backprop::Op;
use crate::layout::resolve_axis;
use crate::storage::Storage;
use crate::{DType, Error, Result};

fn expect_index(t: &Tensor, op: &'static str) -> Result<()> {
    match t.dtype() {
        DType::U32 | DType::I32 => Ok(()),
        got => Err(Error::DType { op, expected: "u32 or i32", got }),
    }
}

impl Tensor {
    /// Entries `ids` (a 1-D u32/i32 tensor) of `axis`: the result has `ids.len()` entries there.
    pub fn index_select(&self, ids: &Tensor, axis: isize) -> Result<Tensor> {
        let axis = resolve_axis("index_select", axis, self.rank())?;
        self.same_device(ids, "index_select")?;
        self.expect_f32("index_select")?;
        expect_index(ids, "index_select")?;
        if ids.rank() != 1 {
            return Err(Error::invalid("index_select", format!("ids must be 1-D, got shape {:?}", ids.dims())));
        }
        let mut shape = self.dims().to_vec();
        shape[axis] = ids.numel();
        super::check_shape("index_select", &shape, self.device())?;
        let storage = self.storage().index_select(self.layout(), &ids.storage(), ids.layout(), axis)?;
        Ok(Tensor::from_storage(
            storage,
            &shape,
            DType::F32,
            self.device().clone(),
            Some(Op::IndexSelect(self.clone(), ids.detach(), axis)),
        ))
    }

    /// Embedding lookup: rows of this `[vocab, dim]` table for `ids` of any shape -> `[..ids, dim]`.
    pub fn embedding(&self, ids: &Tensor) -> Result<Tensor> {
        if self.rank() != 2 {
            return Err(Error::invalid("embedding", format!("the table must be [vocab, dim], got {:?}", self.dims())));
        }
        let rows = self.index_select(&ids.flatten_all()?, 0)?;
        let shape: Vec<usize> = ids.dims().iter().copied().chain([self.dims()[1]]).collect();
        rows.reshape(&shape)
    }

    /// torch.gather: `out[i][j] = self[i][ids[i][j]]` for `axis` 1, and likewise for any axis.
    /// `ids` has the output's shape and matches this tensor on every other axis.
    pub fn gather(&self, axis: isize, ids: &Tensor) -> Result<Tensor> {
        let axis = resolve_axis("gather", axis, self.rank())?;
        self.same_device(ids, "gather")?;
        self.expect_f32("gather")?;
        expect_index(ids, "gather")?;
        let ok = ids.rank() == self.rank() && (0..self.rank()).all(|a| a == axis || ids.dims()[a] == self.dims()[a]);
        if !ok {
            return Err(Error::ShapeMismatch { op: "gather", lhs: self.dims().to_vec(), rhs: ids.dims().to_vec() });
        }
        let storage = self.storage().gather(self.layout(), &ids.storage(), ids.layout(), axis)?;
        Ok(Tensor::from_storage(
            storage,
            ids.dims(),
            DType::F32,
            self.device().clone(),
            Some(Op::Gather(self.clone(), ids.detach(), axis)),
        ))
    }

    /// Adjoint of `index_select`: zeros of `shape` with this tensor's entries added at `ids` along `axis`.
    pub fn index_add(&self, shape: &[usize], axis: usize, ids: &Tensor) -> Result<Tensor> {
        self.same_device(ids, "index_add")?;
        expect_index(ids, "index_add")?;
        let mut want = super::check_shape("index_add", shape, self.device()).map(|_| shape.to_vec())?;
        if axis >= want.len() {
            return Err(Error::invalid("index_add", format!("axis {axis} out of range for shape {shape:?}")));
        }
        want[axis] = ids.numel();
        if want != self.dims() || ids.rank() != 1 {
            return Err(Error::ShapeMismatch { op: "index_add", lhs: self.dims().to_vec(), rhs: want });
        }
        let storage = self.storage().index_add(self.layout(), shape, axis, &ids.storage(), ids.layout())?;
        Ok(Tensor::from_storage(
            storage,
            shape,
            DType::F32,
            self.device().clone(),
            Some(Op::IndexAdd(self.clone(), ids.detach(), axis)),
        ))
    }

    /// Adjoint of `gather`: zeros of `shape` with `self[p]` added where `ids[p]` points along `axis`.
    pub fn scatter_add(&self, shape: &[usize], axis: usize, ids: &Tensor) -> Result<Tensor> {
        super::check_shape("scatter_add", shape, self.device())?;
        self.same_device(ids, "scatter_add")?;
        expect_index(ids, "scatter_add")?;
        let ok = ids.dims() == self.dims()
            && self.rank() == shape.len()
            && axis < shape.len()
            && (0..shape.len()).all(|a| a == axis || shape[a] == self.dims()[a]);
        if !ok {
            return Err(Error::ShapeMismatch { op: "scatter_add", lhs: self.dims().to_vec(), rhs: shape.to_vec() });
        }
        let storage = self.storage().scatter_add(self.layout(), shape, axis, &ids.storage(), ids.layout())?;
        Ok(Tensor::from_storage(
            storage,
            shape,
            DType::F32,
            self.device().clone(),
            Some(Op::ScatterAdd(self.clone(), ids.detach(), axis)),
        ))
    }

    /// Join tensors along an existing axis.
    pub fn concat(tensors: &[Tensor], axis: isize) -> Result<Tensor> {
        let first = tensors.first().ok_or_else(|| Error::invalid("concat", "no tensors given"))?;
        let axis = resolve_axis("concat", axis, first.rank())?;
        let mut shape = first.dims().to_vec();
        shape[axis] = 0;
        for t in tensors {
            first.same_device(t, "concat")?;
            t.expect_f32("concat")?;
            let same = t.rank() == first.rank() && (0..t.rank()).all(|a| a == axis || t.dims()[a] == first.dims()[a]);
            if !same {
                return Err(Error::ShapeMismatch { op: "concat", lhs: first.dims().to_vec(), rhs: t.dims().to_vec() });
            }
            shape[axis] = shape[axis]
                .checked_add(t.dims()[axis])
                .ok_or_else(|| Error::invalid("concat", format!("the sizes along axis {axis} overflow a usize")))?;
        }
        super::check_shape("concat", &shape, first.device())?;
        if tensors.len() == 1 {
            return Ok(first.clone());
        }
        let parts: Vec<(Storage, crate::Layout)> = tensors.iter().map(|t| (t.storage(), t.layout().clone())).collect();
        let storage = Storage::concat(&parts, &shape, axis)?;
        Ok(Tensor::from_storage(
            storage,
            &shape,
            DType::F32,
            first.device().clone(),
            Some(Op::Concat(tensors.to_vec(), axis)),
        ))
    }

    /// Join tensors of one shape along a new axis.
    pub fn stack(tensors: &[Tensor], axis: isize) -> Result<Tensor> {
        let first = tensors.first().ok_or_else(|| Error::invalid("stack", "no tensors given"))?;
        let axis = resolve_axis("stack", axis, first.rank() + 1)? as isize;
        if let Some(other) = tensors.iter().find(|t| t.dims() != first.dims()) {
            return Err(Error::ShapeMismatch { op: "stack", lhs: first.dims().to_vec(), rhs: other.dims().to_vec() });
        }
        let parts = tensors.iter().map(|t| t.unsqueeze(axis)).collect::<Result<Vec<_>>>()?;
        Tensor::concat(&parts, axis)
    }
}
