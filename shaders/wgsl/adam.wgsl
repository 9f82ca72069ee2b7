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
// `main_checked` also checks the gradient in the same pass, so that a training step need not read
// it a second time (two reductions) to know whether its update may stand: `check[0]`, zero
// before the dispatch, becomes the bits of a NaN when any gradient value is an infinity or a NaN
// (a test on the bits: WGSL may assume floats are finite). Every invocation that meets one
// stores the same bits, so the race has one outcome. It binds nine storage buffers (info
// included), past WebGPU's default of eight: the host uses it only where the adapter allows.
//
// info: [n, lr_t bits, beta1 bits, beta2 bits, eps bits, decay bits]

@group(0) @binding(1) var<storage, read> w: array<f32>;
@group(0) @binding(2) var<storage, read> g: array<f32>;
@group(0) @binding(3) var<storage, read> m: array<f32>;
@group(0) @binding(4) var<storage, read> v: array<f32>;
@group(0) @binding(5) var<storage, read_write> w_out: array<f32>;
@group(0) @binding(6) var<storage, read_write> m_out: array<f32>;
@group(0) @binding(7) var<storage, read_write> v_out: array<f32>;

@group(0) @binding(8) var<storage, read_write> check: array<atomic<u32>>;

struct Hyper {
    lr_t: f32,
    b1: f32,
    b2: f32,
    eps: f32,
    decay: f32,
}

fn hyper() -> Hyper {
    return Hyper(param(1u), param(2u), param(3u), param(4u), param(5u));
}

// Updates element i; returns its gradient value.
fn update(i: u32, h: Hyper) -> f32 {
    let gi = g[i];
    let mi = m[i] + (gi - m[i]) * (1.0 - h.b1);
    let vi = v[i] + (gi * gi - v[i]) * (1.0 - h.b2);
    m_out[i] = mi;
    v_out[i] = vi;
    w_out[i] = w[i] * h.decay - h.lr_t * mi / (sqrt(vi) + h.eps);
    return gi;
}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let h = hyper();
    for (var i = linear_id(gid, nwg); i < info[0]; i = i + grid_size(nwg)) {
        update(i, h);
    }
}

@compute @workgroup_size(256)
fn main_checked(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let h = hyper();
    var bad = false;
    for (var i = linear_id(gid, nwg); i < info[0]; i = i + grid_size(nwg)) {
        // (Updated first: `||` would skip the update once `bad` is set.)
        let gi = update(i, h);
        bad = bad || !is_finite_(gi);
    }
    if (bad) {
        atomicStore(&check[0], 0x7fc00000u);
    }
}
