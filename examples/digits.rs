//! An MLP on the 8x8 handwritten digits (data/digits.csv, 1,797 samples): a seeded 80/20 split,
//! training with Adam, then the test accuracy. Runs on the default device; `WEFT_DEVICE=gpu` puts
//! it on a GPU adapter (lavapipe included). `cargo run --release --example digits`

use weft::nn::data::{read_csv, train_test_split};
use weft::nn::layers::Dense;
use weft::nn::optim::Adam;
use weft::nn::{Activation, FitOptions, Loss, Metric, Model, Sequential};
use weft::prelude::*;

/// Pixels scaled to [0, 1] and labels as u32, for the given rows.
fn rows(values: &[f32], cols: usize, ids: &[u32], dev: &Device) -> Result<(Tensor, Tensor)> {
    let mut x = Vec::with_capacity(ids.len() * (cols - 1));
    let mut y = Vec::with_capacity(ids.len());
    for &i in ids {
        let r = &values[i as usize * cols..(i as usize + 1) * cols];
        x.extend(r[..cols - 1].iter().map(|v| v / 16.0));
        y.push(r[cols - 1] as u32);
    }
    Ok((Tensor::from_vec(x, &[ids.len(), cols - 1], dev)?, Tensor::from_vec(y, &[ids.len()], dev)?))
}

fn main() -> Result<()> {
    let dev = Device::from_env()?;
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/data/digits.csv");
    let (values, n, cols) = read_csv(path)?;
    let (train, test) = train_test_split(n, 0.2, 42)?;
    let (x_train, y_train) = rows(&values, cols, &train, &dev)?;
    let (x_test, y_test) = rows(&values, cols, &test, &dev)?;
    println!("digits: {} training and {} test samples of {} pixels", train.len(), test.len(), cols - 1);

    let net = Sequential::new()
        .add(Dense::new(128).activation(Activation::Relu))
        .add(Dense::new(64).activation(Activation::Relu))
        .add(Dense::new(10));
    let mut model = Model::new(net, &dev);
    model.compile(
        Adam::new(2e-3),
        Loss::SparseCategoricalCrossentropy { from_logits: true },
        &[Metric::SparseCategoricalAccuracy],
    )?;
    let opts = FitOptions { epochs: 40, batch_size: 32, seed: 7, validation_split: 0.1, ..Default::default() };
    let start = std::time::Instant::now();
    model.fit(&x_train, &y_train, opts)?;
    println!("{}", model.summary(&[cols - 1])?);
    let (loss, metrics) = model.evaluate(&x_test, &y_test, 256)?;
    println!(
        "test loss {loss:.4}, test accuracy {:.2}% ({:.1}s on {})",
        100.0 * metrics[0].1,
        start.elapsed().as_secs_f32(),
        dev.describe()
    );

    // A checkpoint in the safetensors format, loaded back into a fresh model.
    let path = std::env::temp_dir().join("weft_digits.safetensors");
    model.save_weights(&path)?;
    let fresh = Model::new(
        Sequential::new()
            .add(Dense::new(128).activation(Activation::Relu))
            .add(Dense::new(64).activation(Activation::Relu))
            .add(Dense::new(10)),
        &dev,
    );
    fresh.build(&[cols - 1])?;
    fresh.load_weights(&path)?;
    let same = fresh.predict(&x_test, 256)?.to_vec::<f32>()? == model.predict(&x_test, 256)?.to_vec::<f32>()?;
    println!("saved {} and loaded it into a fresh model: predictions identical: {same}", path.display());
    Ok(())
}
