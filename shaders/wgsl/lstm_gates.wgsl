// lstm_gates.wgsl: what lstm_cell.wgsl and lstm_cell_grad.wgsl share, the four gates of one unit
// of one row, the state they update and the new state:
//     i = sigmoid(z_i)  f = sigmoid(z_f)  g = tanh(z_g)  o = sigmoid(z_o)  c' = f * c + i * g
// from the gates' pre-activations z = [z_i | z_f | z_g | z_o] (a row of 4u) and the state c, both
// read through their strides. z may come as two shares, x W + b and h U, added here (info[12] = 1:
// the second share in z2_buf, which each kernel binds after its own buffers) rather than by a pass
// of their own. The arithmetic is the Cpu's (core/src/cpu/lstm.rs), term for term.
//
// info: [rows, u, z offset, z row stride, z unit stride, c offset, c row stride, c unit stride,
//        (lstm_cell_grad.wgsl:) g offset, g stride from h to c, g row stride, g unit stride,
//        has a second share, its offset, row stride, unit stride]

@group(0) @binding(1) var<storage, read> z_buf: array<f32>;
@group(0) @binding(2) var<storage, read> c_buf: array<f32>;

// Gate pre-activation `k` (`k * u + j` along the row) of row `r`: z's, plus the second share's.
fn pre(r: u32, k: u32) -> f32 {
    let v = z_buf[info[2] + r * info[3] + k * info[4]];
    if (info[12] == 0u) {
        return v;
    }
    return v + z2_buf[info[13] + r * info[14] + k * info[15]];
}

struct Gates {
    i: f32,
    f: f32,
    g: f32,
    o: f32,
    c: f32,
    c2: f32,
}

fn gates(r: u32, j: u32) -> Gates {
    let u = info[1];
    var q: Gates;
    q.i = sigmoid_(pre(r, j));
    q.f = sigmoid_(pre(r, u + j));
    q.g = tanh_(pre(r, 2u * u + j));
    q.o = sigmoid_(pre(r, 3u * u + j));
    q.c = c_buf[info[5] + r * info[6] + j * info[7]];
    q.c2 = q.f * q.c + q.i * q.g;
    return q;
}
