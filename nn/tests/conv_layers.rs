//! Convolution layers in use: grouped convolutions keep their blocks of channels apart, and
//! groups that do not divide the channels are an `Err`. (Values against Keras are in
//! keras_conformance.rs.)

use weft_core::{Device, Tensor};
use weft_nn::{Ctx, Layer};

/// Grouped convolutions: each block of filters sees its block of channels only, so changing
/// the second block of input channels leaves the first block of outputs as it was; groups that
/// do not divide the channels are an `Err` naming the layer.
#[test]
fn grouped_convolutions_keep_their_blocks_apart() {
    use weft_nn::layers::Conv2D;
    let ctx = &mut Ctx::inference();
    let conv = Conv2D::new(4, [3, 3]).groups(2).named("grouped");
    let x = Tensor::rand(-1.0, 1.0, &[1, 4, 4, 6], 1, &Device::Cpu).unwrap();
    let y = conv.call(&x, ctx).unwrap();
    assert_eq!(conv.variables()[0].1.dims(), &[3, 3, 3, 4]);
    let other = Tensor::rand(-1.0, 1.0, &[1, 4, 4, 3], 2, &Device::Cpu).unwrap();
    let x2 = Tensor::concat(&[x.narrow(-1, 0, 3).unwrap(), other], -1).unwrap();
    let y2 = conv.call(&x2, ctx).unwrap();
    let block = |t: &Tensor, i: usize| t.narrow(-1, 2 * i, 2).unwrap().contiguous().unwrap().to_vec::<f32>().unwrap();
    assert_eq!(block(&y, 0), block(&y2, 0));
    assert_ne!(block(&y, 1), block(&y2, 1));
    let e = Conv2D::new(4, [3, 3]).groups(3).named("bad").call(&x, ctx).unwrap_err().to_string();
    assert!(e.contains("bad") && e.contains("groups"), "{e}");
}
