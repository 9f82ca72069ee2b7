//! Models of several outputs: each output's loss, weight and metrics (`compile_outputs`), labels
//! by output name, the weighted total, Keras' per-output history keys, `predict_outputs`, and
//! every mistake named.

use weft_core::{Device, Tensor};
use weft_nn::layers::Dense;
use weft_nn::optim::Adam;
use weft_nn::{Activation, FitOptions, Functional, Inputs, Loss, Metric, Model, OutputLoss};

const CE: Loss = Loss::SparseCategoricalCrossentropy { from_logits: true };

/// A shared trunk and two heads: a price (regression) and a kind (3 classes).
fn two_heads() -> Functional {
    let mut g = Functional::new("shop");
    let x = g.input("x");
    let h = g.apply(Dense::new(16).activation(Activation::Relu).named("trunk"), &[x]);
    let price = g.apply(Dense::new(1).named("price_head"), &[h]);
    let kind = g.apply(Dense::new(3).named("kind_head"), &[h]);
    g.outputs(&[("price", price), ("kind", kind)]).unwrap()
}

fn data(n: usize) -> (Tensor, Inputs) {
    let x = Tensor::rand(-1.0, 1.0, &[n, 5], 3, &Device::Cpu).unwrap();
    let price = x.sum(&[1], true).unwrap();
    let v = x.to_vec::<f32>().unwrap();
    let kind: Vec<u32> = v
        .chunks(5)
        .map(|r| {
            if r[0] > 0.3 {
                2
            } else if r[0] > -0.3 {
                1
            } else {
                0
            }
        })
        .collect();
    let y = Inputs::from([("price", price), ("kind", Tensor::from_vec(kind, &[n], &Device::Cpu).unwrap())]);
    (x, y)
}

fn compiled() -> Model {
    let mut m = Model::new(two_heads(), &Device::Cpu);
    m.compile_outputs(
        Adam::new(0.02),
        &[
            OutputLoss::new("price", Loss::MeanSquaredError),
            OutputLoss::new("kind", CE).weight(0.5).metrics(&[Metric::Accuracy]),
        ],
    )
    .unwrap();
    m
}

#[test]
fn the_loss_is_the_weighted_sum_of_each_outputs_loss() {
    let (x, y) = data(24);
    let mut m = compiled();
    let (total, figures) = m.evaluate(&x, &y, 8).unwrap();
    let out = m.predict_outputs(&x, 8).unwrap();
    let mse = Loss::MeanSquaredError.compute(out.get("price").unwrap(), y.get("price").unwrap()).unwrap();
    let ce = CE.compute(out.get("kind").unwrap(), y.get("kind").unwrap()).unwrap();
    let (mse, ce) = (mse.to_scalar::<f32>().unwrap(), ce.to_scalar::<f32>().unwrap());
    assert!((total - (mse + 0.5 * ce)).abs() < 1e-5, "{total} vs {mse} + 0.5 x {ce}");
    let names: Vec<&str> = figures.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["price_loss", "kind_loss", "kind_accuracy"]);
    assert!((figures[0].1 - mse).abs() < 1e-5 && (figures[1].1 - ce).abs() < 1e-5, "{figures:?}");
    assert_eq!(out.get("kind").unwrap().dims(), &[24, 3]);
}

#[test]
fn fit_trains_every_head_and_reports_each_as_keras_does() {
    let (x, y) = data(64);
    let mut m = compiled();
    let opts = FitOptions { epochs: 12, batch_size: 16, validation_split: 0.25, verbose: false, ..Default::default() };
    let h = m.fit(&x, &y, opts).unwrap();
    let flat = h.flat();
    let keys: Vec<&str> = flat.keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        [
            "kind_accuracy",
            "kind_loss",
            "loss",
            "price_loss",
            "val_kind_accuracy",
            "val_kind_loss",
            "val_loss",
            "val_price_loss"
        ]
    );
    for k in ["loss", "price_loss", "kind_loss"] {
        let v = &flat[k];
        assert!(v[v.len() - 1] < v[0], "{k} did not fall: {v:?}");
    }
    // Each epoch's total is the weighted sum of its per-output means.
    let (l, p, c) = (flat["loss"][3], flat["price_loss"][3], flat["kind_loss"][3]);
    assert!((l - (p + 0.5 * c)).abs() < 1e-4 * l.max(1.0), "{l} vs {p} + 0.5 x {c}");
}

#[test]
fn one_loss_for_every_output_and_one_label_for_a_one_output_model() {
    let mut g = Functional::new("twice");
    let x = g.input("x");
    let a = g.apply(Dense::new(1), &[x]);
    let b = g.apply(Dense::new(1), &[x]);
    let mut m = Model::new(g.outputs(&[("a", a), ("b", b)]).unwrap(), &Device::Cpu);
    m.compile(Adam::new(0.01), Loss::MeanSquaredError, &[]).unwrap();
    let x = Tensor::rand(-1.0, 1.0, &[8, 2], 0, &Device::Cpu).unwrap();
    let t = x.sum(&[1], true).unwrap();
    let y = Inputs::from([("a", t.clone()), ("b", t.mul_scalar(2.0).unwrap())]);
    let (total, figures) = m.evaluate(&x, &y, 8).unwrap();
    assert!((total - figures[0].1 - figures[1].1).abs() < 1e-5, "{total} {figures:?}");

    // A one-output model still takes one plain tensor of labels.
    let mut g = Functional::new("one");
    let xi = g.input("x");
    let o = g.apply(Dense::new(1), &[xi]);
    let mut one = Model::new(g.outputs(&[("only", o)]).unwrap(), &Device::Cpu);
    one.compile(Adam::new(0.01), Loss::MeanSquaredError, &[]).unwrap();
    assert!(one.train_on_batch(&x, &t).unwrap().is_finite());
    assert_eq!(one.predict(&x, 4).unwrap().dims(), &[8, 1]);
}

#[test]
fn mistakes_are_named() {
    let (x, y) = data(8);
    let mut m = compiled();
    fn err<T>(r: weft_core::Result<T>) -> String {
        r.map(drop).unwrap_err().to_string()
    }
    let only_price = Inputs::from([("price", y.get("price").unwrap().clone())]);
    let e = err(m.fit(&x, &only_price, FitOptions { verbose: false, ..Default::default() }));
    assert!(e.contains("no labels for the output \"kind\""), "{e}");
    let extra = Inputs::from([
        ("price", y.get("price").unwrap().clone()),
        ("kind", y.get("kind").unwrap().clone()),
        ("colour", y.get("kind").unwrap().clone()),
    ]);
    let e = err(m.evaluate(&x, &extra, 4));
    assert!(e.contains("\"colour\""), "{e}");
    let e = err(m.train_on_batch(&x, y.get("price").unwrap()));
    assert!(e.contains("by output name") && e.contains("\"kind\""), "{e}");
    let e = err(m.predict(&x, 4));
    assert!(e.contains("predict_outputs"), "{e}");
    let e = err(Model::new(two_heads(), &Device::Cpu).compile_outputs(Adam::new(0.1), &[OutputLoss::new("size", CE)]));
    assert!(e.contains("no output \"size\"") && e.contains("kind"), "{e}");
    let e = err(Model::new(two_heads(), &Device::Cpu)
        .compile_outputs(Adam::new(0.1), &[OutputLoss::new("kind", CE), OutputLoss::new("kind", CE)]));
    assert!(e.contains("two losses"), "{e}");
    let e = err(Model::new(two_heads(), &Device::Cpu)
        .compile_outputs(Adam::new(0.1), &[OutputLoss::new("kind", CE).weight(f32::NAN)]));
    assert!(e.contains("weight"), "{e}");
    let mut g = Functional::new("dup");
    let xi = g.input("x");
    let a = g.apply(Dense::new(1), &[xi]);
    let e = err(g.outputs(&[("a", a), ("a", a)]));
    assert!(e.contains("distinct names"), "{e}");
    // A short label is named with the shapes, before anything trains.
    let short = Inputs::from([
        ("price", y.get("price").unwrap().narrow(0, 0, 4).unwrap()),
        ("kind", y.get("kind").unwrap().clone()),
    ]);
    let before = m.predict_outputs(&x, 8).unwrap().get("kind").unwrap().to_vec::<f32>().unwrap();
    let e = err(m.fit(&x, &short, FitOptions { verbose: false, ..Default::default() }));
    assert!(e.contains("labels") && e.contains("different numbers of samples"), "{e}");
    let after = m.predict_outputs(&x, 8).unwrap().get("kind").unwrap().to_vec::<f32>().unwrap();
    assert_eq!(before, after);
}
