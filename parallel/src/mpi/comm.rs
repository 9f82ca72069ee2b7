//! `MpiComm`: weft's collectives over an MPI communicator, one rank per process.
//!
//! Each collective first has the ranks agree on what they are doing (which call, its sequence
//! number, the shape, the axis or root) with one small all-reduce of a header, so ranks that call
//! different collectives, or pass different shapes, get `Err` naming what differs instead of a
//! hang or a wrong sum. The header goes through MPI's non-blocking all-reduce, polled together
//! with the failure channel (`control.rs`): that is where a rank waits for a peer that is still
//! computing, or that failed and will never come. The data then moves with MPI's non-blocking
//! collective, polled too: a peer can give up on a header (a failure reached it) just as the
//! header completes elsewhere, and a blocking call would then wait for it forever. MPI moves a
//! non-blocking collective's data only while it is tested, so that wait tests without sleeping
//! (yielding the core): with sleeps between tests it ran at a quarter of `MPI_Allreduce`,
//! without them at par. Values are f32.

use super::control::{Control, RawComm};
use ::mpi::ffi;
use std::sync::{Arc, Mutex};
use weft_core::{Collectives, DType, Error, ReduceKind, Result, Tensor};

/// Fields in every call's header (the most any call has).
const HEADER: usize = 6;

/// The header's first field: which call a rank is in.
const CALLED: &str = "the collective called (1 all_reduce, 2 all_gather, 3 reduce_scatter, 4 broadcast, 5 barrier, 6 split, 7 agreement, 8 vote, 9 exchange)";

/// The call code of a process that is finishing: the largest, so the others can say so.
const FINISH: u64 = u64::MAX >> 1;

/// One rank's handle on a group of processes. Made by [`Mpi::world`](super::Mpi::world) or
/// [`Mpi::split`](super::Mpi::split).
pub struct MpiComm {
    comm: RawComm,
    rank: usize,
    size: usize,
    control: Arc<Control>,
    /// Calls made on this communicator so far; held for the whole of a call, so two threads of
    /// this process never interleave collectives on it.
    calls: Mutex<u64>,
    /// Where the time spent in collectives is counted (a sharded model's world), if anywhere.
    clock: Option<Arc<crate::comm::World>>,
}

impl std::fmt::Debug for MpiComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MpiComm(rank {} of {})", self.rank, self.size)
    }
}

impl Drop for MpiComm {
    /// Free the communicator, unless MPI is finalised or a failure may have left a request of
    /// it pending (then it is left to the job's end).
    fn drop(&mut self) {
        if self.control.finalized() || self.control.failure().is_some() {
            return;
        }
        // SAFETY: a communicator this value owns, with no call in progress (it is being dropped).
        unsafe { ffi::MPI_Comm_free(&mut self.comm.0) };
    }
}

/// A pending request's buffers, leaked when the request is abandoned (a failure elsewhere): MPI
/// may still write into them.
fn abandon<T>(bufs: T) {
    std::mem::forget(bufs);
}

/// Room for `n` values for MPI to write into (length 0: the caller sets the length once MPI has
/// written them all), from weft's host pool: a fresh allocation each call cost page faults on
/// every call, and all-reduce ran at about a third of `MPI_Allreduce`.
fn receive_buffer(n: usize) -> Vec<f32> {
    let mut v = Tensor::host_vec(n);
    v.clear();
    v.reserve_exact(n);
    v
}

fn null_request() -> ffi::MPI_Request {
    // SAFETY: reading MPI's predefined null request.
    unsafe { ffi::RSMPI_REQUEST_NULL }
}

fn count(n: usize, what: &str) -> Result<i32> {
    i32::try_from(n).map_err(|_| Error::Collective(format!("{what}: {n} values exceed MPI's count limit (2^31 - 1)")))
}

impl MpiComm {
    pub(super) fn from_raw(comm: RawComm, control: Arc<Control>) -> MpiComm {
        let (mut rank, mut size) = (0, 0);
        // SAFETY: queries of a live communicator.
        unsafe {
            ffi::MPI_Comm_rank(comm.0, &mut rank);
            ffi::MPI_Comm_size(comm.0, &mut size);
        }
        MpiComm { comm, rank: rank as usize, size: size as usize, control, calls: Mutex::new(0), clock: None }
    }

    /// Tell every process that this one failed (see [`Mpi::fail`](super::Mpi::fail)).
    pub fn fail(&self, why: &str) {
        self.control.fail(why);
    }

    /// Count the time this communicator's collectives take (waiting for the other processes
    /// included) in `world`'s collective time, as an in-host group's is.
    pub(crate) fn timed(mut self, world: Arc<crate::comm::World>) -> MpiComm {
        self.clock = Some(world);
        self
    }

    /// `f`, its time counted on the clock.
    fn on_clock<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let start = std::time::Instant::now();
        let out = f();
        if let Some(w) = &self.clock {
            w.add_collective_time(start.elapsed());
        }
        out
    }

    /// The element-wise max of every rank's `values`, through MPI's non-blocking all-reduce
    /// polled with the failure channel (so a failed peer is an `Err`, never a hang).
    fn max_polled(&self, call: &str, values: &[u64]) -> Result<Vec<u64>> {
        self.max_polled_until(call, values, None)
    }

    /// As `max_polled`, giving up at `deadline`.
    fn max_polled_until(&self, call: &str, values: &[u64], deadline: Option<std::time::Instant>) -> Result<Vec<u64>> {
        self.control.check(call)?;
        let send = values.to_vec();
        let mut recv = vec![0u64; send.len()];
        let mut req = null_request();
        // SAFETY: both buffers hold len u64s and outlive the request (leaked if it is abandoned).
        unsafe {
            ffi::MPI_Iallreduce(
                send.as_ptr().cast(),
                recv.as_mut_ptr().cast(),
                send.len() as i32,
                ffi::RSMPI_UINT64_T,
                ffi::RSMPI_MAX,
                self.comm.0,
                &mut req,
            )
        };
        if let Err(e) = self.control.wait_until(req, call, deadline, false) {
            abandon((send, recv));
            return Err(e);
        }
        Ok(recv)
    }

    /// The header every call agrees on: which call, its number on this communicator, and `rest`
    /// (name, value); every rank gets `Err` naming the first field that differs (`shape` is this
    /// rank's, for the message). The returned guard keeps other threads of this process off the
    /// communicator until the call is done.
    fn begin(
        &self,
        call: &str,
        code: u64,
        rest: &[(&str, u64)],
        shape: &[usize],
    ) -> Result<std::sync::MutexGuard<'_, u64>> {
        self.begin_until(call, code, rest, shape, None)
    }

    /// As `begin`, giving up at `deadline`.
    fn begin_until(
        &self,
        call: &str,
        code: u64,
        rest: &[(&str, u64)],
        shape: &[usize],
        deadline: Option<std::time::Instant>,
    ) -> Result<std::sync::MutexGuard<'_, u64>> {
        let mut calls = self.calls.lock().unwrap_or_else(|p| p.into_inner());
        *calls += 1;
        let mut fields = vec![(CALLED, code), ("the call's number on this communicator", *calls)];
        fields.extend_from_slice(rest);
        // One length for every call, so ranks in different calls still exchange matching headers.
        fields.resize(HEADER, ("nothing", 0));
        // Max of each value and of its complement: the max and the min in one MAX reduction.
        let send: Vec<u64> = fields.iter().map(|f| f.1).chain(fields.iter().map(|f| !f.1)).collect();
        let recv = self.max_polled_until(call, &send, deadline)?;
        for (i, (name, mine)) in fields.iter().enumerate() {
            let (max, min) = (recv[i], !recv[HEADER + i]);
            if max == min {
                continue;
            }
            if i == 0 && max == FINISH {
                return Err(Error::Collective(format!(
                    "{call}: another process has finished (its program returned or failed before this call); this is rank {} of {}",
                    self.rank, self.size
                )));
            }
            return Err(Error::Collective(format!(
                "{call}: the {} ranks disagree on {name} (rank {} has {mine} and shape {shape:?}; the ranks range from {min} to {max})",
                self.size, self.rank
            )));
        }
        Ok(calls)
    }

    /// Every rank holds the same `fields`, or every one gets `Err` naming the first that differs.
    pub(crate) fn agree(&self, call: &str, code: u64, fields: &[(&str, u64)]) -> Result<()> {
        self.begin(call, code, fields, &[]).map(drop)
    }

    /// Every rank says whether its own part of `call` went well (`ok`); `Err` on every rank when
    /// any rank's did not, naming it. Lets a check that one process alone can fail (a file it
    /// cannot read, a batch it refuses) reach the others before anything collective starts.
    pub(crate) fn vote(&self, call: &str, ok: bool) -> Result<()> {
        let _call = self.begin(call, 8, &[("what is voted on", super::digest_text(call))], &[])?;
        let failed = if ok { 0 } else { self.rank as u64 + 1 };
        let worst = self.max_polled(call, &[failed])?[0];
        if worst == 0 {
            return Ok(());
        }
        Err(Error::Collective(format!(
            "{call}: process {} failed it (its own error says why); nothing was changed",
            worst - 1
        )))
    }

    /// The element-wise max of every rank's `values` (a shared random id, say).
    pub(crate) fn max_u64(&self, call: &str, values: &[u64]) -> Result<Vec<u64>> {
        let _call = self.begin(call, 9, &[("how many values", values.len() as u64)], &[])?;
        self.max_polled(call, values)
    }

    /// Say this process is done (its `Mpi` is dropped): succeeds once every rank says so, or
    /// `Err` at `deadline`. A rank still in another call of this communicator gets `Err` there.
    pub(crate) fn finish_job(&self, deadline: std::time::Instant) -> Result<()> {
        self.begin_until("finishing", FINISH, &[], &[], Some(deadline)).map(drop)
    }

    /// A communicator over the ranks that pass the same `color` (none for this rank when
    /// `color` is `None`), ranked by `key`. Every rank first agrees that it is splitting (a
    /// polled agreement: `MPI_Comm_split` itself cannot see a failed peer).
    pub(crate) fn split(&self, color: Option<usize>, key: usize) -> Result<Option<MpiComm>> {
        let color = match color {
            Some(c) => i32::try_from(c).map_err(|_| self.refuse(format!("MPI split: color {c} is too large")))?,
            // SAFETY: reading MPI's predefined constant.
            None => unsafe { ffi::RSMPI_UNDEFINED },
        };
        let _call = self.begin("MPI split", 6, &[], &[])?;
        let mut out: ffi::MPI_Comm = unsafe { ffi::RSMPI_COMM_NULL };
        // SAFETY: a split of a live communicator into a handle we own.
        let code = unsafe { ffi::MPI_Comm_split(self.comm.0, color, key as i32, &mut out) };
        self.ok("MPI split", code)?;
        // SAFETY: comparing handles.
        if out == unsafe { ffi::RSMPI_COMM_NULL } {
            return Ok(None);
        }
        Ok(Some(MpiComm::from_raw(RawComm(out), self.control.clone())))
    }

    /// Wait for the data stage `req`, polled like the header, so a peer that failed (or gave
    /// up on this call's header just as it completed here) is an `Err`, never a hang. `bufs`,
    /// which MPI reads or writes until the request completes, come back when it does; on a
    /// failure they are leaked, since MPI may still use them.
    fn complete<T>(&self, call: &str, req: ffi::MPI_Request, bufs: T) -> Result<T> {
        match self.control.wait_until(req, call, None, true) {
            Ok(()) => Ok(bufs),
            Err(e) => {
                abandon(bufs);
                Err(e)
            }
        }
    }

    /// `r`, whose error (found on this rank alone, before a call's header) also fails the job.
    fn local<T>(&self, r: Result<T>) -> Result<T> {
        r.map_err(|e| self.refuse(e.to_string()))
    }

    /// An argument error found before a call's header: the other ranks will wait in that call
    /// for this one, so the failure goes to them too (as `InHost` does).
    fn refuse(&self, why: String) -> Error {
        self.control.fail(&why);
        Error::Collective(why)
    }

    /// A reduction's values made final: a mean is MPI's sum over the ranks, divided here.
    fn finish(&self, kind: ReduceKind, values: &mut [f32]) {
        if kind == ReduceKind::Mean {
            let s = 1.0 / self.size as f32;
            values.iter_mut().for_each(|v| *v *= s);
        }
    }

    /// An MPI return code as a `Result` (Open MPI's default handler aborts the job before
    /// returning an error, so this is for libraries set to return them).
    fn ok(&self, what: &str, code: i32) -> Result<()> {
        if code == 0 { Ok(()) } else { Err(Error::Collective(format!("{what}: MPI error code {code}"))) }
    }
}

/// A digest of a shape (with one axis left out), for the ranks to compare.
fn digest(dims: &[usize], skip: Option<usize>) -> u64 {
    dims.iter()
        .enumerate()
        .filter(|(i, _)| Some(*i) != skip)
        .fold(0xcbf2_9ce4_8422_2325u64, |h, (_, &d)| (h ^ d as u64).wrapping_mul(0x0100_0000_01b3))
        ^ dims.len() as u64
}

/// `x` with `axis` moved to the front, and the permutation that moves it back.
fn axis_first(x: &Tensor, axis: usize) -> Result<(Tensor, Vec<usize>)> {
    let r = x.rank();
    let order: Vec<usize> = std::iter::once(axis).chain((0..r).filter(|&i| i != axis)).collect();
    let mut back = vec![0; r];
    for (i, &o) in order.iter().enumerate() {
        back[o] = i;
    }
    Ok((if axis == 0 { x.clone() } else { x.permute(&order)? }, back))
}

fn expect_f32(x: &Tensor, what: &str) -> Result<()> {
    if x.dtype() != DType::F32 {
        return Err(Error::Collective(format!(
            "{what}: MPI collectives carry f32 values, this tensor is {:?}",
            x.dtype()
        )));
    }
    Ok(())
}

fn op_of(kind: ReduceKind) -> ffi::MPI_Op {
    // SAFETY: reading MPI's predefined operation handles.
    unsafe {
        match kind {
            ReduceKind::Sum | ReduceKind::Mean => ffi::RSMPI_SUM,
            ReduceKind::Max => ffi::RSMPI_MAX,
        }
    }
}

impl Collectives for MpiComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.size
    }

    fn all_reduce(&self, x: &Tensor, kind: ReduceKind) -> Result<Tensor> {
        self.on_clock(|| self.all_reduce_now(x, kind))
    }

    fn all_gather(&self, x: &Tensor, axis: usize) -> Result<Tensor> {
        self.on_clock(|| self.all_gather_now(x, axis))
    }

    fn reduce_scatter(&self, x: &Tensor, axis: usize, sizes: &[usize], kind: ReduceKind) -> Result<Tensor> {
        self.on_clock(|| self.reduce_scatter_now(x, axis, sizes, kind))
    }

    fn broadcast(&self, x: &Tensor, root: usize) -> Result<Tensor> {
        self.on_clock(|| self.broadcast_now(x, root))
    }

    fn barrier(&self) -> Result<()> {
        self.on_clock(|| self.barrier_now())
    }
}

/// The collectives themselves (the trait's methods time them).
impl MpiComm {
    fn all_reduce_now(&self, x: &Tensor, kind: ReduceKind) -> Result<Tensor> {
        // Everything that can fail on this rank alone is done before the header.
        let (send, n) = self.local((|| {
            expect_f32(x, "all_reduce")?;
            let send = x.host_f32()?;
            let n = count(send.len(), "all_reduce")?;
            Ok((send, n))
        })())?;
        let _call = self.begin(
            "all_reduce",
            1,
            &[("the shape", digest(x.dims(), None)), ("the reduction", kind as u64)],
            x.dims(),
        )?;
        let mut recv = receive_buffer(send.len());
        let mut req = null_request();
        // SAFETY: send holds n f32s and recv has room for n; both stay alive (moved, their heap
        // buffers unmoved) until the request completes, or are leaked.
        self.ok("all_reduce", unsafe {
            ffi::MPI_Iallreduce(
                send.as_ptr().cast(),
                recv.as_mut_ptr().cast(),
                n,
                ffi::RSMPI_FLOAT,
                op_of(kind),
                self.comm.0,
                &mut req,
            )
        })?;
        let (send, mut recv) = self.complete("all_reduce", req, (send, recv))?;
        // SAFETY: the all-reduce wrote all n values into recv's capacity.
        unsafe { recv.set_len(send.len()) };
        self.finish(kind, &mut recv);
        Tensor::from_host_vec(recv, x.dims(), x.device())
    }

    fn all_gather_now(&self, x: &Tensor, axis: usize) -> Result<Tensor> {
        let (front, back, send) = self.local((|| {
            expect_f32(x, "all_gather")?;
            if axis >= x.rank() {
                return Err(Error::Collective(format!("all_gather: axis {axis} of a tensor of shape {:?}", x.dims())));
            }
            let (front, back) = axis_first(x, axis)?;
            let send = front.host_f32()?;
            Ok((front, back, send))
        })())?;
        let _call = self.begin(
            "all_gather",
            2,
            &[("the shape outside the gathered axis", digest(x.dims(), Some(axis))), ("the axis", axis as u64)],
            x.dims(),
        )?;
        let inner: usize = x.dims().iter().enumerate().filter(|(i, _)| *i != axis).map(|(_, d)| d).product();
        // Every rank's length along the axis first (they may differ), then the values.
        let mine = vec![x.dims()[axis] as u64];
        let mut lens = vec![0u64; self.size];
        let mut req = null_request();
        // SAFETY: one u64 sent, one per rank received, both kept until completion (or leaked).
        self.ok("all_gather", unsafe {
            ffi::MPI_Iallgather(
                mine.as_ptr().cast(),
                1,
                ffi::RSMPI_UINT64_T,
                lens.as_mut_ptr().cast(),
                1,
                ffi::RSMPI_UINT64_T,
                self.comm.0,
                &mut req,
            )
        })?;
        let (_, lens) = self.complete("all_gather", req, (mine, lens))?;
        let counts = lens.iter().map(|&l| count(l as usize * inner, "all_gather")).collect::<Result<Vec<i32>>>()?;
        let displs: Vec<i32> = counts
            .iter()
            .scan(0i64, |at, &c| {
                let d = *at;
                *at += c as i64;
                Some(d)
            })
            .map(|d| count(d as usize, "all_gather"))
            .collect::<Result<_>>()?;
        let total: usize = counts.iter().map(|&c| c as usize).sum();
        let mut recv = receive_buffer(total);
        let mut req = null_request();
        // SAFETY: recv has room for the sum of counts; counts and displs have one entry per rank;
        // all are kept until completion (or leaked).
        self.ok("all_gather", unsafe {
            ffi::MPI_Iallgatherv(
                send.as_ptr().cast(),
                counts[self.rank],
                ffi::RSMPI_FLOAT,
                recv.as_mut_ptr().cast(),
                counts.as_ptr(),
                displs.as_ptr(),
                ffi::RSMPI_FLOAT,
                self.comm.0,
                &mut req,
            )
        })?;
        let (_, mut recv, _, _) = self.complete("all_gather", req, (send, recv, counts, displs))?;
        let mut shape: Vec<usize> = front.dims().to_vec();
        shape[0] = lens.iter().sum::<u64>() as usize;
        // SAFETY: MPI_Allgatherv wrote every rank's count at its displacement: all of 0..total.
        unsafe { recv.set_len(total) };
        let joined = Tensor::from_host_vec(recv, &shape, x.device())?;
        if axis == 0 { Ok(joined) } else { joined.permute(&back)?.contiguous() }
    }

    fn reduce_scatter_now(&self, x: &Tensor, axis: usize, sizes: &[usize], kind: ReduceKind) -> Result<Tensor> {
        let (front, back, send, inner, counts) = self.local((|| {
            expect_f32(x, "reduce_scatter")?;
            if sizes.len() != self.size || axis >= x.rank() || sizes.iter().sum::<usize>() != x.dims()[axis] {
                return Err(Error::Collective(format!(
                    "reduce_scatter: sizes {sizes:?} do not split axis {axis} of shape {:?} over {} ranks (this is rank {})",
                    x.dims(),
                    self.size,
                    self.rank
                )));
            }
            let (front, back) = axis_first(x, axis)?;
            let send = front.host_f32()?;
            let inner = x.numel() / x.dims()[axis].max(1);
            let counts = sizes.iter().map(|&s| count(s * inner, "reduce_scatter")).collect::<Result<Vec<i32>>>()?;
            Ok((front, back, send, inner, counts))
        })())?;
        let sizes_digest = sizes.iter().fold(0u64, |h, &s| h.wrapping_mul(1_000_003) ^ s as u64);
        let _call = self.begin(
            "reduce_scatter",
            3,
            &[
                ("the shape", digest(x.dims(), None)),
                ("the axis", axis as u64),
                ("the sizes", sizes_digest),
                ("the reduction", kind as u64),
            ],
            x.dims(),
        )?;
        let mut recv = receive_buffer(sizes[self.rank] * inner);
        let mut req = null_request();
        // SAFETY: send holds the sum of counts, recv has room for this rank's count; all kept
        // until completion (or leaked).
        self.ok("reduce_scatter", unsafe {
            ffi::MPI_Ireduce_scatter(
                send.as_ptr().cast(),
                recv.as_mut_ptr().cast(),
                counts.as_ptr(),
                ffi::RSMPI_FLOAT,
                op_of(kind),
                self.comm.0,
                &mut req,
            )
        })?;
        let (_, mut recv, _) = self.complete("reduce_scatter", req, (send, recv, counts))?;
        // SAFETY: MPI_Reduce_scatter wrote this rank's count of values.
        unsafe { recv.set_len(sizes[self.rank] * inner) };
        self.finish(kind, &mut recv);
        let mut shape = front.dims().to_vec();
        shape[0] = sizes[self.rank];
        let part = Tensor::from_host_vec(recv, &shape, x.device())?;
        if axis == 0 { Ok(part) } else { part.permute(&back)?.contiguous() }
    }

    fn broadcast_now(&self, x: &Tensor, root: usize) -> Result<Tensor> {
        let (mut buf, n) = self.local((|| {
            expect_f32(x, "broadcast")?;
            if root >= self.size {
                return Err(Error::Collective(format!("broadcast from rank {root} in a group of {}", self.size)));
            }
            let buf = x.to_vec::<f32>()?;
            let n = count(buf.len(), "broadcast")?;
            Ok((buf, n))
        })())?;
        let _call =
            self.begin("broadcast", 4, &[("the shape", digest(x.dims(), None)), ("the root", root as u64)], x.dims())?;
        let mut req = null_request();
        // SAFETY: buf holds n f32s, kept until completion (or leaked).
        self.ok("broadcast", unsafe {
            ffi::MPI_Ibcast(buf.as_mut_ptr().cast(), n, ffi::RSMPI_FLOAT, root as i32, self.comm.0, &mut req)
        })?;
        let buf = self.complete("broadcast", req, buf)?;
        Tensor::from_host_vec(buf, x.dims(), x.device())
    }

    fn barrier_now(&self) -> Result<()> {
        // The header's agreement is itself a barrier: every rank has arrived once it completes.
        self.begin("barrier", 5, &[], &[]).map(drop)
    }
}
