//! BatchNormalization's state in a model: the moving statistics move only with an applied step,
//! are never trained, are counted as non-trainable, survive a save and a load, and bad input is
//! an `Err` naming the layer. (Values against Keras are in keras_conformance.rs.)

use weft_core::{Device, Tensor};
use weft_nn::layers::{BatchNormalization, Dense, GroupNormalization};
use weft_nn::optim::AdamW;
use weft_nn::{Ctx, FitOptions, Layer, Loss, Model, Sequential};

fn model() -> Model {
    let net = Sequential::new().add(Dense::new(4)).add(BatchNormalization::new().momentum(0.5)).add(Dense::new(2));
    let mut m = Model::new(net, &Device::Cpu);
    // Weight decay touches every variable it is given: the moving statistics must not be.
    m.compile(AdamW::new(0.01).weight_decay(0.5), Loss::MeanSquaredError, &[]).unwrap();
    m.build(&[1, 3]).unwrap();
    m
}

fn state(m: &Model) -> Vec<(String, Vec<f32>)> {
    m.variables().into_iter().map(|(p, v)| (p, v.to_vec::<f32>().unwrap())).collect()
}

fn data() -> (Tensor, Tensor) {
    (
        Tensor::rand(-1.0, 2.0, &[8, 3], 1, &Device::Cpu).unwrap(),
        Tensor::rand(-1.0, 1.0, &[8, 2], 2, &Device::Cpu).unwrap(),
    )
}

#[test]
fn moving_statistics_follow_applied_steps_only() {
    let mut m = model();
    let (x, y) = data();
    let stats = |m: &Model| -> Vec<Vec<f32>> {
        state(m).into_iter().filter(|(p, _)| p.contains("moving")).map(|(_, v)| v).collect()
    };
    assert_eq!(stats(&m), vec![vec![0.0; 4], vec![1.0; 4]]);
    assert_eq!(m.trainable_variables().len(), 6, "kernel, bias, gamma, beta, kernel, bias");
    // Inference (predict, evaluate) reads the statistics and leaves them.
    m.predict(&x, 4).unwrap();
    m.evaluate(&x, &y, 4).unwrap();
    assert_eq!(stats(&m), vec![vec![0.0; 4], vec![1.0; 4]]);
    // A step moves them halfway (momentum 0.5) toward the batch's mean and variance.
    m.train_on_batch(&x, &y).unwrap();
    let after = stats(&m);
    assert!(after[0].iter().all(|v| *v != 0.0) && after[1].iter().all(|v| *v != 1.0), "{after:?}");
    // A batch whose loss is not finite is refused: no weight and no statistic has changed.
    let before = state(&m);
    let bad = Tensor::from_vec(vec![f32::NAN; 6], &[2, 3], &Device::Cpu).unwrap();
    let e = m.train_on_batch(&bad, Tensor::zeros(&[2, 2], &Device::Cpu).unwrap()).unwrap_err();
    assert!(e.to_string().contains("not applied"), "{e}");
    assert_eq!(state(&m), before);
    // fit keeps going from there, and the statistics stay finite.
    m.fit(&x, &y, FitOptions { epochs: 2, batch_size: 4, verbose: false, ..Default::default() }).unwrap();
    assert!(stats(&m).iter().flatten().all(|v| v.is_finite()));
}

#[test]
fn summary_counts_the_moving_statistics_as_non_trainable() {
    let m = model();
    let s = m.summary(&[1, 3]).unwrap();
    // Dense 3->4 (16), BatchNormalization 4 features (16: 8 trainable), Dense 4->2 (10).
    assert!(s.contains("Total params: 42 (168.00 B)"), "{s}");
    assert!(s.contains("Trainable params: 34 (136.00 B)"), "{s}");
    assert!(s.contains("Non-trainable params: 8 (32.00 B)"), "{s}");
    assert!(s.contains("batch_normalization (BatchNormalization)"), "{s}");
}

#[test]
fn moving_statistics_survive_a_save_and_a_load() {
    let mut m = model();
    let (x, y) = data();
    m.fit(&x, &y, FitOptions { epochs: 3, batch_size: 4, verbose: false, ..Default::default() }).unwrap();
    let dir = std::env::temp_dir().join(format!("weft-bn-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("bn.safetensors");
    m.save_weights(&file).unwrap();
    let fresh = model();
    fresh.load_weights(&file).unwrap();
    assert_eq!(state(&fresh), state(&m));
    assert_eq!(
        fresh.predict(&x, 8).unwrap().to_vec::<f32>().unwrap(),
        m.predict(&x, 8).unwrap().to_vec::<f32>().unwrap()
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_input_is_an_err_naming_the_layer() {
    let dev = Device::Cpu;
    let bn = BatchNormalization::new().named("bn");
    bn.call(&Tensor::ones(&[2, 3], &dev).unwrap(), &mut Ctx::inference()).unwrap();
    // Built for 3 features, given 5.
    let e = bn.call(&Tensor::ones(&[2, 5], &dev).unwrap(), &mut Ctx::inference()).unwrap_err().to_string();
    assert!(e.contains("bn") && e.contains("[2, 5]"), "{e}");
    // A mask of the wrong shape.
    let x = Tensor::ones(&[2, 4, 3], &dev).unwrap();
    let e = BatchNormalization::new()
        .named("masked")
        .call_with(std::slice::from_ref(&x), &[Some(Tensor::ones(&[2, 3], &dev).unwrap())], &mut Ctx::training(0))
        .unwrap_err()
        .to_string();
    assert!(e.contains("masked") && e.contains("[2, 3]"), "{e}");
    // No rows to take statistics over.
    let e =
        BatchNormalization::new().named("empty").call(&Tensor::zeros(&[0, 3], &dev).unwrap(), &mut Ctx::training(0));
    assert!(e.unwrap_err().to_string().contains("empty"));
    // Bad settings.
    let e = BatchNormalization::new().momentum(1.5).named("m").call(&x, &mut Ctx::training(0)).unwrap_err();
    assert!(e.to_string().contains("1.5"), "{e}");
    let e = GroupNormalization::new(2).named("gn").call(&x, &mut Ctx::inference()).unwrap_err().to_string();
    assert!(e.contains("gn") && e.contains("3 channels"), "{e}");
    let e = GroupNormalization::new(0).call(&x, &mut Ctx::inference()).unwrap_err().to_string();
    assert!(e.contains("0 groups"), "{e}");
    let e = GroupNormalization::new(1).axis(0).call(&x, &mut Ctx::inference()).unwrap_err().to_string();
    assert!(e.contains("batch axis"), "{e}");
}

/// A masked position changes neither the output elsewhere nor the statistics.
#[test]
fn masked_positions_do_not_count() {
    let dev = Device::Cpu;
    let x = Tensor::from_vec(vec![1f32, 2., 3., 1000., 5., 6.], &[1, 6, 1], &dev).unwrap();
    let keep = Tensor::from_vec(vec![1f32, 1., 1., 0., 1., 1.], &[1, 6], &dev).unwrap();
    let bn = BatchNormalization::new().momentum(0.0);
    let mut ctx = Ctx::training(0);
    bn.call_with(&[x], &[Some(keep)], &mut ctx).unwrap();
    ctx.commit_updates().unwrap();
    let mean = bn.variables()[2].1.to_vec::<f32>().unwrap()[0];
    assert!((mean - 3.4).abs() < 1e-5, "{mean}");
}

/// A layer called twice in one step (shared) moves its statistics twice, each call from where
/// the last left them, as Keras' second call does.
#[test]
fn a_shared_layer_moves_its_statistics_once_per_call() {
    let dev = Device::Cpu;
    let bn = BatchNormalization::new().momentum(0.5);
    let a = Tensor::from_vec(vec![1f32, 3.0], &[2, 1], &dev).unwrap();
    let b = Tensor::from_vec(vec![10f32, 20.0], &[2, 1], &dev).unwrap();
    let mut ctx = Ctx::training(0);
    bn.call(&a, &mut ctx).unwrap();
    bn.call(&b, &mut ctx).unwrap();
    ctx.commit_updates().unwrap();
    // 0 -> 0.5 * 0 + 0.5 * 2 = 1 -> 0.5 * 1 + 0.5 * 15 = 8
    assert_eq!(bn.variables()[2].1.to_vec::<f32>().unwrap(), vec![8.0]);
}

/// A normalization layer's gamma and beta take regularizers (added to the loss) and constraints
/// (applied after each step), as the other layers' weights do.
#[test]
fn norm_layers_take_gamma_and_beta_penalties() {
    use weft_nn::layers::LayerNormalization;
    use weft_nn::optim::Sgd;
    use weft_nn::{Constraint, Regularizer};
    let (x, y) =
        (Tensor::rand(-1.0, 1.0, &[6, 4], 3, &Device::Cpu).unwrap(), Tensor::zeros(&[6, 4], &Device::Cpu).unwrap());
    let loss_with = |ln: LayerNormalization| {
        let mut m = Model::new(Sequential::new().add(ln), &Device::Cpu);
        m.compile(Sgd::new(0.1), Loss::MeanSquaredError, &[]).unwrap();
        m.build(&[1, 4]).unwrap();
        m.evaluate(&x, &y, 6).unwrap().0
    };
    let plain = loss_with(LayerNormalization::new());
    // gamma starts at 1: 0.5 * 4 more; beta at 0: nothing more.
    let penalised = loss_with(
        LayerNormalization::new().gamma_regularizer(Regularizer::L2(0.5)).beta_regularizer(Regularizer::L1(9.0)),
    );
    assert!((penalised - plain - 2.0).abs() < 1e-5, "{penalised} against {plain}");
    let mut m = Model::new(
        Sequential::new()
            .add(BatchNormalization::new().gamma_constraint(Constraint::MaxNorm { max_value: 0.5, axes: vec![0] })),
        &Device::Cpu,
    );
    m.compile(Sgd::new(0.1), Loss::MeanSquaredError, &[]).unwrap();
    m.train_on_batch(&x, &y).unwrap();
    let gamma = m.variables()[0].1.to_vec::<f32>().unwrap();
    let norm = gamma.iter().map(|g| g * g).sum::<f32>().sqrt();
    assert!((norm - 0.5).abs() < 1e-4, "{gamma:?}");
}
