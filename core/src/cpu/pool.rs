//! A cache of host buffers for Cpu tensors. Large fresh allocations come from the OS as untouched
//! pages, and the first write to each page faults: for a 1024x1024 matmul that halves the speed.
//! Reusing freed buffers of the same size (the common case in a training loop) avoids it.

use crate::{Error, Result};
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// Buffers smaller than this (in elements) are left to the allocator.
const MIN_POOLED: usize = 8 * 1024;
/// At most this many bytes are kept for reuse.
const MAX_POOLED_BYTES: usize = 1 << 30;

#[derive(Default)]
struct Pool {
    free: HashMap<usize, Vec<Vec<f32>>>,
    bytes: usize,
}

fn pool() -> &'static Mutex<Pool> {
    static POOL: OnceLock<Mutex<Pool>> = OnceLock::new();
    POOL.get_or_init(Mutex::default)
}

/// An empty vector with room for exactly `len` elements, reused when one of that size was freed.
/// Aborts when the allocator has no room; ops use [`try_take`].
pub fn take(len: usize) -> Vec<f32> {
    reuse(len).unwrap_or_else(|| Vec::with_capacity(len))
}

/// As [`take`], but memory the allocator refuses is an `Err` naming the bytes, not an abort.
pub fn try_take(len: usize) -> Result<Vec<f32>> {
    if let Some(v) = reuse(len) {
        return Ok(v);
    }
    let mut v = Vec::new();
    v.try_reserve_exact(len)
        .map_err(|_| Error::OutOfMemory { bytes: (len as u64).saturating_mul(4), device: "cpu".into() })?;
    Ok(v)
}

fn reuse(len: usize) -> Option<Vec<f32>> {
    if len < MIN_POOLED {
        return None;
    }
    let mut p = pool().lock().unwrap_or_else(|e| e.into_inner());
    let mut v = p.free.get_mut(&len).and_then(Vec::pop)?;
    p.bytes -= len * 4;
    v.clear();
    Some(v)
}

/// A vector of `len` zeros from the cache, or an `Err` when the allocator has no room.
pub fn try_zeros(len: usize) -> Result<Vec<f32>> {
    let mut v = try_take(len)?;
    v.resize(len, 0.0);
    Ok(v)
}

fn recycle(v: Vec<f32>) {
    let cap = v.capacity();
    if cap < MIN_POOLED {
        return;
    }
    let mut p = pool().lock().unwrap_or_else(|e| e.into_inner());
    if p.bytes + cap * 4 <= MAX_POOLED_BYTES {
        p.bytes += cap * 4;
        p.free.entry(cap).or_default().push(v);
    }
}

/// The f32 data of a Cpu tensor; returns its buffer to the cache when dropped.
#[derive(Debug, Default)]
pub struct HostBuf {
    data: Vec<f32>,
    /// Packed copies of the data as a right matrix (inference products; see `packed_gemm`):
    /// storage is written after it is made only through `values_mut`, which drops them, so
    /// they stay true while they are kept.
    rhs: super::packed_gemm::RhsCache,
}

impl HostBuf {
    /// Wrap a vector.
    pub fn new(v: Vec<f32>) -> Self {
        HostBuf { data: v, rhs: Default::default() }
    }

    /// The vector itself, no longer returned to the cache on drop (its new owner decides).
    pub fn into_vec(mut self) -> Vec<f32> {
        std::mem::take(&mut self.data)
    }

    /// The start of the buffer's room, for scratch written and read through the pointer only
    /// (never through the vector: its length stays as it is).
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn spare_ptr(&mut self) -> *mut f32 {
        self.data.as_mut_ptr()
    }

    /// The data as the right matrix `key` of a product, packed (kept from the second use on).
    pub(crate) fn packed_rhs(
        &self,
        key: super::packed_gemm::Key,
    ) -> Result<std::sync::Arc<super::packed_gemm::PackedRhs>> {
        self.rhs.get(&self.data, key)
    }

    /// The values, to be written in place by the buffer's one holder (an optimizer's update of
    /// a storage nothing else can see: `optim_ops::adam_step_in_place`): the packed copies
    /// made from the old values go.
    pub(crate) fn values_mut(&mut self) -> &mut [f32] {
        self.rhs = Default::default();
        &mut self.data
    }

    /// How many right-matrix layouts of this storage are remembered (for tests).
    #[cfg(test)]
    pub(crate) fn rhs_layouts(&self) -> usize {
        self.rhs.layouts()
    }

    /// How many packed copies of this storage as a right matrix are kept (for tests).
    #[cfg(test)]
    pub(crate) fn rhs_copies(&self) -> usize {
        self.rhs.copies()
    }
}

impl std::ops::Deref for HostBuf {
    type Target = Vec<f32>;
    fn deref(&self) -> &Vec<f32> {
        &self.data
    }
}

impl Drop for HostBuf {
    fn drop(&mut self) {
        recycle(std::mem::take(&mut self.data));
    }
}
