//! The digits MLP reaches at least 97% test accuracy (the bar), on the Cpu.

use weft::nn::data::{read_csv, train_test_split};
use weft::nn::layers::Dense;
use weft::nn::optim::Adam;
use weft::nn::{Activation, FitOptions, Loss, Metric, Model, Sequential};
use weft::prelude::*;

fn rows(values: &[f32], cols: usize, ids: &[u32]) -> (Tensor, Tensor) {
    let x: Vec<f32> = ids
        .iter()
        .flat_map(|&i| values[i as usize * cols..i as usize * cols + cols - 1].iter().map(|v| v / 16.0))
        .collect();
    let y: Vec<u32> = ids.iter().map(|&i| values[i as usize * cols + cols - 1] as u32).collect();
    (
        Tensor::from_vec(x, &[ids.len(), cols - 1], &Device::Cpu).unwrap(),
        Tensor::from_vec(y, &[ids.len()], &Device::Cpu).unwrap(),
    )
}

#[test]
fn the_digits_mlp_reaches_97_percent() {
    let (values, n, cols) = read_csv(concat!(env!("CARGO_MANIFEST_DIR"), "/data/digits.csv")).unwrap();
    assert_eq!((n, cols), (1797, 65));
    let (train, test) = train_test_split(n, 0.2, 42).unwrap();
    let (x, y) = rows(&values, cols, &train);
    let (xt, yt) = rows(&values, cols, &test);
    let net = Sequential::new()
        .add(Dense::new(128).activation(Activation::Relu))
        .add(Dense::new(64).activation(Activation::Relu))
        .add(Dense::new(10));
    let mut model = Model::new(net, &Device::Cpu);
    model
        .compile(
            Adam::new(2e-3),
            Loss::SparseCategoricalCrossentropy { from_logits: true },
            &[Metric::SparseCategoricalAccuracy],
        )
        .unwrap();
    let opts =
        FitOptions { epochs: 40, batch_size: 32, seed: 7, validation_split: 0.1, verbose: false, ..Default::default() };
    let history = model.fit(&x, &y, opts).unwrap();
    assert!(history.loss[39] < history.loss[0] / 20.0, "loss {:?}", history.loss);
    assert_eq!(history.val_loss.len(), 40);
    let (_, metrics) = model.evaluate(&xt, &yt, 256).unwrap();
    assert!(metrics[0].1 >= 0.97, "test accuracy {}", metrics[0].1);
    // predict agrees with evaluate's accuracy.
    let pred = model.predict(&xt, 100).unwrap().argmax(-1, false).unwrap().to_vec::<u32>().unwrap();
    let hits = pred.iter().zip(yt.to_vec::<u32>().unwrap()).filter(|(p, t)| **p == *t).count();
    assert!((hits as f32 / pred.len() as f32 - metrics[0].1).abs() < 1e-6);
}
