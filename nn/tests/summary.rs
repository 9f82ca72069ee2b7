//! Snapshots of `summary()` for the digits MLP and a 2-block transformer language model.

use weft_core::Device;
use weft_nn::layers::{Dense, Embedding, LayerNormalization, TransformerBlock};
use weft_nn::{Activation, Model, Sequential};

#[test]
fn digits_mlp_summary() {
    let net = Sequential::new()
        .add(Dense::new(128).activation(Activation::Relu))
        .add(Dense::new(64).activation(Activation::Relu))
        .add(Dense::new(10));
    let model = Model::new(net, &Device::Cpu);
    model.build(&[64]).unwrap();
    insta::assert_snapshot!(model.summary(&[64]).unwrap());
}

#[test]
fn two_block_transformer_summary() {
    let net = Sequential::new()
        .named("tiny_gpt")
        .add(Embedding::new(16, 32))
        .add(TransformerBlock::new(4, 8, 128).causal(true).named("block_0"))
        .add(TransformerBlock::new(4, 8, 128).causal(true).named("block_1"))
        .add(LayerNormalization::new())
        .add(Dense::new(16).named("head"));
    let model = Model::new(net, &Device::Cpu);
    model.build(&[12]).unwrap();
    insta::assert_snapshot!(model.summary(&[12]).unwrap());
}
