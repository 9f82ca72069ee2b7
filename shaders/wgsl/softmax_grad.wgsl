// softmax_grad.wgsl: softmax's or log-softmax's backward over the last axis, in one dispatch,
// from the forward's output y and the output's gradient g:
//     softmax:      dx = y * (g - sum(g * y))
//     log-softmax:  dx = g - exp(y) * sum(g)
// `{{TERM}}` is a value's term of the row sum (of `y` and `g`), `{{OUT}}` its result (of `y`,
// `g` and the sum `s`). As tensor ops each was four dispatches (a product, a row sum, a
// difference, a product; an exponential in log-softmax's), three of them writing a temporary as
// large as an attention's scores.
//
// `main`: one workgroup per row, whose invocations stride over it and add their partial sums in
// workgroup memory (row_tree.wgsl), then write it; `main_short`: one invocation per row, for
// short rows (the host picks, as for softmax.wgsl). A NaN in a row's g, or in softmax's y, makes
// its sum NaN (0 * NaN is NaN); the whole row is then written as that NaN, tested on the bits
// (WGSL may assume there is none), as on the Cpu; log-softmax's `{{OUT}}` tests its own y. y and
// g are read through their strides (g may be a broadcast view); dx is contiguous.
//
// info: [n_rows, n, outer_rank, y offset, y last stride, outer_shape[8], y outer_strides[8],
//        g offset, g last stride, g outer_strides[8]]

@group(0) @binding(1) var<storage, read> y_buf: array<f32>;
@group(0) @binding(2) var<storage, read> g_buf: array<f32>;
@group(0) @binding(3) var<storage, read_write> dx_buf: array<f32>;

var<workgroup> part: array<f32, 256>;

fn term(y: f32, g: f32) -> f32 {
    return {{TERM}};
}

fn result(y: f32, g: f32, s: f32) -> f32 {
    return select({{OUT}}, s, is_nan_(s));
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = wid.x + wid.y * nwg.x;
    let t = lid.x;
    let n = info[1];
    let live = row < info[0];
    var yb = 0u;
    var gb = 0u;
    if (live) {
        yb = strided_offset(row, info[2], 5u, 13u, info[3]);
        gb = strided_offset(row, info[2], 5u, 23u, info[21]);
    }
    let ys = info[4];
    let gs = info[22];
    var s = 0.0;
    if (live) {
        for (var j = t; j < n; j = j + WG) {
            s = s + term(y_buf[yb + j * ys], g_buf[gb + j * gs]);
        }
    }
    part[t] = s;
    workgroupBarrier();
    s = tree(t, false);
    if (live) {
        for (var j = t; j < n; j = j + WG) {
            dx_buf[row * n + j] = result(y_buf[yb + j * ys], g_buf[gb + j * gs], s);
        }
    }
}

@compute @workgroup_size(256)
fn main_short(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let n = info[1];
    let ys = info[4];
    let gs = info[22];
    for (var row = linear_id(gid, nwg); row < info[0]; row = row + grid_size(nwg)) {
        let yb = strided_offset(row, info[2], 5u, 13u, info[3]);
        let gb = strided_offset(row, info[2], 5u, 23u, info[21]);
        var s = 0.0;
        for (var j = 0u; j < n; j = j + 1u) {
            s = s + term(y_buf[yb + j * ys], g_buf[gb + j * gs]);
        }
        for (var j = 0u; j < n; j = j + 1u) {
            dx_buf[row * n + j] = result(y_buf[yb + j * ys], g_buf[gb + j * gs], s);
        }
    }
}
