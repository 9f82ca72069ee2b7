//! Adam's update fused into the product that makes a weight's gradient (`x^T @ dy` of a dense
//! layer): each block of the product's output rows, once summed (into a scratch block in L2), is
//! handed to Adam's update of the same elements (`blocked_gemm::Finish`) instead of being stored.
//!
//! Why: the gradient is never written to memory nor read back (about a fifth of the bytes per
//! weight that a product and then Adam's pass move), and no gradient buffer is allocated. Measured in the
//! MLP's training step (784-1024-1024-10, batch 256, 2-core Zen 3, the two ways alternated in one
//! process): 1-3% more steps/s, Adam's pass from 16% of the step's samples to 7-8%. The update's
//! reads of the weights and moments still wait for memory on the thread that runs them: fetching
//! them while the micro-kernel sums (tile by tile, or a band ahead) cost the kernel more than it
//! saved, because each tile's lines lie on a new page.
//!
//! The bits are those of the product followed by `adam::chunk`: the block's sums are the values
//! `blocked_gemm::run` would store (whatever the threads), and `adam::Block` runs the same
//! operations as `adam::chunk`.

use super::adam::{Block, BlockLoop, block_loop};
use super::blocked_gemm::{Finish, k_chunk, run_finishing};
use super::gemm_engine::{Product, engine, on_weft};
use super::{CpuStorage, try_take};
use crate::optim_ops::AdamStep;
use crate::{Layout, Result};
use std::sync::atomic::{AtomicBool, Ordering};

/// Adam's update of a row-major `m x n` variable, block by block as the product finishes them.
struct Finisher {
    w: *const f32,
    m: *const f32,
    v: *const f32,
    wo: *mut f32,
    mo: *mut f32,
    vo: *mut f32,
    /// Values per row.
    n: usize,
    p: AdamStep,
    /// Whether the moments are written with streaming stores (see `adam::Block`).
    stream: bool,
    run: BlockLoop,
    /// Whether any block's gradient held an infinity or a NaN.
    bad: AtomicBool,
}

// SAFETY: the inputs are only read; each output element is written by the one thread that
// finishes its block (`Finish::finish`'s contract).
unsafe impl Sync for Finisher {}

impl Finish for Finisher {
    unsafe fn finish(&self, i: usize, j: usize, rows: usize, cols: usize, g: *const f32, gs: usize) {
        let o = i * self.n + j;
        // SAFETY: the block lies inside the variable and its outputs (the caller's contract),
        // and only this call writes it.
        let check = unsafe {
            let block = Block {
                w: self.w.add(o),
                g,
                m: self.m.add(o),
                v: self.v.add(o),
                wo: self.wo.add(o),
                mo: self.mo.add(o),
                vo: self.vo.add(o),
                rows,
                cols,
                rs: self.n,
                gs,
                stream: self.stream,
            };
            (self.run)(&block, &self.p)
        };
        if check != 0.0 {
            self.bad.store(true, Ordering::Relaxed);
        }
    }
}

/// The variable's values and moments as a fused step gets them: read, with the new values
/// written to fresh buffers, or written over in place.
pub(crate) enum State<'a> {
    /// Read only (the new values come back).
    Read([&'a [f32]; 3]),
    /// Written over (nothing comes back but the check).
    InPlace([&'a mut [f32]; 3]),
}

/// What a fused step gives: the new weight, m and v where the state was read (`None` in
/// place), and the gradient's check.
pub(crate) type Stepped = (Option<[Vec<f32>; 3]>, f32);

/// One Adam step whose gradient is `lhs @ rhs` (2-D layouts) for a row-major `m x n` variable
/// whose weight, m and v `state` holds: the new weight, m and v where `state` is read (`None`
/// in place), and the gradient's check (0, or NaN when any value is an infinity or a NaN);
/// `None` when the product is not one weft's own kernel runs (nothing is written: the caller
/// multiplies, then updates).
pub(crate) fn matmul_adam(
    (lhs, la): (&CpuStorage, &Layout),
    (rhs, lb): (&CpuStorage, &Layout),
    mut state: State<'_>,
    p: &AdamStep,
) -> Result<Option<Stepped>> {
    let (x, y) = (lhs.f32s("adam_step")?, rhs.f32s("adam_step")?);
    let Some(mut product) = Product::of_matrices("adam_step", (x, la), (y, lb))? else { return Ok(None) };
    let (rows, n, k) = (product.m, product.n, product.k);
    let size = rows * n;
    let short = match &state {
        State::Read(s) => s.iter().any(|s| s.len() < size),
        State::InPlace(s) => s.iter().any(|s| s.len() < size),
    };
    if !on_weft(engine(), rows, n, k) || short {
        return Ok(None);
    }
    // The earlier chunks' sums of a long `k` wait here; one chunk needs no room at all.
    let mut sums = if k_chunk(k) < k { try_take(size)? } else { Vec::new() };
    let mut outs = None;
    let ([w, m, v], [wo, mo, vo]) = match &mut state {
        State::Read(ins) => {
            let mut o = [try_take(size)?, try_take(size)?, try_take(size)?];
            let at = o.each_mut().map(|o| o.as_mut_ptr());
            outs = Some(o);
            (ins.map(|s| s.as_ptr()), at)
        }
        State::InPlace(s) => {
            let at = s.each_mut().map(|s| s.as_mut_ptr());
            (at.map(|a| a.cast_const()), at)
        }
    };
    let fin = Finisher {
        w,
        m,
        v,
        wo,
        mo,
        vo,
        n,
        p: *p,
        // In place the moments' lines were just read: a streaming store would save nothing.
        stream: outs.is_some() && size >= 1 << 18,
        run: block_loop(),
        bad: AtomicBool::new(false),
    };
    if sums.capacity() > 0 {
        product.dst = sums.as_mut_ptr();
    }
    let threads = product.threads();
    // SAFETY: on_weft: the CPU runs weft's kernel; every element the strides reach lies inside
    // x and y (the extent check); `sums` has room for the output when k takes several chunks;
    // the finisher's pointers hold `size` values each, and in place each output is its own
    // input, borrowed mutably here (a block's elements are read before they are written).
    unsafe { run_finishing(&product, None, &fin, threads) }?;
    if let Some(o) = outs.as_mut() {
        // SAFETY: every output block was finished once, which wrote each of its elements in all three.
        o.iter_mut().for_each(|o| unsafe { o.set_len(size) });
    }
    let check = if fin.bad.load(Ordering::Relaxed) { f32::NAN } else { 0.0 };
    Ok(Some((outs, check)))
}

#[cfg(test)]
mod tests {
    use crate::optim_ops::AdamStep;
    use crate::{Device, Result, Tensor};
    use proptest::prelude::*;

    fn values(n: usize, seed: u64, lo: f32) -> Vec<f32> {
        (0..n).map(|i| ((((i as u64 * 2654435761 + seed * 97) % 1999) as f32 / 999.5) - 1.0).max(lo)).collect()
    }

    /// Bits, except that any NaN equals any NaN.
    fn same(a: &[f32], b: &[f32]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()))
    }

    /// `(fused, apart)`: each the new weight, m, v and check, for the gradient `lhs @ rhs`.
    fn both(lhs: &Tensor, rhs: &Tensor, w: &Tensor, m: &Tensor, v: &Tensor, p: AdamStep) -> Result<[Vec<Vec<f32>>; 2]> {
        let fused = w.adam_step_of_product(lhs, rhs, m, v, p)?;
        let apart = w.adam_step_checked(&lhs.matmul(rhs)?, m, v, p)?;
        let list = |(w, m, v, c): (Tensor, Tensor, Tensor, Option<Tensor>)| -> Result<Vec<Vec<f32>>> {
            Ok(vec![w.to_vec()?, m.to_vec()?, v.to_vec()?, c.expect("a check on the Cpu").to_vec()?])
        };
        Ok([list(fused)?, list(apart)?])
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// Any shape (tiles cut short at the right and bottom edges, `k` over one chunk or
        /// several), a left matrix read in rows or transposed (a weight gradient's `x^T`), with
        /// and without decay, and a gradient with an infinity or a NaN: the fused step gives the
        /// bits of the product followed by Adam's pass, and the same check; and where weft's own
        /// kernel runs the product, the fused pass is the one that ran.
        #[test]
        fn gives_the_bits_of_the_product_then_adam(a in 16usize..150, b in 32usize..130, k in 32usize..700,
                                                   transposed in any::<bool>(), decay in any::<bool>(),
                                                   bad in proptest::option::of((0usize..10_000, 0usize..3)), seed in 0u64..1000) {
            let dev = Device::Cpu;
            let mut x = values(a * k, seed, -2.0);
            if let Some((at, kind)) = bad {
                x[at % (a * k)] = [f32::INFINITY, f32::NEG_INFINITY, f32::NAN][kind];
            }
            let lhs = if transposed {
                Tensor::from_vec(x, &[k, a], &dev).unwrap().t().unwrap()
            } else {
                Tensor::from_vec(x, &[a, k], &dev).unwrap()
            };
            let rhs = Tensor::from_vec(values(k * b, seed + 1, -2.0), &[k, b], &dev).unwrap();
            let w = Tensor::from_vec(values(a * b, seed + 2, -2.0), &[a, b], &dev).unwrap();
            let m = Tensor::from_vec(values(a * b, seed + 3, -2.0), &[a, b], &dev).unwrap();
            let v = Tensor::from_vec(values(a * b, seed + 4, 0.0), &[a, b], &dev).unwrap();
            let p = AdamStep { lr_t: 1e-3, beta1: 0.9, beta2: 0.999, eps: 1e-7, decay: if decay { 0.996 } else { 1.0 } };
            let [fused, apart] = both(&lhs, &rhs, &w, &m, &v, p).unwrap();
            for (i, name) in ["weight", "m", "v", "check"].into_iter().enumerate() {
                prop_assert!(same(&fused[i], &apart[i]), "{} differs: {}x{}x{} transposed {}", name, a, b, k, transposed);
            }
            prop_assert_eq!(fused[3][0].is_nan(), bad.is_some());
            let cpu = |t: &Tensor| match t.storage() {
                crate::storage::Storage::Cpu(s) => s,
                _ => unreachable!("a Cpu tensor"),
            };
            let ran = super::matmul_adam(
                (&cpu(&lhs), lhs.layout()),
                (&cpu(&rhs), rhs.layout()),
                super::State::Read([&w.to_vec::<f32>().unwrap(), &m.to_vec::<f32>().unwrap(), &v.to_vec::<f32>().unwrap()]),
                &p,
            ).unwrap();
            let weft = super::on_weft(super::engine(), a, b, k);
            prop_assert_eq!(ran.is_some(), weft);
        }
    }
}
