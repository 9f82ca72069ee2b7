// index_add.wgsl: the adjoints of index_select and gather: add each source element into the
// destination row its index names (the gradient of an embedding lookup).
//
// One invocation per source element. Several may hit the same destination (a token that occurs
// twice), and WGSL has no float atomics, so the add is a compare-and-swap loop on the value's bits:
// read, add, try to swap in; retry if another invocation got there first. The destination is
// zeroed by the host first. Bad indices are skipped and recorded in the dispatch's own fault
// slot, as in index.wgsl: [flag, largest bad index, complement of the first bad position].
//
// info: [n_src, outer, size, inner, n_ids]

@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> dst: array<atomic<u32>>;
@group(0) @binding(4) var<storage, read_write> fault: array<atomic<u32>>;

fn report(id: u32, at: u32) {
    atomicStore(&fault[0], 1u);
    atomicMax(&fault[1], id);
    atomicMax(&fault[2], ~at);
}

// Add source element p at index `id`, found at position `at` of ids.
fn add_at(p: u32, id: u32, at: u32) {
    let size = info[2];
    let inner = info[3];
    if (id >= size) {
        report(id, at);
        return;
    }
    let t = p % inner;
    let o = p / (inner * info[4]);
    let d = (o * size + id) * inner + t;
    let v = src[p];
    var old = atomicLoad(&dst[d]);
    loop {
        let r = atomicCompareExchangeWeak(&dst[d], old, bitcast<u32>(bitcast<f32>(old) + v));
        if (r.exchanged) {
            break;
        }
        old = r.old_value;
    }
}

@compute @workgroup_size(256)
fn index_add(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    for (var p = linear_id(gid, nwg); p < info[0]; p = p + grid_size(nwg)) {
        let j = (p / info[3]) % info[4];
        add_at(p, ids[j], j);
    }
}

@compute @workgroup_size(256)
fn scatter_add(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    for (var p = linear_id(gid, nwg); p < info[0]; p = p + grid_size(nwg)) {
        add_at(p, ids[p], p);
    }
}
