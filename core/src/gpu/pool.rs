//! A size-bucketed buffer pool. Buffers come back to the pool when the last handle drops, and the
//! next allocation of the same bucket reuses them, so a training loop stops allocating after its
//! first step. The pool also keeps the byte counts `memory_stats()` reports.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

/// Device memory figures, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Bytes in buffers held by live tensors (or by work not yet submitted).
    pub in_use: u64,
    /// The largest `in_use` seen.
    pub peak: u64,
    /// Bytes in free buffers kept for reuse.
    pub pooled: u64,
    /// Bytes live tensors asked for (`in_use` counts whole pool buckets, rounded up to a power
    /// of two; this is what a memory plan predicts).
    pub requested: u64,
}

#[derive(Default)]
pub(crate) struct PoolInner {
    free: HashMap<u64, Vec<wgpu::Buffer>>,
    pub(crate) stats: MemoryStats,
}

/// Shared handle to a pool.
pub(crate) type Pool = Arc<Mutex<PoolInner>>;

/// A buffer on loan from the pool.
pub struct PooledBuffer {
    pub(crate) buffer: wgpu::Buffer,
    pub(crate) size: u64,
    requested: u64,
    pool: Option<Weak<Mutex<PoolInner>>>,
}

impl std::fmt::Debug for PooledBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PooledBuffer({} bytes)", self.size)
    }
}

impl Drop for PooledBuffer {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.as_ref().and_then(Weak::upgrade) {
            let mut p = pool.lock().unwrap_or_else(|e| e.into_inner());
            p.stats.in_use -= self.size;
            p.stats.requested -= self.requested;
            p.stats.pooled += self.size;
            p.free.entry(self.size).or_default().push(self.buffer.clone());
        }
    }
}

/// The bucket a request of `bytes` is served from: the next power of two (at least 256 bytes),
/// capped at `cap` so a buffer that fits the binding limit is never rounded past it.
pub(crate) fn bucket(bytes: u64, cap: u64) -> u64 {
    let b = bytes.max(256).next_power_of_two();
    if b > cap { bytes.div_ceil(4) * 4 } else { b }
}

impl PoolInner {
    /// A free buffer of exactly `size` bytes, if one is pooled.
    pub(crate) fn take(&mut self, size: u64) -> Option<wgpu::Buffer> {
        let b = self.free.get_mut(&size)?.pop()?;
        self.stats.pooled -= size;
        Some(b)
    }

    /// Record a loan of `size` bytes.
    pub(crate) fn lend(&mut self, size: u64, requested: u64) {
        self.stats.in_use += size;
        self.stats.requested += requested;
        self.stats.peak = self.stats.peak.max(self.stats.in_use);
    }

    /// Release every pooled buffer back to the driver.
    pub(crate) fn trim(&mut self) {
        self.free.clear();
        self.stats.pooled = 0;
    }
}

/// Wrap a buffer as a loan from `pool`.
pub(crate) fn loan(pool: &Pool, buffer: wgpu::Buffer, size: u64, requested: u64) -> PooledBuffer {
    PooledBuffer { buffer, size, requested, pool: Some(Arc::downgrade(pool)) }
}

#[cfg(test)]
mod tests {
    #[test]
    fn buckets_round_up_to_powers_of_two_under_the_cap() {
        assert_eq!(super::bucket(1, 1 << 30), 256);
        assert_eq!(super::bucket(1000, 1 << 30), 1024);
        assert_eq!(super::bucket(1025, 1 << 30), 2048);
        assert_eq!(super::bucket(3000, 2048), 3000);
    }
}
