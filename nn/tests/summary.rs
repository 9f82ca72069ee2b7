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

/// Expanded, each layer's sublayers follow it, indented; a layer that records no op at
/// inference (dropout) shows the shape it passes on; an image model fixed in size by its
/// Flatten shows its spatial axes, not `None`; after training the optimizer's state is counted.
#[test]
fn expanded_and_trained_summaries() {
    use weft_core::Tensor;
    use weft_nn::layers::{Conv2D, Dropout, Flatten};
    let net = Sequential::new()
        .named("cnn")
        .add(Conv2D::new(4, [3, 3]).activation(Activation::Relu))
        .add(Dropout::new(0.5))
        .add(Flatten::new())
        .add(Dense::new(3));
    let mut model = Model::new(net, &Device::Cpu);
    model.build(&[6, 6, 2]).unwrap();
    let s = model.summary(&[6, 6, 2]).unwrap();
    assert!(s.contains("│ dropout (Dropout)               │ (None, 4, 4, 4)"), "{s}");
    assert!(s.contains("│ dense (Dense)                   │ (None, 3)"), "{s}");
    let x = Tensor::zeros(&[4, 6, 6, 2], &Device::Cpu).unwrap();
    let y = Tensor::zeros(&[4, 3], &Device::Cpu).unwrap();
    model.compile(weft_nn::optim::Adam::new(1e-3), weft_nn::Loss::MeanSquaredError, &[]).unwrap();
    model.train_on_batch(&x, &y).unwrap();
    insta::assert_snapshot!(model.summary(&[6, 6, 2]).unwrap());

    let lm = Sequential::new()
        .named("lm")
        .add(Embedding::new(16, 8))
        .add(TransformerBlock::new(2, 4, 16).named("block"))
        .add(Dense::new(16).named("head"));
    let model = Model::new(lm, &Device::Cpu);
    model.build(&[5]).unwrap();
    let x = Tensor::zeros(&[1, 5], &Device::Cpu).unwrap().to_dtype(weft_core::DType::U32).unwrap();
    insta::assert_snapshot!(model.summary_with(&x, true).unwrap());
}
