// common.wgsl: the prelude every weft kernel starts with.
//
// Binding 0 of every kernel is `info`, a small read-only array of u32 that the host fills per
// dispatch: element counts, ranks, shapes, strides and offsets (in elements), and f32 parameters
// stored as their bit patterns. Strided inputs are read through `strided_offset`, which turns a
// row-major output index into a storage offset; that is how transposed, broadcast and narrowed
// views are read without a copy.
//
// One-dimensional kernels run 256 invocations per workgroup, at most 1,024 workgroups, and loop
// (`grid_size`). Kernels with one workgroup per row or chunk may get more workgroups than the
// adapter allows along x: the host then spreads them over x and y, and those kernels fold the
// grid back as `wid.x + wid.y * nwg.x`.

@group(0) @binding(0) var<storage, read> info: array<u32>;

const WG: u32 = 256u;
const MAX_RANK: u32 = 8u;

fn linear_id(gid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return gid.x + gid.y * nwg.x * WG;
}

// Invocations in the whole grid. One-dimensional kernels loop `i += grid_size(nwg)`, so a
// grid of at most 1,024 workgroups covers any size: few workgroups keep the per-workgroup cost
// low (it is high on lavapipe) and still fill a large GPU.
fn grid_size(nwg: vec3<u32>) -> u32 {
    return nwg.x * nwg.y * WG;
}

// Storage offset of row-major index `i` of a layout whose shape starts at info[shape_at] and
// whose strides start at info[strides_at].
fn strided_offset(i: u32, rank: u32, shape_at: u32, strides_at: u32, offset: u32) -> u32 {
    // The host merges axes first, so contiguous operands arrive with rank 1: no division at all.
    if (rank == 1u) {
        return offset + i * info[strides_at];
    }
    var rem = i;
    var off = offset;
    for (var d = i32(rank) - 1; d >= 0; d = d - 1) {
        // One division per axis, its remainder from it: lavapipe runs each lane's division on
        // its own (the CPU has no vector division), the most costly step of a strided kernel.
        let size = info[shape_at + u32(d)];
        let q = rem / size;
        off = off + (rem - q * size) * info[strides_at + u32(d)];
        rem = q;
    }
    return off;
}

// The offsets of row-major index `i` in two layouts of one shape (a copy's source and
// destination, a binary op's operands), strides at info[a_at] and info[b_at]: one index
// decomposition for both, half the divisions of two `strided_offset` calls.
fn strided_offset2(i: u32, rank: u32, shape_at: u32, a_at: u32, b_at: u32, a_offset: u32, b_offset: u32) -> vec2<u32> {
    if (rank == 1u) {
        return vec2<u32>(a_offset + i * info[a_at], b_offset + i * info[b_at]);
    }
    var rem = i;
    var off = vec2<u32>(a_offset, b_offset);
    for (var d = i32(rank) - 1; d >= 0; d = d - 1) {
        let size = info[shape_at + u32(d)];
        let q = rem / size;
        let c = rem - q * size;
        off = off + c * vec2<u32>(info[a_at + u32(d)], info[b_at + u32(d)]);
        rem = q;
    }
    return off;
}

fn param(at: u32) -> f32 {
    return bitcast<f32>(info[at]);
}

// The error function: x P(x^2) / Q(x^2) on x clamped to [-4, 4], within 5e-7 (the same rational
// fit, in the same order, as the Cpu reference `ops::erf`); keeps a NaN, which clamp may not.
fn erf_(x: f32) -> f32 {
    if (is_nan_(x)) {
        return x;
    }
    let c = clamp(x, -4.0, 4.0);
    let u = c * c;
    let p = (((((1.91236e-8 * u - 1.9569466e-6) * u + 1.500411e-4) * u + 4.0954305e-3) * u
        + 5.1847916e-2) * u + 0.20950213) * u + 1.1283792;
    let q = (((1.0473436e-3 * u + 1.5167105e-2) * u + 0.11896101) * u + 0.5189974) * u + 1.0;
    return clamp(c * p / q, -1.0, 1.0);
}

// x^e with the Cpu's meaning for negative bases and integer exponents (WGSL's pow leaves them undefined).
fn pow_(x: f32, e: f32) -> f32 {
    if (x < 0.0 && e == floor(e)) {
        let r = pow(-x, e);
        return select(r, -r, (i32(e) & 1) != 0);
    }
    if (x == 0.0) {
        if (e == 0.0) {
            return 1.0;
        }
        return select(bitcast<f32>(0x7f800000u), 0.0, e > 0.0);
    }
    return pow(x, e);
}

// NaN tests on the bits. WGSL lets a compiler assume floats are never NaN, so `x != x` may fold
// to false and `max`, `min` and `clamp` may drop a NaN; an integer test on the bits cannot be
// folded away. Ops that must propagate NaN (as NumPy and PyTorch do) use these.
fn is_nan_(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u;
}

fn is_finite_(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7fffffffu) < 0x7f800000u;
}

// max and min that return the NaN when either operand is one (NumPy's maximum and minimum).
fn max_(a: f32, b: f32) -> f32 {
    if (is_nan_(a)) {
        return a;
    }
    if (is_nan_(b)) {
        return b;
    }
    return max(a, b);
}

fn min_(a: f32, b: f32) -> f32 {
    if (is_nan_(a)) {
        return a;
    }
    if (is_nan_(b)) {
        return b;
    }
    return min(a, b);
}

// The logistic function, as `unary/sigmoid` and the Cpu's `UnaryOp::Sigmoid` form it (the
// recurrent cells' gates).
fn sigmoid_(x: f32) -> f32 {
    return 1.0 / (1.0 + exp(-x));
}

// tanh: x P(x^2) / Q(x^2) inside (-9, 9), ±1 from there on, within 4e-7 (the same rational fit, in the
// same order, as the Cpu reference `ops::tanh`); finite for large |x| on every driver, and keeps a NaN.
fn tanh_(x: f32) -> f32 {
    if (is_nan_(x)) {
        return x;
    }
    let c = clamp(x, -9.0, 9.0);
    let u = c * c;
    let p = (((((-8.467661e-14 * u + 5.2688808e-11) * u - 2.020458e-8) * u + 1.1148841e-5) * u
        + 3.1034118e-3) * u + 0.13083518) * u + 1.0;
    let q = ((2.545365e-4 * u + 2.4492992e-2) * u + 0.46416846) * u + 1.0;
    return select(clamp(c * p / q, -1.0, 1.0), sign(x), abs(x) >= 9.0);
}
