//! Text classifiers a user brings, beyond the MLP and CNN: an LSTM and a GRU (Embedding 5000x64,
//! LSTM or GRU 128, Dense 2; batch 64 of 64 tokens) and a small transformer encoder (Embedding 5000x128,
//! two pre-norm blocks of 4 heads x 32 and an MLP of 256, mean over time, Dense 2; batch 32 of 64
//! tokens), Adam, softmax cross-entropy on logits: training steps/s and inference samples/s, on
//! every device found. `benches/peers/text_keras.py` builds the same models in Keras:
//! `bash benches/peers/text_side.sh` runs both. `cargo bench --bench text_models`

mod common;

use std::time::Duration;
use weft::nn::layers::{Dense, Embedding, GRU, GlobalAveragePooling1D, LSTM, TransformerBlock};
use weft::nn::optim::Adam;
use weft::nn::{Loss, Model, Sequential};
use weft::prelude::*;

const VOCAB: usize = 5000;
const LEN: usize = 64;

fn main() -> Result<()> {
    // As the other benches measured against peers do: the calling thread works on each op.
    weft::set_num_threads(0)?;
    for dev in common::devices() {
        let lstm = Sequential::new().add(Embedding::new(VOCAB, 64)).add(LSTM::new(128)).add(Dense::new(2));
        measure("text_lstm", lstm, 64, &dev)?;
        let gru = Sequential::new().add(Embedding::new(VOCAB, 64)).add(GRU::new(128)).add(Dense::new(2));
        measure("text_gru", gru, 64, &dev)?;
        let mut encoder = Sequential::new().add(Embedding::new(VOCAB, 128));
        for _ in 0..2 {
            encoder = encoder.add(TransformerBlock::new(4, 32, 256));
        }
        let encoder = encoder.add(GlobalAveragePooling1D::new()).add(Dense::new(2));
        measure("text_transformer", encoder, 32, &dev)?;
    }
    Ok(())
}

/// Training steps/s on one batch of `b` random token rows, and inference samples/s over four.
fn measure(name: &str, net: Sequential, b: usize, dev: &Device) -> Result<()> {
    let mut model = Model::new(net, dev);
    model.compile(Adam::new(1e-3), Loss::SparseCategoricalCrossentropy { from_logits: true }, &[])?;
    let tokens = |rows: usize| (0..rows * LEN).map(|i| ((i * 7919 + 13) % (VOCAB - 1) + 1) as u32).collect();
    let x = Tensor::from_vec(tokens(b), &[b, LEN], dev)?;
    let y = Tensor::from_vec((0..b as u32).map(|i| i % 2).collect(), &[b], dev)?;
    let budget = Duration::from_secs(if dev.is_gpu() { 6 } else { 4 });
    let secs = common::time_per_call(dev, budget, 3, || model.train_on_batch(&x, &y).map(drop))?;
    let size = format!("b{b}x{LEN}");
    common::report(&format!("{name}_train_step"), dev, &size, 1.0 / secs, "steps/s");
    let xi = Tensor::from_vec(tokens(4 * b), &[4 * b, LEN], dev)?;
    let secs = common::time_per_call(dev, budget, 3, || model.predict(&xi, b)?.to_vec::<f32>().map(drop))?;
    common::report(&format!("{name}_infer"), dev, &size, (4 * b) as f64 / secs, "samples/s");
    Ok(())
}
