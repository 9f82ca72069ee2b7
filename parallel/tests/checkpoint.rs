//! Checkpoints do not depend on the device count: train on 2 devices, save, resume on 3, and get
//! what training on without a stop gives; single-device checkpoints load into a mesh and back.

use std::collections::HashMap;
use weft_core::{DType, Device, Tensor};
use weft_nn::layers::{Embedding, LayerNormalization, PositionEmbedding, TransformerBlock};
use weft_nn::optim::{Adam, LearningRate};
use weft_nn::{Loss, Model, Sequential};
use weft_parallel::{AutoConfig, DeviceMesh, ShardedModel};

fn lm() -> Sequential {
    lm_with_dropout(0.0)
}

fn lm_with_dropout(rate: f32) -> Sequential {
    let tokens = Embedding::new(11, 12).named("tokens");
    let head = tokens.tied_head().named("head");
    Sequential::new()
        .named("lm")
        .add(tokens)
        .add(PositionEmbedding::new(5).named("positions"))
        .add(TransformerBlock::new(3, 4, 14).causal(true).dropout(rate).named("block_0"))
        .add(LayerNormalization::new().named("ln_f"))
        .add(head)
}

fn adam() -> Adam {
    Adam::new(LearningRate::CosineDecay { initial: 0.0, peak: 1e-2, warmup_steps: 2, decay_steps: 8, alpha: 0.1 })
        .clip_global_norm(0.5)
}

const LOSS: Loss = Loss::SparseCategoricalCrossentropy { from_logits: true };

fn batch(step: u64) -> (Tensor, Tensor) {
    let ids: Vec<u32> = (0..6 * 5).map(|i| ((i as u64 * 5 + step * 3) % 11) as u32).collect();
    let next: Vec<u32> = ids.iter().map(|i| (i * 2 + 1) % 11).collect();
    (Tensor::from_vec(ids, &[6, 5], &Device::Cpu).unwrap(), Tensor::from_vec(next, &[6, 5], &Device::Cpu).unwrap())
}

fn sharded(n: usize) -> ShardedModel {
    sharded_of(lm, n)
}

fn sharded_of(net: fn() -> Sequential, n: usize) -> ShardedModel {
    let plan = AutoConfig::new().min_params(0).input_dtype(DType::U32).plan(&net(), &[6, 5], n, 1).unwrap();
    let mut m = ShardedModel::new(net, &DeviceMesh::cpus(n).unwrap(), &plan).unwrap();
    m.compile(adam(), LOSS, &[]).unwrap();
    m
}

fn assert_same(a: &HashMap<String, Tensor>, b: &HashMap<String, Tensor>, tol: f32) {
    assert_eq!(a.len(), b.len());
    for (k, x) in a {
        let (x, y) = (x.to_vec::<f32>().unwrap(), b[k].to_vec::<f32>().unwrap());
        let scale = x.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-3);
        let d = x.iter().zip(&y).fold(0f32, |m, (p, q)| m.max((p - q).abs()));
        // The key bias has no gradient (softmax ignores it): compare it in absolute terms.
        let ok = d <= tol * scale || (k.contains("key/bias") && d < 1e-4);
        assert!(ok, "{k}: differs by {d} (scale {scale})");
    }
}

#[test]
fn train_on_two_save_resume_on_three_equals_training_on() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("step4.safetensors");
    let mut two = sharded(2);
    for s in 0..4 {
        let (x, y) = batch(s);
        two.train_on_batch(&x, &y).unwrap();
    }
    two.save_checkpoint(&file).unwrap();
    let mut three = sharded(3);
    three.load_checkpoint(&file).unwrap();
    for s in 4..8 {
        let (x, y) = batch(s);
        three.train_on_batch(&x, &y).unwrap();
        two.train_on_batch(&x, &y).unwrap();
    }
    let (a, b): (HashMap<_, _>, HashMap<_, _>) =
        (three.full_state().unwrap().into_iter().collect(), two.full_state().unwrap().into_iter().collect());
    assert_eq!(a["optimizer/iterations"].to_vec::<f32>().unwrap(), vec![8.0]);
    assert_same(&a, &b, 1e-4);

    // One device reads the same file: weights, slots and the step counter.
    let mut one = Model::new(lm(), &Device::Cpu);
    one.compile(adam(), LOSS, &[]).unwrap();
    one.build(&[5]).unwrap();
    one.load_checkpoint(&file).unwrap();
    assert_eq!(one.optimizer().unwrap().iterations(), 4);
    assert!(one.optimizer().unwrap().slot("lm/block_0/mlp/up/kernel", "m").is_some());
}

#[test]
fn a_single_device_checkpoint_loads_into_any_mesh() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("one.safetensors");
    let mut one = Model::new(lm(), &Device::Cpu);
    one.compile(adam(), LOSS, &[]).unwrap();
    for s in 0..2 {
        let (x, y) = batch(s);
        one.train_on_batch(&x, &y).unwrap();
    }
    one.save_checkpoint(&file).unwrap();
    let mut want: HashMap<String, Tensor> =
        one.variables().into_iter().map(|(p, v)| (p, v.as_tensor().clone())).collect();
    for (p, n, t) in one.optimizer().unwrap().slots() {
        want.insert(weft_nn::checkpoint::slot_key(&n, &p), t);
    }
    want.insert("optimizer/iterations".into(), Tensor::from_vec(vec![2f32], &[1], &Device::Cpu).unwrap());
    for n in [2, 3, 4] {
        let mut m = sharded(n);
        m.load_checkpoint(&file).unwrap();
        let got: HashMap<String, Tensor> = m.full_state().unwrap().into_iter().collect();
        assert_same(&want, &got, 0.0);
    }
}

#[test]
fn a_checkpoint_of_another_model_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("other.safetensors");
    let other = Model::new(Sequential::new().named("lm").add(Embedding::new(11, 8).named("tokens")), &Device::Cpu);
    other.build(&[5]).unwrap();
    other.save_weights(&file).unwrap();
    let mut m = sharded(2);
    let before = m.full_state().unwrap();
    let e = m.load_checkpoint(&file).unwrap_err().to_string();
    assert!(e.contains("lm/tokens/embeddings") && e.contains("[11, 8]"), "{e}");
    let after = m.full_state().unwrap();
    for ((k, a), (_, b)) in before.iter().zip(&after) {
        assert_eq!(a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap(), "{k} changed");
    }
}

/// With dropout, a resumed sharded model draws the masks of the steps it resumes at (the step
/// counter is in the checkpoint): stopping after 3 steps and resuming on another device count
/// trains as going on without a stop. Were the counter lost, steps 4..6 would redraw the masks
/// of steps 1..3 and the weights would differ.
#[test]
fn a_resumed_sharded_model_draws_the_dropout_masks_of_its_steps() {
    let sharded = |n: usize| sharded_of(|| lm_with_dropout(0.3), n);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("step3.safetensors");
    let mut on = sharded(2);
    for s in 0..3 {
        let (x, y) = batch(s);
        on.train_on_batch(&x, &y).unwrap();
    }
    on.save_checkpoint(&file).unwrap();
    // The control: the same state with the step counter written as 0.
    use weft_nn::checkpoint::{ITERATIONS_META, STEP_META, save_with_metadata};
    let reset = dir.path().join("step3_counter0.safetensors");
    save_with_metadata(&reset, &on.full_state().unwrap(), &[(STEP_META, "0".into()), (ITERATIONS_META, "3".into())])
        .unwrap();
    let mut resumed = sharded(3);
    resumed.load_checkpoint(&file).unwrap();
    let mut fresh = sharded(3);
    for s in 3..6 {
        let (x, y) = batch(s);
        on.train_on_batch(&x, &y).unwrap();
        resumed.train_on_batch(&x, &y).unwrap();
    }
    let (a, b): (HashMap<_, _>, HashMap<_, _>) =
        (resumed.full_state().unwrap().into_iter().collect(), on.full_state().unwrap().into_iter().collect());
    assert_same(&a, &b, 1e-4);
    // The control, resumed with the counter at 0, draws other masks and trains differently.
    fresh.load_checkpoint(&reset).unwrap();
    for s in 3..6 {
        let (x, y) = batch(s);
        fresh.train_on_batch(&x, &y).unwrap();
    }
    let c: HashMap<_, _> = fresh.full_state().unwrap().into_iter().collect();
    let differs = c.iter().any(|(k, x)| {
        let (x, y) = (x.to_vec::<f32>().unwrap(), b[k].to_vec::<f32>().unwrap());
        x.iter().zip(&y).any(|(p, q)| (p - q).abs() > 1e-3 * p.abs().max(1e-2))
    });
    assert!(differs, "masks redrawn from step 0 should train differently: the test would not notice a lost counter");
}
