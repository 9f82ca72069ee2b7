//! The failure channel every communicator of a process shares: a communicator of its own (so its
//! messages never match a collective's), on which a failing process sends its reason to every
//! other, and which a waiting rank polls between tests of its collective.

use ::mpi::ffi;
use ::mpi::raw::AsRaw;
use ::mpi::topology::{Communicator, SimpleCommunicator};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use weft_core::{Error, Result};

/// The tag of a failure message on the control communicator.
const TAG_FAIL: i32 = 77;

/// The longest failure reason sent (longer ones are cut at a character boundary): a reason is
/// an error message, and a runaway one must not flood every process.
const MAX_REASON: usize = 4096;

/// A raw communicator handle, shared by the rank threads of this process.
#[derive(Clone, Copy)]
pub(crate) struct RawComm(pub ffi::MPI_Comm);

// SAFETY: MPI was initialised with MPI_THREAD_MULTIPLE (`Mpi::init` refuses less), so any thread
// may call MPI on any communicator; a communicator's collectives are serialised by the lock of
// the `MpiComm` that owns it.
unsafe impl Send for RawComm {}
unsafe impl Sync for RawComm {}

impl RawComm {
    /// The handle of `c`, which is never freed: a communicator freed after `MPI_Finalize` (a
    /// handle that outlives the `Mpi` value) would be an error, and a job makes only a few.
    pub(crate) fn keep(c: SimpleCommunicator) -> (RawComm, usize, usize) {
        let (rank, size) = (c.rank() as usize, c.size() as usize);
        let raw = RawComm(c.as_raw());
        std::mem::forget(c);
        (raw, rank, size)
    }
}

pub(crate) struct Control {
    comm: RawComm,
    rank: usize,
    size: usize,
    failed: Mutex<Option<String>>,
    /// Set when MPI is finalised: communicators dropped later are left alone.
    finalized: AtomicBool,
}

impl Control {
    pub(crate) fn new(c: SimpleCommunicator) -> Control {
        let (comm, rank, size) = RawComm::keep(c);
        Control { comm, rank, size, failed: Mutex::new(None), finalized: AtomicBool::new(false) }
    }

    /// Mark MPI as finalised (or about to be).
    pub(crate) fn finalize(&self) {
        self.finalized.store(true, Ordering::SeqCst);
    }

    /// Whether MPI is finalised (no MPI call may be made).
    pub(crate) fn finalized(&self) -> bool {
        self.finalized.load(Ordering::SeqCst)
    }

    /// Why the job failed, after reading any failure message that has arrived.
    pub(crate) fn failure(&self) -> Option<String> {
        let mut failed = self.failed.lock().unwrap_or_else(|p| p.into_inner());
        if failed.is_none() {
            *failed = self.receive();
        }
        failed.clone()
    }

    /// `Err` naming the failure, if there was one.
    pub(crate) fn check(&self, what: &str) -> Result<()> {
        match self.failure() {
            Some(why) => Err(Error::Collective(format!("{what}: {why}"))),
            None => Ok(()),
        }
    }

    /// Record this process's failure and send it to every other process (sends that complete in
    /// the background: a dead or busy peer cannot block the sender).
    pub(crate) fn fail(&self, why: &str) {
        let mut failed = self.failed.lock().unwrap_or_else(|p| p.into_inner());
        if failed.is_some() {
            return;
        }
        let mut cut = why.len().min(MAX_REASON);
        while !why.is_char_boundary(cut) {
            cut -= 1;
        }
        let why = &why[..cut];
        *failed = Some(format!("process {} failed: {why}", self.rank));
        // The message must outlive the sends, which are never waited for.
        let msg: &'static [u8] = Box::leak(why.as_bytes().to_vec().into_boxed_slice());
        for peer in (0..self.size).filter(|&p| p != self.rank) {
            let mut req: ffi::MPI_Request = unsafe { ffi::RSMPI_REQUEST_NULL };
            // SAFETY: msg lives forever; the request is released at once (MPI completes the
            // send on its own, and the buffer is never reused).
            unsafe {
                ffi::MPI_Isend(
                    msg.as_ptr().cast(),
                    msg.len() as i32,
                    ffi::RSMPI_UINT8_T,
                    peer as i32,
                    TAG_FAIL,
                    self.comm.0,
                    &mut req,
                );
                ffi::MPI_Request_free(&mut req);
            }
        }
    }

    /// A failure message from another process, if one has arrived.
    fn receive(&self) -> Option<String> {
        let mut flag = 0;
        let mut status = std::mem::MaybeUninit::<ffi::MPI_Status>::uninit();
        // SAFETY: a probe into a status we own.
        unsafe { ffi::MPI_Iprobe(ffi::RSMPI_ANY_SOURCE, TAG_FAIL, self.comm.0, &mut flag, status.as_mut_ptr()) };
        if flag == 0 {
            return None;
        }
        // SAFETY: the probe found a message, so it filled the status.
        let status = unsafe { status.assume_init() };
        let mut count = 0;
        unsafe { ffi::MPI_Get_count(&status, ffi::RSMPI_UINT8_T, &mut count) };
        let mut buf = vec![0u8; count.max(0) as usize];
        // SAFETY: buf holds the probed message's count bytes.
        unsafe {
            ffi::MPI_Recv(
                buf.as_mut_ptr().cast(),
                count,
                ffi::RSMPI_UINT8_T,
                status.MPI_SOURCE,
                TAG_FAIL,
                self.comm.0,
                ffi::RSMPI_STATUS_IGNORE,
            )
        };
        Some(format!("process {} failed: {}", status.MPI_SOURCE, String::from_utf8_lossy(&buf)))
    }

    /// Wait for `req` to complete, polling for failures between tests; give up at `deadline`.
    /// On a failure the request is left pending and `Err` returned: the caller must then leak
    /// the request's buffers.
    ///
    /// Waiting long (a peer still computing), it sleeps between tests. With `busy` (a request
    /// every rank has committed to: a collective's data, after its header) it never sleeps, only
    /// yields the core: MPI moves a non-blocking collective's data only while it is tested, and
    /// 50 µs sleeps held all-reduce to a quarter of `MPI_Allreduce`.
    pub(crate) fn wait_until(
        &self,
        mut req: ffi::MPI_Request,
        what: &str,
        deadline: Option<std::time::Instant>,
        busy: bool,
    ) -> Result<()> {
        let mut spins = 0u32;
        loop {
            let mut done = 0;
            // SAFETY: req is a live request of this process.
            unsafe { ffi::MPI_Test(&mut req, &mut done, ffi::RSMPI_STATUS_IGNORE) };
            if done != 0 {
                return Ok(());
            }
            spins = spins.wrapping_add(1);
            // Look for a failure every 64 tests.
            if spins.is_multiple_of(64) {
                self.check(what)?;
                if deadline.is_some_and(|d| std::time::Instant::now() >= d) {
                    return Err(Error::Collective(format!("{what}: the other processes did not come in time")));
                }
            }
            if busy {
                if spins.is_multiple_of(256) {
                    std::thread::yield_now();
                }
            } else if spins > 4096 {
                std::thread::sleep(Duration::from_micros(50));
            } else {
                std::hint::spin_loop();
            }
        }
    }
}
