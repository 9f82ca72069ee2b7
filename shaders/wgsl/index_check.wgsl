// index_check.wgsl: check that values can serve as u32 indices and convert them, in one pass
// (`Tensor::to_index`: labels and ids that come as f32 or i32).
//
// One invocation per element, read through its strides. A value passes when `check` finds it
// a whole number, not negative, finite and below 2^32 (f32 is tested for NaN and infinity on the
// bits: WGSL may assume neither exists), and it is below the bound when there is one. Passing
// values are written as u32. Of the failing ones, the first in row-major order is recorded, so
// the host can name its value and position.
//
// info: [numel, rank, x_offset, bound, has_bound, shape[8], x_strides[8]]
// result: a fault slot's layout, zeroed by the host: [flag, unused, complement of the first bad
// position, unused]; the complement makes atomicMax keep the smallest position.

@group(0) @binding(1) var<storage, read> x_buf: array<{{IN}}>;
@group(0) @binding(2) var<storage, read_write> y_buf: array<u32>;
@group(0) @binding(3) var<storage, read_write> result: array<atomic<u32>>;

// (index, 1) for a value that is a valid u32 index, (0, 0) otherwise.
fn check(v: {{IN}}) -> vec2<u32> {
    {{CHECK}}
}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    for (var i = linear_id(gid, nwg); i < info[0]; i = i + grid_size(nwg)) {
        let c = check(x_buf[strided_offset(i, info[1], 5u, 5u + MAX_RANK, info[2])]);
        let ok = c.y == 1u && (info[4] == 0u || c.x < info[3]);
        if (!ok) {
            atomicStore(&result[0], 1u);
            atomicMax(&result[2], ~i);
        }
        y_buf[i] = select(0u, c.x, ok);
    }
}
