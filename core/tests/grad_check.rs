//! Finite-difference gradient checks: for every differentiable op, the gradient from `backward()`
//! equals the central difference (f(x + e) - f(x - e)) / 2e of a weighted sum of the op's output.

use std::sync::Arc;
use weft_core::collectives::{copy_to_parallel, gather_from_parallel, reduce_from_parallel, scatter_to_parallel};
use weft_core::{Device, Result, SingleRank, Tensor, Var};

const EPS: f32 = 1e-2;
const TOL: f32 = 5e-3;

type Op<'a> = dyn Fn(&[Tensor]) -> Result<Tensor> + 'a;

/// Values in ±[0.3, 1.3): away from the kinks of abs, relu, clamp and sign at 0.
fn input(shape: &[usize], seed: u64) -> Vec<f32> {
    let n: usize = shape.iter().product();
    let u = Tensor::rand(-1.0, 1.0, &[n], seed, &Device::Cpu).unwrap().to_vec::<f32>().unwrap();
    u.iter().map(|&v| v.signum() * (0.3 + v.abs())).collect()
}

fn weighted_loss(f: &Op<'_>, xs: &[Tensor], seed: u64) -> Result<Tensor> {
    let y = f(xs)?;
    let w = Tensor::rand(0.5, 1.5, y.dims(), seed ^ 0xabc, &Device::Cpu)?;
    y.mul(&w)?.sum_all()
}

/// Check the gradient of every input of `f` at the given points.
fn check_with(name: &str, inputs: Vec<(Vec<usize>, Vec<f32>)>, f: &Op<'_>) {
    let vars: Vec<Var> =
        inputs.iter().map(|(s, d)| Var::new(Tensor::from_slice(d, s, &Device::Cpu).unwrap()).unwrap()).collect();
    let ts: Vec<Tensor> = vars.iter().map(|v| v.as_tensor().clone()).collect();
    let loss = weighted_loss(f, &ts, 7).unwrap();
    let grads = loss.backward().unwrap();
    for (i, (shape, data)) in inputs.iter().enumerate() {
        let analytic =
            grads.get(&vars[i]).unwrap_or_else(|| panic!("{name}: input {i} got no gradient")).to_vec::<f32>().unwrap();
        for j in 0..data.len() {
            let eval = |delta: f32| -> f32 {
                let xs: Vec<Tensor> = inputs
                    .iter()
                    .enumerate()
                    .map(|(k, (s, d))| {
                        let mut d = d.clone();
                        if k == i {
                            d[j] += delta;
                        }
                        Tensor::from_slice(&d, s, &Device::Cpu).unwrap()
                    })
                    .collect();
                weighted_loss(f, &xs, 7).unwrap().to_scalar::<f32>().unwrap()
            };
            let numeric = (eval(EPS) - eval(-EPS)) / (2.0 * EPS);
            let a = analytic[j];
            assert!(
                (numeric - a).abs() <= TOL * a.abs().max(1.0),
                "{name}: d/dx{i}[{j}] (shape {shape:?}): backward {a}, finite difference {numeric}"
            );
        }
    }
}

fn check(name: &str, shapes: &[&[usize]], f: &Op<'_>) {
    let inputs = shapes.iter().enumerate().map(|(i, s)| (s.to_vec(), input(s, 100 + i as u64))).collect();
    check_with(name, inputs, f);
}

/// A bias and an activation in one op: each fused activation, and one taken by the general loop
/// (softplus), for a bias over the last axis and a full-shape operand.
#[test]
fn add_unary() {
    use weft_core::ops::UnaryOp as U;
    for op in [U::Relu, U::GeluTanh, U::GeluErf, U::Silu, U::Sigmoid, U::Tanh, U::Softplus] {
        // The bias scaled down keeps every sum at least 0.17 from relu's kink.
        check(&format!("add_unary {op:?} bias"), &[&[3, 4], &[4]], &|x| x[0].add_unary(&x[1].mul_scalar(0.1)?, op));
        check(&format!("add_unary {op:?} full"), &[&[2, 3], &[2, 3]], &|x| x[0].add_unary(&x[1].mul_scalar(0.1)?, op));
    }
}

#[test]
fn unary_ops() {
    let cases: Vec<(&str, Box<Op<'static>>)> = vec![
        ("neg", Box::new(|x| x[0].neg())),
        ("abs", Box::new(|x| x[0].abs())),
        ("exp", Box::new(|x| x[0].exp())),
        ("log", Box::new(|x| x[0].abs()?.log())),
        ("sqrt", Box::new(|x| x[0].abs()?.sqrt())),
        ("rsqrt", Box::new(|x| x[0].abs()?.rsqrt())),
        ("square", Box::new(|x| x[0].square())),
        ("recip", Box::new(|x| x[0].recip())),
        ("tanh", Box::new(|x| x[0].tanh())),
        ("sigmoid", Box::new(|x| x[0].sigmoid())),
        ("relu", Box::new(|x| x[0].relu())),
        ("gelu", Box::new(|x| x[0].gelu())),
        ("gelu_erf", Box::new(|x| x[0].gelu_erf())),
        ("silu", Box::new(|x| x[0].silu())),
        ("sin", Box::new(|x| x[0].sin())),
        ("cos", Box::new(|x| x[0].cos())),
        ("erf", Box::new(|x| x[0].erf())),
        ("affine", Box::new(|x| x[0].affine(-1.5, 0.3))),
        ("powf", Box::new(|x| x[0].abs()?.powf(2.5))),
        ("clamp", Box::new(|x| x[0].clamp(-0.8, 0.9))),
        ("softsign", Box::new(|x| x[0].softsign())),
        ("softplus", Box::new(|x| x[0].softplus())),
        ("log_sigmoid", Box::new(|x| x[0].log_sigmoid())),
        ("mish", Box::new(|x| x[0].mish())),
        // Scaled so the inputs reach past the kinks at 0 and 6, and at -3 and 3.
        ("relu6", Box::new(|x| x[0].mul_scalar(4.0)?.relu6())),
        ("hard_sigmoid", Box::new(|x| x[0].mul_scalar(4.0)?.hard_sigmoid())),
        ("hard_silu", Box::new(|x| x[0].mul_scalar(4.0)?.hard_silu())),
        ("leaky_relu", Box::new(|x| x[0].leaky_relu(0.2))),
        ("elu", Box::new(|x| x[0].elu(1.3))),
        ("to_dtype f32", Box::new(|x| x[0].to_dtype(weft_core::DType::F32))),
    ];
    for (name, f) in cases {
        check(name, &[&[2, 3]], f.as_ref());
    }
}

#[test]
fn binary_ops_with_broadcasting() {
    let cases: Vec<(&str, Box<Op<'static>>)> = vec![
        ("add", Box::new(|x| x[0].add(&x[1]))),
        ("sub", Box::new(|x| x[0].sub(&x[1]))),
        ("mul", Box::new(|x| x[0].mul(&x[1]))),
        ("div", Box::new(|x| x[0].div(&x[1]))),
        ("pow", Box::new(|x| x[0].abs()?.pow(&x[1]))),
        ("maximum", Box::new(|x| x[0].maximum(&x[1]))),
        ("minimum", Box::new(|x| x[0].minimum(&x[1]))),
    ];
    for (name, f) in cases {
        check(name, &[&[2, 3], &[3]], f.as_ref());
        check(name, &[&[2, 1], &[1, 3]], f.as_ref());
    }
}

#[test]
fn reductions() {
    check("sum", &[&[2, 3, 2]], &|x| x[0].sum(&[0, 2], false));
    check("sum_all", &[&[2, 3]], &|x| x[0].sum_all());
    check("mean", &[&[2, 3]], &|x| x[0].mean(&[1], true));
    check("max", &[&[3, 4]], &|x| x[0].max(&[1], false));
    check("min", &[&[3, 4]], &|x| x[0].min(&[0], false));
    check("var", &[&[2, 5]], &|x| x[0].var(&[-1], false));
}

/// A dense layer's product, bias and activation in one op (on the Cpu one `dense` node for the
/// activations whose gradient is read from their output): 2-D and 3-D inputs.
#[test]
fn matmul_add_unary() {
    use weft_core::ops::UnaryOp as U;
    for op in [U::Identity, U::Relu, U::Tanh, U::Sigmoid, U::Exp, U::GeluTanh] {
        // The kernel scaled down and the bias kept positive hold these inputs' sums away from
        // relu's kink (where the difference quotient would not match).
        let f = |x: &[Tensor]| x[0].matmul_add_unary(&x[1].mul_scalar(0.05)?, &x[2].abs()?, op);
        check(&format!("matmul_add_unary {op:?}"), &[&[3, 4], &[4, 5], &[5]], &f);
        check(&format!("matmul_add_unary {op:?} 3-D"), &[&[2, 2, 4], &[4, 5], &[5]], &f);
    }
}

#[test]
fn matmul_and_einsum() {
    check("matmul", &[&[2, 3], &[3, 4]], &|x| x[0].matmul(&x[1]));
    check("matmul transposed", &[&[3, 2], &[4, 3]], &|x| x[0].t()?.matmul(&x[1].t()?));
    check("matmul batch broadcast", &[&[2, 2, 3], &[3, 2]], &|x| x[0].matmul(&x[1]));
    check("matmul vector", &[&[3], &[3, 2]], &|x| x[0].matmul(&x[1]));
    check("einsum abc,cd->abd", &[&[2, 2, 3], &[3, 2]], &|x| Tensor::einsum("abc,cd->abd", &[&x[0], &x[1]]));
    check("einsum bqhd,bkhd->bhqk", &[&[1, 2, 2, 3], &[1, 3, 2, 3]], &|x| {
        Tensor::einsum("bqhd,bkhd->bhqk", &[&x[0], &x[1]])
    });
    check("einsum trace", &[&[3, 3]], &|x| Tensor::einsum("ii->", &[&x[0]]));
}

#[test]
fn views() {
    check("transpose", &[&[2, 3]], &|x| x[0].t()?.mul(&Tensor::arange(1.0, 3.0, 1.0, &Device::Cpu)?));
    check("permute", &[&[2, 3, 2]], &|x| x[0].permute(&[2, 0, 1])?.contiguous());
    check("narrow", &[&[4, 3]], &|x| x[0].narrow(0, 1, 2));
    check("reshape", &[&[2, 3]], &|x| x[0].t()?.reshape(&[6]));
    check("broadcast_to", &[&[1, 3]], &|x| x[0].broadcast_to(&[2, 3]));
    check("squeeze/unsqueeze", &[&[2, 1, 3]], &|x| x[0].squeeze(1)?.unsqueeze(0));
}

#[test]
fn nn_ops() {
    check("softmax", &[&[2, 5]], &|x| x[0].softmax(-1));
    check("softmax axis 0", &[&[3, 2]], &|x| x[0].softmax(0));
    check("log_softmax", &[&[2, 5]], &|x| x[0].log_softmax(-1));
    check("layer_norm", &[&[3, 4], &[4], &[4]], &|x| x[0].layer_norm(&x[1], &x[2], 1e-5));
    check("dropout", &[&[4, 4]], &|x| x[0].dropout(0.25, 99, true));
    let labels = |dev: &Device| Tensor::from_slice(&[2u32, 0, 4], &[3], dev);
    check("cross_entropy", &[&[3, 5]], &|x| Tensor::cross_entropy(&x[0], &labels(&Device::Cpu)?));
    // h and c' both reach the loss: every term of the backward is checked.
    let lstm = |x: &[Tensor]| -> Result<Tensor> {
        let (h, c) = Tensor::lstm_cell(&x[0], &x[1])?;
        Tensor::concat(&[h, c], 1)
    };
    check("lstm_cell", &[&[2, 12], &[2, 3]], &lstm);
    check("gru_cell", &[&[2, 9], &[2, 9], &[2, 3]], &|x| Tensor::gru_cell(&x[0], &x[1], &x[2]));
}

#[test]
fn indexing_and_joining() {
    let ids = || Tensor::from_slice(&[2u32, 0, 2, 1], &[4], &Device::Cpu);
    check("index_select", &[&[3, 2]], &|x| x[0].index_select(&ids()?, 0));
    check("embedding", &[&[3, 2]], &|x| x[0].embedding(&ids()?.reshape(&[2, 2])?));
    let gids = || Tensor::from_slice(&[1u32, 0, 2, 2], &[2, 2], &Device::Cpu);
    check("gather", &[&[2, 3]], &|x| x[0].gather(1, &gids()?));
    check("index_add", &[&[4, 2]], &|x| x[0].index_add(&[3, 2], 0, &ids()?));
    check("scatter_add", &[&[2, 2]], &|x| x[0].scatter_add(&[2, 3], 1, &gids()?));
    check("concat", &[&[2, 3], &[1, 3]], &|x| Tensor::concat(&[x[0].clone(), x[1].clone()], 0));
    check("stack", &[&[2, 3], &[2, 3]], &|x| Tensor::stack(&[x[0].clone(), x[1].clone()], 1));
    let mask = || Tensor::from_slice(&[1f32, 0., 1., 0., 0., 1.], &[2, 3], &Device::Cpu);
    check("where_cond", &[&[2, 3], &[3]], &|x| Tensor::where_cond(&mask()?, &x[0], &x[1]));
    check("masked_fill", &[&[2, 3]], &|x| x[0].masked_fill(&x[0].cmp_scalar(weft_core::ops::BinaryOp::Lt, 0.0)?, 0.5));
}

#[test]
fn collective_ops_on_one_rank() {
    let c = || Arc::new(SingleRank) as Arc<dyn weft_core::Collectives>;
    check("copy_to_parallel", &[&[2, 3]], &|x| Ok(copy_to_parallel(&x[0], c())));
    check("reduce_from_parallel", &[&[2, 3]], &|x| reduce_from_parallel(&x[0], c()));
    check("gather_from_parallel", &[&[2, 3]], &|x| gather_from_parallel(&x[0], c(), 1, &[3]));
    check("scatter_to_parallel", &[&[2, 3]], &|x| scatter_to_parallel(&x[0], c(), 0, &[2]));
}

#[test]
fn convolution_and_pooling() {
    use weft_core::conv::Padding::{Causal, Same, Valid};
    type Case = (&'static str, Vec<&'static [usize]>, Box<Op<'static>>);
    let cases: Vec<Case> = vec![
        ("conv2d valid", vec![&[2, 4, 5, 2], &[2, 3, 2, 3]], Box::new(|x| x[0].conv2d(&x[1], [1, 1], [1, 1], Valid))),
        (
            "conv2d same, strided, dilated",
            vec![&[1, 5, 6, 2], &[3, 2, 2, 2]],
            Box::new(|x| x[0].conv2d(&x[1], [2, 1], [1, 2], Same)),
        ),
        ("conv1d causal", vec![&[2, 6, 2], &[3, 2, 2]], Box::new(|x| x[0].conv1d(&x[1], 1, 2, Causal))),
        ("max_pool2d same", vec![&[1, 5, 5, 2]], Box::new(|x| x[0].max_pool2d([2, 2], [2, 2], Same))),
        ("max_pool2d overlapping", vec![&[2, 4, 4, 1]], Box::new(|x| x[0].max_pool2d([3, 3], [1, 1], Valid))),
        ("avg_pool2d same", vec![&[1, 5, 4, 2]], Box::new(|x| x[0].avg_pool2d([3, 2], [2, 2], Same))),
        ("avg_pool1d", vec![&[2, 7, 2]], Box::new(|x| x[0].avg_pool1d(3, 2, Valid))),
    ];
    for (name, shapes, f) in cases {
        check(name, &shapes, f.as_ref());
    }
}
