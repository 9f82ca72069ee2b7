//! Batched matmul on the Cpu through the `gemm` crate (packed, SIMD, multithreaded), which takes
//! arbitrary row and column strides, so transposed views are read in place.

use super::{CpuStorage, f32_storage, try_zeros};
use crate::{Layout, Result};
use rayon::prelude::*;

/// `a @ b` for layouts `[batch.., m, k]` and `[batch.., k, n]` with one batch shape (strides may be 0).
pub fn matmul(a: &CpuStorage, la: &Layout, b: &CpuStorage, lb: &Layout) -> Result<CpuStorage> {
    let (x, y) = (a.f32s("matmul")?, b.f32s("matmul")?);
    let r = la.rank();
    let (m, k, n) = (la.shape()[r - 2], la.shape()[r - 1], lb.shape()[r - 1]);
    let batch = Layout::contiguous(&la.shape()[..r - 2]);
    let nb = batch.numel();
    let mut out = try_zeros(nb * m * n)?;
    let (ars, acs) = (la.strides()[r - 2] as isize, la.strides()[r - 1] as isize);
    let (brs, bcs) = (lb.strides()[r - 2] as isize, lb.strides()[r - 1] as isize);
    // Offsets of each batch's matrix in a and b.
    let boff = |l: &Layout| -> Vec<usize> {
        Layout::new(l.shape()[..r - 2].into(), l.strides()[..r - 2].into(), l.offset()).offsets().collect()
    };
    let (aoffs, boffs) = (boff(la), boff(lb));
    if m * n * k == 0 {
        return Ok(f32_storage(out));
    }
    // The last element each matrix reads must lie inside its buffer: the bound the unsafe gemm
    // calls below rely on (checked here, not assumed from how the layouts were made).
    let reach = |offs: &[usize], rs: isize, cs: isize, rows: usize, cols: usize| {
        offs.iter().max().copied().unwrap_or(0) + (rows - 1) * rs as usize + (cols - 1) * cs as usize
    };
    if reach(&aoffs, ars, acs, m, k) >= x.len() || reach(&boffs, brs, bcs, k, n) >= y.len() {
        return Err(crate::Error::invalid("matmul", format!("layouts {la:?} and {lb:?} reach outside their buffers")));
    }
    let work = m * n * k;
    let one = |i: usize, dst: &mut [f32], par: gemm::Parallelism| {
        // SAFETY: every pointer plus its strides stays inside its slice (the reach check above:
        // strides are non-negative, so the farthest element is the last row and column of the
        // matrix at the largest offset), and dst is exactly m*n row-major.
        unsafe {
            gemm::gemm(
                m,
                n,
                k,
                dst.as_mut_ptr(),
                1,
                n as isize,
                false,
                x.as_ptr().add(aoffs[i]),
                acs,
                ars,
                y.as_ptr().add(boffs[i]),
                bcs,
                brs,
                0.0,
                1.0,
                false,
                false,
                false,
                par,
            )
        }
    };
    let threads = rayon::current_num_threads();
    if nb >= threads && threads > 1 && work >= 1 << 15 {
        // Enough matrices to keep every core busy: one single-threaded gemm per batch entry.
        out.par_chunks_mut(m * n).enumerate().for_each(|(i, dst)| one(i, dst, gemm::Parallelism::None));
    } else {
        let par =
            if work >= 1 << 18 && threads > 1 { gemm::Parallelism::Rayon(threads) } else { gemm::Parallelism::None };
        for (i, dst) in out.chunks_mut(m * n).enumerate() {
            one(i, dst, par);
        }
    }
    Ok(f32_storage(out))
}
