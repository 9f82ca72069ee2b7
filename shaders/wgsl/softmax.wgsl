// softmax.wgsl: softmax or log-softmax over the last axis, numerically stable.
//
// `main`: one workgroup per row (`main_short`, below: one invocation per row, for short rows).
// The 256 invocations stride over the row three times: to find the row
// maximum, to sum exp(x - max), and to write the result; between passes they combine their
// partial max and sum in workgroup memory (a tree of halvings). Subtracting the maximum keeps
// exp from overflowing. The row is read through its strides; the output is contiguous.
// `{{OUT}}` is the result expression of `v` (the input), `m` (row max) and `s` (sum of exps).
// The row max and sum come from row_max_sum.wgsl; the max propagates NaN, and a row holding a NaN
// comes out all NaN, as on the Cpu: never a finite, silently wrong distribution.
//
// info: [n_rows, n, outer_rank, offset, last_stride, outer_shape[8], outer_strides[8]]

@group(0) @binding(1) var<storage, read> x_buf: array<f32>;
@group(0) @binding(2) var<storage, read_write> y_buf: array<f32>;

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
        base = strided_offset(row, info[2], 5u, 13u, info[3]);
    }
    let stride = info[4];
    let ms = workgroup_max_sum(t, live, base, stride, n);
    let m = ms.x;
    let s = ms.y;
    if (live) {
        for (var j = t; j < n; j = j + WG) {
            let v = x_buf[base + j * stride];
            // m is the NaN itself when the row holds one.
            y_buf[row * n + j] = select({{OUT}}, m, is_nan_(m));
        }
    }
}

// `main_short`, the host's choice for short rows (see gpu/rows.rs): one invocation per row walks
// it three times alone, with no workgroup memory and no barriers (a workgroup of 256 for a row
// of 11 scores, an attention's over 11 tokens, leaves 245 idle through 16 barriers).
@compute @workgroup_size(256)
fn main_short(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let n = info[1];
    let stride = info[4];
    for (var row = linear_id(gid, nwg); row < info[0]; row = row + grid_size(nwg)) {
        let base = strided_offset(row, info[2], 5u, 13u, info[3]);
        let ms = short_max_sum(base, stride, n);
        let m = ms.x;
        let s = ms.y;
        for (var j = 0u; j < n; j = j + 1u) {
            let v = x_buf[base + j * stride];
            y_buf[row * n + j] = select({{OUT}}, m, is_nan_(m));
        }
    }
}
