// reduce.wgsl: sum, max, min or argmax over a set of axes.
//
// The host permutes the tensor's layout so that kept axes come first ("outer") and reduced axes
// last ("inner"); each output element then reduces one run of the inner index space.
//
// `main` (long runs): one workgroup per output element. Its 256 invocations stride over the run,
// each keeping a partial result, then combine them in workgroup memory by halving (a tree).
// `main_small` (short runs): one invocation per output element walks its run alone.
// `{{INIT}}` and `{{COMBINE}}` (of `acc` and `v`) define the reduction; argmax also carries the
// index of the best value, and keeps the first one on ties.
//
// info: [n_out, n_red, outer_rank, inner_rank, offset, outer_shape[8], outer_strides[8],
//        inner_shape[8], inner_strides[8]]

@group(0) @binding(1) var<storage, read> x_buf: array<f32>;
@group(0) @binding(2) var<storage, read_write> out_buf: array<{{OUT}}>;

var<workgroup> part_v: array<f32, 256>;
var<workgroup> part_i: array<u32, 256>;

const OUTER_SHAPE: u32 = 5u;
const OUTER_STRIDES: u32 = 13u;
const INNER_SHAPE: u32 = 21u;
const INNER_STRIDES: u32 = 29u;

struct Pair {
    v: f32,
    i: u32,
}

// Fold (v, vi) into the running (acc, ai).
fn combine(acc: f32, ai: u32, v: f32, vi: u32) -> Pair {
    {{COMBINE}}
}

fn base_of(o: u32) -> u32 {
    return strided_offset(o, info[2], OUTER_SHAPE, OUTER_STRIDES, info[4]);
}

fn elem(base: u32, r: u32) -> f32 {
    return x_buf[strided_offset(r, info[3], INNER_SHAPE, INNER_STRIDES, base)];
}

fn store(o: u32, v: f32, i: u32) {
    out_buf[o] = {{STORE}};
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let o = wid.x + wid.y * nwg.x;
    let t = lid.x;
    let n_red = info[1];
    // Uniform control flow: every invocation reaches the barriers, even in a spare workgroup.
    let live = o < info[0];
    var acc = {{INIT}};
    var ai = 0u;
    if (live) {
        let base = base_of(o);
        for (var r = t; r < n_red; r = r + WG) {
            let c = combine(acc, ai, elem(base, r), r);
            acc = c.v;
            ai = c.i;
        }
    }
    part_v[t] = acc;
    part_i[t] = ai;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s / 2u) {
        if (t < s) {
            let c = combine(part_v[t], part_i[t], part_v[t + s], part_i[t + s]);
            part_v[t] = c.v;
            part_i[t] = c.i;
        }
        workgroupBarrier();
    }
    if (t == 0u && live) {
        store(o, part_v[0], part_i[0]);
    }
}

@compute @workgroup_size(256)
fn main_small(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    for (var o = linear_id(gid, nwg); o < info[0]; o = o + grid_size(nwg)) {
        let base = base_of(o);
        var acc = {{INIT}};
        var ai = 0u;
        for (var r = 0u; r < info[1]; r = r + 1u) {
            let c = combine(acc, ai, elem(base, r), r);
            acc = c.v;
            ai = c.i;
        }
        store(o, acc, ai);
    }
}
