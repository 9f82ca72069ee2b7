// cross_entropy.wgsl: sparse cross-entropy's forward, each row's log-softmax at its label, in one
// dispatch. Composed, it was a log-softmax (a [rows, classes] array written and kept for the
// backward) and a gather; here a row's max and the log of its exponentials' sum are kept instead,
// two numbers a row (`stats`), which cross_entropy_grad.wgsl reads.
//
// `main`: one workgroup per row, whose invocations stride over it and combine their partial max
// and sum in workgroup memory (row_max_sum.wgsl, as softmax.wgsl's `main`: the same values);
// `main_short`: one invocation per row, for short rows (the host picks, as for softmax.wgsl). A
// label past the row is never read: the row's pick is 0 and the dispatch's fault slot records it
// (`report`, as index.wgsl's), an `Err` when the loss, or anything computed from it, is read. A
// row holding a NaN has a NaN max and picks that NaN.
//
// info: [rows, classes, x offset, x row stride, x class stride]; ids contiguous, one a row.

@group(0) @binding(1) var<storage, read> x_buf: array<f32>;
@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> picked: array<f32>;
@group(0) @binding(4) var<storage, read_write> stats: array<f32>;
@group(0) @binding(5) var<storage, read_write> fault: array<atomic<u32>>;

var<workgroup> part: array<f32, 256>;

fn report(id: u32, at: u32) {
    atomicStore(&fault[0], 1u);
    atomicMax(&fault[1], id);
    atomicMax(&fault[2], ~at);
}

// Row `row`'s pick and stats, from its max `m` and exponentials' sum `s`.
fn finish(row: u32, base: u32, m: f32, s: f32) {
    let id = ids[row];
    let lse = log(s);
    var v = 0.0;
    if (id < info[1]) {
        v = x_buf[base + id * info[4]] - m - lse;
    } else {
        report(id, row);
    }
    picked[row] = select(v, m, is_nan_(m));
    stats[2u * row] = m;
    stats[2u * row + 1u] = lse;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = wid.x + wid.y * nwg.x;
    let t = lid.x;
    let n = info[1];
    let live = row < info[0];
    let base = info[2] + row * info[3];
    let ms = workgroup_max_sum(t, live, base, info[4], n);
    if (live && t == 0u) {
        finish(row, base, ms.x, ms.y);
    }
}

@compute @workgroup_size(256)
fn main_short(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let n = info[1];
    for (var row = linear_id(gid, nwg); row < info[0]; row = row + grid_size(nwg)) {
        let base = info[2] + row * info[3];
        let ms = short_max_sum(base, info[4], n);
        finish(row, base, ms.x, ms.y);
    }
}
