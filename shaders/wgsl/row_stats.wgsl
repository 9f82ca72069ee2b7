// row_stats.wgsl: a layer-norm row's mean and sum of squared deviations from it, worked by one
// invocation (the short-row entries of layer_norm.wgsl and layer_norm_grad.wgsl, two passes: the
// mean, then the deviations, more stable than E[x^2] - E[x]^2). The mean sums each value's
// difference from the row's first, one value at a time: a row of values near 1000 then loses no
// more to rounding than one near 0 (a NaN or an infinity still spoils the sum). Reads `x_buf`,
// which the kernel declares, from `base` with `stride` between values.
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
