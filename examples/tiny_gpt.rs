//! A character-level decoder-only transformer.
//!
//! By default it learns a task it can be graded on exactly: adding two 3-digit numbers written as
//! text, `123+456=0579` (operands and sum zero-padded, so every line has the same length), and
//! reports exact-match accuracy on sums it never saw, decoding the answer one character at a
//! time. `--text FILE` trains it on any text file instead and samples from it.
//!
//! `cargo run --release --example tiny_gpt` (`-- --steps N` to change the training length)

use weft::nn::layers::{Dense, Embedding, LayerNormalization, PositionEmbedding, TransformerBlock};
use weft::nn::optim::{Adam, LearningRate, Optimizer};
use weft::nn::{Ctx, Layer, Sequential};
use weft::prelude::*;

fn gpt(vocab: usize, max_len: usize, width: usize, blocks: usize) -> Sequential {
    let mut net = Sequential::new()
        .named("tiny_gpt")
        .add(Embedding::new(vocab, width).named("tokens"))
        .add(PositionEmbedding::new(max_len).named("positions"));
    for i in 0..blocks {
        net = net.add(TransformerBlock::new(4, width / 4, 4 * width).causal(true).named(&format!("block_{i}")));
    }
    net.add(LayerNormalization::new().epsilon(1e-5).named("ln_f")).add(Dense::new(vocab).named("head"))
}

#[path = "common/addition.rs"]
mod addition;
use addition::{CHARS, encode, held_out, sample};

/// A batch of `n` training lines (drawn from the pairs not held out): inputs are the
/// first 11 characters, targets the 4 answer characters.
fn batch(n: usize, step: u64, dev: &Device) -> Result<(Tensor, Tensor)> {
    let key = weft::core::rng::seed_key(step);
    let (mut x, mut y) = (Vec::with_capacity(n * 11), Vec::with_capacity(n * 4));
    for j in 0..n as u32 {
        let mut i = (weft::core::rng::uniform(key, j) * 1_000_000.0) as u32 % 1_000_000;
        while held_out(i) {
            i = (i + 1) % 1_000_000;
        }
        let t = encode(&sample(i));
        x.extend_from_slice(&t[..11]);
        y.extend_from_slice(&t[8..]);
    }
    Ok((Tensor::from_vec(x, &[n, 11], dev)?, Tensor::from_vec(y, &[n, 4], dev)?))
}

/// Exact-match accuracy on `n` held-out sums, decoding the 4 answer characters greedily.
fn accuracy(net: &Sequential, n: usize, dev: &Device) -> Result<f32> {
    let lines: Vec<String> = (0..1_000_000u32).step_by(7).filter(|&i| held_out(i)).take(n).map(sample).collect();
    let mut seqs: Vec<Vec<u32>> = lines.iter().map(|l| encode(&l[..8])).collect();
    no_grad(|| -> Result<()> {
        for _ in 0..4 {
            let len = seqs[0].len();
            let flat: Vec<u32> = seqs.iter().flatten().copied().collect();
            let logits = net.call(&Tensor::from_vec(flat, &[n, len], dev)?, &mut Ctx::inference())?;
            let next = logits.narrow(1, len - 1, 1)?.argmax(-1, false)?.to_vec::<u32>()?;
            for (s, c) in seqs.iter_mut().zip(next) {
                s.push(c);
            }
        }
        Ok(())
    })?;
    let right = seqs.iter().zip(&lines).filter(|(s, l)| encode(l) == **s).count();
    Ok(right as f32 / n as f32)
}

fn train_addition(steps: u64, dev: &Device) -> Result<()> {
    let net = gpt(CHARS.len(), 12, 64, 2);
    let (x, _) = batch(1, 0, dev)?;
    net.call(&x, &mut Ctx::inference())?; // build
    let vars = net.variables();
    let params: usize = vars.iter().map(|(_, v)| v.numel()).sum();
    println!("tiny_gpt: {params} parameters, learning 3-digit addition on {}", dev.describe());
    let schedule =
        LearningRate::CosineDecay { initial: 0.0, peak: 3e-3, warmup_steps: 100, decay_steps: steps, alpha: 0.05 };
    let mut opt = Adam::new(schedule).clip_global_norm(1.0);
    let mut ctx = Ctx::training(1);
    let start = std::time::Instant::now();
    for step in 0..steps {
        let (x, y) = batch(128, step + 1, dev)?;
        ctx.step = step;
        let logits = net.call(&x, &mut ctx)?;
        // Only the answer is graded: the operands are random and cannot be predicted.
        let loss = Tensor::cross_entropy(&logits.narrow(1, 7, 4)?, &y)?;
        let grads = loss.backward()?;
        opt.apply(&vars, &grads)?;
        if (step + 1) % 250 == 0 || step + 1 == steps {
            println!(
                "step {:5}  loss {:.4}  lr {:.2e}  held-out exact match {:.1}%  ({:.0}s)",
                step + 1,
                loss.to_scalar::<f32>()?,
                opt.learning_rate(),
                100.0 * accuracy(&net, 500, dev)?,
                start.elapsed().as_secs_f32()
            );
        }
    }
    let acc = accuracy(&net, 2000, dev)?;
    println!("exact-match accuracy on 2,000 held-out sums: {:.2}%", 100.0 * acc);
    Ok(())
}

fn train_text(path: &str, steps: u64, dev: &Device) -> Result<()> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::Msg(format!("reading {path}: {e}")))?;
    let mut chars: Vec<char> = text.chars().collect::<std::collections::BTreeSet<_>>().into_iter().collect();
    chars.sort_unstable();
    let ids: Vec<u32> = text.chars().map(|c| chars.binary_search(&c).unwrap_or(0) as u32).collect();
    let ctx_len = 64;
    if ids.len() <= ctx_len + 1 {
        return Err(Error::Msg(format!("{path} is too short: need more than {} characters", ctx_len + 1)));
    }
    let net = gpt(chars.len(), ctx_len, 128, 4);
    net.call(&Tensor::from_vec(ids[..ctx_len].to_vec(), &[1, ctx_len], dev)?, &mut Ctx::inference())?;
    let vars = net.variables();
    let mut opt = Adam::new(LearningRate::CosineDecay {
        initial: 0.0,
        peak: 2e-3,
        warmup_steps: 100,
        decay_steps: steps,
        alpha: 0.1,
    });
    let mut ctx = Ctx::training(1);
    for step in 0..steps {
        let key = weft::core::rng::seed_key(step);
        let (mut x, mut y) = (Vec::new(), Vec::new());
        for j in 0..32u32 {
            let s = (weft::core::rng::uniform(key, j) * (ids.len() - ctx_len - 1) as f32) as usize;
            x.extend_from_slice(&ids[s..s + ctx_len]);
            y.extend_from_slice(&ids[s + 1..s + ctx_len + 1]);
        }
        ctx.step = step;
        let logits = net.call(&Tensor::from_vec(x, &[32, ctx_len], dev)?, &mut ctx)?;
        let loss = Tensor::cross_entropy(&logits, &Tensor::from_vec(y, &[32, ctx_len], dev)?)?;
        opt.apply(&vars, &loss.backward()?)?;
        if (step + 1) % 100 == 0 {
            println!("step {:5}  loss {:.4}", step + 1, loss.to_scalar::<f32>()?);
        }
    }
    // Sample greedily from the first line's start.
    let mut out: Vec<u32> = ids[..8].to_vec();
    no_grad(|| -> Result<()> {
        for _ in 0..200 {
            let window = &out[out.len().saturating_sub(ctx_len)..];
            let logits = net.call(&Tensor::from_slice(window, &[1, window.len()], dev)?, &mut Ctx::inference())?;
            out.push(logits.narrow(1, window.len() - 1, 1)?.argmax(-1, false)?.to_vec::<u32>()?[0]);
        }
        Ok(())
    })?;
    println!("{}", out.iter().map(|&i| chars[i as usize]).collect::<String>());
    Ok(())
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let flag = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let steps: u64 =
        flag("--steps").map_or(Ok(1000), |s| s.parse()).map_err(|e| Error::Msg(format!("--steps: {e}")))?;
    let dev = Device::from_env()?;
    match flag("--text") {
        Some(path) => train_text(&path, steps, &dev),
        None => train_addition(steps, &dev),
    }
}
