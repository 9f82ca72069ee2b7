//! Layers against hand computations, naming, lazy building and errors.

use weft_core::{Device, Tensor};
use weft_nn::layers::{ActivationLayer, Dense, Dropout, Flatten};
use weft_nn::{Activation, Ctx, Initializer, Layer, Loss, Sequential};

#[test]
fn dense_is_x_times_kernel_plus_bias() {
    let layer = Dense::new(2).activation(Activation::Relu).bias_initializer(Initializer::Ones);
    let x = Tensor::from_vec(vec![1f32, 2., 3., -1., 0., 1.], &[2, 3], &Device::Cpu).unwrap();
    let y = layer.call(&x, &mut Ctx::inference()).unwrap().to_vec::<f32>().unwrap();
    let vars = layer.variables();
    assert_eq!(vars.iter().map(|v| v.0.as_str()).collect::<Vec<_>>(), ["kernel", "bias"]);
    let k = vars[0].1.to_vec::<f32>().unwrap();
    let want: Vec<f32> = (0..2)
        .flat_map(|r| {
            let xr = [[1f32, 2., 3.], [-1., 0., 1.]][r];
            let k = &k;
            (0..2).map(move |c| ((0..3).map(|i| xr[i] * k[i * 2 + c]).sum::<f32>() + 1.0).max(0.0))
        })
        .collect();
    for (g, w) in y.iter().zip(&want) {
        assert!((g - w).abs() < 1e-6, "{y:?} vs {want:?}");
    }
}

#[test]
fn sequential_names_layers_and_variable_paths() {
    let net = Sequential::new()
        .add(Dense::new(4))
        .add(ActivationLayer::new(Activation::Tanh))
        .add(Dense::new(3).named("head"))
        .add(Dense::new(2));
    net.call(&Tensor::ones(&[1, 5], &Device::Cpu).unwrap(), &mut Ctx::inference()).unwrap();
    let paths: Vec<String> = net.variables().into_iter().map(|v| v.0).collect();
    assert_eq!(paths, ["dense/kernel", "dense/bias", "head/kernel", "head/bias", "dense_1/kernel", "dense_1/bias"]);
}

#[test]
fn a_wrong_input_shape_names_the_layer_path_and_both_shapes() {
    let net = Sequential::new().add(Dense::new(4)).add(Dense::new(2));
    net.call(&Tensor::ones(&[1, 5], &Device::Cpu).unwrap(), &mut Ctx::inference()).unwrap();
    let err = net.call(&Tensor::ones(&[1, 6], &Device::Cpu).unwrap(), &mut Ctx::inference()).unwrap_err().to_string();
    assert!(err.contains("sequential/dense") && err.contains("[1, 6]") && err.contains("[5, 4]"), "{err}");
}

#[test]
fn dropout_only_while_training_and_flatten() {
    let x = Tensor::ones(&[4, 2, 8], &Device::Cpu).unwrap();
    let flat = Flatten::new().call(&x, &mut Ctx::inference()).unwrap();
    assert_eq!(flat.dims(), &[4, 16]);
    let d = Dropout::new(0.5);
    let same = d.call(&flat, &mut Ctx::inference()).unwrap().to_vec::<f32>().unwrap();
    assert!(same.iter().all(|&v| v == 1.0));
    let dropped = d.call(&flat, &mut Ctx::training(3)).unwrap().to_vec::<f32>().unwrap();
    let zeros = dropped.iter().filter(|&&v| v == 0.0).count();
    assert!(zeros > 10 && zeros < 54, "{zeros} of 64 dropped");
    assert!(dropped.iter().all(|&v| v == 0.0 || v == 2.0));
}

#[test]
fn losses_match_their_formulas() {
    let dev = Device::Cpu;
    let p = Tensor::from_vec(vec![0.2f32, 0.7, 0.1, 0.5, 0.25, 0.25], &[2, 3], &dev).unwrap();
    let onehot = Tensor::from_vec(vec![0f32, 1., 0., 1., 0., 0.], &[2, 3], &dev).unwrap();
    let labels = Tensor::from_vec(vec![1u32, 0], &[2], &dev).unwrap();
    let want_ce = -(0.7f32.ln() + 0.5f32.ln()) / 2.0;
    let cce =
        Loss::CategoricalCrossentropy { from_logits: false }.compute(&p, &onehot).unwrap().to_scalar::<f32>().unwrap();
    let scce = Loss::SparseCategoricalCrossentropy { from_logits: false }.compute(&p, &labels).unwrap();
    assert!((cce - want_ce).abs() < 1e-6 && (scce.to_scalar::<f32>().unwrap() - want_ce).abs() < 1e-6);
    // From logits: log of the probabilities are logits up to a per-row constant.
    let logits = p.log().unwrap().add_scalar(3.0).unwrap();
    let from_logits = Loss::SparseCategoricalCrossentropy { from_logits: true }.compute(&logits, &labels).unwrap();
    assert!((from_logits.to_scalar::<f32>().unwrap() - want_ce).abs() < 1e-5);
    let mse = Loss::MeanSquaredError.compute(&p, &onehot).unwrap().to_scalar::<f32>().unwrap();
    let want_mse = [0.04f32, 0.09, 0.01, 0.25, 0.0625, 0.0625].iter().sum::<f32>() / 6.0;
    assert!((mse - want_mse).abs() < 1e-6);
    let q = Tensor::from_vec(vec![0.9f32, 0.2], &[2, 1], &dev).unwrap();
    let t = Tensor::from_vec(vec![1f32, 0.], &[2, 1], &dev).unwrap();
    let bce = Loss::BinaryCrossentropy { from_logits: false }.compute(&q, &t).unwrap().to_scalar::<f32>().unwrap();
    assert!((bce - -(0.9f32.ln() + 0.8f32.ln()) / 2.0).abs() < 1e-6);
    let err = Loss::MeanSquaredError.compute(&p, &labels).unwrap_err().to_string();
    assert!(err.contains("[2, 3]") && err.contains("[2]"), "{err}");
}
