//! The digits_cnn example's network reaches at least 98% test accuracy on the Cpu (issue #12's
//! bar).

use weft::core::conv::Padding;
use weft::nn::data::{read_csv, train_test_split};
use weft::nn::layers::{Conv2D, Dense, Dropout, GlobalAveragePooling2D, MaxPooling2D};
use weft::nn::optim::Adam;
use weft::nn::{Activation, FitOptions, Loss, Metric, Model, Sequential};
use weft::prelude::*;

fn images(values: &[f32], cols: usize, ids: &[u32]) -> (Tensor, Tensor) {
    let x: Vec<f32> = ids.iter().flat_map(|&i| values[i as usize * cols..][..64].iter().map(|v| v / 16.0)).collect();
    let y: Vec<u32> = ids.iter().map(|&i| values[i as usize * cols + 64] as u32).collect();
    (
        Tensor::from_vec(x, &[ids.len(), 8, 8, 1], &Device::Cpu).unwrap(),
        Tensor::from_vec(y, &[ids.len()], &Device::Cpu).unwrap(),
    )
}

/// The example's network.
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

fn compiled(dev: &Device) -> Model {
    let mut model = Model::new(net(), dev);
    model
        .compile(
            Adam::new(3e-3),
            Loss::SparseCategoricalCrossentropy { from_logits: true },
            &[Metric::SparseCategoricalAccuracy],
        )
        .unwrap();
    model
}

#[test]
fn the_digits_cnn_reaches_98_percent() {
    let (values, n, cols) = read_csv(concat!(env!("CARGO_MANIFEST_DIR"), "/data/digits.csv")).unwrap();
    let (train, test) = train_test_split(n, 0.2, 42).unwrap();
    let (x, y) = images(&values, cols, &train);
    let (xt, yt) = images(&values, cols, &test);
    let mut model = compiled(&Device::Cpu);
    let opts =
        FitOptions { epochs: 30, batch_size: 32, seed: 7, validation_split: 0.1, verbose: false, ..Default::default() };
    let history = model.fit(&x, &y, opts).unwrap();
    assert!(history.loss[29] < history.loss[0] / 10.0, "loss {:?}", history.loss);
    let (_, metrics) = model.evaluate(&xt, &yt, 256).unwrap();
    assert!(metrics[0].1 >= 0.98, "test accuracy {}", metrics[0].1);
}
