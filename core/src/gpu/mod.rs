//! The wgpu backend: adapters, open devices, and the launchers that turn a primitive op into a
//! dispatch of a WGSL kernel from weft-shaders.

mod cells;
mod concat;
mod context;
mod conv;
mod cross_entropy;
mod elementwise;
mod fault;
mod index;
mod info_arena;
mod long_rows;
mod matmul;
mod pool;
mod rows;

pub(crate) use cells::{gru_cell, gru_cell_grad, lstm_cell, lstm_cell_grad};
pub(crate) use concat::concat;
pub use context::{Activity, GpuContext, HARDWARE_WIDTH};
pub(crate) use conv::{conv2d, pool2d, pool2d_grad};
pub use cross_entropy::Picked;
pub(crate) use cross_entropy::{LABELS, log_softmax_pick, log_softmax_pick_grad};
pub(crate) use elementwise::{add_unary, binary, cast, copy_into, fill, rand_uniform, unary, unary_grad, where_cond};
pub(crate) use index::{gather, index_add, index_check, index_select, scatter_add};
pub use matmul::{MATMUL_VARIANTS, MatmulVariant, matmul_ranking};
pub(crate) use matmul::{matmul, matmul_add_unary};
pub use pool::MemoryStats;
pub(crate) use pool::PooledBuffer;
pub(crate) use rows::{layer_norm, layer_norm_grad, reduce, softmax, softmax_grad};

use crate::{DType, Error, Layout, Result};
use std::sync::{Arc, OnceLock};

/// A tensor's memory on a GPU: a pooled buffer, the device it belongs to, and the fault slots of
/// the index ops its values came through (see `fault.rs`): reading it fails if one of them met a
/// bad index.
#[derive(Clone)]
pub(crate) struct GpuStorage {
    pub(crate) buf: Arc<PooledBuffer>,
    pub(crate) ctx: Arc<GpuContext>,
    pub(crate) faults: fault::Faults,
}

impl std::fmt::Debug for GpuStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GpuStorage({}, {:?})", self.ctx.describe(), self.buf)
    }
}

impl GpuStorage {
    /// Upload host bytes.
    pub fn from_bytes(ctx: &Arc<GpuContext>, bytes: &[u8]) -> Result<Self> {
        Ok(GpuStorage { buf: ctx.upload(bytes)?, ctx: ctx.clone(), faults: Vec::new() })
    }

    /// A new uninitialised buffer for `n` elements of `dtype`. More elements than a u32 can
    /// count (kernels index with u32), or more bytes than the adapter binds, are an `Err`.
    pub(crate) fn alloc(ctx: &Arc<GpuContext>, n: usize, dtype: DType) -> Result<Self> {
        check_count("alloc", n)?;
        let bytes = (n as u64).checked_mul(dtype.size_in_bytes() as u64).ok_or_else(|| {
            Error::invalid("alloc", format!("{n} elements of {} do not fit in 2^64 bytes", dtype.name()))
        })?;
        Ok(GpuStorage { buf: ctx.alloc(bytes)?, ctx: ctx.clone(), faults: Vec::new() })
    }

    /// This storage, also depending on the fault slots of `inputs` (it was computed from them).
    pub(crate) fn inherit(mut self, inputs: &[&GpuStorage]) -> Self {
        for i in inputs {
            fault::merge(&mut self.faults, &i.faults);
        }
        self
    }

    /// Read the elements of a layout back to the host as raw bytes (contiguous, row-major).
    pub fn read_bytes(&self, layout: &Layout, dtype: DType) -> Result<Vec<u8>> {
        let size = dtype.size_in_bytes() as u64;
        if layout.is_contiguous() {
            return self.ctx.read(&self.buf, layout.offset() as u64 * size, layout.numel() as u64 * size, &self.faults);
        }
        if dtype == DType::F16 {
            // The copy kernel moves 32-bit words; read the whole span and pick on the host.
            let all = self.ctx.read(&self.buf, 0, layout.extent() as u64 * size, &self.faults)?;
            let mut out = Vec::with_capacity(layout.numel() * 2);
            for o in layout.offsets() {
                out.extend_from_slice(&all[o * 2..o * 2 + 2]);
            }
            return Ok(out);
        }
        let c = contiguous(self, layout)?;
        self.ctx.read(&c.buf, 0, layout.numel() as u64 * size, &c.faults)
    }
}

/// A contiguous copy of a (32-bit) strided layout.
pub(crate) fn contiguous(s: &GpuStorage, l: &Layout) -> Result<GpuStorage> {
    let out = GpuStorage::alloc(&s.ctx, l.numel(), DType::F32)?.inherit(&[s]);
    copy_into(s, l, &out, &Layout::contiguous(l.shape()))?;
    Ok(out)
}

/// Ranks up to this fit the kernels' `info` arrays.
pub(crate) const MAX_RANK: usize = 8;

/// Append `v` padded with `pad` to MAX_RANK entries.
pub(crate) fn push_dims(info: &mut Vec<u32>, v: &[usize], pad: u32) {
    info.extend(v.iter().map(|&x| x as u32));
    info.extend(std::iter::repeat_n(pad, MAX_RANK - v.len()));
}

pub(crate) fn check_rank(op: &'static str, l: &Layout) -> Result<()> {
    if l.rank() > MAX_RANK {
        return Err(Error::invalid(
            op,
            format!("GPU kernels take at most {MAX_RANK} dimensions, got shape {:?}", l.shape()),
        ));
    }
    check_layout(op, l)
}

/// Kernels count elements and offsets in u32: a layout (a broadcast view may have any number of
/// elements without the memory) whose element count or extent does not fit is an `Err`, never
/// a count that wraps.
pub(crate) fn check_layout(op: &'static str, l: &Layout) -> Result<()> {
    if l.numel() > u32::MAX as usize || l.extent() > u32::MAX as usize {
        return Err(Error::invalid(
            op,
            format!(
                "shape {:?} has {} elements; GPU kernels index with u32, so at most {} fit",
                l.shape(),
                l.numel(),
                u32::MAX
            ),
        ));
    }
    Ok(())
}

fn check_count(op: &'static str, n: usize) -> Result<()> {
    if n > u32::MAX as usize {
        return Err(Error::invalid(
            op,
            format!("{n} elements on the GPU; kernels index with u32, so at most {} fit", u32::MAX),
        ));
    }
    Ok(())
}

fn instance() -> &'static wgpu::Instance {
    static INSTANCE: OnceLock<wgpu::Instance> = OnceLock::new();
    INSTANCE.get_or_init(|| wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle()))
}

/// Every adapter wgpu finds, in its order (the `N` of `gpu:N`).
pub fn adapters() -> Vec<wgpu::Adapter> {
    static ADAPTERS: OnceLock<Vec<wgpu::Adapter>> = OnceLock::new();
    ADAPTERS.get_or_init(|| pollster::block_on(instance().enumerate_adapters(wgpu::Backends::all()))).clone()
}

/// Open a new device on adapter `index` (each call opens another: a "virtual device").
pub fn open(index: usize) -> Result<Arc<GpuContext>> {
    let all = adapters();
    let adapter = all.get(index).ok_or_else(|| {
        Error::NoAdapter(if all.is_empty() {
            "wgpu found no adapter at all".to_string()
        } else {
            format!("there is no adapter {index}; found {}", all.len())
        })
    })?;
    Ok(Arc::new(GpuContext::open(adapter, index)?))
}

/// The adapter's arithmetic ceiling in FLOP/s, measured with a kernel of independent FMAs
/// (`fma_peak.wgsl`). Benchmarks report matmul figures against it.
pub fn fma_peak(ctx: &Arc<GpuContext>) -> Result<f64> {
    let invocations = 256 * 1024;
    let iters = 512u32;
    let out = GpuStorage::alloc(ctx, invocations, DType::F32)?;
    let run = || -> Result<()> {
        ctx.dispatch("fma_peak", "main", &[iters], &[&out.buf], ctx.grid_1d(invocations))?;
        ctx.synchronize()
    };
    run()?;
    let start = std::time::Instant::now();
    let reps = 3;
    for _ in 0..reps {
        run()?;
    }
    let secs = start.elapsed().as_secs_f64() / reps as f64;
    // 32 multiply-adds of 2 FLOPs each per iteration.
    Ok(invocations as f64 * iters as f64 * 64.0 / secs)
}
