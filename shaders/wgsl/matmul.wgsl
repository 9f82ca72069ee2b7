// matmul.wgsl: batched C = A @ B with strided operands, tiled in workgroup memory.
//
// Each workgroup computes a 64x64 tile of C for one batch entry (workgroup_id.z). Its 16x16
// invocations each own a 4x4 block of that tile (register blocking): row lid.y + 16*i and column
// lid.x + 16*j, so neighbouring invocations write neighbouring columns. The K dimension is walked
// in steps of 16: the workgroup first copies a 64x16 slice of A and a 16x64 slice of B into
// workgroup memory (4 values per invocation, zero outside the matrix so any M, N, K works), waits,
// then every invocation does 16 x 4 x 4 multiply-adds out of that shared copy. Each value loaded
// from global memory is thus used 64 times.
//
// A and B are read through row and column strides, so a transposed view (`x.t()`) costs nothing.
// Batch entries are located through up to four batch axes with their own strides (0 where an
// operand is broadcast over the batch).
//
// info: [M, N, K, a_offset, b_offset, a_row_stride, a_col_stride, b_row_stride, b_col_stride,
//        batch_start, batch_shape[4] at 10, a_batch_strides[4] at 14, b_batch_strides[4] at 18,
//        batch_rank at 22]; with an epilogue (`matmul/tiled/relu`: weft-shaders' matmul_epilogue),
//        the op's two parameters at 23 and 24 and the bias's first value at 25, the bias at
//        binding 4.

@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> c: array<f32>;

const TM: u32 = 64u;
const TN: u32 = 64u;
const TK: u32 = 16u;

var<workgroup> a_tile: array<f32, 1024>; // [TK][TM]
var<workgroup> b_tile: array<f32, 1024>; // [TK][TN]

@compute @workgroup_size(16, 16)
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
    let row0 = wid.y * TM;
    let col0 = wid.x * TN;
    let tid = lid.y * 16u + lid.x;

    var acc: array<f32, 16>;
    for (var i = 0u; i < 16u; i = i + 1u) {
        acc[i] = 0.0;
    }
    for (var k0 = 0u; k0 < k; k0 = k0 + TK) {
        for (var l = 0u; l < 4u; l = l + 1u) {
            let e = tid + l * 256u;
            let r = e / TK;
            let kk = e % TK;
            var v = 0.0;
            if (row0 + r < m && k0 + kk < k) {
                v = a[a_base + (row0 + r) * a_rs + (k0 + kk) * a_cs];
            }
            a_tile[kk * TM + r] = v;
            let kb = e / TN;
            let cb = e % TN;
            var w = 0.0;
            if (k0 + kb < k && col0 + cb < n) {
                w = b[b_base + (k0 + kb) * b_rs + (col0 + cb) * b_cs];
            }
            b_tile[kb * TN + cb] = w;
        }
        workgroupBarrier();
        for (var kk = 0u; kk < TK; kk = kk + 1u) {
            var ar: array<f32, 4>;
            var br: array<f32, 4>;
            for (var i = 0u; i < 4u; i = i + 1u) {
                ar[i] = a_tile[kk * TM + lid.y + 16u * i];
                br[i] = b_tile[kk * TN + lid.x + 16u * i];
            }
            for (var i = 0u; i < 4u; i = i + 1u) {
                for (var j = 0u; j < 4u; j = j + 1u) {
                    acc[i * 4u + j] = acc[i * 4u + j] + ar[i] * br[j];
                }
            }
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < 4u; i = i + 1u) {
        let r = row0 + lid.y + 16u * i;
        for (var j = 0u; j < 4u; j = j + 1u) {
            let col = col0 + lid.x + 16u * j;
            if (r < m && col < n) {
                c[batch * m * n + r * n + col] = epilogue(acc[i * 4u + j], col);
            }
        }
    }
}
