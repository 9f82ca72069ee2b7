// matmul_vec4.wgsl: the workgroup-tiled matmul of matmul.wgsl, loading its tiles four floats at a
// time. When both operands are row-major along the loaded direction and every offset and stride
// is a multiple of 4 (and K and N are too), each of the 256 invocations fetches one vec4 of A and
// one of B per tile instead of four scalars: a quarter of the load instructions, and on real GPUs
// 16-byte memory transactions. The multiply-add loop is unchanged. The launcher only offers this
// variant for layouts that meet those conditions.
//
// Tiles: each workgroup computes 64x64 of C; A's 64x16 slice is 256 vec4 (row r = e / 4, k chunk
// e % 4), B's 16x64 slice is 256 vec4 (k row e / 16, column chunk e % 16). Both are stored as
// scalars in workgroup memory, laid out as in matmul.wgsl.
//
// info: the same layout as matmul.wgsl.

@group(0) @binding(1) var<storage, read> a: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> b: array<vec4<f32>>;
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
    let b_rs = info[7];
    let row0 = wid.y * TM;
    let col0 = wid.x * TN;
    let tid = lid.y * 16u + lid.x;

    var acc: array<f32, 16>;
    for (var i = 0u; i < 16u; i = i + 1u) {
        acc[i] = 0.0;
    }
    for (var k0 = 0u; k0 < k; k0 = k0 + TK) {
        {
            let r = tid / 4u;
            let kq = 4u * (tid % 4u);
            var v = vec4(0.0);
            if (row0 + r < m && k0 + kq < k) {
                v = a[(a_base + (row0 + r) * a_rs + k0 + kq) / 4u];
            }
            for (var q = 0u; q < 4u; q = q + 1u) {
                a_tile[(kq + q) * TM + r] = v[q];
            }
            let kb = tid / 16u;
            let cq = 4u * (tid % 16u);
            var w = vec4(0.0);
            if (k0 + kb < k && col0 + cq < n) {
                w = b[(b_base + (k0 + kb) * b_rs + col0 + cq) / 4u];
            }
            for (var q = 0u; q < 4u; q = q + 1u) {
                b_tile[kb * TN + cq + q] = w[q];
            }
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
