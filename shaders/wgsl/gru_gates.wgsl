// gru_gates.wgsl: what gru_cell.wgsl and gru_cell_grad.wgsl share, one unit of one row of a GRU
// step (Keras' `reset_after`): from the input's share of the gates x = [x_z | x_r | x_h] (x W + b),
// the state's hr = [hr_z | hr_r | hr_h] (h U + b_r), each a row of 3u, and the state h,
//     z = sigmoid(x_z + hr_z)  r = sigmoid(x_r + hr_r)  hh = tanh(x_h + r * hr_h)
// all read through their strides. The arithmetic is the Cpu's (core/src/cpu/gru.rs), term for term.
//
// info: [rows, u, x offset, x row stride, x unit stride, hr offset, hr row stride, hr unit stride,
//        h offset, h row stride, h unit stride,
//        (gru_cell_grad.wgsl:) g offset, g row stride, g unit stride]

@group(0) @binding(1) var<storage, read> x_buf: array<f32>;
@group(0) @binding(2) var<storage, read> hr_buf: array<f32>;
@group(0) @binding(3) var<storage, read> h_buf: array<f32>;

struct Unit {
    z: f32,
    r: f32,
    hn: f32,
    hh: f32,
    h: f32,
}

fn unit(row: u32, j: u32) -> Unit {
    let u = info[1];
    let xb = info[2] + row * info[3];
    let xs = info[4];
    let rb = info[5] + row * info[6];
    let rs = info[7];
    var q: Unit;
    q.z = sigmoid_(x_buf[xb + j * xs] + hr_buf[rb + j * rs]);
    q.r = sigmoid_(x_buf[xb + (u + j) * xs] + hr_buf[rb + (u + j) * rs]);
    q.hn = hr_buf[rb + (2u * u + j) * rs];
    q.hh = tanh_(x_buf[xb + (2u * u + j) * xs] + q.r * q.hn);
    q.h = h_buf[info[8] + row * info[9] + j * info[10]];
    return q;
}
