//! Memory bandwidth of elementwise work on 16M elements, in GB/s of bytes read and written, on
//! every device found: a broadcast add ([4096, 4096] + [4096]), a product of two, a difference
//! with one value repeated along each row ([4096, 4096] - [4096, 1], as `x - mean`), and a
//! transposed copy (`x.t().contiguous()`); and the time of two concats of many parts: an LSTM's 64
//! steps of gate gradients (`[64, 512]` views of `[64, 640]`, joined into `[64, 64, 512]`, as its
//! backward joins them) and a training step's 37 one-value figures (a loss and 36 gradient
//! checks, joined for one read); softmax's backward over 4096 rows of 4096 (`y` and `g` read,
//! the input's gradient written, in GB/s); sparse cross-entropy's loss and logits' gradient over
//! 4096 rows of 4096 classes (an LM's output layer; the logits read and their gradient written,
//! in GB/s). `cargo bench --bench elementwise`

mod common;

use std::time::Duration;
use weft::prelude::*;

fn main() -> Result<()> {
    let n = 4096;
    for dev in common::devices() {
        let a = Tensor::rand(-1.0, 1.0, &[n, n], 1, &dev)?;
        let b = Tensor::rand(-1.0, 1.0, &[n], 2, &dev)?;
        let secs = common::time_per_call(&dev, Duration::from_secs(2), 3, || a.add(&b).map(drop))?;
        // Read a, write the result (b is 16 KiB and stays in cache).
        let bytes = 2.0 * (n * n * 4) as f64;
        common::report("broadcast_add", &dev, "4096x4096+4096", bytes / secs / 1e9, "GB/s");
        let secs = common::time_per_call(&dev, Duration::from_secs(2), 3, || a.mul(&a).map(drop))?;
        common::report("mul_same_shape", &dev, "4096x4096", 3.0 * (n * n * 4) as f64 / secs / 1e9, "GB/s");
        let col = Tensor::rand(-1.0, 1.0, &[n, 1], 3, &dev)?;
        let secs = common::time_per_call(&dev, Duration::from_secs(2), 3, || a.sub(&col).map(drop))?;
        common::report("row_repeated_sub", &dev, "4096x4096-4096x1", bytes / secs / 1e9, "GB/s");
        let secs = common::time_per_call(&dev, Duration::from_secs(2), 3, || a.t()?.contiguous().map(drop))?;
        common::report("transpose_copy", &dev, "4096x4096", bytes / secs / 1e9, "GB/s");
        let steps = (0..64)
            .map(|t| Tensor::rand(-1.0, 1.0, &[64, 640], 10 + t, &dev)?.narrow(1, 0, 512)?.unsqueeze(1))
            .collect::<Result<Vec<_>>>()?;
        let secs = common::time_per_call(&dev, Duration::from_secs(2), 3, || Tensor::concat(&steps, 1).map(drop))?;
        common::report("concat_steps", &dev, "64x[64x1x512]", secs * 1e3, "ms");
        let figures = (0..37).map(|i| Tensor::full(i as f32, &[1], &dev)).collect::<Result<Vec<_>>>()?;
        let secs = common::time_per_call(&dev, Duration::from_secs(2), 3, || Tensor::concat(&figures, 0).map(drop))?;
        common::report("concat_figures", &dev, "37x[1]", secs * 1e6, "us");
        let x = Var::new(a.clone())?;
        let y = x.as_tensor().softmax(-1)?;
        let secs = common::time_per_call(&dev, Duration::from_secs(2), 3, || y.backward_with(a.clone()).map(drop))?;
        common::report("softmax_backward", &dev, "4096x4096", 3.0 * (n * n * 4) as f64 / secs / 1e9, "GB/s");
        let labels: Vec<u32> = (0..n as u32).map(|i| i.wrapping_mul(2_654_435_761) % n as u32).collect();
        let labels = Tensor::from_vec(labels, &[n], &dev)?;
        let secs = common::time_per_call(&dev, Duration::from_secs(2), 3, || {
            let loss = Tensor::cross_entropy(x.as_tensor(), &labels)?;
            loss.backward().map(drop)
        })?;
        common::report("cross_entropy_step", &dev, "4096x4096", 2.0 * (n * n * 4) as f64 / secs / 1e9, "GB/s");
    }
    Ok(())
}
