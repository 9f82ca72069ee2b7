// concat.wgsl: up to six strided views written into their places in a contiguous output, in one
// dispatch. A concat of many parts (a stack of an RNN's 64 steps, the slices of a gradient
// joined, a training step's figures gathered for one read) took a copy dispatch per part; it now
// takes one per six. Six sources, the output and `info` are the eight storage buffers WebGPU's
// default limits allow a kernel.
//
// Row y of the grid copies part y, exactly as copy.wgsl copies one view: its invocations stride
// over the part's elements, each offset pair from one row-major index. A workgroup reads one
// part, so the choice of binding is uniform across it.
//
// info: per part, copy.wgsl's info: [numel, rank, src_offset, dst_offset, shape[8],
//        src_strides[8], dst_strides[8]]

@group(0) @binding(1) var<storage, read> s0: array<u32>;
@group(0) @binding(2) var<storage, read> s1: array<u32>;
@group(0) @binding(3) var<storage, read> s2: array<u32>;
@group(0) @binding(4) var<storage, read> s3: array<u32>;
@group(0) @binding(5) var<storage, read> s4: array<u32>;
@group(0) @binding(6) var<storage, read> s5: array<u32>;
@group(0) @binding(7) var<storage, read_write> dst: array<u32>;

// Values per part in info.
const PART: u32 = 4u + 3u * MAX_RANK;

// Element `at` of source `p` (a binding cannot be picked by index).
fn source_value(p: u32, at: u32) -> u32 {
    switch p {
        case 0u: { return s0[at]; }
        case 1u: { return s1[at]; }
        case 2u: { return s2[at]; }
        case 3u: { return s3[at]; }
        case 4u: { return s4[at]; }
        default: { return s5[at]; }
    }
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let p = wid.y;
    let at = p * PART;
    for (var i = wid.x * WG + lid.x; i < info[at]; i = i + nwg.x * WG) {
        let o = strided_offset2(i, info[at + 1u], at + 4u, at + 4u + MAX_RANK, at + 4u + 2u * MAX_RANK,
                                info[at + 2u], info[at + 3u]);
        dst[o.y] = source_value(p, o.x);
    }
}
