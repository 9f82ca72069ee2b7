//! The model the tensor-parallel example trains and `benches/tp_step.rs` times: tiny_gpt for the
//! addition task, with a head tied to the token embedding (so the vocabulary splits over devices)
//! and the question positions cropped before it (only the 4 answer characters are graded).

use weft::nn::Sequential;
use weft::nn::layers::{Cropping1D, Embedding, LayerNormalization, PositionEmbedding, TransformerBlock};

/// Characters: digits, `+` and `=`.
pub const VOCAB: usize = 12;

/// Token and position embeddings over 11 positions, two causal blocks of width 64, and the tied head.
pub fn gpt() -> Sequential {
    let tokens = Embedding::new(VOCAB, 64).named("tokens");
    let head = tokens.tied_head().named("head");
    Sequential::new()
        .named("tiny_gpt")
        .add(tokens)
        .add(PositionEmbedding::new(11).named("positions"))
        .add(TransformerBlock::new(4, 16, 256).causal(true).named("block_0"))
        .add(TransformerBlock::new(4, 16, 256).causal(true).named("block_1"))
        .add(LayerNormalization::new().epsilon(1e-5).named("ln_f"))
        .add(Cropping1D::new(7, 0).named("answer"))
        .add(head)
}
