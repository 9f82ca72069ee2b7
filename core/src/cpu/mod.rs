//! The Cpu reference backend: every primitive op written plainly (its loops shared by the
//! calling thread and weft's helper threads: `share`, `crew`).
//! It is the oracle the GPU kernels are tested against, and the fallback device.

// Off x86-64 the hand-written kernels (AVX2, AVX-512) are compiled out, and the helpers, row
// loops and constants only they use are left unused: the portable loops stand in for them.
#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code, unused_macros, unused_imports, unused_mut))]

pub(crate) mod adam;
#[cfg(target_arch = "x86_64")]
mod blocked_gemm;
mod conv;
mod conv_windows;
mod crew;
mod cross_entropy;
mod dense_grads;
#[cfg(target_arch = "x86_64")]
mod dense_grads_product;
mod elementwise;
mod fma_peak;
mod gemm_engine;
mod gemm_pack;
mod gru;
mod index;
pub(crate) mod lstm;
mod matmul;
#[cfg(target_arch = "x86_64")]
pub(crate) mod matmul_adam;
mod norm;
mod norm_grad;
#[cfg(target_arch = "x86_64")]
mod pack_room;
mod packed_gemm;
mod pool;
mod pooling;
mod reduce;
mod share;
#[cfg(target_arch = "x86_64")]
mod shared_rhs;
#[cfg(target_arch = "x86_64")]
mod small_gemm;
mod softmax_grad;
mod strided_copy;
mod sum_columns;

pub use conv::{conv2d, conv2d_input_grad, conv2d_kernel_grad};
pub use cross_entropy::{Picked, log_softmax_pick, log_softmax_pick_grad};
pub use dense_grads::act_bias_grads;
#[cfg(target_arch = "x86_64")]
pub use dense_grads_product::act_bias_grads_of_product;
pub use elementwise::{add_unary, binary, cast, copy_into, rand_uniform, unary, unary_grad, where_cond};
pub(crate) use fma_peak::fma_peak;
pub use gru::{gru_cell, gru_cell_grad};
pub use index::{gather, index_add, index_check, index_select, scatter_add};
pub use lstm::{lstm_cell, lstm_cell_grad};
pub use matmul::{matmul, matmul_add_unary};
pub use norm::{layer_norm, softmax};
pub use norm_grad::layer_norm_grad;
pub use pool::HostBuf;
pub use pool::take as take_host_vec;
pub use pooling::{pool2d, pool2d_grad};
pub use reduce::reduce;
pub use softmax_grad::softmax_grad;

use crate::{DType, Error, Layout, Result};
use half::f16;
use std::sync::Arc;

/// Host memory of one tensor. Cheap to clone (the data is shared).
#[derive(Debug, Clone)]
pub enum CpuStorage {
    /// f32 values.
    F32(Arc<HostBuf>),
    /// f16 values.
    F16(Arc<Vec<f16>>),
    /// u32 values.
    U32(Arc<Vec<u32>>),
    /// i32 values.
    I32(Arc<Vec<i32>>),
}

impl CpuStorage {
    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            CpuStorage::F32(_) => DType::F32,
            CpuStorage::F16(_) => DType::F16,
            CpuStorage::U32(_) => DType::U32,
            CpuStorage::I32(_) => DType::I32,
        }
    }

    /// The f32 data, or a dtype error naming `op`.
    pub fn f32s(&self, op: &'static str) -> Result<&[f32]> {
        match self {
            CpuStorage::F32(v) => Ok(v),
            s => Err(Error::DType { op, expected: "f32", got: s.dtype() }),
        }
    }

    /// Index data as u32 (i32 indices must be non-negative), or a dtype error naming `op`.
    pub fn indices(&self, op: &'static str, layout: &Layout) -> Result<Vec<u32>> {
        match self {
            CpuStorage::U32(v) => Ok(layout.offsets().map(|o| v[o]).collect()),
            CpuStorage::I32(v) => layout
                .offsets()
                .map(|o| u32::try_from(v[o]).map_err(|_| Error::invalid(op, format!("negative index {}", v[o]))))
                .collect(),
            s => Err(Error::DType { op, expected: "u32 or i32", got: s.dtype() }),
        }
    }

    /// The raw bytes of the whole storage.
    pub fn bytes(&self) -> &[u8] {
        match self {
            CpuStorage::F32(v) => bytemuck::cast_slice(v.as_slice()),
            CpuStorage::F16(v) => bytemuck::cast_slice(v),
            CpuStorage::U32(v) => bytemuck::cast_slice(v),
            CpuStorage::I32(v) => bytemuck::cast_slice(v),
        }
    }

    /// Build from raw bytes of a given dtype.
    pub fn from_bytes(dtype: DType, bytes: &[u8]) -> Self {
        match dtype {
            DType::F32 => f32_storage(bytemuck::pod_collect_to_vec(bytes)),
            DType::F16 => CpuStorage::F16(Arc::new(bytemuck::pod_collect_to_vec(bytes))),
            DType::U32 => CpuStorage::U32(Arc::new(bytemuck::pod_collect_to_vec(bytes))),
            DType::I32 => CpuStorage::I32(Arc::new(bytemuck::pod_collect_to_vec(bytes))),
        }
    }

    /// The elements of `layout`, gathered into a contiguous vector of raw bytes.
    pub fn gather_bytes(&self, layout: &Layout) -> Vec<u8> {
        let size = self.dtype().size_in_bytes();
        let all = self.bytes();
        if layout.is_contiguous() {
            let start = layout.offset() * size;
            return all[start..start + layout.numel() * size].to_vec();
        }
        let mut out = Vec::with_capacity(layout.numel() * size);
        for o in layout.offsets() {
            out.extend_from_slice(&all[o * size..(o + 1) * size]);
        }
        out
    }
}

/// The f32 elements of a layout in row-major order, borrowing when already contiguous.
pub(crate) fn strided<'a>(data: &'a [f32], layout: &Layout) -> Result<Gathered<'a>> {
    Ok(if layout.is_contiguous() {
        Gathered::Borrowed(&data[layout.offset()..layout.offset() + layout.numel()])
    } else {
        Gathered::Copied(HostBuf::new(strided_copy::to_contiguous(data, layout)?))
    })
}

/// The rows of a rank-2 layout: read where they lie when each row's values are adjacent (a
/// narrowed or offset view, a time step of a sequence), else from a gathered copy.
pub(crate) struct Rows<'a> {
    data: Gathered<'a>,
    offset: usize,
    stride: usize,
    len: usize,
}

impl<'a> Rows<'a> {
    pub(crate) fn new(data: &'a [f32], l: &Layout) -> Result<Self> {
        let (len, [s0, s1]) = (l.shape()[1], [l.strides()[0], l.strides()[1]]);
        if (s1 == 1 || len <= 1) && l.numel() > 0 {
            return Ok(Rows { data: Gathered::Borrowed(data), offset: l.offset(), stride: s0, len });
        }
        Ok(Rows { data: strided(data, l)?, offset: 0, stride: len, len })
    }

    /// Row `r`'s `len` values.
    #[inline]
    pub(crate) fn row(&self, r: usize) -> &[f32] {
        let start = self.offset + r * self.stride;
        &self.data[start..start + self.len]
    }
}

/// A layout's elements in rows: the storage itself, or a copy that goes back to the buffer cache
/// when dropped (a temporary dropped to the allocator is a fresh allocation, page faults and all,
/// on the next step).
pub(crate) enum Gathered<'a> {
    /// Already in rows.
    Borrowed(&'a [f32]),
    /// Copied into rows.
    Copied(HostBuf),
}

impl std::ops::Deref for Gathered<'_> {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        match self {
            Gathered::Borrowed(s) => s,
            Gathered::Copied(h) => h,
        }
    }
}

impl Gathered<'_> {
    /// The elements as a vector of their own (the copy itself, when there is one).
    pub fn into_vec(self) -> Result<Vec<f32>> {
        match self {
            Gathered::Borrowed(s) => {
                let mut v = try_take(s.len())?;
                v.extend_from_slice(s);
                Ok(v)
            }
            Gathered::Copied(h) => Ok(h.into_vec()),
        }
    }
}

/// Whether rayon's pool has a single thread: the ops then run their serial loops on the calling
/// thread. Handing work to the one worker and waiting to be woken costs more than it saves
/// (about 5% of a MiniLM forward on one thread, in microseconds per op).
pub(crate) fn one_thread() -> bool {
    rayon::current_num_threads() == 1
}

/// Wrap an f32 result.
pub(crate) fn f32_storage(v: Vec<f32>) -> CpuStorage {
    CpuStorage::F32(Arc::new(HostBuf::new(v)))
}

pub(crate) use pool::{try_take, try_zeros};
pub(crate) use share::par_chunks_mut;
