//! The MPI part of the allreduce bench: the bench runs itself under `mpirun`, and each process
//! of that job measures, interleaved on the same buffers, weft's `MpiComm::all_reduce` and Open
//! MPI's own `MPI_Allreduce` (1 to 64 MiB), then, on 2 processes, a tiny_gpt training step split
//! over the processes' model axis and the share of it spent in collectives. Process 0 prints.

use mpi::collective::SystemOperation;
use mpi::traits::*;
use std::process::Command;
use std::time::Instant;
use weft::core::Collectives;
use weft::nn::Loss;
use weft::nn::optim::Adam;
use weft::parallel::mpi::Mpi;
use weft::parallel::{AutoConfig, DeviceMesh, ShardedModel};
use weft::prelude::*;

#[path = "../../examples/common/answer_gpt.rs"]
mod answer_gpt;

/// Whether this process was started by mpirun.
pub fn in_job() -> bool {
    std::env::var_os("OMPI_COMM_WORLD_SIZE").is_some() || std::env::var_os("PMI_SIZE").is_some()
}

/// Run this bench's binary under `mpirun -np processes`, its lines passed through. Without
/// mpirun, one JSON line says the MPI figures were skipped.
pub fn launch(processes: usize) -> Result<()> {
    let exe = std::env::current_exe().map_err(|e| Error::Msg(format!("allreduce bench: {e}")))?;
    let status = Command::new("mpirun")
        .args(["--oversubscribe", "--allow-run-as-root", "--bind-to", "none", "-np", &processes.to_string()])
        .arg(exe)
        // Containers often forbid the cross-memory attach Open MPI's shared memory uses.
        .env("OMPI_MCA_btl_vader_single_copy_mechanism", "none")
        .status();
    match status {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => Err(Error::Msg(format!("allreduce bench: mpirun -np {processes} ended with {s}"))),
        Err(e) => {
            println!("{{\"bench\":\"allreduce/mpi\",\"skipped\":\"mpirun cannot start: {e}\"}}");
            Ok(())
        }
    }
}

/// One process of the job.
pub fn process() -> Result<()> {
    let mpi = Mpi::init()?;
    bandwidth(&mpi)?;
    if mpi.size() == 2 {
        tiny_gpt_step(&mpi)?;
    }
    Ok(())
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// weft's all-reduce against `MPI_Allreduce`, in alternating rounds on the same data.
fn bandwidth(mpi: &Mpi) -> Result<()> {
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
            // The first round warms both up.
            if round > 0 {
                ours.push(a);
                theirs.push(b);
            }
        }
        let (a, b) = (median(&mut ours), median(&mut theirs));
        let gbs = |s: f64| (n * 4) as f64 / s / 1e9;
        if comm.rank() == 0 {
            println!(
                "{{\"bench\":\"allreduce/mpi\",\"processes\":{},\"size\":\"{mib} MiB\",\"weft_gb_s\":{:.3},\"mpi_allreduce_gb_s\":{:.3},\"weft_over_mpi\":{:.3}}}",
                comm.world_size(),
                gbs(a),
                gbs(b),
                b / a
            );
        }
    }
    Ok(())
}

/// tiny_gpt (the tensor_parallel example's model) split over the processes' model axis, one Cpu
/// device each: milliseconds per training step, and the share each rank spends in collectives.
fn tiny_gpt_step(mpi: &Mpi) -> Result<()> {
    let p = mpi.size();
    let mesh = DeviceMesh::across_processes(&mpi.procs(), vec![Device::Cpu], &[p], &["model"])?;
    let n = 128;
    let plan = AutoConfig::new().min_params(0).input_dtype(DType::U32).plan(&answer_gpt::gpt(), &[n, 11], p, 1)?;
    let mut model = ShardedModel::new(answer_gpt::gpt, &mesh, &plan)?;
    model.compile(Adam::new(1e-3), Loss::SparseCategoricalCrossentropy { from_logits: true }, &[])?;
    // Tokens and answer digits of the example's shapes (11 in, 4 out); their values do not
    // change the time.
    let x: Vec<u32> = (0..n * 11).map(|i| (i * 7 + 3) as u32 % answer_gpt::VOCAB as u32).collect();
    let y: Vec<u32> = (0..n * 4).map(|i| (i * 3 + 1) as u32 % 10).collect();
    let (x, y) = (Tensor::from_vec(x, &[n, 11], &Device::Cpu)?, Tensor::from_vec(y, &[n, 4], &Device::Cpu)?);
    for _ in 0..2 {
        model.train_on_batch(&x, &y)?;
    }
    let (mut steps, mut shares) = (Vec::new(), Vec::new());
    for _ in 0..6 {
        let (t, c0) = (Instant::now(), model.collective_time());
        model.train_on_batch(&x, &y)?;
        let step = t.elapsed().as_secs_f64();
        steps.push(step);
        shares.push((model.collective_time() - c0).as_secs_f64() / step);
    }
    if mpi.rank() == 0 {
        println!(
            "{{\"bench\":\"allreduce/mpi_tiny_gpt_step\",\"processes\":{p},\"size\":\"batch {n}\",\"ms_per_step\":{:.3},\"collective_share\":{:.3}}}",
            median(&mut steps) * 1e3,
            median(&mut shares)
        );
    }
    Ok(())
}
