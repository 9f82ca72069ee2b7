//! Regularizers, constraints and optimizer options in a model: what they change, and that a
//! setting that cannot run is an `Err` before anything changes. (Values against Keras are in
//! keras_conformance.rs.)

use weft_core::{Device, Tensor};
use weft_nn::layers::{BatchNormalization, Dense};
use weft_nn::optim::{AdamW, Sgd};
use weft_nn::{Constraint, Loss, Model, Sequential};

fn state(m: &Model) -> Vec<Vec<f32>> {
    m.variables().iter().map(|(_, v)| v.to_vec::<f32>().unwrap()).collect()
}

fn data() -> (Tensor, Tensor) {
    (
        Tensor::rand(-1.0, 1.0, &[8, 3], 1, &Device::Cpu).unwrap(),
        Tensor::rand(-1.0, 1.0, &[8, 2], 2, &Device::Cpu).unwrap(),
    )
}

/// A constraint naming an axis its variable lacks, or a bad bound, stops the first step before
/// any weight, optimizer count or moving statistic moves.
#[test]
fn a_constraint_that_cannot_run_changes_nothing() {
    let (x, y) = data();
    for bad in [
        Constraint::MaxNorm { max_value: 1.0, axes: vec![2] },
        Constraint::max_norm(f32::NAN),
        Constraint::min_max_norm(2.0, 1.0),
    ] {
        let net = Sequential::new()
            .add(Dense::new(4))
            .add(BatchNormalization::new())
            .add(Dense::new(2).kernel_constraint(bad.clone()));
        let mut m = Model::new(net, &Device::Cpu);
        m.compile(Sgd::new(0.1), Loss::MeanSquaredError, &[]).unwrap();
        m.build(&[1, 3]).unwrap();
        let before = state(&m);
        let e = m.train_on_batch(&x, &y).unwrap_err().to_string();
        assert!(e.contains("dense_1/kernel"), "{bad:?}: {e}");
        assert_eq!(state(&m), before, "{bad:?}");
        assert_eq!(m.optimizer().unwrap().iterations(), 0);
    }
}

/// Weight decay leaves out the variables whose own name matches (`bias`), not every variable
/// of a layer whose path does (`dense`), as Keras matches names.
#[test]
fn exclusions_from_weight_decay_match_the_variable_name() {
    let (x, y) = (Tensor::zeros(&[4, 3], &Device::Cpu).unwrap(), Tensor::zeros(&[4, 2], &Device::Cpu).unwrap());
    let decayed = |names: &[&str]| {
        let mut m =
            Model::new(Sequential::new().add(Dense::new(2).bias_initializer(weft_nn::Initializer::Ones)), &Device::Cpu);
        m.compile(AdamW::new(0.1).weight_decay(0.5).exclude_from_weight_decay(names), Loss::MeanSquaredError, &[])
            .unwrap();
        m.build(&[1, 3]).unwrap();
        let before = state(&m);
        // Zero inputs: the kernel's gradient is 0, so only decay moves it.
        m.train_on_batch(&x, &y).unwrap();
        before[0] != state(&m)[0]
    };
    assert!(decayed(&["bias"]), "the kernel still decays");
    assert!(!decayed(&["kernel"]), "the kernel is left out");
    assert!(decayed(&["dense"]), "a layer's name matches no variable's own name");
}

/// `ema_overwrite_frequency` without `ema` changes nothing (Keras ignores it too).
#[test]
fn an_overwrite_frequency_alone_keeps_no_average() {
    let (x, y) = data();
    let run = |opt: Sgd| {
        let mut m = Model::new(Sequential::new().add(Dense::new(2)), &Device::Cpu);
        m.compile(opt, Loss::MeanSquaredError, &[]).unwrap();
        m.build(&[1, 3]).unwrap();
        for _ in 0..3 {
            m.train_on_batch(&x, &y).unwrap();
        }
        (state(&m), m.optimizer().unwrap().slots().len())
    };
    assert_eq!(run(Sgd::new(0.1).ema_overwrite_frequency(1)), run(Sgd::new(0.1)));
}
