// pool.wgsl: max and average pooling forward, one invocation per output element (the taps
// helpers are in pool_taps.wgsl).

@group(0) @binding(1) var<storage, read> x_buf: array<f32>;
@group(0) @binding(2) var<storage, read_write> y_buf: array<f32>;

// (n, oh, ow, ch) of output element i.
fn output_pos(i: u32) -> vec4<u32> {
    let c = info[3]; let ow_n = info[13]; let oh_n = info[12];
    return vec4(i / (c * ow_n * oh_n), (i / (c * ow_n)) % oh_n, (i / c) % ow_n, i % c);
}

@compute @workgroup_size(256)
fn max_pool(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    for (var i = linear_id(gid, nwg); i < info[14]; i = i + grid_size(nwg)) {
        let p = output_pos(i);
        y_buf[i] = x_buf[window_argmax(p.x, p.y, p.z, p.w)];
    }
}

@compute @workgroup_size(256)
fn avg_pool(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let h = info[1]; let w = info[2]; let c = info[3];
    for (var i = linear_id(gid, nwg); i < info[14]; i = i + grid_size(nwg)) {
        let p = output_pos(i);
        var s = 0.0;
        for (var ky = 0u; ky < info[4]; ky = ky + 1u) {
            let iy = source(0u, p.y, ky);
            if (iy < 0) { continue; }
            for (var kx = 0u; kx < info[5]; kx = kx + 1u) {
                let ix = source(1u, p.z, kx);
                if (ix < 0) { continue; }
                s = s + x_buf[((p.x * h + u32(iy)) * w + u32(ix)) * c + p.w];
            }
        }
        y_buf[i] = s / f32(max(tap_count(p.y, p.z), 1u));
    }
}
