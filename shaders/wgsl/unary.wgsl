// unary.wgsl: y = op(x) for every element; x is read through its strides, y is contiguous.
//
// One invocation computes one output element: it turns its index into x's storage offset
// (strided_offset) and applies the op, which the host splices in as the expression `{{OP}}` of
// `x` and the two scalar parameters `p0`, `p1`.
//
// info: [numel, rank, x_offset, p0 bits, p1 bits, shape[8], x_strides[8]]

@group(0) @binding(1) var<storage, read> x_buf: array<f32>;
@group(0) @binding(2) var<storage, read_write> y_buf: array<f32>;

fn op(x: f32, p0: f32, p1: f32) -> f32 {
    return {{OP}};
}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    for (var i = linear_id(gid, nwg); i < info[0]; i = i + grid_size(nwg)) {
        let rank = info[1];
        let off = strided_offset(i, rank, 5u, 5u + MAX_RANK, info[2]);
        y_buf[i] = op(x_buf[off], param(3u), param(4u));
    }
}

// The host's choice when x coalesces to one axis of stride 1 (a whole tensor, or a run of whole
// rows): no index arithmetic, and the parameters read once. On lavapipe, where each element's
// strided offset is scalar code, this runs a 4M-element relu 2.7 times as fast.
@compute @workgroup_size(256)
fn contiguous(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let n = info[0];
    let x0 = info[2];
    let p0 = param(3u);
    let p1 = param(4u);
    let step = grid_size(nwg);
    for (var i = linear_id(gid, nwg); i < n; i = i + step) {
        y_buf[i] = op(x_buf[x0 + i], p0, p1);
    }
}
