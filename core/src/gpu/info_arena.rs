//! The `info` words of a batch's dispatches, gathered into one buffer.
//!
//! Every kernel reads its parameters from binding 0, `info` (see `common.wgsl`). Uploaded one
//! dispatch at a time they cost a pooled buffer and a `write_buffer` each, and wgpu serves every
//! `write_buffer` with a staging buffer of its own, allocated and freed again: on the host, more
//! than recording the dispatch. Instead a batch of recorded work (`context.rs`) places its
//! dispatches' words here, each at an offset the adapter can bind, and writes them with one
//! `write_buffer` just before the batch is submitted, which is before any of its kernels runs.

use super::pool::PooledBuffer;
use std::sync::Arc;

/// Bytes of an arena: room for a batch of dispatches (`FLUSH_EVERY`, 64) at the largest offset
/// alignment WebGPU allows (256 bytes), each of up to 64 words; a batch that fills it is
/// submitted early. (An info larger than this gets an arena of its size.)
const ARENA_BYTES: u64 = 16 << 10;

/// One batch's `info` words, and the buffer they go to.
pub(super) struct InfoArena {
    /// The buffer the batch's bind groups read; held by each dispatch recorded with it.
    pub(super) buf: Arc<PooledBuffer>,
    /// Its contents so far.
    words: Vec<u32>,
}

impl InfoArena {
    /// The bytes to allocate for an arena whose first words are `info`.
    pub(super) fn bytes_for(info: &[u32]) -> u64 {
        ARENA_BYTES.max(4 * info.len() as u64)
    }

    /// An empty arena writing to `buf` (of [`bytes_for`](InfoArena::bytes_for) bytes or more).
    pub(super) fn new(buf: Arc<PooledBuffer>) -> Self {
        InfoArena { buf, words: Vec::with_capacity(ARENA_BYTES as usize / 4) }
    }

    /// Places `info` at the next offset that is a multiple of `align` bytes and returns that
    /// offset and the bytes bound there; `None` when it does not fit.
    pub(super) fn place(&mut self, info: &[u32], align: u64) -> Option<(u64, u64)> {
        place(&mut self.words, info, align, self.buf.size)
    }

    /// Writes the words placed so far into the buffer (ordered before the next submit's work).
    pub(super) fn write(&self, queue: &wgpu::Queue) {
        if !self.words.is_empty() {
            queue.write_buffer(&self.buf.buffer, 0, bytemuck::cast_slice(&self.words));
        }
    }
}

/// [`InfoArena::place`] on its words, in an arena of `capacity` bytes: the offset is the first
/// multiple of `align` past the words so far; the size at least one word (an empty binding is
/// invalid).
fn place(words: &mut Vec<u32>, info: &[u32], align: u64, capacity: u64) -> Option<(u64, u64)> {
    let at = (words.len() as u64 * 4).next_multiple_of(align.max(4));
    let size = 4 * info.len().max(1) as u64;
    if at + size > capacity {
        return None;
    }
    words.resize((at / 4) as usize, 0);
    words.extend_from_slice(info);
    if info.is_empty() {
        words.push(0);
    }
    Some((at, size))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_follow_the_alignment_and_words_land_at_them() {
        let mut words = Vec::new();
        let out: Vec<_> = [&[1, 2, 3][..], &[], &[4; 70]].iter().map(|i| place(&mut words, i, 256, 4096)).collect();
        assert_eq!(out, [Some((0, 12)), Some((256, 4)), Some((512, 280))]);
        assert_eq!(&words[..3], [1, 2, 3]);
        assert_eq!(words[64], 0);
        assert_eq!(&words[128..198], [4; 70]);
        // Past the capacity: refused, the words as they were.
        assert_eq!(place(&mut words, &[5; 900], 256, 4096), None);
        assert_eq!(words.len(), 198);
        let mut words = Vec::new();
        assert_eq!(place(&mut words, &[1], 16, 64), Some((0, 4)));
        assert_eq!(place(&mut words, &[2, 3], 16, 64), Some((16, 8)));
        assert_eq!(words, [1, 0, 0, 0, 2, 3]);
        assert_eq!((InfoArena::bytes_for(&[0; 4096]), InfoArena::bytes_for(&[0; 5000])), (16384, 20000));
    }
}
