//! `InHost`: collectives among the devices of one process, one thread per rank.
//!
//! A collective is a rendezvous. Each rank copies its tensor to host memory and deposits it; the
//! last rank to arrive combines every deposit (the sums spread over the Cpu ops' threads) and
//! publishes one result per rank; each rank then uploads its result to its own device. Ranks
//! that arrive early sleep on a condition variable.
//!
//! Failure is shared: a rank that returns an error or panics marks the whole world failed (the
//! runner in `sharded.rs` does that), and every rank waiting in, or later entering, a collective
//! of any group of that world returns `Err` at once. Ranks that call different collectives in
//! the same slot (a bug in the calling code) fail the world too, naming both calls, instead of
//! deadlocking.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use weft_core::{Collectives, DType, Device, Error, HostF32, ReduceKind, Result, Tensor};

/// Told the reason of a world's first failure.
pub type FailureHook = Box<dyn Fn(&str) + Send + Sync>;

/// The failure flag every group of one sharded run shares.
#[derive(Default)]
pub struct World {
    failed: Mutex<Option<String>>,
    /// Nanoseconds ranks have spent inside collectives (staging, waiting, reducing), summed.
    spent_ns: AtomicU64,
    /// Rank threads of the current run that have returned (they join no further collective).
    left: Mutex<Vec<std::thread::ThreadId>>,
    /// Told of the first failure (a mesh across processes tells the other processes).
    on_fail: Mutex<Option<FailureHook>>,
}

impl std::fmt::Debug for World {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "World(failed: {:?})", self.failure())
    }
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
            drop(f);
            if let Some(tell) = &*self.on_fail.lock().unwrap_or_else(|p| p.into_inner()) {
                tell(why);
            }
        }
    }

    /// Have `tell` called with the reason of the first failure.
    pub fn on_fail(&self, tell: FailureHook) {
        *self.on_fail.lock().unwrap_or_else(|p| p.into_inner()) = Some(tell);
    }
    /// Time spent inside collectives, summed over every rank of every group (divide by the
    /// number of ranks for the time per rank).
    pub fn collective_time(&self) -> Duration {
        Duration::from_nanos(self.spent_ns.load(Ordering::Relaxed))
    }
    /// Count `spent` as time a rank spent inside a collective.
    #[cfg(feature = "mpi")]
    pub(crate) fn add_collective_time(&self, spent: Duration) {
        self.spent_ns.fetch_add(spent.as_nanos() as u64, Ordering::Relaxed);
    }
    /// Why the world failed, if it did.
    pub fn failure(&self) -> Option<String> {
        self.failed.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// A rank's deposit: its tensor's values in host memory (shared, not copied, for a contiguous
/// Cpu tensor).
#[derive(Debug, Clone, Default)]
struct Staged {
    shape: Vec<usize>,
    data: Option<HostF32>,
}

impl Staged {
    fn values(&self) -> &[f32] {
        self.data.as_deref().unwrap_or(&[])
    }
}

#[derive(Default)]
struct Slot {
    generation: u64,
    arrived: usize,
    call: String,
    inputs: Vec<Option<Staged>>,
    outputs: Vec<Option<Tensor>>,
}

struct Group {
    size: usize,
    world: Arc<World>,
    slot: Mutex<Slot>,
    cv: Condvar,
    /// The thread each rank of this group last called a collective from.
    threads: Mutex<Vec<Option<std::thread::ThreadId>>>,
}

/// One rank's handle on a group of ranks in this process.
///
/// ```
/// use weft_core::{Collectives, Device, ReduceKind, Tensor};
/// use weft_parallel::InHost;
/// let sums = InHost::run(2, |rank, comm| {
///     let x = Tensor::full(rank as f32 + 1.0, &[3], &Device::Cpu)?;
///     comm.all_reduce(&x, ReduceKind::Sum)?.to_vec::<f32>()
/// });
/// for s in sums {
///     assert_eq!(s?, vec![3.0; 3]);
/// }
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

/// How long a rank waits in a collective after another rank of the run whose thread this group
/// has not seen has returned (a member that never called a collective of this group). A member
/// seen here that returned without arriving fails the run at once.
const AFTER_LEAVE: Duration = Duration::from_secs(3);

impl InHost {
    /// Handles for the `n` ranks of a new group in `world`.
    pub fn group(n: usize, world: &Arc<World>) -> Vec<InHost> {
        let group = Arc::new(Group {
            size: n,
            world: world.clone(),
            slot: Mutex::new(Slot { inputs: vec![None; n], outputs: vec![None; n], ..Default::default() }),
            cv: Condvar::new(),
            threads: Mutex::new(vec![None; n]),
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
        combine: impl FnOnce(Vec<Staged>) -> Result<Vec<Tensor>>,
    ) -> Result<Tensor> {
        self.rendezvous(call, input, combine)
    }

    /// Run a whole collective (staging to the host and back included), adding its time to the
    /// world's. A GPU input's queued work is waited for first, outside the clock: reading the
    /// input back would wait for it anyway, and that is compute, not communication.
    fn timed<T>(&self, x: Option<&Tensor>, f: impl FnOnce() -> Result<T>) -> Result<T> {
        if let Some(x) = x.filter(|x| x.device().is_gpu()) {
            x.device().synchronize()?;
        }
        let start = Instant::now();
        let out = f();
        self.group.world.spent_ns.fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        // An error of this rank's own (a bad argument, a failed copy) must not leave the others
        // waiting for it.
        if let Err(e) = &out
            && self.group.world.failure().is_none()
        {
            self.fail(&format!("rank {}: {e}", self.rank));
        }
        out
    }

    /// Run `f(rank, comm)` on `n` threads, one per rank of a new group, and return each rank's
    /// result. A rank that returns an error or panics fails the group, so the others return
    /// `Err` from their next collective instead of waiting, and a rank that finished gets an
    /// `Err` naming the rank that failed.
    pub fn run<T: Send>(n: usize, f: impl Fn(usize, &InHost) -> Result<T> + Sync) -> Vec<Result<T>> {
        let world = World::new();
        let comms = InHost::group(n, &world);
        let outs = on_threads(comms.iter().collect(), &world, 0, f);
        // The ranks compute one thing together: when one failed, a rank that finished (one that
        // returned without joining a collective the others waited in, say) has no result either.
        // Its Err names the rank that failed, not that rank's words, which stay that rank's own.
        let Some(failed) = outs.iter().position(|o| o.is_err()) else { return outs };
        outs.into_iter()
            .enumerate()
            .map(|(r, o)| {
                o.and_then(|_| Err(Error::Collective(format!("rank {r} finished, but rank {failed} failed"))))
            })
            .collect()
    }

    /// Clear a failure once every rank has left (all threads joined): empty the group's slot
    /// and the world's flag, so the ranks can meet again.
    pub(crate) fn reset(&self) {
        let mut slot = self.lock();
        slot.arrived = 0;
        slot.inputs.iter_mut().for_each(|i| *i = None);
        slot.outputs.iter_mut().for_each(|o| *o = None);
        drop(slot);
        *self.group.world.failed.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    fn rendezvous(
        &self,
        call: String,
        input: Staged,
        combine: impl FnOnce(Vec<Staged>) -> Result<Vec<Tensor>>,
    ) -> Result<Tensor> {
        self.failed()?;
        let mut slot = self.lock();
        if slot.arrived > 0 && slot.call != call {
            let why = format!("rank {} called {call} while another rank called {}", self.rank, slot.call);
            drop(slot);
            self.fail(&why);
            return Err(Error::Collective(why));
        }
        slot.call = call;
        self.group.threads.lock().unwrap_or_else(|p| p.into_inner())[self.rank] = Some(std::thread::current().id());
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
        let mut since_leave: Option<Instant> = None;
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
            if let Some(gone) = self.departed_member(&slot, &mut since_leave) {
                let why = format!(
                    "rank {} waited in {} for {gone}, which had returned without joining it",
                    self.rank, slot.call
                );
                drop(slot);
                self.fail(&why);
                return Err(Error::Collective(why));
            }
        }
    }

    /// A member of this group that has not arrived in `slot` and can no longer arrive: one whose
    /// thread has returned. A member this group never saw is only presumed gone once some rank of
    /// the run has returned and `AFTER_LEAVE` has passed since this rank noticed.
    fn departed_member(&self, slot: &Slot, since: &mut Option<Instant>) -> Option<String> {
        let left = self.group.world.left.lock().unwrap_or_else(|p| p.into_inner());
        if left.is_empty() {
            return None;
        }
        let threads = self.group.threads.lock().unwrap_or_else(|p| p.into_inner());
        let missing = (0..self.group.size).filter(|&r| slot.inputs[r].is_none());
        let mut unseen = false;
        for r in missing {
            match threads[r] {
                Some(t) if left.contains(&t) => return Some(format!("rank {r}")),
                None => unseen = true,
                Some(_) => {}
            }
        }
        (unseen && since.get_or_insert_with(Instant::now).elapsed() > AFTER_LEAVE)
            .then(|| "a rank that never joined this group".to_string())
    }

    fn stage(x: &Tensor, op: &str) -> Result<Staged> {
        if x.dtype() != DType::F32 {
            return Err(Error::Collective(format!("{op}: collectives carry f32 tensors, got {:?}", x.dtype())));
        }
        Ok(Staged { shape: x.dims().to_vec(), data: Some(x.host_f32()?) })
    }

    /// The result on this rank's device (on a Cpu device: the shared result itself, no copy).
    fn unstage(out: &Tensor, like: &Tensor) -> Result<Tensor> {
        out.to_device(like.device())
    }
}

/// Run `f(index, item)` on one thread per item and collect the results in order (messages name
/// rank `first_rank + index`: this process's ranks of a mesh that spans processes). A rank that
/// returns an error or panics (the panic becomes an `Err` naming it) fails `world` at once, so the
/// other ranks leave their collectives instead of waiting for it.
pub(crate) fn on_threads<I: Send, T: Send>(
    items: Vec<I>,
    world: &World,
    first_rank: usize,
    f: impl Fn(usize, I) -> Result<T> + Sync,
) -> Vec<Result<T>> {
    world.left.lock().unwrap_or_else(|p| p.into_inner()).clear();
    std::thread::scope(|s| {
        let handles: Vec<_> = items
            .into_iter()
            .enumerate()
            .map(|(r, item)| {
                let f = &f;
                s.spawn(move || {
                    let out =
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(r, item))).unwrap_or_else(|p| {
                            let msg = p
                                .downcast_ref::<String>()
                                .cloned()
                                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                                .unwrap_or_else(|| "a panic".into());
                            Err(Error::Msg(format!("rank {} panicked: {msg}", first_rank + r)))
                        });
                    if let Err(e) = &out {
                        world.fail(&format!("rank {}: {e}", first_rank + r));
                    }
                    world.left.lock().unwrap_or_else(|p| p.into_inner()).push(std::thread::current().id());
                    out
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(Error::Msg("a rank thread died".into())))).collect()
    })
}

/// Elementwise reduction of equal-shaped deposits, into a Cpu tensor: one pass over the
/// deposits, reading each once and writing the output once.
fn reduce(inputs: &[Staged], kind: ReduceKind, call: &str) -> Result<Tensor> {
    let first = &inputs[0];
    if let Some((r, bad)) = inputs.iter().enumerate().find(|(_, s)| s.shape != first.shape) {
        return Err(Error::Collective(format!("{call}: rank 0 has shape {:?}, rank {r} {:?}", first.shape, bad.shape)));
    }
    let a = first.values();
    let mut out = Tensor::host_vec(a.len());
    const MIN: usize = 1 << 14;
    let op = |x: f32, y: f32| match kind {
        ReduceKind::Sum | ReduceKind::Mean => x + y,
        ReduceKind::Max => x.max(y),
    };
    // One pass over memory: each chunk is combined in a cache-resident buffer from every deposit,
    // then written once (no zeroing of the output first).
    const CHUNK: usize = 1 << 12;
    let len = a.len();
    weft_core::par_chunks_mut(&mut out.spare_capacity_mut()[..len], CHUNK, |c, dst| {
        let at = c * CHUNK;
        let mut acc = [0f32; CHUNK];
        let acc = &mut acc[..dst.len()];
        acc.copy_from_slice(&a[at..at + dst.len()]);
        for other in &inputs[1..] {
            let src = &other.values()[at..at + dst.len()];
            acc.iter_mut().zip(src).for_each(|(x, y)| *x = op(*x, *y));
        }
        dst.iter_mut().zip(acc.iter()).for_each(|(d, v)| {
            d.write(*v);
        });
    });
    // SAFETY: the loop above wrote every one of the first `len` elements.
    unsafe { out.set_len(len) };
    if kind == ReduceKind::Mean && inputs.len() > 1 {
        let k = 1.0 / inputs.len() as f32;
        weft_core::par_chunks_mut(&mut out, MIN, |_, c| c.iter_mut().for_each(|x| *x *= k));
    }
    Tensor::from_host_vec(out, &first.shape, &Device::Cpu)
}

/// (outer, inner) element counts around `axis`: the data is `outer` runs of `dims[axis] * inner`.
fn runs(shape: &[usize], axis: usize) -> (usize, usize) {
    (shape[..axis].iter().product(), shape[axis + 1..].iter().product())
}

/// Join deposits along `axis` in rank order (sizes along `axis` may differ), into a Cpu tensor.
fn concat(inputs: &[Staged], axis: usize, call: &str) -> Result<Tensor> {
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
    let mut data = Tensor::host_vec(outer * row);
    data.resize(outer * row, 0.0);
    weft_core::par_chunks_mut(&mut data, row.max(1), |o, dst| {
        let mut at = 0;
        for s in inputs {
            let len = s.shape[axis] * inner;
            dst[at..at + len].copy_from_slice(&s.values()[o * len..(o + 1) * len]);
            at += len;
        }
    });
    Tensor::from_host_vec(data, &shape, &Device::Cpu)
}

/// Rank `r`'s part (`sizes[r]` entries of `axis`) of `full`, as a Cpu tensor.
fn part(full: &Tensor, axis: usize, sizes: &[usize], r: usize) -> Result<Tensor> {
    full.narrow(axis as isize, sizes[..r].iter().sum(), sizes[r])?.contiguous()
}

impl Collectives for InHost {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.group.size
    }
    fn all_reduce(&self, x: &Tensor, kind: ReduceKind) -> Result<Tensor> {
        self.timed(Some(x), || self.all_reduce_now(x, kind))
    }
    fn all_gather(&self, x: &Tensor, axis: usize) -> Result<Tensor> {
        self.timed(Some(x), || self.all_gather_now(x, axis))
    }
    fn reduce_scatter(&self, x: &Tensor, axis: usize, sizes: &[usize], kind: ReduceKind) -> Result<Tensor> {
        self.timed(Some(x), || self.reduce_scatter_now(x, axis, sizes, kind))
    }
    fn broadcast(&self, x: &Tensor, root: usize) -> Result<Tensor> {
        self.timed(Some(x), || self.broadcast_now(x, root))
    }
    fn barrier(&self) -> Result<()> {
        self.timed(None, || self.barrier_now())
    }
}

impl InHost {
    fn all_reduce_now(&self, x: &Tensor, kind: ReduceKind) -> Result<Tensor> {
        let call = format!("all_reduce({kind:?})");
        let c = call.clone();
        let n = self.group.size;
        let out = self.exchange(call, Self::stage(x, "all_reduce")?, move |ins| {
            let r = reduce(&ins, kind, &c)?;
            Ok(vec![r; n])
        })?;
        Self::unstage(&out, x)
    }
    fn all_gather_now(&self, x: &Tensor, axis: usize) -> Result<Tensor> {
        let call = format!("all_gather(axis {axis})");
        let c = call.clone();
        let n = self.group.size;
        let out = self.exchange(call, Self::stage(x, "all_gather")?, move |ins| {
            let r = concat(&ins, axis, &c)?;
            Ok(vec![r; n])
        })?;
        Self::unstage(&out, x)
    }
    fn reduce_scatter_now(&self, x: &Tensor, axis: usize, sizes: &[usize], kind: ReduceKind) -> Result<Tensor> {
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
            (0..sizes.len()).map(|r| part(&full, axis, &sizes, r)).collect()
        })?;
        Self::unstage(&out, x)
    }
    fn broadcast_now(&self, x: &Tensor, root: usize) -> Result<Tensor> {
        let n = self.group.size;
        if root >= n {
            return Err(Error::Collective(format!("broadcast from rank {root} in a group of {n}")));
        }
        let out = self.exchange(format!("broadcast(root {root})"), Self::stage(x, "broadcast")?, move |ins| {
            let r = Tensor::from_host_vec(ins[root].values().to_vec(), &ins[root].shape, &Device::Cpu)?;
            Ok(vec![r; n])
        })?;
        Self::unstage(&out, x)
    }
    fn barrier_now(&self) -> Result<()> {
        let n = self.group.size;
        self.exchange("barrier".into(), Staged::default(), move |_| {
            let r = Tensor::from_host_vec(Vec::new(), &[0], &Device::Cpu)?;
            Ok(vec![r; n])
        })
        .map(drop)
    }
}
