//! A small convolutional network on the 8x8 handwritten digits (data/digits.csv): two 3x3
//! convolutions, max pooling, a third convolution, global average pooling and a softmax layer,
//! trained with Adam on a seeded 80/20 split; then the test accuracy, and the plan that would
//! split it over two devices (the convolutions by output channels, paired as Dense layers are).
//! Runs on the default device; `WEFT_DEVICE=gpu` puts it on a GPU adapter.
//! `cargo run --release --example digits_cnn`

use weft::core::conv::Padding;
use weft::nn::data::{read_csv, train_test_split};
use weft::nn::layers::{Conv2D, Dense, Dropout, GlobalAveragePooling2D, MaxPooling2D};
use weft::nn::optim::Adam;
use weft::nn::{Activation, FitOptions, Loss, Metric, Model, Sequential};
use weft::parallel::AutoConfig;
use weft::prelude::*;

/// Images `[n, 8, 8, 1]` scaled to [0, 1] and labels as u32, for the given rows.
fn images(values: &[f32], cols: usize, ids: &[u32], dev: &Device) -> Result<(Tensor, Tensor)> {
    let mut x = Vec::with_capacity(ids.len() * 64);
    let mut y = Vec::with_capacity(ids.len());
    for &i in ids {
        let r = &values[i as usize * cols..(i as usize + 1) * cols];
        x.extend(r[..64].iter().map(|v| v / 16.0));
        y.push(r[64] as u32);
    }
    Ok((Tensor::from_vec(x, &[ids.len(), 8, 8, 1], dev)?, Tensor::from_vec(y, &[ids.len()], dev)?))
}

fn net() -> Sequential {
    let conv = |filters| Conv2D::new(filters, [3, 3]).padding(Padding::Same).activation(Activation::Relu);
    Sequential::new()
        .add(conv(32))
        .add(conv(32))
        .add(MaxPooling2D::new([2, 2]))
        .add(conv(64))
        .add(GlobalAveragePooling2D::new())
        .add(Dropout::new(0.2))
        .add(Dense::new(10))
}

fn main() -> Result<()> {
    let dev = Device::from_env()?;
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/data/digits.csv");
    let (values, n, cols) = read_csv(path)?;
    let (train, test) = train_test_split(n, 0.2, 42)?;
    let (x_train, y_train) = images(&values, cols, &train, &dev)?;
    let (x_test, y_test) = images(&values, cols, &test, &dev)?;
    println!("digits: {} training and {} test images of 8x8", train.len(), test.len());

    let mut model = Model::new(net(), &dev);
    model.compile(
        Adam::new(3e-3),
        Loss::SparseCategoricalCrossentropy { from_logits: true },
        &[Metric::SparseCategoricalAccuracy],
    )?;
    let opts = FitOptions { epochs: 30, batch_size: 32, seed: 7, validation_split: 0.1, ..Default::default() };
    let start = std::time::Instant::now();
    model.fit(&x_train, &y_train, opts)?;
    println!("{}", model.summary(&[8, 8, 1])?);
    let (loss, metrics) = model.evaluate(&x_test, &y_test, 256)?;
    println!(
        "test loss {loss:.4}, test accuracy {:.2}% ({:.1}s on {})",
        100.0 * metrics[0].1,
        start.elapsed().as_secs_f32(),
        dev.describe()
    );

    // How the planner would split it over two devices, before anything is allocated.
    let plan = AutoConfig::new().min_params(0).plan(&net(), &[32, 8, 8, 1], 2, 1)?;
    println!("{plan}");
    Ok(())
}
