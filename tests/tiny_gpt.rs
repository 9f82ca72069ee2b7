//! A short run of the tiny_gpt setup (a decoder-only transformer learning `123+456=0579`): the
//! loss on the answer digits falls well below chance (ln 12 = 2.48) within 300 steps (with
//! EinsumDense drawn by Keras' fans, attention starts from larger weights than it did).

use weft::nn::layers::{Dense, Embedding, LayerNormalization, PositionEmbedding, TransformerBlock};
use weft::nn::optim::{Adam, LearningRate, Optimizer};
use weft::nn::{Ctx, Layer, Sequential};
use weft::prelude::*;

fn batch(n: usize, step: u64) -> (Tensor, Tensor) {
    let key = weft::core::rng::seed_key(step);
    let (mut x, mut y) = (Vec::new(), Vec::new());
    for j in 0..n as u32 {
        let i = (weft::core::rng::uniform(key, j) * 1_000_000.0) as u32;
        let (a, b) = (i / 1000, i % 1000);
        let line: Vec<u32> =
            format!("{a:03}+{b:03}={:04}", a + b).chars().map(|c| "0123456789+=".find(c).unwrap() as u32).collect();
        x.extend_from_slice(&line[..11]);
        y.extend_from_slice(&line[8..]);
    }
    (Tensor::from_vec(x, &[n, 11], &Device::Cpu).unwrap(), Tensor::from_vec(y, &[n, 4], &Device::Cpu).unwrap())
}

#[test]
fn the_answer_loss_falls_below_one() {
    let net = Sequential::new()
        .add(Embedding::new(12, 64))
        .add(PositionEmbedding::new(12))
        .add(TransformerBlock::new(4, 16, 256).causal(true).named("block_0"))
        .add(TransformerBlock::new(4, 16, 256).causal(true).named("block_1"))
        .add(LayerNormalization::new().epsilon(1e-5))
        .add(Dense::new(12));
    let mut ctx = Ctx::training(1);
    net.call(&batch(1, 0).0, &mut ctx).unwrap();
    let vars = net.variables();
    let mut opt = Adam::new(LearningRate::CosineDecay {
        initial: 0.0,
        peak: 3e-3,
        warmup_steps: 50,
        decay_steps: 300,
        alpha: 0.05,
    })
    .clip_global_norm(1.0);
    let mut losses = Vec::new();
    for step in 0..300 {
        let (x, y) = batch(128, step + 1);
        let logits = net.call(&x, &mut ctx).unwrap();
        let loss = Tensor::cross_entropy(&logits.narrow(1, 7, 4).unwrap(), &y).unwrap();
        opt.apply(&vars, &loss.backward().unwrap()).unwrap();
        losses.push(loss.to_scalar::<f32>().unwrap());
    }
    let last: f32 = losses[290..].iter().sum::<f32>() / 10.0;
    eprintln!("answer loss: first {}, mean of the last 10 steps {last}", losses[0]);
    assert!(losses[0] > 2.0, "starts near chance: {}", losses[0]);
    assert!(last < 1.0, "mean loss of the last 10 steps {last} (first {})", losses[0]);
}
