//! A cache of host buffers for Cpu tensors. Large fresh allocations come from the OS as untouched
//! pages, and the first write to each page faults: for a 1024x1024 matmul that halves the speed.
//! Reusing freed buffers of the same size (the common case in a training loop) avoids it.

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
pub fn take(len: usize) -> Vec<f32> {
    if len >= MIN_POOLED {
        let mut p = pool().lock().unwrap_or_else(|e| e.into_inner());
        if let Some(mut v) = p.free.get_mut(&len).and_then(Vec::pop) {
            p.bytes -= len * 4;
            v.clear();
            return v;
        }
    }
    Vec::with_capacity(len)
}

/// A vector of `len` zeros from the cache.
pub fn zeros(len: usize) -> Vec<f32> {
    let mut v = take(len);
    v.resize(len, 0.0);
    v
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
pub struct HostBuf(Vec<f32>);

impl HostBuf {
    /// Wrap a vector.
    pub fn new(v: Vec<f32>) -> Self {
        HostBuf(v)
    }
}

impl std::ops::Deref for HostBuf {
    type Target = Vec<f32>;
    fn deref(&self) -> &Vec<f32> {
        &self.0
    }
}

impl Drop for HostBuf {
    fn drop(&mut self) {
        recycle(std::mem::take(&mut self.0));
    }
}
