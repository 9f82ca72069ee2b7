//! The communicators of this process's ranks of a mesh: each rank's model group and data group.
//!
//! In one process every group is in-host (`InHost`). On a mesh that spans processes (feature
//! `mpi`), a group that lies inside one process stays in-host; a group with one rank in each of
//! its processes is an MPI communicator; a group with k > 1 ranks in each of its processes is a
//! `Hier`: an in-host group of this process's k, and an MPI communicator per position
//! (`DeviceMesh::group_place` refuses any other).

use crate::DeviceMesh;
use crate::comm::{InHost, World};
use std::sync::Arc;
use weft_core::{Collectives, Result};

/// One rank's (model group, data group).
pub(crate) type RankComms = (Arc<dyn Collectives>, Arc<dyn Collectives>);

/// The communicators of this process's ranks (in `mesh.local_ranks()` order), and one handle on
/// each in-host group (to clear a failure).
pub(crate) struct Comms {
    pub per_rank: Vec<RankComms>,
    pub in_host: Vec<InHost>,
}

pub(crate) fn make(mesh: &DeviceMesh, world: &Arc<World>) -> Result<Comms> {
    let local = mesh.local_ranks();
    let here: Vec<usize> = local.iter().map(|(g, _)| *g).collect();
    let mut in_host: Vec<InHost> = Vec::new();
    let mut kinds: Vec<Vec<Arc<dyn Collectives>>> = Vec::new();
    for kind in ["model", "data"] {
        // In-host groups (of a group inside this process, or of this process's part of a group
        // over several), made once per group (keyed by its first rank here), handed out by position.
        let mut made: Vec<(usize, Vec<InHost>)> = Vec::new();
        let mut mine: Vec<Option<Arc<dyn Collectives>>> = vec![None; local.len()];
        let mut parts: Vec<Option<InHost>> = vec![None; local.len()];
        for (i, g) in here.iter().enumerate() {
            let place = place(mesh, kind, *g)?;
            let members: Vec<usize> = mesh.group(kind, *g).into_iter().filter(|m| here.contains(m)).collect();
            if place == Some(1) {
                continue;
            }
            let at = members.iter().position(|m| m == g).unwrap_or(0);
            let k = match made.iter().position(|(first, _)| *first == members[0]) {
                Some(k) => k,
                None => {
                    let hs = InHost::group(members.len(), world);
                    in_host.push(hs[0].clone());
                    made.push((members[0], hs));
                    made.len() - 1
                }
            };
            let handle = made[k].1[at].clone();
            match place {
                None => mine[i] = Some(Arc::new(handle)),
                Some(_) => parts[i] = Some(handle),
            }
        }
        split_across_processes(mesh, kind, world, &mut mine, &mut parts)?;
        let mine = mine
            .into_iter()
            .zip(&local)
            .map(|(c, (g, _))| c.ok_or_else(|| weft_core::Error::Collective(format!("rank {g} has no {kind} group"))));
        kinds.push(mine.collect::<Result<_>>()?);
    }
    let data = kinds.pop().unwrap_or_default();
    let model = kinds.pop().unwrap_or_default();
    Ok(Comms { per_rank: model.into_iter().zip(data).collect(), in_host })
}

/// Where rank `g`'s group lies: `None` inside this process, `Some(k)` k ranks in each of its processes.
#[cfg(feature = "mpi")]
fn place(mesh: &DeviceMesh, kind: &str, g: usize) -> Result<Option<usize>> {
    if mesh.procs().is_none() {
        return Ok(None);
    }
    mesh.group_place(kind, g)
}

#[cfg(not(feature = "mpi"))]
fn place(_: &DeviceMesh, _: &str, _: usize) -> Result<Option<usize>> {
    Ok(None)
}

/// MPI communicators for the groups that span processes. Every process makes the same calls:
/// one split per local index, in which the local rank at that index joins its group's
/// communicator (colour: the group's first rank; the members at one local index are one
/// position of the group in each process) or none. With an in-host part, the two make a `Hier`.
#[cfg(feature = "mpi")]
fn split_across_processes(
    mesh: &DeviceMesh,
    kind: &str,
    world: &Arc<World>,
    mine: &mut [Option<Arc<dyn Collectives>>],
    parts: &mut [Option<InHost>],
) -> Result<()> {
    let Some(procs) = mesh.procs() else { return Ok(()) };
    for (i, (g, _)) in mesh.local_ranks().into_iter().enumerate() {
        let members = mesh.group(kind, g);
        let spanning = mesh.group_place(kind, g)?.is_some();
        if let Some(c) = procs.split(spanning.then_some(members[0]), g)? {
            let c = c.timed(world.clone());
            mine[i] = Some(match parts[i].take() {
                Some(part) => Arc::new(crate::mpi::Hier::new(part, c)),
                None => Arc::new(c),
            });
        }
    }
    Ok(())
}

#[cfg(not(feature = "mpi"))]
fn split_across_processes(
    _: &DeviceMesh,
    _: &str,
    _: &Arc<World>,
    _: &mut [Option<Arc<dyn Collectives>>],
    _: &mut [Option<InHost>],
) -> Result<()> {
    Ok(())
}
