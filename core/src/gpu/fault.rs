//! Index faults on the GPU, owned by the op that caused them.
//!
//! A kernel cannot return an error, so an index kernel that meets an index past its axis skips it
//! and records it in a *fault slot*: a 16-byte buffer of its own, zeroed on creation, holding
//! `[flag, largest bad index, !first bad position]`. `Tensor::to_index_later`'s check of values
//! that must be indices (labels) uses the same slot, and so does sparse cross-entropy for its
//! labels; their messages name the values and read the bad one back (the second word unused).
//! The slot belongs to that one dispatch:
//!
//! - the output storage carries a handle to the slot, and every storage computed from it carries
//!   the handles of its inputs (`GpuStorage::inherit`), so a fault follows the data it spoiled;
//! - a read-back checks only the slots its own storage carries: the faulting tensor, and anything
//!   derived from it, read as an `Err` naming the op, the bad index and the axis size, while an
//!   unrelated tensor (on this thread or another one sharing the device) reads `Ok`.
//!
//! Resolving a slot needs its bytes on the host. Every read-back waits for all submitted work
//! anyway, so it copies every slot still outstanding on the device into its staging buffer, next
//! to the data, and settles them all (`outcome`). A settled clean slot is dropped from the handles
//! of storages made afterwards, and its buffers are released: lists stay short, and memory stays
//! bounded over a training loop. A slot becomes outstanding when its dispatch is recorded, under
//! the same lock a read-back takes to submit, so a read-back never settles a slot whose dispatch
//! it did not submit.

use super::pool::PooledBuffer;
use crate::{DType, Error, Layout};
use std::sync::{Arc, Mutex, OnceLock};

/// Bytes of one slot: flag, largest bad index, complement of the first bad position, unused.
pub(crate) const SLOT_BYTES: u64 = 16;

/// What a slot's dispatch checks, for its message.
enum Check {
    /// Indices into an axis of this size (index_select, gather and their adjoints); the indices
    /// buffer is contiguous.
    Axis(usize),
    /// Values that must be valid indices (`Tensor::to_index_later`, cross-entropy's labels): what
    /// they are, their dtype, the bound, and where they lie in their buffer.
    Values { what: String, dtype: DType, bound: Option<usize>, layout: Layout },
}

/// The fault record of one index dispatch.
pub(crate) struct FaultSlot {
    /// The op that owns it, for the error message.
    op: &'static str,
    check: Check,
    /// The slot's device buffer and the indices (or values) it checks, until settled.
    device: Mutex<Option<(Arc<PooledBuffer>, Arc<PooledBuffer>)>>,
    /// `None` while outstanding; then `Some(None)` when clean, `Some(Some(err))` when it faulted.
    outcome: OnceLock<Option<Error>>,
}

impl std::fmt::Debug for FaultSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FaultSlot({}, {:?})", self.op, self.outcome.get())
    }
}

/// What a read-back learnt from a slot's bytes.
pub(crate) enum Seen {
    Clean,
    /// The first bad position in the indices, and the largest bad index.
    Bad {
        at: u32,
        largest: u32,
    },
}

impl Seen {
    /// Decode the slot's words.
    pub(crate) fn from_bytes(b: &[u8]) -> Seen {
        let word = |i: usize| u32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]]);
        if word(0) == 0 { Seen::Clean } else { Seen::Bad { at: !word(2), largest: word(1) } }
    }
}

impl FaultSlot {
    /// A slot for `op` over an axis of `size`, checking the contiguous indices `ids`.
    pub(crate) fn new(op: &'static str, size: usize, buf: Arc<PooledBuffer>, ids: Arc<PooledBuffer>) -> Self {
        FaultSlot { op, check: Check::Axis(size), device: Mutex::new(Some((buf, ids))), outcome: OnceLock::new() }
    }

    /// A slot for the check of `values` (laid out as `layout`, of `dtype`) as indices below
    /// `bound`, named `what` in its message.
    pub(crate) fn values(
        what: &str,
        dtype: DType,
        bound: Option<usize>,
        layout: &Layout,
        buf: Arc<PooledBuffer>,
        values: Arc<PooledBuffer>,
    ) -> Self {
        let check = Check::Values { what: what.to_string(), dtype, bound, layout: layout.clone() };
        FaultSlot { op: "to_index", check, device: Mutex::new(Some((buf, values))), outcome: OnceLock::new() }
    }

    /// The element of the indices buffer at flat position `at` (to read the bad one back).
    pub(crate) fn element_at(&self, at: u32) -> u64 {
        match &self.check {
            Check::Axis(_) => u64::from(at),
            Check::Values { layout, .. } => layout.offsets().nth(at as usize).unwrap_or(0) as u64,
        }
    }

    /// The slot's device buffer, while it is still outstanding.
    pub(crate) fn buffer(&self) -> Option<Arc<PooledBuffer>> {
        self.device.lock().unwrap_or_else(|p| p.into_inner()).as_ref().map(|d| d.0.clone())
    }

    /// The indices buffer, while the slot is outstanding (to read the bad index back).
    pub(crate) fn ids(&self) -> Option<Arc<PooledBuffer>> {
        self.device.lock().unwrap_or_else(|p| p.into_inner()).as_ref().map(|d| d.1.clone())
    }

    /// Settled and clean: nothing to carry forward.
    pub(crate) fn is_clean(&self) -> bool {
        matches!(self.outcome.get(), Some(None))
    }

    /// The error, once settled as faulted.
    pub(crate) fn error(&self) -> Option<Error> {
        self.outcome.get().cloned().flatten()
    }

    /// Settle the slot (the first settlement wins; all see the same bytes) and release its buffers.
    /// `first` is the index at the first bad position when it could be read back.
    pub(crate) fn settle(&self, seen: &Seen, first: Option<u32>) {
        let outcome = match *seen {
            Seen::Clean => None,
            Seen::Bad { at, largest } => Some(self.message(at, largest, first)),
        };
        let _ = self.outcome.set(outcome);
        self.device.lock().unwrap_or_else(|p| p.into_inner()).take();
    }

    fn message(&self, at: u32, largest: u32, first: Option<u32>) -> Error {
        // Signed indices reach the kernel as their bit pattern: -1 is 4294967295.
        let show = |i: u32| {
            if i > i32::MAX as u32 { format!("{i} (or {} as i32)", i as i32) } else { i.to_string() }
        };
        let size = match &self.check {
            Check::Axis(size) => *size,
            Check::Values { what, dtype, bound, .. } => {
                let value = match (first, dtype) {
                    (Some(b), DType::F32) => f32::from_bits(b).to_string(),
                    (Some(b), DType::I32) => (b as i32).to_string(),
                    (Some(b), _) => b.to_string(),
                    (None, _) => "(not read back)".into(),
                };
                return crate::tensor::not_an_index(what, &value, at as usize, *bound);
            }
        };
        let msg = match first {
            Some(i) => format!(
                "index {} (at flat position {at} of the indices) is out of range for an axis of size {size}",
                show(i)
            ),
            None => format!(
                "an index at flat position {at} of the indices is out of range for an axis of size {size} \
                 (the largest bad index is {})",
                show(largest)
            ),
        };
        Error::invalid(self.op, msg)
    }
}

/// The fault slots a storage depends on.
pub(crate) type Faults = Vec<Arc<FaultSlot>>;

/// Add the slots of `from` that may still matter (not settled clean) to `into`, once each.
pub(crate) fn merge(into: &mut Faults, from: &[Arc<FaultSlot>]) {
    for s in from {
        if !s.is_clean() && !into.iter().any(|t| Arc::ptr_eq(s, t)) {
            into.push(s.clone());
        }
    }
}
