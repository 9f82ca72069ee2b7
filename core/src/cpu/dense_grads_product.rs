//! A dense layer's backward through its activation and bias, fused into the product that makes
//! the gradient of its output: for `y = op(x @ w + b)` read by another layer, whose input
//! gradient is the product `g = a @ b` (that layer's `d @ w^T`), each block of `g`'s rows, once
//! weft's kernel has summed it, becomes `d = g * op'(y)` in place and is added to the bias's
//! column sums while in cache. Apart, the product stored `g`, and `dense_grads` read it back with
//! `y` and wrote `d` to another buffer: a pass over the layer's output, and a buffer, fewer.
//!
//! The bits are those of the product followed by `dense_grads::act_bias_grads`: a finisher's
//! block holds the sums the product stores (`blocked_gemm::run_finishing`), `d` is the same
//! scalar operations, and the column sums are [`ColumnSums`] fed each column's rows in order
//! (the output cut by columns among the threads, each part finishing its rows in order).

use super::blocked_gemm::{Finish, run_finishing};
use super::dense_grads::{WithGrad, with_grad};
use super::gemm_engine::{Product, engine, on_weft};
use super::gemm_pack::NR;
use super::sum_columns::{ColumnSums, MIN_RUN};
use super::{CpuStorage, try_take};
use crate::ops::UnaryOp;
use crate::{Error, Layout, Result};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// `(d, db)` of `y = op(..)` (row-major `m x n`) for the gradient `lhs @ rhs` of `y` (2-D
/// layouts), as `dense_grads::act_bias_grads` gives them for that product (here the bias's always
/// by columns); `None` where weft's
/// kernel does not run the product, `op` is not one `act_bias_grads` takes (the identity, an
/// activation whose gradient needs its input), or the bias's sums are not taken by columns
/// (fewer rows than `MIN_RUN`, one column): the caller multiplies, then runs the backward apart.
pub fn act_bias_grads_of_product(
    (lhs, la): (&CpuStorage, &Layout),
    (rhs, lb): (&CpuStorage, &Layout),
    y: &[f32],
    op: UnaryOp,
) -> Result<Option<(Vec<f32>, Vec<f32>)>> {
    let (x, w) = (lhs.f32s("dense backward")?, rhs.f32s("dense backward")?);
    let Some(mut product) = Product::of_matrices("dense backward", (x, la), (w, lb))? else { return Ok(None) };
    let (m, n, k) = (product.m, product.n, product.k);
    if m < MIN_RUN || n < 2 || !on_weft(engine(), m, n, k) {
        return Ok(None);
    }
    if y.len() < m * n {
        return Err(Error::invalid("dense backward", format!("an output of {} values for {m} x {n}", y.len())));
    }
    let mut d = try_take(m * n)?;
    product.dst = d.as_mut_ptr();
    struct Fused<'a>(&'a Product, &'a [f32]);
    impl WithGrad for Fused<'_> {
        type Out = Result<Vec<f32>>;
        fn run<F: Fn(f32, f32) -> f32 + Sync + Copy>(self, f: F) -> Result<Vec<f32>> {
            let Fused(product, y) = self;
            let slots = (0..product.n.div_ceil(NR)).map(|_| Mutex::new(None)).collect();
            let fin = Sums { y, n: product.n, f, slots, mismatched: AtomicBool::new(false) };
            // SAFETY: on_weft: the CPU runs weft's kernel; every element the strides reach lies
            // inside the operands (the extent check); the output has room for m x n, each of which
            // the product writes and the finisher finishes once.
            unsafe { run_finishing(product, None, &fin, product.threads()) }?;
            fin.into_bias()
        }
    }
    let Some(db) = with_grad(op, Fused(&product, y)) else { return Ok(None) };
    let db = db?;
    // SAFETY: the product wrote every element of the m x n output (and the finisher rewrote it).
    unsafe { d.set_len(m * n) };
    #[cfg(test)]
    tests::FUSED.with(|c| c.set(c.get() + 1));
    Ok(Some((d, db)))
}

/// The finisher: `d = f(g, y)` in place on each block, and the block's rows added to the column
/// sums of its columns (one slot per block of columns, by its first column: each part's blocks
/// start on a panel).
struct Sums<'a, F> {
    y: &'a [f32],
    n: usize,
    f: F,
    /// By first column / NR: that column, the block's width and its sums so far.
    slots: Vec<Mutex<Option<(usize, usize, ColumnSums)>>>,
    /// Whether a block met a slot taken by another first column or width (never, as the product
    /// cuts its output: then an `Err`, not sums of the wrong rows).
    mismatched: AtomicBool,
}

impl<F: Fn(f32, f32) -> f32 + Sync> Finish for Sums<'_, F> {
    fn in_output(&self) -> bool {
        true
    }

    fn by_columns(&self) -> bool {
        true
    }

    unsafe fn finish(&self, i: usize, j: usize, rows: usize, cols: usize, g: *const f32, gs: usize) {
        let mut slot = self.slots[j / NR].lock().unwrap_or_else(|e| e.into_inner());
        let (at, width, sums) = slot.get_or_insert_with(|| (j, cols, ColumnSums::new(cols)));
        if (*at, *width) != (j, cols) {
            self.mismatched.store(true, Ordering::Relaxed);
            return;
        }
        for r in 0..rows {
            // SAFETY: `g` points into the output (in place), whose rows hold `cols` values from
            // column `j`, and only this call touches them now.
            let row = unsafe { std::slice::from_raw_parts_mut(g.add(r * gs).cast_mut(), cols) };
            let at = (i + r) * self.n + j;
            for (v, &yv) in row.iter_mut().zip(&self.y[at..at + cols]) {
                *v = (self.f)(*v, yv);
            }
            sums.add(row);
        }
    }
}

impl<F> Sums<'_, F> {
    /// The bias's gradient: each block's column sums in its columns; `Err` unless the blocks
    /// covered every column once, each with one width (as the product's cut gives them).
    fn into_bias(self) -> Result<Vec<f32>> {
        let (n, mismatched) = (self.n, self.mismatched.load(Ordering::Relaxed));
        let mut db = vec![0f32; n];
        let mut covered = 0;
        for slot in self.slots {
            if let Some((j, w, sums)) = slot.into_inner().unwrap_or_else(|e| e.into_inner()) {
                let out =
                    db.get_mut(j..j + w).ok_or_else(|| Error::invalid("dense backward", "a block past the output"))?;
                sums.finish(out);
                covered += w;
            }
        }
        if covered != n || mismatched {
            return Err(Error::invalid("dense backward", format!("column sums of {covered} of {n} columns")));
        }
        Ok(db)
    }
}

#[cfg(test)]
mod tests {
    use super::super::blocked_gemm::tests::has_kernel;
    use crate::ops::UnaryOp;
    use crate::storage::Storage;
    use crate::{Device, GradStore, Tensor, Var};
    use proptest::prelude::*;

    const OPS: [UnaryOp; 4] = [UnaryOp::Relu, UnaryOp::Exp, UnaryOp::Tanh, UnaryOp::Sigmoid];

    thread_local! {
        /// Fused passes run on this thread.
        pub(super) static FUSED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// The fused pass on Cpu tensors (`None` where it declines).
    fn fused(lhs: &Tensor, rhs: &Tensor, y: &[f32], op: UnaryOp) -> Option<(Vec<f32>, Vec<f32>)> {
        let (ls, rs) = (lhs.storage(), rhs.storage());
        let (Storage::Cpu(l), Storage::Cpu(r)) = (&ls, &rs) else { panic!("Cpu tensors") };
        super::act_bias_grads_of_product((l, lhs.layout()), (r, rhs.layout()), y, op).unwrap()
    }

    /// Four threads, whatever the machine has: the output cut into several parts.
    fn four_threads<T: Send>(f: impl FnOnce() -> T + Send) -> T {
        rayon::ThreadPoolBuilder::new().num_threads(4).build().expect("a pool of 4 threads").install(f)
    }

    /// The fused pass against the product (as the backward pass multiplies) then
    /// `act_bias_grads`, bit for bit, where it runs; where it declines, that weft's kernel does
    /// not take the product.
    fn check(m: usize, n: usize, k: usize, op: UnaryOp, (lt, rt): (bool, bool), seed: u64) -> Result<(), String> {
        let dev = Device::Cpu;
        let matrix = |rows: usize, cols: usize, t: bool, s: u64| {
            if t {
                Tensor::rand(-1.0, 1.0, &[cols, rows], s, &dev).unwrap().t().unwrap()
            } else {
                Tensor::rand(-1.0, 1.0, &[rows, cols], s, &dev).unwrap()
            }
        };
        let (lhs, rhs) = (matrix(m, k, lt, seed), matrix(k, n, rt, seed + 1));
        // An output with zeros (relu's kink) and values either side.
        let y = Tensor::rand(-1.0, 1.0, &[m, n], seed + 2, &dev).unwrap().unary(op).unwrap();
        let keep =
            Tensor::rand(0.0, 1.0, &[m, n], seed + 3, &dev).unwrap().cmp_scalar(crate::ops::BinaryOp::Gt, 0.3).unwrap();
        let yv = y.mul(&keep).unwrap().to_vec::<f32>().unwrap();
        let g = GradStore::multiply(&lhs, &rhs).unwrap().to_vec::<f32>().unwrap();
        let want = super::super::act_bias_grads(&g, &yv, m, n, op).unwrap().expect("an output-only op");
        let on_weft = super::on_weft(super::engine(), m, n, k);
        let what = format!("{op:?} {m}x{n}x{k}, transposed {lt} {rt}");
        match fused(&lhs, &rhs, &yv, op) {
            Some((d, db)) if on_weft => {
                let want_db = want.1.expect("column sums");
                (bits(&d) == bits(&want.0)).then_some(()).ok_or(format!("{what}: d"))?;
                (bits(&db) == bits(&want_db)).then_some(()).ok_or(format!("{what}: bias"))
            }
            Some(_) => Err(format!("{what}: fused off weft's kernel")),
            None if on_weft => Err(format!("{what}: declined on weft's kernel")),
            None => Ok(()),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(16))]
        /// Shapes weft's kernel takes (rows past a column sum's block and a kernel block, widths
        /// that end inside a panel, parts wider than the left matrix read in place, a `k` of one
        /// chunk or several) and some it leaves, each matrix in rows or transposed (the right one
        /// as a weight's transpose, as a layer's input gradient reads it), each activation, on
        /// four threads: `d` and the bias's gradient are the bits of the product then the
        /// backward apart.
        #[test]
        fn gives_the_bits_of_the_product_then_the_backward(m in 16usize..300, n in prop_oneof![2usize..200, 200usize..700],
                                                           k in prop_oneof![32usize..300, 300usize..700], which in 0usize..4,
                                                           transposed in any::<(bool, bool)>(), seed in 0u64..1000) {
            if !has_kernel() {
                return Ok(());
            }
            let out = four_threads(|| check(m, n, k, OPS[which], transposed, seed));
            prop_assert!(out.is_ok(), "{}", out.unwrap_err());
        }
    }

    /// An output wider than the kernel's column block (4080), on one thread and on four: each
    /// block's sums go to its own columns.
    #[test]
    fn wide_outputs_keep_the_bits() {
        if !has_kernel() {
            return;
        }
        check(24, 4200, 40, UnaryOp::Tanh, (false, true), 7).unwrap();
        four_threads(|| check(24, 4200, 40, UnaryOp::Relu, (true, false), 8)).unwrap();
    }

    /// The identity and activations whose gradient needs their input are declined.
    #[test]
    fn declines_what_it_does_not_fuse() {
        if !has_kernel() {
            return;
        }
        let dev = Device::Cpu;
        let (lhs, rhs) = (Tensor::ones(&[64, 64], &dev).unwrap(), Tensor::ones(&[64, 128], &dev).unwrap());
        let y = vec![0.5f32; 64 * 128];
        assert!(fused(&lhs, &rhs, &y, UnaryOp::Relu).is_some());
        for op in [UnaryOp::Identity, UnaryOp::GeluTanh, UnaryOp::GeluErf] {
            assert!(fused(&lhs, &rhs, &y, op).is_none(), "{op:?}");
        }
    }

    /// A two-layer MLP's backward, the hidden layer's output read by the next layer alone (its
    /// gradient left as a product and fused) or also by a second branch (worked out and added),
    /// with a batch weft's kernel takes and one it leaves, on four threads: every gradient is the
    /// bits of the same model built from the ops apart (matmul, then the bias and activation),
    /// plain or with the kernels' gradients deferred (Adam's way), and the hidden layer's
    /// backward is fused where its output has one reader and the kernel runs the product.
    #[test]
    fn stacked_layers_keep_the_gradients_of_the_ops_apart() {
        let dev = Device::Cpu;
        let var = |shape: &[usize], s: u64| Var::new(Tensor::rand(-0.5, 0.5, shape, s, &dev).unwrap()).unwrap();
        let (w1, b1, w2, b2) = (var(&[128, 256], 2), var(&[256], 3), var(&[256, 128], 4), var(&[128], 5));
        for rows in [32, 8] {
            let x = Tensor::rand(-1.0, 1.0, &[rows, 128], 1, &dev).unwrap();
            for op in OPS {
                for branch in [false, true] {
                    for deferring in [false, true] {
                        let run = |fused: bool| {
                            let layer = |x: &Tensor, w: &Var, b: &Var| {
                                if fused {
                                    x.matmul_add_unary(w.as_tensor(), b.as_tensor(), op)
                                } else {
                                    x.matmul(w.as_tensor()).and_then(|t| t.add_unary(b.as_tensor(), op))
                                }
                            };
                            let h = layer(&x, &w1, &b1).unwrap();
                            let mut y = layer(&h, &w2, &b2).unwrap().sum_all().unwrap();
                            if branch {
                                y = y.add(&h.square().unwrap().sum_all().unwrap()).unwrap();
                            }
                            let vars = [&w1, &b1, &w2, &b2];
                            let ts: Vec<&Tensor> = vars.iter().map(|v| v.as_tensor()).collect();
                            let grads = if deferring { y.backward_deferring(&ts) } else { y.backward() }.unwrap();
                            // (Batches this short leave the kernels' gradients as products.)
                            let left = grads.product(w2.as_tensor()).is_some();
                            assert_eq!(left, deferring, "{op:?}, {rows} rows: w2's gradient deferred");
                            vars.map(|v| bits(&grads.resolve(v.as_tensor()).unwrap().unwrap().to_vec::<f32>().unwrap()))
                        };
                        let what = format!("{op:?}, {rows} rows, branch {branch}, deferring {deferring}");
                        let before = FUSED.with(|c| c.get());
                        let here = run(true);
                        let ran = FUSED.with(|c| c.get()) - before;
                        let want = usize::from(has_kernel() && rows == 32 && !branch);
                        assert_eq!(ran, want, "{what}: fused passes");
                        let (pooled, apart) = (four_threads(|| run(true)), four_threads(|| run(false)));
                        for (i, name) in ["w1", "b1", "w2", "b2"].iter().enumerate() {
                            assert_eq!(here[i], apart[i], "{what}: {name}");
                            assert_eq!(pooled[i], apart[i], "{what}: {name}, four threads");
                        }
                    }
                }
            }
        }
    }
}
