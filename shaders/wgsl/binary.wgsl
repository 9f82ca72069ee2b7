// binary.wgsl: z = op(a, b) for two operands already broadcast to one shape (broadcast axes have
// stride 0, so a bias row is read again for every output row without being copied).
//
// Each invocation loops over the elements `linear_id + k * grid_size` and computes each from its
// two strided offsets; the host splices in the expression `{{OP}}` of `a` and `b`.
//
// info: [numel, rank, a_offset, b_offset, shape[8], a_strides[8], b_strides[8]], and for add_unary
// and unary_grad the unary op's two parameters after them (28, 29).

@group(0) @binding(1) var<storage, read> a_buf: array<f32>;
@group(0) @binding(2) var<storage, read> b_buf: array<f32>;
@group(0) @binding(3) var<storage, read_write> z_buf: array<f32>;

fn op(a: f32, b: f32) -> f32 {
    return {{OP}};
}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    for (var i = linear_id(gid, nwg); i < info[0]; i = i + grid_size(nwg)) {
        let o = strided_offset2(i, info[1], 4u, 4u + MAX_RANK, 4u + 2u * MAX_RANK, info[2], info[3]);
        z_buf[i] = op(a_buf[o.x], b_buf[o.y]);
    }
}

// The host's choice when both operands coalesce to one axis of stride 1: no index arithmetic.
@compute @workgroup_size(256)
fn contiguous(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let n = info[0];
    let a0 = info[2];
    let b0 = info[3];
    let step = grid_size(nwg);
    for (var i = linear_id(gid, nwg); i < n; i = i + step) {
        z_buf[i] = op(a_buf[a0 + i], b_buf[b0 + i]);
    }
}

// The host's choice for two axes (a bias row added to every row, a transposed operand): one
// division per element, shared by both operands, and the strides read once.
@compute @workgroup_size(256)
fn rows(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let n = info[0];
    let cols = info[5];
    let a0 = info[2];
    let b0 = info[3];
    let sa = vec2<u32>(info[4u + MAX_RANK], info[5u + MAX_RANK]);
    let sb = vec2<u32>(info[4u + 2u * MAX_RANK], info[5u + 2u * MAX_RANK]);
    let step = grid_size(nwg);
    for (var i = linear_id(gid, nwg); i < n; i = i + step) {
        let r = i / cols;
        let c = i - r * cols;
        z_buf[i] = op(a_buf[a0 + r * sa.x + c * sa.y], b_buf[b0 + r * sb.x + c * sb.y]);
    }
}
