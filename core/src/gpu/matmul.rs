//! Launcher for the batched, strided matmul kernels, and the autotuner that picks one per adapter.
//!
//! There is no single best matmul kernel: a real GPU wants workgroup-memory tiling (`tiled`),
//! while lavapipe, which runs invocations as SIMD lanes on the CPU, is several times faster with
//! large register blocks and no barriers (`directTMxTN`). The first matmul on an adapter times
//! every variant on one problem, checks each against the others, and ranks them; later calls use
//! the best-ranked variant whose tile the problem fills at least halfway and pads little, else one
//! that pads it little (`choose`). The row variants (`rowsTMxTN`, 64 x 1 workgroups) serve
//! products of fewer than 64 rows only; a tall, narrow product runs as its transpose where that
//! pads half as much (`transposed`).

use super::{GpuContext, GpuStorage};
use crate::layout::Dims;
use crate::ops::UnaryOp;
use crate::{DType, Error, Layout, Result};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// Batch axes the kernels locate by their strides.
const MAX_BATCH_RANK: usize = 4;

/// A matmul kernel and the tile of C one workgroup computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatmulVariant {
    /// Kernel name in weft-shaders.
    pub kernel: &'static str,
    /// Rows of C per workgroup.
    pub tile_m: usize,
    /// Columns of C per workgroup.
    pub tile_n: usize,
    /// Reads A and B as vec4: needs both row-major with every offset, stride, K and N a multiple of 4.
    pub vec4: bool,
}

/// Every matmul kernel (the first is the autotuner's reference).
pub const MATMUL_VARIANTS: &[MatmulVariant] = &[
    MatmulVariant { kernel: "matmul/tiled", tile_m: 64, tile_n: 64, vec4: false },
    MatmulVariant { kernel: "matmul/tiled_vec4", tile_m: 64, tile_n: 64, vec4: true },
    MatmulVariant { kernel: "matmul/direct4x4", tile_m: 64, tile_n: 64, vec4: false },
    MatmulVariant { kernel: "matmul/direct8x8", tile_m: 128, tile_n: 128, vec4: false },
    MatmulVariant { kernel: "matmul/direct16x16", tile_m: 256, tile_n: 256, vec4: false },
    // Products of a few rows (a sample's inference, a decoder's next token): the others' tiles
    // would repeat their first row 15 or more times.
    MatmulVariant { kernel: "matmul/rows1x4", tile_m: 1, tile_n: 256, vec4: false },
    MatmulVariant { kernel: "matmul/rows4x4", tile_m: 4, tile_n: 256, vec4: false },
];

/// Rankings by adapter, fastest first, so virtual devices on one adapter tune once (shared, so
/// that a product reads its adapter's ranking without copying it).
fn rankings() -> &'static Mutex<HashMap<usize, Arc<[MatmulVariant]>>> {
    static R: OnceLock<Mutex<HashMap<usize, Arc<[MatmulVariant]>>>> = OnceLock::new();
    R.get_or_init(Mutex::default)
}

/// The ranking of an adapter's matmul variants, fastest first (tuning it on first use).
pub fn matmul_ranking(ctx: &Arc<GpuContext>) -> Result<Arc<[MatmulVariant]>> {
    if let Some(r) = rankings().lock().unwrap_or_else(|p| p.into_inner()).get(&ctx.adapter_index) {
        return Ok(r.clone());
    }
    let ranked: Arc<[MatmulVariant]> = autotune(ctx)?.into();
    rankings().lock().unwrap_or_else(|p| p.into_inner()).insert(ctx.adapter_index, ranked.clone());
    Ok(ranked)
}

fn autotune(ctx: &Arc<GpuContext>) -> Result<Vec<MatmulVariant>> {
    if let Ok(name) = std::env::var("WEFT_MATMUL_KERNEL") {
        let v = MATMUL_VARIANTS.iter().find(|v| v.kernel == name);
        return v
            .map(|v| vec![*v])
            .ok_or_else(|| Error::invalid("matmul", format!("WEFT_MATMUL_KERNEL={name} names no kernel")));
    }
    let (m, k, n) = (256, 512, 512);
    let host: Vec<f32> = (0..m.max(n) * k).map(|i| ((i * 7919) % 13) as f32 * 0.1 - 0.6).collect();
    let a = GpuStorage::from_bytes(ctx, bytemuck::cast_slice(&host[..m * k]))?;
    let b = GpuStorage::from_bytes(ctx, bytemuck::cast_slice(&host[..k * n]))?;
    let (la, lb) = (Layout::contiguous(&[m, k]), Layout::contiguous(&[k, n]));
    let mut timed: Vec<(f64, MatmulVariant)> = Vec::new();
    let mut reference: Option<Vec<f32>> = None;
    for v in MATMUL_VARIANTS {
        // A variant that fails to compile or run, or disagrees with the first one, is left out.
        let Ok(out) = run(&a, &la, &b, &lb, *v, None) else {
            continue;
        };
        let Ok(bytes) = ctx.read(&out.buf, 0, (m * n * 4) as u64, &[]) else {
            continue;
        };
        let vals: Vec<f32> = bytemuck::pod_collect_to_vec(&bytes);
        match &reference {
            None => reference = Some(vals),
            Some(r) if r.iter().zip(&vals).all(|(x, y)| (x - y).abs() <= 1e-3 * x.abs().max(1.0)) => {}
            Some(_) => continue,
        }
        let start = std::time::Instant::now();
        for _ in 0..2 {
            run(&a, &la, &b, &lb, *v, None)?;
        }
        ctx.synchronize()?;
        timed.push((start.elapsed().as_secs_f64(), *v));
    }
    timed.sort_by(|x, y| x.0.total_cmp(&y.0));
    if timed.is_empty() {
        return Err(Error::Gpu(format!("no matmul kernel runs correctly on {}", ctx.describe())));
    }
    Ok(timed.into_iter().map(|t| t.1).collect())
}

/// Whether vec4 loads fit these layouts: both operands row-major along the loaded direction,
/// and every offset, stride, K and N a multiple of 4 (so no vec4 straddles a row or an edge).
fn vec4_ok(la: &Layout, lb: &Layout) -> bool {
    let r = la.rank();
    let (k, n) = (la.shape()[r - 1], lb.shape()[r - 1]);
    let aligned = |l: &Layout| {
        l.offset().is_multiple_of(4)
            && l.strides()[..r - 1].iter().zip(l.shape()).all(|(s, d)| s.is_multiple_of(4) || *d == 1)
    };
    la.strides()[r - 1] == 1
        && lb.strides()[r - 1] == 1
        && k.is_multiple_of(4)
        && n.is_multiple_of(4)
        && aligned(la)
        && aligned(lb)
}

/// Products of this many rows or more never take a row variant (a tile under [`FEW_ROWS`] rows
/// high: `rows1x4`, `rows4x4`). Those reuse no value through workgroup memory; on a large GPU
/// they may still win the autotuner's one timing by filling more of it, but a large product
/// belongs to a tile that reuses its loads.
const FEW_ROWS: usize = 64;

/// The variant for these layouts: of the applicable ones whose tile the `m x n` output fills at
/// least halfway in both directions, the best-ranked one whose tiles pad the output at most a
/// quarter more than the snuggest of them (the ranking is one problem's timing: lavapipe ranks
/// `direct16x16`'s 256 x 256 tile first, yet a 2,048 x 128 output, half of each of those tiles
/// idle, ran 1.2 times faster on `direct8x8`'s 128 x 128, and a 128 x 128 weight gradient 2.3
/// times); where none fills its tile halfway, the best-ranked applicable one whose tiles cover
/// the output with at most half again the least padding any does. (Padding alone
/// would favour the thinnest tile: an attention's 11 x 11 scores went to `rows1x4`, whose
/// invocations reuse a loaded value 4 times, at 24.8 ms for 512 of them on lavapipe, against
/// 13.8 for `direct4x4`'s 64 x 64 tiles.)
fn choose(ranked: &[MatmulVariant], la: &Layout, lb: &Layout) -> MatmulVariant {
    let r = la.rank();
    let (m, n) = (la.shape()[r - 2], lb.shape()[r - 1]);
    // (A variant forced on the device is the ranking's only one, and runs wherever it can.)
    let forced = ranked.len() == 1;
    let usable = |v: &&MatmulVariant| (!v.vec4 || vec4_ok(la, lb)) && (v.tile_m >= FEW_ROWS || m < FEW_ROWS || forced);
    // (A tall output only 10 wide, a classifier's logits, is no row variant's: its 256-wide
    // tile would pad the output's columns 25 times.)
    let padded = |v: &&MatmulVariant| m.next_multiple_of(v.tile_m) * n.next_multiple_of(v.tile_n);
    let fills = |v: &&MatmulVariant| 2 * m >= v.tile_m && 2 * n >= v.tile_n;
    let snug = ranked.iter().filter(usable).filter(fills).map(|v| padded(&v)).min();
    ranked
        .iter()
        .filter(usable)
        .filter(fills)
        .find(|v| snug.is_some_and(|least| 4 * padded(v) <= 5 * least))
        .or_else(|| {
            let least = ranked.iter().filter(usable).map(|v| padded(&v)).min()?;
            ranked.iter().filter(usable).find(|v| 2 * padded(v) <= 3 * least)
        })
        .copied()
        .unwrap_or(MATMUL_VARIANTS[0])
}

/// The longest run of K one dispatch sums over. Every kernel loops over K inside an invocation,
/// and llvmpipe silently stops all loops of an invocation after 65,535 iterations in total (the
/// tiled kernels spend about 18 per 16 values of K, so K = 58,253 already came out wrong; a
/// weight gradient over a batch of 64 sequences of 1,024 tokens has K = 65,536). Longer K is
/// split into runs of this length whose products are added.
const K_RUN: usize = 16_384;

/// `a @ b` for `[batch.., m, k]` and `[batch.., k, n]` layouts with one batch shape.
pub fn matmul(a: &GpuStorage, la: &Layout, b: &GpuStorage, lb: &Layout) -> Result<GpuStorage> {
    let ranked = ranking(a)?;
    let max_groups = a.ctx.limits.max_compute_workgroups_per_dimension as usize;
    if let Some(swapped) = transposed(&ranked, la, lb, max_groups)? {
        // Its transpose copied out (a single column's is already in order).
        let (t, lt) = run_transposed(a, b, swapped, &ranked)?;
        if lb.shape()[lb.rank() - 1] == 1 {
            return Ok(t);
        }
        let out = GpuStorage::alloc(&a.ctx, lt.numel(), DType::F32)?;
        super::copy_into(&t, &lt, &out, &Layout::contiguous(lt.shape()))?;
        return Ok(out.inherit(&[&t]));
    }
    runs(a, la, b, lb, &ranked)
}

/// `b^T a^T` for the operands' layouts `transposed` gives, and the view of it as `a @ b`
/// (`[batch.., m, n]`, its last two axes swapped).
fn run_transposed(
    a: &GpuStorage,
    b: &GpuStorage,
    (ta, tb): (Layout, Layout),
    ranked: &[MatmulVariant],
) -> Result<(GpuStorage, Layout)> {
    let t = runs(b, &ta, a, &tb, ranked)?;
    let r = ta.rank();
    let lt = Layout::contiguous(&out_shape(&ta, &tb)).transpose(r - 2, r - 1)?;
    Ok((t, lt))
}

/// The least work a transposed product saves, in multiply-adds: about what its copy's dispatch
/// costs (a quarter of a millisecond on lavapipe, microseconds on a GPU).
const MIN_SAVED: usize = 1 << 20;

/// The operands' layouts of `b^T a^T` where that product pads its tiles at most half as much as
/// `a @ b` would (then a copy transposes it): a tall, narrow output, a classifier's 10 logits for
/// 256 rows, pads each 64-wide tile's columns six times, where its transpose of 10 rows fills a
/// row variant's tiles. Not where that saves fewer than [`MIN_SAVED`] multiply-adds (the copy
/// would cost more), nor where the transpose's column tiles would pass `max_groups`, the
/// workgroups a dispatch may have along x (`run` cuts rows, not columns).
fn transposed(
    ranked: &[MatmulVariant],
    la: &Layout,
    lb: &Layout,
    max_groups: usize,
) -> Result<Option<(Layout, Layout)>> {
    let r = la.rank();
    let (m, k, n) = (la.shape()[r - 2], la.shape()[r - 1], lb.shape()[r - 1]);
    if m * k * n == 0 {
        return Ok(None);
    }
    let (ta, tb) = (lb.transpose(r - 2, r - 1)?, la.transpose(r - 2, r - 1)?);
    let (v, tv) = (choose(ranked, la, lb), choose(ranked, &ta, &tb));
    let padded = |v: MatmulVariant, m: usize, n: usize| m.next_multiple_of(v.tile_m) * n.next_multiple_of(v.tile_n);
    let (as_is, swapped) = (padded(v, m, n), padded(tv, n, m));
    let nb: usize = la.shape()[..r - 2].iter().product();
    let saved = as_is.saturating_sub(swapped).saturating_mul(k).saturating_mul(nb);
    let pays = 2 * swapped <= as_is && saved >= MIN_SAVED && m.div_ceil(tv.tile_n) <= max_groups;
    Ok(pays.then_some((ta, tb)))
}

/// `a @ b` by runs of K of at most [`K_RUN`], added.
fn runs(a: &GpuStorage, la: &Layout, b: &GpuStorage, lb: &Layout, ranked: &[MatmulVariant]) -> Result<GpuStorage> {
    let r = la.rank();
    let k = la.shape()[r - 1];
    let mut sum: Option<GpuStorage> = None;
    for start in (0..k.max(1)).step_by(K_RUN) {
        let len = K_RUN.min(k - start.min(k));
        let (pa, pb) = if len == k {
            (la.clone(), lb.clone())
        } else {
            (la.narrow(r - 1, start, len)?, lb.narrow(r - 2, start, len)?)
        };
        let part = run_split(a, &pa, b, &pb, choose(ranked, &pa, &pb), None)?;
        sum = Some(match sum {
            None => part,
            Some(acc) => {
                let l = Layout::contiguous(&out_shape(la, lb));
                super::binary(crate::ops::BinaryOp::Add, &acc, &l, &part, &l)?
            }
        });
    }
    sum.ok_or_else(|| Error::Gpu("matmul produced no output".into()))
}

/// The variants `a`'s device ranks: a forced one alone, so that `choose` runs it wherever it can
/// (a vec4 kernel still falls back to the plain tiled one on layouts it cannot read: `choose`'s
/// default).
fn ranking(a: &GpuStorage) -> Result<Arc<[MatmulVariant]>> {
    match a.ctx.forced_matmul() {
        Some(v) => Ok(Arc::new([v])),
        None => matmul_ranking(&a.ctx),
    }
}

/// `[batch.., m, n]` of two operand layouts.
fn out_shape(la: &Layout, lb: &Layout) -> Vec<usize> {
    let r = la.rank();
    la.shape()[..r - 1].iter().copied().chain([lb.shape()[r - 1]]).collect()
}

/// Each slice of K a split product gives a workgroup is at least this long: its loop over K
/// stays long beside the tile it writes, which the slices' sum then reads once more.
const MIN_SLICE: usize = 128;

/// Run `v`, its K cut into slices when the output's tiles alone would leave the adapter idle.
///
/// A weight's gradient is a small output over a long K (128 x 128 summed over a batch of 2,048
/// tokens is one tile of `direct8x8` and four of `tiled`): one workgroup, so one of lavapipe's
/// threads or one of a GPU's hundred cores, loops over all of K. Split, the slices are an extra
/// batch axis of the same kernel (A's `[m, k]` viewed as `[s, m, len]`, B's `[k, n]` as
/// `[s, len, n]`), and one reduction sums the `s` partial products. The slice count is one that
/// divides K where one of at least half the most useful count does; otherwise the values the
/// slices leave are one more product, added. (So the order of a product's sums, and its last
/// bits, follow the adapter's width.)
///
/// With an epilogue (a dense layer's bias and op), the slices' sum applies it as it stores each
/// value (`rows::sum_add_unary`): only where the slices cover K ([`slicing`]; the caller checks).
fn run_split(
    a: &GpuStorage,
    la: &Layout,
    b: &GpuStorage,
    lb: &Layout,
    v: MatmulVariant,
    epilogue: Option<Epilogue>,
) -> Result<GpuStorage> {
    let r = la.rank();
    let k = la.shape()[r - 1];
    let Some((slices, len)) = slicing(a, la, lb, v) else {
        return run(a, la, b, lb, v, epilogue);
    };
    if epilogue.is_some() && slices * len != k {
        // (matmul_add_unary never sends one: the epilogue would miss the remainder's product.)
        return Err(Error::Gpu(format!("matmul: an epilogue on {slices} slices of {len} that leave part of K = {k}")));
    }
    let sliced = |l: &Layout, k_axis: usize| -> Layout {
        let mut shape: Dims = l.shape().into();
        let mut strides: Dims = l.strides().into();
        let step = strides[k_axis] * len;
        shape[k_axis] = len;
        shape.insert(r - 2, slices);
        strides.insert(r - 2, step);
        Layout::new(shape, strides, l.offset())
    };
    let (sa, sb) = (sliced(la, r - 1), sliced(lb, r - 2));
    let partials = run(a, &sa, b, &sb, fitting(v, &sa, &sb), None)?;
    let mut shape = out_shape(la, lb);
    shape.insert(r - 2, slices);
    let (lp, n) = (Layout::contiguous(&shape), lb.shape()[r - 1]);
    let sum = match epilogue {
        Some((bias, op)) => super::rows::sum_add_unary(&partials, &lp, &[r - 2], bias, n, op)?,
        None => super::reduce(crate::ops::ReduceOp::Sum, &partials, &lp, &[r - 2])?,
    };
    let done = slices * len;
    if done == k {
        return Ok(sum);
    }
    let (ra, rb) = (la.narrow(r - 1, done, k - done)?, lb.narrow(r - 2, done, k - done)?);
    let rest = run(a, &ra, b, &rb, fitting(v, &ra, &rb), None)?;
    let l = Layout::contiguous(&out_shape(la, lb));
    super::binary(crate::ops::BinaryOp::Add, &sum, &l, &rest, &l)
}

/// A dense layer's bias (a buffer and the offset of its first value) and op, applied to each
/// value a product stores.
type Epilogue<'a> = ((&'a GpuStorage, usize), UnaryOp);

/// The slices `run_split` cuts K into for `v` and their length (`None`: it runs whole). The
/// count divides K where one of at least half the most useful count does; a vec4 kernel reads K
/// four at a time from aligned offsets, so its slices are a multiple of 4 long.
fn slicing(a: &GpuStorage, la: &Layout, lb: &Layout, v: MatmulVariant) -> Option<(usize, usize)> {
    let k = la.shape()[la.rank() - 1];
    let most = split_count(a, la, lb, v);
    if most < 2 {
        return None;
    }
    let whole = |s: usize| k.is_multiple_of(s) && (!v.vec4 || (k / s).is_multiple_of(4));
    let slices = (most.div_ceil(2).max(2)..=most).rev().find(|&s| whole(s)).unwrap_or(most);
    let len = if v.vec4 { k / slices / 4 * 4 } else { k / slices };
    Some((slices, len))
}

/// The most slices `run_split` would cut K into for `v` (1: none): as many as fill the adapter's
/// width with the output's tiles, each at least [`MIN_SLICE`] long.
fn split_count(a: &GpuStorage, la: &Layout, lb: &Layout, v: MatmulVariant) -> usize {
    let r = la.rank();
    let (m, k, n) = (la.shape()[r - 2], la.shape()[r - 1], lb.shape()[r - 1]);
    let nb: usize = la.shape()[..r - 2].iter().product();
    let tiles = nb * m.div_ceil(v.tile_m) * n.div_ceil(v.tile_n);
    if tiles == 0 || r - 2 >= MAX_BATCH_RANK {
        return 1;
    }
    a.ctx.parallel_width().div_ceil(tiles).min(k / MIN_SLICE).max(1)
}

/// `v`, or the plain tiled kernel where `v` reads vec4 and these layouts do not allow it.
fn fitting(v: MatmulVariant, la: &Layout, lb: &Layout) -> MatmulVariant {
    if v.vec4 && !vec4_ok(la, lb) { MATMUL_VARIANTS[0] } else { v }
}

/// `op(a @ b + bias)` for `[m, k]` and `[k, n]` layouts and a bias of `n` adjacent values from
/// `bias_offset`, the bias and op applied as each value is stored: by the product's kernel (a
/// dense layer's forward in one dispatch), or where K is cut into slices (most products of a
/// batch on a GPU of a hundred cores), by the sum of the slices; the values `add_unary` gives the
/// product. A product that runs transposed (`transposed`) applies them as its transpose is
/// copied out. `None` where nothing stores the whole output (K cut into runs, slices that leave a
/// remainder of K, rows past a dispatch's limit): the caller then runs the two ops.
pub fn matmul_add_unary(
    a: &GpuStorage,
    la: &Layout,
    b: &GpuStorage,
    lb: &Layout,
    bias: (&GpuStorage, usize),
    op: UnaryOp,
) -> Result<Option<GpuStorage>> {
    if la.rank() != 2 || lb.rank() != 2 {
        return Ok(None);
    }
    let (m, k) = (la.shape()[0], la.shape()[1]);
    if m * k * lb.shape()[1] == 0 || k > K_RUN {
        return Ok(None);
    }
    let ranked = ranking(a)?;
    let max_groups = a.ctx.limits.max_compute_workgroups_per_dimension as usize;
    if let Some(swapped) = transposed(&ranked, la, lb, max_groups)? {
        // The bias and op applied as its transpose is copied out: the product and the pass
        // `matmul` then `add_unary` would make, less the copy between them (a classifier's few
        // logits for many rows), the same values.
        let (t, lt) = run_transposed(a, b, swapped, &ranked)?;
        let n = lb.shape()[1];
        let (bias, offset) = bias;
        let lbias = Layout::new([n].into_iter().collect(), [1].into_iter().collect(), offset).broadcast_to(&[m, n])?;
        return super::add_unary(op, &t, &lt, bias, &lbias).map(|out| Some(out.inherit(&[&t])));
    }
    let v = choose(&ranked, la, lb);
    let remainder = slicing(a, la, lb, v).is_some_and(|(slices, len)| slices * len != k);
    if remainder || m > max_groups * v.tile_m {
        return Ok(None);
    }
    run_split(a, la, b, lb, v, Some((bias, op))).map(Some)
}

/// Run one variant, with an epilogue (a bias and an op) where given.
fn run(
    a: &GpuStorage,
    la: &Layout,
    b: &GpuStorage,
    lb: &Layout,
    v: MatmulVariant,
    epilogue: Option<Epilogue>,
) -> Result<GpuStorage> {
    let r = la.rank();
    let (m, k, n) = (la.shape()[r - 2], la.shape()[r - 1], lb.shape()[r - 1]);
    let batch_shape = &la.shape()[..r - 2];
    if batch_shape.len() > MAX_BATCH_RANK {
        return Err(Error::invalid(
            "matmul",
            format!("at most {MAX_BATCH_RANK} batch axes on the GPU, got shape {:?}", la.shape()),
        ));
    }
    let nb: usize = batch_shape.iter().product();
    if m * n * nb == 0 {
        return GpuStorage::alloc(&a.ctx, 0, DType::F32);
    }
    if k == 0 {
        return super::fill(&a.ctx, nb * m * n, 0);
    }
    // The adapter's limit of workgroups per dispatch dimension (y for row tiles, z for batches).
    let max_groups = a.ctx.limits.max_compute_workgroups_per_dimension as usize;
    let rows_per = max_groups * v.tile_m;
    if m > rows_per {
        // (matmul_add_unary never sends a product here: the blocks would drop its epilogue.)
        debug_assert!(epilogue.is_none(), "an epilogue on a product of row blocks");
        // More row tiles than one dispatch may have along y (a stack of rows folded into one
        // product can reach it): products of row blocks, each copied into its rows of the output.
        let mut out = GpuStorage::alloc(&a.ctx, nb * m * n, DType::F32)?;
        let lo = Layout::contiguous(&out_shape(la, lb));
        for start in (0..m).step_by(rows_per) {
            let len = rows_per.min(m - start);
            let part = run(a, &la.narrow(r - 2, start, len)?, b, lb, v, None)?;
            let block = lo.narrow(r - 2, start, len)?;
            super::copy_into(&part, &Layout::contiguous(block.shape()), &out, &block)?;
            out = out.inherit(&[&part]);
        }
        return Ok(out);
    }
    let out = GpuStorage::alloc(&a.ctx, nb * m * n, DType::F32)?;
    let push4 = |info: &mut Vec<u32>, v: &[usize], pad: u32| {
        info.extend(v.iter().map(|&x| x as u32));
        info.extend(std::iter::repeat_n(pad, MAX_BATCH_RANK - v.len()));
    };
    let groups = [n.div_ceil(v.tile_n) as u32, m.div_ceil(v.tile_m) as u32];
    // Batches beyond the z limit go in further dispatches, each starting at `batch_start`.
    let mut start = 0;
    while start < nb {
        let count = (nb - start).min(max_groups);
        let mut info = vec![
            m as u32,
            n as u32,
            k as u32,
            la.offset() as u32,
            lb.offset() as u32,
            la.strides()[r - 2] as u32,
            la.strides()[r - 1] as u32,
            lb.strides()[r - 2] as u32,
            lb.strides()[r - 1] as u32,
            start as u32,
        ];
        push4(&mut info, batch_shape, 1);
        push4(&mut info, &la.strides()[..r - 2], 0);
        push4(&mut info, &lb.strides()[..r - 2], 0);
        info.push(batch_shape.len() as u32);
        let grid = [groups[0], groups[1], count as u32];
        match epilogue {
            Some(((bias, offset), op)) => {
                info.extend(op.params().map(f32::to_bits));
                info.push(offset as u32);
                let kernel = format!("{}/{}", v.kernel, op.name());
                a.ctx.dispatch(&kernel, "main", &info, &[&a.buf, &b.buf, &out.buf, &bias.buf], grid)?;
            }
            None => a.ctx.dispatch(v.kernel, "main", &info, &[&a.buf, &b.buf, &out.buf], grid)?,
        }
        start += count;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whatever order an adapter ranks them in, a product of 1 to 31 rows goes to a row variant
    /// (32 to 63 rows: to either kind, as ranked), and neither a product of 64 rows or more nor a
    /// tall narrow one (10 or 1 columns) does.
    #[test]
    fn a_product_of_few_rows_takes_a_row_variant() {
        let mut ranked = MATMUL_VARIANTS.to_vec();
        for turn in 0..ranked.len() {
            ranked.rotate_left(1);
            for (m, n, want_rows) in [
                (1, 1536, Some(true)),
                (3, 1536, Some(true)),
                (8, 1536, Some(true)),
                (31, 1536, Some(true)),
                (32, 1536, None),
                (63, 1536, None),
                (64, 1536, Some(false)),
                (512, 1536, Some(false)),
                (1, 10, Some(true)),
                (1024, 10, Some(false)),
                (1024, 1, Some(false)),
            ] {
                let (la, lb) = (Layout::contiguous(&[m, 384]), Layout::contiguous(&[384, n]));
                let v = choose(&ranked, &la, &lb);
                assert!(2 * m >= v.tile_m || m < 32, "turn {turn}: {m} x {n} got {}", v.kernel);
                if let Some(want) = want_rows {
                    assert_eq!(v.kernel.starts_with("matmul/rows"), want, "turn {turn}: {m} x {n} got {}", v.kernel);
                }
            }
        }
    }

    /// An output no tile fills halfway (an attention's 11 x 11 scores) goes to the best-ranked
    /// variant that pads it little, not to the one that pads it least: on lavapipe's ranking,
    /// `direct4x4`, not `rows1x4`.
    #[test]
    fn a_small_square_output_takes_the_best_ranked_tile_that_pads_it_little() {
        let ranked = lavapipe_ranking();
        let (la, lb) = (Layout::contiguous(&[512, 11, 16]), Layout::contiguous(&[512, 16, 11]));
        assert_eq!(choose(&ranked, &la, &lb).kernel, "matmul/direct4x4");
    }

    /// Lavapipe's ranking, fastest first.
    fn lavapipe_ranking() -> Vec<MatmulVariant> {
        let order = ["direct16x16", "direct8x8", "direct4x4", "rows4x4", "rows1x4", "tiled", "tiled_vec4"];
        order.iter().map(|k| *MATMUL_VARIANTS.iter().find(|v| v.kernel == format!("matmul/{k}")).unwrap()).collect()
    }

    /// A tile the output fills halfway but pads by more than a quarter over a smaller tile's
    /// padding gives way to the smaller tile (fails with the halfway rule alone, which gave
    /// `direct16x16` every one of these); an output that fills the best-ranked tile keeps it.
    #[test]
    fn an_output_takes_a_tile_that_pads_it_little() {
        let ranked = lavapipe_ranking();
        for (m, k, n, want) in [
            (2048, 128, 128, "direct8x8"),
            (128, 2048, 128, "direct8x8"),
            (64, 128, 512, "direct4x4"),
            (2048, 256, 384, "direct8x8"),
            (256, 784, 1024, "direct16x16"),
            (2048, 128, 512, "direct16x16"),
        ] {
            let (la, lb) = (Layout::contiguous(&[m, k]), Layout::contiguous(&[k, n]));
            assert_eq!(choose(&ranked, &la, &lb).kernel, format!("matmul/{want}"), "{m} x {k} x {n}");
        }
    }

    /// A tall output a few columns wide runs as its transpose where that pads half as much (a
    /// classifier's logits, a weight's gradient for them); square-ish and short outputs do not,
    /// nor one that saves too little work for its copy (40 x 3 over 64), nor one whose transpose
    /// has more column tiles than a dispatch may have (20 million rows of one column: 78,125
    /// tiles of 256).
    #[test]
    fn a_tall_narrow_product_runs_transposed() {
        let ranked = lavapipe_ranking();
        for (m, k, n, batch, want) in [
            (256, 1024, 10, 0, true),
            (1024, 256, 10, 0, true),
            (300, 64, 3, 4, true),
            (256, 1024, 1024, 0, false),
            (10, 1024, 256, 0, false),
            (11, 16, 11, 512, false),
            (1, 64, 10, 0, false),
            (0, 64, 10, 0, false),
            (40, 64, 3, 0, false),
            (256, 64, 10, 0, false),
            (20_000_000, 1, 1, 0, false),
            (1_000_000, 1, 1, 0, true),
        ] {
            let lead: Vec<usize> = if batch == 0 { vec![] } else { vec![batch] };
            let dims = |r: usize, c: usize| lead.iter().copied().chain([r, c]).collect::<Vec<_>>();
            let (la, lb) = (Layout::contiguous(&dims(m, k)), Layout::contiguous(&dims(k, n)));
            let got = transposed(&ranked, &la, &lb, 65_535).unwrap();
            assert_eq!(got.is_some(), want, "{m} x {k} x {n}, batch {batch}");
            if let Some((ta, tb)) = got {
                assert_eq!(out_shape(&ta, &tb), dims(n, m));
            }
        }
    }

    /// A variant forced on a device (the ranking's only one) is chosen for every product it can
    /// run, a row variant for 64 rows or more and a large tile for a small output included (a
    /// tall, narrow product may still run transposed: `transposed`).
    #[test]
    fn a_forced_variant_runs_wherever_it_can() {
        for v in MATMUL_VARIANTS {
            for (m, n) in [(1, 10), (11, 11), (512, 1536), (1024, 10)] {
                let (la, lb) = (Layout::contiguous(&[m, 384]), Layout::contiguous(&[384, n]));
                let want = if v.vec4 && !vec4_ok(&la, &lb) { MATMUL_VARIANTS[0].kernel } else { v.kernel };
                assert_eq!(choose(&[*v], &la, &lb).kernel, want, "{m} x {n}");
            }
        }
    }
}
