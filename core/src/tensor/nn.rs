//! The ops neural networks are made of: softmax, layer norm, dropout, one_hot, cross-entropy.

use super::Tensor;
use crate::backprop::Op;
use crate::layout::resolve_axis;
use crate::{DType, Error, Result};

impl Tensor {
    /// Move `axis` last (a view), apply a last-axis row op, and move it back.
    fn along_axis(&self, axis: isize, f: impl FnOnce(&Tensor) -> Result<Tensor>) -> Result<Tensor> {
        let axis = resolve_axis("softmax", axis, self.rank())?;
        let last = self.rank() - 1;
        if axis == last {
            return f(self);
        }
        f(&self.transpose(axis as isize, last as isize)?)?.transpose(axis as isize, last as isize)
    }

    fn softmax_last(&self, log: bool) -> Result<Tensor> {
        self.expect_f32("softmax")?;
        if self.rank() == 0 {
            return Err(Error::invalid("softmax", "needs at least one axis"));
        }
        let storage = self.storage().softmax(self.layout(), log)?;
        let op = if log { Op::LogSoftmax(self.clone()) } else { Op::Softmax(self.clone()) };
        Ok(Tensor::from_storage(storage, self.dims(), DType::F32, self.device().clone(), Some(op)))
    }

    /// Softmax along `axis`, numerically stable.
    pub fn softmax(&self, axis: isize) -> Result<Tensor> {
        self.along_axis(axis, |x| x.softmax_last(false))
    }

    /// Log-softmax along `axis`, numerically stable.
    pub fn log_softmax(&self, axis: isize) -> Result<Tensor> {
        self.along_axis(axis, |x| x.softmax_last(true))
    }

    /// Softmax's (`log`: log-softmax's) backward over the last axis in one op where the device
    /// has it (the Cpu; a GPU for rows one workgroup takes), from this tensor, the forward's
    /// output, and the output's gradient `g` (this shape, this device): `y (g - sum(g y))`, or
    /// `g - exp(y) sum(g)`. `None` elsewhere (the tensor ops then name any mismatch).
    pub(crate) fn softmax_grad(&self, g: &Tensor, log: bool) -> Result<Option<Tensor>> {
        if [self, g].iter().any(|t| t.dtype() != DType::F32)
            || self.rank() == 0
            || self.same_device(g, "softmax").is_err()
            || g.dims() != self.dims()
        {
            return Ok(None);
        }
        let dx = self.storage().softmax_grad(self.layout(), (&g.storage(), g.layout()), log)?;
        Ok(dx.map(|s| Tensor::from_storage(s, self.dims(), DType::F32, self.device().clone(), None)))
    }

    /// Layer norm's backward in one op where the device has it (the Cpu; a GPU for rows one
    /// workgroup takes): the input's gradient and `g * xhat` (whose sums over
    /// the rows are gamma's gradient), for this input, `gamma` (`[last]`) and the output's
    /// gradient `g` (this shape), all on one device; `None` elsewhere (the tensor ops then name
    /// any mismatch).
    pub(crate) fn layer_norm_grad(&self, gamma: &Tensor, g: &Tensor, eps: f32) -> Result<Option<(Tensor, Tensor)>> {
        let n = self.dims().last().copied();
        if [self, gamma, g].iter().any(|t| t.dtype() != DType::F32)
            || self.same_device(gamma, "layer_norm").is_err()
            || self.same_device(g, "layer_norm").is_err()
            || g.dims() != self.dims()
            || n.is_none_or(|n| gamma.dims() != [n])
        {
            return Ok(None);
        }
        // (Compact, as the forward reads it: a GPU's kernel reads gamma from its buffer's start.)
        let gamma = gamma.contiguous_from_zero()?;
        let out = self.storage().layer_norm_grad(
            self.layout(),
            (&gamma.storage(), gamma.layout()),
            (&g.storage(), g.layout()),
            eps,
        )?;
        Ok(out.map(|(dx, q)| {
            let t = |s| Tensor::from_storage(s, self.dims(), DType::F32, self.device().clone(), None);
            (t(dx), t(q))
        }))
    }

    /// Layer normalisation over the last axis: `(x - mean) / sqrt(var + eps) * gamma + beta`,
    /// with `gamma` and `beta` of shape `[last]`. One fused kernel forward.
    pub fn layer_norm(&self, gamma: &Tensor, beta: &Tensor, eps: f32) -> Result<Tensor> {
        self.expect_f32("layer_norm")?;
        let n = *self.dims().last().ok_or_else(|| Error::invalid("layer_norm", "needs at least one axis"))?;
        for p in [gamma, beta] {
            self.same_device(p, "layer_norm")?;
            p.expect_f32("layer_norm")?;
            if p.dims() != [n] {
                return Err(Error::ShapeMismatch {
                    op: "layer_norm",
                    lhs: self.dims().to_vec(),
                    rhs: p.dims().to_vec(),
                });
            }
        }
        let (g, b) = (gamma.contiguous_from_zero()?, beta.contiguous_from_zero()?);
        let storage =
            self.storage().layer_norm(self.layout(), &g.storage(), g.layout(), &b.storage(), b.layout(), eps)?;
        Ok(Tensor::from_storage(
            storage,
            self.dims(),
            DType::F32,
            self.device().clone(),
            Some(Op::LayerNorm { x: self.clone(), gamma: gamma.clone(), beta: beta.clone(), eps }),
        ))
    }

    /// Contiguous and starting at element 0 of its storage (what kernels that index a vector directly need).
    pub(crate) fn contiguous_from_zero(&self) -> Result<Tensor> {
        if self.is_compact() { Ok(self.clone()) } else { self.copy() }
    }

    /// One-hot rows: labels of any shape -> f32 `[..labels, classes]`. Labels may be u32, i32
    /// or whole-valued f32; a label that is not in `0..classes` is an `Err` naming it and
    /// `classes` (it used to give a row of zeros).
    pub fn one_hot(labels: &Tensor, classes: usize) -> Result<Tensor> {
        let what = format!("one_hot: labels for {classes} classes");
        let l = labels.to_index(&what, Some(classes))?.to_dtype(DType::F32)?.unsqueeze(-1)?;
        let range = Tensor::arange(0.0, classes as f32, 1.0, labels.device())?;
        l.eq(&range)
    }

    /// Inverted dropout: zero each element with probability `p` and scale the rest by 1/(1-p).
    /// The mask comes from the counter-based generator, so one seed gives one mask on every device.
    /// With `training == false` (or p == 0) the input is returned as is.
    pub fn dropout(&self, p: f32, seed: u64, training: bool) -> Result<Tensor> {
        if !(0.0..1.0).contains(&p) {
            return Err(Error::invalid("dropout", format!("rate {p} must be in [0, 1)")));
        }
        if !training || p == 0.0 {
            return Ok(self.clone());
        }
        let u = Tensor::rand_on_device(self.dims(), seed, self.device())?;
        let keep = u.cmp_scalar(crate::ops::BinaryOp::Ge, p)?.mul_scalar(1.0 / (1.0 - p))?;
        self.mul(&keep)
    }

    /// Mean cross-entropy of `[.., classes]` logits against integer labels of shape `[..]`,
    /// computed from log-softmax (stable for large logits): `-mean(log_softmax(logits)[label])`.
    /// The log-softmax at each label and its gradient are one pass each: on the Cpu with the bits
    /// of the log-softmax, `gather` and their gradients, on a GPU (u32 labels) one dispatch each.
    ///
    /// ```
    /// # use weft_core::{Device, Tensor};
    /// let logits = Tensor::from_vec(vec![2f32, 0.0, 0.0, 0.0, 3.0, 0.0], &[2, 3], &Device::Cpu)?;
    /// let labels = Tensor::from_vec(vec![0u32, 1], &[2], &Device::Cpu)?;
    /// let loss = Tensor::cross_entropy(&logits, &labels)?.to_vec::<f32>()?[0];
    /// let by_hand = ((1.0f32 + 2.0 * (-2f32).exp()).ln() + (1.0f32 + 2.0 * (-3f32).exp()).ln()) / 2.0;
    /// assert!((loss - by_hand).abs() < 1e-6, "{loss} vs {by_hand}");
    /// # Ok::<(), weft_core::Error>(())
    /// ```
    pub fn cross_entropy(logits: &Tensor, labels: &Tensor) -> Result<Tensor> {
        let r = logits.rank();
        if r == 0 || labels.dims() != &logits.dims()[..r - 1] {
            return Err(Error::ShapeMismatch {
                op: "cross_entropy",
                lhs: logits.dims().to_vec(),
                rhs: labels.dims().to_vec(),
            });
        }
        let c = logits.dims()[r - 1];
        let rows = logits.numel() / c.max(1);
        let (x, ids) = (logits.reshape(&[rows, c])?, labels.reshape(&[rows, 1])?);
        let picked = match x.log_softmax_pick(&ids)? {
            Some(picked) => picked,
            None => {
                // (A GPU's fused kernel checks its labels; gather's own check would not name them.)
                let ids = match ids.device() {
                    crate::Device::Gpu(_) => ids.to_index_later(crate::gpu::LABELS, Some(c))?,
                    _ => ids,
                };
                x.log_softmax(-1)?.gather(1, &ids)?
            }
        };
        // The mean's scale and the sign in one op (on a GPU one dispatch each way, not two):
        // s * -(1/n) + -0 is -(s * (1/n) + 0), `picked.mean_all()?.neg()`, bit for bit for every
        // sum but a NaN's sign and -0 (a sum of picks, x - max - log(sum exp) <= 0, is never -0;
        // a zero sum gives -0 as before).
        picked.sum_all()?.affine(-(1.0 / rows.max(1) as f32), -0.0)
    }

    /// `self.log_softmax(-1)?.gather(1, ids)` for `[rows, classes]` f32 logits and `[rows, 1]`
    /// labels, u32 or i32 on the Cpu (the same bits), u32 on a GPU (one dispatch), as one node
    /// whose backward is one pass; `None` elsewhere.
    fn log_softmax_pick(&self, ids: &Tensor) -> Result<Option<Tensor>> {
        let index = match self.device() {
            crate::Device::Cpu => matches!(ids.dtype(), DType::U32 | DType::I32),
            crate::Device::Gpu(_) => ids.dtype() == DType::U32,
            _ => false,
        };
        if self.same_device(ids, "cross_entropy").is_err() || self.dtype() != DType::F32 || !index {
            return Ok(None);
        }
        let Some((storage, picked)) = self.storage().log_softmax_pick(self.layout(), &ids.storage(), ids.layout())?
        else {
            return Ok(None);
        };
        let x = self.clone();
        let backward = std::sync::Arc::new(move |g: &Tensor| -> Result<Vec<Option<Tensor>>> {
            let d = x.storage().log_softmax_pick_grad(x.layout(), &picked, &g.storage(), g.layout())?;
            Ok(vec![Some(Tensor::from_storage(d, x.dims(), DType::F32, x.device().clone(), None))])
        });
        let node = Op::Custom { name: "log_softmax_pick", inputs: vec![self.clone()], backward };
        Ok(Some(Tensor::from_storage(storage, ids.dims(), DType::F32, self.device().clone(), Some(node))))
    }
}
