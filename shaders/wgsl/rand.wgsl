// rand.wgsl: uniform random numbers in [0, 1) from a counter-based generator.
//
// Value i of stream `key` is a pure function of (key, start + i) built from 32-bit integer ops
// only: the same bits as the Cpu's `rng::uniform`, so a seeded dropout mask is identical on
// every backend. One invocation per value.
//
// info: [n, key, start]

@group(0) @binding(1) var<storage, read_write> out_buf: array<f32>;

fn pcg_hash(x: u32) -> u32 {
    let state = x * 747796405u + 2891336453u;
    let word = ((state >> ((state >> 28u) + 4u)) ^ state) * 277803737u;
    return (word >> 22u) ^ word;
}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    for (var i = linear_id(gid, nwg); i < info[0]; i = i + grid_size(nwg)) {
        let c = info[2] + i;
        let h = pcg_hash(c ^ pcg_hash(info[1] + ((c << 16u) | (c >> 16u))));
        out_buf[i] = f32(h >> 8u) * (1.0 / 16777216.0);
    }
}
