//! A dense layer's product with its bias and activation applied in the product
//! (`matmul_add_unary`): in inference on the Cpu (the bias and activation finished on each block
//! of output rows in the kernel, or in one pass after the products that do not take blocks), the
//! bits of the product then `add_unary`; with gradients recorded, the same values and gradients.

use proptest::prelude::*;
use weft_core::ops::UnaryOp;
use weft_core::{Device, Tensor, Var, no_grad};

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec::<f32>().unwrap().iter().map(|v| v.to_bits()).collect()
}

const OPS: [UnaryOp; 7] = [
    UnaryOp::Identity,
    UnaryOp::Relu,
    UnaryOp::GeluErf,
    UnaryOp::GeluTanh,
    UnaryOp::Silu,
    UnaryOp::Tanh,
    UnaryOp::Sigmoid,
];

/// `x` `[lead.., k]` (narrowed inside a wider matrix when `narrowed`), `w` `[k, n]`, `b` `[n]`.
fn operands(lead: &[usize], k: usize, n: usize, narrowed: bool, seed: u64) -> (Tensor, Tensor, Tensor) {
    let dev = Device::Cpu;
    let mut shape = lead.to_vec();
    shape.push(k + if narrowed { 5 } else { 0 });
    let x = Tensor::rand(-2.0, 2.0, &shape, seed, &dev).unwrap();
    let x = if narrowed { x.narrow(-1, 3, k).unwrap() } else { x };
    let w = Tensor::rand(-0.3, 0.3, &[k, n], seed + 1, &dev).unwrap();
    let b = Tensor::rand(-1.0, 1.0, &[n], seed + 2, &dev).unwrap();
    (x, w, b)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, .. ProptestConfig::default() })]

    /// Any shape (rows for the kernel's blocks and for few-row products, columns off the 16-wide
    /// panels and up to the widths whose left matrix is read in place, `k` over one chunk or
    /// several, a 3-D input, a left matrix with a row stride longer than its rows), every
    /// activation with a loop of its own: without gradients, twice over (the second time with
    /// the kept packed weights), the bits of `matmul` then `add_unary` run without gradients.
    #[test]
    fn without_gradients_it_is_the_product_then_add_unary(
        m in prop::sample::select(vec![1usize, 7, 32, 33, 100, 150, 300]),
        k in prop::sample::select(vec![32usize, 200, 300, 600]),
        n in prop::sample::select(vec![16usize, 37, 128, 130, 500]),
        three_d in any::<bool>(),
        narrowed in any::<bool>(),
        pick in 0usize..OPS.len(),
        seed in 0u64..1000,
    ) {
        let op = OPS[pick];
        let lead: Vec<usize> = if three_d && m % 2 == 0 { vec![2, m / 2] } else { vec![m] };
        let (x, w, b) = operands(&lead, k, n, narrowed, seed);
        for round in 0..2 {
            // (Inference's product of few rows runs on its own kernel: the ops apart in the same mode.)
            let want = bits(&no_grad(|| x.matmul(&w)?.add_unary(&b, op)).unwrap());
            let got = no_grad(|| x.matmul_add_unary(&w, &b, op)).unwrap();
            let mut dims = lead.clone();
            dims.push(n);
            prop_assert_eq!(got.dims(), &dims[..]);
            prop_assert!(bits(&got) == want, "{:?} on {:?} x {}x{} (narrowed {}), round {}", op, lead, k, n, narrowed, round);
        }
    }
}

/// With gradients recorded it is the product then `add_unary` (the identity: `add`), and the
/// gradients of the input, the kernel and the bias are those of the two ops, bit for bit: for
/// every activation (on the Cpu those whose gradient is read from their output run as one
/// `dense` node, the activation's and bias's gradients in one pass; the others as the two ops),
/// a 2-D and a 3-D input, a product small enough for one thread and one on weft's kernel with
/// the bias and activation applied in its blocks; and with the kernel's gradient left as a
/// product for the optimizer (`backward_deferring`), that product gives the same bits.
#[test]
fn with_gradients_it_is_the_two_ops_and_their_gradients() {
    let all = OPS.iter().copied().chain([UnaryOp::Exp]);
    for (op, (lead, k, n)) in all.flat_map(|op| {
        [(vec![40], 64, 48), (vec![16], 64, 48), (vec![2, 20], 64, 48), (vec![300], 256, 130)]
            .into_iter()
            .map(move |s| (op, s))
    }) {
        let what = format!("{op:?} on {lead:?} x {k}x{n}");
        let (x, w, b) = operands(&lead, k, n, false, 3);
        let (xv, wv, bv) = (Var::new(x).unwrap(), Var::new(w).unwrap(), Var::new(b).unwrap());
        let (x, w, b) = (xv.as_tensor(), wv.as_tensor(), bv.as_tensor());
        let mut dims = lead.clone();
        dims.push(n);
        let weights = Tensor::rand(-1.0, 1.0, &dims, 9, &Device::Cpu).unwrap();
        let (fused, nodes) = weft_core::trace::trace(|| x.matmul_add_unary(w, b, op)).unwrap();
        let one_node =
            matches!(op, UnaryOp::Identity | UnaryOp::Relu | UnaryOp::Tanh | UnaryOp::Sigmoid | UnaryOp::Exp);
        let kinds: Vec<&str> = nodes.iter().map(|n| n.kind.as_str()).collect();
        assert_eq!(kinds.iter().any(|k| k.starts_with("dense/")), one_node, "{what}: {kinds:?}");
        let apart = x.matmul(w).unwrap().add_unary(b, op).unwrap();
        assert_eq!(fused.dims(), &dims[..], "{what}");
        assert_eq!(bits(&fused), bits(&apart), "{what}");
        let loss = |y: &Tensor| y.mul(&weights).unwrap().sum_all().unwrap();
        let g1 = loss(&fused).backward().unwrap();
        let g2 = loss(&apart).backward().unwrap();
        for (v, name) in [(&xv, "input"), (&wv, "kernel"), (&bv, "bias")] {
            assert_eq!(bits(g1.get(v).unwrap()), bits(g2.get(v).unwrap()), "{what}: {name}");
        }
        // (Deferred where the operands are no larger than the gradient: see `backward_deferring`.)
        if lead.len() == 1 && lead[0] * (k + n) <= k * n {
            let deferred = loss(&fused).backward_deferring(&[w]).unwrap();
            let (l, r) = deferred.product(w).expect("the kernel's gradient left as a product");
            let kernel = no_grad(|| l.matmul(r)).unwrap();
            assert_eq!(bits(&kernel), bits(g2.get(&wv).unwrap()), "{what}: deferred kernel");
            assert_eq!(bits(deferred.get(&bv).unwrap()), bits(g2.get(&bv).unwrap()), "{what}: bias, deferring");
        }
    }
}

/// One layer used three times over (its bias's gradient summed from three uses), an input of
/// rows that do not merge (a permuted 3-D one), fewer rows than a column sum's run and a single
/// column: the gradients are those of the two ops, bit for bit.
#[test]
fn shared_layers_odd_inputs_and_narrow_outputs_keep_the_gradients() {
    let dev = Device::Cpu;
    let cases: Vec<(Vec<usize>, bool, usize, usize)> =
        vec![(vec![12], false, 24, 24), (vec![3, 4], true, 24, 24), (vec![5], false, 24, 24), (vec![12], false, 24, 1)];
    for (lead, permuted, k, n) in cases {
        for op in [UnaryOp::Relu, UnaryOp::Tanh, UnaryOp::Identity] {
            let what = format!("{op:?} on {lead:?} (permuted {permuted}) x {k}x{n}");
            let (x, w, b) = operands(&lead, k, n, false, 5);
            let x = if permuted {
                Tensor::rand(-2.0, 2.0, &[lead[1], lead[0], k], 6, &dev).unwrap().permute(&[1, 0, 2]).unwrap()
            } else {
                x
            };
            let (xv, wv, bv) = (Var::new(x).unwrap(), Var::new(w).unwrap(), Var::new(b).unwrap());
            let (x, w, b) = (xv.as_tensor(), wv.as_tensor(), bv.as_tensor());
            // Three uses where the layer is square, one otherwise.
            let uses = if k == n { 3 } else { 1 };
            let run = |fused: bool| {
                let mut y = x.clone();
                for _ in 0..uses {
                    y = if fused { y.matmul_add_unary(w, b, op) } else { y.matmul(w).and_then(|t| t.add_unary(b, op)) }
                        .unwrap();
                }
                let weights = Tensor::rand(-1.0, 1.0, y.dims(), 9, &dev).unwrap();
                let grads = y.mul(&weights).unwrap().sum_all().unwrap().backward().unwrap();
                (bits(&y), [&xv, &wv, &bv].map(|v| bits(grads.get(v).unwrap())))
            };
            let (fused, apart) = (run(true), run(false));
            assert_eq!(fused.0, apart.0, "{what}: output");
            for (i, name) in ["input", "kernel", "bias"].iter().enumerate() {
                assert_eq!(fused.1[i], apart.1[i], "{what}: {name}");
            }
        }
    }
}

/// A bias that does not match the kernel's columns, or a kernel that does not fit the input, is
/// an error naming both shapes, with or without gradients.
#[test]
fn mismatched_shapes_are_errors() {
    let (x, w, _) = operands(&[4], 8, 6, false, 1);
    let short = Tensor::zeros(&[5], &Device::Cpu).unwrap();
    for grad in [true, false] {
        let run = |b: &Tensor, w: &Tensor| {
            let f = || x.matmul_add_unary(w, b, UnaryOp::Relu);
            if grad { f() } else { no_grad(f) }
        };
        let e = run(&short, &w).unwrap_err().to_string();
        assert!(e.contains('5') && e.contains('6'), "{e}");
        let wide = Tensor::zeros(&[9, 6], &Device::Cpu).unwrap();
        let e = run(&Tensor::zeros(&[6], &Device::Cpu).unwrap(), &wide).unwrap_err().to_string();
        assert!(e.contains('8') && e.contains('9'), "{e}");
    }
}
