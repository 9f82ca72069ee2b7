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
        let size = info[shape_at + u32(d)];
        off = off + (rem % size) * info[strides_at + u32(d)];
        rem = rem / size;
    }
    return off;
}

fn param(at: u32) -> f32 {
    return bitcast<f32>(info[at]);
}

// The error function to 1.2e-7 (the same Chebyshev fit as the Cpu reference, `ops::erf`).
fn erf_(x: f32) -> f32 {
    let z = abs(x);
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -z * z - 1.2655122 + t * (1.0000237 + t * (0.37409196 + t * (0.09678418
        + t * (-0.18628806 + t * (0.27886807 + t * (-1.135204 + t * (1.4885159
        + t * (-0.82215223 + t * 0.17087277))))))));
    let r = 1.0 - t * exp(poly);
    return select(-r, r, x >= 0.0);
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

// tanh that stays finite for large |x| on every driver, and keeps a NaN.
fn tanh_(x: f32) -> f32 {
    if (is_nan_(x)) {
        return x;
    }
    return tanh(clamp(x, -15.0, 15.0));
}
