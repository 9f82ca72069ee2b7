//! Fused optimizer updates: one pass over memory per variable instead of one per elementwise op.
//! They take and return plain tensors (no autograd): optimizers call them under `no_grad`.

use crate::cpu;
use crate::gpu::GpuStorage;
use crate::storage::Storage;
use crate::{DType, Error, Result, Tensor};
use rayon::prelude::*;

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
        let outs = match (w.storage(), g.storage(), m.storage(), v.storage()) {
            (Storage::Cpu(w), Storage::Cpu(g), Storage::Cpu(m), Storage::Cpu(v)) => {
                let (w, g, m, v) =
                    (w.f32s("adam_step")?, g.f32s("adam_step")?, m.f32s("adam_step")?, v.f32s("adam_step")?);
                let (mut wo, mut mo, mut vo) = (cpu::try_zeros(n)?, cpu::try_zeros(n)?, cpu::try_zeros(n)?);
                const CHUNK: usize = 1 << 14;
                wo.par_chunks_mut(CHUNK)
                    .zip(mo.par_chunks_mut(CHUNK))
                    .zip(vo.par_chunks_mut(CHUNK))
                    .enumerate()
                    .for_each(|(c, ((wo, mo), vo))| {
                        for j in 0..wo.len() {
                            let i = c * CHUNK + j;
                            let mi = m[i] + (g[i] - m[i]) * (1.0 - p.beta1);
                            let vi = v[i] + (g[i] * g[i] - v[i]) * (1.0 - p.beta2);
                            mo[j] = mi;
                            vo[j] = vi;
                            wo[j] = w[i] * p.decay - p.lr_t * mi / (vi.sqrt() + p.eps);
                        }
                    });
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
                ctx.dispatch(
                    "adam",
                    "main",
                    &info,
                    &[&w.buf, &g.buf, &m.buf, &v.buf, &wo.buf, &mo.buf, &vo.buf],
                    ctx.grid_1d(n),
                )?;
                // The new state depends on every input's values, so on their index faults too.
                [wo, mo, vo].map(|o| Storage::Gpu(o.inherit(&[&w, &g, &m, &v])))
            }
            (Storage::Meta, ..) => [Storage::Meta, Storage::Meta, Storage::Meta],
            _ => return Err(Error::invalid("adam_step", "operands are on different devices")),
        };
        let [a, b, c] = outs.map(|s| Tensor::from_storage(s, self.dims(), DType::F32, self.device().clone(), None));
        Ok((a, b, c))
    }
}
