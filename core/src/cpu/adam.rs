//! Adam's fused update over one chunk of a variable on the Cpu.
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
    #[cfg(target_arch = "x86_64")]
    if super::gemm_engine::full_width_avx512() {
        // SAFETY: AVX-512 F is present; the lengths are checked above.
        return unsafe { avx512(ins, out, p, stream) };
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx") {
        // SAFETY: AVX is present; the lengths are checked above.
        return unsafe { avx(ins, out, p, stream) };
    }
    scalar(ins, out, p, 0, n)
}

/// Elements `from..to` one at a time; returns their gradient check (0, or NaN).
fn scalar(ins: [&[f32]; 4], out: Outs<'_>, p: &AdamStep, from: usize, to: usize) -> f32 {
    let [w, g, m, v] = ins.map(|s| &s[from..to]);
    let outs = out.w[from..to].iter_mut().zip(&mut out.m[from..to]).zip(&mut out.v[from..to]);
    let mut check = 0.0;
    for (((wo, mo), vo), (((&w, &g), &m), &v)) in outs.zip(w.iter().zip(g).zip(m).zip(v)) {
        // Not 0 for every g: an infinity or a NaN gives NaN, which is the point.
        #[allow(clippy::eq_op)]
        {
            check += g - g;
        }
        let (w, m, v) = one(w, g, m, v, p);
        wo.write(w);
        mo.write(m);
        vo.write(v);
    }
    check
}

/// The new (weight, m, v) of one vector of elements, and `g - g` added to the `check` vector:
/// [`one`]'s operations in its order, without fused multiply-adds (the same bits). Shared by
/// every vector loop.
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

/// A vector loop over the elements, `$lanes` at a time with one instruction set's intrinsics;
/// streaming stores for the moments when asked for and the two share their alignment (the
/// vector's size). The scalar loop's operations in its order, without fused multiply-adds:
/// the same bits.
macro_rules! vector_loop {
    ($(#[$doc:meta])* $name:ident, $feature:literal, $lanes:literal, $load:ident, $store:ident, $stream:ident,
     $set1:ident, $add:ident, $sub:ident, $mul:ident, $div:ident, $sqrt:ident) => {
        $(#[$doc])*
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $feature)]
        unsafe fn $name(ins: [&[f32]; 4], out: Outs<'_>, p: &AdamStep, stream: bool) -> f32 {
            use std::arch::x86_64::*;
            const BYTES: usize = $lanes * 4;
            let n = ins[0].len();
            let mis = |s: &[MaybeUninit<f32>]| s.as_ptr() as usize % BYTES;
            let same = stream && mis(out.m) == mis(out.v);
            // Scalar up to the first vector boundary of the moments (streaming stores need it).
            let head = if same { ((BYTES - mis(out.m)) % BYTES / 4).min(n) } else { 0 };
            let body = head + (n - head) / $lanes * $lanes;
            let (b1, b2) = ($set1(1.0 - p.beta1), $set1(1.0 - p.beta2));
            let (lr, eps, decay) = ($set1(p.lr_t), $set1(p.eps), $set1(p.decay));
            let (wp, gp, mp, vp) = (ins[0].as_ptr(), ins[1].as_ptr(), ins[2].as_ptr(), ins[3].as_ptr());
            let (wo, mo, vo) =
                (out.w.as_mut_ptr().cast::<f32>(), out.m.as_mut_ptr().cast::<f32>(), out.v.as_mut_ptr().cast::<f32>());
            // The gradient check, a vector of them: g - g is 0 unless g is an infinity or NaN.
            let mut check = $set1(0.0);
            let mut i = head;
            while i < body {
                // SAFETY: i + lanes <= body <= n for every pointer; with `same`, mo/vo + i are
                // aligned to the vector (head brought them there and i advances by whole vectors).
                unsafe {
                    let (w, g) = ($load(wp.add(i)), $load(gp.add(i)));
                    let (m, v) = ($load(mp.add(i)), $load(vp.add(i)));
                    let (wi, mi, vi) = update!([w, g, m, v], check, [b1, b2, lr, eps, decay], $add, $sub, $mul, $div, $sqrt);
                    // The weights are read again by the next forward pass: an ordinary store keeps
                    // them in the cache. The moments wait for the next step: streamed past it.
                    $store(wo.add(i), wi);
                    if same {
                        $stream(mo.add(i), mi);
                        $stream(vo.add(i), vi);
                    } else {
                        $store(mo.add(i), mi);
                        $store(vo.add(i), vi);
                    }
                }
                i += $lanes;
            }
            if same {
                // Streaming stores are weakly ordered: fence them before the buffers are handed on.
                _mm_sfence();
            }
            let tail = |from, to, out: Outs<'_>| scalar(ins, out, p, from, to);
            let Outs { w, m, v } = out;
            let first = tail(0, head, Outs { w: &mut w[..], m: &mut m[..], v: &mut v[..] });
            let ends = first + tail(body, n, Outs { w, m, v });
            let mut lanes = [0f32; $lanes];
            // SAFETY: `lanes` holds one vector.
            unsafe { $store(lanes.as_mut_ptr(), check) };
            lanes.iter().sum::<f32>() + ends
        }
    };
}

vector_loop!(
    /// Eight at a time with AVX.
    ///
    /// # Safety
    /// The CPU has AVX, and every slice has the same length (checked by `chunk`).
    avx, "avx", 8, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_stream_ps, _mm256_set1_ps, _mm256_add_ps,
    _mm256_sub_ps, _mm256_mul_ps, _mm256_div_ps, _mm256_sqrt_ps
);

vector_loop!(
    /// Sixteen at a time where AVX-512 runs at full width: its square roots and divisions (the
    /// loop's slowest instructions) take half the instructions per value.
    ///
    /// # Safety
    /// The CPU has AVX-512 F, and every slice has the same length (checked by `chunk`).
    avx512, "avx512f", 16, _mm512_loadu_ps, _mm512_storeu_ps, _mm512_stream_ps, _mm512_set1_ps, _mm512_add_ps,
    _mm512_sub_ps, _mm512_mul_ps, _mm512_div_ps, _mm512_sqrt_ps
);

/// A block of a row-major variable for [`Block::update`]: `rows` rows of `cols` values, `rs`
/// apart in the weights, the moments and the outputs, `gs` apart in the gradient.
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

/// The loop [`Block::update`] runs on, chosen once for this CPU (see [`block_loop`]).
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
    /// Adam's update of every element of the block (the same bits as [`chunk`]), on `run` (from
    /// [`block_loop`]); returns the gradient's check (0, or NaN).
    ///
    /// # Safety
    /// Every row of every pointer holds `cols` values; the outputs overlap nothing else.
    pub(crate) unsafe fn update(&self, run: BlockLoop, p: &AdamStep) -> f32 {
        // SAFETY: the caller's contract; `run` is one this CPU has.
        unsafe { run(self, p) }
    }

    /// Element `i` of row `r`, one at a time; returns its check.
    ///
    /// # Safety
    /// As [`Block::update`], with `r < rows` and `i < cols`.
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

/// [`Block::update`] one element at a time.
///
/// # Safety
/// As [`Block::update`].
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

/// [`Block::update`] a vector at a time along each row, the row's first values (up to the
/// moments' vector boundary, when streamed) and last ones one at a time.
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
    /// The CPU has AVX; as [`Block::update`].
    avx_block, "avx", 8, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_stream_ps, _mm256_set1_ps, _mm256_add_ps, _mm256_sub_ps,
    _mm256_mul_ps, _mm256_div_ps, _mm256_sqrt_ps
);

block_loop!(
    /// Sixteen at a time where AVX-512 runs at full width.
    ///
    /// # Safety
    /// The CPU has AVX-512 F; as [`Block::update`].
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

    /// The scalar loop over a whole chunk (its gradient check is tested too).
    fn whole(ins: [&[f32]; 4], out: Outs<'_>, p: &AdamStep, _stream: bool) -> f32 {
        scalar(ins, out, p, 0, ins[0].len())
    }

    /// The loops this CPU runs, each to be checked against one element at a time: the scalar
    /// one and the vector ones.
    #[allow(clippy::type_complexity)]
    fn loops() -> Vec<(&'static str, unsafe fn([&[f32]; 4], Outs<'_>, &AdamStep, bool) -> f32)> {
        let mut v: Vec<(&'static str, unsafe fn([&[f32]; 4], Outs<'_>, &AdamStep, bool) -> f32)> =
            vec![("scalar", whole)];
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx") {
                v.push(("avx", avx));
            }
            if std::arch::is_x86_feature_detected!("avx512f") {
                v.push(("avx512", avx512));
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
                let check = unsafe { run([&ins[0], &ins[1], &ins[2], &ins[3]], outs, &p, stream) };
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
        }
    }
}
