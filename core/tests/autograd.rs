//! Autograd semantics: accumulation, broadcasting, no_grad, detach, Var updates.

use weft_core::{Device, Tensor, Var, no_grad};

fn var(v: &[f32], shape: &[usize]) -> Var {
    Var::new(Tensor::from_slice(v, shape, &Device::Cpu).unwrap()).unwrap()
}

#[test]
fn gradients_accumulate_when_a_tensor_is_used_twice() {
    let x = var(&[2.0, 3.0], &[2]);
    // y = x * x + x  ->  dy/dx = 2x + 1
    let y = x.as_tensor().mul(x.as_tensor()).unwrap().add(x.as_tensor()).unwrap().sum_all().unwrap();
    let g = y.backward().unwrap();
    assert_eq!(g.get(&x).unwrap().to_vec::<f32>().unwrap(), vec![5.0, 7.0]);
}

#[test]
fn broadcast_gradients_reduce_over_the_broadcast_axes() {
    let b = var(&[1.0, 2.0, 3.0], &[3]);
    let x = Tensor::ones(&[4, 3], &Device::Cpu).unwrap();
    let y = x.add(&b).unwrap().sum_all().unwrap();
    let g = y.backward().unwrap();
    assert_eq!(g.get(&b).unwrap().to_vec::<f32>().unwrap(), vec![4.0, 4.0, 4.0]);
    assert_eq!(g.get(&b).unwrap().dims(), &[3]);
}

#[test]
fn no_grad_and_detach_stop_gradients() {
    let x = var(&[1.0], &[1]);
    let y = no_grad(|| x.as_tensor().mul_scalar(2.0)).unwrap();
    assert!(!y.tracks_grad());
    let z = x.as_tensor().detach().mul_scalar(2.0).unwrap();
    assert!(!z.tracks_grad());
    let w = x.as_tensor().mul_scalar(3.0).unwrap().add(&z).unwrap().sum_all().unwrap();
    assert_eq!(w.backward().unwrap().get(&x).unwrap().to_vec::<f32>().unwrap(), vec![3.0]);
}

#[test]
fn var_set_keeps_its_id_and_checks_shape() {
    let x = var(&[1.0, 2.0], &[2]);
    let id = x.id();
    x.set(&Tensor::from_slice(&[5.0f32, 6.0], &[2], &Device::Cpu).unwrap()).unwrap();
    assert_eq!(x.id(), id);
    assert_eq!(x.to_vec::<f32>().unwrap(), vec![5.0, 6.0]);
    let err = x.set(&Tensor::zeros(&[3], &Device::Cpu).unwrap()).unwrap_err();
    assert!(err.to_string().contains("[2]") && err.to_string().contains("[3]"), "{err}");
}

#[test]
fn backward_needs_a_scalar() {
    let x = var(&[1.0, 2.0], &[2]);
    let err = x.as_tensor().mul_scalar(2.0).unwrap().backward().unwrap_err();
    assert!(err.to_string().contains("one-element"), "{err}");
}

#[test]
fn a_long_chain_does_not_overflow_the_stack() {
    let x = var(&[1.0], &[1]);
    let mut y = x.as_tensor().clone();
    for _ in 0..20_000 {
        y = y.add_scalar(0.0).unwrap();
    }
    let g = y.sum_all().unwrap().backward().unwrap();
    assert_eq!(g.get(&x).unwrap().to_vec::<f32>().unwrap(), vec![1.0]);
}

/// `add_unary` gives the values and the gradients (input and bias, through a broadcast) of the
/// sum followed by the op, bit for bit, whether its gradient reads the output (relu, tanh,
/// sigmoid) or computes the sum again (the GELUs, silu, softplus); relu's at NaN and 0 included.
#[test]
fn add_unary_is_the_sum_then_the_op_bit_for_bit() {
    use weft_core::ops::UnaryOp as U;
    let d = Device::Cpu;
    let mut xs: Vec<f32> = Tensor::rand(-3.0, 3.0, &[6, 5], 1, &d).unwrap().to_vec().unwrap();
    xs[..4].copy_from_slice(&[f32::NAN, 0.0, -0.0, 0.25]);
    let bias: Vec<f32> = vec![0.0, 0.0, 0.0, -0.25, 1.5];
    for op in [U::Relu, U::Tanh, U::Sigmoid, U::GeluTanh, U::GeluErf, U::Silu, U::Softplus] {
        let run = |fused: bool| {
            let x = var(&xs, &[6, 5]);
            let b = var(&bias, &[5]);
            let y = if fused {
                x.as_tensor().add_unary(b.as_tensor(), op).unwrap()
            } else {
                x.as_tensor().add(b.as_tensor()).unwrap().unary(op).unwrap()
            };
            let w = Tensor::rand(-1.0, 1.0, &[6, 5], 9, &d).unwrap();
            let g = y.mul(&w).unwrap().sum_all().unwrap().backward().unwrap();
            let bits = |t: &Tensor| t.to_vec::<f32>().unwrap().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            (bits(&y), bits(g.get(&x).unwrap()), bits(g.get(&b).unwrap()))
        };
        assert_eq!(run(true), run(false), "{op:?}");
    }
}

/// `backward_deferring` leaves the gradient of a variable used once in a 2-D product (on either
/// side) as that product's operands, whose product (`GradStore::resolve`) is `backward`'s
/// gradient bit for bit (worked out on the backward pass's kernels); a variable used twice
/// (tied), one used through a slice, one whose product's operands outsize its gradient, a tensor
/// that is not a leaf and a variable not listed get their gradients worked out, as `backward`
/// gives them. The operands kept do not change when a variable is set after the pass.
#[test]
fn deferred_products_are_the_gradients_backward_gives() {
    use weft_core::Var;
    let dev = Device::Cpu;
    let rand = |shape: &[usize], seed| Tensor::rand(-1.0, 1.0, shape, seed, &dev).unwrap();
    let var = |shape: &[usize], seed| Var::new(rand(shape, seed)).unwrap();
    let (right, left, tied, sliced, unlisted) =
        (var(&[8, 8], 1), var(&[8, 8], 2), var(&[8, 8], 3), var(&[10, 8], 4), var(&[8, 8], 5));
    // A left operand of 16 rows times 8 columns of a constant: its gradient g @ c^T has 16 rows.
    let (wide, tall) = (var(&[16, 256], 6), var(&[8, 8], 7));
    let x = rand(&[2, 8], 8);
    let h = x.matmul(right.as_tensor()).unwrap();
    let inner = h.matmul(tied.as_tensor()).unwrap().matmul(tied.as_tensor()).unwrap();
    let mid = inner.matmul(unlisted.as_tensor()).unwrap();
    let out = left.as_tensor().matmul(&mid.t().unwrap()).unwrap();
    let part = sliced.as_tensor().narrow(0, 1, 8).unwrap();
    let side = out.t().unwrap().matmul(&part.t().unwrap()).unwrap();
    let z = wide.as_tensor().matmul(&rand(&[256, 8], 9)).unwrap();
    let y = rand(&[40, 8], 10).matmul(tall.as_tensor()).unwrap();
    // Two variables multiplied: `after`'s gradient is `before^T @ g`, kept as `before` was.
    let (before, after) = (var(&[4, 8], 11), var(&[8, 8], 12));
    let q = before.as_tensor().matmul(after.as_tensor()).unwrap();
    let terms = [side, z, q].map(|t| t.square().unwrap().sum_all().unwrap());
    let loss = terms[0].add(&terms[1]).unwrap().add(&terms[2]).unwrap().add(&y.sum_all().unwrap()).unwrap();
    let whole = loss.backward().unwrap();
    let listed = [&right, &left, &tied, &sliced, &wide, &tall, &before, &after].map(|v| v.as_tensor());
    let listed: Vec<&Tensor> = listed.into_iter().chain([&h]).collect();
    let deferred = loss.backward_deferring(&listed).unwrap();
    assert_eq!(deferred.len(), whole.len());
    let bits = |t: &Tensor| t.to_vec::<f32>().unwrap().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    let all = [
        ("right", &right, true),
        ("left", &left, true),
        ("wide", &wide, true),
        ("after", &after, true),
        ("before", &before, false),
        ("tied", &tied, false),
        ("sliced", &sliced, false),
        ("tall", &tall, false),
        ("unlisted", &unlisted, false),
    ];
    // Every variable set to other values after the pass: the products kept are of the old ones.
    for (_, v, _) in &all {
        v.set(&v.as_tensor().mul_scalar(3.0).unwrap()).unwrap();
    }
    for (name, v, as_product) in all {
        let want = bits(whole.get(v.as_tensor()).unwrap());
        assert_eq!(deferred.product(v.as_tensor()).is_some(), as_product, "{name}");
        assert_eq!(deferred.get(v.as_tensor()).is_none(), as_product, "{name}");
        assert_eq!(bits(&deferred.resolve(v.as_tensor()).unwrap().unwrap()), want, "{name}");
    }
    assert!(deferred.product(&h).is_none(), "not a leaf: never deferred");
}

/// Softmax's and log-softmax's backward in one op gives the composed tensor ops' values (within
/// rounding: its row sums run in another order), on rows of 5 (a partial lane group), 1,000
/// (several threads' tasks; a broadcast gradient) and 33 scores with masked keys (-1e9, weight 0),
/// each through a transposed input; a NaN in a row's gradient makes that row NaN and no other
/// (fails if the sum is taken over the wrong values, or a NaN is dropped).
#[test]
fn softmax_gradients_in_one_op_are_the_composed_ops_values() {
    use weft_core::ops::BinaryOp;
    let dev = Device::Cpu;
    for (rows, n) in [(3, 5), (40, 1_000), (64, 33)] {
        let x = Tensor::rand(-4.0, 4.0, &[n, rows], 7, &dev).unwrap();
        let at = |t: &Tensor| Tensor::arange(0.0, t.numel() as f32, 1.0, &dev).unwrap().reshape(t.dims()).unwrap();
        let x = if n == 33 {
            x.masked_fill(&at(&x).cmp_scalar(BinaryOp::Ge, (20 * rows) as f32).unwrap(), -1e9).unwrap()
        } else {
            x
        };
        let mut g = Tensor::rand(-1.0, 1.0, &[1, n], 8, &dev).unwrap().broadcast_to(&[rows, n]).unwrap();
        let poisoned = n == 33;
        if poisoned {
            // Row 2 of the gradient holds a NaN.
            g = g.masked_fill(&at(&g).cmp_scalar(BinaryOp::Eq, (2 * n + 1) as f32).unwrap(), f32::NAN).unwrap();
        }
        for log in [false, true] {
            // The variable is stored [n, rows]: the rows softmax reads are its columns.
            let v = Var::new(x.clone()).unwrap();
            let xt = v.as_tensor().t().unwrap();
            let y = if log { xt.log_softmax(-1) } else { xt.softmax(-1) }.unwrap();
            let got = y.backward_with(g.clone()).unwrap().get(&v).unwrap().t().unwrap().to_vec::<f32>().unwrap();
            let y = y.detach();
            let want = if log {
                g.sub(&y.exp().unwrap().mul(&g.sum(&[-1], true).unwrap()).unwrap()).unwrap()
            } else {
                y.mul(&g.sub(&g.mul(&y).unwrap().sum(&[-1], true).unwrap()).unwrap()).unwrap()
            };
            let want = want.to_vec::<f32>().unwrap();
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                let what = format!("log {log}, {rows} x {n}, value {i}: {a} against {b}");
                if poisoned && i / n == 2 {
                    assert!(a.is_nan(), "{what}: the row whose gradient holds a NaN");
                } else {
                    assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{what}");
                }
            }
        }
    }
}

#[test]
fn a_loss_ending_in_affine_ops_seeds_their_input_with_the_gradient_they_pass_it() {
    // backward() folds the ops after the sum (a scale, a sign, a scale, an affine) into the
    // seed of the sum; backward_with(1) runs their backward op by op: the same bits. The
    // scales are chosen so that multiplying them in another order rounds differently, and one
    // is 0 after a sign (g * 0 + 0 is +0 where g * 0 alone is -0, which the sum's gradient
    // passes on to x as it is); the sum is of x, or of x read twice.
    let x = var(&[0.5, -1.25, 3.0, 7.5e-3], &[4]);
    let t = x.as_tensor();
    let scale_sets =
        [[1.0f32 / 3.0, 0.1, 1.7], [1.0 / 3.0, 1.0 / 7.0, 7.0e-5], [0.0, 1.0, 1.0], [1.0e5, -1.0, 1.0 / 3.0]];
    for (scales, twice) in scale_sets.into_iter().flat_map(|s| [(s, false), (s, true)]) {
        let terms = if twice { t.square().unwrap().add(t).unwrap() } else { t.clone() };
        let loss = terms.sum_all().unwrap();
        let loss = loss.mul_scalar(scales[0]).unwrap().neg().unwrap().mul_scalar(scales[1]).unwrap();
        let loss = loss.affine(scales[2], 2.0).unwrap();
        let folded = loss.backward().unwrap();
        let run = loss.backward_with(Tensor::ones(&[], &Device::Cpu).unwrap()).unwrap();
        let bits = |g: &weft_core::GradStore| -> Vec<u32> {
            g.get(t).unwrap().to_vec::<f32>().unwrap().iter().map(|v| v.to_bits()).collect()
        };
        assert_eq!(bits(&folded), bits(&run), "scales {scales:?}, x read twice: {twice}");
        assert!(folded.get(&loss).is_none() && run.get(&loss).is_some());
    }
}
