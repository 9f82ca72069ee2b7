// row_tree.wgsl: the max or the sum of a workgroup's 256 partial values, for the kernels that
// give a workgroup a row (softmax.wgsl, cross_entropy.wgsl through row_max_sum.wgsl,
// softmax_grad.wgsl), which declare the workgroup's `part`: a tree of halvings, eight rounds of a
// barrier each, shared so that those kernels combine their partials in one order.

// The max (`is_max`) or the sum of every invocation's `part`, left for all: a tree of halvings.
fn tree(t: u32, is_max: bool) -> f32 {
    for (var s = WG / 2u; s > 0u; s = s / 2u) {
        if (t < s) {
            part[t] = select(part[t] + part[t + s], max_(part[t], part[t + s]), is_max);
        }
        workgroupBarrier();
    }
    let r = part[0];
    workgroupBarrier();
    return r;
}

