// lstm_cell.wgsl: one step of an LSTM cell, one invocation per (row, unit): h = o * tanh(c'),
// with the gates and c' of lstm_gates.wgsl. It writes [rows, 2, u]: each row's h, then its c'. As
// tensor ops a step was about ten dispatches, each a pass over [rows, units].

@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<storage, read> z2_buf: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let u = info[1];
    for (var id = linear_id(gid, nwg); id < info[0] * u; id = id + grid_size(nwg)) {
        let r = id / u;
        let j = id - r * u;
        let q = gates(r, j);
        out[r * 2u * u + j] = q.o * tanh_(q.c2);
        out[r * 2u * u + u + j] = q.c2;
    }
}
