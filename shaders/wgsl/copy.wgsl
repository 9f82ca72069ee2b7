// copy.wgsl: copy a strided view into a strided destination, 32 bits at a time, whatever the
// element type (f32, u32, i32). `contiguous()` uses it with a row-major destination, a product
// run transposed to put its output back in order; concat.wgsl copies up to six views this way in
// one dispatch.
//
// One invocation per element: both offsets come from the same row-major index, decomposed once.
//
// info: [numel, rank, src_offset, dst_offset, shape[8], src_strides[8], dst_strides[8]]

@group(0) @binding(1) var<storage, read> src: array<u32>;
@group(0) @binding(2) var<storage, read_write> dst: array<u32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    for (var i = linear_id(gid, nwg); i < info[0]; i = i + grid_size(nwg)) {
        let o = strided_offset2(i, info[1], 4u, 4u + MAX_RANK, 4u + 2u * MAX_RANK, info[2], info[3]);
        dst[o.y] = src[o.x];
    }
}
