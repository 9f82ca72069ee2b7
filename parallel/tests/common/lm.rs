//! The small tied-embedding language model the equivalence tests and the MPI check train: two
//! causal transformer blocks over a vocabulary of 13, whose output projection is its token
//! embedding (so the planner splits both by vocabulary and the loss runs on vocabulary shards).

use weft_nn::Sequential;
use weft_nn::layers::{Embedding, LayerNormalization, PositionEmbedding, TransformerBlock};

/// Sequences of 6 tokens out of 13.
pub fn lm() -> Sequential {
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
