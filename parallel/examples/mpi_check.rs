//! weft's collectives across processes, checked by every process against values it works out
//! alone. Run under MPI (the tests in `tests/mpi.rs` do):
//!
//! ```text
//! cargo build -p weft-parallel --features mpi --example mpi_check
//! mpirun -np 4 target/debug/examples/mpi_check collectives
//! ```
//!
//! Modes: `collectives` (every collective, uneven sizes), `hier` (the same over groups of 2 ranks
//! in each process), `fail` (process 1 fails; the others
//! must leave their collective with its reason), `mismatch` (processes that call different
//! collectives or pass different shapes must all get an `Err` naming what differs), `kill`
//! (process 1 is killed outright mid-run; mpirun must end the job), `train LAYOUT` (a tied-embedding
//! language model sharded over the processes trains 20 steps as on one device, through `verify`:
//! LAYOUT `model` (one device per process, model axis across them), `data` (data axis across
//! them), `2x2` (2 processes of 2 devices: model axis inside a process, data axis across), or
//! `model4` / `data4` (2 devices per process, one axis over all of them)),
//! `checkpoint [L]` (with L devices per process, default 1: a checkpoint saved by the model split over the processes' model axis loads into
//! one device and into the data-axis layout, weights and optimizer state), `fail_train` (process
//! 1 is given a label outside the vocabulary: every process's `train_on_batch` returns `Err`),
//! `bad_layouts` (a mesh larger than the job, processes that disagree on the mesh or the plan: all
//! refused on every process before any step, naming what differs), `local_errors` (checks that
//! fail on process 1 alone, outside any collective: every process gets `Err`, none hangs),
//! `early_exit` (process 1 returns while process 0 goes on: process 0 gets `Err`, no hang),
//! `exit_while_waiting` (process 1 returns while process 0 waits in a collective of another
//! communicator: process 0 gets `Err` once process 1's grace period ends).

#[path = "../tests/common/lm.rs"]
mod lm;
use lm::lm;
use weft_core::{Collectives, DType, Device, Error, ReduceKind, Result, Tensor};
use weft_nn::checkpoint::Index;
use weft_nn::optim::{Adam, AdamW, LearningRate};
use weft_nn::{Loss, Model};
use weft_parallel::mpi::{Hier, Mpi, MpiComm};
use weft_parallel::{AutoConfig, DeviceMesh, InHost, ShardedModel, ShardingPlan, World, verify};

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
        "hier" => hier(&mpi),
        "fail" => fail(&mpi),
        "mismatch" => mismatch(&mpi),
        "kill" => kill(&mpi),
        "train" => train(&mpi, &std::env::args().nth(2).unwrap_or_else(|| "model".into())),
        "checkpoint" => checkpoint(&mpi, std::env::args().nth(2).map_or(Ok(1), |l| l.parse()).unwrap_or(1)),
        "fail_train" => fail_train(&mpi),
        "bad_layouts" => bad_layouts(&mpi),
        "local_errors" => local_errors(&mpi),
        "early_exit" => early_exit(&mpi),
        "exit_while_waiting" => exit_while_waiting(&mpi),
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
    check_all(&comm)?;
    let (r, p) = (comm.rank(), comm.world_size());
    // Groups made by split: even and odd ranks.
    let half = mpi.split(r % 2, r)?;
    let members: Vec<usize> = (0..p).filter(|q| q % 2 == r % 2).collect();
    let x = Tensor::full(r as f32, &[2], &Device::Cpu)?;
    let sum: usize = members.iter().sum();
    check("split all_reduce", &half.all_reduce(&x, ReduceKind::Sum)?.to_vec()?, &[sum as f32; 2])?;
    Ok(())
}

/// A group of 2 ranks in each process (threads of an in-host group, and per position an MPI
/// communicator across the processes) passes the same checks as one rank per process.
fn hier(mpi: &Mpi) -> Result<()> {
    let k = 2;
    let local = InHost::group(k, &World::new());
    let cross: Vec<MpiComm> = (0..k).map(|_| mpi.split(0, mpi.rank())).collect::<Result<_>>()?;
    let groups: Vec<Hier> = local.into_iter().zip(cross).map(|(l, c)| Hier::new(l, c)).collect();
    std::thread::scope(|s| {
        let runs: Vec<_> = groups.iter().map(|g| s.spawn(move || check_all(g))).collect();
        runs.into_iter().try_for_each(|h| h.join().unwrap_or_else(|_| Err(Error::Msg("a rank panicked".into()))))
    })
}

/// Every collective of `comm`, checked against values each rank works out alone.
fn check_all(comm: &dyn Collectives) -> Result<()> {
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
    check("broadcast from 1", &comm.broadcast(&x, 1)?.to_vec()?, &[1.0; 5])?;
    comm.barrier()
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

/// The language model sharded over the processes (and their devices) trains 20 AdamW steps
/// (cosine schedule with warm-up, global-norm clipping, vocabulary-parallel loss), each on a fresh
/// batch, as it does on one device: `verify` runs both in every process and compares losses,
/// outputs, gradients, weights and optimizer state.
fn train(mpi: &Mpi, layout: &str) -> Result<()> {
    let p = mpi.size();
    let (local, shape, names): (usize, Vec<usize>, Vec<&str>) = match layout {
        "model" => (1, vec![p], vec!["model"]),
        "data" => (1, vec![p], vec!["data"]),
        "2x2" => (2, vec![p, 2], vec!["data", "model"]),
        // 2 devices per process on one axis: every group has 2 ranks in each process.
        "model4" => (2, vec![2 * p], vec!["model"]),
        "data4" => (2, vec![2 * p], vec!["data"]),
        other => return Err(Error::Msg(format!("unknown layout {other:?}"))),
    };
    let mesh = DeviceMesh::across_processes(&mpi.procs(), vec![Device::Cpu; local], &shape, &names)?;
    let (x, y) = tokens()?;
    let report = verify(lm, &mesh, &lm_plan(&mesh)?, adam(), LOSS, (&x, &y), 20)?;
    if mpi.rank() == 0 {
        println!("{}: largest relative difference {:.2e}", mesh.describe(), report.max_rel());
    }
    // A NaN difference fails too (it is not below the bound).
    let close = report.max_rel() < 1e-4;
    if !close || report.losses.last().map(|l| l.0) >= report.losses.first().map(|l| l.0) {
        return Err(Error::Msg(format!("{layout}: sharded training differs from one device:\n{report}")));
    }
    Ok(())
}

const LOSS: Loss = Loss::SparseCategoricalCrossentropy { from_logits: true };

fn tokens() -> Result<(Tensor, Tensor)> {
    let ids: Vec<u32> = (0..32 * 6).map(|i| (i * 7 + 3) % 13).collect();
    let x = Tensor::from_vec(ids.clone(), &[32, 6], &Device::Cpu)?;
    let y = Tensor::from_vec(ids.iter().map(|i| (i + 1) % 13).collect(), &[32, 6], &Device::Cpu)?;
    Ok((x, y))
}

fn lm_plan(mesh: &DeviceMesh) -> Result<ShardingPlan> {
    AutoConfig::new().min_params(0).input_dtype(DType::U32).plan(&lm(), &[8, 6], mesh.size("model"), mesh.size("data"))
}

/// AdamW (decoupled weight decay) on a cosine schedule with warm-up, clipped by global norm.
fn adam() -> Adam {
    let schedule = LearningRate::CosineDecay { initial: 0.0, peak: 1e-2, warmup_steps: 5, decay_steps: 20, alpha: 0.1 };
    AdamW::new(schedule).weight_decay(0.01).clip_global_norm(0.5)
}

/// Largest absolute difference between two states, by name; `Err` if the names differ.
fn state_diff(a: &[(String, Tensor)], b: &[(String, Tensor)]) -> Result<f32> {
    let mut worst = 0f32;
    for (k, t) in a {
        let (_, u) = b.iter().find(|(n, _)| n == k).ok_or_else(|| Error::Msg(format!("{k} is missing")))?;
        let (t, u) = (t.to_vec::<f32>()?, u.to_vec::<f32>()?);
        if t.len() != u.len() {
            return Err(Error::Msg(format!("{k}: {} values against {}", t.len(), u.len())));
        }
        worst = t.iter().zip(&u).map(|(p, q)| (p - q).abs()).fold(worst, f32::max);
    }
    if a.len() != b.len() {
        return Err(Error::Msg(format!("{} tensors against {}", a.len(), b.len())));
    }
    Ok(worst)
}

/// Train 3 steps split over the processes' model axis, save a checkpoint, and load it into one
/// device and into the data-axis layout: weights, optimizer slots and step counts all arrive.
fn checkpoint(mpi: &Mpi, local: usize) -> Result<()> {
    let world = mpi.world()?;
    // One file name for every process: process 0's pid, broadcast.
    let pid = world.broadcast(&Tensor::full(std::process::id() as f32, &[1], &Device::Cpu)?, 0)?.to_vec::<f32>()?[0];
    let path = std::env::temp_dir().join(format!("weft-mpi-check-{pid}.safetensors"));
    let (x, y) = tokens()?;
    let p = mpi.size();
    let by_model = DeviceMesh::across_processes(&mpi.procs(), vec![Device::Cpu; local], &[p * local], &["model"])?;
    let mut a = ShardedModel::new(lm, &by_model, &lm_plan(&by_model)?)?;
    a.compile(adam(), LOSS, &[])?;
    for step in 0..3 {
        a.train_on_batch(&x.narrow(0, step * 8, 8)?, &y.narrow(0, step * 8, 8)?)?;
    }
    a.save_checkpoint(&path)?;
    let saved = a.full_state()?;
    world.barrier()?;
    // An index at the path, and a part file of this process's own beside it.
    let first = Index::read(&path)?.ok_or_else(|| Error::Msg("save_checkpoint wrote no index".into()))?;
    let own = Index::part_file_name(&path, &first.save_id, mpi.rank(), p);
    if !first.files().contains(&own) || !path.with_file_name(&own).exists() {
        return Err(Error::Msg(format!("process {} wrote no part file {own}: {:?}", mpi.rank(), first.files())));
    }
    // Into one device.
    let mut one = Model::new(lm(), &Device::Cpu);
    one.compile(adam(), LOSS, &[])?;
    one.build_for(x.narrow(0, 0, 1)?)?;
    one.load_checkpoint(&path)?;
    let d1 = state_diff(&saved, &one.whole_state(true)?)?;
    // Into the data-axis layout over the same processes.
    let by_data = DeviceMesh::across_processes(&mpi.procs(), vec![Device::Cpu; local], &[p * local], &["data"])?;
    let mut b = ShardedModel::new(lm, &by_data, &lm_plan(&by_data)?)?;
    b.compile(adam(), LOSS, &[])?;
    b.load_checkpoint(&path)?;
    let d2 = state_diff(&saved, &b.full_state()?)?;
    let iterations = b.ranks()[0].optimizer().map(|o| o.iterations());
    // The data layout trains on and saves over the first save: its parts replace the first's,
    // whose files are gone once the new index is in place.
    b.train_on_batch(&x.narrow(0, 24, 8)?, &y.narrow(0, 24, 8)?)?;
    b.save_checkpoint(&path)?;
    let resaved = b.full_state()?;
    world.barrier()?;
    let second = Index::read(&path)?.ok_or_else(|| Error::Msg("the second save wrote no index".into()))?;
    let left: Vec<String> = first.files().into_iter().filter(|f| path.with_file_name(f).exists()).collect();
    let mut again = Model::new(lm(), &Device::Cpu);
    again.compile(adam(), LOSS, &[])?;
    again.build_for(x.narrow(0, 0, 1)?)?;
    again.load_checkpoint(&path)?;
    let d3 = state_diff(&resaved, &again.whole_state(true)?)?;
    world.barrier()?;
    if mpi.rank() == 0 {
        for f in second.files() {
            let _ = std::fs::remove_file(path.with_file_name(f));
        }
        let _ = std::fs::remove_file(&path);
    }
    if d1 > 0.0 || d2 > 0.0 || d3 > 0.0 || iterations != Some(3) || !left.is_empty() || second.files().len() != p {
        return Err(Error::Msg(format!(
            "checkpoint: one device differs by {d1}, the data layout by {d2}, its own save by {d3}; iterations {iterations:?}; files of the first save left: {left:?}; files of the second: {:?}",
            second.files()
        )));
    }
    Ok(())
}

/// Process 1's batch has a label outside the vocabulary: its rank refuses the batch before the
/// step, and every other process, waiting for it in a collective, gets `Err` naming process 1.
fn fail_train(mpi: &Mpi) -> Result<()> {
    let (x, y) = tokens()?;
    let mesh = DeviceMesh::across_processes(&mpi.procs(), vec![Device::Cpu], &[mpi.size()], &["model"])?;
    let mut model = ShardedModel::new(lm, &mesh, &lm_plan(&mesh)?)?;
    model.compile(adam(), LOSS, &[])?;
    let mut labels = y.narrow(0, 0, 8)?.to_vec::<u32>()?;
    if mpi.rank() == 1 {
        labels[5] = 99;
    }
    let labels = Tensor::from_vec(labels, &[8, 6], &Device::Cpu)?;
    match model.train_on_batch(&x.narrow(0, 0, 8)?, &labels) {
        Err(e) if mpi.rank() == 1 || e.to_string().contains("process 1 failed") => {
            println!("process {}: train_on_batch: {e}", mpi.rank());
            Ok(())
        }
        other => Err(Error::Msg(format!("wanted an Err naming process 1, got {other:?}"))),
    }
}

fn expect_refusal<T>(what: &str, r: Result<T>, words: &str) -> Result<()> {
    match r {
        Err(e) if e.to_string().contains(words) => Ok(()),
        Err(e) => Err(Error::Msg(format!("{what}: the error does not say {words:?}: {e}"))),
        Ok(_) => Err(Error::Msg(format!("{what}: accepted"))),
    }
}

/// Layouts that cannot work are refused on every process, before any step.
fn bad_layouts(mpi: &Mpi) -> Result<()> {
    let (p, r) = (mpi.size(), mpi.rank());
    let procs = mpi.procs();
    let cpu = || vec![Device::Cpu];
    // A mesh larger than the job.
    expect_refusal("too large", DeviceMesh::across_processes(&procs, cpu(), &[2 * p], &["model"]), "do not fill")?;
    // Processes that disagree on the mesh's shape, or on how many devices they bring.
    let shape: &[usize] = if r == 0 { &[p, 1] } else { &[1, p] };
    expect_refusal("shapes", DeviceMesh::across_processes(&procs, cpu(), shape, &["data", "model"]), "the mesh shape")?;
    let local = if r == 0 { vec![Device::Cpu; 2] } else { cpu() };
    expect_refusal("devices", DeviceMesh::across_processes(&procs, local, &[p], &["model"]), "devices per process")?;
    // A group that would mix: 3 devices per process and a model axis of 2, so the model group
    // of ranks 2 and 3 has them on two processes at different local indices.
    if p == 2 {
        expect_refusal(
            "mixed group",
            DeviceMesh::across_processes(&procs, vec![Device::Cpu; 3], &[3, 2], &["data", "model"]),
            "must lie inside one process",
        )?;
    }
    // Processes that disagree on the plan.
    let mesh = DeviceMesh::across_processes(&procs, cpu(), &[p], &["model"])?;
    let mut plan = lm_plan(&mesh)?;
    if r == 1 {
        plan = AutoConfig::new().min_params(1 << 30).input_dtype(DType::U32).plan(&lm(), &[8, 6], p, 1)?;
    }
    expect_refusal("plans", ShardedModel::new(lm, &mesh, &plan), "disagree on the sharding plan")?;
    // After all of that, a good layout still trains.
    let mut model = ShardedModel::new(lm, &mesh, &lm_plan(&mesh)?)?;
    model.compile(adam(), LOSS, &[])?;
    let (x, y) = tokens()?;
    model.train_on_batch(&x.narrow(0, 0, 8)?, &y.narrow(0, 0, 8)?).map(drop)
}

/// `r` is an `Err`: this process's own (on the process that failed) or one naming process 1.
fn refused_by_1<T>(mpi: &Mpi, what: &str, r: Result<T>, own: &str) -> Result<()> {
    match r {
        Err(e) if mpi.rank() == 1 && e.to_string().contains(own) => Ok(()),
        Err(e) if mpi.rank() != 1 && e.to_string().contains("process 1 failed") => Ok(()),
        Err(e) => Err(Error::Msg(format!("{what}: an error that does not say why: {e}"))),
        Ok(_) => Err(Error::Msg(format!("{what}: accepted"))),
    }
}

/// Errors found by process 1 alone, before anything collective: each reaches every process,
/// and (being found before any rank started) leaves the model usable.
fn local_errors(mpi: &Mpi) -> Result<()> {
    let (p, r) = (mpi.size(), mpi.rank());
    let mesh = DeviceMesh::across_processes(&mpi.procs(), vec![Device::Cpu], &[p], &["model"])?;
    // A plan for another mesh, on process 1 only.
    let bad = if r == 1 {
        AutoConfig::new().min_params(0).input_dtype(DType::U32).plan(&lm(), &[8, 6], 1, 1)?
    } else {
        lm_plan(&mesh)?
    };
    refused_by_1(mpi, "a plan for another mesh", ShardedModel::new(lm, &mesh, &bad), "the plan is for")?;
    let mut model = ShardedModel::new(lm, &mesh, &lm_plan(&mesh)?)?;
    model.compile(adam(), LOSS, &[])?;
    let (x, y) = tokens()?;
    // A checkpoint only process 1 cannot read (one name for the others: process 0's pid).
    let pid = mpi.procs().max_u64("the file's name", &[if r == 0 { std::process::id() as u64 } else { 0 }])?[0];
    let path = if r == 1 {
        std::path::PathBuf::from("/nonexistent/weft.safetensors")
    } else {
        std::env::temp_dir().join(format!("weft-local-{pid}.safetensors"))
    };
    if r == 0 {
        let one = Model::new(lm(), &Device::Cpu);
        one.build_for(x.narrow(0, 0, 1)?)?;
        one.save_weights(&path)?;
    }
    mpi.procs().agree("the file is written", &[])?;
    refused_by_1(mpi, "an unreadable checkpoint", model.load_checkpoint(&path), "/nonexistent")?;
    let _ = std::fs::remove_file(&path);
    // A batch whose labels hold fewer samples than its inputs, on process 1 only.
    let rows = if r == 1 { 7 } else { 8 };
    refused_by_1(
        mpi,
        "a ragged batch",
        model.train_on_batch(&x.narrow(0, 0, 8)?, &y.narrow(0, 0, rows)?),
        "different numbers of samples",
    )?;
    // None of that changed anything: the model still trains.
    model.train_on_batch(&x.narrow(0, 0, 8)?, &y.narrow(0, 0, 8)?)?;
    // A communicator call refused on process 1 alone (sizes that do not split the axis).
    let comm = mpi.world()?;
    let t = Tensor::full(1.0, &[4, 2], &Device::Cpu)?;
    let sizes: Vec<usize> =
        if r == 1 { vec![1; p] } else { (0..p).map(|i| if i == 0 { 4 - (p - 1) } else { 1 }).collect() };
    refused_by_1(
        mpi,
        "reduce_scatter's sizes",
        comm.reduce_scatter(&t, 0, &sizes, ReduceKind::Sum),
        "do not split axis",
    )
}

/// Process 1 returns (its program ends, as after an error of its own) while process 0 calls on
/// the model: process 0 gets `Err` saying another process has finished, and both end.
fn early_exit(mpi: &Mpi) -> Result<()> {
    let mesh = DeviceMesh::across_processes(&mpi.procs(), vec![Device::Cpu], &[mpi.size()], &["model"])?;
    let mut model = ShardedModel::new(lm, &mesh, &lm_plan(&mesh)?)?;
    model.compile(adam(), LOSS, &[])?;
    let (x, y) = tokens()?;
    model.train_on_batch(&x.narrow(0, 0, 8)?, &y.narrow(0, 0, 8)?)?;
    if mpi.rank() == 1 {
        return Ok(());
    }
    std::thread::sleep(std::time::Duration::from_millis(200));
    match model.train_on_batch(&x.narrow(0, 8, 8)?, &y.narrow(0, 8, 8)?) {
        Err(e) if e.to_string().contains("another process has finished") => Ok(()),
        other => Err(Error::Msg(format!("wanted an Err saying process 1 finished, got {other:?}"))),
    }
}

/// Process 1 returns while process 0 waits in an all-reduce of a communicator of its own (not
/// the world one a finishing process waits on): process 1's `Mpi` waits its grace period, then
/// tells process 0, whose all-reduce returns `Err` naming it.
fn exit_while_waiting(mpi: &Mpi) -> Result<()> {
    let comm = mpi.world()?;
    if mpi.rank() == 1 {
        return Ok(());
    }
    match comm.all_reduce(&Tensor::full(1.0, &[4], &Device::Cpu)?, ReduceKind::Sum) {
        Err(e) if e.to_string().contains("process 1 failed: ended its program") => Ok(()),
        other => Err(Error::Msg(format!("wanted an Err saying process 1 ended, got {other:?}"))),
    }
}
