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
    let dev = Device::Cpu;
    for shape in shapes.split(',').filter(|s| !s.is_empty()) {
        let (batch, widths) = parse(shape)?;
        let mut model = common::mlp_of(&dev, &widths)?;
        let x = Tensor::rand(0.0, 1.0, &[batch, widths[0]], 1, &dev)?;
        let classes = widths[widths.len() - 1];
        let labels: Vec<u32> = (0..batch).map(|i| (i * 7 % classes) as u32).collect();
        let y = Tensor::from_vec(labels, &[batch], &dev)?;
        let size = format!("b{batch}/{}", &shape[shape.find(':').map_or(0, |i| i + 1)..]);
        let rate = common::median_block_rate(&dev, secs, 5, || model.train_on_batch(&x, &y).map(drop))?;
        common::report("mlp_shape_train", &dev, &size, rate, "steps/s");
        let rate = common::median_block_rate(&dev, secs, 5, || model.predict(&x, batch)?.to_vec::<f32>().map(drop))?;
        common::report("mlp_shape_infer", &dev, &size, rate * batch as f64, "samples/s");
    }
    Ok(())
}
