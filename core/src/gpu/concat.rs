//! Launcher for concat.wgsl: parts joined along an axis, six to a dispatch.

use super::context::MAX_1D_GROUPS;
use super::elementwise::{copy_info, copy_into};
use super::{GpuStorage, check_layout, check_rank};
use crate::{DType, Error, Layout, Result};

/// The parts one dispatch reads: six sources, the output and `info` are WebGPU's default limit of
/// eight storage buffers a kernel.
const SOURCES: usize = 6;

/// The parts (storage, layout), of one shape but along `axis`, written one after another into a
/// new contiguous f32 tensor of `shape`: a dispatch per six parts (parts with no elements take
/// none), each part copied by its own row of workgroups as `copy_into` would copy it; a dispatch
/// per part where the adapter binds fewer than eight storage buffers a kernel.
pub fn concat(parts: &[(&GpuStorage, &Layout)], shape: &[usize], axis: usize) -> Result<GpuStorage> {
    let first = parts.first().ok_or_else(|| Error::invalid("concat", "no parts"))?.0;
    let ctx = &first.ctx;
    let out_layout = Layout::contiguous(shape);
    check_layout("concat", &out_layout)?;
    let mut out = GpuStorage::alloc(ctx, out_layout.numel(), DType::F32)?;
    // Each part with its place in the output; the empty ones write nothing.
    let mut placed = Vec::with_capacity(parts.len());
    let mut start = 0;
    for &(s, l) in parts {
        check_rank("concat", l)?;
        let len = l.shape()[axis];
        if l.numel() > 0 {
            placed.push((s, l, out_layout.narrow(axis, start, len)?));
        }
        start += len;
    }
    let per_dispatch = if ctx.limits.max_storage_buffers_per_shader_stage as usize > SOURCES + 1 { SOURCES } else { 1 };
    for group in placed.chunks(per_dispatch) {
        if let [(s, l, dst)] = group {
            copy_into(s, l, &out, dst)?;
            continue;
        }
        let info: Vec<u32> = group.iter().flat_map(|(_, l, dst)| copy_info(l, dst)).collect();
        // Slots past the group's parts are bound to its first source and never read.
        let mut buffers: Vec<_> = (0..SOURCES).map(|i| &group.get(i).unwrap_or(&group[0]).0.buf).collect();
        buffers.push(&out.buf);
        // Workgroups along x for the largest part (the others loop less), about as many in all
        // as a one-dimensional kernel's; a row of them a part.
        let most = group.iter().map(|p| p.1.numel()).max().unwrap_or(0);
        let across = most.div_ceil(256).min(MAX_1D_GROUPS.div_ceil(group.len())).max(1);
        ctx.dispatch("concat", "main", &info, &buffers, [across as u32, group.len() as u32, 1])?;
    }
    // The output carries every part's faults (an empty part's too, as every op's output does).
    for (s, _) in parts {
        out = out.inherit(&[s]);
    }
    Ok(out)
}
