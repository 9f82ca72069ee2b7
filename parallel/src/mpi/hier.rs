//! `Hier`: a group with several ranks in each of several processes (a model axis wider than one
//! host, say), built from two communicators: the in-host group of this process's members, and
//! an MPI communicator linking the members at the same position in every process.
//!
//! The group's members are ranked process by process (k in each): member q·k + i is position i
//! of the q-th process. Every collective runs in two stages that together equal the one-stage
//! collective: a sum over the in-host group, then over the processes, is the sum over all; an
//! in-host gather, then a gather of those blocks over the processes, is the gather in order.
//! Only the second stage crosses the network, with one process's share of the data.

use super::MpiComm;
use crate::comm::InHost;
use weft_core::{Collectives, Error, ReduceKind, Result, Tensor};

/// One rank's handle on a group that spans processes with several members in each: the
/// in-host group of this process's members and the MPI communicator of this rank's position.
/// `ShardedModel` makes these for a mesh whose groups need them; made by hand, every process's
/// in-host group must have the same size, and `cross` must link one rank at this position in
/// each process, ranked in process order.
pub struct Hier {
    /// This process's members of the group (k ranks, one thread each).
    local: InHost,
    /// The members at this rank's position in every process of the group.
    cross: MpiComm,
}

impl Hier {
    /// The group of `local` (this process's members) across the processes `cross` links.
    pub fn new(local: InHost, cross: MpiComm) -> Hier {
        Hier { local, cross }
    }

    /// Members per process.
    fn k(&self) -> usize {
        self.local.world_size()
    }

    /// Sum for a mean (the division comes once, at the end).
    fn stage_kind(kind: ReduceKind) -> ReduceKind {
        if kind == ReduceKind::Mean { ReduceKind::Sum } else { kind }
    }

    fn finish(&self, kind: ReduceKind, x: Tensor) -> Result<Tensor> {
        if kind == ReduceKind::Mean { x.mul_scalar(1.0 / self.world_size() as f32) } else { Ok(x) }
    }
}

impl Collectives for Hier {
    fn rank(&self) -> usize {
        self.cross.rank() * self.k() + self.local.rank()
    }

    fn world_size(&self) -> usize {
        self.cross.world_size() * self.k()
    }

    fn all_reduce(&self, x: &Tensor, kind: ReduceKind) -> Result<Tensor> {
        let stage = Self::stage_kind(kind);
        let here = self.local.all_reduce(x, stage)?;
        let all = self.cross.all_reduce(&here, stage)?;
        self.finish(kind, all)
    }

    fn all_gather(&self, x: &Tensor, axis: usize) -> Result<Tensor> {
        let here = self.local.all_gather(x, axis)?;
        self.cross.all_gather(&here, axis)
    }

    fn reduce_scatter(&self, x: &Tensor, axis: usize, sizes: &[usize], kind: ReduceKind) -> Result<Tensor> {
        let (k, n) = (self.k(), self.world_size());
        if sizes.len() != n {
            let why = format!("reduce_scatter: {} sizes for a group of {n} ranks", sizes.len());
            self.local.fail(&why);
            return Err(Error::Collective(why));
        }
        // First each process's block, summed over the processes (position by position), then
        // each member's part of its process's block, summed over the process's members.
        let blocks: Vec<usize> = sizes.chunks(k).map(|c| c.iter().sum()).collect();
        let stage = Self::stage_kind(kind);
        let block = self.cross.reduce_scatter(x, axis, &blocks, stage)?;
        let q = self.cross.rank();
        let part = self.local.reduce_scatter(&block, axis, &sizes[q * k..(q + 1) * k], stage)?;
        self.finish(kind, part)
    }

    fn broadcast(&self, x: &Tensor, root: usize) -> Result<Tensor> {
        let k = self.k();
        // The root's process spreads its value in-host (the other processes' in-host step is
        // overwritten next), then each position's MPI group takes it from the root's process.
        let here = self.local.broadcast(x, root % k)?;
        self.cross.broadcast(&here, root / k)
    }

    fn barrier(&self) -> Result<()> {
        self.local.barrier()?;
        self.cross.barrier()
    }
}
