// lstm_cell_grad.wgsl: the backward of lstm_cell.wgsl, one invocation per (row, unit). Given the
// gradient of its output (gh for h, gc for c', read through their strides), it works the gates
// and c' out again from z and c (lstm_gates.wgsl) and writes [rows, 5u]: each row's gradient of
// z (4u), then of c (u):
//     dc' = gc + gh * o * (1 - tanh(c')^2)
//     dz_i = dc' g i (1 - i)   dz_f = dc' c f (1 - f)   dz_g = dc' i (1 - g^2)
//     dz_o = gh tanh(c') o (1 - o)   dc = dc' f
// As tensor ops this was about twenty dispatches.

@group(0) @binding(3) var<storage, read> g_buf: array<f32>;
@group(0) @binding(4) var<storage, read_write> grads: array<f32>;
@group(0) @binding(5) var<storage, read> z2_buf: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let u = info[1];
    for (var id = linear_id(gid, nwg); id < info[0] * u; id = id + grid_size(nwg)) {
        let r = id / u;
        let j = id - r * u;
        let q = gates(r, j);
        let tc = tanh_(q.c2);
        let gb = info[8] + r * info[10] + j * info[11];
        let gh = g_buf[gb];
        let gc = g_buf[gb + info[9]];
        let dc2 = gc + gh * q.o * (1.0 - tc * tc);
        let b = r * 5u * u;
        grads[b + j] = dc2 * q.g * (q.i * (1.0 - q.i));
        grads[b + u + j] = dc2 * q.c * (q.f * (1.0 - q.f));
        grads[b + 2u * u + j] = dc2 * q.i * (1.0 - q.g * q.g);
        grads[b + 3u * u + j] = gh * tc * (q.o * (1.0 - q.o));
        grads[b + 4u * u + j] = dc2 * q.f;
    }
}
