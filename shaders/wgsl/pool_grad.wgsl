// pool_grad.wgsl: the input gradient of max and average pooling, one invocation per input
// element, summing over the windows that read it (no atomics): max pooling passes a window's
// gradient to its first largest tap, average pooling spreads it over the taps inside the input.

@group(0) @binding(1) var<storage, read> x_buf: array<f32>;
@group(0) @binding(2) var<storage, read> dy_buf: array<f32>;
@group(0) @binding(3) var<storage, read_write> dx_buf: array<f32>;

// The output position whose tap `k` reads input position `i` along an axis, or -1.
fn reader(axis: u32, i: u32, k: u32) -> i32 {
    let t = i32(i + info[10u + axis]) - i32(k * info[8u + axis]);
    let s = i32(info[6u + axis]);
    if (t < 0 || t % s != 0 || t / s >= i32(info[12u + axis])) {
        return -1;
    }
    return t / s;
}

fn grad(i: u32, is_max: bool) -> f32 {
    let h = info[1]; let w = info[2]; let c = info[3];
    let ch = i % c;
    let ix = (i / c) % w;
    let iy = (i / (c * w)) % h;
    let n = i / (c * w * h);
    var acc = 0.0;
    for (var ky = 0u; ky < info[4]; ky = ky + 1u) {
        let oh = reader(0u, iy, ky);
        if (oh < 0) { continue; }
        for (var kx = 0u; kx < info[5]; kx = kx + 1u) {
            let ow = reader(1u, ix, kx);
            if (ow < 0) { continue; }
            let d = dy_buf[((n * info[12] + u32(oh)) * info[13] + u32(ow)) * c + ch];
            if (is_max) {
                if (window_argmax(n, u32(oh), u32(ow), ch) == i) {
                    acc = acc + d;
                }
            } else {
                acc = acc + d / f32(max(tap_count(u32(oh), u32(ow)), 1u));
            }
        }
    }
    return acc;
}

@compute @workgroup_size(256)
fn max_grad(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    for (var i = linear_id(gid, nwg); i < info[14]; i = i + grid_size(nwg)) {
        dx_buf[i] = grad(i, true);
    }
}

@compute @workgroup_size(256)
fn avg_grad(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    for (var i = linear_id(gid, nwg); i < info[14]; i = i + grid_size(nwg)) {
        dx_buf[i] = grad(i, false);
    }
}
