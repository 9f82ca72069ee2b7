//! MLPs of other sizes than the peers' one (ReLU, softmax cross-entropy on logits, Adam 1e-3,
//! random data) on the Cpu: training steps/s and inference samples/s of each, measured as the
//! peer kit measures (`common::median_block_rate`), for `benches/peers/mlp_shapes_side.sh`,
//! which sets them beside a `jax.jit` step of the same shapes.
//! `cargo bench --bench mlp_shapes`
//!
//! Why: one shape hides whole classes. Small batches and narrow layers put Adam's pass, the
//! per-op overhead and the few-row products first where the peers' 256 x 1024 shape puts the
//! large products first (Adam's moments decaying into subnormals showed only there: 0.56 of
//! `jax.jit` at batch 32). `WEFT_MLP_SHAPES` lists the shapes as `batch:in-hidden-..-classes`,
//! comma-separated; `WEFT_MLP_SECS` (default 1) is each figure's measuring time.
//!
//! `WEFT_BENCH_DEVICES` (e.g. `gpu:0`) measures other devices instead; on a GPU each shape also
//! reports `mlp_shape_train_host`, the calling thread's CPU time per training step in µs: the
//! host's cost of recording and submitting the step, which a real GPU pays as lavapipe does and
//! which bounds a small model's step there (`WEFT_BENCH_DEVICES=gpu:0
//! WEFT_MLP_SHAPES=8:8-8-2,32:32-64-64-2 cargo bench --bench mlp_shapes`).

mod common;

use weft::prelude::*;

/// The shapes measured unless `WEFT_MLP_SHAPES` says otherwise.
const SHAPES: &str = "32:784-256-10,64:784-512-512-10,128:784-256-256-10,256:784-1024-1024-10,\
                      1024:784-512-512-10,32:784-1024-1024-10,256:64-64-64-10,32:32-64-64-2";

/// `batch:w0-w1-..` as the batch and the widths; an `Err` naming the shape otherwise.
fn parse(shape: &str) -> Result<(usize, Vec<usize>)> {
    let bad = || Error::invalid("WEFT_MLP_SHAPES", format!("{shape:?} is not batch:in-hidden-..-classes"));
    let (b, w) = shape.split_once(':').ok_or_else(bad)?;
    let widths: Vec<usize> = w.split('-').map(|s| s.parse().map_err(|_| bad())).collect::<Result<_>>()?;
    let batch = b.parse().map_err(|_| bad())?;
    if batch == 0 || widths.len() < 2 || widths.contains(&0) {
        return Err(bad());
    }
    Ok((batch, widths))
}

fn main() -> Result<()> {
    weft::set_num_threads(0)?;
    let shapes = std::env::var("WEFT_MLP_SHAPES").unwrap_or_else(|_| SHAPES.to_string());
    let secs: f64 = std::env::var("WEFT_MLP_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(1.0);
    // (The Cpu unless `WEFT_BENCH_DEVICES` names others: a GPU's small shapes measure its
    // per-dispatch cost, the host's share of which a real GPU pays too.)
    let devs = match std::env::var("WEFT_BENCH_DEVICES") {
        Ok(_) => common::devices(),
        Err(_) => vec![Device::Cpu],
    };
    for dev in &devs {
        for shape in shapes.split(',').filter(|s| !s.is_empty()) {
            measure(dev, shape, secs)?;
        }
    }
    Ok(())
}

/// Reports one shape's training and inference rates on `dev`.
fn measure(dev: &Device, shape: &str, secs: f64) -> Result<()> {
    let (batch, widths) = parse(shape)?;
    let mut model = common::mlp_of(dev, &widths)?;
    let x = Tensor::rand(0.0, 1.0, &[batch, widths[0]], 1, dev)?;
    let classes = widths[widths.len() - 1];
    let labels: Vec<u32> = (0..batch).map(|i| (i * 7 % classes) as u32).collect();
    let y = Tensor::from_vec(labels, &[batch], dev)?;
    let size = format!("b{batch}/{}", &shape[shape.find(':').map_or(0, |i| i + 1)..]);
    let rate = common::median_block_rate(dev, secs, 5, || model.train_on_batch(&x, &y).map(drop))?;
    common::report("mlp_shape_train", dev, &size, rate, "steps/s");
    if !matches!(dev, Device::Cpu) {
        // The host's CPU time a step (recording and submitting its work), over about a second.
        let steps = (rate as usize).clamp(10, 5000);
        dev.synchronize()?;
        if let Some(t0) = common::thread_cpu_secs() {
            for _ in 0..steps {
                model.train_on_batch(&x, &y)?;
            }
            dev.synchronize()?;
            let host = common::thread_cpu_secs().unwrap_or(t0) - t0;
            common::report("mlp_shape_train_host", dev, &size, 1e6 * host / steps as f64, "us/step");
        }
    }
    let rate = common::median_block_rate(dev, secs, 5, || model.predict(&x, batch)?.to_vec::<f32>().map(drop))?;
    common::report("mlp_shape_infer", dev, &size, rate * batch as f64, "samples/s");
    Ok(())
}
