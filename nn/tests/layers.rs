//! Layers against hand computations, naming, lazy building and errors.

use weft_core::{Device, Tensor};
use weft_nn::layers::{ActivationLayer, Dense, Dropout, Flatten};
use weft_nn::{Activation, Ctx, Initializer, Layer, Loss, Sequential};

#[test]
fn dense_is_x_times_kernel_plus_bias() {
    let layer = Dense::new(2).activation(Activation::Relu).bias_initializer(Initializer::Ones);
    let x = Tensor::from_vec(vec![1f32, 2., 3., -1., 0., 1.], &[2, 3], &Device::Cpu).unwrap();
    let y = layer.call(&x, &mut Ctx::inference()).unwrap().to_vec::<f32>().unwrap();
    let vars = layer.variables();
    assert_eq!(vars.iter().map(|v| v.0.as_str()).collect::<Vec<_>>(), ["kernel", "bias"]);
    let k = vars[0].1.to_vec::<f32>().unwrap();
    let want: Vec<f32> = (0..2)
        .flat_map(|r| {
            let xr = [[1f32, 2., 3.], [-1., 0., 1.]][r];
            let k = &k;
            (0..2).map(move |c| ((0..3).map(|i| xr[i] * k[i * 2 + c]).sum::<f32>() + 1.0).max(0.0))
        })
        .collect();
    for (g, w) in y.iter().zip(&want) {
        assert!((g - w).abs() < 1e-6, "{y:?} vs {want:?}");
    }
}

#[test]
fn sequential_names_layers_and_variable_paths() {
    let net = Sequential::new()
        .add(Dense::new(4))
        .add(ActivationLayer::new(Activation::Tanh))
        .add(Dense::new(3).named("head"))
        .add(Dense::new(2));
    net.call(&Tensor::ones(&[1, 5], &Device::Cpu).unwrap(), &mut Ctx::inference()).unwrap();
    let paths: Vec<String> = net.variables().into_iter().map(|v| v.0).collect();
    assert_eq!(paths, ["dense/kernel", "dense/bias", "head/kernel", "head/bias", "dense_1/kernel", "dense_1/bias"]);
}

#[test]
fn describe_lists_kinds_variables_and_sublayers() {
    let net = Sequential::new().add(Dense::new(4)).add(Dense::new(2).use_bias(false));
    net.call(&Tensor::ones(&[1, 3], &Device::Cpu).unwrap(), &mut Ctx::inference()).unwrap();
    let info = net.describe();
    assert_eq!((info.name.as_str(), info.kind.as_str()), ("sequential", "Sequential"));
    assert!(info.variables.is_empty());
    let kinds: Vec<(&str, &str)> = info.sublayers.iter().map(|s| (s.name.as_str(), s.kind.as_str())).collect();
    assert_eq!(kinds, [("dense", "Dense"), ("dense_1", "Dense")]);
    assert_eq!(info.sublayers[0].variables, vec![("kernel".to_string(), vec![3, 4]), ("bias".to_string(), vec![4])]);
    assert_eq!(info.total_params(), 3 * 4 + 4 + 4 * 2);
}

#[test]
fn initializers_have_the_right_spread() {
    let dev = Device::Cpu;
    let stats = |i: Initializer, shape: &[usize]| {
        let v = i.init(shape, 5, &dev).unwrap().to_vec::<f32>().unwrap();
        let n = v.len() as f32;
        let mean = v.iter().sum::<f32>() / n;
        let std = (v.iter().map(|x| (x - mean) * (x - mean)).sum::<f32>() / n).sqrt();
        let max = v.iter().fold(0f32, |m, x| m.max(x.abs()));
        (mean, std, max)
    };
    let (fan_in, fan_out) = (200usize, 100usize);
    let glorot = (6.0 / (fan_in + fan_out) as f32).sqrt();
    let (m, s, max) = stats(Initializer::GlorotUniform, &[fan_in, fan_out]);
    assert!(m.abs() < 0.01 && (s - glorot / 3f32.sqrt()).abs() < 0.01 && max <= glorot, "{m} {s} {max}");
    let (_, s, _) = stats(Initializer::GlorotNormal, &[fan_in, fan_out]);
    assert!((s - (2.0 / 300f32).sqrt()).abs() < 0.01);
    let (_, s, max) = stats(Initializer::HeUniform, &[fan_in, fan_out]);
    assert!((s - (6.0 / 200f32).sqrt() / 3f32.sqrt()).abs() < 0.01 && max <= (6.0 / 200f32).sqrt());
    let (_, s, _) = stats(Initializer::HeNormal, &[fan_in, fan_out]);
    assert!((s - 0.1).abs() < 0.01);
    let (_, _, max) = stats(Initializer::TruncatedNormal(0.5), &[fan_in, fan_out]);
    assert!(max <= 1.0, "truncated at two std: {max}");
    let (_, s, _) = stats(Initializer::Normal(0.3), &[fan_in, fan_out]);
    assert!((s - 0.3).abs() < 0.01);
    assert_eq!(stats(Initializer::Zeros, &[3]).2, 0.0);
    assert_eq!(stats(Initializer::Ones, &[3]), (1.0, 0.0, 1.0));
    // Seeded: the same seed gives the same weights.
    let a = Initializer::GlorotUniform.init(&[4, 4], 9, &dev).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(a, Initializer::GlorotUniform.init(&[4, 4], 9, &dev).unwrap().to_vec::<f32>().unwrap());
}

#[test]
fn a_wrong_input_shape_names_the_layer_path_and_both_shapes() {
    let net = Sequential::new().add(Dense::new(4)).add(Dense::new(2));
    net.call(&Tensor::ones(&[1, 5], &Device::Cpu).unwrap(), &mut Ctx::inference()).unwrap();
    let err = net.call(&Tensor::ones(&[1, 6], &Device::Cpu).unwrap(), &mut Ctx::inference()).unwrap_err().to_string();
    assert!(err.contains("sequential/dense") && err.contains("[1, 6]") && err.contains("[5, 4]"), "{err}");
}

#[test]
fn dropout_only_while_training_and_flatten() {
    let x = Tensor::ones(&[4, 2, 8], &Device::Cpu).unwrap();
    let flat = Flatten::new().call(&x, &mut Ctx::inference()).unwrap();
    assert_eq!(flat.dims(), &[4, 16]);
    let d = Dropout::new(0.5);
    let same = d.call(&flat, &mut Ctx::inference()).unwrap().to_vec::<f32>().unwrap();
    assert!(same.iter().all(|&v| v == 1.0));
    let dropped = d.call(&flat, &mut Ctx::training(3)).unwrap().to_vec::<f32>().unwrap();
    let zeros = dropped.iter().filter(|&&v| v == 0.0).count();
    assert!(zeros > 10 && zeros < 54, "{zeros} of 64 dropped");
    assert!(dropped.iter().all(|&v| v == 0.0 || v == 2.0));
}

#[test]
fn losses_match_their_formulas() {
    let dev = Device::Cpu;
    let p = Tensor::from_vec(vec![0.2f32, 0.7, 0.1, 0.5, 0.25, 0.25], &[2, 3], &dev).unwrap();
    let onehot = Tensor::from_vec(vec![0f32, 1., 0., 1., 0., 0.], &[2, 3], &dev).unwrap();
    let labels = Tensor::from_vec(vec![1u32, 0], &[2], &dev).unwrap();
    let want_ce = -(0.7f32.ln() + 0.5f32.ln()) / 2.0;
    let cce =
        Loss::CategoricalCrossentropy { from_logits: false }.compute(&p, &onehot).unwrap().to_scalar::<f32>().unwrap();
    let scce = Loss::SparseCategoricalCrossentropy { from_logits: false }.compute(&p, &labels).unwrap();
    assert!((cce - want_ce).abs() < 1e-6 && (scce.to_scalar::<f32>().unwrap() - want_ce).abs() < 1e-6);
    // From logits: log of the probabilities are logits up to a per-row constant.
    let logits = p.log().unwrap().add_scalar(3.0).unwrap();
    let from_logits = Loss::SparseCategoricalCrossentropy { from_logits: true }.compute(&logits, &labels).unwrap();
    assert!((from_logits.to_scalar::<f32>().unwrap() - want_ce).abs() < 1e-5);
    let mse = Loss::MeanSquaredError.compute(&p, &onehot).unwrap().to_scalar::<f32>().unwrap();
    let want_mse = [0.04f32, 0.09, 0.01, 0.25, 0.0625, 0.0625].iter().sum::<f32>() / 6.0;
    assert!((mse - want_mse).abs() < 1e-6);
    let q = Tensor::from_vec(vec![0.9f32, 0.2], &[2, 1], &dev).unwrap();
    let t = Tensor::from_vec(vec![1f32, 0.], &[2, 1], &dev).unwrap();
    let bce = Loss::BinaryCrossentropy { from_logits: false }.compute(&q, &t).unwrap().to_scalar::<f32>().unwrap();
    assert!((bce - -(0.9f32.ln() + 0.8f32.ln()) / 2.0).abs() < 1e-6);
    let err = Loss::MeanSquaredError.compute(&p, &labels).unwrap_err().to_string();
    assert!(err.contains("[2, 3]") && err.contains("[2]"), "{err}");
}

use weft_nn::layers::{EinsumDense, Embedding, LayerNormalization, Reshape};

fn close(a: &Tensor, b: &Tensor) {
    assert_eq!(a.dims(), b.dims());
    for (x, y) in a.to_vec::<f32>().unwrap().iter().zip(b.to_vec::<f32>().unwrap()) {
        assert!((x - y).abs() < 1e-5, "{x} vs {y}");
    }
}

fn kernel_and_bias(l: &dyn Layer) -> (Tensor, Tensor) {
    let v = l.variables();
    (v[0].1.as_tensor().clone(), v[1].1.as_tensor().clone())
}

#[test]
fn einsum_dense_matches_the_equivalent_matmuls() {
    let dev = Device::Cpu;
    let x = Tensor::rand(-1.0, 1.0, &[2, 3, 4], 1, &dev).unwrap();
    let ctx = &mut Ctx::inference();
    let rand_bias = |l: &dyn Layer| {
        let b = &l.variables()[1].1;
        b.set(&Tensor::rand(-1.0, 1.0, b.dims(), 9, &dev).unwrap()).unwrap();
    };

    // A Dense over the last axis of a 3-D input.
    let l = EinsumDense::new("abc,cd->abd", &[3, 5]).bias_axes("d");
    l.call(&x, ctx).unwrap();
    rand_bias(&l);
    let (k, b) = kernel_and_bias(&l);
    close(&l.call(&x, ctx).unwrap(), &x.matmul(&k).unwrap().add(&b).unwrap());

    // Projection to heads: a 3-D kernel, bias over both new axes.
    let l = EinsumDense::new("abc,cde->abde", &[3, 2, 6]).bias_axes("de");
    l.call(&x, ctx).unwrap();
    rand_bias(&l);
    let (k, b) = kernel_and_bias(&l);
    assert_eq!((k.dims(), b.dims()), (&[4usize, 2, 6][..], &[2usize, 6][..]));
    let want = x.matmul(&k.reshape(&[4, 12]).unwrap()).unwrap().reshape(&[2, 3, 2, 6]).unwrap().add(&b).unwrap();
    close(&l.call(&x, ctx).unwrap(), &want);

    // Heads back to the model width.
    let h = Tensor::rand(-1.0, 1.0, &[2, 3, 2, 6], 2, &dev).unwrap();
    let l = EinsumDense::new("abcd,cde->abe", &[3, 4]).bias_axes("e");
    l.call(&h, ctx).unwrap();
    rand_bias(&l);
    let (k, b) = kernel_and_bias(&l);
    let want = h.reshape(&[2, 3, 12]).unwrap().matmul(&k.reshape(&[12, 4]).unwrap()).unwrap().add(&b).unwrap();
    close(&l.call(&h, ctx).unwrap(), &want);

    // A bias on a middle axis spans the rest of the output with size 1 (Keras' rule).
    let l = EinsumDense::new("abc,cd->abd", &[3, 5]).bias_axes("b");
    l.call(&x, ctx).unwrap();
    rand_bias(&l);
    let (k, b) = kernel_and_bias(&l);
    assert_eq!(b.dims(), &[3, 1]);
    close(&l.call(&x, ctx).unwrap(), &x.matmul(&k).unwrap().add(&b).unwrap());

    let err = EinsumDense::new("abc,cd->abd", &[3, 5]).call(&Tensor::ones(&[2, 4], &dev).unwrap(), ctx).unwrap_err();
    assert!(err.to_string().contains("rank-3"), "{err}");
}

#[test]
fn embedding_layer_norm_and_reshape() {
    let dev = Device::Cpu;
    let ctx = &mut Ctx::inference();
    let emb = Embedding::new(5, 3);
    let ids = Tensor::from_vec(vec![4u32, 0, 4, 1], &[2, 2], &dev).unwrap();
    let out = emb.call(&ids, ctx).unwrap();
    assert_eq!(out.dims(), &[2, 2, 3]);
    let table = emb.table().unwrap().to_vec::<f32>().unwrap();
    assert_eq!(out.to_vec::<f32>().unwrap()[..3], table[12..15]);
    assert!(table.iter().all(|v| v.abs() <= 0.05));
    let bad = Tensor::from_vec(vec![5u32], &[1], &dev).unwrap();
    assert!(emb.call(&bad, ctx).is_err(), "id 5 is past a vocabulary of 5");

    let x = Tensor::rand(-2.0, 2.0, &[4, 6], 3, &dev).unwrap();
    let ln = LayerNormalization::new();
    let y = ln.call(&x, ctx).unwrap();
    let mean = x.mean(&[-1], true).unwrap();
    let var = x.var(&[-1], true).unwrap();
    close(&y, &x.sub(&mean).unwrap().div(&var.add_scalar(1e-3).unwrap().sqrt().unwrap()).unwrap());
    assert_eq!(ln.variables().iter().map(|v| v.0.as_str()).collect::<Vec<_>>(), ["gamma", "beta"]);

    let r = Reshape::new(&[3, -1]).call(&x, ctx).unwrap();
    assert_eq!(r.dims(), &[4, 3, 2]);
    assert!(Reshape::new(&[5, -1]).call(&x, ctx).is_err());
}

#[test]
fn a_part_drawn_alone_equals_the_same_part_of_the_whole() {
    use weft_nn::Initializer::*;
    let kinds = [
        GlorotUniform,
        GlorotNormal,
        HeUniform,
        HeNormal,
        Zeros,
        Ones,
        Normal(0.3),
        Uniform(0.05),
        TruncatedNormal(0.02),
    ];
    for init in kinds {
        for (shape, axis, start, len) in
            [(&[7, 10][..], 1, 3, 4), (&[7, 10][..], 0, 4, 3), (&[5, 3, 4][..], 1, 1, 1), (&[9][..], 0, 0, 9)]
        {
            let whole = init.init(shape, 11, &Device::Cpu).unwrap();
            let part = init.init_part(shape, axis, start, len, 11, &Device::Cpu).unwrap();
            assert_eq!(
                part.to_vec::<f32>().unwrap(),
                whole.narrow(axis as isize, start, len).unwrap().to_vec::<f32>().unwrap(),
                "{init:?} {shape:?} axis {axis} {start}+{len}"
            );
        }
    }
    let e = GlorotUniform.init_part(&[4, 4], 1, 3, 2, 0, &Device::Cpu).unwrap_err().to_string();
    assert!(e.contains("3..5") && e.contains("[4, 4]"), "{e}");
}

/// Initial weights come from the layer's path and the seed alone: a model built before training
/// (by `predict`) starts where one built by its first training step does.
#[test]
fn initial_weights_do_not_depend_on_when_the_model_is_built() {
    use weft_nn::{FitOptions, Model, optim::Sgd};
    let mlp = || Sequential::new().add(Dense::new(6).activation(Activation::Tanh)).add(Dense::new(2));
    let x = Tensor::rand(-1.0, 1.0, &[8, 3], 0, &Device::Cpu).unwrap();
    let y = Tensor::rand(-1.0, 1.0, &[8, 2], 1, &Device::Cpu).unwrap();
    let opts = || FitOptions { epochs: 1, batch_size: 8, shuffle: false, verbose: false, ..Default::default() };
    let mut early = Model::new(mlp(), &Device::Cpu);
    early.predict(&x, 8).unwrap();
    early.compile(Sgd::new(0.1), Loss::MeanSquaredError, &[]).unwrap();
    let mut late = Model::new(mlp(), &Device::Cpu);
    late.compile(Sgd::new(0.1), Loss::MeanSquaredError, &[]).unwrap();
    assert_eq!(early.fit(&x, &y, opts()).unwrap().loss, late.fit(&x, &y, opts()).unwrap().loss);
}

/// EinsumDense scales its initializer by the fans of its kernel's input and output axes, as
/// Keras 3 does (`compute_fans(shape, input_axes, output_axes)`), not by the last two axes: a
/// projection to 8 heads of 16 from 64 has fans (64, 128), the projection back (128, 64).
/// Keras 3.15 draws these kernels with max |w| 0.1767 (Glorot uniform) and std 0.1246 (He normal).
#[test]
fn einsum_dense_fans_come_from_its_input_and_output_axes() {
    let to_heads = EinsumDense::new("abc,cde->abde", &[0, 8, 16]).bias_axes("de");
    to_heads.call(&Tensor::zeros(&[2, 5, 64], &Device::Cpu).unwrap(), &mut Ctx::inference()).unwrap();
    let k = to_heads.variables()[0].1.as_tensor().to_vec::<f32>().unwrap();
    let limit = (6.0f32 / (64.0 + 128.0)).sqrt();
    let largest = k.iter().fold(0f32, |m, v| m.max(v.abs()));
    assert!(largest <= limit && largest > 0.99 * limit, "max |w| {largest}, Keras' limit {limit}");

    let back = EinsumDense::new("abcd,cde->abe", &[0, 64]).kernel_initializer(Initializer::HeNormal);
    back.call(&Tensor::zeros(&[2, 5, 8, 16], &Device::Cpu).unwrap(), &mut Ctx::inference()).unwrap();
    let k = back.variables()[0].1.as_tensor().to_vec::<f32>().unwrap();
    let std = (k.iter().map(|v| v * v).sum::<f32>() / k.len() as f32).sqrt();
    let want = (2.0f32 / 128.0).sqrt();
    assert!((std - want).abs() < 0.03 * want, "std {std}, Keras' {want}");
}

/// Normalizing over an inner axis is normalizing over the last axis of the transposed input
/// (Keras 3.15's RMSNormalization cannot broadcast its scale over an inner axis; weft's can),
/// and a variable built for one width refuses another with both shapes.
#[test]
fn normalization_over_an_inner_axis_and_a_refit() {
    use weft_nn::layers::RMSNormalization;
    let x = Tensor::rand(-1.0, 1.0, &[2, 3, 4], 9, &Device::Cpu).unwrap();
    let xt = x.transpose(1, 2).unwrap().contiguous().unwrap();
    let ctx = &mut Ctx::inference();
    let pairs: [(Box<dyn Layer>, Box<dyn Layer>); 2] = [
        (Box::new(RMSNormalization::new().axis(1)), Box::new(RMSNormalization::new())),
        (Box::new(LayerNormalization::new().axis(-2)), Box::new(LayerNormalization::new())),
    ];
    for (inner, last) in pairs {
        // Built on a first call, then given the same random scales.
        inner.call(&x, ctx).unwrap();
        last.call(&xt, ctx).unwrap();
        for ((_, va), (_, vb)) in inner.variables().iter().zip(last.variables()) {
            let w = Tensor::rand(0.5, 1.5, va.dims(), 4, &Device::Cpu).unwrap();
            va.set(&w).unwrap();
            vb.set(&w).unwrap();
        }
        let a = inner.call(&x, ctx).unwrap();
        let b = last.call(&xt, ctx).unwrap().transpose(1, 2).unwrap().contiguous().unwrap();
        close(&a, &b);
        let e = inner.call(&Tensor::ones(&[2, 5, 4], &Device::Cpu).unwrap(), ctx).unwrap_err().to_string();
        assert!(e.contains("[2, 5, 4]") && e.contains("[3]"), "{e}");
    }
}

/// Dense and EinsumDense in inference apply the bias and activation inside the product (a
/// dense-form equation as one matrix product): the bits of the same layer with gradients
/// recorded, for every activation kind (none, relu, gelu), 2-D and 3-D inputs, and a form that
/// is not a dense one (its einsum then the bias).
#[test]
fn dense_layers_in_inference_give_the_bits_of_training_mode() {
    let dev = Device::Cpu;
    let bits = |t: &Tensor| t.to_vec::<f32>().unwrap().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    for act in [Activation::Linear, Activation::Relu, Activation::Gelu] {
        let layers: Vec<(Box<dyn Layer>, Vec<usize>)> = vec![
            (Box::new(Dense::new(96).activation(act)), vec![80, 64]),
            (Box::new(Dense::new(40).activation(act)), vec![2, 50, 64]),
            (Box::new(EinsumDense::new("abc,cde->abde", &[0, 4, 24]).bias_axes("de").activation(act)), vec![3, 40, 64]),
            (Box::new(EinsumDense::new("abcd,cde->abe", &[0, 48]).bias_axes("e").activation(act)), vec![3, 40, 4, 24]),
            (Box::new(EinsumDense::new("abc,cd->adb", &[30, 40]).bias_axes("b").activation(act)), vec![2, 40, 64]),
        ];
        for (layer, shape) in layers {
            let x = Tensor::rand(-1.0, 1.0, &shape, 5, &dev).unwrap();
            let with_grads = layer.call(&x, &mut Ctx::inference()).unwrap();
            let fused = weft_core::no_grad(|| layer.call(&x, &mut Ctx::inference())).unwrap();
            assert_eq!(fused.dims(), with_grads.dims(), "{} {act:?}", layer.kind());
            assert!(bits(&fused) == bits(&with_grads), "{} {act:?} on {shape:?}", layer.kind());
        }
    }
}
