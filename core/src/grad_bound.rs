//! Whether a gradient left as a product is finite, told without working it out.
//!
//! A training step refuses a gradient that holds an infinity or a NaN. Where it must know that
//! before the update (an update written in place cannot be undone), multiplying the product
//! first would cost what leaving it as a product saved. A bound costs one read of each operand:
//! every value of `lhs @ rhs` is a sum of `k` products, so it is at most `k * max|lhs| *
//! max|rhs|` in size, times a rounding factor under 1.07 for any `k` below 2^20 (each of the
//! `k` additions errs by at most 2^-24 of its result); with both operands finite and that bound
//! far below `f32::MAX`, no value of the product can be infinite or NaN.

use crate::storage::Storage;
use crate::{DType, Device, GradStore, Result, Tensor};

impl GradStore {
    /// Whether `lhs @ rhs` (2-D, `[a, k] @ [k, b]`) is surely finite: both operands on the
    /// Cpu, finite, and `k * max|lhs| * max|rhs|` below a 16th of `f32::MAX` (see the module
    /// doc). `false` means unknown: work the product out to tell.
    ///
    /// ```
    /// use weft_core::{Device, GradStore, Tensor};
    /// let dev = Device::Cpu;
    /// let x = Tensor::from_vec(vec![1f32, -2.0, 3.0, 4.0], &[2, 2], &dev)?;
    /// assert!(GradStore::product_surely_finite(&x.t()?, &x)?);
    /// let huge = Tensor::from_vec(vec![1e30f32, 1.0, 1.0, 1.0], &[2, 2], &dev)?;
    /// assert!(!GradStore::product_surely_finite(&huge.t()?, &huge)?);
    /// # Ok::<(), weft_core::Error>(())
    /// ```
    pub fn product_surely_finite(lhs: &Tensor, rhs: &Tensor) -> Result<bool> {
        Self::bounded(lhs, rhs)
    }

    /// Whether the gradient of `t` is surely finite, told on the host with no op run: worked
    /// out, every value finite; left as a product, [`product_surely_finite`]. On the Cpu only:
    /// `false` means unknown (on another device, or a product too large to bound).
    ///
    /// [`product_surely_finite`]: GradStore::product_surely_finite
    ///
    /// ```
    /// use weft_core::{Device, Tensor, Var};
    /// let w = Var::new(Tensor::ones(&[2], &Device::Cpu)?)?;
    /// let grads = w.as_tensor().sqrt()?.sum_all()?.backward()?;
    /// assert!(grads.surely_finite(w.as_tensor())?);
    /// let at_zero = Var::new(Tensor::zeros(&[2], &Device::Cpu)?)?;
    /// let grads = at_zero.as_tensor().sqrt()?.sum_all()?.backward()?; // 1 / (2 sqrt 0)
    /// assert!(!grads.surely_finite(at_zero.as_tensor())?);
    /// # Ok::<(), weft_core::Error>(())
    /// ```
    pub fn surely_finite(&self, t: &Tensor) -> Result<bool> {
        match (self.get(t), self.product(t)) {
            (Some(g), _) => Ok(abs_max(g)?.is_some()),
            (None, Some((l, r))) => Self::bounded(l, r),
            (None, None) => Ok(false),
        }
    }

    fn bounded(lhs: &Tensor, rhs: &Tensor) -> Result<bool> {
        if lhs.rank() != 2 || rhs.rank() != 2 || lhs.dims()[1] != rhs.dims()[0] {
            return Ok(false);
        }
        let k = lhs.dims()[1];
        let (Some(a), Some(b)) = (abs_max(lhs)?, abs_max(rhs)?) else { return Ok(false) };
        // In f64, where the bound itself cannot overflow.
        Ok((k as f64) * (a as f64) * (b as f64) < (f32::MAX / 16.0) as f64 && k < 1 << 20)
    }
}

/// The largest magnitude among a Cpu f32 tensor's values (an upper bound: a view may be read
/// with the elements around it), or `None` when one is not finite or the tensor is elsewhere.
fn abs_max(t: &Tensor) -> Result<Option<f32>> {
    if t.dtype() != DType::F32 || !matches!(t.device(), Device::Cpu) {
        return Ok(None);
    }
    let l = t.layout();
    let span = l.extent().saturating_sub(l.offset());
    let bits = if span <= 2 * l.numel() {
        // Every element the view reads lies in the span (so its largest is no larger).
        let Storage::Cpu(s) = t.storage() else { return Ok(None) };
        largest_bits(&s.f32s("product_surely_finite")?[l.offset()..l.offset() + span])
    } else {
        largest_bits(&t.host_f32()?)
    };
    // Magnitudes' bits order as the magnitudes do; an infinity or a NaN is 0x7f80_0000 or more.
    Ok((bits < 0x7f80_0000).then(|| f32::from_bits(bits)))
}

/// The largest of the values' bits with the sign cleared, over the threads.
fn largest_bits(values: &[f32]) -> u32 {
    const CHUNK: usize = 1 << 15;
    let largest = |chunk: &[f32]| chunk.iter().fold(0, |m, x| m.max(x.to_bits() & 0x7fff_ffff));
    if values.len() <= CHUNK {
        return largest(values);
    }
    let mut parts = vec![0u32; values.len().div_ceil(CHUNK)];
    crate::cpu::par_chunks_mut(&mut parts, 1, |i, part| {
        let chunk = &values[i * CHUNK..((i + 1) * CHUNK).min(values.len())];
        part[0] = largest(chunk);
    });
    parts.into_iter().max().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use crate::{Device, GradStore, Tensor};

    /// Finite operands of moderate size pass (read in rows, transposed, narrowed); an infinity
    /// or a NaN anywhere in either, or a bound near f32's largest, does not; and whatever
    /// passes multiplies out finite.
    #[test]
    fn passes_only_what_multiplies_out_finite() {
        let dev = Device::Cpu;
        let vals = |n: usize, s: f32| (0..n).map(|i| ((i * 37 % 101) as f32 / 50.0 - 1.0) * s).collect::<Vec<_>>();
        let x = Tensor::from_vec(vals(70 * 33, 3.0), &[70, 33], &dev).unwrap();
        let dy = Tensor::from_vec(vals(70 * 41, 0.5), &[70, 41], &dev).unwrap();
        assert!(GradStore::product_surely_finite(&x.t().unwrap(), &dy).unwrap());
        let narrow = x.narrow(1, 5, 20).unwrap();
        assert!(GradStore::product_surely_finite(&narrow.t().unwrap(), &dy).unwrap());
        for bad in [f32::INFINITY, f32::NEG_INFINITY, f32::NAN] {
            for at in [0, 1234, 70 * 33 - 1] {
                let mut v = vals(70 * 33, 3.0);
                v[at] = bad;
                let x = Tensor::from_vec(v, &[70, 33], &dev).unwrap();
                assert!(!GradStore::product_surely_finite(&x.t().unwrap(), &dy).unwrap(), "{bad} at {at}");
                assert!(!GradStore::product_surely_finite(&dy.t().unwrap(), &x).unwrap(), "{bad} at {at} on the right");
            }
        }
        // 70 * 3e18 * 1e18 is past f32's largest: unknown, though this product happens to be finite.
        let big = Tensor::from_vec(vals(70 * 33, 3e18), &[70, 33], &dev).unwrap();
        let wide = Tensor::from_vec(vals(70 * 41, 1e18), &[70, 41], &dev).unwrap();
        assert!(!GradStore::product_surely_finite(&big.t().unwrap(), &wide).unwrap());
        // Within a tenth of the bound's limit it passes, and the product is finite.
        let edge = Tensor::from_vec(vals(70 * 41, 1e16), &[70, 41], &dev).unwrap();
        assert!(GradStore::product_surely_finite(&big.t().unwrap(), &edge).unwrap());
        let p = big.t().unwrap().matmul(&edge).unwrap().to_vec::<f32>().unwrap();
        assert!(p.iter().all(|v| v.is_finite()));
        // A view reading a few values far apart is copied, not read through its span: a NaN
        // between its values leaves it finite, one in it does not.
        let mut v = vals(70 * 330, 1.0);
        v[1] = f32::NAN;
        let wide = Tensor::from_vec(v, &[70, 330], &dev).unwrap();
        let few = wide.narrow(1, 2, 10).unwrap();
        let dy = Tensor::from_vec(vals(70 * 41, 1.0), &[70, 41], &dev).unwrap();
        assert!(GradStore::product_surely_finite(&few.t().unwrap(), &dy).unwrap());
        assert!(!GradStore::product_surely_finite(&wide.narrow(1, 1, 10).unwrap().t().unwrap(), &dy).unwrap());
        // Past 2^20 terms the rounding factor is not bounded here: unknown.
        let (l, r) = (Tensor::zeros(&[1, 1 << 20], &dev).unwrap(), Tensor::zeros(&[1 << 20, 1], &dev).unwrap());
        assert!(!GradStore::product_surely_finite(&l, &r).unwrap());
        let (l, r) = (l.narrow(1, 0, (1 << 20) - 1).unwrap(), r.narrow(0, 0, (1 << 20) - 1).unwrap());
        assert!(GradStore::product_surely_finite(&l, &r).unwrap());
    }
}
