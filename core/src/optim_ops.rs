//! Fused optimizer updates: one pass over memory per variable instead of one per elementwise op.
//! They take and return plain tensors (no autograd): optimizers call them under `no_grad`.

use crate::cpu;
mod in_place;
use crate::gpu::GpuStorage;
use crate::storage::Storage;
use crate::{DType, Error, Result, Tensor};
pub use in_place::AdamGrad;

/// Hyper-parameters of one Adam step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamStep {
    /// Step size with the bias correction folded in: `lr * sqrt(1 - beta2^t) / (1 - beta1^t)`.
    pub lr_t: f32,
    /// First-moment decay.
    pub beta1: f32,
    /// Second-moment decay.
    pub beta2: f32,
    /// Added to sqrt(v).
    pub eps: f32,
    /// Weights are multiplied by this first (decoupled weight decay: `1 - lr * wd`; 1 for none).
    pub decay: f32,
}

impl Tensor {
    /// One Adam step for weight `self` with gradient `g` and moments `m`, `v` (all one shape):
    /// returns the new weight, m and v, computed in one pass.
    ///
    /// ```
    /// use weft_core::{optim_ops::AdamStep, Device, Tensor};
    /// let dev = Device::Cpu;
    /// let (w, g) = (Tensor::ones(&[3], &dev)?, Tensor::full(0.5, &[3], &dev)?);
    /// let (m, v) = (Tensor::zeros(&[3], &dev)?, Tensor::zeros(&[3], &dev)?);
    /// let step = AdamStep { lr_t: 0.1, beta1: 0.9, beta2: 0.999, eps: 1e-7, decay: 1.0 };
    /// let (w2, m2, _v2) = w.adam_step(&g, &m, &v, step)?;
    /// assert!((m2.to_vec::<f32>()?[0] - 0.05).abs() < 1e-7);
    /// assert!(w2.to_vec::<f32>()?[0] < 1.0);
    /// # Ok::<(), weft_core::Error>(())
    /// ```
    pub fn adam_step(&self, g: &Tensor, m: &Tensor, v: &Tensor, p: AdamStep) -> Result<(Tensor, Tensor, Tensor)> {
        let ([w, m, v], _) = self.adam_pass(g, m, v, p, false)?;
        Ok((w, m, v))
    }

    /// [`adam_step`](Tensor::adam_step) that also checks the gradient in the same pass, so that
    /// a training step need not read it again to know whether the update may stand: the fourth
    /// value is a `[1]` tensor, 0 when every value of `g` is finite and NaN when any is an
    /// infinity or a NaN. On a GPU the kernel tests the values' bits (its arithmetic may assume
    /// finite values), and only where the adapter binds nine storage buffers to a kernel (every
    /// desktop driver; not WebGPU's default limit of eight): elsewhere `None`, and the
    /// gradient's [`max`](Tensor::max) and [`min`](Tensor::min), found by bit tests, tell.
    ///
    /// ```
    /// use weft_core::{optim_ops::AdamStep, Device, Tensor};
    /// let dev = Device::Cpu;
    /// let w = Tensor::ones(&[3], &dev)?;
    /// let (m, v) = (Tensor::zeros(&[3], &dev)?, Tensor::zeros(&[3], &dev)?);
    /// let step = AdamStep { lr_t: 0.1, beta1: 0.9, beta2: 0.999, eps: 1e-7, decay: 1.0 };
    /// let good = Tensor::from_vec(vec![0.5f32, -1.0, 2.0], &[3], &dev)?;
    /// let (_, _, _, check) = w.adam_step_checked(&good, &m, &v, step)?;
    /// assert_eq!(check.unwrap().to_vec::<f32>()?, [0.0]);
    /// let bad = Tensor::from_vec(vec![0.5f32, f32::INFINITY, 2.0], &[3], &dev)?;
    /// let (_, _, _, check) = w.adam_step_checked(&bad, &m, &v, step)?;
    /// assert!(check.unwrap().to_vec::<f32>()?[0].is_nan());
    /// # Ok::<(), weft_core::Error>(())
    /// ```
    pub fn adam_step_checked(
        &self,
        g: &Tensor,
        m: &Tensor,
        v: &Tensor,
        p: AdamStep,
    ) -> Result<(Tensor, Tensor, Tensor, Option<Tensor>)> {
        let ([w, m, v], check) = self.adam_pass(g, m, v, p, true)?;
        Ok((w, m, v, check))
    }

    /// [`adam_step_checked`](Tensor::adam_step_checked) with the gradient given as the product
    /// `lhs @ rhs` (2-D: `[a, k] @ [k, b]` for an `[a, b]` weight), the form a dense layer's weight
    /// gradient takes (`x^T @ dy`; see [`GradStore::product`](crate::GradStore::product)). The
    /// same values as multiplying first, bit for bit; on the Cpu, where weft's own kernel runs
    /// the product, each block of the gradient's rows goes into Adam's update as soon as it is
    /// summed, from a scratch block in the cache: the gradient is never stored in memory.
    ///
    /// ```
    /// use weft_core::{optim_ops::AdamStep, Device, Tensor};
    /// let dev = Device::Cpu;
    /// let (x, dy) = (Tensor::rand(-1.0, 1.0, &[8, 40], 1, &dev)?, Tensor::rand(-1.0, 1.0, &[8, 48], 2, &dev)?);
    /// let w = Tensor::rand(-1.0, 1.0, &[40, 48], 3, &dev)?;
    /// let (m, v) = (Tensor::zeros(&[40, 48], &dev)?, Tensor::zeros(&[40, 48], &dev)?);
    /// let step = AdamStep { lr_t: 0.1, beta1: 0.9, beta2: 0.999, eps: 1e-7, decay: 1.0 };
    /// let fused = w.adam_step_of_product(&x.t()?, &dy, &m, &v, step)?;
    /// let apart = w.adam_step_checked(&x.t()?.matmul(&dy)?, &m, &v, step)?;
    /// assert_eq!(fused.0.to_vec::<f32>()?, apart.0.to_vec::<f32>()?);
    /// assert_eq!(fused.3.unwrap().to_vec::<f32>()?, [0.0]);
    /// # Ok::<(), weft_core::Error>(())
    /// ```
    pub fn adam_step_of_product(
        &self,
        lhs: &Tensor,
        rhs: &Tensor,
        m: &Tensor,
        v: &Tensor,
        p: AdamStep,
    ) -> Result<(Tensor, Tensor, Tensor, Option<Tensor>)> {
        let (a, b) = (lhs.dims(), rhs.dims());
        if lhs.rank() != 2 || rhs.rank() != 2 || a[1] != b[0] || [a[0], b[1]] != self.dims() {
            return Err(Error::invalid(
                "adam_step",
                format!("a gradient of {a:?} @ {b:?} for a variable of shape {:?}", self.dims()),
            ));
        }
        #[cfg(target_arch = "x86_64")]
        if let Some(out) = self.adam_pass_of_product(lhs, rhs, m, v, &p)? {
            return Ok(out);
        }
        // (Multiplied as the backward pass would have: the same kernel and bits.)
        let g = crate::GradStore::multiply(lhs, rhs)?;
        self.adam_step_checked(&g, m, v, p)
    }

    /// The fused pass of [`adam_step_of_product`](Tensor::adam_step_of_product) on the Cpu;
    /// `None` where it does not apply (another device, a product weft's kernel leaves).
    #[cfg(target_arch = "x86_64")]
    #[allow(clippy::type_complexity)]
    fn adam_pass_of_product(
        &self,
        lhs: &Tensor,
        rhs: &Tensor,
        m: &Tensor,
        v: &Tensor,
        p: &AdamStep,
    ) -> Result<Option<(Tensor, Tensor, Tensor, Option<Tensor>)>> {
        // (Anything else, a GPU's tensors included, goes the way of a product then Adam's pass.)
        let all = [self, lhs, rhs, m, v];
        if all.iter().any(|t| t.dtype() != DType::F32 || !matches!(t.storage(), Storage::Cpu(_)))
            || m.dims() != self.dims()
            || v.dims() != self.dims()
        {
            return Ok(None);
        }
        let [w, m, v] = [self, m, v].map(|t| crate::no_grad(|| t.contiguous_from_zero()));
        let (w, m, v) = (w?, m?, v?);
        let (ws, ms, vs, ls, rs) = (w.storage(), m.storage(), v.storage(), lhs.storage(), rhs.storage());
        let (Storage::Cpu(ws), Storage::Cpu(ms), Storage::Cpu(vs), Storage::Cpu(ls), Storage::Cpu(rs)) =
            (ws, ms, vs, ls, rs)
        else {
            return Ok(None);
        };
        let ins = [ws.f32s("adam_step")?, ms.f32s("adam_step")?, vs.f32s("adam_step")?];
        let state = cpu::matmul_adam::State::Read(ins);
        let Some((Some(outs), check)) =
            cpu::matmul_adam::matmul_adam((&ls, lhs.layout()), (&rs, rhs.layout()), state, p)?
        else {
            return Ok(None);
        };
        let dev = self.device().clone();
        let [w, m, v] = outs.map(|o| {
            Tensor::from_storage(Storage::Cpu(cpu::f32_storage(o)), self.dims(), DType::F32, dev.clone(), None)
        });
        let c = Storage::Cpu(cpu::f32_storage(vec![check]));
        Ok(Some((w, m, v, Some(Tensor::from_storage(c, &[1], DType::F32, dev, None)))))
    }

    /// The new weight, m and v, and the gradient's check: on the Cpu always (it costs nothing
    /// there), on a GPU when `checked` and the adapter allows it.
    fn adam_pass(
        &self,
        g: &Tensor,
        m: &Tensor,
        v: &Tensor,
        p: AdamStep,
        checked: bool,
    ) -> Result<([Tensor; 3], Option<Tensor>)> {
        for t in [g, m, v] {
            self.same_device(t, "adam_step")?;
            t.expect_f32("adam_step")?;
            if t.dims() != self.dims() {
                return Err(Error::ShapeMismatch {
                    op: "adam_step",
                    lhs: self.dims().to_vec(),
                    rhs: t.dims().to_vec(),
                });
            }
        }
        self.expect_f32("adam_step")?;
        let [w, g, m, v] = [self, g, m, v].map(|t| crate::no_grad(|| t.contiguous_from_zero()));
        let (w, g, m, v) = (w?, g?, m?, v?);
        let n = self.numel();
        let mut check = None;
        let outs = match (w.storage(), g.storage(), m.storage(), v.storage()) {
            (Storage::Cpu(w), Storage::Cpu(g), Storage::Cpu(m), Storage::Cpu(v)) => {
                // Contiguous from 0, but the buffers may run past the view: the first n of each.
                fn first(s: &cpu::CpuStorage, n: usize) -> Result<&[f32]> {
                    Ok(&s.f32s("adam_step")?[..n])
                }
                let (w, g, m, v) = (first(&w, n)?, first(&g, n)?, first(&m, n)?, first(&v, n)?);
                let (mut wo, mut mo, mut vo) = (cpu::try_take(n)?, cpu::try_take(n)?, cpu::try_take(n)?);
                const CHUNK: usize = 1 << 14;
                // Zipped slices of one chunk each, written straight into the outputs' spare
                // capacity (no zero fill first).
                // Streaming stores only for a variable whose seven arrays outgrow a core's cache.
                let stream = n >= 1 << 18;
                let job = |((((wo, mo), vo), c), (((w, g), m), v)): ((_, &mut f32), _)| {
                    *c = cpu::adam::chunk([w, g, m, v], cpu::adam::Outs { w: wo, m: mo, v: vo }, &p, stream);
                };
                let (wo_s, mo_s, vo_s) = (
                    &mut wo.spare_capacity_mut()[..n],
                    &mut mo.spare_capacity_mut()[..n],
                    &mut vo.spare_capacity_mut()[..n],
                );
                let ins = w.chunks(CHUNK).zip(g.chunks(CHUNK)).zip(m.chunks(CHUNK)).zip(v.chunks(CHUNK));
                // Each chunk's gradient check: 0, or NaN.
                let mut checks = vec![0f32; n.div_ceil(CHUNK)];
                let outs = wo_s
                    .chunks_mut(CHUNK)
                    .zip(mo_s.chunks_mut(CHUNK))
                    .zip(vo_s.chunks_mut(CHUNK))
                    .zip(checks.iter_mut());
                // Each chunk's seven slices, handed out by index to the threads (the calling one
                // among them: `cpu::par_chunks_mut`).
                let mut pieces: Vec<Option<_>> = outs.zip(ins).map(Some).collect();
                cpu::par_chunks_mut(&mut pieces, 1, |_, p| p[0].take().into_iter().for_each(job));
                // SAFETY: the inputs are contiguous from offset 0 with at least n elements each
                // (checked shapes, made contiguous above), so the zipped chunks cover 0..n of
                // every output once, and every element was written.
                unsafe {
                    wo.set_len(n);
                    mo.set_len(n);
                    vo.set_len(n);
                }
                let c = Storage::Cpu(cpu::f32_storage(vec![checks.iter().sum::<f32>()]));
                check = Some(Tensor::from_storage(c, &[1], DType::F32, self.device().clone(), None));
                [wo, mo, vo].map(|o| Storage::Cpu(cpu::f32_storage(o)))
            }
            (Storage::Gpu(w), Storage::Gpu(g), Storage::Gpu(m), Storage::Gpu(v)) => {
                let ctx = &w.ctx;
                let outs = [0; 3].map(|_| GpuStorage::alloc(ctx, n, DType::F32));
                let [wo, mo, vo] = outs;
                let (wo, mo, vo) = (wo?, mo?, vo?);
                let info = [
                    n as u32,
                    p.lr_t.to_bits(),
                    p.beta1.to_bits(),
                    p.beta2.to_bits(),
                    p.eps.to_bits(),
                    p.decay.to_bits(),
                ];
                let mut buffers = vec![&w.buf, &g.buf, &m.buf, &v.buf, &wo.buf, &mo.buf, &vo.buf];
                // The gradient's check in the same pass where the adapter binds a ninth storage
                // buffer (every desktop driver; WebGPU's default limit is eight): a `[1]` that
                // stays 0 unless the kernel meets an infinity or a NaN (written with the queue's
                // next submit, as any upload: no dispatch of its own).
                let flag = if checked && ctx.limits.max_storage_buffers_per_shader_stage >= 9 {
                    Some(GpuStorage::from_bytes(ctx, &0f32.to_le_bytes())?)
                } else {
                    None
                };
                buffers.extend(flag.as_ref().map(|f| &f.buf));
                let entry = if flag.is_some() { "main_checked" } else { "main" };
                ctx.dispatch("adam", entry, &info, &buffers, ctx.grid_1d(n))?;
                check = flag.map(|f| {
                    let f = Storage::Gpu(f.inherit(&[&g]));
                    Tensor::from_storage(f, &[1], DType::F32, self.device().clone(), None)
                });
                // The new state depends on every input's values, so on their index faults too.
                [wo, mo, vo].map(|o| Storage::Gpu(o.inherit(&[&w, &g, &m, &v])))
            }
            (Storage::Meta, ..) => [Storage::Meta, Storage::Meta, Storage::Meta],
            _ => return Err(Error::invalid("adam_step", "operands are on different devices")),
        };
        let outs = outs.map(|s| Tensor::from_storage(s, self.dims(), DType::F32, self.device().clone(), None));
        Ok((outs, check))
    }
}
