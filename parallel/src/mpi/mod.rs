//! Ranks in several processes (and hosts) over MPI: the environment ([`Mpi`]) and a communicator
//! ([`MpiComm`]) that implements weft-core's `Collectives`, so the collective ops and the layers
//! that call them run unchanged across processes. Behind the `mpi` feature (rsmpi over Open MPI).
//!
//! Start a program under `mpirun -np N`; each process calls [`Mpi::init`] once, on its main
//! thread, and keeps the value alive until it is done with MPI (dropping it finalises MPI).
//!
//! Failure is shared as in-host: a process whose work fails calls [`Mpi::fail`] (or
//! [`MpiComm::fail`]); that sends its reason to every other process on a control channel of its
//! own, and every process waiting in, or later entering, a collective returns `Err` naming the
//! failed process, never hangs. A process killed outright (SIGKILL) is mpirun's to see: Open MPI
//! then ends every process of the job.

mod comm;
mod control;
mod hier;

pub use comm::MpiComm;
pub use hier::Hier;

use ::mpi::Threading;
use ::mpi::environment::Universe;
use ::mpi::topology::Communicator;
use control::{Control, RawComm};
use std::sync::Arc;
use weft_core::{Error, Result};

/// This process's MPI environment: initialised by [`Mpi::init`], finalised when dropped.
///
/// ```no_run
/// use weft_core::{Collectives, Device, ReduceKind, Tensor};
/// use weft_parallel::mpi::Mpi;
/// let mpi = Mpi::init()?; // under `mpirun -np 2`
/// let comm = mpi.world()?;
/// let x = Tensor::full(comm.rank() as f32 + 1.0, &[3], &Device::Cpu)?;
/// assert_eq!(comm.all_reduce(&x, ReduceKind::Sum)?.to_vec::<f32>()?, vec![3.0; 3]);
/// # Ok::<(), weft_core::Error>(())
/// ```
pub struct Mpi {
    procs: Procs,
    // Dropped last: finalises MPI.
    _universe: Universe,
}

/// The processes of the job, as a mesh that spans them keeps them: a communicator over every
/// process (for agreements and splits; its own, so it never meets a user's collectives) and the
/// failure channel. Cheap to clone; made by [`Mpi::procs`].
#[derive(Clone)]
pub struct Procs {
    world: Arc<MpiComm>,
    control: Arc<Control>,
    rank: usize,
    size: usize,
}

impl std::fmt::Debug for Procs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "process {} of {}", self.rank, self.size)
    }
}

impl Mpi {
    /// Initialise MPI with full thread support (every rank of a process runs on its own thread
    /// and may call MPI). `Err` if MPI was initialised before in this process or the library
    /// cannot give `MPI_THREAD_MULTIPLE`.
    pub fn init() -> Result<Mpi> {
        let (universe, level) = ::mpi::initialize_with_threading(Threading::Multiple)
            .ok_or_else(|| Error::Collective("MPI was already initialised in this process".into()))?;
        if level != Threading::Multiple {
            return Err(Error::Collective(format!(
                "the MPI library gives thread level {level:?}; weft's ranks need Multiple (MPI_THREAD_MULTIPLE)"
            )));
        }
        let world = universe.world();
        let control = Arc::new(Control::new(world.duplicate()));
        let (world, rank, size) = RawComm::keep(world.duplicate());
        let world = Arc::new(MpiComm::from_raw(world, control.clone()));
        Ok(Mpi { procs: Procs { world, control, rank, size }, _universe: universe })
    }

    /// The processes of the job, for [`DeviceMesh::across_processes`](crate::DeviceMesh::across_processes).
    pub fn procs(&self) -> Procs {
        self.procs.clone()
    }

    /// This process's rank in the job.
    pub fn rank(&self) -> usize {
        self.procs.rank
    }

    /// Number of processes in the job.
    pub fn size(&self) -> usize {
        self.procs.size
    }

    /// A communicator over every process of the job (its own, so its collectives never mix with
    /// another communicator's). Every process must call this, in the same order as its other
    /// communicator-making calls.
    pub fn world(&self) -> Result<MpiComm> {
        self.procs
            .split(Some(0), self.procs.rank)?
            .ok_or_else(|| Error::Collective("MPI world: no communicator".into()))
    }

    /// Communicators over the processes that pass the same `color`, ranked by `key` (ties by
    /// world rank). Every process must call this together.
    pub fn split(&self, color: usize, key: usize) -> Result<MpiComm> {
        self.procs
            .split(Some(color), key)?
            .ok_or_else(|| Error::Collective(format!("MPI split by color {color} gave no communicator")))
    }

    /// Tell every process that this one failed, with `why`: their collectives return `Err`
    /// naming this process from now on, and so do this process's own.
    pub fn fail(&self, why: &str) {
        self.procs.fail(why);
    }

    /// Why the job failed, if a process said so (this one or another).
    pub fn failure(&self) -> Option<String> {
        self.procs.control.failure()
    }
}

impl Procs {
    /// This process's rank in the job.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of processes in the job.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Tell every process that this one failed (see [`Mpi::fail`]).
    pub fn fail(&self, why: &str) {
        self.control.fail(why);
    }

    /// Every process must hold the same `text` (a plan, say): `Err` on every process, naming
    /// `what`, when they differ. Collective over every process of the job.
    pub fn agree_on(&self, what: &str, text: &str) -> Result<()> {
        self.world.agree(what, 7, &[(what, digest_text(text)), ("its length", text.len() as u64)])
    }

    /// Every process must hold the same values of `fields` (name, value): `Err` on every process,
    /// naming the first that differs. Collective over every process of the job.
    pub fn agree(&self, what: &str, fields: &[(&str, u64)]) -> Result<()> {
        if fields.len() > 4 {
            return Err(Error::invalid("Procs::agree", format!("{what}: at most 4 fields, not {}", fields.len())));
        }
        self.world.agree(what, 7, fields)
    }

    /// Every process says whether its own part of `what` went well: `Ok` when all did, `Err` on
    /// every process (naming one that failed) otherwise. A check only one process can fail (a
    /// file only it reads, a batch only it holds) then stops every process before any collective
    /// work, instead of leaving the others waiting for it. Collective over every process.
    ///
    /// ```no_run
    /// # let mpi = weft_parallel::mpi::Mpi::init()?;
    /// let read = std::fs::read("data.bin");
    /// mpi.procs().vote("reading data.bin", read.is_ok())?;
    /// # Ok::<(), weft_core::Error>(())
    /// ```
    pub fn vote(&self, what: &str, ok: bool) -> Result<()> {
        self.world.vote(what, ok)
    }

    /// `local` on every process when every process's is `Ok`; otherwise `Err` on all (each its
    /// own error, or one naming the process that failed). See [`vote`](Self::vote).
    pub fn all_ok<T>(&self, what: &str, local: Result<T>) -> Result<T> {
        let voted = self.world.vote(what, local.is_ok());
        let v = local?;
        voted.map(|_| v)
    }

    /// The element-wise max over the processes of each one's `values`. Collective.
    pub fn max_u64(&self, what: &str, values: &[u64]) -> Result<Vec<u64>> {
        self.world.max_u64(what, values)
    }

    /// A communicator over the processes that pass the same `color` (none for this process when
    /// `color` is `None`), ranked by `key`. Collective over every process of the job; a process
    /// that failed before it makes every process's split an `Err`.
    pub(crate) fn split(&self, color: Option<usize>, key: usize) -> Result<Option<MpiComm>> {
        self.world.split(color, key)
    }
}

/// FNV-1a over `text`.
pub(crate) fn digest_text(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}

/// How long a finishing process waits for the others to finish too.
const FINISH_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

impl Drop for Mpi {
    /// Wait until every process has finished before MPI is finalised. A process still in a call
    /// of the world communicator (every `ShardedModel` call starts with one) gets `Err` there at
    /// once, and comes; one still waiting elsewhere after [`FINISH_GRACE`] is told this process
    /// has ended (a failure to it), so it returns `Err` instead of waiting forever. Skipped after
    /// a failure (the others have been told).
    fn drop(&mut self) {
        let control = &self.procs.control;
        let deadline = std::time::Instant::now() + FINISH_GRACE;
        while control.failure().is_none() {
            match self.procs.world.finish_job(deadline) {
                Ok(()) => break,
                Err(_) if std::time::Instant::now() >= deadline => {
                    control.fail("ended its program (dropped its Mpi) while this process still calls");
                    break;
                }
                // A process in another call got `Err` there; it will come.
                Err(_) => {}
            }
        }
        control.finalize();
    }
}
