//! A right matrix packed once for all the parts of a product (`blocked_gemm`), each group of its
//! panels by the first part that needs it: for a product whose sums go to Adam's update
//! (`matmul_adam`), cut by rows (see [`shares_packing`] for why only those).
//!
//! How: the output is cut by rows, each part packing only its own rows of the left matrix, so
//! every value is packed once however many threads there are. The parts claim groups of panels
//! as they reach them (no parallel loop of its own, no barrier): a part that finds a group being
//! packed by another waits only for that group, and one that comes later finds them all packed.

use super::HostBuf;
use super::blocked_gemm::k_chunk;
use super::gemm_pack::{NR, Strided, b_len, pack_b};
use super::try_take;
use crate::Result;
use std::sync::atomic::{AtomicU8, Ordering};

/// Values packed more than once (by parts that each pack all of one matrix) from which the parts
/// share one packing instead: below it the bookkeeping costs about what it saves.
const SHARED_MIN: usize = 1 << 16;
/// Largest right matrix (in values) packed whole for the parts to share: a larger one's packed copy
/// no longer stays in the cache, as each part's blocks do.
const SHARED_MAX: usize = 1 << 22;
/// Most panels in a group claimed at once.
const GROUP: usize = 32;

/// A group's state: nobody has claimed it, a part is packing it, it is packed.
const FREE: u8 = 0;
const PACKING: u8 = 1;
const PACKED: u8 = 2;

/// Whether the parts of an `m x k` by `k x n` product on `threads` threads share one packing of
/// the right matrix: only where a finisher takes the sums from scratch (`scratch`: Adam's update
/// of the weight whose gradient the product is), the left matrix is more than half as tall as the
/// right one is wide, every thread gets at least two tiles of `tile_rows` rows, the values
/// packed more than once otherwise are at least [`SHARED_MIN`], and the matrix is at most
/// [`SHARED_MAX`].
///
/// Why so few: a part that reads another's packing reads lines another core wrote, which costs
/// where the cores share no cache (a 2-core Zen 4 VM whose cores sit at times on one core complex,
/// handing a cache line back and forth in about 60 ns, and at times on two, about 300 ns). Once
/// each thread packed into its own room (`pack_room`), a product whose parts each pack what they
/// read ran as fast or faster. Measured on that VM in one process, alternating, speed unshared /
/// shared on one complex and on two: 256³ 1.10 and 1.30; 512³ 1.03 and 1.21; 1024³ level and
/// 1.05; 2048³ level; a weight gradient 1024 x 1024 x 256 level and 1.08, 784 x 1024 x 256 level
/// and 1.11; the CNN's, LSTM's and text transformer's training and MiniLM's forward level. But a
/// product finished by Adam's update is cut by rows and shares: cut by columns (each part
/// updating half of every row of the weight and its moments) the MLP's training step ran 0.96
/// and 0.82 of the speed; cut by rows, each part packing all of the right matrix, 1.015 on two
/// complexes (too few rounds on one to tell).
///
/// A short left matrix (`2 * m <= n`) never shares: cut by columns, each part packs all of it (at
/// most half the right matrix's values) and reads only what it packed (256 x 1024 x 1024, ms
/// shared -> by columns: 2.72 -> 2.66 on one complex, 3.70 -> 3.00 on two).
pub(super) fn shares_packing(
    (m, n, k): (usize, usize, usize),
    tile_rows: usize,
    threads: usize,
    scratch: bool,
) -> bool {
    if !scratch || 2 * m <= n {
        return false;
    }
    threads > 1
        && m >= 2 * tile_rows * threads
        && b_len(k, n) <= SHARED_MAX
        && (threads - 1) * k * m.min(n) >= SHARED_MIN
}

/// Marks a group packed when dropped (release: its values are written before).
struct Publish<'a>(&'a AtomicU8);

impl Drop for Publish<'_> {
    fn drop(&mut self) {
        self.0.store(PACKED, Ordering::Release);
    }
}

/// The buffer of the packed matrix and its groups' states, for the length of one product.
pub(super) struct SharedRhs {
    _buf: HostBuf,
    _states: Vec<AtomicU8>,
    view: View,
}

impl SharedRhs {
    /// Room for the `k x n` matrix `src`, nothing packed yet; `Err` when memory runs out.
    ///
    /// # Safety
    /// Every element of the matrix lies in an allocation that outlives this value.
    pub(super) unsafe fn new(src: Strided, k: usize, n: usize, threads: usize) -> Result<SharedRhs> {
        let (kc, panels) = (k_chunk(k), n.div_ceil(NR));
        let row = b_len(1, n);
        let mut buf = try_take(k * row + 16)?;
        // Panels start on a cache line (see `blocked_gemm`).
        let start = buf.as_ptr().align_offset(64).min(16);
        // (Even, so that a 512-bit tile's two panels lie in one group when the part's columns
        // start on an even panel, as they do but in a column block that starts at 4080.)
        let group = panels.div_ceil(threads).next_multiple_of(2).min(GROUP);
        let groups = panels.div_ceil(group);
        let states: Vec<AtomicU8> = (0..k.div_ceil(kc) * groups).map(|_| AtomicU8::new(FREE)).collect();
        // SAFETY: start lies inside the buffer's capacity (k * row + 16 values).
        let ptr = unsafe { buf.as_mut_ptr().add(start) };
        let view = View { src, ptr, row, kc, k, n, group, groups, states: states.as_ptr(), p: 0, t: 0 };
        Ok(SharedRhs { _buf: HostBuf::new(buf), _states: states, view })
    }

    /// The matrix from row 0, column 0.
    pub(super) fn view(&self) -> View {
        self.view
    }
}

/// The shared matrix as one part sees it from row `p` (a chunk's first) and panel `t`: for each
/// chunk of `k` (`kc` values, the last perhaps fewer), the chunk's panels one after the other, as a
/// part's own packing lays out a block. (Panels of all of `k`, as inference keeps them, would put a
/// chunk's pieces of consecutive panels `k * 64` bytes apart: a 1024-square product read them
/// 2-4% slower.)
#[derive(Clone, Copy)]
pub(super) struct View {
    src: Strided,
    ptr: *mut f32,
    /// Values in a row of panels (the width rounded up to whole panels): chunk `c` starts at
    /// `c * kc * row`.
    row: usize,
    kc: usize,
    k: usize,
    n: usize,
    /// Panels per group, groups per chunk.
    group: usize,
    groups: usize,
    states: *const AtomicU8,
    p: usize,
    t: usize,
}

// SAFETY: the source is only read; each group of the buffer is written by the one part that
// claimed it, and read only once its state says packed (release / acquire); `SharedRhs` keeps
// both alive while the product runs.
unsafe impl Send for View {}
unsafe impl Sync for View {}

impl View {
    /// The matrix from row `p` (a chunk's first, relative to this view) and column `j` (a panel's
    /// first).
    pub(super) fn at(self, p: usize, j: usize) -> View {
        View { p: self.p + p, t: self.t + j / NR, ..self }
    }

    /// Packs the groups nobody has claimed among those covering the next `cols` columns of the
    /// chunk that starts here, and returns the first column (from here) of the first group this
    /// call packed (0 if none): the part takes those panels first, while the others' are packed.
    ///
    /// # Safety
    /// The view's row starts a chunk of the matrix, and the columns lie inside it.
    pub(super) unsafe fn claim(self, cols: usize) -> usize {
        let kc = self.kc.min(self.k - self.p);
        let mut first = None;
        for g in self.groups_of(0, cols) {
            // SAFETY (both): g is one of the groups the columns cover (the caller's bounds).
            let state = unsafe { self.state(g) };
            if state.compare_exchange(FREE, PACKING, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                // Packed on every way out, so that no part waits forever (were the packing to
                // panic, the panic reaches the product's caller once every part has ended).
                let _publish = Publish(state);
                let j = g * self.group * NR;
                // SAFETY: rows p..p + kc, columns j.. of the group lie inside the matrix; its
                // panels lie inside the chunk's `kc * row` values in the buffer, and only this
                // part writes them (it claimed the group).
                unsafe {
                    let to = self.ptr.add(self.p * self.row + g * self.group * kc * NR);
                    pack_b(self.src.at(self.p, j), kc, (self.n - j).min(self.group * NR), to);
                }
                first.get_or_insert((g * self.group).max(self.t) - self.t);
            }
        }
        first.unwrap_or(0) * NR
    }

    /// Waits until the panels covering columns `j..j + cols` (from here) of the chunk that starts
    /// here are packed. A group still packing was claimed by a part that is running: it ends soon.
    ///
    /// # Safety
    /// The view's row starts a chunk of the matrix, and the columns lie inside it.
    pub(super) unsafe fn wait(self, j: usize, cols: usize) {
        for g in self.groups_of(j, cols) {
            // SAFETY: g is one of the groups the columns cover (the caller's bounds).
            let state = unsafe { self.state(g) };
            let mut spins = 0u32;
            while state.load(Ordering::Acquire) != PACKED {
                spins += 1;
                if spins < 1 << 12 {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
        }
    }

    /// The first panel (from here) of the chunk that starts here, and the distance between panels.
    pub(super) fn panels(self) -> (*const f32, usize) {
        let kc = self.kc.min(self.k - self.p);
        // (Address arithmetic only: `wait` says when the values may be read.)
        (self.ptr.wrapping_add(self.p * self.row + self.t * kc * NR).cast_const(), kc * NR)
    }

    /// The groups covering columns `j..j + cols` from here.
    fn groups_of(self, j: usize, cols: usize) -> std::ops::Range<usize> {
        let t = self.t + j / NR;
        t / self.group..(t + cols.div_ceil(NR)).div_ceil(self.group)
    }

    /// Group `g`'s state in the chunk that starts here.
    ///
    /// # Safety
    /// `g` is one of the chunk's groups, and the view's row starts a chunk of the matrix.
    unsafe fn state(&self, g: usize) -> &AtomicU8 {
        debug_assert!(g < self.groups && self.p < self.k);
        // SAFETY: the chunk's states start at (p / kc) * groups and g < groups: inside the
        // states, which `SharedRhs` keeps alive while a view is used.
        unsafe { &*self.states.add(self.p / self.kc * self.groups + g) }
    }
}

#[cfg(test)]
mod tests {
    use super::shares_packing;

    /// A product finished from scratch (Adam's) shares the right matrix's packing when its left
    /// matrix is more than half as tall as the right one is wide (a shorter one is cut by
    /// columns, each part packing all of it); a product whose sums are stored never shares.
    #[test]
    fn only_products_finished_from_scratch_share() {
        for (m, n, k, shared) in [
            (256, 1024, 1024, false),
            (512, 1024, 1024, false),
            (256, 1536, 384, false),
            (513, 1024, 1024, true),
            (1024, 1024, 1024, true),
            (1024, 1024, 256, true),
            (784, 1024, 256, true),
            (256, 384, 384, true),
        ] {
            assert_eq!(shares_packing((m, n, k), 6, 2, true), shared, "{m} x {k} by {k} x {n} finished from scratch");
            assert!(!shares_packing((m, n, k), 6, 2, false), "{m} x {k} by {k} x {n} stored");
        }
        assert!(!shares_packing((1024, 1024, 1024), 6, 1, true));
    }
}
