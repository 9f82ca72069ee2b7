//! Convolution and pooling: GFLOP/s of a 3x3 "same" convolution forward and of its two
//! gradients (a ResNet-like [32, 32, 32, 64] -> 64 layer, and the digits CNN's [32, 8, 8, 32] ->
//! 32), the digits_cnn training step, and a CIFAR-sized CNN's training step and inference (the
//! model `benches/peers/cnn_keras.py` builds in Keras: `bash benches/peers/cnn_side.sh` runs
//! both), on every device found. `cargo bench --bench conv`

mod common;

use std::time::Duration;
use weft::core::conv::Padding;
use weft::nn::layers::{Conv2D, Dense, Dropout, Flatten, GlobalAveragePooling2D, MaxPooling2D};
use weft::nn::optim::Adam;
use weft::nn::{Activation, Loss, Model, Sequential};
use weft::prelude::*;

fn main() -> Result<()> {
    // As the other benches measured against peers do: the calling thread works on each op.
    weft::set_num_threads(0)?;
    for dev in common::devices() {
        // Lavapipe runs the direct kernels slowly: a smaller first case there.
        let big = if dev.is_gpu() { [8, 16, 16, 32, 32] } else { [32, 32, 32, 64, 64] };
        for [n, h, w, c, f] in [big, [32, 8, 8, 32, 32]] {
            let x = Var::new(Tensor::rand(-1.0, 1.0, &[n, h, w, c], 1, &dev)?)?;
            let k = Var::new(Tensor::rand(-0.1, 0.1, &[3, 3, c, f], 2, &dev)?)?;
            let flops = 2.0 * (n * h * w * f * 9 * c) as f64;
            let size = format!("{n}x{h}x{w}x{c}->{f}");
            let fwd = || x.as_tensor().conv2d(k.as_tensor(), [1, 1], [1, 1], Padding::Same);
            let secs = common::time_per_call(&dev, Duration::from_secs(2), 3, || fwd().map(drop))?;
            common::report("conv2d_3x3_forward", &dev, &size, flops / secs / 1e9, "GFLOP/s");
            let secs = common::time_per_call(&dev, Duration::from_secs(2), 3, || {
                let grads = fwd()?.sum_all()?.backward()?;
                grads.get(&k).map(|g| g.to_vec::<f32>().map(drop)).unwrap_or(Ok(()))
            })?;
            common::report("conv2d_3x3_forward_backward", &dev, &size, 3.0 * flops / secs / 1e9, "GFLOP/s");
            let pool = || x.as_tensor().max_pool2d([2, 2], [2, 2], Padding::Valid);
            let secs = common::time_per_call(&dev, Duration::from_secs(1), 3, || pool().map(drop))?;
            common::report("max_pool2d_2x2", &dev, &size, (n * h * w * c * 4) as f64 / secs / 1e9, "GB/s");
        }
        let net = conv_stem().add(GlobalAveragePooling2D::new()).add(Dropout::new(0.2)).add(Dense::new(10));
        let mut model = Model::new(net, &dev);
        model.compile(Adam::new(1e-3), Loss::SparseCategoricalCrossentropy { from_logits: true }, &[])?;
        let x = Tensor::rand(0.0, 1.0, &[32, 8, 8, 1], 3, &dev)?;
        let y = Tensor::from_vec((0..32u32).map(|i| i % 10).collect(), &[32], &dev)?;
        let secs = common::time_per_call(&dev, Duration::from_secs(2), 3, || model.train_on_batch(&x, &y).map(drop))?;
        common::report("digits_cnn_train_step", &dev, "batch 32", 1.0 / secs, "steps/s");
        cifar_cnn(&dev)?;
    }
    Ok(())
}

/// 32x32x3 inputs through Conv2D 32-32 (3x3 same, ReLU), max pooling, Conv2D 64-64, max pooling,
/// Dense 128 ReLU and Dense 10; Adam, batch 64: training steps/s and inference samples/s.
fn cifar_cnn(dev: &Device) -> Result<()> {
    let net = conv_stem()
        .add(conv3x3(64))
        .add(MaxPooling2D::new([2, 2]))
        .add(Flatten::new())
        .add(Dense::new(128).activation(Activation::Relu))
        .add(Dense::new(10));
    let mut model = Model::new(net, dev);
    model.compile(Adam::new(1e-3), Loss::SparseCategoricalCrossentropy { from_logits: true }, &[])?;
    let b = 64;
    let x = Tensor::rand(0.0, 1.0, &[b, 32, 32, 3], 3, dev)?;
    let y = Tensor::from_vec((0..b as u32).map(|i| i % 10).collect(), &[b], dev)?;
    let budget = Duration::from_secs(if dev.is_gpu() { 6 } else { 4 });
    let secs = common::time_per_call(dev, budget, 3, || model.train_on_batch(&x, &y).map(drop))?;
    common::report("cifar_cnn_train_step", dev, "b64", 1.0 / secs, "steps/s");
    let xi = Tensor::rand(0.0, 1.0, &[4 * b, 32, 32, 3], 4, dev)?;
    let secs = common::time_per_call(dev, budget, 3, || model.predict(&xi, b)?.to_vec::<f32>().map(drop))?;
    common::report("cifar_cnn_infer", dev, "b64", (4 * b) as f64 / secs, "samples/s");
    Ok(())
}

/// A 3x3 "same" convolution with ReLU.
fn conv3x3(filters: usize) -> Conv2D {
    Conv2D::new(filters, [3, 3]).padding(Padding::Same).activation(Activation::Relu)
}

/// Conv2D 32, 32, max pooling, Conv2D 64: how both CNNs here begin.
fn conv_stem() -> Sequential {
    Sequential::new().add(conv3x3(32)).add(conv3x3(32)).add(MaxPooling2D::new([2, 2])).add(conv3x3(64))
}
