// fma_peak.wgsl: not an op, a measuring stick. Each invocation runs a long loop of independent
// multiply-adds on 32 values (eight vec4 registers) (no memory traffic inside the loop), so the time it takes is
// the adapter's arithmetic ceiling; the matmul benchmark reports its figures against it. The
// sum is written out so the compiler cannot drop the loop.
//
// info: [iterations]

@group(0) @binding(1) var<storage, read_write> out_buf: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = linear_id(gid, nwg);
    let s = f32(i) * 1e-9;
    var a0 = vec4(s, s + 0.1, s + 0.2, s + 0.3);
    var a1 = a0 + 0.4;
    var a2 = a0 + 0.8;
    var a3 = a0 + 1.2;
    var a4 = a0 + 1.6;
    var a5 = a0 + 2.0;
    var a6 = a0 + 2.4;
    var a7 = a0 + 2.8;
    let m = vec4(0.999);
    let c = vec4(0.001);
    for (var k = 0u; k < info[0]; k = k + 1u) {
        a0 = a0 * m + c;
        a1 = a1 * m + c;
        a2 = a2 * m + c;
        a3 = a3 * m + c;
        a4 = a4 * m + c;
        a5 = a5 * m + c;
        a6 = a6 * m + c;
        a7 = a7 * m + c;
    }
    let t = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
    out_buf[i] = t.x + t.y + t.z + t.w;
}
