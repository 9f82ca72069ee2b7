// gru_cell.wgsl: one step of a GRU cell, one invocation per (row, unit): the new state
// h' = hh + z * (h - hh), with the gates of gru_gates.wgsl, written [rows, u]. As tensor ops a
// step was about ten dispatches, each a pass over [rows, units].

@group(0) @binding(4) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let u = info[1];
    for (var id = linear_id(gid, nwg); id < info[0] * u; id = id + grid_size(nwg)) {
        let row = id / u;
        let q = unit(row, id - row * u);
        out[id] = q.hh + q.z * (q.h - q.hh);
    }
}
