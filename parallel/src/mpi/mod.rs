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

pub use comm::MpiComm;

use ::mpi::Threading;
use ::mpi::environment::Universe;
use ::mpi::topology::{Color, Communicator, SimpleCommunicator};
use control::Control;
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
    control: Arc<Control>,
    world: SimpleCommunicator,
    // Dropped last: finalises MPI.
    _universe: Universe,
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
        Ok(Mpi { control, world, _universe: universe })
    }

    /// This process's rank in the job.
    pub fn rank(&self) -> usize {
        self.world.rank() as usize
    }

    /// Number of processes in the job.
    pub fn size(&self) -> usize {
        self.world.size() as usize
    }

    /// A communicator over every process of the job (its own, so its collectives never mix with
    /// another communicator's). Every process must call this, in the same order as its other
    /// communicator-making calls.
    pub fn world(&self) -> Result<MpiComm> {
        self.control.check("MPI world")?;
        Ok(MpiComm::new(self.world.duplicate(), self.control.clone()))
    }

    /// Communicators over the processes that pass the same `color`, ranked by `key` (ties by
    /// world rank): how a mesh's model and data groups are made. Every process must call this
    /// together.
    pub fn split(&self, color: usize, key: usize) -> Result<MpiComm> {
        self.control.check("MPI split")?;
        let c = self
            .world
            .split_by_color_with_key(Color::with_value(color as i32), key as i32)
            .ok_or_else(|| Error::Collective(format!("MPI split by color {color} gave no communicator")))?;
        Ok(MpiComm::new(c, self.control.clone()))
    }

    /// Tell every process that this one failed, with `why`: their collectives return `Err`
    /// naming this process from now on, and so do this process's own.
    pub fn fail(&self, why: &str) {
        self.control.fail(why);
    }

    /// Why the job failed, if a process said so (this one or another).
    pub fn failure(&self) -> Option<String> {
        self.control.failure()
    }
}
