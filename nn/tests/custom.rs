//! Losses and metrics of one's own (`Loss::custom`, `Metric::custom`): trained and reported
//! through `fit` exactly as the built-in ones they restate, and refused with their name when
//! they give something that is not a loss or fail.

use weft_core::{DType, Device, Tensor};
use weft_nn::layers::Dense;
use weft_nn::optim::Adam;
use weft_nn::{Activation, FitOptions, Loss, Model, Sequential};

fn data() -> (Tensor, Tensor) {
    let x = Tensor::rand(-1.0, 1.0, &[24, 3], 1, &Device::Cpu).unwrap();
    let y = Tensor::rand(-1.0, 1.0, &[24, 2], 2, &Device::Cpu).unwrap();
    (x, y)
}

fn trained(loss: Loss) -> (Vec<f32>, Vec<Vec<f32>>) {
    let (x, y) = data();
    let net = Sequential::new().add(Dense::new(5).activation(Activation::Tanh)).add(Dense::new(2));
    let mut m = Model::new(net, &Device::Cpu);
    m.compile(Adam::new(0.02), loss, &[]).unwrap();
    let opts = FitOptions { epochs: 3, batch_size: 8, verbose: false, ..Default::default() };
    let h = m.fit(&x, &y, opts).unwrap();
    (h.loss, m.variables().iter().map(|(_, v)| v.to_vec::<f32>().unwrap()).collect())
}

#[test]
fn a_custom_loss_trains_as_the_built_in_one_it_restates() {
    // Keras' order: (y_true, y_pred); a loss per sample, averaged by fit.
    let mse = Loss::custom("my_mse", |y_true, y_pred| y_pred.sub(y_true)?.square()?.mean(&[-1], false));
    let (l1, w1) = trained(mse);
    let (l2, w2) = trained(Loss::MeanSquaredError);
    for (a, b) in l1.iter().zip(&l2) {
        assert!((a - b).abs() <= 1e-6 * b.abs().max(1.0), "losses {l1:?} against {l2:?}");
    }
    for (a, b) in w1.iter().flatten().zip(w2.iter().flatten()) {
        assert!((a - b).abs() <= 1e-5, "weights differ: {a} against {b}");
    }
    // An asymmetric loss (its argument order matters) is not the built-in's.
    let over = Loss::custom("over", |y_true, y_pred| y_pred.sub(y_true)?.relu()?.square());
    assert_ne!(trained(over).0, l2);
}

#[test]
fn a_custom_loss_that_gives_no_loss_is_an_err_naming_it() {
    let (x, y) = data();
    let bad: [(Loss, &str); 3] = [
        (Loss::custom("ids", |t, _| t.to_dtype(DType::U32)), "U32"),
        (Loss::custom("nothing", |t, _| t.narrow(0, 0, 0)), "[0, 2]"),
        (Loss::custom("shapes", |t, p| t.matmul(p)), "matmul"),
    ];
    for (loss, what) in bad {
        let mut m = Model::new(Sequential::new().add(Dense::new(2)), &Device::Cpu);
        m.compile(Adam::new(0.02), loss.clone(), &[]).unwrap();
        m.build(&[3]).unwrap();
        let before: Vec<Vec<f32>> = m.variables().iter().map(|(_, v)| v.to_vec::<f32>().unwrap()).collect();
        let err = m.train_on_batch(&x, &y).unwrap_err().to_string();
        let Loss::Custom(c) = &loss else { unreachable!() };
        assert!(err.contains(c.name()) && err.contains(what), "{err}");
        let after: Vec<Vec<f32>> = m.variables().iter().map(|(_, v)| v.to_vec::<f32>().unwrap()).collect();
        assert_eq!(before, after, "nothing changed");
    }
}

#[test]
fn a_custom_metric_reports_as_the_built_in_one_it_restates() {
    use weft_nn::Metric;
    let (x, y) = data();
    let mae = Metric::custom("my_mae", |y_true, y_pred| y_pred.sub(y_true)?.abs());
    let net = Sequential::new().add(Dense::new(2));
    let mut m = Model::new(net, &Device::Cpu);
    m.compile(Adam::new(0.02), Loss::MeanSquaredError, &[mae, Metric::MeanAbsoluteError]).unwrap();
    let opts = FitOptions { epochs: 2, batch_size: 5, validation_split: 0.25, verbose: false, ..Default::default() };
    let h = m.fit(&x, &y, opts).unwrap();
    for (a, b) in h.metrics["my_mae"].iter().zip(&h.metrics["mean_absolute_error"]) {
        assert!((a - b).abs() <= 1e-6, "{h:?}");
    }
    assert_eq!(h.val_metrics["my_mae"].len(), 2);
    let (_, figures) = m.evaluate(&x, &y, 7).unwrap();
    assert_eq!(figures[0].0, "my_mae");
    assert!((figures[0].1 - figures[1].1).abs() <= 1e-6, "{figures:?}");
    // A metric that fails names itself.
    let bad = Metric::custom("broken", |t, p| t.matmul(p));
    let mut m = Model::new(Sequential::new().add(Dense::new(2)), &Device::Cpu);
    m.compile(Adam::new(0.02), Loss::MeanSquaredError, &[bad]).unwrap();
    let err = m.evaluate(&x, &y, 8).unwrap_err().to_string();
    assert!(err.contains("broken"), "{err}");
}

#[test]
fn metric_names_must_be_unique_and_not_a_loss() {
    use weft_nn::Metric;
    let cases = [
        (vec![Metric::Precision(0.5), Metric::Precision(0.8)], "\"precision\" is given twice"),
        (vec![Metric::custom("accuracy", |t, _| Ok(t.clone())), Metric::Accuracy], "\"accuracy\" is given twice"),
        (vec![Metric::custom("loss", |t, _| Ok(t.clone()))], "\"loss\" is a name"),
        (vec![Metric::custom("val_x", |t, _| Ok(t.clone()))], "\"val_x\" is a name"),
    ];
    for (metrics, want) in cases {
        let mut m = Model::new(Sequential::new().add(Dense::new(2)), &Device::Cpu);
        let err = m.compile(Adam::new(0.02), Loss::MeanSquaredError, &metrics).unwrap_err().to_string();
        assert!(err.contains(want), "{err}");
        assert!(m.optimizer().is_none(), "nothing compiled");
    }
}
