// row_max_sum.wgsl: a row's maximum and the sum of exp(x - max), the two numbers of a softmax,
// shared by softmax.wgsl and cross_entropy.wgsl (which declare `x_buf` and the workgroup's
// `part`, and take row_tree.wgsl's `tree` with it). The maximum propagates NaN (`max_`, a test on the bits); subtracting it keeps exp from
// overflowing.

// (max, sum) of the row of `n` values from `base` at `stride`, by a whole workgroup: every
// invocation calls it (it holds barriers), `live` false in a spare workgroup's.
fn workgroup_max_sum(t: u32, live: bool, base: u32, stride: u32, n: u32) -> vec2<f32> {
    var m = -3.4028235e38;
    if (live) {
        for (var j = t; j < n; j = j + WG) {
            m = max_(m, x_buf[base + j * stride]);
        }
    }
    part[t] = m;
    workgroupBarrier();
    m = tree(t, true);
    var s = 0.0;
    if (live) {
        for (var j = t; j < n; j = j + WG) {
            s = s + exp(x_buf[base + j * stride] - m);
        }
    }
    part[t] = s;
    workgroupBarrier();
    s = tree(t, false);
    return vec2<f32>(m, s);
}

// (max, sum) of the row by one invocation alone (a short row).
fn short_max_sum(base: u32, stride: u32, n: u32) -> vec2<f32> {
    var m = -3.4028235e38;
    for (var j = 0u; j < n; j = j + 1u) {
        m = max_(m, x_buf[base + j * stride]);
    }
    var s = 0.0;
    for (var j = 0u; j < n; j = j + 1u) {
        s = s + exp(x_buf[base + j * stride] - m);
    }
    return vec2<f32>(m, s);
}
