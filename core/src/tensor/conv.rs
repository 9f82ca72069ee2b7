//! Convolution and pooling over channels-last tensors, with their gradients. The 1-D forms are
//! the 2-D ones over a height of 1.

use super::Tensor;
use crate::backprop::{Op, reads_output_only, unary_grad};
use crate::conv::{ConvPass, Padding, PoolKind, Window2d};
use crate::ops::UnaryOp;
use crate::{DType, Error, Result};
use std::sync::Arc;

impl Tensor {
    /// 2-D convolution (cross-correlation, as in Keras and PyTorch) of `[batch, h, w, c_in]` with
    /// a kernel `[kh, kw, c_in, c_out]` (Keras' layout), giving `[batch, out_h, out_w, c_out]`.
    ///
    /// ```
    /// use weft_core::{conv::Padding, Device, Tensor};
    /// let x = Tensor::ones(&[2, 5, 5, 3], &Device::Cpu)?;
    /// let k = Tensor::ones(&[3, 3, 3, 4], &Device::Cpu)?;
    /// let y = x.conv2d(&k, [1, 1], [1, 1], Padding::Valid)?;
    /// assert_eq!(y.dims(), &[2, 3, 3, 4]);
    /// assert_eq!(y.to_vec::<f32>()?[0], 27.0);
    /// # Ok::<(), weft_core::Error>(())
    /// ```
    pub fn conv2d(
        &self,
        kernel: &Tensor,
        strides: [usize; 2],
        dilation: [usize; 2],
        padding: Padding,
    ) -> Result<Tensor> {
        self.conv2d_then(kernel, None, [strides, dilation], padding)
    }

    /// `op(self.conv2d(kernel, ..) + bias)`, a convolution layer's bias and activation: on the
    /// Cpu, for the activations whose gradient reads the output (relu, tanh, sigmoid, identity),
    /// applied to each block of output rows right after its product while in cache; otherwise the
    /// convolution, then [`Tensor::add_unary`]. `bias` is `[c_out]`.
    ///
    /// ```
    /// use weft_core::{conv::Padding, ops::UnaryOp, Device, Tensor};
    /// let x = Tensor::ones(&[1, 3, 3, 2], &Device::Cpu)?;
    /// let k = Tensor::ones(&[3, 3, 2, 2], &Device::Cpu)?;
    /// let bias = Tensor::from_vec(vec![-20f32, 1.0], &[2], &Device::Cpu)?;
    /// let y = x.conv2d_add_unary(&k, &bias, UnaryOp::Relu, [1, 1], [1, 1], Padding::Valid)?;
    /// assert_eq!(y.to_vec::<f32>()?, vec![0.0, 19.0]);
    /// # Ok::<(), weft_core::Error>(())
    /// ```
    pub fn conv2d_add_unary(
        &self,
        kernel: &Tensor,
        bias: &Tensor,
        op: UnaryOp,
        strides: [usize; 2],
        dilation: [usize; 2],
        padding: Padding,
    ) -> Result<Tensor> {
        self.conv2d_then(kernel, Some((bias, op)), [strides, dilation], padding)
    }

    /// The convolution, with `epilogue` (bias, op) applied to its output blocks where the Cpu can.
    fn conv2d_then(
        &self,
        kernel: &Tensor,
        epilogue: Option<(&Tensor, UnaryOp)>,
        [strides, dilation]: [[usize; 2]; 2],
        padding: Padding,
    ) -> Result<Tensor> {
        let g = self.conv_geometry(kernel, strides, dilation, padding)?;
        let c_out = kernel.dims()[3];
        let (x, k) = (self.contiguous_from_zero()?, kernel.contiguous_from_zero()?);
        let (storage, epilogue) = match epilogue {
            None => (x.storage().conv2d(ConvPass::Forward, x.layout(), &k.storage(), k.layout(), &g)?, None),
            Some((bias, op)) => {
                if bias.dims() != [c_out] {
                    return Err(Error::ShapeMismatch {
                        op: "conv2d bias",
                        lhs: vec![c_out],
                        rhs: bias.dims().to_vec(),
                    });
                }
                let b = bias.contiguous_from_zero()?;
                let fused = match reads_output_only(op) {
                    true => x.storage().conv2d_add_unary(x.layout(), &k.storage(), k.layout(), &g, &b.storage(), op)?,
                    false => None,
                };
                match fused {
                    Some(storage) => (storage, Some((b, op))),
                    None => return x.conv2d_then(&k, None, [strides, dilation], padding)?.add_unary(bias, op),
                }
            }
        };
        let dims = g.output_dims(c_out);
        let (xs, ks, device) = (x.clone(), k.clone(), self.device().clone());
        // With an epilogue the closure keeps the output's storage, not the output (which holds
        // the closure): the op's gradient reads it.
        let out = epilogue.as_ref().map(|&(_, op)| (storage.clone(), op));
        let backward = Arc::new(move |dy: &Tensor| -> Result<Vec<Option<Tensor>>> {
            let dy = match &out {
                Some((s, op)) => {
                    let out = Tensor::from_storage(s.clone(), &dims, DType::F32, device.clone(), None);
                    unary_grad(*op, &out, &out, dy)?.ok_or_else(|| Error::invalid("conv2d", "no gradient"))?
                }
                None => dy.clone(),
            };
            let dy = dy.contiguous_from_zero()?;
            // Only for inputs that take part in the gradient (backprop drops the others' anyway):
            // the images fed to a model's first layer do not, and a frozen kernel does not.
            let dx = xs.tracks_grad().then(|| conv_pass(ConvPass::InputGrad, &dy, &ks, &g, xs.dims())).transpose()?;
            let dk = ks.tracks_grad().then(|| conv_pass(ConvPass::KernelGrad, &xs, &dy, &g, ks.dims())).transpose()?;
            let db = out.as_ref().map(|_| dy.sum(&[0, 1, 2], false)).transpose()?;
            Ok([dx, dk].into_iter().chain(db.map(Some)).collect())
        });
        let (name, mut inputs) = (if epilogue.is_some() { "conv2d_add_unary" } else { "conv2d" }, vec![x, k]);
        inputs.extend(epilogue.map(|(b, _)| b));
        let op = Op::Custom { name, inputs, backward };
        Ok(Tensor::from_storage(storage, &dims, DType::F32, self.device().clone(), Some(op)))
    }

    /// 1-D convolution of `[batch, steps, c_in]` with a kernel `[k, c_in, c_out]` (Keras'
    /// `Conv1D`; `Padding::Causal` pads before the sequence only).
    pub fn conv1d(&self, kernel: &Tensor, stride: usize, dilation: usize, padding: Padding) -> Result<Tensor> {
        let (x, k) = (self.as_2d("conv1d")?, kernel.kernel_as_2d()?);
        x.conv2d(&k, [1, stride], [1, dilation], padding)?.squeeze(1)
    }

    /// `op(self.conv1d(kernel, ..) + bias)`: [`Tensor::conv2d_add_unary`] over a height of 1.
    pub fn conv1d_add_unary(
        &self,
        kernel: &Tensor,
        bias: &Tensor,
        op: UnaryOp,
        stride: usize,
        dilation: usize,
        padding: Padding,
    ) -> Result<Tensor> {
        let (x, k) = (self.as_2d("conv1d")?, kernel.kernel_as_2d()?);
        x.conv2d_add_unary(&k, bias, op, [1, stride], [1, dilation], padding)?.squeeze(1)
    }

    /// Max pooling over windows of `pool` (height, width) of `[batch, h, w, c]`; padding is
    /// never the maximum.
    pub fn max_pool2d(&self, pool: [usize; 2], strides: [usize; 2], padding: Padding) -> Result<Tensor> {
        self.pool2d(PoolKind::Max, pool, strides, padding)
    }

    /// Average pooling over windows of `pool` of `[batch, h, w, c]`; with `Padding::Same` the
    /// edge windows average only their taps inside the input (as Keras).
    pub fn avg_pool2d(&self, pool: [usize; 2], strides: [usize; 2], padding: Padding) -> Result<Tensor> {
        self.pool2d(PoolKind::Avg, pool, strides, padding)
    }

    /// Max pooling of `[batch, steps, c]`.
    pub fn max_pool1d(&self, pool: usize, stride: usize, padding: Padding) -> Result<Tensor> {
        self.as_2d("max_pool1d")?.pool2d(PoolKind::Max, [1, pool], [1, stride], padding)?.squeeze(1)
    }

    /// Average pooling of `[batch, steps, c]`.
    pub fn avg_pool1d(&self, pool: usize, stride: usize, padding: Padding) -> Result<Tensor> {
        self.as_2d("avg_pool1d")?.pool2d(PoolKind::Avg, [1, pool], [1, stride], padding)?.squeeze(1)
    }

    fn pool2d(&self, kind: PoolKind, pool: [usize; 2], strides: [usize; 2], padding: Padding) -> Result<Tensor> {
        let op = if kind == PoolKind::Max { "max_pool" } else { "avg_pool" };
        self.expect_f32(op)?;
        if padding == Padding::Causal {
            return Err(Error::invalid(op, "pooling pads valid or same, not causal"));
        }
        let g = Window2d::new(op, self.dims(), pool, strides, [1, 1], padding)?;
        let x = self.contiguous_from_zero()?;
        let storage = x.storage().pool2d(kind, x.layout(), None, &g)?;
        let xs = x.clone();
        let backward = Arc::new(move |dy: &Tensor| -> Result<Vec<Option<Tensor>>> {
            // (Images pooled before any layer take no part in the gradient.)
            if !xs.tracks_grad() {
                return Ok(vec![None]);
            }
            let dy = dy.contiguous_from_zero()?;
            let s = xs.storage().pool2d(kind, xs.layout(), Some((&dy.storage(), dy.layout())), &g)?;
            Ok(vec![Some(Tensor::from_storage(s, xs.dims(), DType::F32, xs.device().clone(), None))])
        });
        let op = Op::Custom { name: op, inputs: vec![x], backward };
        let dims = g.output_dims(g.channels);
        Ok(Tensor::from_storage(storage, &dims, DType::F32, self.device().clone(), Some(op)))
    }

    /// The geometry of `self` convolved with `kernel`, after checking both.
    fn conv_geometry(
        &self,
        kernel: &Tensor,
        strides: [usize; 2],
        dilation: [usize; 2],
        padding: Padding,
    ) -> Result<Window2d> {
        self.expect_f32("conv2d")?;
        kernel.expect_f32("conv2d")?;
        self.same_device(kernel, "conv2d")?;
        let (x, k) = (self.dims(), kernel.dims());
        if x.len() != 4 || k.len() != 4 || k[2] != x[3] || k[3] == 0 {
            return Err(Error::invalid(
                "conv2d",
                format!(
                    "input {x:?} must be [batch, h, w, c_in] and kernel {k:?} [kh, kw, c_in, c_out] with the same c_in and c_out > 0"
                ),
            ));
        }
        Window2d::new("conv2d", x, [k[0], k[1]], strides, dilation, padding)
    }

    /// `[batch, steps, c]` as `[batch, 1, steps, c]`.
    fn as_2d(&self, op: &'static str) -> Result<Tensor> {
        if self.rank() != 3 {
            return Err(Error::invalid(op, format!("input must be [batch, steps, channels], got {:?}", self.dims())));
        }
        self.unsqueeze(1)
    }

    /// A 1-D kernel `[k, c_in, c_out]` as `[1, k, c_in, c_out]`.
    fn kernel_as_2d(&self) -> Result<Tensor> {
        if self.rank() != 3 {
            return Err(Error::invalid("conv1d", format!("kernel must be [k, c_in, c_out], got {:?}", self.dims())));
        }
        self.unsqueeze(0)
    }
}

/// One gradient pass of a convolution, as a tensor of `dims` (no gradient of its own).
fn conv_pass(pass: ConvPass, a: &Tensor, b: &Tensor, g: &Window2d, dims: &[usize]) -> Result<Tensor> {
    let s = a.storage().conv2d(pass, a.layout(), &b.storage(), b.layout(), g)?;
    Ok(Tensor::from_storage(s, dims, DType::F32, a.device().clone(), None))
}
