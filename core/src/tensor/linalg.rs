//! Matrix multiplication with NumPy's rules: batch axes broadcast, 1-D operands are promoted.

use super::Tensor;
use crate::backprop::Op;
use crate::layout::broadcast_shape;
use crate::{Error, Result};

impl Tensor {
    /// `self @ rhs`. Shapes `[.., m, k] @ [.., k, n] -> [.., m, n]`; batch axes broadcast; a 1-D
    /// operand is a row (left) or column (right) vector, dropped from the result. Transposed views
    /// are read in place on every backend.
    pub fn matmul(&self, rhs: &Tensor) -> Result<Tensor> {
        self.same_device(rhs, "matmul")?;
        self.expect_f32("matmul")?;
        rhs.expect_f32("matmul")?;
        let err = || Error::ShapeMismatch { op: "matmul", lhs: self.dims().to_vec(), rhs: rhs.dims().to_vec() };
        if self.rank() == 0 || rhs.rank() == 0 {
            return Err(err());
        }
        if self.rank() == 1 {
            return self.unsqueeze(0)?.matmul(rhs)?.squeeze(-2);
        }
        if rhs.rank() == 1 {
            return self.matmul(&rhs.unsqueeze(1)?)?.squeeze(-1);
        }
        let (ra, rb) = (self.rank(), rhs.rank());
        let (m, k) = (self.dims()[ra - 2], self.dims()[ra - 1]);
        let (k2, n) = (rhs.dims()[rb - 2], rhs.dims()[rb - 1]);
        if k != k2 {
            return Err(err());
        }
        // A stack of rows times one matrix (a Dense layer on `[batch, steps, features]`) is one
        // product over all the rows when they merge without a copy: the engine packs the matrix
        // once rather than per batch entry, and the backward's gradient of the matrix is one
        // product, not a batch of them summed after.
        if rb == 2 && ra > 2 {
            let rows: usize = self.dims()[..ra - 1].iter().product();
            if self.layout().reshape(&[rows, k]).is_some() {
                let mut shape = self.dims().to_vec();
                shape[ra - 1] = n;
                return self.reshape(&[rows, k])?.matmul(rhs)?.reshape(&shape);
            }
        }
        let batch = broadcast_shape("matmul", &self.dims()[..ra - 2], &rhs.dims()[..rb - 2]).map_err(|_| err())?;
        let shape_a: Vec<usize> = batch.iter().copied().chain([m, k]).collect();
        let shape_b: Vec<usize> = batch.iter().copied().chain([k, n]).collect();
        let (a, b) = (self.broadcast_to(&shape_a)?, rhs.broadcast_to(&shape_b)?);
        let shape: Vec<usize> = batch.iter().copied().chain([m, n]).collect();
        super::check_shape("matmul", &shape, self.device())?;
        let storage = a.storage().matmul(a.layout(), &b.storage(), b.layout())?;
        Ok(Tensor::from_storage(storage, &shape, self.dtype(), self.device().clone(), Some(Op::Matmul(a, b))))
    }
}
