//! The Cpu kernels' fast paths against plain f64 loops, on awkward shapes: matmul cut into
//! column blocks per core (transposed operands, batches, sizes that are no multiple of the block),
//! elementwise ops on contiguous rows (long ones cut into pieces) and on strided views, max and min (NaN and infinities
//! included), and the Adam step.

mod common;

use common::{assert_close, vals};
use proptest::prelude::*;
use weft_core::optim_ops::AdamStep;
use weft_core::{Device, Result, Tensor};

/// `a @ b` in f64 from the tensors' values (`a`: [m, k], `b`: [k, n], any layout).
fn reference_matmul(a: &Tensor, b: &Tensor) -> Vec<f32> {
    let (m, k, n) = (a.dims()[0], a.dims()[1], b.dims()[1]);
    let (x, y) = (vals(&a.contiguous().unwrap()), vals(&b.contiguous().unwrap()));
    let mut out = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            out[i * n + j] = (0..k).map(|p| x[i * k + p] as f64 * y[p * n + j] as f64).sum::<f64>() as f32;
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Large enough that the column-block path runs (n of 97 and more splits over two cores).
    #[test]
    fn matmul_in_column_blocks_matches_f64(m in prop::sample::select(vec![1usize, 5, 64, 131]),
                                           k in prop::sample::select(vec![1usize, 17, 300]),
                                           n in prop::sample::select(vec![97usize, 200, 517, 1025]),
                                           ta in any::<bool>(), tb in any::<bool>(), seed in 0u64..1000) {
        let d = Device::Cpu;
        let a = if ta { Tensor::rand(-1.0, 1.0, &[k, m], seed, &d).unwrap().t().unwrap() } else { Tensor::rand(-1.0, 1.0, &[m, k], seed, &d).unwrap() };
        let b = if tb { Tensor::rand(-1.0, 1.0, &[n, k], seed + 1, &d).unwrap().t().unwrap() } else { Tensor::rand(-1.0, 1.0, &[k, n], seed + 1, &d).unwrap() };
        let got = a.matmul(&b).unwrap();
        prop_assert_eq!(got.dims(), &[m, n][..]);
        assert_close(&vals(&got), &reference_matmul(&a, &b), 1e-4 * (k as f32).sqrt(), &format!("m{m} k{k} n{n} ta{ta} tb{tb}"));
        // A batch of three, each entry its own product.
        let ab = Tensor::stack(&[a.clone(), a.affine(0.5, 0.0).unwrap(), a.neg().unwrap()], 0).unwrap();
        let batched = vals(&ab.matmul(&b).unwrap());
        for (i, scale) in [1.0f32, 0.5, -1.0].into_iter().enumerate() {
            let want: Vec<f32> = reference_matmul(&a, &b).into_iter().map(|v| v * scale).collect();
            assert_close(&batched[i * m * n..(i + 1) * m * n], &want, 1e-4 * (k as f32).sqrt(), &format!("batch entry {i}"));
        }
    }

    /// Operands that repeat one value along each row (a column `[r, 1]`, a scalar) in every
    /// pattern over one, two and three operands give each element's own result, bit for bit:
    /// the loop compiled per pattern must read each operand from the right place.
    #[test]
    fn operands_repeated_along_rows_match_elementwise(r in 1usize..40, c in 1usize..300, pick in 0usize..8, seed in 0u64..1000) {
        let d = Device::Cpu;
        let full = |s: u64| Tensor::rand(-2.0, 2.0, &[r, c], s, &d).unwrap();
        let column = |s: u64| Tensor::rand(-2.0, 2.0, &[r, 1], s, &d).unwrap();
        // Operand k is a column broadcast along the rows (stride 0) when bit k of `pick` is set,
        // else a full matrix: every pattern, all-repeated ones included, gives an [r, c] result.
        let wide = |t: Tensor| t.broadcast_to(&[r, c]).unwrap();
        let operand = |k: usize| if pick >> k & 1 == 1 { wide(column(seed + k as u64)) } else { full(seed + k as u64) };
        let gt0 = |t: &Tensor| t.cmp_scalar(weft_core::ops::BinaryOp::Gt, 0.0).unwrap();
        let m = if pick >> 2 & 1 == 1 { wide(gt0(&column(seed + 2))) } else { gt0(&full(seed + 2)) };
        let (a, b) = (operand(0), operand(1));
        let each = |f: &dyn Fn(usize) -> f32| -> Vec<f32> { (0..r * c).map(f).collect() };
        let (av, bv, mv) = (vals(&a), vals(&b), vals(&m));
        prop_assert_eq!(vals(&a.sub(&b).unwrap()), each(&|e| av[e] - bv[e]), "sub, pattern {}", pick);
        let picked = Tensor::where_cond(&m, &a, &b).unwrap();
        prop_assert_eq!(vals(&picked), each(&|e| if mv[e] != 0.0 { av[e] } else { bv[e] }), "where_cond, pattern {}", pick);
        // A scalar tensor, and a unary op on a column broadcast along the rows.
        let (x, s) = (full(seed + 7), Tensor::rand(-2.0, 2.0, &[1], seed + 9, &d).unwrap());
        let (xv, sv) = (vals(&x), vals(&s)[0]);
        prop_assert_eq!(vals(&x.mul(&s).unwrap()), each(&|e| xv[e] * sv), "times a scalar");
        let spread = wide(column(seed + 5));
        let pv = vals(&spread);
        prop_assert_eq!(vals(&spread.relu().unwrap()), each(&|e| pv[e].max(0.0)), "relu of a column");
    }

    /// Short rows with an operand that repeats one row (a bias over few channels) are folded into
    /// longer ones: every element still reads its own row and channel, with the operands at an
    /// offset in their storage (narrowed), a repeated value beside them, for any row count
    /// (prime ones cannot fold), bit for bit; `add_unary` too.
    #[test]
    fn short_rows_with_a_repeated_row_keep_every_value(r in 1usize..300, c in 1usize..80, skip in 0usize..3, seed in 0u64..1000) {
        use weft_core::ops::UnaryOp;
        let d = Device::Cpu;
        let x = Tensor::rand(-2.0, 2.0, &[r + skip, c], seed, &d).unwrap().narrow(0, skip, r).unwrap();
        let bias = Tensor::rand(-2.0, 2.0, &[c + skip], seed + 1, &d).unwrap().narrow(0, skip, c).unwrap();
        let m = Tensor::rand(-1.0, 1.0, &[r, c], seed + 2, &d).unwrap().cmp_scalar(weft_core::ops::BinaryOp::Gt, 0.0).unwrap();
        let s = Tensor::rand(-2.0, 2.0, &[1], seed + 3, &d).unwrap();
        let (xv, bv, mv, sv) = (vals(&x), vals(&bias), vals(&m), vals(&s)[0]);
        let each = |f: &dyn Fn(usize) -> f32| -> Vec<f32> { (0..r * c).map(f).collect() };
        prop_assert_eq!(vals(&x.add(&bias).unwrap()), each(&|e| xv[e] + bv[e % c]), "x + bias");
        prop_assert_eq!(vals(&bias.sub(&x).unwrap()), each(&|e| bv[e % c] - xv[e]), "bias - x");
        let row = bias.broadcast_to(&[r, c]).unwrap();
        let wide_s = s.broadcast_to(&[r, c]).unwrap();
        let picked = Tensor::where_cond(&m, &row, &wide_s).unwrap();
        prop_assert_eq!(vals(&picked), each(&|e| if mv[e] != 0.0 { bv[e % c] } else { sv }), "where(mask, bias, scalar)");
        for op in [UnaryOp::Relu, UnaryOp::GeluTanh, UnaryOp::Sigmoid, UnaryOp::Softplus] {
            prop_assert_eq!(vals(&x.add_unary(&bias, op).unwrap()), each(&|e| op.apply(xv[e] + bv[e % c])), "add_unary {:?}", op);
        }
        // A repeated row read with a stride (a column of a matrix): not folded as if adjacent.
        let column = Tensor::rand(-2.0, 2.0, &[c, 2], seed + 4, &d).unwrap().narrow(1, 1, 1).unwrap().squeeze(1).unwrap();
        let cv = vals(&column);
        prop_assert_eq!(vals(&x.add(&column).unwrap()), each(&|e| xv[e] + cv[e % c]), "x + a strided row");
    }

    /// Contiguous rows and strided views (a transpose, a broadcast row) give the same values.
    #[test]
    fn elementwise_on_rows_and_views_matches_f64(r in 1usize..200, c in 1usize..600, seed in 0u64..1000) {
        let d = Device::Cpu;
        let x = Tensor::rand(-3.0, 3.0, &[r, c], seed, &d).unwrap();
        let row = Tensor::rand(-1.0, 1.0, &[c], seed + 1, &d).unwrap();
        let xv = vals(&x);
        let rv = vals(&row);
        let relu: Vec<f32> = xv.iter().map(|v| v.max(0.0)).collect();
        assert_close(&vals(&x.relu().unwrap()), &relu, 0.0, "relu");
        let tanh: Vec<f32> = xv.iter().map(|&v| (v as f64).tanh() as f32).collect();
        assert_close(&vals(&x.tanh().unwrap()), &tanh, 1e-6, "tanh");
        let sum: Vec<f32> = xv.iter().enumerate().map(|(i, v)| v + rv[i % c]).collect();
        assert_close(&vals(&x.add(&row).unwrap()), &sum, 1e-6, "add a broadcast row");
        let xt = x.t().unwrap();
        let t: Vec<f32> = (0..c).flat_map(|j| (0..r).map(move |i| (i, j))).map(|(i, j)| xv[i * c + j] * 2.0).collect();
        assert_close(&vals(&xt.mul_scalar(2.0).unwrap()), &t, 1e-6, "a transposed view");
    }

    #[test]
    fn max_and_min_match_f64_with_nan_and_infinities(n in 1usize..200_000, at in 0usize..200_000, special in 0usize..4, seed in 0u64..1000) {
        let d = Device::Cpu;
        let mut v = vals(&Tensor::rand(-5.0, 5.0, &[n], seed, &d).unwrap());
        let s = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 7.5][special];
        v[at % n] = s;
        let t = Tensor::from_vec(v.clone(), &[n], &d).unwrap();
        let (max, min) = (t.max(&[0], false).unwrap().to_vec::<f32>().unwrap()[0], t.min(&[0], false).unwrap().to_vec::<f32>().unwrap()[0]);
        if s.is_nan() {
            prop_assert!(max.is_nan() && min.is_nan(), "NaN must propagate: max {max}, min {min}");
        } else {
            prop_assert_eq!(max, v.iter().copied().fold(f32::NEG_INFINITY, f32::max));
            prop_assert_eq!(min, v.iter().copied().fold(f32::INFINITY, f32::min));
        }
        // Down the columns of a matrix: each output's run is strided.
        let cols = 1 + n % 13;
        let rows = n / cols;
        if rows > 0 {
            let m = Tensor::from_vec(v[..rows * cols].to_vec(), &[rows, cols], &d).unwrap();
            let (mx, mn) = (vals(&m.max(&[0], false).unwrap()), vals(&m.min(&[0], false).unwrap()));
            for j in 0..cols {
                let col: Vec<f32> = (0..rows).map(|i| v[i * cols + j]).collect();
                if col.iter().any(|x| x.is_nan()) {
                    prop_assert!(mx[j].is_nan() && mn[j].is_nan(), "column {j}: NaN must propagate");
                } else {
                    prop_assert_eq!(mx[j], col.iter().copied().fold(f32::NEG_INFINITY, f32::max));
                    prop_assert_eq!(mn[j], col.iter().copied().fold(f32::INFINITY, f32::min));
                }
            }
        }
    }
}

/// A batch of no matrices multiplies to an empty result, not an Err about the layouts.
#[test]
fn an_empty_batch_multiplies_to_nothing() -> Result<()> {
    let d = Device::Cpu;
    let p = Tensor::zeros(&[0, 3, 4], &d)?.matmul(&Tensor::zeros(&[0, 4, 5], &d)?)?;
    assert_eq!(p.dims(), &[0, 3, 5]);
    Ok(())
}

/// A long contiguous tensor is one row, cut into pieces over the cores: every piece, the last
/// short one included, is written with the op's value (and a strided view of it too).
#[test]
fn one_long_row_is_cut_into_pieces_and_each_is_written() -> Result<()> {
    let d = Device::Cpu;
    for n in [65_536, 100_003, 3 * 32_768 + 1] {
        let x = Tensor::rand(-3.0, 3.0, &[n], 7, &d)?;
        let xv = vals(&x);
        let exp: Vec<f32> = xv.iter().map(|&v| (v as f64).exp() as f32).collect();
        assert_close(&vals(&x.exp()?), &exp, 1e-6, "exp of one long row");
        let sum: Vec<f32> = xv.iter().map(|&v| v + v).collect();
        assert_close(&vals(&x.add(&x)?), &sum, 0.0, "x + x of one long row");
        let wide = x.reshape(&[1, n])?.broadcast_to(&[2, n])?;
        let relu: Vec<f32> = xv.iter().chain(&xv).map(|v| v.max(0.0)).collect();
        assert_close(&vals(&wide.relu()?), &relu, 0.0, "relu of two long broadcast rows");
    }
    Ok(())
}

#[test]
fn the_adam_step_matches_its_formula_in_f64() -> Result<()> {
    let d = Device::Cpu;
    // Longer than one parallel chunk and no multiple of it.
    let n = 40_003;
    let [w, g, m, v] = [1u64, 2, 3, 4].map(|s| Tensor::rand(-1.0, 1.0, &[n], s, &d));
    let (w, g, m) = (w?, g?, m?);
    let v = v?.abs()?;
    let p = AdamStep { lr_t: 0.01, beta1: 0.9, beta2: 0.999, eps: 1e-7, decay: 0.99 };
    let (w2, m2, v2) = w.adam_step(&g, &m, &v, p)?;
    let [w, g, m, v] = [&w, &g, &m, &v].map(vals);
    let (mut ww, mut mw, mut vw) = (vec![0f32; n], vec![0f32; n], vec![0f32; n]);
    for i in 0..n {
        let (wi, gi, mi, vi) = (w[i] as f64, g[i] as f64, m[i] as f64, v[i] as f64);
        let m1 = mi + (gi - mi) * (1.0 - 0.9);
        let v1 = vi + (gi * gi - vi) * (1.0 - 0.999);
        mw[i] = m1 as f32;
        vw[i] = v1 as f32;
        ww[i] = (wi * 0.99 - 0.01 * m1 / (v1.sqrt() + 1e-7)) as f32;
    }
    assert_close(&vals(&m2), &mw, 1e-6, "m");
    assert_close(&vals(&v2), &vw, 1e-6, "v");
    assert_close(&vals(&w2), &ww, 1e-5, "w");
    Ok(())
}

/// Softmax, log-softmax and layer norm of `x` ([rows, n], contiguous values) in f64.
fn reference_rows(x: &[f32], n: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (mut sm, mut lsm, mut ln) = (Vec::new(), Vec::new(), Vec::new());
    for r in x.chunks(n) {
        let r: Vec<f64> = r.iter().map(|&v| v as f64).collect();
        let max = r.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = r.iter().map(|v| (v - max).exp()).sum();
        sm.extend(r.iter().map(|v| ((v - max).exp() / sum) as f32));
        lsm.extend(r.iter().map(|v| (v - max - sum.ln()) as f32));
        let mean = r.iter().sum::<f64>() / n as f64;
        let var = r.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n as f64;
        ln.extend(r.iter().map(|v| ((v - mean) / (var + 1e-5).sqrt() * 1.5 - 0.25) as f32));
    }
    (sm, lsm, ln)
}

/// Softmax rows with masked scores (-1e9, as attention's mask writes), scores far below the
/// maximum, a row masked everywhere, -inf and NaN: masked and far-below weights are exactly 0
/// (their exponentials are skipped, not computed through subnormals), a row masked everywhere
/// attends evenly, -inf weighs 0, a NaN makes its row NaN; the rest as in f64.
#[test]
fn softmax_of_masked_and_extreme_rows() {
    let m = -1e9f32;
    let rows: [[f32; 9]; 5] = [
        [0.5, m, 1.0, m, m, -2.0, 0.0, m, 3.0],
        [0.0, -86.0, -88.0, -103.0, -150.0, 1.0, 2.0, -1e30, 0.25],
        [m; 9],
        [f32::NEG_INFINITY, 1.0, 0.0, -1.0, m, 2.0, 0.5, 0.5, 0.5],
        [0.0, 1.0, f32::NAN, 2.0, m, 0.0, 0.0, 0.0, 0.0],
    ];
    let x = Tensor::from_slice(rows.as_flattened(), &[5, 9], &Device::Cpu).unwrap();
    let got = vals(&x.softmax(-1).unwrap());
    let (want, _, _) = reference_rows(&rows.as_flattened()[..36], 9);
    assert_close(&got[..36], &want, 1e-6, "finite rows");
    for (i, &g) in got[..36].iter().enumerate() {
        let v = rows.as_flattened()[i];
        // (Row 2 is masked everywhere: even weights, checked below.)
        if v <= -88.0 && !(18..27).contains(&i) {
            assert!(g == 0.0, "element {i} ({v}) weighs {g}, not 0");
        }
    }
    assert!(got[18..27].iter().all(|&p| (p - 1.0 / 9.0).abs() < 1e-7), "masked everywhere: {:?}", &got[18..27]);
    assert_eq!(got[27], 0.0, "-inf weighs 0");
    assert!(got[36..].iter().all(|p| p.is_nan()), "a NaN makes its row NaN: {:?}", &got[36..]);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Row ops on rows of every length class (shorter than, equal to and longer than the eight
    /// lanes and the 128-value sum block) and row counts that make one task or many, on
    /// contiguous input and on a transposed view.
    #[test]
    fn row_ops_match_f64(rows in prop::sample::select(vec![1usize, 3, 129, 700]),
                         n in prop::sample::select(vec![1usize, 7, 8, 9, 32, 129, 300]),
                         transposed in any::<bool>(), seed in 0u64..1000) {
        let d = Device::Cpu;
        let x = if transposed {
            Tensor::rand(-4.0, 4.0, &[n, rows], seed, &d).unwrap().t().unwrap()
        } else {
            Tensor::rand(-4.0, 4.0, &[rows, n], seed, &d).unwrap()
        };
        let (sm, lsm, ln) = reference_rows(&vals(&x.contiguous().unwrap()), n);
        let what = format!("rows {rows} n {n} transposed {transposed}");
        assert_close(&vals(&x.softmax(-1).unwrap()), &sm, 1e-5, &format!("softmax {what}"));
        assert_close(&vals(&x.log_softmax(-1).unwrap()), &lsm, 1e-5, &format!("log_softmax {what}"));
        let g = Tensor::full(1.5, &[n], &d).unwrap();
        let b = Tensor::full(-0.25, &[n], &d).unwrap();
        // A row of one value has no spread: its variance is 0 and its output beta.
        assert_close(&vals(&x.layer_norm(&g, &b, 1e-5).unwrap()), &ln, 2e-4, &format!("layer_norm {what}"));
    }

    /// Short rows are taken several at a time, pass by pass (every row's maximum, then every
    /// row's exponentials, ...): each row still gets its own maximum, sum, mean and variance,
    /// so its softmax, log-softmax and layer norm have the bits of that row alone. Rows of
    /// unlike scales (a row given its neighbour's maximum or mean comes out different).
    #[test]
    fn rows_side_by_side_give_each_rows_own_bits(rows in 1usize..40,
                         n in prop::sample::select(vec![1usize, 5, 32, 100, 384, 1023, 1030]), seed in 0u64..1000) {
        let d = Device::Cpu;
        let x = Tensor::rand(-4.0, 4.0, &[rows, n], seed, &d).unwrap();
        let scale: Vec<f32> = (0..rows).map(|r| 10f32.powi(r as i32 % 5 - 2)).collect();
        let x = x.mul(&Tensor::from_slice(&scale, &[rows, 1], &d).unwrap()).unwrap();
        let g = Tensor::rand(0.5, 1.5, &[n], seed + 1, &d).unwrap();
        let b = Tensor::rand(-0.5, 0.5, &[n], seed + 2, &d).unwrap();
        let ops = |t: &Tensor| [t.softmax(-1).unwrap(), t.log_softmax(-1).unwrap(), t.layer_norm(&g, &b, 1e-5).unwrap()];
        let all = ops(&x).map(|t| vals(&t));
        for r in 0..rows {
            let alone = ops(&x.narrow(0, r, 1).unwrap()).map(|t| vals(&t));
            for (name, (all, alone)) in ["softmax", "log_softmax", "layer_norm"].iter().zip(all.iter().zip(&alone)) {
                let got = &all[r * n..(r + 1) * n];
                prop_assert!(got.iter().zip(alone).all(|(p, q)| p.to_bits() == q.to_bits()),
                    "{name}, row {r} of {rows} (n {n}): not the bits of the row alone");
            }
        }
    }

    /// `[b, t, k] @ [k, n]` runs as one product over all b*t rows when the rows merge without a
    /// copy, and as a batch otherwise (a permuted left operand with b and t above 1): both equal
    /// each entry's own product, and their gradients equal those of the batch written out entry
    /// by entry.
    #[test]
    fn rows_times_one_matrix_match_entry_by_entry(b in 2usize..4, t in 2usize..9, k in 1usize..40, n in 1usize..70,
                                                 permuted in any::<bool>(), seed in 0u64..1000) {
        let d = Device::Cpu;
        // Which way it runs: one 2-D product of b*t rows, or a batch of b.
        let (_, nodes) = weft_core::trace::trace(|| {
            let x = Tensor::zeros(&[b, t, k], &Device::Meta)?;
            let x = if permuted { Tensor::zeros(&[t, b, k], &Device::Meta)?.permute(&[1, 0, 2])? } else { x };
            x.matmul(&Tensor::zeros(&[k, n], &Device::Meta)?)
        }).unwrap();
        let product = nodes.iter().find(|n| n.kind == "matmul").unwrap();
        let want_shape = if permuted { vec![b, t, n] } else { vec![b * t, n] };
        prop_assert_eq!(&product.shape, &want_shape);
        let x = if permuted {
            Tensor::rand(-1.0, 1.0, &[t, b, k], seed, &d).unwrap().permute(&[1, 0, 2]).unwrap()
        } else {
            Tensor::rand(-1.0, 1.0, &[b, t, k], seed, &d).unwrap()
        };
        let w = weft_core::Var::new(Tensor::rand(-1.0, 1.0, &[k, n], seed + 1, &d).unwrap()).unwrap();
        let xv = weft_core::Var::new(x.contiguous().unwrap()).unwrap();
        let x_in = if permuted { x.clone() } else { xv.as_tensor().clone() };
        let y = x_in.matmul(w.as_tensor()).unwrap();
        prop_assert_eq!(y.dims(), &[b, t, n][..]);
        let entries: Vec<Tensor> = (0..b).map(|i| xv.as_tensor().narrow(0, i, 1).unwrap().squeeze(0).unwrap()
            .matmul(w.as_tensor()).unwrap()).collect();
        let want = Tensor::stack(&entries, 0).unwrap();
        assert_close(&vals(&y), &vals(&want), 1e-5, "forward");
        // The weight's gradient of a weighted sum, both ways.
        let r = Tensor::rand(-1.0, 1.0, &[b, t, n], seed + 2, &d).unwrap();
        let g1 = y.mul(&r).unwrap().sum_all().unwrap().backward().unwrap();
        let g2 = want.mul(&r).unwrap().sum_all().unwrap().backward().unwrap();
        assert_close(&vals(g1.get(w.as_tensor()).unwrap()), &vals(g2.get(w.as_tensor()).unwrap()), 1e-4, "weight gradient");
        if !permuted {
            assert_close(&vals(g1.get(xv.as_tensor()).unwrap()), &vals(g2.get(xv.as_tensor()).unwrap()), 1e-5, "input gradient");
        }
    }

    /// Concat writes each part (contiguous or a transposed view) as rows; casts gather a strided
    /// f32 view by rows before converting.
    #[test]
    fn concat_and_casts_of_views_match(r in 1usize..40, c in 1usize..40, axis in 0usize..2, seed in 0u64..1000) {
        let d = Device::Cpu;
        let a = Tensor::rand(-100.0, 100.0, &[r, c], seed, &d).unwrap();
        let bt = Tensor::rand(-100.0, 100.0, &[c, r], seed + 1, &d).unwrap().t().unwrap();
        let (av, bv) = (vals(&a), vals(&bt.contiguous().unwrap()));
        let got = vals(&Tensor::concat(&[a.clone(), bt.clone(), a.clone()], axis as isize).unwrap());
        let mut want = Vec::new();
        if axis == 0 {
            want.extend(&av);
            want.extend(&bv);
            want.extend(&av);
        } else {
            for i in 0..r {
                want.extend(&av[i * c..(i + 1) * c]);
                want.extend(&bv[i * c..(i + 1) * c]);
                want.extend(&av[i * c..(i + 1) * c]);
            }
        }
        prop_assert_eq!(got, want);
        let as_i32 = bt.to_dtype(weft_core::DType::I32).unwrap().to_vec::<i32>().unwrap();
        prop_assert_eq!(as_i32, bv.iter().map(|&v| v as i32).collect::<Vec<_>>());
        let as_f16 = bt.to_dtype(weft_core::DType::F16).unwrap().to_dtype(weft_core::DType::F32).unwrap();
        prop_assert_eq!(vals(&as_f16), bv.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect::<Vec<_>>());
        // Integer storage read as a slice (rows at an offset) and by an offset walk (a narrowed
        // transpose), through every integer cast and to f32.
        let code = |i: usize| (i * 7 % 1000) as u32;
        let u = Tensor::from_vec((0..r * c).map(code).collect::<Vec<u32>>(), &[r, c], &d).unwrap();
        let (r0, c0) = (r / 2, c / 2);
        let views = [
            (u.narrow(0, r0, r - r0).unwrap(), (0..(r - r0) * c).map(|e| code((r0 + e / c) * c + e % c)).collect::<Vec<_>>()),
            (u.t().unwrap().narrow(0, c0, c - c0).unwrap(), (0..(c - c0) * r).map(|e| code((e % r) * c + c0 + e / r)).collect()),
        ];
        for (view, want) in views {
            let ints = view.to_dtype(weft_core::DType::I32).unwrap();
            prop_assert_eq!(ints.to_vec::<i32>().unwrap(), want.iter().map(|&v| v as i32).collect::<Vec<_>>());
            prop_assert_eq!(ints.to_dtype(weft_core::DType::U32).unwrap().to_vec::<u32>().unwrap(), want.clone());
            prop_assert_eq!(vals(&view.to_dtype(weft_core::DType::F32).unwrap()), want.iter().map(|&v| v as f32).collect::<Vec<_>>());
        }
    }
}
