//! A dense layer's backward through its activation and bias, in one pass: for `y = op(x @ w + b)`
//! and the gradient `g` of `y`, the gradient `d = g * op'(..)` of the sum (read from `y` alone:
//! relu, tanh, sigmoid, exp) and the bias's, the column sums of `d`.
//!
//! Apart, these were three passes over the layer's output and two temporaries: `op'` from `y`,
//! its product with `g`, then the column sums reading `d` again. Here the rows are walked once,
//! in order, each writing its `d` and adding it to the sums (the columns cut among the threads).
//! The values are those of the ops apart, bit for bit (NaN as NaN): the same scalar operations in
//! the same order for `d`, and the column sums blocked as `sum_columns` blocks them
//! ([`ColumnSums`]); where `reduce` would not sum by columns (fewer rows than
//! [`MIN_RUN`], one column) the sums are left to it.

use super::share::Ptr;
use super::sum_columns::{ColumnSums, MIN_RUN};
use super::{one_thread, try_take};
use crate::Result;
use crate::ops::UnaryOp;
use std::mem::MaybeUninit;

/// The gradient of the sum, and the bias's (`None`: left to `reduce`, which sums such a shape
/// in another order).
pub type Grads = (Vec<f32>, Option<Vec<f32>>);

/// `1 - v`, as `backprop::unary_grad` takes it (`affine(-1, 1)`).
const ONE_MINUS: UnaryOp = UnaryOp::Affine { mul: -1.0, add: 1.0 };

/// Outputs below this many values are done on the calling thread.
const PAR_MIN: usize = 1 << 15;

/// `(d, db)` for the `rows x cols` row-major gradient `g` of `y = op(..)` (also row-major);
/// `None` for an `op` whose gradient is not read from its output, and for the identity (whose
/// `d` is `g` itself).
pub fn act_bias_grads(g: &[f32], y: &[f32], rows: usize, cols: usize, op: UnaryOp) -> Result<Option<Grads>> {
    assert!(g.len() >= rows * cols && y.len() >= rows * cols, "act_bias_grads: {rows} x {cols} values");
    struct Pass<'a>(&'a [f32], &'a [f32], usize, usize);
    impl WithGrad for Pass<'_> {
        type Out = Result<Grads>;
        fn run<F: Fn(f32, f32) -> f32 + Sync + Copy>(self, f: F) -> Result<Grads> {
            run(self.0, self.1, self.2, self.3, f)
        }
    }
    with_grad(op, Pass(g, y, rows, cols)).transpose()
}

/// Work over pairs `(g, y)` that takes an activation's gradient `d = f(g, y)` as a type of its
/// own, so that each activation's loop is compiled (and vectorised) for it.
pub(super) trait WithGrad {
    type Out;
    fn run<F: Fn(f32, f32) -> f32 + Sync + Copy>(self, f: F) -> Self::Out;
}

/// `work` run with `op`'s gradient as `backprop::unary_grad` writes it, one scalar operation at a
/// time (read from the output `y` alone); `None` for any other op.
pub(super) fn with_grad<W: WithGrad>(op: UnaryOp, work: W) -> Option<W::Out> {
    Some(match op {
        UnaryOp::Relu => work.run(|g, y| g * UnaryOp::Step.apply(y)),
        UnaryOp::Exp => work.run(|g, y| g * y),
        UnaryOp::Tanh => work.run(|g, y| g * ONE_MINUS.apply(UnaryOp::Square.apply(y))),
        UnaryOp::Sigmoid => work.run(|g, y| g * (y * ONE_MINUS.apply(y))),
        _ => return None,
    })
}

/// Columns below this many are not shared out.
const MIN_COLS: usize = 64;

/// `d = f(g, y)` and its column sums, rows in order, the columns cut among the threads.
fn run(g: &[f32], y: &[f32], rows: usize, cols: usize, f: impl Fn(f32, f32) -> f32 + Sync) -> Result<Grads> {
    let mut d = try_take(rows * cols)?;
    let columns = rows >= MIN_RUN && cols > 1;
    let mut db = vec![0f32; if columns { cols } else { 0 }];
    let (dp, sp) = (Ptr(d.as_mut_ptr()), Ptr(db.as_mut_ptr()));
    let parts = if rows * cols >= PAR_MIN && !one_thread() {
        rayon::current_num_threads().min(cols / MIN_COLS).max(1)
    } else {
        1
    };
    // Whole vectors per part, so that each part's rows start alike.
    let per = cols.div_ceil(parts).div_ceil(16) * 16;
    let part = |p: usize| {
        let (c0, c1) = ((p * per).min(cols), ((p + 1) * per).min(cols));
        let w = c1 - c0;
        if w == 0 {
            return;
        }
        let mut sums = columns.then(|| ColumnSums::new(w));
        for r in 0..rows {
            let at = r * cols + c0;
            // SAFETY: row r, columns c0..c1 lie in d's rows * cols room, and only this part
            // writes them (as MaybeUninit: written before they are read).
            let row = unsafe { std::slice::from_raw_parts_mut(dp.get().add(at).cast::<MaybeUninit<f32>>(), w) };
            for ((v, &gv), &yv) in row.iter_mut().zip(&g[at..at + w]).zip(&y[at..at + w]) {
                v.write(f(gv, yv));
            }
            if let Some(sums) = &mut sums {
                // SAFETY: every value of the row was just written.
                sums.add(unsafe { std::slice::from_raw_parts(dp.get().add(at), w) });
            }
        }
        if let Some(sums) = sums {
            // SAFETY: sums c0..c1 lie in db (cols of them), and only this part writes them.
            sums.finish(unsafe { std::slice::from_raw_parts_mut(sp.get().add(c0), w) });
        }
    };
    if parts > 1 {
        super::share::par_for(parts, &part);
    } else {
        part(0);
    }
    // SAFETY: the parts wrote every column of every row.
    unsafe { d.set_len(rows * cols) };
    Ok((d, columns.then_some(db)))
}

#[cfg(test)]
mod tests {
    use crate::ops::UnaryOp;
    use crate::{Device, Tensor};
    use proptest::prelude::*;

    /// Bits, except that any NaN equals any NaN.
    fn same(a: &[f32], b: &[f32]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]
        /// Any shape (one row, fewer rows than the column sums take, rows past a sum block, one
        /// column, enough to run in parallel), each activation, outputs with zeros, negative
        /// zeros and NaN: `d` and the bias's gradient (where it is given) are the bits of
        /// `backprop::unary_grad` and the column sum.
        #[test]
        fn gives_the_bits_of_the_ops_apart(rows in prop_oneof![1usize..10, 1usize..300], cols in prop_oneof![1usize..3, 1usize..200],
                                           which in 0usize..4, seed in 0u64..1000, nan in proptest::option::of(0usize..60_000)) {
            let op = [UnaryOp::Relu, UnaryOp::Exp, UnaryOp::Tanh, UnaryOp::Sigmoid][which];
            let dev = Device::Cpu;
            let val = |i: usize, s: u64| (((i as u64 * 2654435761 + s * 97) % 1999) as f32 / 999.5) - 1.0;
            let g: Vec<f32> = (0..rows * cols).map(|i| val(i, seed)).collect();
            let mut z: Vec<f32> = (0..rows * cols).map(|i| if i % 7 == 0 { -0.0 } else { val(i, seed + 1) }).collect();
            if let Some(at) = nan {
                z[at % (rows * cols)] = f32::NAN;
            }
            let y = Tensor::from_vec(z, &[rows, cols], &dev).unwrap().unary(op).unwrap();
            let gt = Tensor::from_vec(g.clone(), &[rows, cols], &dev).unwrap();
            let want = crate::backprop::unary_grad(op, &y, &y, &gt).unwrap().unwrap();
            let want_db = want.sum(&[0], false).unwrap().to_vec::<f32>().unwrap();
            let yv = y.to_vec::<f32>().unwrap();
            let (d, db) = super::act_bias_grads(&g, &yv, rows, cols, op).unwrap().expect("an output-only op");
            prop_assert!(same(&d, &want.to_vec::<f32>().unwrap()), "d of {:?}, {}x{}", op, rows, cols);
            prop_assert_eq!(db.is_some(), rows >= super::MIN_RUN && cols > 1);
            if let Some(db) = db {
                prop_assert!(same(&db, &want_db), "bias gradient of {:?}, {}x{}", op, rows, cols);
            }
        }
    }

    /// The identity, and an activation whose gradient needs its input, are left to the ops apart.
    #[test]
    fn declines_the_identity_and_what_needs_the_input() {
        let v = [0.5f32; 4];
        for op in [UnaryOp::Identity, UnaryOp::GeluTanh] {
            assert!(super::act_bias_grads(&v, &v, 2, 2, op).unwrap().is_none(), "{op:?}");
        }
    }
}
