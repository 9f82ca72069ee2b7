//! tiny_gpt, split over several devices: every adapter found, or 4 virtual devices on the one
//! adapter this machine has (or 4 Cpu devices with `--cpu`, or when there is no adapter).
//!
//! It prints the plan (every layer's split, with its reason, and the memory per device), trains
//! the model on 3-digit addition with the Keras-style `fit`, grades it on sums it never saw, and
//! prints `verify`'s report: the same model trained on one device from the same weights, compared
//! tensor by tensor.
//!
//! `cargo run --release --example tensor_parallel` (`-- --steps N`, `--devices N`, `--cpu`)

use weft::nn::optim::{Adam, LearningRate};
use weft::nn::{FitOptions, Loss};
use weft::parallel::{AutoConfig, DeviceMesh, ShardedModel, verify};
use weft::prelude::*;

#[path = "common/addition.rs"]
mod addition;
use addition::{CHARS, encode, held_out, sample};

#[path = "common/answer_gpt.rs"]
mod answer_gpt;
use answer_gpt::gpt;

/// `n` lines: inputs are the first 11 characters, targets the 4 answer characters.
fn data(n: usize, seed: u64, held: bool) -> Result<(Tensor, Tensor)> {
    let key = weft::core::rng::seed_key(seed);
    let (mut x, mut y) = (Vec::with_capacity(n * 11), Vec::with_capacity(n * 4));
    for j in 0..n as u32 {
        let mut i = (weft::core::rng::uniform(key, j) * 1_000_000.0) as u32 % 1_000_000;
        while held_out(i) != held {
            i = (i + 1) % 1_000_000;
        }
        let t = encode(&sample(i));
        x.extend_from_slice(&t[..11]);
        y.extend_from_slice(&t[8..]);
    }
    Ok((Tensor::from_vec(x, &[n, 11], &Device::Cpu)?, Tensor::from_vec(y, &[n, 4], &Device::Cpu)?))
}

/// Exact match on held-out sums, decoding the answer one character at a time.
fn accuracy(model: &mut ShardedModel, x: &Tensor, y: &Tensor) -> Result<f32> {
    let n = x.dims()[0];
    let mut seq = x.to_vec::<u32>()?;
    for row in seq.chunks_mut(11) {
        row[8..].fill(0); // the answer is unknown; causal attention never looks ahead anyway
    }
    for k in 0..4 {
        let logits = model.predict(&Tensor::from_slice(&seq, &[n, 11], &Device::Cpu)?, 256)?;
        let next = logits.narrow(1, k, 1)?.argmax(-1, false)?.to_vec::<u32>()?;
        for (row, c) in seq.chunks_mut(11).zip(next) {
            if k < 3 {
                row[8 + k] = c;
            } else {
                row[10] = row[10] * 100 + c; // keep the fourth character beside the third
            }
        }
    }
    let want = y.to_vec::<u32>()?;
    let right = seq
        .chunks(11)
        .zip(want.chunks(4))
        .filter(|(s, w)| s[8] == w[0] && s[9] == w[1] && s[10] / 100 == w[2] && s[10] % 100 == w[3])
        .count();
    Ok(right as f32 / n as f32)
}

/// The mesh, and whether its devices are software (lavapipe: a correctness platform, slow).
fn mesh(args: &[String]) -> Result<(DeviceMesh, bool)> {
    let flag = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let n: usize = flag("--devices").map_or(Ok(4), |s| s.parse()).map_err(|e| Error::Msg(format!("--devices: {e}")))?;
    if args.iter().any(|a| a == "--cpu") {
        return Ok((DeviceMesh::cpus(n)?, false));
    }
    let software = weft::devices().iter().all(|a| a.is_software);
    match DeviceMesh::gpus() {
        Ok(m) if m.len() > 1 => Ok((m, software)),
        Ok(_) => Ok((DeviceMesh::virtual_gpus(n)?, software)),
        Err(e) => {
            eprintln!("no GPU adapter ({e}): splitting over {n} Cpu devices instead");
            Ok((DeviceMesh::cpus(n)?, false))
        }
    }
}

/// With `--mpi` (built with `--features mpi`, run under `mpirun -np P`): one rank per process,
/// the model axis across the processes, each on the Cpu (`--cpu`) or its best GPU. The MPI
/// environment is returned to be kept alive until the end of `main`.
#[cfg(feature = "mpi")]
fn mpi_mesh(args: &[String]) -> Result<(DeviceMesh, bool, weft::parallel::mpi::Mpi)> {
    let mpi = weft::parallel::mpi::Mpi::init()?;
    let cpu = args.iter().any(|a| a == "--cpu") || weft::devices().is_empty();
    let dev = if cpu { Device::Cpu } else { Device::best_gpu()? };
    let software = !cpu && weft::devices().iter().all(|a| a.is_software);
    let mesh = DeviceMesh::across_processes(&mpi.procs(), vec![dev], &[mpi.size()], &["model"])?;
    Ok((mesh, software, mpi))
}

fn main() -> Result<()> {
    assert_eq!(answer_gpt::VOCAB, CHARS.len(), "the model's vocabulary is the task's alphabet");
    let args: Vec<String> = std::env::args().collect();
    #[cfg(feature = "mpi")]
    let (mesh, software, _mpi) = if args.iter().any(|a| a == "--mpi") {
        let (m, s, mpi) = mpi_mesh(&args)?;
        (m, s, Some(mpi))
    } else {
        let (m, s) = mesh(&args)?;
        (m, s, None)
    };
    #[cfg(not(feature = "mpi"))]
    let (mesh, software) = if args.iter().any(|a| a == "--mpi") {
        return Err(Error::Msg(
            "--mpi needs the mpi feature: cargo build --release --features mpi --example tensor_parallel".into(),
        ));
    } else {
        mesh(&args)?
    };
    // Under MPI every process runs this; only the first prints.
    let lead = mesh.process() == 0;
    macro_rules! say {
        ($($t:tt)*) => { if lead { println!($($t)*); } };
    }
    let steps: usize = match args.iter().position(|a| a == "--steps").and_then(|i| args.get(i + 1)) {
        Some(s) => s.parse().map_err(|e| Error::Msg(format!("--steps {s}: {e}")))?,
        None if software => 20,
        None => 600,
    };
    // Every process must train the same number of steps: without `--steps`, each chose by its own
    // adapter, so all take the smallest choice.
    #[cfg(feature = "mpi")]
    let steps = match &_mpi {
        Some(mpi) => !mpi.procs().max_u64("tensor_parallel: --steps", &[!(steps as u64)])?[0] as usize,
        None => steps,
    };
    let batch = 128;
    say!("devices: {}\n", mesh.describe());
    if software && steps < 100 {
        say!("(a software adapter: training {steps} steps only, too few to learn addition; `--cpu` trains 600)\n");
    }

    let plan =
        AutoConfig::new().min_params(0).input_dtype(DType::U32).plan(&gpt(), &[batch, 11], mesh.size("model"), 1)?;
    say!("{plan}");

    let mut model = ShardedModel::new(gpt, &mesh, &plan)?;
    let loss = Loss::SparseCategoricalCrossentropy { from_logits: true };
    let schedule = LearningRate::CosineDecay {
        initial: 0.0,
        peak: 3e-3,
        warmup_steps: 100,
        decay_steps: steps as u64,
        alpha: 0.05,
    };
    model.compile(Adam::new(schedule.clone()).clip_global_norm(1.0), loss.clone(), &[])?;
    let (x, y) = data(steps * batch, 1, false)?;
    let start = std::time::Instant::now();
    let epochs = 1;
    let history = model.fit(
        &x,
        &y,
        FitOptions { epochs, batch_size: batch, shuffle: false, verbose: true, ..Default::default() },
    )?;
    say!(
        "trained {steps} steps of {batch} in {:.1}s: mean loss {:.4}",
        start.elapsed().as_secs_f32(),
        history.loss[epochs - 1]
    );
    let (hx, hy) = data(500, 2, true)?;
    // Every process predicts (a collective); the first prints.
    let held = accuracy(&mut model, &hx, &hy)?;
    say!("exact match on 500 held-out sums: {:.1}%\n", 100.0 * held);

    say!("verify: 3 steps on one device ({}) and sharded, from the same weights", mesh.devices()[0].describe());
    let (vx, vy) = data(16, 3, false)?;
    let vplan =
        AutoConfig::new().min_params(0).input_dtype(DType::U32).plan(&gpt(), &[16, 11], mesh.size("model"), 1)?;
    let report = verify(gpt, &mesh, &vplan, Adam::new(schedule).clip_global_norm(1.0), loss, (&vx, &vy), 3)?;
    say!("{report}");
    Ok(())
}
