// conv.wgsl: 2-D convolution over channels-last input, and its two gradients; one invocation
// per output element, each a plain sum (no workgroup memory: these are the reference-shaped
// kernels, checked against the Cpu's im2col + gemm).
//
//   forward:     y[n, oh, ow, co]  = sum over ky, kx, ci of x[n, iy, ix, ci] * k[ky, kx, ci, co]
//   input_grad:  dx[n, iy, ix, ci] = sum over the (oh, ow, ky, kx) that read (iy, ix), and co,
//                                    of dy[n, oh, ow, co] * k[ky, kx, ci, co]
//   kernel_grad: dk[ky, kx, ci, co] = sum over n, oh, ow of x[n, iy, ix, ci] * dy[n, oh, ow, co]
//
// with iy = oh * sh + ky * dh - pad_top (and the same across), taps outside the input reading 0.
// Every operand is contiguous.
//
// info: [batch, h, w, c_in, kh, kw, sh, sw, dh, dw, pad_top, pad_left, out_h, out_w, c_out, total]

@group(0) @binding(1) var<storage, read> a_buf: array<f32>;
@group(0) @binding(2) var<storage, read> b_buf: array<f32>;
@group(0) @binding(3) var<storage, read_write> out_buf: array<f32>;

// The input position output `o` reads at tap `k` along an axis (0: height, 1: width), or -1
// where that is padding.
fn source(axis: u32, o: u32, k: u32) -> i32 {
    let i = i32(o * info[6u + axis] + k * info[8u + axis]) - i32(info[10u + axis]);
    return select(-1, i, i >= 0 && i < i32(info[1u + axis]));
}

// The output position whose tap `k` reads input position `i` along an axis, or -1.
fn reader(axis: u32, i: u32, k: u32) -> i32 {
    let t = i32(i + info[10u + axis]) - i32(k * info[8u + axis]);
    let s = i32(info[6u + axis]);
    if (t < 0 || t % s != 0 || t / s >= i32(info[12u + axis])) {
        return -1;
    }
    return t / s;
}

// a = x, b = kernel, out = y.
@compute @workgroup_size(256)
fn forward(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let h = info[1]; let w = info[2]; let cin = info[3]; let kh = info[4]; let kw = info[5];
    let oh_n = info[12]; let ow_n = info[13]; let cout = info[14];
    for (var i = linear_id(gid, nwg); i < info[15]; i = i + grid_size(nwg)) {
        let co = i % cout;
        let ow = (i / cout) % ow_n;
        let oh = (i / (cout * ow_n)) % oh_n;
        let n = i / (cout * ow_n * oh_n);
        var acc = 0.0;
        for (var ky = 0u; ky < kh; ky = ky + 1u) {
            let iy = source(0u, oh, ky);
            if (iy < 0) { continue; }
            for (var kx = 0u; kx < kw; kx = kx + 1u) {
                let ix = source(1u, ow, kx);
                if (ix < 0) { continue; }
                let xb = ((n * h + u32(iy)) * w + u32(ix)) * cin;
                let kb = (ky * kw + kx) * cin * cout + co;
                for (var ci = 0u; ci < cin; ci = ci + 1u) {
                    acc = acc + a_buf[xb + ci] * b_buf[kb + ci * cout];
                }
            }
        }
        out_buf[i] = acc;
    }
}

// a = dy, b = kernel, out = dx.
@compute @workgroup_size(256)
fn input_grad(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let h = info[1]; let w = info[2]; let cin = info[3]; let kh = info[4]; let kw = info[5];
    let oh_n = info[12]; let ow_n = info[13]; let cout = info[14];
    for (var i = linear_id(gid, nwg); i < info[15]; i = i + grid_size(nwg)) {
        let ci = i % cin;
        let ix = (i / cin) % w;
        let iy = (i / (cin * w)) % h;
        let n = i / (cin * w * h);
        var acc = 0.0;
        for (var ky = 0u; ky < kh; ky = ky + 1u) {
            let oh = reader(0u, iy, ky);
            if (oh < 0) { continue; }
            for (var kx = 0u; kx < kw; kx = kx + 1u) {
                let ow = reader(1u, ix, kx);
                if (ow < 0) { continue; }
                let db = ((n * oh_n + u32(oh)) * ow_n + u32(ow)) * cout;
                let kb = ((ky * kw + kx) * cin + ci) * cout;
                for (var co = 0u; co < cout; co = co + 1u) {
                    acc = acc + a_buf[db + co] * b_buf[kb + co];
                }
            }
        }
        out_buf[i] = acc;
    }
}

// a = x, b = dy, out = dk.
@compute @workgroup_size(256)
fn kernel_grad(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let h = info[1]; let w = info[2]; let cin = info[3]; let kw = info[5];
    let oh_n = info[12]; let ow_n = info[13]; let cout = info[14];
    for (var i = linear_id(gid, nwg); i < info[15]; i = i + grid_size(nwg)) {
        let co = i % cout;
        let ci = (i / cout) % cin;
        let kx = (i / (cout * cin)) % kw;
        let ky = i / (cout * cin * kw);
        var acc = 0.0;
        for (var n = 0u; n < info[0]; n = n + 1u) {
            for (var oh = 0u; oh < oh_n; oh = oh + 1u) {
                let iy = source(0u, oh, ky);
                if (iy < 0) { continue; }
                for (var ow = 0u; ow < ow_n; ow = ow + 1u) {
                    let ix = source(1u, ow, kx);
                    if (ix < 0) { continue; }
                    let xv = a_buf[((n * h + u32(iy)) * w + u32(ix)) * cin + ci];
                    acc = acc + xv * b_buf[((n * oh_n + oh) * ow_n + ow) * cout + co];
                }
            }
        }
        out_buf[i] = acc;
    }
}
