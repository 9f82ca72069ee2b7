// matmul_direct.wgsl: batched C = A @ B with strided operands, register-blocked, with no
// workgroup memory and no barriers.
//
// Each invocation computes a TM x TN block of C: rows row0 + i (i < TM) and columns
// col0 + WX*j (j < TN), so neighbouring invocations read neighbouring columns of B. Workgroups
// are WX x WY invocations: 16 x 16 (`directTMxTN`), or 64 x 1 (`rowsTMxTN`: a product of a
// few rows, as inference on one sample or a decoder's next token makes, fills a whole block
// instead of one row of a 16 x 16 one, where the other 15 rows would only repeat the first). For every k
// it loads TM values of A and TN of B straight from the buffers and does TM*TN multiply-adds
// into the accumulators c_i_j. Indices past the edge are clamped to the last row or column, so
// the inner loop has no branches; those results are not written.
//
// The block is written out as named scalars (a_0, b_0, c_0_0, ...) rather than arrays and loops,
// because shader compilers keep named scalars in registers but may leave an indexed array in
// memory. weft-shaders generates those lines for each block size (`matmul_direct_source`)
// in place of the SETUP, STEP and STORE markers below.
//
// Why it exists: on an adapter whose "global memory" is the CPU's cached RAM (lavapipe, which
// runs 8 invocations at once in SIMD lanes), every load is a gather and every barrier a context
// switch, so big register blocks and no barriers are several times faster than the
// workgroup-tiled kernel. On a real GPU a 16x16 block would spill; there `tiled` wins. The
// autotuner times every variant once per adapter and keeps the fastest.
//
// info: the same layout as matmul.wgsl.

@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> c: array<f32>;

@compute @workgroup_size({{WX}}, {{WY}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let m = info[0];
    let n = info[1];
    let k = info[2];
    let batch = wid.z + info[9];
    let a_base = strided_offset(batch, info[22], 10u, 14u, info[3]);
    let b_base = strided_offset(batch, info[22], 10u, 18u, info[4]);
    let a_rs = info[5];
    let a_cs = info[6];
    let b_rs = info[7];
    let b_cs = info[8];
    let row0 = wid.y * {{WY}}u * {{TM}}u + lid.y * {{TM}}u;
    let col0 = wid.x * {{WX}}u * {{TN}}u + lid.x;
    // Where each row of A and column of B starts (clamped to the matrix).
{{SETUP}}
    for (var kk = 0u; kk < k; kk = kk + 1u) {
        let ka = kk * a_cs;
        let kb = kk * b_rs;
{{STEP}}
    }
    let out = batch * m * n;
{{STORE}}
}
