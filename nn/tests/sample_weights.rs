//! Sample weights, class weights and `ignore_class` in `fit`, `train_on_batch` and `evaluate`:
//! what they change, and the `Err`s for what does not fit. (Values against Keras are in
//! keras_conformance.rs.)

use std::collections::HashMap;
use weft_core::{Device, Tensor};
use weft_nn::layers::Dense;
use weft_nn::optim::Sgd;
use weft_nn::{FitOptions, Loss, Model, Sequential};

const SCCE: Loss = Loss::SparseCategoricalCrossentropy { from_logits: true };

fn model(loss: Loss) -> Model {
    let mut m = Model::new(Sequential::new().add(Dense::new(3)), &Device::Cpu);
    m.compile(Sgd::new(0.5), loss, &[]).unwrap();
    m.build(&[1, 4]).unwrap();
    m
}

fn weights(m: &Model) -> Vec<Vec<f32>> {
    m.variables().iter().map(|(_, v)| v.to_vec::<f32>().unwrap()).collect()
}

fn opts() -> FitOptions {
    FitOptions { epochs: 2, batch_size: 3, shuffle: false, verbose: false, ..Default::default() }
}

/// Rows labelled with the ignored class change nothing: a batch with them trains exactly as the
/// batch without them, whatever their inputs.
#[test]
fn ignored_labels_count_for_nothing() {
    let x = Tensor::rand(-1.0, 1.0, &[5, 4], 3, &Device::Cpu).unwrap();
    let y = Tensor::from_vec(vec![0i32, -1, 2, -1, 1], &[5], &Device::Cpu).unwrap();
    let keep = Tensor::from_vec(vec![0u32, 2, 4], &[3], &Device::Cpu).unwrap();
    let mut with = model(SCCE.with_ignore_class(-1).unwrap());
    let mut without = model(SCCE);
    let lw = with.train_on_batch(&x, &y).unwrap();
    let kept = Tensor::from_vec(vec![0i32, 2, 1], &[3], &Device::Cpu).unwrap();
    let lo = without.train_on_batch(x.index_select(&keep, 0).unwrap(), kept).unwrap();
    assert!((lw - lo).abs() < 1e-6, "{lw} against {lo}");
    for (a, b) in weights(&with).iter().zip(weights(&without)) {
        for (p, q) in a.iter().zip(&b) {
            assert!((p - q).abs() < 1e-6, "{a:?} against {b:?}");
        }
    }
    // The label check in fit lets the ignored value through, and still refuses a bad one.
    with.fit(&x, &y, opts()).unwrap();
    let bad = Tensor::from_vec(vec![0i32, -2, 2, -1, 1], &[5], &Device::Cpu).unwrap();
    let e = with.fit(&x, &bad, opts()).unwrap_err().to_string();
    assert!(e.contains("-2"), "{e}");
}

/// Weights of zero leave the model as it was; evaluate weighs the loss the same way.
#[test]
fn zero_weights_train_nothing_and_evaluate_weighs_the_loss() {
    let x = Tensor::rand(-1.0, 1.0, &[6, 4], 4, &Device::Cpu).unwrap();
    let y = Tensor::from_vec(vec![0u32, 1, 2, 0, 1, 2], &[6], &Device::Cpu).unwrap();
    let mut m = model(SCCE);
    let before = weights(&m);
    let zero = Tensor::zeros(&[6], &Device::Cpu).unwrap();
    let h = m.fit(&x, &y, FitOptions { sample_weight: Some(zero.clone()), ..opts() }).unwrap();
    assert_eq!(h.loss, vec![0.0, 0.0]);
    assert_eq!(weights(&m), before);
    // Weight 2 on every sample doubles the loss; weight on half the samples halves their share.
    let (plain, _) = m.evaluate(&x, &y, 6).unwrap();
    let (double, _) = m.evaluate_weighted(&x, &y, &Tensor::full(2.0, &[6], &Device::Cpu).unwrap(), 6).unwrap();
    assert!((double - 2.0 * plain).abs() < 1e-5, "{double} against 2 x {plain}");
    assert_eq!(m.evaluate_weighted(&x, &y, &zero, 4).unwrap().0, 0.0);
}

/// A class weight of k counts each sample of that class k times.
#[test]
fn class_weights_weigh_each_sample_by_its_class() {
    let x = Tensor::rand(-1.0, 1.0, &[4, 4], 5, &Device::Cpu).unwrap();
    let y = Tensor::from_vec(vec![0u32, 1, 2, 1], &[4], &Device::Cpu).unwrap();
    let mut by_class = model(SCCE);
    let mut by_sample = model(SCCE);
    let classes = HashMap::from([(1, 3.0), (2, 0.0)]);
    let samples = Tensor::from_vec(vec![1f32, 3.0, 0.0, 3.0], &[4], &Device::Cpu).unwrap();
    let h1 = by_class.fit(&x, &y, FitOptions { class_weight: Some(classes), ..opts() }).unwrap();
    let h2 = by_sample.fit(&x, &y, FitOptions { sample_weight: Some(samples), ..opts() }).unwrap();
    assert_eq!(h1.loss, h2.loss);
    assert_eq!(weights(&by_class), weights(&by_sample));
    // One-hot labels: the class is the position of the one.
    let mut one_hot = model(Loss::CategoricalCrossentropy { from_logits: true });
    let y1 = Tensor::from_vec(vec![1f32, 0., 0., 0., 1., 0., 0., 0., 1., 0., 1., 0.], &[4, 3], &Device::Cpu).unwrap();
    let h3 =
        one_hot.fit(&x, &y1, FitOptions { class_weight: Some(HashMap::from([(1, 3.0), (2, 0.0)])), ..opts() }).unwrap();
    for (a, b) in h3.loss.iter().zip(&h1.loss) {
        assert!((a - b).abs() < 1e-5, "{:?} against {:?}", h3.loss, h1.loss);
    }
}

#[test]
fn weights_that_do_not_fit_are_an_err_and_change_nothing() {
    let x = Tensor::rand(-1.0, 1.0, &[6, 4], 4, &Device::Cpu).unwrap();
    let y = Tensor::from_vec(vec![0u32, 1, 2, 0, 1, 2], &[6], &Device::Cpu).unwrap();
    let mut m = model(SCCE);
    let before = weights(&m);
    let short = Tensor::ones(&[5], &Device::Cpu).unwrap();
    let e = m.fit(&x, &y, FitOptions { sample_weight: Some(short), ..opts() }).unwrap_err().to_string();
    assert!(e.contains("sample_weight") && e.contains("[5]"), "{e}");
    let both = FitOptions {
        sample_weight: Some(Tensor::ones(&[6], &Device::Cpu).unwrap()),
        class_weight: Some(HashMap::from([(0, 2.0)])),
        ..opts()
    };
    assert!(m.fit(&x, &y, both).unwrap_err().to_string().contains("not both"));
    // Per-sample losses of shape [6]: a weight per sample and step does not fit them.
    let e = Loss::MeanSquaredError
        .compute_weighted(
            &Tensor::ones(&[6, 2], &Device::Cpu).unwrap(),
            &Tensor::ones(&[6, 2], &Device::Cpu).unwrap(),
            Some(&Tensor::ones(&[6, 2], &Device::Cpu).unwrap()),
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("[6, 2]") && e.contains("[6]"), "{e}");
    assert!(Loss::MeanSquaredError.with_ignore_class(0).is_err());
    assert_eq!(weights(&m), before);
}

/// With `ignore_class`, a sparse accuracy counts a left-out label that is no class as a miss
/// (as Keras, which compares it with the prediction), and the metric runs rather than failing.
#[test]
fn accuracy_counts_ignored_labels_that_are_no_class_as_misses() {
    let x = Tensor::rand(-1.0, 1.0, &[4, 4], 3, &Device::Cpu).unwrap();
    let mut m = Model::new(Sequential::new().add(Dense::new(3)), &Device::Cpu);
    m.compile(Sgd::new(0.5), SCCE.with_ignore_class(-1).unwrap(), &[weft_nn::Metric::Accuracy]).unwrap();
    m.build(&[1, 4]).unwrap();
    let pred = m.predict(&x, 4).unwrap().argmax(-1, false).unwrap().to_dtype(weft_core::DType::F32).unwrap();
    let p = pred.to_vec::<f32>().unwrap();
    // Two rows labelled with their prediction, two left out.
    let y = Tensor::from_vec(vec![p[0] as i32, -1, p[2] as i32, -1], &[4], &Device::Cpu).unwrap();
    let (_, figures) = m.evaluate(&x, &y, 4).unwrap();
    assert_eq!(figures, vec![("accuracy".to_string(), 0.5)]);
    m.fit(&x, &y, opts()).unwrap();
}
