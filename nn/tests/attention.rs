//! MultiHeadAttention against a per-head reference, causality, and the transformer block.

use weft_core::{Device, Tensor};
use weft_nn::layers::{MultiHeadAttention, TransformerBlock};
use weft_nn::{Ctx, Layer};

fn close(a: &Tensor, b: &Tensor, tol: f32) {
    assert_eq!(a.dims(), b.dims());
    for (x, y) in a.to_vec::<f32>().unwrap().iter().zip(b.to_vec::<f32>().unwrap()) {
        assert!((x - y).abs() < tol, "{x} vs {y}");
    }
}

#[test]
fn attention_matches_a_per_head_reference() {
    let (b, t, d, h, k) = (2, 5, 6, 3, 4);
    let dev = Device::Cpu;
    let x = Tensor::rand(-1.0, 1.0, &[b, t, d], 1, &dev).unwrap();
    let mha = MultiHeadAttention::new(h, k).causal(true);
    mha.call(&x, &mut Ctx::inference()).unwrap();
    // Random biases too, so a bias on the wrong axis would show.
    for (i, (_, v)) in mha.variables().iter().enumerate() {
        v.set(&Tensor::rand(-0.5, 0.5, v.dims(), 10 + i as u64, &dev).unwrap()).unwrap();
    }
    let got = mha.call(&x, &mut Ctx::inference()).unwrap();

    let var = |p: &str| mha.variables().into_iter().find(|(n, _)| n == p).unwrap().1.as_tensor().clone();
    let proj = |name: &str| {
        let w = var(&format!("{name}/kernel")).reshape(&[d, h * k]).unwrap();
        let bias = var(&format!("{name}/bias")).reshape(&[h * k]).unwrap();
        // [b, t, h*k] -> [b, h, t, k]
        x.matmul(&w).unwrap().add(&bias).unwrap().reshape(&[b, t, h, k]).unwrap().permute(&[0, 2, 1, 3]).unwrap()
    };
    let (q, kk, v) = (proj("query"), proj("key"), proj("value"));
    let scores = q.matmul(&kk.t().unwrap()).unwrap().mul_scalar(1.0 / (k as f32).sqrt()).unwrap();
    let future: Vec<f32> = (0..t * t).map(|i| if i % t > i / t { 1.0 } else { 0.0 }).collect();
    let scores = scores.masked_fill(&Tensor::from_vec(future, &[t, t], &dev).unwrap(), -1e9).unwrap();
    let heads = scores.softmax(-1).unwrap().matmul(&v).unwrap(); // [b, h, t, k]
    let merged = heads.permute(&[0, 2, 1, 3]).unwrap().reshape(&[b, t, h * k]).unwrap();
    let wo = var("attention_output/kernel").reshape(&[h * k, d]).unwrap();
    let want = merged.matmul(&wo).unwrap().add(&var("attention_output/bias")).unwrap();
    close(&got, &want, 1e-5);
}

#[test]
fn a_causal_position_never_sees_the_future() {
    let dev = Device::Cpu;
    let mha = MultiHeadAttention::new(2, 3).causal(true);
    let x = Tensor::rand(-1.0, 1.0, &[1, 6, 4], 2, &dev).unwrap();
    let y1 = mha.call(&x, &mut Ctx::inference()).unwrap();
    // Change only the last position.
    let tail = Tensor::rand(-1.0, 1.0, &[1, 1, 4], 3, &dev).unwrap();
    let x2 = Tensor::concat(&[x.narrow(1, 0, 5).unwrap(), tail], 1).unwrap();
    let y2 = mha.call(&x2, &mut Ctx::inference()).unwrap();
    close(&y1.narrow(1, 0, 5).unwrap(), &y2.narrow(1, 0, 5).unwrap(), 1e-6);
    let last_moved = (y1.narrow(1, 5, 1).unwrap().sub(&y2.narrow(1, 5, 1).unwrap()).unwrap()).abs().unwrap();
    assert!(last_moved.sum_all().unwrap().to_scalar::<f32>().unwrap() > 1e-4);
}

#[test]
fn every_variable_of_a_transformer_block_gets_a_gradient() {
    let dev = Device::Cpu;
    let block = TransformerBlock::new(2, 4, 16).causal(true).named("block_0");
    let x = Tensor::rand(-1.0, 1.0, &[2, 3, 8], 4, &dev).unwrap();
    let y = block.call(&x, &mut Ctx::training(1)).unwrap();
    assert_eq!(y.dims(), &[2, 3, 8]);
    let vars = block.variables();
    let paths: Vec<&str> = vars.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(
        paths,
        [
            "ln_1/gamma",
            "ln_1/beta",
            "attention/query/kernel",
            "attention/query/bias",
            "attention/key/kernel",
            "attention/key/bias",
            "attention/value/kernel",
            "attention/value/bias",
            "attention/attention_output/kernel",
            "attention/attention_output/bias",
            "ln_2/gamma",
            "ln_2/beta",
            "mlp/up/kernel",
            "mlp/up/bias",
            "mlp/down/kernel",
            "mlp/down/bias",
        ]
    );
    let grads = y.square().unwrap().sum_all().unwrap().backward().unwrap();
    for (p, v) in &vars {
        let g = grads.get(v).unwrap_or_else(|| panic!("{p} got no gradient"));
        assert_eq!(g.dims(), v.dims(), "{p}");
    }
}

/// Finite differences through whole layers: the gradient `backward()` gives each variable of a
/// transformer block (attention, layer norms, MLP) matches (L(w + e) - L(w - e)) / 2e.
#[test]
fn layer_gradients_match_finite_differences() {
    let dev = Device::Cpu;
    let block = TransformerBlock::new(2, 3, 8).causal(true);
    let x = Tensor::rand(-1.0, 1.0, &[2, 4, 6], 7, &dev).unwrap();
    let weights = Tensor::rand(0.5, 1.5, &[2, 4, 6], 8, &dev).unwrap();
    let loss = || block.call(&x, &mut Ctx::inference()).unwrap().mul(&weights).unwrap().sum_all().unwrap();
    loss();
    // Random biases and norms, so every variable matters.
    for (i, (_, v)) in block.variables().iter().enumerate() {
        v.set(&Tensor::rand(-0.5, 0.5, v.dims(), 20 + i as u64, &dev).unwrap().add(&v.as_tensor().clone()).unwrap())
            .unwrap();
    }
    let grads = loss().backward().unwrap();
    let eps = 1e-2f32;
    for (path, v) in block.variables() {
        let analytic = grads.get(&v).unwrap().to_vec::<f32>().unwrap();
        let base = v.to_vec::<f32>().unwrap();
        // Three entries of each variable: first, middle, last.
        for &j in &[0, base.len() / 2, base.len() - 1] {
            let at = |d: f32| {
                let mut w = base.clone();
                w[j] += d;
                v.set(&Tensor::from_vec(w, v.dims(), &dev).unwrap()).unwrap();
                loss().to_scalar::<f32>().unwrap()
            };
            let numeric = (at(eps) - at(-eps)) / (2.0 * eps);
            v.set(&Tensor::from_vec(base.clone(), v.dims(), &dev).unwrap()).unwrap();
            let a = analytic[j];
            assert!(
                (numeric - a).abs() <= 2e-2 * a.abs().max(1.0),
                "{path}[{j}]: backward {a}, finite difference {numeric}"
            );
        }
    }
}
