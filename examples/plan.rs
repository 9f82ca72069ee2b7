//! Plan a decoder-only transformer over N devices without allocating it: the model is built and
//! traced on the Meta device, so a model far larger than this machine plans in a moment.
//!
//! `cargo run --release --example plan -- --layers 32 --d-model 4096 --heads 32 --vocab 32000 --devices 8`
//!
//! Other flags: `--seq N` and `--batch N` (the batch the activation figures are for, default 1), `--data N`
//! (a data axis), `--json FILE` (save the plan).

use weft::nn::layers::{Embedding, LayerNormalization, PositionEmbedding, TransformerBlock};
use weft::nn::{Layer, Sequential};
use weft::parallel::AutoConfig;
use weft::prelude::*;

fn decoder(layers: usize, d_model: usize, heads: usize, vocab: usize, seq: usize) -> Sequential {
    let tokens = Embedding::new(vocab, d_model).named("tokens");
    let head = tokens.tied_head().named("head");
    let mut net = Sequential::new().named("decoder").add(tokens).add(PositionEmbedding::new(seq).named("positions"));
    for i in 0..layers {
        net = net
            .add(TransformerBlock::new(heads, d_model / heads, 4 * d_model).causal(true).named(&format!("block_{i}")));
    }
    net.add(LayerNormalization::new().epsilon(1e-5).named("ln_f")).add(head)
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let flag = |name: &str, default: usize| -> Result<usize> {
        match args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)) {
            Some(v) => v.parse().map_err(|e| Error::Msg(format!("{name} {v}: {e}"))),
            None => Ok(default),
        }
    };
    let (layers, d_model, heads) = (flag("--layers", 32)?, flag("--d-model", 4096)?, flag("--heads", 32)?);
    let (vocab, devices, data) = (flag("--vocab", 32000)?, flag("--devices", 8)?, flag("--data", 1)?);
    let (seq, batch) = (flag("--seq", 2048)?, flag("--batch", 1)?);
    if heads == 0 || d_model % heads != 0 {
        return Err(Error::Msg(format!("--d-model {d_model} must be a multiple of --heads {heads}")));
    }
    let start = std::time::Instant::now();
    let net = decoder(layers, d_model, heads, vocab, seq);
    let plan = AutoConfig::new().input_dtype(DType::U32).plan(&net, &[batch, seq], devices, data)?;
    let took = start.elapsed();
    let params: usize = net.variables().iter().map(|(_, v)| v.numel()).sum();
    println!("{plan}");
    println!(
        "{:.2}B parameters ({:.1} GiB in f32) planned over {devices} devices in {:.0} ms, nothing allocated",
        params as f64 / 1e9,
        params as f64 * 4.0 / (1u64 << 30) as f64,
        took.as_secs_f64() * 1e3
    );
    if let Some(i) = args.iter().position(|a| a == "--json") {
        let path = args.get(i + 1).ok_or_else(|| Error::Msg("--json needs a file name".into()))?;
        plan.save(path)?;
        println!("saved the plan to {path}");
    }
    Ok(())
}
