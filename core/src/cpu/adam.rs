//! Adam's fused update on the Cpu, over a chunk of a variable ([`chunk`]) or a block of its rows
//! (a [`Block`], as a product finishes them: `matmul_adam`), one loop for both.
//!
//! The update reads four values and writes three per weight, and a training step's variables do
//! not fit in the cache, so it runs at the speed of memory. An ordinary store first reads the
//! line it writes (to own it): 40 bytes of traffic per weight. Where the CPU has AVX, the new
//! values are computed eight at a time (sixteen where AVX-512 runs at full width: the square root
//! and division are as slow as the memory there) and, for a variable too large to stay in the
//! cache anyway, the moments are written with streaming stores, which skip that read (32 bytes);
//! they are read only at the next step. The new weights are stored as usual, so that the next
//! forward pass, which reads them first, finds them in the cache: on a 2-core Zen 3 with a 32 MiB
//! L3 the MLP's step (7.4 MB of weights) ran 2-3% faster than with the weights streamed too.
//! Without fused multiply-adds, in the scalar loop's order: the results are the same bits either
//! way, so a variable split over devices updates as it would whole.
//!
//! The same pass also checks the gradient: it adds up `g - g` (0 for a finite value, NaN for an
//! infinity or a NaN), so the training step need not read every gradient a second time to find
//! out whether the step may stand (on a 2-core Zen 3 that second read was 3% of the MLP's step).

use crate::optim_ops::AdamStep;
use std::mem::MaybeUninit;

/// The new (weight, m, v) of one element.
#[inline(always)]
fn one(w: f32, g: f32, m: f32, v: f32, p: &AdamStep) -> (f32, f32, f32) {
    let mi = m + (g - m) * (1.0 - p.beta1);
    let vi = v + (g * g - v) * (1.0 - p.beta2);
    (w * p.decay - p.lr_t * mi / (vi.sqrt() + p.eps), mi, vi)
}

/// The outputs of one chunk, each as long as the inputs.
pub struct Outs<'a> {
    /// New weights.
    pub w: &'a mut [MaybeUninit<f32>],
    /// New first moments.
    pub m: &'a mut [MaybeUninit<f32>],
    /// New second moments.
    pub v: &'a mut [MaybeUninit<f32>],
}

/// Writes every element of `out` from the inputs `[w, g, m, v]` (all of one length); `stream`:
/// the moments with streaming stores where the CPU has them (for a large variable). Returns the
/// gradient's check: 0 when every value of `g` is finite, NaN when any is not.
pub fn chunk(ins: [&[f32]; 4], out: Outs<'_>, p: &AdamStep, stream: bool) -> f32 {
    let n = ins[0].len();
    assert!(ins.iter().all(|s| s.len() == n) && out.w.len() == n && out.m.len() == n && out.v.len() == n);
    // SAFETY: one row of `n` values in every slice (checked above); the outputs are borrowed
    // mutably, so they overlap nothing else; `block_loop` is one this CPU runs.
    unsafe { block_loop()(&Block::row(ins, out, stream), p) }
}

/// [`chunk`] written over its inputs: each of `w`, `m` and `v` takes its new values (all four
/// of one length), with the same operations, so the same bits, as into fresh outputs. The
/// moments are stored as usual: their lines were just read, so a streaming store saves nothing.
/// Returns the gradient's check.
pub fn chunk_in_place(w: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], p: &AdamStep) -> f32 {
    let n = w.len();
    assert!(g.len() == n && m.len() == n && v.len() == n);
    let (w, m, v) = (w.as_mut_ptr(), m.as_mut_ptr(), v.as_mut_ptr());
    let block = Block { w, g: g.as_ptr(), m, v, wo: w, mo: m, vo: v, rows: 1, cols: n, rs: n, gs: n, stream: false };
    // SAFETY: one row of `n` values in every slice (checked above); each output is its own
    // input, borrowed mutably (so nothing else reads it), and every loop reads an element's
    // inputs before it writes that element; `block_loop` is one this CPU runs.
    unsafe { block_loop()(&block, p) }
}

/// The new (weight, m, v) of one vector of elements, and `g - g` added to the `check` vector:
/// [`one`]'s operations in its order, without fused multiply-adds (the same bits).
macro_rules! update {
    ([$w:ident, $g:ident, $m:ident, $v:ident], $check:ident, [$b1:ident, $b2:ident, $lr:ident, $eps:ident, $decay:ident],
     $add:ident, $sub:ident, $mul:ident, $div:ident, $sqrt:ident) => {{
        $check = $add($check, $sub($g, $g));
        let mi = $add($m, $mul($sub($g, $m), $b1));
        let vi = $add($v, $mul($sub($mul($g, $g), $v), $b2));
        let step = $div($mul($lr, mi), $add($sqrt(vi), $eps));
        ($sub($mul($w, $decay), step), mi, vi)
    }};
}

/// A block of a row-major variable for a [`BlockLoop`]: `rows` rows of `cols` values, `rs` apart
/// in the weights, the moments and the outputs, `gs` apart in the gradient. Each output may be
/// its own input (an update in place): the loops read an element's inputs before writing it.
pub(crate) struct Block {
    pub w: *const f32,
    pub g: *const f32,
    pub m: *const f32,
    pub v: *const f32,
    pub wo: *mut f32,
    pub mo: *mut f32,
    pub vo: *mut f32,
    pub rows: usize,
    pub cols: usize,
    pub rs: usize,
    pub gs: usize,
    /// The moments with streaming stores where the CPU has them and a row's two share their
    /// alignment (a variable too large for the cache, as in [`chunk`]).
    pub stream: bool,
}

/// Adam's update of every element of a block; returns the gradient's check (0, or NaN).
///
/// # Safety
/// The CPU runs the loop (see [`block_loop`]); every row of every pointer holds `cols` values;
/// the outputs overlap nothing else, except that each may be its own input.
pub(crate) type BlockLoop = unsafe fn(&Block, &AdamStep) -> f32;

/// The widest block loop this CPU has: the same bits whichever it is.
pub(crate) fn block_loop() -> BlockLoop {
    #[cfg(target_arch = "x86_64")]
    {
        if super::gemm_engine::full_width_avx512() {
            return avx512_block;
        }
        if std::arch::is_x86_feature_detected!("avx") {
            return avx_block;
        }
    }
    scalar_block
}

impl Block {
    /// One row: the slices of a chunk (all of one length).
    fn row(ins: [&[f32]; 4], out: Outs<'_>, stream: bool) -> Block {
        let n = ins[0].len();
        let [w, g, m, v] = ins.map(|s| s.as_ptr());
        let [wo, mo, vo] = [out.w, out.m, out.v].map(|s| s.as_mut_ptr().cast::<f32>());
        Block { w, g, m, v, wo, mo, vo, rows: 1, cols: n, rs: n, gs: n, stream }
    }

    /// Element `i` of row `r`, one at a time; returns its check.
    ///
    /// # Safety
    /// As [`BlockLoop`], with `r < rows` and `i < cols`.
    #[inline(always)]
    unsafe fn one_at(&self, r: usize, i: usize, p: &AdamStep) -> f32 {
        let (o, go) = (r * self.rs + i, r * self.gs + i);
        // SAFETY: the caller's contract.
        unsafe {
            let g = *self.g.add(go);
            let (w, m, v) = one(*self.w.add(o), g, *self.m.add(o), *self.v.add(o), p);
            *self.wo.add(o) = w;
            *self.mo.add(o) = m;
            *self.vo.add(o) = v;
            #[allow(clippy::eq_op)]
            let check = g - g;
            check
        }
    }
}

/// A [`BlockLoop`] one element at a time.
///
/// # Safety
/// As [`BlockLoop`].
unsafe fn scalar_block(b: &Block, p: &AdamStep) -> f32 {
    let mut check = 0.0;
    for r in 0..b.rows {
        for i in 0..b.cols {
            // SAFETY: the caller's contract; r and i lie inside the block.
            check += unsafe { b.one_at(r, i, p) };
        }
    }
    check
}

/// A [`BlockLoop`] a vector at a time along each row, the row's first values (up to the moments'
/// vector boundary, when streamed) and last ones one at a time. The moments are streamed past
/// the cache when the block asks for it and a row's two share their alignment; the new weights
/// are stored as usual (see the module doc).
macro_rules! block_loop {
    ($(#[$doc:meta])* $name:ident, $feature:literal, $lanes:literal, $load:ident, $store:ident, $stream:ident,
     $set1:ident, $add:ident, $sub:ident, $mul:ident, $div:ident, $sqrt:ident) => {
        $(#[$doc])*
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $feature)]
        unsafe fn $name(b: &Block, p: &AdamStep) -> f32 {
            use std::arch::x86_64::*;
            let (b1, b2) = ($set1(1.0 - p.beta1), $set1(1.0 - p.beta2));
            let (lr, eps, decay) = ($set1(p.lr_t), $set1(p.eps), $set1(p.decay));
            let mut check = $set1(0.0);
            let mut ends = 0.0;
            let mut streamed = false;
            for r in 0..b.rows {
                let (o, go) = (r * b.rs, r * b.gs);
                let mis = |p: *mut f32| (p.wrapping_add(o) as usize) % ($lanes * 4);
                let stream = b.stream && mis(b.mo) == mis(b.vo) && b.cols >= 4 * $lanes;
                // Scalar up to the moments' first vector boundary (streaming stores need it).
                let head = if stream { ((($lanes * 4) - mis(b.mo)) % ($lanes * 4) / 4).min(b.cols) } else { 0 };
                let body = head + (b.cols - head) / $lanes * $lanes;
                streamed |= stream;
                for i in 0..head {
                    // SAFETY: as below, one element.
                    ends += unsafe { b.one_at(r, i, p) };
                }
                let mut i = head;
                while i < body {
                    // SAFETY: i + lanes <= cols on row r of every pointer (the caller's contract).
                    unsafe {
                        let (w, g) = ($load(b.w.add(o + i)), $load(b.g.add(go + i)));
                        let (m, v) = ($load(b.m.add(o + i)), $load(b.v.add(o + i)));
                        let (wi, mi, vi) =
                            update!([w, g, m, v], check, [b1, b2, lr, eps, decay], $add, $sub, $mul, $div, $sqrt);
                        $store(b.wo.add(o + i), wi);
                        if stream {
                            $stream(b.mo.add(o + i), mi);
                            $stream(b.vo.add(o + i), vi);
                        } else {
                            $store(b.mo.add(o + i), mi);
                            $store(b.vo.add(o + i), vi);
                        }
                    }
                    i += $lanes;
                }
                for i in body..b.cols {
                    // SAFETY: as above, one element.
                    ends += unsafe { b.one_at(r, i, p) };
                }
            }
            if streamed {
                _mm_sfence();
            }
            let mut lanes = [0f32; $lanes];
            // SAFETY: `lanes` holds one vector.
            unsafe { $store(lanes.as_mut_ptr(), check) };
            lanes.iter().sum::<f32>() + ends
        }
    };
}

block_loop!(
    /// Eight at a time with AVX.
    ///
    /// # Safety
    /// The CPU has AVX; as [`BlockLoop`].
    avx_block, "avx", 8, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_stream_ps, _mm256_set1_ps, _mm256_add_ps, _mm256_sub_ps,
    _mm256_mul_ps, _mm256_div_ps, _mm256_sqrt_ps
);

block_loop!(
    /// Sixteen at a time where AVX-512 runs at full width.
    ///
    /// # Safety
    /// The CPU has AVX-512 F; as [`BlockLoop`].
    avx512_block, "avx512f", 16, _mm512_loadu_ps, _mm512_storeu_ps, _mm512_stream_ps, _mm512_set1_ps, _mm512_add_ps,
    _mm512_sub_ps, _mm512_mul_ps, _mm512_div_ps, _mm512_sqrt_ps
);

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The proptest below compares the AVX loop with the scalar one only where the CPU has AVX;
    /// CI's machines do, so there a missing one is a failure, not a silent scalar-with-scalar run.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_avx_loop_is_what_ci_checks() {
        let has = std::arch::is_x86_feature_detected!("avx");
        assert!(has || std::env::var("CI").is_err(), "no AVX under CI=true: the AVX Adam loop went untested");
    }

    /// The loops this CPU runs, each to be checked against one element at a time: the scalar
    /// one and the vector ones.
    fn loops() -> Vec<(&'static str, BlockLoop)> {
        let mut v: Vec<(&'static str, BlockLoop)> = vec![("scalar", scalar_block)];
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx") {
                v.push(("avx", avx_block));
            }
            if std::arch::is_x86_feature_detected!("avx512f") {
                v.push(("avx512", avx512_block));
            }
        }
        v
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]
        /// Any length and any start of each output (so shared and unshared alignments, and with
        /// `carve` three outputs cut from one buffer 64 bytes apart, which always share theirs and
        /// take the streaming stores) gives the scalar loop's bits, streaming or not, for each
        /// vector loop the CPU has (AVX; AVX-512 where present); and the gradient check is 0 for
        /// a finite gradient and NaN when one value (anywhere: head, body or tail) is an
        /// infinity or a NaN.
        #[test]
        fn equals_the_scalar_loop(n in 0usize..300, offs in proptest::array::uniform3(0usize..17), carve in any::<bool>(),
                                  stream in any::<bool>(), seed in 0u64..1000, bad in proptest::option::of((0usize..300, 0usize..3))) {
            let val = |i: usize, s: u64| (((i as u64 * 2654435761 + s * 97) % 1999) as f32 / 999.5) - 1.0;
            let mut ins: Vec<Vec<f32>> = (0..4).map(|k| (0..n).map(|i| {
                let x = val(i, seed + k);
                if k == 3 { x.abs() } else { x }
            }).collect()).collect();
            let bad = bad.filter(|&(at, _)| at < n);
            if let Some((at, kind)) = bad {
                ins[1][at] = [f32::INFINITY, f32::NEG_INFINITY, f32::NAN][kind];
            }
            let p = AdamStep { lr_t: 1e-3, beta1: 0.9, beta2: 0.999, eps: 1e-7, decay: 0.996 };
            // Each output's start in one buffer: apart by a whole number of 16-float blocks when
            // carved (one alignment for all three), else at unrelated offsets.
            let span = n.div_ceil(16) * 16 + 16;
            let starts = if carve { [0, 1, 2].map(|k| offs[0] + k * span) } else { [offs[0], span + offs[1], 2 * span + offs[2]] };
            // Bits, except that any NaN equals any NaN (their payloads are not the point).
            let same = |a: f32, b: f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
            for (name, run) in loops() {
                // A value no output takes: an element left unwritten shows.
                let mut buf = vec![MaybeUninit::new(12345.0f32); 3 * span + 16];
                let (a, rest) = buf.split_at_mut(span);
                let (b, c) = rest.split_at_mut(span);
                let (s0, s1, s2) = (starts[0], starts[1] - span, starts[2] - 2 * span);
                let outs = Outs { w: &mut a[s0..s0 + n], m: &mut b[s1..s1 + n], v: &mut c[s2..s2 + n] };
                // SAFETY: `loops` lists only what the CPU has; the slices have one length.
                let check = unsafe { run(&Block::row([&ins[0], &ins[1], &ins[2], &ins[3]], outs, stream), &p) };
                if bad.is_some() {
                    prop_assert!(check.is_nan(), "{} missed {:?}: {}", name, bad, check);
                } else {
                    prop_assert_eq!(check.to_bits(), 0f32.to_bits(), "{}", name);
                }
                for i in 0..n {
                    let (w, m, v) = one(ins[0][i], ins[1][i], ins[2][i], ins[3][i], &p);
                    // SAFETY: the loop wrote every element of each output range.
                    let got = unsafe { [buf[starts[0] + i].assume_init(), buf[starts[1] + i].assume_init(), buf[starts[2] + i].assume_init()] };
                    for (g, want) in got.into_iter().zip([w, m, v]) {
                        prop_assert!(same(g, want), "{} element {}: {} against {}", name, i, g, want);
                    }
                }
            }
            // In place: the same bits and check as into fresh outputs.
            let [mut w, g, mut m, mut v] = [0, 1, 2, 3].map(|k| ins[k].clone());
            let check = chunk_in_place(&mut w, &g, &mut m, &mut v, &p);
            prop_assert_eq!(check.is_nan(), bad.is_some());
            for i in 0..n {
                let want = one(ins[0][i], ins[1][i], ins[2][i], ins[3][i], &p);
                for (got, want) in [w[i], m[i], v[i]].into_iter().zip([want.0, want.1, want.2]) {
                    prop_assert!(same(got, want), "in place, element {}: {} against {}", i, got, want);
                }
            }
        }
    }
}
