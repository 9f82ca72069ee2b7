// lstm_gates.wgsl: what lstm_cell.wgsl and lstm_cell_grad.wgsl share, the four gates of one unit
// of one row, the state they update and the new state:
//     i = sigmoid(z_i)  f = sigmoid(z_f)  g = tanh(z_g)  o = sigmoid(z_o)  c' = f * c + i * g
// from the gates' pre-activations z = [z_i | z_f | z_g | z_o] (a row of 4u) and the state c, both
// read through their strides. The arithmetic is the Cpu's (core/src/cpu/lstm.rs), term for term.
//
// info: [rows, u, z offset, z row stride, z unit stride, c offset, c row stride, c unit stride,
//        (lstm_cell_grad.wgsl:) g offset, g stride from h to c, g row stride, g unit stride]

@group(0) @binding(1) var<storage, read> z_buf: array<f32>;
@group(0) @binding(2) var<storage, read> c_buf: array<f32>;

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
    let zb = info[2] + r * info[3];
    let zs = info[4];
    var q: Gates;
    q.i = sigmoid_(z_buf[zb + j * zs]);
    q.f = sigmoid_(z_buf[zb + (u + j) * zs]);
    q.g = tanh_(z_buf[zb + (2u * u + j) * zs]);
    q.o = sigmoid_(z_buf[zb + (3u * u + j) * zs]);
    q.c = c_buf[info[5] + r * info[6] + j * info[7]];
    q.c2 = q.f * q.c + q.i * q.g;
    return q;
}
