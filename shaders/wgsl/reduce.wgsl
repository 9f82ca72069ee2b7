// reduce.wgsl: sum, max, min or argmax over a set of axes.
//
// The host permutes the tensor's layout so that kept axes come first ("outer") and reduced axes
// last ("inner"); each output element then reduces one run of the inner index space.
//
// `main` (long runs) works on chunks of at most `chunk` elements: one workgroup per (output,
// chunk) pair. Its 256 invocations stride over the chunk, each keeping a partial result, then
// combine them in workgroup memory by halving (a tree). A run of one chunk is done; a longer run
// leaves one partial per chunk, contiguous as [n_out, n_chunks], and the host runs `main` (or
// `main_small`) again over the partials until one value per output is left. So no invocation
// loops more than chunk / 256 times, whatever the length: the rounding error grows with the log
// of the length rather than the length, a long run is spread over many workgroups, and every
// loop stays far below llvmpipe's budget (it silently stops all loops of an invocation after
// 65,535 iterations in total; a one-workgroup reduction of 8M elements used to hit it).
// `main_small` (short runs, runs down columns, and on a software adapter runs up to 1,024 with
// many outputs, where `main`'s barriers are context switches): one invocation per (output, chunk)
// pair walks its chunk alone, writing the same [n_out, n_chunks] partials; the host gives it
// short chunks of columns (where the outputs lie side by side in memory and the runs' values
// do not) and runs of one chunk otherwise.
//
// The host splices in the initial value and `combine` (of `acc`, `ai`, `v`, `vi`), which define
// the reduction. max, min and argmax propagate NaN (tested on the bits: WGSL may assume there is
// none); argmax keeps the first index on ties and the first NaN. argmax's partials carry their
// index: its variant declares `xi_buf` and `out_i`, and with `idx_in` set the input indices come
// from `xi_buf`; the other variants get `index_at` and `store_index` that do nothing.
//
// Each value stored passes through `finish(o, v)`: `v` itself, or for `reduce/sum/<op>` (the
// slices of a split product summed into a dense layer's output: matmul.rs)
// `op(v + bias[info[40] + o % info[41]])`, the op's parameters at info 42 and 43, the bias at
// binding 3. The host gives that variant the last pass only, where each output is one value.
//
// info: [n_out, n_red, outer_rank, inner_rank, offset, chunk, n_chunks, idx_in,
//        outer_shape[8], outer_strides[8], inner_shape[8], inner_strides[8]]

@group(0) @binding(1) var<storage, read> x_buf: array<f32>;
@group(0) @binding(2) var<storage, read_write> out_v: array<f32>;

var<workgroup> part_v: array<f32, 256>;
var<workgroup> part_i: array<u32, 256>;

const OUTER_SHAPE: u32 = 8u;
const OUTER_STRIDES: u32 = 16u;
const INNER_SHAPE: u32 = 24u;
const INNER_STRIDES: u32 = 32u;
// The index of "no element yet": loses every tie, so a spare invocation never wins.
const NO_INDEX: u32 = 0xffffffffu;

struct Pair {
    v: f32,
    i: u32,
}

{{INDEX}}

// Fold (v, vi) into the running (acc, ai).
fn combine(acc: f32, ai: u32, v: f32, vi: u32) -> Pair {
    {{COMBINE}}
}

fn base_of(o: u32) -> u32 {
    return strided_offset(o, info[2], OUTER_SHAPE, OUTER_STRIDES, info[4]);
}

fn offset_of(base: u32, r: u32) -> u32 {
    return strided_offset(r, info[3], INNER_SHAPE, INNER_STRIDES, base);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let g = wid.x + wid.y * nwg.x;
    let o = g / info[6];
    let c = g % info[6];
    let t = lid.x;
    // Uniform control flow: every invocation reaches the barriers, even in a spare workgroup.
    let live = o < info[0];
    var acc = {{INIT}};
    var ai = NO_INDEX;
    if (live) {
        let base = base_of(o);
        let start = c * info[5];
        // min() first, so start + chunk cannot wrap past 2^32.
        let end = start + min(info[5], info[1] - start);
        for (var r = start + t; r < end; r = r + WG) {
            let off = offset_of(base, r);
            let p = combine(acc, ai, x_buf[off], index_at(off, r));
            acc = p.v;
            ai = p.i;
        }
    }
    part_v[t] = acc;
    part_i[t] = ai;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s / 2u) {
        if (t < s) {
            let p = combine(part_v[t], part_i[t], part_v[t + s], part_i[t + s]);
            part_v[t] = p.v;
            part_i[t] = p.i;
        }
        workgroupBarrier();
    }
    if (t == 0u && live) {
        out_v[g] = finish(o, part_v[0]);
        store_index(g, part_i[0]);
    }
}

@compute @workgroup_size(256)
fn main_small(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    // Invocation j takes output j % n_out and chunk j / n_out: neighbours take neighbouring
    // outputs, so a sum down columns reads adjacent values side by side.
    for (var j = linear_id(gid, nwg); j < info[0] * info[6]; j = j + grid_size(nwg)) {
        let c = j / info[0];
        let o = j - c * info[0];
        let base = base_of(o);
        let start = c * info[5];
        let end = start + min(info[5], info[1] - start);
        var acc = {{INIT}};
        var ai = NO_INDEX;
        for (var r = start; r < end; r = r + 1u) {
            let off = offset_of(base, r);
            let p = combine(acc, ai, x_buf[off], index_at(off, r));
            acc = p.v;
            ai = p.i;
        }
        out_v[o * info[6] + c] = finish(o, acc);
        store_index(o * info[6] + c, ai);
    }
}
