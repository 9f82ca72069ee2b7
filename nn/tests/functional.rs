//! Functional models: named inputs, fan-out and merges, masks from an input, trained through
//! `fit` with several inputs; bad inputs are named.

use weft_core::{Device, Tensor};
use weft_nn::layers::{Add, Concatenate, Dense, Embedding, GlobalAveragePooling1D, Multiply};
use weft_nn::optim::Adam;
use weft_nn::{Activation, FitOptions, Functional, Inputs, Layer, Loss, Model};

/// Two inputs: token ids with a padding mask, and a dense feature vector.
fn two_tower() -> Functional {
    let mut g = Functional::new("two_tower");
    let ids = g.input("ids");
    let keep = g.input("keep");
    let feats = g.input("feats");
    let e = g.apply(Embedding::new(12, 6), &[ids]);
    let e = g.mask(e, keep);
    let a = g.apply(Dense::new(6).activation(Activation::Tanh), &[e]);
    let s = g.apply(Add::new(), &[e, a]);
    let pooled = g.apply(GlobalAveragePooling1D::new(), &[s]);
    let f = g.apply(Dense::new(6).activation(Activation::Relu), &[feats]);
    let gate = g.apply(Dense::new(6).activation(Activation::Sigmoid), &[feats]);
    let both = g.apply(Multiply::new(), &[f, gate]);
    let joined = g.apply(Concatenate::new(-1), &[pooled, both]);
    let out = g.apply(Dense::new(1), &[joined]);
    g.output(out).unwrap()
}

fn data(n: usize) -> (Inputs, Tensor) {
    let ids: Vec<u32> = (0..n * 4).map(|i| (i * 7 % 11) as u32 + 1).collect();
    let keep: Vec<f32> = (0..n * 4).map(|i| if i % 4 < 2 + (i / 4) % 3 { 1.0 } else { 0.0 }).collect();
    let feats = Tensor::rand(-1.0, 1.0, &[n, 3], 5, &Device::Cpu).unwrap();
    let y = feats.sum(&[1], true).unwrap().tanh().unwrap();
    let x = Inputs::from([
        ("ids", Tensor::from_vec(ids, &[n, 4], &Device::Cpu).unwrap()),
        ("keep", Tensor::from_vec(keep, &[n, 4], &Device::Cpu).unwrap()),
        ("feats", feats),
    ]);
    (x, y)
}

#[test]
fn a_two_input_model_trains_through_fit_with_named_inputs() {
    let mut m = Model::new(two_tower(), &Device::Cpu);
    m.compile(Adam::new(0.02), Loss::MeanSquaredError, &[]).unwrap();
    let (x, y) = data(32);
    let h = m.fit(&x, &y, FitOptions { epochs: 30, batch_size: 8, verbose: false, ..Default::default() }).unwrap();
    assert!(h.loss[29] < h.loss[0] * 0.5, "{:?}", h.loss);
    assert_eq!(m.predict(&x, 5).unwrap().dims(), &[32, 1]);
    let (loss, _) = m.evaluate(&x, &y, 7).unwrap();
    assert!(loss < h.loss[0]);
    let paths: Vec<String> = m.variables().into_iter().map(|(p, _)| p).collect();
    assert!(paths.contains(&"two_tower/dense_3/kernel".to_string()), "{paths:?}");
}

#[test]
fn the_mask_input_changes_only_the_masked_positions() {
    let m = Model::new(two_tower(), &Device::Cpu);
    let (x, _) = data(2);
    let a = m.call(&x).unwrap().to_vec::<f32>().unwrap();
    // Change the ids where keep = 0: the output must not move.
    let keep = x.get("keep").unwrap().to_vec::<f32>().unwrap();
    let ids: Vec<u32> = x.get("ids").unwrap().to_vec::<u32>().unwrap();
    let changed: Vec<u32> = ids.iter().zip(&keep).map(|(&i, &k)| if k == 0.0 { (i + 3) % 12 } else { i }).collect();
    let x2 = Inputs::from([
        ("ids", Tensor::from_vec(changed, &[2, 4], &Device::Cpu).unwrap()),
        ("keep", x.get("keep").unwrap().clone()),
        ("feats", x.get("feats").unwrap().clone()),
    ]);
    let b = m.call(&x2).unwrap().to_vec::<f32>().unwrap();
    for (p, q) in a.iter().zip(&b) {
        assert!((p - q).abs() < 1e-6, "{a:?} vs {b:?}");
    }
}

#[test]
fn missing_and_unknown_inputs_are_named() {
    let m = Model::new(two_tower(), &Device::Cpu);
    let (x, _) = data(2);
    let partial = Inputs::from([("ids", x.get("ids").unwrap().clone()), ("extra", x.get("feats").unwrap().clone())]);
    let err = m.predict(&partial, 2).unwrap_err().to_string();
    assert!(err.contains("keep") && err.contains("feats") && err.contains("extra"), "{err}");
    let ragged = Inputs::from([
        ("ids", x.get("ids").unwrap().clone()),
        ("keep", x.get("keep").unwrap().narrow(0, 0, 1).unwrap()),
        ("feats", x.get("feats").unwrap().clone()),
    ]);
    let err = m.predict(&ragged, 2).unwrap_err().to_string();
    assert!(err.contains("keep") && err.contains("different numbers of samples"), "{err}");
}

#[test]
fn a_value_from_another_graph_is_refused() {
    let mut other = Functional::new("other");
    let x = other.input("x");
    let y = other.apply(Dense::new(2), &[x]);
    let z = other.apply(Dense::new(2), &[y]);
    let mut g = Functional::new("g");
    let a = g.input("a");
    let _ = g.apply(Dense::new(2), &[z]); // z is value 2 of `other`: g has no value 2 yet
    let err = g.output(a).err().expect("refused").to_string();
    assert!(err.contains("g/dense"), "{err}");
    assert_eq!(two_tower().input_names(), vec!["ids", "keep", "feats"]);
}
