//! All-reduce bandwidth of weft's MPI communicator against Open MPI's own `MPI_Allreduce` on the
//! same buffers, interleaved in one run; process 0 prints one JSON line per size.
//!
//! ```text
//! cargo build --release --workspace --features weft/mpi --example mpi_allreduce
//! mpirun -np 2 target/release/examples/mpi_allreduce
//! ```

use mpi::collective::SystemOperation;
use mpi::traits::*;
use std::time::Instant;
use weft_core::{Collectives, Device, ReduceKind, Result, Tensor};
use weft_parallel::mpi::Mpi;

fn main() -> Result<()> {
    let mpi = Mpi::init()?;
    let comm = mpi.world()?;
    // rsmpi's world communicator, for the reference.
    let world = mpi::topology::SimpleCommunicator::world();
    for mib in [1usize, 4, 16, 64] {
        let n = mib << 18;
        let x = Tensor::rand(-1.0, 1.0, &[n], comm.rank() as u64, &Device::Cpu)?;
        let send = x.to_vec::<f32>()?;
        let mut recv = vec![0f32; n];
        let reps = (256 / mib).clamp(3, 64);
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        for round in 0..5 {
            let t = Instant::now();
            for _ in 0..reps {
                comm.all_reduce(&x, ReduceKind::Sum)?;
            }
            let a = t.elapsed().as_secs_f64() / reps as f64;
            let t = Instant::now();
            for _ in 0..reps {
                world.all_reduce_into(&send[..], &mut recv[..], SystemOperation::sum());
            }
            let b = t.elapsed().as_secs_f64() / reps as f64;
            if round > 0 {
                ours.push(a);
                theirs.push(b);
            }
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(|a, b| a.total_cmp(b));
            v[v.len() / 2]
        };
        let (a, b) = (median(&mut ours), median(&mut theirs));
        let gbs = |s: f64| (n * 4) as f64 / s / 1e9;
        if comm.rank() == 0 {
            println!(
                "{{\"bench\":\"mpi_all_reduce\",\"processes\":{},\"size_mib\":{mib},\"weft_gb_s\":{:.3},\"mpi_allreduce_gb_s\":{:.3},\"weft_over_mpi\":{:.3}}}",
                comm.world_size(),
                gbs(a),
                gbs(b),
                b / a
            );
        }
    }
    Ok(())
}
