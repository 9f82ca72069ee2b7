//! all-MiniLM-L6-v2's encoder (6 layers, width 384, 12 heads, random weights: latency does not
//! depend on their values): forward latency of a batch of 8 sequences of 32 tokens, padded
//! sequences masked. `cargo bench --bench minilm`

mod common;

use std::time::Duration;
use weft::nn::Inputs;
use weft::nn::Model;
use weft::nn::models::bert::{BertConfig, bert_encoder};
use weft::prelude::*;

fn main() -> Result<()> {
    // This thread works on the ops with the pool (RAYON_NUM_THREADS or one per core), as a user
    // who sets the thread count does.
    weft::set_num_threads(0)?;
    let cfg = BertConfig::all_minilm_l6_v2();
    let (b, t) = (8, 32);
    for dev in common::devices() {
        let model = Model::new(bert_encoder("minilm", &cfg, true)?, &dev);
        let ids: Vec<u32> = (0..b * t).map(|i| (i * 7919 % 30000) as u32 + 100).collect();
        // Sequences of 32 down to 11 tokens: the rest is padding, masked.
        let keep: Vec<f32> = (0..b * t).map(|i| if i % t < t - 3 * (i / t) { 1.0 } else { 0.0 }).collect();
        let x = Inputs::from([
            ("input_ids", Tensor::from_vec(ids, &[b, t], &dev)?),
            ("attention_mask", Tensor::from_vec(keep, &[b, t], &dev)?),
            ("token_type_ids", Tensor::zeros(&[b, t], &dev)?.to_dtype(DType::U32)?),
        ]);
        let budget = Duration::from_secs(if dev.is_gpu() { 8 } else { 4 });
        let s = common::time_per_call(&dev, budget, 2, || model.predict(&x, b)?.to_vec::<f32>().map(drop))?;
        common::report("minilm_forward", &dev, "b8xt32", s * 1e3, "ms");
    }
    Ok(())
}
