// row_stats.wgsl: a layer-norm row's mean and sum of squared deviations from it (two passes:
// the mean, then the deviations, more stable than E[x^2] - E[x]^2), for layer_norm.wgsl and
// layer_norm_grad.wgsl. `workgroup_row_stats` has a workgroup's invocations stride over the row
// and meet in the kernel's workgroup array `part` (a tree of halvings); `short_row_stats` is one
// invocation's, whose mean sums each value's difference from the row's first, one value at a
// time: a row of values near 1000 then loses no more to rounding than one near 0 (a NaN or an
// infinity still spoils the sum). Both read `x_buf`, which the kernel declares, from `base`
// with `stride` between values.

// The sum of every invocation's `part[t]`, left for all; every invocation of the workgroup calls it.
fn part_sum(t: u32) -> f32 {
    for (var s = WG / 2u; s > 0u; s = s / 2u) {
        if (t < s) {
            part[t] = part[t] + part[t + s];
        }
        workgroupBarrier();
    }
    let r = part[0];
    workgroupBarrier();
    return r;
}

// Every invocation of the workgroup calls it (it waits at barriers); `live` is false in a
// workgroup past the last row, whose sums are then of nothing.
fn workgroup_row_stats(t: u32, live: bool, base: u32, stride: u32, n: u32) -> vec2<f32> {
    var s = 0.0;
    if (live) {
        for (var j = t; j < n; j = j + WG) {
            s = s + x_buf[base + j * stride];
        }
    }
    part[t] = s;
    workgroupBarrier();
    let mean = part_sum(t) / f32(n);
    var q = 0.0;
    if (live) {
        for (var j = t; j < n; j = j + WG) {
            let d = x_buf[base + j * stride] - mean;
            q = q + d * d;
        }
    }
    part[t] = q;
    workgroupBarrier();
    return vec2<f32>(mean, part_sum(t));
}

fn short_row_stats(base: u32, stride: u32, n: u32) -> vec2<f32> {
    let x0 = x_buf[base];
    var s = 0.0;
    for (var j = 0u; j < n; j = j + 1u) {
        s = s + (x_buf[base + j * stride] - x0);
    }
    let mean = x0 + s / f32(n);
    var q = 0.0;
    for (var j = 0u; j < n; j = j + 1u) {
        let d = x_buf[base + j * stride] - mean;
        q = q + d * d;
    }
    return vec2<f32>(mean, q);
}
