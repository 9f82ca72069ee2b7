//! Matrix multiplication with NumPy's rules: batch axes broadcast, 1-D operands are promoted.

use super::Tensor;
use crate::backprop::Op;
use crate::layout::broadcast_shape;
use crate::ops::UnaryOp;
use crate::{DType, Device, Error, Result};
use std::sync::Arc;

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

    /// `op(self @ rhs + bias)`: a dense layer's product, bias and activation, for `self`
    /// `[.., k]`, `rhs` `[k, n]` and `bias` `[n]`.
    ///
    /// On the Cpu the bias and activation are applied to the product's output blocks right after
    /// their sums, while in cache (one pass over the output fewer, and one op): in inference
    /// ([`no_grad`](crate::no_grad)), and in training for an activation whose gradient is read
    /// from its output (identity, relu, tanh, sigmoid, exp), as one node whose backward takes
    /// the activation's and the bias's gradients in one pass, then the product's (the kernel's
    /// may be left to the optimizer: [`backward_deferring`](Tensor::backward_deferring)).
    /// On a GPU, in the same cases, the product's kernel adds the bias and applies the op as it
    /// stores each value, where the product is one dispatch (one dispatch and one pass over the
    /// output fewer; the backward as the ops'). Otherwise it is [`matmul`](Tensor::matmul) then
    /// [`add_unary`](Tensor::add_unary), with their gradients. The same values and gradients
    /// either way, bit for bit on one device (NaN as NaN).
    ///
    /// ```
    /// use weft_core::{no_grad, ops::UnaryOp, Device, Tensor};
    /// let x = Tensor::from_vec(vec![1f32, 2.0, 3.0, 4.0], &[2, 2], &Device::Cpu)?;
    /// let w = Tensor::from_vec(vec![1f32, -1.0, 1.0, 1.0], &[2, 2], &Device::Cpu)?;
    /// let b = Tensor::from_vec(vec![0.5f32, -10.0], &[2], &Device::Cpu)?;
    /// let fused = no_grad(|| x.matmul_add_unary(&w, &b, UnaryOp::Relu))?;
    /// assert_eq!(fused.to_vec::<f32>()?, vec![3.5, 0.0, 7.5, 0.0]);
    /// assert_eq!(fused.to_vec::<f32>()?, x.matmul(&w)?.add_unary(&b, UnaryOp::Relu)?.to_vec::<f32>()?);
    /// # Ok::<(), weft_core::Error>(())
    /// ```
    pub fn matmul_add_unary(&self, rhs: &Tensor, bias: &Tensor, op: UnaryOp) -> Result<Tensor> {
        let what = "matmul_add_unary";
        // With a gradient, one node whose backward takes the activation's and bias's gradients
        // in one pass: for an activation whose gradient is read from its output.
        let training = crate::backprop::grad_enabled();
        let fused = !matches!(self.device(), Device::Meta) && (!training || crate::backprop::reads_output_only(op));
        let n = rhs.dims().last().copied().unwrap_or(0);
        // The ops one after another (their own checks name any mismatch).
        let apart = || self.matmul(rhs)?.add_unary(bias, op);
        if !fused || self.rank() < 2 || rhs.rank() != 2 || bias.dims() != [n] {
            return apart();
        }
        for (t, side) in [(rhs, "kernel"), (bias, "bias")] {
            self.same_device(t, what)?;
            t.expect_f32(side)?;
        }
        self.expect_f32(what)?;
        let k = self.dims()[self.rank() - 1];
        if rhs.dims()[0] != k {
            return Err(Error::ShapeMismatch { op: "matmul", lhs: self.dims().to_vec(), rhs: rhs.dims().to_vec() });
        }
        let rows: usize = self.dims()[..self.rank() - 1].iter().product();
        if training && self.layout().reshape(&[rows, k]).is_none() {
            // Rows that do not merge without a copy: `matmul` multiplies them as a batch, whose
            // kernel gradient sums the entries' products (in another order than one product).
            return apart();
        }
        let x = self.reshape(&[rows, k])?;
        let mut shape = self.dims().to_vec();
        *shape.last_mut().expect("rank >= 2") = n;
        super::check_shape(what, &shape, self.device())?;
        // (A bias cut from a wider variable, a GRU's recurrent half, is read where it lies.)
        let b = bias.contiguous()?;
        let bias_storage = b.storage();
        let bias_at = (&bias_storage, b.layout().offset());
        let storage = match x.storage().matmul_add_unary(x.layout(), &rhs.storage(), rhs.layout(), bias_at, op)? {
            Some(s) => s,
            None => return apart(),
        };
        if training {
            // The bias through a view of its own per use, whose gradient reaches the bias where
            // `add_unary`'s broadcast view would: a bias used many times sums its gradients in
            // the same order.
            let node = Op::Dense { x, w: rhs.clone(), b: b.reshape(&[1, n])?, op };
            let y = Tensor::from_storage(storage, &[rows, n], DType::F32, self.device().clone(), Some(node));
            return y.reshape(&shape);
        }
        // Made only where no gradient is recorded: the node names the op in a trace.
        let backward = Arc::new(|_: &Tensor| -> Result<Vec<Option<Tensor>>> {
            Err(Error::invalid("matmul_add_unary", "its fused form was made without a gradient"))
        });
        let node = Op::Custom { name: what, inputs: vec![x, rhs.clone(), b], backward };
        Ok(Tensor::from_storage(storage, &shape, DType::F32, self.device().clone(), Some(node)))
    }
}
