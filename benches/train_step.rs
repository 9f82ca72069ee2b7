//! MLP 784-1024-1024-10 (ReLU, softmax cross-entropy, Adam, batch 256, random data): training
//! steps/s and inference samples/s on every device found, and each as a share of the device's FMA
//! ceiling (`Device::fma_peak`; the products' multiply-adds only, the rest of the work is on top).
//! `cargo bench --bench train_step`
//!
//! With `WEFT_STEP_BLOCKS=SECS`, only the training step, measured as the peer kit measures its
//! peers (`common::median_block_rate`: the median of 5 blocks of steps taking at least SECS
//! seconds together): `train_step_blocks`, for `benches/peers/mlp_modes.sh`.

mod common;

use std::time::Duration;
use weft::prelude::*;

fn main() -> Result<()> {
    // The thread count a user sets (RAYON_NUM_THREADS or one per core); this thread works on
    // each op beside weft's helpers.
    weft::set_num_threads(0)?;
    // The products' FLOPs per layer of the batch; a step multiplies forward, for each weight's
    // gradient, and for the input gradient of every layer but the first; inference forward only.
    let layer: Vec<f64> = common::MLP_WIDTHS.windows(2).map(|w| (2 * 256 * w[0] * w[1]) as f64).collect();
    let forward: f64 = layer.iter().sum();
    let step_flops = forward + forward + (forward - layer[0]);
    let blocks: Option<f64> = std::env::var("WEFT_STEP_BLOCKS").ok().and_then(|s| s.parse().ok());
    for dev in common::devices() {
        let mut model = common::mlp(&dev)?;
        let x = Tensor::rand(0.0, 1.0, &[256, 784], 1, &dev)?;
        let labels: Vec<u32> = (0..256).map(|i| (i * 7 % 10) as u32).collect();
        let y = Tensor::from_vec(labels, &[256], &dev)?;
        if let Some(secs) = blocks {
            let rate = common::median_block_rate(&dev, secs, 5, || model.train_on_batch(&x, &y).map(drop))?;
            common::report("train_step_blocks", &dev, "mlp784-1024-1024-10/b256", rate, "steps/s");
            continue;
        }
        let peak = dev.fma_peak()?;
        let budget = Duration::from_secs(if dev.is_gpu() { 6 } else { 3 });
        // train_on_batch reads the loss back, so each step is waited for.
        let step = common::time_per_call(&dev, budget, 2, || model.train_on_batch(&x, &y).map(drop))?;
        common::report("train_step", &dev, "mlp784-1024-1024-10/b256", 1.0 / step, "steps/s");
        common::report_share("train_step_of_fma_peak", &dev, "mlp784-1024-1024-10/b256", step_flops / step, peak);
        let infer = common::time_per_call(&dev, budget, 2, || model.predict(&x, 256)?.to_vec::<f32>().map(drop))?;
        common::report("inference", &dev, "mlp784-1024-1024-10/b256", 256.0 / infer, "samples/s");
        common::report_share("inference_of_fma_peak", &dev, "mlp784-1024-1024-10/b256", forward / infer, peak);
    }
    Ok(())
}
