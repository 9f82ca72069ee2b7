// cross_entropy_grad.wgsl: sparse cross-entropy's backward, the logits' gradient in one pass:
//     dx[r, j] = ([j = label r] - exp(x[r, j] - max r - lse r)) * g[r]
// from the logits, the labels and each row's max and log-sum-exp (`stats`, which
// cross_entropy.wgsl wrote), and the gradient of each row's pick `g`. Composed, it was a
// `scatter_add` into zeros (a fill and a dispatch), then log-softmax's backward. A row whose max
// is NaN is written NaN, tested on the bits (WGSL may assume there is none), as on the Cpu.
//
// info: [rows, classes, x offset, x row stride, x class stride, g offset, g stride]

@group(0) @binding(1) var<storage, read> x_buf: array<f32>;
@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<storage, read> stats: array<f32>;
@group(0) @binding(4) var<storage, read> g_buf: array<f32>;
@group(0) @binding(5) var<storage, read_write> dx: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let n = info[1];
    for (var i = linear_id(gid, nwg); i < info[0] * n; i = i + grid_size(nwg)) {
        let r = i / n;
        let j = i - r * n;
        let m = stats[2u * r];
        let p = exp(x_buf[info[2] + r * info[3] + j * info[4]] - m - stats[2u * r + 1u]);
        let hot = select(0.0, 1.0, ids[r] == j);
        dx[i] = select((hot - p) * g_buf[info[5] + r * info[6]], m, is_nan_(m));
    }
}
