//! Creating tensors: from host data, constants, ranges and seeded random values.
//!
//! Every constructor checks its shape first (`check_shape`): an element count that overflows, or
//! does not fit the GPU's u32 indexing, is an `Err` naming the shape; and host memory the
//! allocator refuses is an `Err`, not an abort.

use super::{Tensor, check_shape};
use crate::cpu::CpuStorage;
use crate::gpu::{self, GpuStorage};
use crate::storage::Storage;
use crate::{DType, Device, Error, Result, WithDType};

/// Storage on `device` holding contiguous host bytes of `dtype`.
pub(crate) fn storage_from_bytes(dtype: DType, bytes: &[u8], device: &Device) -> Result<Storage> {
    Ok(match device {
        Device::Cpu => Storage::Cpu(CpuStorage::from_bytes(dtype, bytes)),
        Device::Gpu(ctx) => {
            if dtype == DType::F16 && !device.supports_f16() {
                return Err(Error::invalid(
                    "from_vec",
                    format!("{} lacks shader-f16, so it cannot hold f16 tensors", ctx.describe()),
                ));
            }
            Storage::Gpu(GpuStorage::from_bytes(ctx, bytes)?)
        }
        Device::Meta => Storage::Meta,
    })
}

impl Tensor {
    /// A tensor of `shape` from row-major host data.
    pub fn from_vec<T: WithDType>(data: Vec<T>, shape: &[usize], device: &Device) -> Result<Tensor> {
        Tensor::from_slice(&data, shape, device)
    }

    /// A tensor of `shape` from a row-major host slice.
    pub fn from_slice<T: WithDType>(data: &[T], shape: &[usize], device: &Device) -> Result<Tensor> {
        let n = check_shape("from_vec", shape, device)?;
        if data.len() != n {
            return Err(Error::invalid(
                "from_vec",
                format!("{} values cannot fill shape {shape:?} ({n} elements)", data.len()),
            ));
        }
        let storage = storage_from_bytes(T::DTYPE, bytemuck::cast_slice(data), device)?;
        Ok(Tensor::from_storage(storage, shape, T::DTYPE, device.clone(), None))
    }

    /// A 0-dimensional f32 tensor.
    pub fn scalar(v: f32, device: &Device) -> Result<Tensor> {
        Tensor::full(v, &[], device)
    }

    /// A tensor of `shape` with every element `v` (f32). On a GPU this is a fill kernel, not an upload.
    pub fn full(v: f32, shape: &[usize], device: &Device) -> Result<Tensor> {
        let n = check_shape("full", shape, device)?;
        let storage = match device {
            Device::Cpu => {
                let mut buf = crate::cpu::try_take(n).map_err(|e| in_shape(e, shape))?;
                buf.resize(n, v);
                Storage::Cpu(crate::cpu::f32_storage(buf))
            }
            Device::Gpu(ctx) => Storage::Gpu(gpu::fill(ctx, n, v.to_bits())?),
            Device::Meta => Storage::Meta,
        };
        Ok(Tensor::from_storage(storage, shape, DType::F32, device.clone(), None))
    }

    /// Zeros (f32).
    pub fn zeros(shape: &[usize], device: &Device) -> Result<Tensor> {
        Tensor::full(0.0, shape, device)
    }

    /// Ones (f32).
    pub fn ones(shape: &[usize], device: &Device) -> Result<Tensor> {
        Tensor::full(1.0, shape, device)
    }

    /// Zeros with this tensor's shape and device.
    pub fn zeros_like(&self) -> Result<Tensor> {
        Tensor::zeros(self.dims(), self.device())
    }

    /// Ones with this tensor's shape and device.
    pub fn ones_like(&self) -> Result<Tensor> {
        Tensor::ones(self.dims(), self.device())
    }

    /// `start, start + step, ...` below `end` (f32). Bounds and step must be finite, the step
    /// nonzero and pointing from `start` to `end`.
    pub fn arange(start: f32, end: f32, step: f32, device: &Device) -> Result<Tensor> {
        let count = (f64::from(end) - f64::from(start)) / f64::from(step);
        // With finite f32 bounds and a nonzero step, the f64 count is finite (never NaN).
        let finite = start.is_finite() && end.is_finite() && step.is_finite();
        if !finite || step == 0.0 || count < 0.0 {
            return Err(Error::invalid("arange", format!("cannot step from {start} to {end} by {step}")));
        }
        let n = count.ceil();
        if n > usize::MAX as f64 {
            return Err(Error::invalid("arange", format!("{start} to {end} by {step} is {n} values, too many")));
        }
        let n = n as usize;
        check_shape("arange", &[n], device)?;
        let mut v = host_vec::<f32>(n, &[n])?;
        v.extend((0..n).map(|i| start + i as f32 * step));
        Tensor::from_vec(v, &[n], device)
    }

    /// Uniform values in `[lo, hi)` from `seed`: the same values on every device.
    pub fn rand(lo: f32, hi: f32, shape: &[usize], seed: u64, device: &Device) -> Result<Tensor> {
        if matches!(device, Device::Meta) {
            return Tensor::zeros(shape, device); // shapes only: draw nothing
        }
        let key = crate::rng::seed_key(seed);
        let n = random_count("rand", shape, device)?;
        let mut v = host_vec::<f32>(n, shape)?;
        v.extend((0..n).map(|i| lo + (hi - lo) * crate::rng::uniform(key, i as u32)));
        Tensor::from_vec(v, shape, device)
    }

    /// Normal values with `mean` and `std` from `seed`: the same values on every device.
    pub fn randn(mean: f32, std: f32, shape: &[usize], seed: u64, device: &Device) -> Result<Tensor> {
        if matches!(device, Device::Meta) {
            return Tensor::zeros(shape, device); // shapes only: draw nothing
        }
        let key = crate::rng::seed_key(seed);
        let n = random_count("randn", shape, device)?;
        let mut v = host_vec::<f32>(n, shape)?;
        v.extend((0..n).map(|i| mean + std * crate::rng::normal(key, i as u32)));
        Tensor::from_vec(v, shape, device)
    }

    /// Uniform [0, 1) values generated on the device itself from the counter-based generator
    /// (bit-identical across devices; used for dropout masks).
    pub fn rand_on_device(shape: &[usize], seed: u64, device: &Device) -> Result<Tensor> {
        if matches!(device, Device::Meta) {
            return Tensor::zeros(shape, device); // shapes only: draw nothing
        }
        let n = random_count("rand_on_device", shape, device)?;
        let key = crate::rng::seed_key(seed);
        let storage = match device {
            Device::Cpu => Storage::Cpu(crate::cpu::rand_uniform(n, key, 0).map_err(|e| in_shape(e, shape))?),
            Device::Gpu(ctx) => Storage::Gpu(gpu::rand_uniform(ctx, n, key, 0)?),
            Device::Meta => Storage::Meta,
        };
        Ok(Tensor::from_storage(storage, shape, DType::F32, device.clone(), None))
    }
}

/// The element count of a random tensor: the generator has 2^32 counters per seed, so a larger
/// tensor would repeat its values (its count used to be cut to u32 silently).
fn random_count(op: &'static str, shape: &[usize], device: &Device) -> Result<usize> {
    let n = check_shape(op, shape, device)?;
    if n as u64 > 1 << 32 {
        return Err(Error::invalid(
            op,
            format!("shape {shape:?} has {n} elements; one seed draws at most 2^32 values"),
        ));
    }
    Ok(n)
}

/// An empty host vector with room for `n` values (for a tensor of `shape`), or an `Err`.
fn host_vec<T>(n: usize, shape: &[usize]) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| {
        in_shape(
            Error::OutOfMemory {
                bytes: (n as u64).saturating_mul(std::mem::size_of::<T>() as u64),
                device: "cpu".into(),
            },
            shape,
        )
    })?;
    Ok(v)
}

/// Name the shape in a host out-of-memory error.
fn in_shape(e: Error, shape: &[usize]) -> Error {
    match e {
        Error::OutOfMemory { bytes, device } => {
            Error::OutOfMemory { bytes, device: format!("{device} (a tensor of shape {shape:?})") }
        }
        e => e,
    }
}
