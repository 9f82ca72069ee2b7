// adam.wgsl: one fused Adam step over contiguous vectors: reads the weight, its gradient and the
// two moment estimates once and writes the three updated tensors, instead of the dozen
// elementwise kernels (and memory passes) the formula would take op by op.
//
//   m' = m + (g - m) * (1 - beta1)
//   v' = v + (g * g - v) * (1 - beta2)
//   w' = w * decay - lr_t * m' / (sqrt(v') + eps)
//
// lr_t carries Adam's bias correction and decay the decoupled weight decay (AdamW); the host
// computes both. One invocation per element, looping over the grid.
//
// info: [n, lr_t bits, beta1 bits, beta2 bits, eps bits, decay bits]

@group(0) @binding(1) var<storage, read> w: array<f32>;
@group(0) @binding(2) var<storage, read> g: array<f32>;
@group(0) @binding(3) var<storage, read> m: array<f32>;
@group(0) @binding(4) var<storage, read> v: array<f32>;
@group(0) @binding(5) var<storage, read_write> w_out: array<f32>;
@group(0) @binding(6) var<storage, read_write> m_out: array<f32>;
@group(0) @binding(7) var<storage, read_write> v_out: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let lr_t = param(1u);
    let b1 = param(2u);
    let b2 = param(3u);
    let eps = param(4u);
    let decay = param(5u);
    for (var i = linear_id(gid, nwg); i < info[0]; i = i + grid_size(nwg)) {
        let gi = g[i];
        let mi = m[i] + (gi - m[i]) * (1.0 - b1);
        let vi = v[i] + (gi * gi - v[i]) * (1.0 - b2);
        m_out[i] = mi;
        v_out[i] = vi;
        w_out[i] = w[i] * decay - lr_t * mi / (sqrt(vi) + eps);
    }
}
