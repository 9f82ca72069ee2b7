// where.wgsl: out = mask != 0 ? a : b, the three operands broadcast to one shape.
//
// One invocation per output element, each operand read through its own strides.
//
// info: [numel, rank, m_offset, a_offset, b_offset, shape[8], m_strides[8], a_strides[8], b_strides[8]]

@group(0) @binding(1) var<storage, read> m_buf: array<f32>;
@group(0) @binding(2) var<storage, read> a_buf: array<f32>;
@group(0) @binding(3) var<storage, read> b_buf: array<f32>;
@group(0) @binding(4) var<storage, read_write> out_buf: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    for (var i = linear_id(gid, nwg); i < info[0]; i = i + grid_size(nwg)) {
        let rank = info[1];
        let om = strided_offset(i, rank, 5u, 5u + MAX_RANK, info[2]);
        let oa = strided_offset(i, rank, 5u, 5u + 2u * MAX_RANK, info[3]);
        let ob = strided_offset(i, rank, 5u, 5u + 3u * MAX_RANK, info[4]);
        out_buf[i] = select(b_buf[ob], a_buf[oa], m_buf[om] != 0.0);
    }
}
