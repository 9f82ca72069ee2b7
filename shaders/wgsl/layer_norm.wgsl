// layer_norm.wgsl: y = (x - mean) / sqrt(var + eps) * gamma + beta over the last axis.
//
// `main`: one workgroup per row (`main_short`, below: one invocation per row, for short rows).
// The invocations stride over the row to sum x, combine the sums in
// workgroup memory (a tree of halvings) to get the mean, then do the same for the squared
// deviations to get the variance (two passes: more stable than E[x^2] - E[x]^2; both in
// row_stats.wgsl), and finally write the normalised row. x is read through its strides; gamma and beta are contiguous.
// A row holding a NaN (or an infinity, whose deviation is NaN) has a NaN sum; the whole row is
// then written as that NaN, tested on the bits (WGSL may assume there is no NaN).
//
// info: [n_rows, n, outer_rank, offset, last_stride, eps bits, outer_shape[8], outer_strides[8]]

@group(0) @binding(1) var<storage, read> x_buf: array<f32>;
@group(0) @binding(2) var<storage, read> gamma: array<f32>;
@group(0) @binding(3) var<storage, read> beta: array<f32>;
@group(0) @binding(4) var<storage, read_write> y_buf: array<f32>;

var<workgroup> part: array<f32, 256>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = wid.x + wid.y * nwg.x;
    let t = lid.x;
    let n = info[1];
    let live = row < info[0];
    var base = 0u;
    if (live) {
        base = strided_offset(row, info[2], 6u, 14u, info[3]);
    }
    let stride = info[4];
    let stats = workgroup_row_stats(t, live, base, stride, n);
    let mean = stats.x;
    let qs = stats.y;
    let rstd = inverseSqrt(qs / f32(n) + param(5u));
    let bad = is_nan_(mean) || is_nan_(qs);
    let nan = select(qs, mean, is_nan_(mean));
    if (live) {
        for (var j = t; j < n; j = j + WG) {
            let y = (x_buf[base + j * stride] - mean) * rstd * gamma[j] + beta[j];
            y_buf[row * n + j] = select(y, nan, bad);
        }
    }
}

// `main_short`, the host's choice for short rows (see gpu/rows.rs): one invocation per row, the
// same three passes (the first two in row_stats.wgsl), no workgroup memory and no barriers.
@compute @workgroup_size(256)
fn main_short(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let n = info[1];
    let stride = info[4];
    for (var row = linear_id(gid, nwg); row < info[0]; row = row + grid_size(nwg)) {
        let base = strided_offset(row, info[2], 6u, 14u, info[3]);
        let stats = short_row_stats(base, stride, n);
        let mean = stats.x;
        let q = stats.y;
        let rstd = inverseSqrt(q / f32(n) + param(5u));
        let bad = is_nan_(mean) || is_nan_(q);
        let nan = select(q, mean, is_nan_(mean));
        for (var j = 0u; j < n; j = j + 1u) {
            let y = (x_buf[base + j * stride] - mean) * rstd * gamma[j] + beta[j];
            y_buf[row * n + j] = select(y, nan, bad);
        }
    }
}
