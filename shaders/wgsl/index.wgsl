// index.wgsl: index_select (embedding lookup) and gather, one invocation per output element.
//
// The source is contiguous and seen as [outer, size, inner] around the indexed axis. For
// index_select the index of output (o, j, t) is ids[j]; for gather it is ids[p], p being the
// output position itself. An index past the axis is never read: the output gets 0 and the
// device's fault flag is raised, which the host turns into an `Err` at the next read-back.
//
// info: [n_out, outer, size, inner, n_ids]

@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> out_buf: array<f32>;
@group(0) @binding(4) var<storage, read_write> fault: array<atomic<u32>>;

fn fetch(p: u32, id: u32) -> f32 {
    let size = info[2];
    let inner = info[3];
    let t = p % inner;
    let o = p / (inner * info[4]);
    if (id >= size) {
        atomicStore(&fault[0], 1u);
        return 0.0;
    }
    return src[(o * size + id) * inner + t];
}

@compute @workgroup_size(256)
fn index_select(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    for (var p = linear_id(gid, nwg); p < info[0]; p = p + grid_size(nwg)) {
        let j = (p / info[3]) % info[4];
        out_buf[p] = fetch(p, ids[j]);
    }
}

@compute @workgroup_size(256)
fn gather(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    for (var p = linear_id(gid, nwg); p < info[0]; p = p + grid_size(nwg)) {
        out_buf[p] = fetch(p, ids[p]);
    }
}
