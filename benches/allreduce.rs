//! In-host all-reduce bandwidth: a tensor of 1 to 64 MiB summed over 2 and 4 ranks (Cpu devices,
//! and virtual devices on each GPU adapter), one thread per rank. Bandwidth is the tensor's
//! size over the time of one all-reduce (what NCCL calls algorithm bandwidth). The host's memcpy
//! bandwidth is measured alongside, as the yardstick.
//!
//! With the `mpi` feature it then runs itself under `mpirun -np 2` (and 4) and reports weft's MPI
//! communicator against Open MPI's own `MPI_Allreduce` on the same buffers, and the share of a
//! tiny_gpt training step split over 2 processes that goes to collectives.
//!
//! `cargo bench --bench allreduce` (`WEFT_BENCH_DEVICES=cpu` for Cpu devices only);
//! `cargo bench --features mpi --bench allreduce` adds the MPI figures.

mod common;
#[cfg(feature = "mpi")]
#[path = "common/mpi_allreduce.rs"]
mod mpi_allreduce;

use std::time::{Duration, Instant};
use weft::parallel::{InHost, World};
use weft::prelude::*;

const MIB: usize = 1 << 20;

fn memcpy_gbps(bytes: usize) -> f64 {
    let src = vec![1f32; bytes / 4];
    let mut dst = vec![0f32; bytes / 4];
    let mut best = f64::INFINITY;
    for _ in 0..10 {
        let t = Instant::now();
        dst.copy_from_slice(&src);
        std::hint::black_box(&mut dst);
        best = best.min(t.elapsed().as_secs_f64());
    }
    bytes as f64 / best / 1e9
}

/// Seconds per all-reduce of `bytes` over one device per rank: the best of several rounds.
fn allreduce_secs(devs: &[Device], bytes: usize) -> Result<f64> {
    let comms = InHost::group(devs.len(), &World::new());
    let inputs: Vec<Tensor> =
        devs.iter().enumerate().map(|(r, d)| Tensor::full(r as f32, &[bytes / 4], d)).collect::<Result<_>>()?;
    let rounds = if bytes >= 32 * MIB { 4 } else { 8 };
    let times: Vec<Result<f64>> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .zip(&inputs)
            .map(|(c, x)| {
                s.spawn(move || -> Result<f64> {
                    let mut best = f64::INFINITY;
                    for _ in 0..rounds {
                        c.barrier()?;
                        let t = Instant::now();
                        let y = c.all_reduce(x, ReduceKind::Sum)?;
                        y.device().synchronize()?;
                        c.barrier()?;
                        best = best.min(t.elapsed().as_secs_f64());
                    }
                    Ok(best)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank thread")).collect()
    });
    let mut worst: f64 = 0.0;
    for t in times {
        worst = worst.max(t?);
    }
    Ok(worst)
}

fn main() -> Result<()> {
    // Started by mpirun (below): one process of the MPI figures.
    #[cfg(feature = "mpi")]
    if mpi_allreduce::in_job() {
        return mpi_allreduce::process();
    }
    let memcpy = memcpy_gbps(64 * MIB);
    common::report("allreduce/memcpy", &Device::Cpu, "64 MiB", memcpy, "GB/s");
    let sizes = [MIB, 4 * MIB, 16 * MIB, 64 * MIB];
    for base in common::devices() {
        for ranks in [2, 4] {
            // Ranks on Cpu devices, or virtual devices on the same adapter as `base`.
            let devs: Vec<Device> = match &base {
                Device::Gpu(_) => {
                    (0..ranks).map(|_| Device::parse(&format!("gpu:{}", adapter(&base)))).collect::<Result<_>>()?
                }
                d => vec![d.clone(); ranks],
            };
            for &bytes in &sizes {
                if base.is_gpu() && bytes > 16 * MIB {
                    continue; // lavapipe reads back at a few hundred MB/s: keep the run short
                }
                let secs = allreduce_secs(&devs, bytes)?;
                let size = format!("{ranks} ranks, {} MiB", bytes / MIB);
                common::report("allreduce", &base, &size, bytes as f64 / secs / 1e9, "GB/s");
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    #[cfg(feature = "mpi")]
    for processes in [2, 4] {
        mpi_allreduce::launch(processes)?;
    }
    Ok(())
}

/// The adapter index of a GPU device.
fn adapter(d: &Device) -> usize {
    match d {
        Device::Gpu(ctx) => ctx.adapter_index(),
        _ => 0,
    }
}
