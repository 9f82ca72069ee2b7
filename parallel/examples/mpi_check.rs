//! weft's collectives across processes, checked by every process against values it works out
//! alone. Run under MPI (the tests in `tests/mpi.rs` do):
//!
//! ```text
//! cargo build -p weft-parallel --features mpi --example mpi_check
//! mpirun -np 4 target/debug/examples/mpi_check collectives
//! ```
//!
//! Modes: `collectives` (every collective, uneven sizes), `fail` (process 1 fails; the others
//! must leave their collective with its reason), `mismatch` (processes that call different
//! collectives or pass different shapes must all get an `Err` naming what differs), `kill`
//! (process 1 is killed outright mid-run; mpirun must end the job).

use weft_core::{Collectives, Device, Error, ReduceKind, Result, Tensor};
use weft_parallel::mpi::{Mpi, MpiComm};

fn main() {
    let mode = std::env::args().nth(1).unwrap_or_else(|| "collectives".into());
    let mpi = match Mpi::init() {
        Ok(m) => m,
        Err(e) => {
            eprintln!("mpi_check: {e}");
            std::process::exit(2);
        }
    };
    let rank = mpi.rank();
    let result = match mode.as_str() {
        "collectives" => collectives(&mpi),
        "fail" => fail(&mpi),
        "mismatch" => mismatch(&mpi),
        "kill" => kill(&mpi),
        other => Err(Error::Msg(format!("unknown mode {other:?}"))),
    };
    match result {
        Ok(()) => println!("process {rank}: {mode} ok"),
        Err(e) => {
            eprintln!("process {rank}: {mode} FAILED: {e}");
            drop(mpi);
            std::process::exit(1);
        }
    }
}

fn check(what: &str, got: &[f32], want: &[f32]) -> Result<()> {
    if got.len() != want.len() || got.iter().zip(want).any(|(g, w)| (g - w).abs() > 1e-4 * (1.0 + w.abs())) {
        return Err(Error::Msg(format!("{what}: got {got:?}, want {want:?}")));
    }
    Ok(())
}

fn collectives(mpi: &Mpi) -> Result<()> {
    let comm = mpi.world()?;
    let (r, p) = (comm.rank(), comm.world_size());
    let cpu = Device::Cpu;
    // all_reduce: rank r holds (r + 1) * (i + 1).
    let x: Vec<f32> = (0..6).map(|i| ((r + 1) * (i + 1)) as f32).collect();
    let x = Tensor::from_vec(x, &[2, 3], &cpu)?;
    let s = (p * (p + 1) / 2) as f32;
    let scaled = |k: f32| (0..6).map(|i| k * (i + 1) as f32).collect::<Vec<f32>>();
    check("all_reduce sum", &comm.all_reduce(&x, ReduceKind::Sum)?.to_vec()?, &scaled(s))?;
    check("all_reduce mean", &comm.all_reduce(&x, ReduceKind::Mean)?.to_vec()?, &scaled(s / p as f32))?;
    check("all_reduce max", &comm.all_reduce(&x, ReduceKind::Max)?.to_vec()?, &scaled(p as f32))?;
    // all_gather along axis 1, rank q holding q + 1 entries of it: value 1000q + 100a + 10b + c.
    let part = |q: usize| -> Vec<f32> {
        let mut v = Vec::new();
        for a in 0..2 {
            for b in 0..q + 1 {
                for c in 0..3 {
                    v.push((1000 * q + 100 * a + 10 * b + c) as f32);
                }
            }
        }
        v
    };
    let mine = Tensor::from_vec(part(r), &[2, r + 1, 3], &cpu)?;
    let got = comm.all_gather(&mine, 1)?;
    let mut want = Vec::new();
    for a in 0..2 {
        for q in 0..p {
            for b in 0..q + 1 {
                for c in 0..3 {
                    want.push((1000 * q + 100 * a + 10 * b + c) as f32);
                }
            }
        }
    }
    let total: usize = (1..=p).sum();
    if got.dims() != [2, total, 3] {
        return Err(Error::Msg(format!("all_gather: shape {:?}", got.dims())));
    }
    check("all_gather axis 1", &got.to_vec()?, &want)?;
    check("all_gather axis 0", &comm.all_gather(&mine.narrow(1, 0, 1)?.contiguous()?, 0)?.to_vec()?, &{
        let mut w = Vec::new();
        for q in 0..p {
            for a in 0..2 {
                for c in 0..3 {
                    w.push((1000 * q + 100 * a + c) as f32);
                }
            }
        }
        w
    })?;
    // reduce_scatter along axis 1 into uneven parts: rank q holds (q + 1) * (100a + 10b + c).
    let sizes: Vec<usize> = (0..p).map(|q| q + 1).collect();
    let whole = |k: usize| -> Vec<f32> {
        let mut v = Vec::new();
        for a in 0..2 {
            for b in 0..total {
                for c in 0..3 {
                    v.push((k * (100 * a + 10 * b + c)) as f32);
                }
            }
        }
        v
    };
    let x = Tensor::from_vec(whole(r + 1), &[2, total, 3], &cpu)?;
    let got = comm.reduce_scatter(&x, 1, &sizes, ReduceKind::Sum)?;
    let start: usize = sizes[..r].iter().sum();
    let want_t = Tensor::from_vec(whole(p * (p + 1) / 2), &[2, total, 3], &cpu)?.narrow(1, start, sizes[r])?;
    if got.dims() != want_t.dims() {
        return Err(Error::Msg(format!("reduce_scatter: shape {:?}, want {:?}", got.dims(), want_t.dims())));
    }
    check("reduce_scatter", &got.to_vec()?, &want_t.to_vec()?)?;
    // broadcast from the last rank.
    let x = Tensor::full(r as f32, &[5], &cpu)?;
    check("broadcast", &comm.broadcast(&x, p - 1)?.to_vec()?, &[(p - 1) as f32; 5])?;
    comm.barrier()?;
    // Groups made by split: even and odd ranks.
    let half = mpi.split(r % 2, r)?;
    let members: Vec<usize> = (0..p).filter(|q| q % 2 == r % 2).collect();
    let x = Tensor::full(r as f32, &[2], &cpu)?;
    let sum: usize = members.iter().sum();
    check("split all_reduce", &half.all_reduce(&x, ReduceKind::Sum)?.to_vec()?, &[sum as f32; 2])?;
    Ok(())
}

/// Process 1 fails; every other process must leave the all-reduce it waits in with process 1's reason.
fn fail(mpi: &Mpi) -> Result<()> {
    let comm = mpi.world()?;
    let x = Tensor::full(1.0, &[4], &Device::Cpu)?;
    comm.all_reduce(&x, ReduceKind::Sum)?;
    if comm.rank() == 1 {
        std::thread::sleep(std::time::Duration::from_millis(300));
        comm.fail("it gave up on purpose");
    }
    let t = std::time::Instant::now();
    match comm.all_reduce(&x, ReduceKind::Sum) {
        Err(Error::Collective(m)) if m.contains("process 1 failed: it gave up on purpose") => {
            if t.elapsed().as_secs() > 20 {
                return Err(Error::Msg(format!("the failure took {:?} to arrive", t.elapsed())));
            }
            Ok(())
        }
        other => Err(Error::Msg(format!("wanted process 1's failure, got {other:?}"))),
    }
}

fn expect_err(what: &str, r: Result<Tensor>, words: &str) -> Result<()> {
    match r {
        Err(Error::Collective(m)) if m.contains(words) => Ok(()),
        other => Err(Error::Msg(format!("{what}: wanted an error naming {words:?}, got {other:?}"))),
    }
}

/// Ranks that pass different shapes, or call different collectives, all get `Err`; afterwards the
/// communicator still works.
fn mismatch(mpi: &Mpi) -> Result<()> {
    let comm: MpiComm = mpi.world()?;
    let r = comm.rank();
    let x = Tensor::full(1.0, &[3 + r.min(1)], &Device::Cpu)?;
    expect_err("shapes", comm.all_reduce(&x, ReduceKind::Sum), "disagree on the shape")?;
    let y = Tensor::full(1.0, &[3], &Device::Cpu)?;
    let r2 = if r == 0 { comm.barrier().map(|_| y.clone()) } else { comm.all_reduce(&y, ReduceKind::Sum) };
    expect_err("calls", r2, "disagree on the collective called")?;
    let sum = comm.all_reduce(&y, ReduceKind::Sum)?.to_vec::<f32>()?;
    check("after the mismatches", &sum, &[comm.world_size() as f32; 3])
}

/// Process 1 kills itself (SIGKILL) between two collectives; the others wait in the second until
/// mpirun ends the job. Never returns normally on a process that is not 1.
fn kill(mpi: &Mpi) -> Result<()> {
    let comm = mpi.world()?;
    let x = Tensor::full(1.0, &[4], &Device::Cpu)?;
    comm.all_reduce(&x, ReduceKind::Sum)?;
    if comm.rank() == 1 {
        let pid = std::process::id().to_string();
        let _ = std::process::Command::new("kill").args(["-9", &pid]).status();
    }
    loop {
        comm.all_reduce(&x, ReduceKind::Sum)?;
    }
}
