//! Sharded training equals one device: an MLP, a 2-block transformer language model (attention,
//! MLP, vocabulary-parallel embedding with a tied head) and an EinsumDense model train 20 Adam
//! steps (cosine schedule, clipping on) on 1 device and sharded over 2, 3 (uneven) and 4 devices,
//! and over a 2 x 2 data x model mesh, on Cpu devices. Losses, outputs, gradients, weights and
//! optimizer state agree within 1e-4 relative.

use weft_core::{DType, Device, Tensor};
use weft_nn::layers::{
    Dense, Dropout, EinsumDense, Embedding, LayerNormalization, PositionEmbedding, TransformerBlock,
};
use weft_nn::optim::{Adam, LearningRate};
use weft_nn::{Activation, Layer, Loss, Sequential};
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

fn check<L: Layer + 'static>(name: &str, net: impl Fn() -> L + Copy, x: &Tensor, y: &Tensor, loss: Loss, dtype: DType) {
    for mesh in meshes() {
        let plan = plan(&net(), x.dims(), &mesh, dtype);
        let report = verify(net, &mesh, &plan, adam(), loss, (x, y), STEPS).unwrap();
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
    let x = Tensor::rand(-1.0, 1.0, &[8, 7], 1, &Device::Cpu).unwrap();
    let y = Tensor::from_vec((0..8u32).map(|i| i % 5).collect(), &[8], &Device::Cpu).unwrap();
    check("mlp", mlp, &x, &y, Loss::SparseCategoricalCrossentropy { from_logits: true }, DType::F32);
}

fn lm() -> Sequential {
    let tokens = Embedding::new(13, 16).named("tokens");
    let head = tokens.tied_head().named("head");
    Sequential::new()
        .named("lm")
        .add(tokens)
        .add(PositionEmbedding::new(6).named("positions"))
        .add(TransformerBlock::new(4, 4, 22).causal(true).named("block_0"))
        .add(TransformerBlock::new(4, 4, 22).causal(true).named("block_1"))
        .add(LayerNormalization::new().named("ln_f"))
        .add(head)
}

#[test]
fn transformer_lm_matches_one_device() {
    let ids: Vec<u32> = (0..8 * 6).map(|i| (i * 7 + 3) % 13).collect();
    let x = Tensor::from_vec(ids.clone(), &[8, 6], &Device::Cpu).unwrap();
    let y = Tensor::from_vec(ids.iter().map(|i| (i + 1) % 13).collect(), &[8, 6], &Device::Cpu).unwrap();
    check("lm", lm, &x, &y, Loss::SparseCategoricalCrossentropy { from_logits: true }, DType::U32);
}

fn einsum_model() -> Sequential {
    Sequential::new()
        .add(EinsumDense::new("abc,cd->abd", &[0, 18]).bias_axes("d").activation(Activation::Relu))
        .add(EinsumDense::new("abc,cd->abd", &[0, 6]).bias_axes("d"))
}

#[test]
fn einsum_dense_matches_one_device() {
    let x = Tensor::rand(-1.0, 1.0, &[4, 3, 9], 3, &Device::Cpu).unwrap();
    let y = Tensor::rand(-1.0, 1.0, &[4, 3, 6], 4, &Device::Cpu).unwrap();
    check("einsum", einsum_model, &x, &y, Loss::MeanSquaredError, DType::F32);
}
