//! all-MiniLM-L6-v2's encoder (6 layers, width 384, 12 heads, random weights: latency does not
//! depend on their values): forward latency of a batch of 8 sequences of 32 tokens, padded
//! sequences masked, and the products' share of the device's FMA ceiling (`Device::fma_peak`).
//! `cargo bench --bench minilm`; `WEFT_MINILM_SHAPE=1x128` (batch x tokens, up
//! to 512 tokens) measures another shape: one long request, a larger batch.

mod common;

use std::time::Duration;
use weft::nn::Inputs;
use weft::nn::Model;
use weft::nn::models::bert::{BertConfig, bert_encoder};
use weft::prelude::*;

fn main() -> Result<()> {
    // The thread count a user sets (RAYON_NUM_THREADS or one per core); this thread works on
    // each op beside weft's helpers.
    weft::set_num_threads(0)?;
    let cfg = BertConfig::all_minilm_l6_v2();
    let (b, t) = shape()?;
    // The products' FLOPs (padding included, as it is computed): per layer the four projections
    // and the two feed-forward products over every token, and the attention's scores and
    // weighted values over every pair of a sequence's tokens.
    let (h, ff) = (cfg.hidden_size, cfg.intermediate_size);
    let per_layer = 2 * b * t * h * (4 * h + 2 * ff) + 4 * b * t * t * h;
    let flops = (cfg.num_hidden_layers * per_layer) as f64;
    for dev in common::devices() {
        let peak = dev.fma_peak()?;
        let model = Model::new(bert_encoder("minilm", &cfg, true)?, &dev);
        let ids: Vec<u32> = (0..b * t).map(|i| (i * 7919 % 30000) as u32 + 100).collect();
        // Sequence j keeps t - (3 j mod (2t/3 + 1)) tokens (32 down to 11 for 8 x 32): the rest
        // is padding, masked.
        let keep: Vec<f32> =
            (0..b * t).map(|i| if i % t < t - (3 * (i / t)) % (2 * t / 3 + 1) { 1.0 } else { 0.0 }).collect();
        let x = Inputs::from([
            ("input_ids", Tensor::from_vec(ids, &[b, t], &dev)?),
            ("attention_mask", Tensor::from_vec(keep, &[b, t], &dev)?),
            ("token_type_ids", Tensor::zeros(&[b, t], &dev)?.to_dtype(DType::U32)?),
        ]);
        let budget = Duration::from_secs(if dev.is_gpu() { 8 } else { 4 });
        let s = common::time_per_call(&dev, budget, 2, || model.predict(&x, b)?.to_vec::<f32>().map(drop))?;
        common::report("minilm_forward", &dev, &format!("b{b}xt{t}"), s * 1e3, "ms");
        common::report_share("minilm_forward_of_fma_peak", &dev, &format!("b{b}xt{t}"), flops / s, peak);
    }
    Ok(())
}

/// The batch and sequence length: `WEFT_MINILM_SHAPE` (`BxT`), default 8 x 32.
fn shape() -> Result<(usize, usize)> {
    let Ok(s) = std::env::var("WEFT_MINILM_SHAPE") else { return Ok((8, 32)) };
    let bad = || Error::Msg(format!("WEFT_MINILM_SHAPE={s:?}: want BATCHxTOKENS, each at least 1, tokens at most 512"));
    let (b, t) = s.split_once('x').ok_or_else(bad)?;
    let (b, t): (usize, usize) = (b.trim().parse().map_err(|_| bad())?, t.trim().parse().map_err(|_| bad())?);
    if b == 0 || t == 0 || t > 512 {
        return Err(bad());
    }
    Ok((b, t))
}
