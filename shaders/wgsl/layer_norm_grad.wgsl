// layer_norm_grad.wgsl: layer norm's backward over the last axis, in one dispatch. For the input
// x, gamma and the output's gradient g it writes
//     dx = (g * gamma - mean(g * gamma) - xhat * mean(g * gamma * xhat)) * rstd
//     q  = g * xhat                     (whose column sums, taken after, are gamma's gradient)
// with xhat = (x - mean) * rstd worked out again from x as the forward does (two passes: the
// mean, then the variance of the deviations). As tensor ops this was about twenty dispatches,
// each writing a temporary as large as the activations.
//
// `main`: one workgroup per row, whose invocations stride over the row and combine partial sums
// in workgroup memory (a tree of halvings); `main_short`: one invocation per row, for short rows
// (the host picks, as for layer_norm.wgsl). A NaN or an infinity in a row makes its mean or
// variance NaN; every value of its dx and q is then written as that NaN, tested on the bits (WGSL
// may assume there is no NaN), as on the Cpu.
// x and g are read through their strides (g may be a broadcast view); gamma is contiguous; dx
// and q are contiguous.
//
// info: [n_rows, n, outer_rank, x offset, x last stride, eps bits, outer_shape[8],
//        x outer_strides[8], g offset, g last stride, g outer_strides[8]]

@group(0) @binding(1) var<storage, read> x_buf: array<f32>;
@group(0) @binding(2) var<storage, read> gamma: array<f32>;
@group(0) @binding(3) var<storage, read> g_buf: array<f32>;
@group(0) @binding(4) var<storage, read_write> dx_buf: array<f32>;
@group(0) @binding(5) var<storage, read_write> q_buf: array<f32>;

var<workgroup> part: array<f32, 256>;
var<workgroup> part2: array<f32, 256>;

// The sums of every invocation's `part` and `part2` side by side (a row's two gradient sums),
// left for all; every invocation of the workgroup calls it.
fn tree_sums(t: u32) -> vec2<f32> {
    for (var s = WG / 2u; s > 0u; s = s / 2u) {
        if (t < s) {
            part[t] = part[t] + part[t + s];
            part2[t] = part2[t] + part2[t + s];
        }
        workgroupBarrier();
    }
    let r = vec2<f32>(part[0], part2[0]);
    workgroupBarrier();
    return r;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = wid.x + wid.y * nwg.x;
    let t = lid.x;
    let n = info[1];
    let live = row < info[0];
    var xb = 0u;
    var gb = 0u;
    if (live) {
        xb = strided_offset(row, info[2], 6u, 14u, info[3]);
        gb = strided_offset(row, info[2], 6u, 24u, info[22]);
    }
    let xs = info[4];
    let gs = info[23];
    let stats = workgroup_row_stats(t, live, xb, xs, n);
    let mean = stats.x;
    let vs = stats.y;
    let rstd = inverseSqrt(vs / f32(n) + param(5u));
    // Sums of g * gamma and of g * gamma * xhat, side by side.
    var a = 0.0;
    var b = 0.0;
    if (live) {
        for (var j = t; j < n; j = j + WG) {
            let dxhat = g_buf[gb + j * gs] * gamma[j];
            a = a + dxhat;
            b = b + dxhat * ((x_buf[xb + j * xs] - mean) * rstd);
        }
    }
    part[t] = a;
    part2[t] = b;
    workgroupBarrier();
    let ab = tree_sums(t) / f32(n);
    let bad = is_nan_(mean) || is_nan_(vs);
    let nan = select(vs, mean, is_nan_(mean));
    if (live) {
        for (var j = t; j < n; j = j + WG) {
            let gj = g_buf[gb + j * gs];
            let xhat = (x_buf[xb + j * xs] - mean) * rstd;
            dx_buf[row * n + j] = select((gj * gamma[j] - ab.x - xhat * ab.y) * rstd, nan, bad);
            q_buf[row * n + j] = select(gj * xhat, nan, bad);
        }
    }
}

// `main_short`: one invocation per row, the same passes (the first two in row_stats.wgsl), no
// workgroup memory and no barriers.
@compute @workgroup_size(256)
fn main_short(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let n = info[1];
    let xs = info[4];
    let gs = info[23];
    for (var row = linear_id(gid, nwg); row < info[0]; row = row + grid_size(nwg)) {
        let xb = strided_offset(row, info[2], 6u, 14u, info[3]);
        let gb = strided_offset(row, info[2], 6u, 24u, info[22]);
        let stats = short_row_stats(xb, xs, n);
        let mean = stats.x;
        let rstd = inverseSqrt(stats.y / f32(n) + param(5u));
        var a = 0.0;
        var b = 0.0;
        for (var j = 0u; j < n; j = j + 1u) {
            let dxhat = g_buf[gb + j * gs] * gamma[j];
            a = a + dxhat;
            b = b + dxhat * ((x_buf[xb + j * xs] - mean) * rstd);
        }
        let ma = a / f32(n);
        let mb = b / f32(n);
        let bad = is_nan_(mean) || is_nan_(stats.y);
        let nan = select(stats.y, mean, is_nan_(mean));
        for (var j = 0u; j < n; j = j + 1u) {
            let gj = g_buf[gb + j * gs];
            let xhat = (x_buf[xb + j * xs] - mean) * rstd;
            dx_buf[row * n + j] = select((gj * gamma[j] - ma - xhat * mb) * rstd, nan, bad);
            q_buf[row * n + j] = select(gj * xhat, nan, bad);
        }
    }
}
