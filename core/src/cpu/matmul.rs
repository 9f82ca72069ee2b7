//! Batched matmul on the Cpu: cuts the work over the cores and hands each piece to the engine
//! (`gemm_engine`), which takes arbitrary row and column strides, so transposed views are read in
//! place; only for faer's kernels is a large transposed left matrix first copied into rows, which
//! they pack faster (weft's own kernel packs either as fast).

use super::gemm_engine::{Product, engine, on_weft};
use super::{CpuStorage, f32_storage, try_take, try_zeros};
use crate::ops::UnaryOp;
use crate::{Layout, Result};

/// `a @ b` for layouts `[batch.., m, k]` and `[batch.., k, n]` with one batch shape (strides may be 0).
pub fn matmul(a: &CpuStorage, la: &Layout, b: &CpuStorage, lb: &Layout) -> Result<CpuStorage> {
    Ok(f32_storage(product(a, la, b, lb, None)?.0))
}

/// `op(a @ b + bias)` for `[m, k]` and `[k, n]` layouts and a bias of `n` values: a dense layer's
/// output. Where weft's kernel runs the product (in inference with the right matrix kept packed:
/// `packed`; in training packed as it comes), the bias and activation are applied to each block
/// of output rows right after its sums, while it is in cache; otherwise in one pass over the
/// output after the product. Either way the same bits as the product then `add_unary`.
pub fn matmul_add_unary(
    a: &CpuStorage,
    la: &Layout,
    b: &CpuStorage,
    lb: &Layout,
    bias: &[f32],
    op: UnaryOp,
) -> Result<CpuStorage> {
    let n = lb.shape()[lb.rank() - 1];
    if la.rank() != 2 || lb.rank() != 2 || bias.len() != n {
        return Err(crate::Error::invalid(
            "matmul_add_unary",
            format!(
                "{:?} @ {:?} + bias of {}: takes two matrices and a bias per column",
                la.shape(),
                lb.shape(),
                bias.len()
            ),
        ));
    }
    let (mut out, finished) = product(a, la, b, lb, Some((bias, op)))?;
    if !finished {
        super::elementwise::add_unary_rows_par(&mut out, bias, op);
    }
    Ok(f32_storage(out))
}

/// A dense layer's bias and activation, finished on each block of the product's output in place.
#[cfg(target_arch = "x86_64")]
struct BiasAct<'a> {
    bias: &'a [f32],
    op: UnaryOp,
}

#[cfg(target_arch = "x86_64")]
impl super::blocked_gemm::Finish for BiasAct<'_> {
    fn in_output(&self) -> bool {
        true
    }

    unsafe fn finish(&self, _i: usize, j: usize, rows: usize, cols: usize, g: *const f32, gs: usize) {
        for r in 0..rows {
            // SAFETY: `g` points into the output (in place), whose rows hold `cols` values from
            // column `j`, and only this call touches them now.
            let row = unsafe { std::slice::from_raw_parts_mut(g.add(r * gs).cast_mut(), cols) };
            super::elementwise::add_unary_rows_in_place(row, &self.bias[j..j + cols], self.op);
        }
    }
}

/// [`matmul`], with `epilogue` (a bias per column and an op) applied to the output blocks where
/// the product's kernel can; `true` when it was.
fn product(
    a: &CpuStorage,
    la: &Layout,
    b: &CpuStorage,
    lb: &Layout,
    epilogue: Option<(&[f32], UnaryOp)>,
) -> Result<(Vec<f32>, bool)> {
    let (x, y) = (a.f32s("matmul")?, b.f32s("matmul")?);
    let r = la.rank();
    let (m, k, n) = (la.shape()[r - 2], la.shape()[r - 1], lb.shape()[r - 1]);
    let batch = Layout::contiguous(&la.shape()[..r - 2]);
    let nb = batch.numel();
    if [nb, m, n, k].contains(&0) {
        // No products to sum: every output is 0 (and nothing is read).
        return Ok((try_zeros(nb * m * n)?, false));
    }
    let (ars, acs) = (la.strides()[r - 2] as isize, la.strides()[r - 1] as isize);
    let (brs, bcs) = (lb.strides()[r - 2] as isize, lb.strides()[r - 1] as isize);
    // Offsets of each batch's matrix in a and b.
    let boff = |l: &Layout| -> Vec<usize> { l.leading(r - 2).offsets().collect() };
    let (aoffs, boffs) = (boff(la), boff(lb));
    // The last element each matrix reads must lie inside its buffer: the bound the unsafe gemm
    // calls below rely on (checked here, not assumed from how the layouts were made).
    let reach = |offs: &[usize], rs: isize, cs: isize, rows: usize, cols: usize| {
        offs.iter().max().copied().unwrap_or(0) + (rows - 1) * rs as usize + (cols - 1) * cs as usize
    };
    if reach(&aoffs, ars, acs, m, k) >= x.len() || reach(&boffs, brs, bcs, k, n) >= y.len() {
        return Err(crate::Error::invalid("matmul", format!("layouts {la:?} and {lb:?} reach outside their buffers")));
    }
    let work = m * n * k;
    let threads = rayon::current_num_threads();
    #[cfg(target_arch = "x86_64")]
    if let Some(out) = packed(x, b, (m, n, k), (ars, acs, aoffs[0]), (brs, bcs, boffs[0]), nb, threads, epilogue)? {
        return Ok(out);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = epilogue;
    // Every element is written by the engine (it replaces, not adds): no zero fill first.
    let mut out = try_take(nb * m * n)?;
    // A transposed left matrix (its columns adjacent in memory) slows the engine's packing by up
    // to a fifth on the backward's `x^T @ g`; a blocked transpose into rows (`strided_copy`) costs m*k
    // against m*k*n.
    let lhs_rows;
    // (Not for a left matrix broadcast over the batch: the copy would repeat it per entry.)
    let broadcast = la.strides()[..r - 2].iter().zip(&la.shape()[..r - 2]).any(|(&s, &d)| s == 0 && d > 1);
    let engine = engine();
    // (weft's own kernel packs a transposed left matrix as fast as rows: no copy for it.)
    let packs_columns = on_weft(engine, m, n, k);
    let (x, ars, acs, aoffs) =
        if ars == 1 && acs > 1 && m > 1 && n >= 64 && work >= 1 << 20 && !broadcast && !packs_columns {
            // A HostBuf, so the copy's buffer goes back to the cache for the next step.
            lhs_rows = super::HostBuf::new(super::strided_copy::to_contiguous(x, la)?);
            (&lhs_rows[..], k as isize, 1, (0..nb).map(|i| i * m * k).collect())
        } else {
            (x, ars, acs, aoffs)
        };
    let base = Dst(out.as_mut_ptr());
    // The product of batch entry `i`, written to its m*n row-major block of `out`.
    let part = |i: usize| Product {
        m,
        n,
        k,
        dst: base.at(i * m * n).ptr(),
        dst_rs: n as isize,
        lhs: unsafe { x.as_ptr().add(aoffs[i]) },
        lhs_rs: ars,
        lhs_cs: acs,
        rhs: unsafe { y.as_ptr().add(boffs[i]) },
        rhs_rs: brs,
        rhs_cs: bcs,
    };
    // SAFETY (of `part`'s products): every pointer plus its strides stays inside its slice (the
    // reach check above: strides are non-negative, so the farthest element is the last row and
    // column of the matrix at the largest offset), and dst points at the entry's m*n row-major
    // block of `out`, which no other entry's product writes.
    let block = |i: usize, threads: usize| unsafe { part(i).run(engine, threads) };
    let big = work >= super::gemm_engine::shared_from() && threads > 1;
    #[cfg(target_arch = "x86_64")]
    if let (Some((bias, op)), true) = (epilogue, nb == 1 && packs_columns) {
        // A dense layer's bias and activation (in training, or in inference where `packed` did
        // not take the product) applied to each block of output rows in cache, with the right
        // matrix packed as it comes.
        let fin = BiasAct { bias, op };
        // SAFETY: on weft's kernel (AVX2 and FMA); `part`'s contract; out has room for m x n,
        // every element of which the product writes.
        unsafe {
            super::blocked_gemm::run_finishing(&part(0), None, &fin, if big { threads } else { 1 })?;
            out.set_len(m * n);
        }
        return Ok((out, true));
    }
    if nb >= threads && threads > 1 && work >= 1 << 15 {
        // Enough matrices to keep every core busy: one single-threaded product per batch entry.
        super::share::try_par_for(nb, |_: &mut (), i| block(i, 1))?;
    } else {
        // A large product on every core: weft's kernel shares its blocks out itself, and
        // `Product::run` cuts a library's product into blocks over the same threads.
        for i in 0..nb {
            block(i, if big { threads } else { 1 })?;
        }
    }
    // SAFETY: every branch above ran `block` over all batch entries, each of which wrote every
    // element of its m*n block, and the capacity is nb*m*n.
    unsafe { out.set_len(nb * m * n) };
    Ok((out, false))
}

/// The product on weft's own kernels in inference (no gradient recorded, outside a backward
/// pass, whose weights are new storage every training step) when the CPU runs weft's kernels
/// (`packed_gemm::available`) and there is one matrix of at least 16 columns: the right matrix is packed per storage
/// and layout, and kept from its second use (a model's weights), as onnxruntime pre-packs its
/// constant weights. Up to `FEW_ROWS` rows whose values are adjacent (unit column stride), or
/// `max_rows` where weft's kernel suits the shape and every thread gets a panel of columns, run
/// on `packed_gemm`; more on `blocked_gemm` (where it suits the shape), which applies `epilogue` to
/// its blocks (then `true`). `None`: the engine's turn.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
fn packed(
    x: &[f32],
    b: &CpuStorage,
    (m, n, k): (usize, usize, usize),
    (ars, acs, aoff): (isize, isize, usize),
    (brs, bcs, boff): (isize, isize, usize),
    nb: usize,
    threads: usize,
    epilogue: Option<(&[f32], UnaryOp)>,
) -> Result<Option<(Vec<f32>, bool)>> {
    use super::{blocked_gemm, packed_gemm};
    let CpuStorage::F32(buf) = b else { return Ok(None) };
    let inference = crate::backprop::inference();
    // The threads the product runs on: one below the size either kernel shares out.
    let threads = if m * n * k >= super::gemm_engine::shared_from() { threads } else { 1 };
    let suits = on_weft(engine(), m, n, k);
    // Past FEW_ROWS only where blocked_gemm would take the product too (so a batch's rows keep
    // their bits whatever its size) and every thread gets columns.
    let few =
        m <= packed_gemm::FEW_ROWS || (m <= packed_gemm::max_rows() && suits && n.div_ceil(packed_gemm::NR) >= threads);
    let small = few && acs == 1;
    let big = !small && suits;
    if !inference || nb != 1 || !(small || big) || n < packed_gemm::NR || !packed_gemm::available() {
        return Ok(None);
    }
    let rhs = buf.packed_rhs((boff, brs as usize, bcs as usize, k, n))?;
    if rhs.dims() != (k, n) {
        // The kernel writes the packed matrix's columns: never let a mismatch reach it.
        return Err(crate::Error::invalid("matmul", format!("packed right matrix {:?} for a {k}x{n} one", rhs.dims())));
    }
    let mut out = try_take(m * n)?;
    if big {
        let p = Product {
            m,
            n,
            k,
            dst: out.as_mut_ptr(),
            dst_rs: n as isize,
            // SAFETY: aoff lies inside x (the reach check).
            lhs: unsafe { x.as_ptr().add(aoff) },
            lhs_rs: ars,
            lhs_cs: acs,
            // Not read: the packed copy stands for it.
            rhs: std::ptr::null(),
            rhs_rs: 0,
            rhs_cs: 0,
        };
        // SAFETY: the engine is Weft (AVX2 and FMA); a's rows and columns lie inside x (the
        // reach check), out has room for m*n, rhs is k x n.
        match epilogue {
            Some((bias, op)) => {
                let fin = BiasAct { bias, op };
                unsafe { blocked_gemm::run_finishing(&p, Some(&rhs), &fin, threads) }?
            }
            None => unsafe { blocked_gemm::run(&p, Some(&rhs), threads) }?,
        }
    } else {
        let lhs = packed_gemm::Lhs::new(&x[aoff..], m, ars as usize, k)?;
        let panels = rhs.panels();
        // Columns split over the threads: each output element is summed in the same order either way.
        let parts = threads.min(panels);
        let per = panels.div_ceil(parts);
        let dst = Dst(out.as_mut_ptr());
        let run = |part: usize| {
            let cols = (part * per).min(panels)..((part + 1) * per).min(panels);
            // SAFETY: the kernel exists (available), both operands have this k, out has room for
            // m*n, and each part writes only its own columns.
            unsafe { packed_gemm::run(&lhs, &rhs, cols, dst.ptr(), n) }
        };
        if parts > 1 {
            super::share::par_for(parts, &run);
        } else {
            run(0);
        }
    }
    // SAFETY: every branch wrote every row and column of the m x n output.
    unsafe { out.set_len(m * n) };
    Ok(Some((out, big && epilogue.is_some())))
}

/// The output buffer, shared by products that each write their own elements (a batch entry's
/// block, or a part's columns).
#[derive(Clone, Copy)]
struct Dst(*mut f32);

// SAFETY: the products that share it write disjoint blocks (see `block`), and `out` outlives them.
unsafe impl Send for Dst {}
unsafe impl Sync for Dst {}

impl Dst {
    fn ptr(self) -> *mut f32 {
        self.0
    }

    fn at(self, offset: usize) -> Dst {
        // SAFETY: callers pass the start of a batch entry's m*n block, inside the buffer.
        Dst(unsafe { self.0.add(offset) })
    }
}
