// pool_taps.wgsl: what the pooling kernels share: a window's taps inside the input and its
// first largest value. Channels-last and contiguous.
//
// info: [batch, h, w, c, kh, kw, sh, sw, dh, dw, pad_top, pad_left, out_h, out_w, total]

fn source(axis: u32, o: u32, k: u32) -> i32 {
    let i = i32(o * info[6u + axis] + k * info[8u + axis]) - i32(info[10u + axis]);
    return select(-1, i, i >= 0 && i < i32(info[1u + axis]));
}

// The offset of the first largest value in window (n, oh, ow) of channel ch (the first NaN if
// any, as the Cpu: a NaN is kept once found, and only a larger value or a NaN replaces the best).
fn window_argmax(n: u32, oh: u32, ow: u32, ch: u32) -> u32 {
    let h = info[1]; let w = info[2]; let c = info[3];
    var best = 0u;
    var bv = 0.0;
    var found = false;
    for (var ky = 0u; ky < info[4]; ky = ky + 1u) {
        let iy = source(0u, oh, ky);
        if (iy < 0) { continue; }
        for (var kx = 0u; kx < info[5]; kx = kx + 1u) {
            let ix = source(1u, ow, kx);
            if (ix < 0) { continue; }
            let off = ((n * h + u32(iy)) * w + u32(ix)) * c + ch;
            let v = x_buf[off];
            if (!found || (!is_nan_(bv) && (v > bv || is_nan_(v)))) {
                best = off;
                bv = v;
                found = true;
            }
        }
    }
    return best;
}

// The number of window (oh, ow)'s taps inside the input.
fn tap_count(oh: u32, ow: u32) -> u32 {
    var count = 0u;
    for (var ky = 0u; ky < info[4]; ky = ky + 1u) {
        for (var kx = 0u; kx < info[5]; kx = kx + 1u) {
            if (source(0u, oh, ky) >= 0 && source(1u, ow, kx) >= 0) {
                count = count + 1u;
            }
        }
    }
    return count;
}
