// index.wgsl: index_select (embedding lookup) and gather, one invocation per output element.
//
// The source is contiguous and seen as [outer, size, inner] around the indexed axis. For
// index_select the index of output (o, j, t) is ids[j]; for gather it is ids[p], p being the
// output position itself. An index past the axis is never read: the output gets 0 and the
// dispatch's own fault slot records it (`report`); the host turns that into an `Err` when this
// output, or anything computed from it, is read.
//
// fault: [flag, largest bad index, complement of the first bad position in ids, unused], zeroed
// by the host. The complement makes atomicMax keep the smallest position: the first bad index in
// row-major order, the one the Cpu reports.
//
// info: [n_out, outer, size, inner, n_ids]

@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> out_buf: array<f32>;
@group(0) @binding(4) var<storage, read_write> fault: array<atomic<u32>>;

fn report(id: u32, at: u32) {
    atomicStore(&fault[0], 1u);
    atomicMax(&fault[1], id);
    atomicMax(&fault[2], ~at);
}

// Output element p from index `id`, found at position `at` of ids.
fn fetch(p: u32, id: u32, at: u32) -> f32 {
    let size = info[2];
    let inner = info[3];
    let t = p % inner;
    let o = p / (inner * info[4]);
    if (id >= size) {
        report(id, at);
        return 0.0;
    }
    return src[(o * size + id) * inner + t];
}

@compute @workgroup_size(256)
fn index_select(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    for (var p = linear_id(gid, nwg); p < info[0]; p = p + grid_size(nwg)) {
        let j = (p / info[3]) % info[4];
        out_buf[p] = fetch(p, ids[j], j);
    }
}

@compute @workgroup_size(256)
fn gather(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    for (var p = linear_id(gid, nwg); p < info[0]; p = p + grid_size(nwg)) {
        out_buf[p] = fetch(p, ids[p], p);
    }
}
