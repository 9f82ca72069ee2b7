//! Weight initializers, all seeded: the same seed gives the same weights on every device.

use weft_core::{Device, Result, Tensor};

/// How a variable's first values are drawn. `fan_in` and `fan_out` come from its shape
/// (for a `[in, out]` kernel: `in` and `out`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Initializer {
    /// Uniform in ±sqrt(6 / (fan_in + fan_out)) (Keras' default for Dense).
    GlorotUniform,
    /// Normal with std sqrt(2 / (fan_in + fan_out)).
    GlorotNormal,
    /// Uniform in ±sqrt(6 / fan_in).
    HeUniform,
    /// Normal with std sqrt(2 / fan_in).
    HeNormal,
    /// All zeros.
    Zeros,
    /// All ones.
    Ones,
    /// Normal with the given std.
    Normal(f32),
    /// Uniform in ±the given limit (Keras' default for embeddings: 0.05).
    Uniform(f32),
    /// Normal with the given std, redrawn beyond two std (as Keras does).
    TruncatedNormal(f32),
}

impl Initializer {
    /// A tensor of `shape` on `device` drawn from `seed`.
    pub fn init(self, shape: &[usize], seed: u64, device: &Device) -> Result<Tensor> {
        if matches!(device, Device::Meta) {
            return Tensor::zeros(shape, device); // planning: shapes only
        }
        let (fan_in, fan_out) = match shape.len() {
            0 => (1, 1),
            1 => (shape[0], shape[0]),
            n => (shape[..n - 1].iter().product::<usize>(), shape[n - 1]),
        };
        let (fi, fo) = (fan_in.max(1) as f32, fan_out.max(1) as f32);
        match self {
            Initializer::GlorotUniform => {
                let l = (6.0 / (fi + fo)).sqrt();
                Tensor::rand(-l, l, shape, seed, device)
            }
            Initializer::GlorotNormal => Tensor::randn(0.0, (2.0 / (fi + fo)).sqrt(), shape, seed, device),
            Initializer::HeUniform => {
                let l = (6.0 / fi).sqrt();
                Tensor::rand(-l, l, shape, seed, device)
            }
            Initializer::HeNormal => Tensor::randn(0.0, (2.0 / fi).sqrt(), shape, seed, device),
            Initializer::Zeros => Tensor::zeros(shape, device),
            Initializer::Ones => Tensor::ones(shape, device),
            Initializer::Normal(std) => Tensor::randn(0.0, std, shape, seed, device),
            Initializer::Uniform(l) => Tensor::rand(-l, l, shape, seed, device),
            Initializer::TruncatedNormal(std) => {
                // Draw on the host, redraw values beyond two std, then upload.
                let n: usize = shape.iter().product();
                let mut vals = Vec::with_capacity(n);
                let mut round = 0u64;
                while vals.len() < n {
                    let draw =
                        Tensor::randn(0.0, 1.0, &[n], seed.wrapping_add(round), &Device::Cpu)?.to_vec::<f32>()?;
                    vals.extend(draw.into_iter().filter(|v| v.abs() <= 2.0).map(|v| v * std));
                    round += 1;
                }
                vals.truncate(n);
                Tensor::from_vec(vals, shape, device)
            }
        }
    }
}
