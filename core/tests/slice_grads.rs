//! Gradients through slices (`narrow`): however many slices a tensor gives, along one axis or
//! several, disjoint, repeated or overlapping, mixed with uses of the whole tensor, on a leaf or
//! an intermediate, the gradient is the definition's: each element gets the sum of the slices'
//! gradients that cover it. On the Cpu (random cases) and a GPU adapter.

mod common;

use proptest::prelude::*;
use weft_core::{Device, Result, Tensor, Var};

const DIMS: [usize; 3] = [4, 6, 5];

/// A slice along `axis` from `start`, `len` long, weighted by `seed`'s random values.
#[derive(Debug, Clone, Copy)]
struct Slice {
    axis: usize,
    start: usize,
    len: usize,
    seed: u64,
}

fn weights(shape: &[usize], seed: u64) -> Vec<f32> {
    let n: usize = shape.iter().product();
    (0..n).map(|i| ((i as u64 * 7 + seed * 13) % 17) as f32 / 4.0 - 2.0).collect()
}

fn slice_shape(s: &Slice) -> Vec<usize> {
    let mut d = DIMS.to_vec();
    d[s.axis] = s.len;
    d
}

/// The gradient of `sum(x[s] * w_s) + whole * sum(x * w)`, taken through `x` (a var) or through
/// `2 x` (an intermediate; then doubled back), and the definition's value for it, in f64.
fn gradient(dev: &Device, slices: &[Slice], whole: bool, intermediate: bool) -> Result<(Vec<f32>, Vec<f64>)> {
    let n: usize = DIMS.iter().product();
    let x = Var::new(Tensor::from_vec((0..n).map(|i| i as f32 * 0.01).collect(), &DIMS, dev)?)?;
    let src = if intermediate { x.as_tensor().mul_scalar(2.0)? } else { x.as_tensor().clone() };
    let mut loss = Tensor::zeros(&[], dev)?;
    for s in slices {
        let w = Tensor::from_vec(weights(&slice_shape(s), s.seed), &slice_shape(s), dev)?;
        loss = loss.add(&src.narrow(s.axis as isize, s.start, s.len)?.mul(&w)?.sum_all()?)?;
    }
    if whole {
        loss = loss.add(&src.mul(&Tensor::from_vec(weights(&DIMS, 99), &DIMS, dev)?)?.sum_all()?)?;
    }
    let got = loss.backward()?.get(x.as_tensor()).map(|g| g.to_vec::<f32>()).transpose()?.unwrap_or(vec![0.0; n]);
    let mut want = vec![0f64; n];
    let strides = [DIMS[1] * DIMS[2], DIMS[2], 1];
    for s in slices {
        let w = weights(&slice_shape(s), s.seed);
        let sd = slice_shape(s);
        for (k, wk) in w.iter().enumerate() {
            let mut idx = [k / (sd[1] * sd[2]), k / sd[2] % sd[1], k % sd[2]];
            idx[s.axis] += s.start;
            want[idx.iter().zip(strides).map(|(i, s)| i * s).sum::<usize>()] += *wk as f64;
        }
    }
    if whole {
        for (a, w) in want.iter_mut().zip(weights(&DIMS, 99)) {
            *a += w as f64;
        }
    }
    if intermediate {
        want.iter_mut().for_each(|a| *a *= 2.0);
    }
    Ok((got, want))
}

fn check(dev: &Device, slices: &[Slice], whole: bool, intermediate: bool) {
    let (got, want) = gradient(dev, slices, whole, intermediate).unwrap();
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            (*g as f64 - w).abs() <= 1e-5 * w.abs().max(1.0),
            "{slices:?} whole {whole} intermediate {intermediate}: element {i}: got {g}, want {w}"
        );
    }
}

fn any_slice() -> impl Strategy<Value = Slice> {
    (0usize..3, 0usize..6, 1usize..7, 0u64..50).prop_map(|(axis, start, len, seed)| {
        let start = start % DIMS[axis];
        Slice { axis, start, len: len.min(DIMS[axis] - start), seed }
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn slices_of_any_kind_sum_to_the_definition(slices in prop::collection::vec(any_slice(), 1..9),
                                                whole: bool, intermediate: bool) {
        check(&Device::Cpu, &slices, whole, intermediate);
    }
}

/// Every step of a sequence read once (an RNN's input), plus a repeated slice of a weight: the
/// common cases, exact (each element has one contribution, or the same slice's in order).
#[test]
fn time_steps_and_repeated_slices_are_exact() {
    let steps: Vec<Slice> = (0..DIMS[1]).map(|t| Slice { axis: 1, start: t, len: 1, seed: t as u64 }).collect();
    let repeated = [Slice { axis: 2, start: 1, len: 3, seed: 4 }; 3];
    for dev in [Some(Device::Cpu), common::gpu()].into_iter().flatten() {
        for slices in [&steps[..], &repeated[..]] {
            for intermediate in [false, true] {
                let (got, want) = gradient(&dev, slices, false, intermediate).unwrap();
                let want: Vec<f32> = want.iter().map(|&w| w as f32).collect();
                assert_eq!(got, want, "{} {slices:?} intermediate {intermediate}", dev.describe());
            }
        }
        // Overlapping slices along two axes with a use of the whole, on the GPU too.
        let mixed = [
            Slice { axis: 0, start: 1, len: 2, seed: 1 },
            Slice { axis: 2, start: 0, len: 4, seed: 2 },
            Slice { axis: 1, start: 2, len: 3, seed: 3 },
        ];
        check(&dev, &mixed, true, true);
    }
}
