//! Weight initializers, all seeded: the same seed gives the same weights on every device.

use weft_core::{Device, Result, Tensor};

/// How a variable's first values are drawn. `fan_in` and `fan_out` come from its shape
/// (for a `[in, out]` kernel: `in` and `out`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Initializer {
    /// Uniform in ±sqrt(6 / (fan_in + fan_out)) (Keras' default for Dense).
    GlorotUniform,
    /// Truncated normal (within two std) with std sqrt(2 / (fan_in + fan_out)) / 0.8796, as
    /// Keras draws it (0.8796 is the std of a unit normal truncated at ±2).
    GlorotNormal,
    /// Uniform in ±sqrt(6 / fan_in).
    HeUniform,
    /// Truncated normal (within two std) with std sqrt(2 / fan_in) / 0.8796, as Keras draws it.
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
    /// Truncated normal with std sqrt(1 / fan_in) (corrected as Keras does); for SELU networks.
    LecunNormal,
    /// Uniform in ±sqrt(3 / fan_in).
    LecunUniform,
    /// Keras' `VarianceScaling`: variance `scale / fan` (fan by `mode`), drawn from
    /// `distribution`. Glorot, He and LeCun are special cases.
    VarianceScaling {
        /// The variance's numerator.
        scale: f32,
        /// Which fan divides it.
        mode: FanMode,
        /// The distribution drawn from.
        distribution: Distribution,
    },
    /// Every value the same.
    Constant(f32),
    /// A (semi-)orthogonal matrix times `gain` (Saxe et al.; Keras' `Orthogonal`): the shape
    /// flattened to [product of the leading axes, last axis] has orthonormal rows or columns,
    /// whichever are fewer. Drawn whole on the host (a QR of a normal draw, O(n m^2)), so a
    /// part of a split layer is cut from the whole.
    Orthogonal(f32),
}

/// Which fan a [`Initializer::VarianceScaling`] divides by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FanMode {
    /// fan_in
    FanIn,
    /// fan_out
    FanOut,
    /// (fan_in + fan_out) / 2
    FanAvg,
}

/// The distribution a [`Initializer::VarianceScaling`] draws from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Distribution {
    /// Normal truncated at two std, its std corrected so the variance is as asked.
    TruncatedNormal,
    /// Normal.
    UntruncatedNormal,
    /// Uniform in ±sqrt(3 variance).
    Uniform,
}

/// The std of a unit normal truncated to [-2, 2]: Keras divides by it so that a truncated
/// variance-scaling draw keeps the intended variance.
const TRUNCATED_STD: f32 = 0.879_625_7;

/// Value `i` of a unit normal truncated to [-2, 2]: the first of the draws `normal(seed + r, i)`,
/// r = 0, 1, .., that lies within two std. Each value depends only on its index, so a part of a
/// tensor is drawn alone with the same values as the whole (rejection, not a sequential redraw).
fn truncated_unit(seed: u64, i: u32) -> f32 {
    for r in 0..64u64 {
        let z = weft_core::rng::normal(weft_core::rng::seed_key(seed.wrapping_add(r)), i);
        if z.abs() <= 2.0 {
            return z;
        }
    }
    0.0 // 64 draws all beyond two std: probability 0.0455^64
}

/// The distribution an initializer draws from, for a given full shape.
enum Dist {
    Uniform(f32, f32),
    Normal(f32, f32),
    Const(f32),
    Truncated(f32),
    Orthogonal(f32),
}

impl Initializer {
    /// The distribution for a tensor of `shape` (fans come from the whole shape).
    fn dist(self, shape: &[usize], fans: Option<(usize, usize)>) -> Dist {
        // Keras' fans, unless the layer gives them (EinsumDense: from its input and output
        // axes): a kernel [.., in, out] has a receptive field of the leading axes' product;
        // fan_in = in * field, fan_out = out * field.
        let (fan_in, fan_out) = match (fans, shape.len()) {
            (Some(f), _) => f,
            (None, 0) => (1, 1),
            (None, 1) => (shape[0], shape[0]),
            (None, n) => {
                let field: usize = shape[..n - 2].iter().product();
                (shape[n - 2] * field, shape[n - 1] * field)
            }
        };
        let (fi, fo) = (fan_in.max(1) as f32, fan_out.max(1) as f32);
        match self {
            Initializer::GlorotUniform => {
                let l = (6.0 / (fi + fo)).sqrt();
                Dist::Uniform(-l, l)
            }
            Initializer::GlorotNormal => Dist::Truncated((2.0 / (fi + fo)).sqrt() / TRUNCATED_STD),
            Initializer::HeUniform => {
                let l = (6.0 / fi).sqrt();
                Dist::Uniform(-l, l)
            }
            Initializer::HeNormal => Dist::Truncated((2.0 / fi).sqrt() / TRUNCATED_STD),
            Initializer::Zeros => Dist::Const(0.0),
            Initializer::Ones => Dist::Const(1.0),
            Initializer::Normal(std) => Dist::Normal(0.0, std),
            Initializer::Uniform(l) => Dist::Uniform(-l, l),
            Initializer::TruncatedNormal(std) => Dist::Truncated(std),
            Initializer::LecunNormal => Dist::Truncated((1.0 / fi).sqrt() / TRUNCATED_STD),
            Initializer::LecunUniform => {
                let l = (3.0 / fi).sqrt();
                Dist::Uniform(-l, l)
            }
            Initializer::VarianceScaling { scale, mode, distribution } => {
                let fan = match mode {
                    FanMode::FanIn => fi,
                    FanMode::FanOut => fo,
                    FanMode::FanAvg => (fi + fo) / 2.0,
                };
                let var = scale / fan.max(1.0);
                match distribution {
                    Distribution::TruncatedNormal => Dist::Truncated(var.sqrt() / TRUNCATED_STD),
                    Distribution::UntruncatedNormal => Dist::Normal(0.0, var.sqrt()),
                    Distribution::Uniform => {
                        let l = (3.0 * var).sqrt();
                        Dist::Uniform(-l, l)
                    }
                }
            }
            Initializer::Constant(v) => Dist::Const(v),
            Initializer::Orthogonal(gain) => Dist::Orthogonal(gain),
        }
    }

    /// Check the initializer's numbers: `Err` naming a non-finite value, a negative std or
    /// limit, or a scale that is not positive.
    pub fn validate(self) -> Result<()> {
        let bad = |what: &str, v: f32| {
            Err(weft_core::Error::invalid("Initializer", format!("{what} must be a finite number, at least 0: {v}")))
        };
        match self {
            Initializer::Normal(v) | Initializer::Uniform(v) | Initializer::TruncatedNormal(v)
                if !(v.is_finite() && v >= 0.0) =>
            {
                bad("the std or limit", v)
            }
            Initializer::VarianceScaling { scale, .. } if !(scale.is_finite() && scale > 0.0) => {
                bad("VarianceScaling's scale (above 0)", scale)
            }
            Initializer::Constant(v) | Initializer::Orthogonal(v) if !v.is_finite() => bad("the value or gain", v),
            _ => Ok(()),
        }
    }

    /// A tensor of `shape` on `device` drawn from `seed`.
    pub fn init(self, shape: &[usize], seed: u64, device: &Device) -> Result<Tensor> {
        self.init_fans(shape, None, seed, device)
    }

    /// [`init`](Self::init), scaled by the fans given (`None`: from the shape, as Keras).
    pub(crate) fn init_fans(
        self,
        shape: &[usize],
        fans: Option<(usize, usize)>,
        seed: u64,
        device: &Device,
    ) -> Result<Tensor> {
        if matches!(device, Device::Meta) {
            return Tensor::zeros(shape, device); // planning: shapes only
        }
        match self.dist(shape, fans) {
            Dist::Uniform(lo, hi) => Tensor::rand(lo, hi, shape, seed, device),
            Dist::Normal(mean, std) => Tensor::randn(mean, std, shape, seed, device),
            Dist::Const(v) => Tensor::full(v, shape, device),
            Dist::Truncated(_) | Dist::Orthogonal(_) => {
                let axis = shape.len().saturating_sub(1);
                let len = shape.get(axis).copied().unwrap_or(1);
                self.init_part_fans(shape, fans, axis, 0, len, seed, device)
            }
        }
    }

    /// Entries `start..start + len` of axis `axis` of what `init(shape, seed, ..)` draws, drawn
    /// alone: the same values, without ever making the whole tensor (a split layer builds its
    /// shard this way). The generator is counter-based, so each value depends only on its index.
    ///
    /// ```
    /// use weft_core::Device;
    /// use weft_nn::Initializer;
    /// let whole = Initializer::GlorotUniform.init(&[4, 10], 7, &Device::Cpu)?;
    /// let part = Initializer::GlorotUniform.init_part(&[4, 10], 1, 4, 3, 7, &Device::Cpu)?;
    /// assert_eq!(part.to_vec::<f32>()?, whole.narrow(1, 4, 3)?.to_vec::<f32>()?);
    /// # Ok::<(), weft_core::Error>(())
    /// ```
    pub fn init_part(
        self,
        shape: &[usize],
        axis: usize,
        start: usize,
        len: usize,
        seed: u64,
        device: &Device,
    ) -> Result<Tensor> {
        self.init_part_fans(shape, None, axis, start, len, seed, device)
    }

    /// [`init_part`](Self::init_part), scaled by the fans given (`None`: from the shape).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn init_part_fans(
        self,
        shape: &[usize],
        fans: Option<(usize, usize)>,
        axis: usize,
        start: usize,
        len: usize,
        seed: u64,
        device: &Device,
    ) -> Result<Tensor> {
        if shape.is_empty() && axis == 0 && start == 0 && len == 1 {
            // A scalar: one value, drawn as a vector of one.
            return self.init_part_fans(&[1], fans, 0, 0, 1, seed, device)?.reshape(&[]);
        }
        if axis >= shape.len() || start.checked_add(len).is_none_or(|end| end > shape[axis]) {
            return Err(weft_core::Error::invalid(
                "Initializer::init_part",
                format!("entries {start}..{} of axis {axis} of shape {shape:?}", start + len),
            ));
        }
        let mut local = shape.to_vec();
        local[axis] = len;
        if matches!(device, Device::Meta) {
            return Tensor::zeros(&local, device);
        }
        // The generator counts values in u32: a whole tensor of more than 2^32 values cannot be
        // drawn from one seed (checked, as the sizes come from the user's layers).
        let total = weft_core::layout::checked_numel("Initializer::init_part", shape)?;
        if total > 1usize << 32 {
            return Err(weft_core::Error::invalid(
                "Initializer::init_part",
                format!("shape {shape:?} holds {total} values; one seed draws at most 2^32"),
            ));
        }
        let (inner, outer): (usize, usize) = (shape[axis + 1..].iter().product(), shape[..axis].iter().product());
        let row = shape[axis] * inner;
        let key = weft_core::rng::seed_key(seed);
        let draw = |f: &dyn Fn(u32) -> f32| -> Result<Vec<f32>> {
            let mut v = Vec::new();
            v.try_reserve_exact(outer * len * inner).map_err(|_| weft_core::Error::OutOfMemory {
                bytes: (outer * len * inner * 4) as u64,
                device: format!("the host, drawing a part {local:?} of {shape:?}"),
            })?;
            for o in 0..outer {
                let base = o * row + start * inner;
                v.extend((base..base + len * inner).map(|i| f(i as u32)));
            }
            Ok(v)
        };
        let values = match self.dist(shape, fans) {
            Dist::Orthogonal(gain) => {
                let whole = orthogonal(shape, gain, seed);
                draw(&|i| whole[i as usize])?
            }
            Dist::Uniform(lo, hi) => draw(&|i| lo + (hi - lo) * weft_core::rng::uniform(key, i))?,
            Dist::Normal(mean, std) => draw(&|i| mean + std * weft_core::rng::normal(key, i))?,
            Dist::Const(c) => return Tensor::full(c, &local, device),
            Dist::Truncated(std) => draw(&|i| std * truncated_unit(seed, i))?,
        };
        Tensor::from_vec(values, &local, device)
    }
}

/// `shape` flattened to [rows, cols] (cols the last axis): a matrix whose rows (when fewer) or
/// columns are orthonormal, times `gain`, row-major. The Q of a QR of a normal draw of
/// [max, min], by modified Gram-Schmidt in f64 with each column orthogonalised twice (positive
/// norms make Q the unique one with a positive R diagonal, as Keras' sign correction does).
fn orthogonal(shape: &[usize], gain: f32, seed: u64) -> Vec<f32> {
    let cols = shape.last().copied().unwrap_or(1).max(1);
    let rows = (shape.iter().product::<usize>() / cols).max(1);
    let (n, m) = (rows.max(cols), rows.min(cols));
    let key = weft_core::rng::seed_key(seed);
    // Column j of the n x m draw, stored column by column.
    let mut q: Vec<f64> = (0..n * m).map(|i| weft_core::rng::normal(key, i as u32) as f64).collect();
    for j in 0..m {
        for _ in 0..2 {
            for k in 0..j {
                let dot: f64 = (0..n).map(|i| q[k * n + i] * q[j * n + i]).sum();
                for i in 0..n {
                    q[j * n + i] -= dot * q[k * n + i];
                }
            }
        }
        let norm = (0..n).map(|i| q[j * n + i] * q[j * n + i]).sum::<f64>().sqrt().max(f64::MIN_POSITIVE);
        for i in 0..n {
            q[j * n + i] /= norm;
        }
    }
    // Tall (rows >= cols): entry (r, c) is Q[r][c]; wide: the transpose, Q[c][r].
    let g = gain as f64;
    (0..rows * cols)
        .map(|e| {
            let (r, c) = (e / cols, e % cols);
            let v = if rows >= cols { q[c * n + r] } else { q[r * n + c] };
            (g * v) as f32
        })
        .collect()
}
