//! Each thread's packing room: the blocks of a product's operands that the micro-kernel reads
//! (`blocked_gemm`), and a finisher's block of sums, kept from one product to the next on the
//! thread that packs into it, as BLIS keeps one per thread.
//!
//! Why not a buffer from the pool per part, as before: the pool hands back the buffer freed last,
//! and a product freed its parts' buffers in order, so on two threads the parts swapped buffers
//! at every product and each thread packed into lines the other core held last. Where the two
//! cores share no cache (a 2-vCPU VM whose vCPUs sit at times on two core complexes) each such
//! line is fetched from the other complex before it is written. Kept per thread, the lines a
//! thread packs into are ones it wrote itself.
//!
//! Measured on a 2-core Zen 4 (AMD EPYC family 25 model 17) in one process, alternating with the
//! pool's buffers (16 rounds, then 16 with the order swapped), speed on two core complexes / on
//! one: 256 x 1024 x 1024 1.22 / 1.03; the same times a transposed weight 1.15 / 1.01; a weight
//! gradient (1024 x 256 by 256 x 1024) 1.06 / 1.01; 1024³ level. The MLP's training step
//! (784-1024-1024-10, batch 256, Adam; 40 rounds each way) 1.04-1.11 / 1.01; the CNN's, LSTM's and
//! text transformer's level to 1.03; MiniLM's forward level.
//!
//! Bounded: a product's room is at most one left block, one right block and one block of sums
//! (`MC x KC + KC x NC + MC x NC` values, about 6.7 MB), so a thread keeps at most that. It is
//! freed when the thread ends.

use super::{HostBuf, try_take};
use crate::Result;
use std::cell::RefCell;

thread_local! {
    static ROOM: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` on this thread's room of at least `len` values (their contents undefined: written
/// before they are read, through the pointer only); `Err` when the allocator refuses a larger
/// room (the pool's `try_take`). A call nested in another's `f` on the same thread, or one made
/// while the thread ends, gets a buffer of the pool's instead.
pub(crate) fn with_room<R>(len: usize, f: impl FnOnce(*mut f32) -> R) -> Result<R> {
    let mut f = Some(f);
    let kept = ROOM.try_with(|room| {
        let Ok(mut v) = room.try_borrow_mut() else { return None };
        if v.capacity() < len {
            // A fresh buffer, not a grown one (nothing in the old room is worth copying); the old
            // one goes back to the pool.
            match try_take(len) {
                Ok(bigger) => drop(HostBuf::new(std::mem::replace(&mut *v, bigger))),
                Err(e) => return Some(Err(e)),
            }
        }
        let f = f.take().expect("called once");
        Some(Ok(f(v.as_mut_ptr())))
    });
    match kept {
        Ok(Some(out)) => out,
        _ => {
            let f = f.take().expect("not called yet");
            let mut buf = HostBuf::new(try_take(len)?);
            Ok(f(buf.spare_ptr()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::with_room;

    /// The room a thread gets back is the one it wrote (the point of keeping it), it grows to
    /// what a call needs and stays grown, a nested call gets other room rather than the one in
    /// use, and room the allocator refuses is an `Err` naming the bytes.
    #[test]
    fn a_thread_gets_its_own_room_back() {
        let first = with_room(1000, |p| {
            // SAFETY: the room holds 1000 values.
            unsafe { p.write(7.0) };
            p as usize
        })
        .unwrap();
        // SAFETY: the first value was written by the call before.
        let (again, seen) = with_room(10, |p| (p as usize, unsafe { p.read() })).unwrap();
        assert_eq!((again, seen), (first, 7.0));
        let nested = with_room(10, |outer| with_room(10, |inner| !std::ptr::eq(inner, outer)).unwrap()).unwrap();
        assert!(nested, "a nested call must not get the room in use");
        let other = std::thread::spawn(|| with_room(1000, |p| p as usize).unwrap()).join().unwrap();
        assert_ne!(other, first, "each thread has room of its own");
        let grown = with_room(1 << 20, |p| {
            // SAFETY: the room holds 1 << 20 values.
            unsafe { p.add((1 << 20) - 1).write(1.0) };
            p as usize
        })
        .unwrap();
        assert_eq!(with_room(10, |p| p as usize).unwrap(), grown, "the grown room is kept");
        let refused = with_room(usize::MAX / 8, |_| ()).unwrap_err().to_string();
        assert!(refused.contains(&(usize::MAX / 8 * 4).to_string()), "{refused}");
    }
}
