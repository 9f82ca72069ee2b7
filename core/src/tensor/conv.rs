//! Convolution and pooling over channels-last tensors, with their gradients. The 1-D forms are
//! the 2-D ones over a height of 1.

use super::Tensor;
use crate::backprop::Op;
use crate::conv::{ConvPass, Padding, PoolKind, Window2d};
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
        let g = self.conv_geometry(kernel, strides, dilation, padding)?;
        let c_out = kernel.dims()[3];
        let (x, k) = (self.contiguous_from_zero()?, kernel.contiguous_from_zero()?);
        let storage = x.storage().conv2d(ConvPass::Forward, x.layout(), &k.storage(), k.layout(), &g)?;
        let (xs, ks) = (x.clone(), k.clone());
        let backward = Arc::new(move |dy: &Tensor| -> Result<Vec<Option<Tensor>>> {
            let dy = dy.contiguous_from_zero()?;
            let dx = conv_pass(ConvPass::InputGrad, &dy, &ks, &g, xs.dims())?;
            let dk = conv_pass(ConvPass::KernelGrad, &xs, &dy, &g, ks.dims())?;
            Ok(vec![Some(dx), Some(dk)])
        });
        let op = Op::Custom { name: "conv2d", inputs: vec![x, k], backward };
        Ok(Tensor::from_storage(storage, &g.output_dims(c_out), DType::F32, self.device().clone(), Some(op)))
    }

    /// 1-D convolution of `[batch, steps, c_in]` with a kernel `[k, c_in, c_out]` (Keras'
    /// `Conv1D`; `Padding::Causal` pads before the sequence only).
    pub fn conv1d(&self, kernel: &Tensor, stride: usize, dilation: usize, padding: Padding) -> Result<Tensor> {
        let (x, k) = (self.as_2d("conv1d")?, kernel.kernel_as_2d()?);
        x.conv2d(&k, [1, stride], [1, dilation], padding)?.squeeze(1)
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
