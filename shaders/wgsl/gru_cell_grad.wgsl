// gru_cell_grad.wgsl: the backward of gru_cell.wgsl, one invocation per (row, unit). Given the
// gradient g of h' (read through its strides), it works the gates out again (gru_gates.wgsl) and
// writes [rows, 7u]: each row's gradient of x (3u), of hr (3u), then of h (u):
//     dz = g (h - hh) z (1 - z)   da = (g - g z) (1 - hh^2)   dr = da hr_h r (1 - r)
//     dx = [dz | dr | da]   dhr = [dz | dr | da r]   dh = g z
// As tensor ops this was about eighteen dispatches.

@group(0) @binding(4) var<storage, read> g_buf: array<f32>;
@group(0) @binding(5) var<storage, read_write> grads: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let u = info[1];
    for (var id = linear_id(gid, nwg); id < info[0] * u; id = id + grid_size(nwg)) {
        let row = id / u;
        let j = id - row * u;
        let q = unit(row, j);
        let gn = g_buf[info[11] + row * info[12] + j * info[13]];
        let dz = gn * (q.h - q.hh) * (q.z * (1.0 - q.z));
        let da = (gn - gn * q.z) * (1.0 - q.hh * q.hh);
        let dr = da * q.hn * (q.r * (1.0 - q.r));
        let b = row * 7u * u + j;
        grads[b] = dz;
        grads[b + u] = dr;
        grads[b + 2u * u] = da;
        grads[b + 3u * u] = dz;
        grads[b + 4u * u] = dr;
        grads[b + 5u * u] = da * q.r;
        grads[b + 6u * u] = gn * q.z;
    }
}
