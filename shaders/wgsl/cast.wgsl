// cast.wgsl: convert a strided tensor to another element type, one element per invocation.
// The host splices in the input and output element types and the conversion `{{CONV}}` of `v`;
// the f16 variants start with `enable f16;` and need the adapter feature shader-f16.
//
// info: [numel, rank, x_offset, shape[8], x_strides[8]]

@group(0) @binding(1) var<storage, read> x_buf: array<{{IN}}>;
@group(0) @binding(2) var<storage, read_write> y_buf: array<{{OUT}}>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    for (var i = linear_id(gid, nwg); i < info[0]; i = i + grid_size(nwg)) {
        let v = x_buf[strided_offset(i, info[1], 3u, 3u + MAX_RANK, info[2])];
        y_buf[i] = {{CONV}};
    }
}
