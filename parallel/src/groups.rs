//! The communicators of this process's ranks of a mesh: each rank's model group and data group.
//!
//! In one process every group is in-host (`InHost`). On a mesh that spans processes (feature
//! `mpi`), a group that lies inside one process stays in-host, and a group with one rank in each
//! of its processes is an MPI communicator (`DeviceMesh::group_place` refuses any other).

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
    let mut in_host: Vec<InHost> = Vec::new();
    let mut kinds: Vec<Vec<Arc<dyn Collectives>>> = Vec::new();
    for kind in ["model", "data"] {
        // In-host groups, made once per group (keyed by its first rank) and handed out by position.
        let mut made: Vec<(usize, Vec<InHost>)> = Vec::new();
        let mut mine: Vec<Option<Arc<dyn Collectives>>> = vec![None; local.len()];
        for (i, (g, _)) in local.iter().enumerate() {
            if spans(mesh, kind, *g)? {
                continue;
            }
            let members = mesh.group(kind, *g);
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
            let handles = &made[k].1;
            mine[i] = Some(Arc::new(handles[at].clone()));
        }
        split_across_processes(mesh, kind, &mut mine)?;
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

#[cfg(feature = "mpi")]
fn spans(mesh: &DeviceMesh, kind: &str, g: usize) -> Result<bool> {
    Ok(mesh.procs().is_some() && mesh.group_place(kind, g)?.is_some())
}

#[cfg(not(feature = "mpi"))]
fn spans(_: &DeviceMesh, _: &str, _: usize) -> Result<bool> {
    Ok(false)
}

/// MPI communicators for the groups that span processes. Every process makes the same calls:
/// one split per local index, in which the local rank at that index joins its group's
/// communicator (colour: the group's first rank) or none.
#[cfg(feature = "mpi")]
fn split_across_processes(mesh: &DeviceMesh, kind: &str, mine: &mut [Option<Arc<dyn Collectives>>]) -> Result<()> {
    let Some(procs) = mesh.procs() else { return Ok(()) };
    for (i, (g, _)) in mesh.local_ranks().into_iter().enumerate() {
        let members = mesh.group(kind, g);
        let spanning = mesh.group_place(kind, g)?.is_some();
        let key = members.iter().position(|&m| m == g).unwrap_or(0);
        if let Some(c) = procs.split(spanning.then_some(members[0]), key)? {
            mine[i] = Some(Arc::new(c));
        }
    }
    Ok(())
}

#[cfg(not(feature = "mpi"))]
fn split_across_processes(_: &DeviceMesh, _: &str, _: &mut [Option<Arc<dyn Collectives>>]) -> Result<()> {
    Ok(())
}
