//! `InHost`: collectives among the devices of one process, one thread per rank.
//!
//! A collective is a rendezvous. Each rank copies its tensor to host memory and deposits it; the
//! last rank to arrive combines every deposit (rayon spreads the sums over the cores) and
//! publishes one result per rank; each rank then uploads its result to its own device. Ranks
//! that arrive early sleep on a condition variable.
//!
//! Failure is shared: a rank that returns an error or panics marks the whole world failed (the
//! runner in `sharded.rs` does that), and every rank waiting in, or later entering, a collective
//! of any group of that world returns `Err` at once. Ranks that call different collectives in
//! the same slot (a bug in the calling code) fail the world too, naming both calls, instead of
//! deadlocking.

use rayon::prelude::*;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;
use weft_core::{Collectives, DType, Error, ReduceKind, Result, Tensor};

/// The failure flag every group of one sharded run shares.
#[derive(Default, Debug)]
pub struct World {
    failed: Mutex<Option<String>>,
}

impl World {
    /// A fresh world, nothing failed.
    pub fn new() -> Arc<World> {
        Arc::new(World::default())
    }
    /// Mark the world failed (the first reason wins); every collective returns `Err` from now on.
    pub fn fail(&self, why: &str) {
        let mut f = self.failed.lock().unwrap_or_else(|p| p.into_inner());
        if f.is_none() {
            *f = Some(why.to_string());
        }
    }
    /// Why the world failed, if it did.
    pub fn failure(&self) -> Option<String> {
        self.failed.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// A tensor staged in host memory.
#[derive(Debug, Clone, Default)]
struct Staged {
    shape: Vec<usize>,
    data: Vec<f32>,
}

#[derive(Default)]
struct Slot {
    generation: u64,
    arrived: usize,
    call: String,
    inputs: Vec<Option<Staged>>,
    outputs: Vec<Option<Arc<Staged>>>,
}

struct Group {
    size: usize,
    world: Arc<World>,
    slot: Mutex<Slot>,
    cv: Condvar,
}

/// One rank's handle on a group of ranks in this process.
///
/// ```
/// use std::sync::Arc;
/// use weft_core::{Collectives, Device, ReduceKind, Tensor};
/// use weft_parallel::InHost;
/// let ranks = InHost::group(2, &weft_parallel::World::new());
/// let sums: Vec<Vec<f32>> = std::thread::scope(|s| {
///     let hs: Vec<_> = ranks.iter().map(|c| s.spawn(move || {
///         let x = Tensor::full(c.rank() as f32 + 1.0, &[3], &Device::Cpu)?;
///         c.all_reduce(&x, ReduceKind::Sum)?.to_vec::<f32>()
///     })).collect();
///     hs.into_iter().map(|h| h.join().unwrap()).collect::<weft_core::Result<_>>()
/// })?;
/// assert_eq!(sums, vec![vec![3.0; 3], vec![3.0; 3]]);
/// # Ok::<(), weft_core::Error>(())
/// ```
#[derive(Clone)]
pub struct InHost {
    rank: usize,
    group: Arc<Group>,
}

/// How often a waiting rank looks at the world's failure flag (a failure in another group of the
/// world does not wake this group's condition variable).
const POLL: Duration = Duration::from_millis(10);

impl InHost {
    /// Handles for the `n` ranks of a new group in `world`.
    pub fn group(n: usize, world: &Arc<World>) -> Vec<InHost> {
        let group = Arc::new(Group {
            size: n,
            world: world.clone(),
            slot: Mutex::new(Slot { inputs: vec![None; n], outputs: vec![None; n], ..Default::default() }),
            cv: Condvar::new(),
        });
        (0..n).map(|rank| InHost { rank, group: group.clone() }).collect()
    }

    /// Mark this rank's world failed and wake this group.
    pub fn fail(&self, why: &str) {
        self.group.world.fail(why);
        self.group.cv.notify_all();
    }

    fn lock(&self) -> MutexGuard<'_, Slot> {
        self.group.slot.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn failed(&self) -> Result<()> {
        match self.group.world.failure() {
            Some(why) => Err(Error::Collective(format!("rank {} stopped: {why}", self.rank))),
            None => Ok(()),
        }
    }

    /// Deposit `input` under the description `call`; the last rank runs `combine` over every
    /// rank's deposit; each rank returns its part of the result.
    fn exchange(
        &self,
        call: String,
        input: Staged,
        combine: impl FnOnce(Vec<Staged>) -> Result<Vec<Arc<Staged>>>,
    ) -> Result<Arc<Staged>> {
        self.failed()?;
        let mut slot = self.lock();
        if slot.arrived > 0 && slot.call != call {
            let why = format!("rank {} called {call} while another rank called {}", self.rank, slot.call);
            drop(slot);
            self.fail(&why);
            return Err(Error::Collective(why));
        }
        slot.call = call;
        slot.inputs[self.rank] = Some(input);
        slot.arrived += 1;
        let generation = slot.generation;
        if slot.arrived == self.group.size {
            let inputs: Vec<Staged> = slot.inputs.iter_mut().map(|i| i.take().unwrap_or_default()).collect();
            slot.arrived = 0;
            match combine(inputs) {
                Ok(outs) => {
                    slot.outputs = outs.into_iter().map(Some).collect();
                    slot.generation += 1;
                    let mine = slot.outputs[self.rank].take();
                    drop(slot);
                    self.group.cv.notify_all();
                    return mine.ok_or_else(|| Error::Collective("a collective produced no result".into()));
                }
                Err(e) => {
                    drop(slot);
                    self.fail(&format!("{} failed: {e}", self.rank));
                    return Err(e);
                }
            }
        }
        loop {
            let (s, _) = self.group.cv.wait_timeout(slot, POLL).unwrap_or_else(|p| p.into_inner());
            slot = s;
            if slot.generation != generation {
                return slot.outputs[self.rank]
                    .take()
                    .ok_or_else(|| Error::Collective("a collective produced no result".into()));
            }
            if let Some(why) = self.group.world.failure() {
                return Err(Error::Collective(format!("rank {} stopped waiting: {why}", self.rank)));
            }
        }
    }

    fn stage(x: &Tensor, op: &str) -> Result<Staged> {
        if x.dtype() != DType::F32 {
            return Err(Error::Collective(format!("{op}: collectives carry f32 tensors, got {:?}", x.dtype())));
        }
        Ok(Staged { shape: x.dims().to_vec(), data: x.to_vec::<f32>()? })
    }

    fn unstage(s: &Staged, like: &Tensor) -> Result<Tensor> {
        Tensor::from_slice(&s.data, &s.shape, like.device())
    }
}

/// Elementwise reduction of equal-shaped deposits.
fn reduce(inputs: &[Staged], kind: ReduceKind, call: &str) -> Result<Staged> {
    let first = &inputs[0];
    if let Some((r, bad)) = inputs.iter().enumerate().find(|(_, s)| s.shape != first.shape) {
        return Err(Error::Collective(format!("{call}: rank 0 has shape {:?}, rank {r} {:?}", first.shape, bad.shape)));
    }
    let mut out = first.data.clone();
    const CHUNK: usize = 1 << 15;
    out.par_chunks_mut(CHUNK).enumerate().for_each(|(c, chunk)| {
        let base = c * CHUNK;
        for other in &inputs[1..] {
            let src = &other.data[base..base + chunk.len()];
            match kind {
                ReduceKind::Sum | ReduceKind::Mean => chunk.iter_mut().zip(src).for_each(|(a, b)| *a += b),
                ReduceKind::Max => chunk.iter_mut().zip(src).for_each(|(a, b)| *a = a.max(*b)),
            }
        }
        if kind == ReduceKind::Mean {
            let k = 1.0 / inputs.len() as f32;
            chunk.iter_mut().for_each(|a| *a *= k);
        }
    });
    Ok(Staged { shape: first.shape.clone(), data: out })
}

/// (outer, inner) element counts around `axis`: the data is `outer` runs of `dims[axis] * inner`.
fn runs(shape: &[usize], axis: usize) -> (usize, usize) {
    (shape[..axis].iter().product(), shape[axis + 1..].iter().product())
}

/// Join deposits along `axis` in rank order (sizes along `axis` may differ).
fn concat(inputs: &[Staged], axis: usize, call: &str) -> Result<Staged> {
    let first = &inputs[0];
    for (r, s) in inputs.iter().enumerate() {
        let same = s.shape.len() == first.shape.len()
            && axis < s.shape.len()
            && s.shape.iter().zip(&first.shape).enumerate().all(|(i, (a, b))| i == axis || a == b);
        if !same {
            return Err(Error::Collective(format!(
                "{call}: rank {r} has shape {:?}, which does not join rank 0's {:?} along axis {axis}",
                s.shape, first.shape
            )));
        }
    }
    let (outer, inner) = runs(&first.shape, axis);
    let mut shape = first.shape.clone();
    shape[axis] = inputs.iter().map(|s| s.shape[axis]).sum();
    let row: usize = shape[axis] * inner;
    let mut data = vec![0f32; outer * row];
    data.par_chunks_mut(row.max(1)).enumerate().for_each(|(o, dst)| {
        let mut at = 0;
        for s in inputs {
            let len = s.shape[axis] * inner;
            dst[at..at + len].copy_from_slice(&s.data[o * len..(o + 1) * len]);
            at += len;
        }
    });
    Ok(Staged { shape, data })
}

/// Rank `r`'s part (`sizes[r]` entries of `axis`) of `full`.
fn part(full: &Staged, axis: usize, sizes: &[usize], r: usize) -> Staged {
    let (outer, inner) = runs(&full.shape, axis);
    let row = full.shape[axis] * inner;
    let (start, len) = (sizes[..r].iter().sum::<usize>() * inner, sizes[r] * inner);
    let mut data = Vec::with_capacity(outer * len);
    for o in 0..outer {
        data.extend_from_slice(&full.data[o * row + start..o * row + start + len]);
    }
    let mut shape = full.shape.clone();
    shape[axis] = sizes[r];
    Staged { shape, data }
}

impl Collectives for InHost {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.group.size
    }
    fn all_reduce(&self, x: &Tensor, kind: ReduceKind) -> Result<Tensor> {
        let call = format!("all_reduce({kind:?})");
        let c = call.clone();
        let n = self.group.size;
        let out = self.exchange(call, Self::stage(x, "all_reduce")?, move |ins| {
            let r = Arc::new(reduce(&ins, kind, &c)?);
            Ok(vec![r; n])
        })?;
        Self::unstage(&out, x)
    }
    fn all_gather(&self, x: &Tensor, axis: usize) -> Result<Tensor> {
        let call = format!("all_gather(axis {axis})");
        let c = call.clone();
        let n = self.group.size;
        let out = self.exchange(call, Self::stage(x, "all_gather")?, move |ins| {
            let r = Arc::new(concat(&ins, axis, &c)?);
            Ok(vec![r; n])
        })?;
        Self::unstage(&out, x)
    }
    fn reduce_scatter(&self, x: &Tensor, axis: usize, sizes: &[usize], kind: ReduceKind) -> Result<Tensor> {
        let call = format!("reduce_scatter(axis {axis}, {sizes:?}, {kind:?})");
        if sizes.len() != self.group.size || x.dims().get(axis) != Some(&sizes.iter().sum()) {
            let why =
                format!("{call}: the sizes do not split axis {axis} of {:?} over {} ranks", x.dims(), sizes.len());
            self.fail(&why);
            return Err(Error::Collective(why));
        }
        let c = call.clone();
        let sizes = sizes.to_vec();
        let out = self.exchange(call, Self::stage(x, "reduce_scatter")?, move |ins| {
            let full = reduce(&ins, kind, &c)?;
            Ok((0..sizes.len()).map(|r| Arc::new(part(&full, axis, &sizes, r))).collect())
        })?;
        Self::unstage(&out, x)
    }
    fn broadcast(&self, x: &Tensor, root: usize) -> Result<Tensor> {
        let n = self.group.size;
        if root >= n {
            return Err(Error::Collective(format!("broadcast from rank {root} in a group of {n}")));
        }
        let out = self.exchange(format!("broadcast(root {root})"), Self::stage(x, "broadcast")?, move |mut ins| {
            let r = Arc::new(std::mem::take(&mut ins[root]));
            Ok(vec![r; n])
        })?;
        Self::unstage(&out, x)
    }
    fn barrier(&self) -> Result<()> {
        let n = self.group.size;
        self.exchange("barrier".into(), Staged::default(), move |_| {
            let r = Arc::new(Staged::default());
            Ok(vec![r; n])
        })
        .map(drop)
    }
}
