// fill.wgsl: write one 32-bit pattern into every element (zeros, ones, full), so creating a
// constant tensor on the GPU uploads nothing. One invocation per element.
//
// info: [n, value bits]

@group(0) @binding(1) var<storage, read_write> out_buf: array<u32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    for (var i = linear_id(gid, nwg); i < info[0]; i = i + grid_size(nwg)) {
        out_buf[i] = info[1];
    }
}
