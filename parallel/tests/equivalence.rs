//! Sharded training equals one device: an MLP, a 2-block transformer language model (attention,
//! MLP, vocabulary-parallel embedding with a tied head), an EinsumDense model and a column layer
//! fanning out to two row layers train 20 Adam steps (cosine schedule, clipping on) on 1 device
//! and sharded over 2, 3 (uneven) and 4 devices, and over a 2 x 2 data x model mesh, on Cpu
//! devices, each step on a fresh batch. Losses, outputs, gradients, weights and optimizer state
//! agree within 1e-4 relative.

mod common;

#[path = "common/lm.rs"]
mod lm;
use lm::lm;
use weft_core::conv::Padding;
use weft_core::{DType, Device, Tensor};
use weft_nn::layers::ActivationLayer;
use weft_nn::layers::{
    AveragePooling2D, BatchNormalization, Bidirectional, Conv1D, Conv2D, Dense, Dropout, EinsumDense, Flatten, GRU,
    GlobalMaxPooling1D, GroupNormalization, LSTM, MaxPooling2D,
};
use weft_nn::optim::{Adam, LearningRate};
use weft_nn::{Activation, Constraint, Layer, Loss, Regularizer, Sequential};
use weft_parallel::{AutoConfig, DeviceMesh, ShardingPlan, verify};

const STEPS: usize = 20;
const TOLERANCE: f32 = 1e-4;

fn adam() -> Adam {
    let schedule = LearningRate::CosineDecay { initial: 0.0, peak: 1e-2, warmup_steps: 5, decay_steps: 20, alpha: 0.1 };
    Adam::new(schedule).clip_global_norm(0.5)
}

fn meshes() -> Vec<DeviceMesh> {
    let mut m: Vec<DeviceMesh> = [1, 2, 3, 4].iter().map(|&n| DeviceMesh::cpus(n).unwrap()).collect();
    m.push(DeviceMesh::cpus(4).unwrap().reshape(&[2, 2], &["data", "model"]).unwrap());
    m
}

fn plan(net: &dyn Layer, input: &[usize], mesh: &DeviceMesh, dtype: DType) -> ShardingPlan {
    AutoConfig::new().min_params(0).input_dtype(dtype).plan(net, input, mesh.size("model"), mesh.size("data")).unwrap()
}

/// Batches of a quarter of the rows of `(x, y)`, a fresh one each step.
fn check<L: Layer + 'static>(name: &str, net: impl Fn() -> L + Copy, x: &Tensor, y: &Tensor, loss: Loss, dtype: DType) {
    let mut batch = x.dims().to_vec();
    batch[0] /= 4;
    for mesh in meshes() {
        let plan = plan(&net(), &batch, &mesh, dtype);
        let report = verify(net, &mesh, &plan, adam(), loss.clone(), (x, y), STEPS).unwrap();
        println!(
            "{name} on {}: largest relative difference {:.2e} (zero-gradient variables: {:.2e} absolute)",
            mesh.describe(),
            report.max_rel(),
            report.zero_gradient_max_abs()
        );
        assert!(report.max_rel() < TOLERANCE, "{name} on {}:\n{report}\n{plan}", mesh.describe());
        assert!(report.zero_gradient_max_abs() < 1e-3, "{name} on {}:\n{report}", mesh.describe());
        assert!(report.losses.last().unwrap().0 < report.losses[0].0, "{name}: the loss did not fall");
    }
}

fn mlp() -> Sequential {
    Sequential::new()
        .add(Dense::new(22).activation(Activation::Gelu))
        .add(Dropout::new(0.2))
        .add(Dense::new(10).activation(Activation::Tanh))
        .add(Dense::new(5))
}

#[test]
fn mlp_matches_one_device() {
    let x = Tensor::rand(-1.0, 1.0, &[32, 7], 1, &Device::Cpu).unwrap();
    let y = Tensor::from_vec((0..32u32).map(|i| i % 5).collect(), &[32], &Device::Cpu).unwrap();
    check("mlp", mlp, &x, &y, Loss::SparseCategoricalCrossentropy { from_logits: true }, DType::F32);
}

#[test]
fn transformer_lm_matches_one_device() {
    let ids: Vec<u32> = (0..32 * 6).map(|i| (i * 7 + 3) % 13).collect();
    let x = Tensor::from_vec(ids.clone(), &[32, 6], &Device::Cpu).unwrap();
    let y = Tensor::from_vec(ids.iter().map(|i| (i + 1) % 13).collect(), &[32, 6], &Device::Cpu).unwrap();
    check("lm", lm, &x, &y, Loss::SparseCategoricalCrossentropy { from_logits: true }, DType::U32);
}

fn einsum_model() -> Sequential {
    Sequential::new()
        .add(EinsumDense::new("abc,cd->abd", &[0, 18]).bias_axes("d").activation(Activation::Relu))
        .add(EinsumDense::new("abc,cd->abd", &[0, 6]).bias_axes("d"))
}

#[test]
fn einsum_dense_matches_one_device() {
    let x = Tensor::rand(-1.0, 1.0, &[16, 3, 9], 3, &Device::Cpu).unwrap();
    let y = Tensor::rand(-1.0, 1.0, &[16, 3, 6], 4, &Device::Cpu).unwrap();
    check("einsum", einsum_model, &x, &y, Loss::MeanSquaredError, DType::F32);
}

#[test]
fn a_column_layer_feeding_two_row_layers_matches_one_device() {
    let x = Tensor::rand(-1.0, 1.0, &[32, 9], 5, &Device::Cpu).unwrap();
    let y = Tensor::rand(-1.0, 1.0, &[32, 4], 6, &Device::Cpu).unwrap();
    let net = || common::Fork::new(14, 4);
    // The plan pairs the fan-out on every mesh with a model axis (3 devices: uneven [5, 5, 4]).
    for n in [2, 3, 4] {
        let p = AutoConfig::new().min_params(0).plan(&net(), &[8, 9], n, 1).unwrap();
        assert_eq!(p.layer("fork/right").unwrap().style.name(), "row", "{p}");
    }
    check("fork", net, &x, &y, Loss::MeanSquaredError, DType::F32);
}

/// 50 steps: on one batch repeated, the model memorises it and the last gradients shrink toward
/// rounding noise (the language model then misses 1e-4 on 3 devices); on fresh batches they stay
/// meaningful and every tensor agrees.
#[test]
fn fifty_steps_on_fresh_batches_agree_within_1e_4() {
    let small_mlp = || {
        Sequential::new()
            .add(Dense::new(24).activation(Activation::Gelu))
            .add(Dense::new(11).activation(Activation::Tanh))
            .add(Dense::new(5))
    };
    let x = Tensor::rand(-1.0, 1.0, &[96, 7], 11, &Device::Cpu).unwrap();
    let y = Tensor::from_vec((0..96u32).map(|i| (i * 7 + 2) % 5).collect(), &[96], &Device::Cpu).unwrap();
    let ids: Vec<u32> = (0..32 * 6).map(|i| (i * 7 + 3) % 13).collect();
    let tokens = Tensor::from_vec(ids.clone(), &[32, 6], &Device::Cpu).unwrap();
    let next = Tensor::from_vec(ids.iter().map(|i| (i + 1) % 13).collect(), &[32, 6], &Device::Cpu).unwrap();
    let loss = Loss::SparseCategoricalCrossentropy { from_logits: true };
    for n in [2, 3] {
        let mesh = DeviceMesh::cpus(n).unwrap();
        let p = plan(&small_mlp(), &[8, 7], &mesh, DType::F32);
        let report = verify(small_mlp, &mesh, &p, Adam::new(0.01), loss.clone(), (&x, &y), 50).unwrap();
        assert!(report.max_rel() < TOLERANCE, "mlp on {n}:\n{report}");
        // Fresh batches: consecutive steps see different rows, so their losses differ.
        assert!(report.losses.windows(2).all(|w| w[0].0 != w[1].0), "{:?}", report.losses);
        let p = plan(&lm(), &[8, 6], &mesh, DType::U32);
        let report = verify(lm, &mesh, &p, adam(), loss.clone(), (&tokens, &next), 50).unwrap();
        assert!(report.max_rel() < TOLERANCE, "lm on {n}:\n{report}");
        assert!(report.zero_gradient_max_abs() < 1e-3, "lm on {n}:\n{report}");
    }
}

/// Keras' other optimizers (each rule elementwise, so each rank updates its own shard), the
/// new activations and losses, on a model split 2 ways and 2 x 2: as on one device.
#[test]
fn every_optimizer_and_activation_trains_split_as_on_one_device() {
    use weft_nn::optim::{Adagrad, Adamax, Lion, Nadam, Optimizer, RMSprop, Sgd};
    let net = || {
        Sequential::new()
            .add(Dense::new(12).activation(Activation::Mish))
            .add(Dense::new(9).activation(Activation::LeakyRelu(0.2)))
            .add(Dense::new(6).activation(Activation::Elu(1.0)))
            .add(Dense::new(3).activation(Activation::Softsign))
    };
    let x = Tensor::rand(-1.0, 1.0, &[16, 5], 3, &Device::Cpu).unwrap();
    let y = Tensor::rand(-0.5, 0.5, &[16, 3], 4, &Device::Cpu).unwrap();
    fn run<O: Optimizer + Clone + 'static>(name: &str, opt: O, net: fn() -> Sequential, x: &Tensor, y: &Tensor) {
        let meshes =
            [DeviceMesh::cpus(2).unwrap(), DeviceMesh::cpus(4).unwrap().reshape(&[2, 2], &["data", "model"]).unwrap()];
        for mesh in meshes {
            let plan = plan(&net(), &[4, 5], &mesh, DType::F32);
            let report = verify(net, &mesh, &plan, opt.clone(), Loss::Huber { delta: 0.5 }, (x, y), 8).unwrap();
            assert!(report.max_rel() < TOLERANCE, "{name} on {}:\n{report}", mesh.describe());
        }
    }
    let net: fn() -> Sequential = net;
    run("adagrad", Adagrad::new(0.05), net, &x, &y);
    run("adamax", Adamax::new(0.01), net, &x, &y);
    run("nadam", Nadam::new(0.01), net, &x, &y);
    run("lion", Lion::new(0.003).weight_decay(0.01), net, &x, &y);
    run("adam amsgrad", Adam::new(0.01).amsgrad(true), net, &x, &y);
    run("rmsprop centered, momentum", RMSprop::new(0.01).centered(true).momentum(0.5), net, &x, &y);
    run("sgd clip_value", Sgd::new(0.1).clip_value(0.05), net, &x, &y);
}

/// Convolutions split by output channels and paired through pooling and dropout (odd channel
/// counts, so the parts are uneven), then a flatten and a Dense: as on one device.
fn cnn() -> Sequential {
    let conv = |f, k| Conv2D::new(f, [k, k]).padding(Padding::Same).activation(Activation::Relu);
    Sequential::new()
        .add(conv(7, 3))
        .add(MaxPooling2D::new([2, 2]).padding(Padding::Same))
        .add(Dropout::new(0.1))
        .add(conv(5, 2))
        .add(AveragePooling2D::new([2, 2]))
        .add(Flatten::new())
        .add(Dense::new(4))
}

#[test]
fn a_convolutional_network_matches_one_device() {
    let x = Tensor::rand(-1.0, 1.0, &[32, 5, 5, 3], 4, &Device::Cpu).unwrap();
    let y = Tensor::from_vec((0..32u32).map(|i| i % 4).collect(), &[32], &Device::Cpu).unwrap();
    check("cnn", cnn, &x, &y, Loss::SparseCategoricalCrossentropy { from_logits: true }, DType::F32);
    // The first convolution pairs with the second through the pooling and the dropout.
    let p = plan(&cnn(), &[8, 5, 5, 3], &DeviceMesh::cpus(2).unwrap(), DType::F32);
    let style = |path: &str| p.layers.iter().find(|l| l.path == path).map(|l| l.style.name());
    assert_eq!((style("sequential/conv2d"), style("sequential/conv2d_1")), (Some("column"), Some("row")), "{p}");
}

/// A causal Conv1D stack over time (the last grouped, kept whole) with global max pooling.
fn temporal() -> Sequential {
    Sequential::new()
        .add(Conv1D::new(6, 3).padding(Padding::Causal).activation(Activation::Gelu))
        .add(Conv1D::new(4, 2).dilation_rate(2).padding(Padding::Causal))
        .add(Conv1D::new(6, 2).groups(2).padding(Padding::Same))
        .add(GlobalMaxPooling1D::new())
        .add(Dense::new(3))
}

#[test]
fn a_temporal_convolution_matches_one_device() {
    let x = Tensor::rand(-1.0, 1.0, &[32, 9, 2], 5, &Device::Cpu).unwrap();
    let y = Tensor::from_vec((0..32u32).map(|i| i % 3).collect(), &[32], &Device::Cpu).unwrap();
    check("temporal", temporal, &x, &y, Loss::SparseCategoricalCrossentropy { from_logits: true }, DType::F32);
}

/// A loss of one's own runs on the whole (gathered) output on every rank: trained split as on
/// one device.
#[test]
fn a_custom_loss_trains_split_as_on_one_device() {
    let x = Tensor::rand(-1.0, 1.0, &[32, 7], 1, &Device::Cpu).unwrap();
    let y = Tensor::rand(-1.0, 1.0, &[32, 5], 2, &Device::Cpu).unwrap();
    // Pseudo-Huber on each sample's worst error: not elementwise across the output.
    let loss = Loss::custom("worst_pseudo_huber", |y_true, y_pred| {
        let e = y_pred.sub(y_true)?.square()?.max(&[-1], false)?;
        e.add_scalar(1.0)?.sqrt()?.add_scalar(-1.0)
    });
    check("custom loss", mlp, &x, &y, loss, DType::F32);
}

/// Batch normalization after a Dense and after a convolution (both without a bias, as is usual:
/// the normalization would cancel it, leaving its gradient rounding noise), and a group
/// normalization: on a data axis the batch statistics span the whole batch, so losses,
/// gradients, weights and the moving statistics agree with one device.
fn normalized() -> Sequential {
    Sequential::new()
        .add(Conv2D::new(6, [3, 3]).padding(Padding::Same).use_bias(false))
        .add(BatchNormalization::new().momentum(0.5))
        .add(GroupNormalization::new(3))
        .add(ActivationLayer::new(Activation::Relu))
        .add(Flatten::new())
        .add(Dense::new(10).use_bias(false))
        .add(BatchNormalization::new().momentum(0.8).center(false))
        .add(Dense::new(7).activation(Activation::Gelu))
        .add(Dense::new(3))
}

#[test]
fn batch_and_group_normalization_match_one_device() {
    let x = Tensor::rand(-1.0, 1.0, &[32, 4, 4, 2], 6, &Device::Cpu).unwrap();
    let y = Tensor::from_vec((0..32u32).map(|i| i % 3).collect(), &[32], &Device::Cpu).unwrap();
    check("normalized", normalized, &x, &y, Loss::SparseCategoricalCrossentropy { from_logits: true }, DType::F32);
}

/// Weight penalties (on a column-split and a row-split kernel), an activity penalty and
/// constraints (a max-norm over the split axis of a row-split kernel sums the parts' squares
/// over the model axis): as on one device.
fn regularized() -> Sequential {
    Sequential::new()
        .add(
            Dense::new(22)
                .activation(Activation::Relu)
                .kernel_regularizer(Regularizer::L2(0.01))
                .bias_constraint(Constraint::NonNeg),
        )
        .add(
            Dense::new(10)
                .kernel_regularizer(Regularizer::L1L2 { l1: 0.001, l2: 0.01 })
                .bias_regularizer(Regularizer::L1(0.01))
                .activity_regularizer(Regularizer::L2(0.01))
                .kernel_constraint(Constraint::max_norm(0.3)),
        )
        .add(Dense::new(5).kernel_constraint(Constraint::unit_norm()))
}

#[test]
fn regularizers_and_constraints_match_one_device() {
    let x = Tensor::rand(-1.0, 1.0, &[32, 12], 7, &Device::Cpu).unwrap();
    let y = Tensor::from_vec((0..32u32).map(|i| i % 5).collect(), &[32], &Device::Cpu).unwrap();
    check("regularized", regularized, &x, &y, Loss::SparseCategoricalCrossentropy { from_logits: true }, DType::F32);
    let p = plan(&regularized(), &[8, 12], &DeviceMesh::cpus(2).unwrap(), DType::F32);
    let style = |path: &str| p.layers.iter().find(|l| l.path == path).map(|l| l.style.name());
    assert_eq!(style("sequential/dense_1"), Some("row"), "{p}");
}

/// Recurrent layers (kept whole: each step needs the whole state) between split Dense layers:
/// a bidirectional GRU and an LSTM with dropout on its inputs and its state (masks drawn for the
/// whole batch, so a data axis drops what one device drops).
fn recurrent() -> Sequential {
    Sequential::new()
        .add(Dense::new(6).activation(Activation::Tanh))
        .add(Bidirectional::new(GRU::new(5).return_sequences(true)))
        .add(LSTM::new(4).dropout(0.1).recurrent_dropout(0.1))
        .add(Dense::new(7).activation(Activation::Relu))
        .add(Dense::new(3))
}

#[test]
fn recurrent_layers_match_one_device() {
    let x = Tensor::rand(-1.0, 1.0, &[32, 5, 3], 8, &Device::Cpu).unwrap();
    // A label the sequence decides: the feature largest at the first step.
    let y = x.narrow(1, 0, 1).unwrap().squeeze(1).unwrap().argmax(-1, false).unwrap();
    check("recurrent", recurrent, &x, &y, Loss::SparseCategoricalCrossentropy { from_logits: true }, DType::F32);
}
