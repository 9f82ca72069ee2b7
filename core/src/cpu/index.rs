//! Indexing on the Cpu: index_select (embedding lookup), gather (torch semantics) and their
//! adjoints index_add and scatter_add. Out-of-range indices are errors, never silent reads.

use super::{CpuStorage, f32_storage, strided, try_take, try_zeros};
use crate::{Error, Layout, Result};

fn check(op: &'static str, ids: &[u32], size: usize) -> Result<()> {
    match ids.iter().find(|&&i| i as usize >= size) {
        Some(i) => Err(Error::invalid(op, format!("index {i} is out of range for an axis of size {size}"))),
        None => Ok(()),
    }
}

/// Split a contiguous shape at `axis` into (outer, size, inner).
fn split(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    (shape[..axis].iter().product(), shape[axis], shape[axis + 1..].iter().product())
}

/// Entries `ids` (1-D) of `axis`: output shape is the source shape with `axis` of size `ids.len()`.
pub fn index_select(s: &CpuStorage, l: &Layout, ids: &CpuStorage, li: &Layout, axis: usize) -> Result<CpuStorage> {
    let x = strided(s.f32s("index_select")?, l)?;
    let ids = ids.indices("index_select", li)?;
    let (outer, size, inner) = split(l.shape(), axis);
    check("index_select", &ids, size)?;
    let mut out = try_take(outer * ids.len() * inner)?;
    for o in 0..outer {
        for &i in &ids {
            let start = (o * size + i as usize) * inner;
            out.extend_from_slice(&x[start..start + inner]);
        }
    }
    Ok(f32_storage(out))
}

/// Adjoint of index_select: a zero tensor of `shape` with `src` rows added at `ids` along `axis`.
pub fn index_add(
    shape: &[usize],
    axis: usize,
    ids: &CpuStorage,
    li: &Layout,
    src: &CpuStorage,
    ls: &Layout,
) -> Result<CpuStorage> {
    let x = strided(src.f32s("index_add")?, ls)?;
    let ids = ids.indices("index_add", li)?;
    let (outer, size, inner) = split(shape, axis);
    check("index_add", &ids, size)?;
    let mut out = try_zeros(outer * size * inner)?;
    for o in 0..outer {
        for (j, &i) in ids.iter().enumerate() {
            let d = (o * size + i as usize) * inner;
            let s = (o * ids.len() + j) * inner;
            for t in 0..inner {
                out[d + t] += x[s + t];
            }
        }
    }
    Ok(f32_storage(out))
}

/// `out[.., j, ..] = src[.., ids[.., j, ..], ..]` along `axis`; `ids` has the output's shape, which
/// matches the source on every other axis.
pub fn gather(s: &CpuStorage, l: &Layout, ids: &CpuStorage, li: &Layout, axis: usize) -> Result<CpuStorage> {
    let x = strided(s.f32s("gather")?, l)?;
    let ids = ids.indices("gather", li)?;
    let (outer, size, inner) = split(l.shape(), axis);
    let k = li.shape()[axis];
    check("gather", &ids, size)?;
    let mut out = try_zeros(ids.len())?;
    for o in 0..outer {
        for j in 0..k {
            for t in 0..inner {
                let p = (o * k + j) * inner + t;
                out[p] = x[(o * size + ids[p] as usize) * inner + t];
            }
        }
    }
    Ok(f32_storage(out))
}

/// Adjoint of gather: a zero tensor of `shape` with `src[p]` added at the position `ids[p]` names.
pub fn scatter_add(
    shape: &[usize],
    axis: usize,
    ids: &CpuStorage,
    li: &Layout,
    src: &CpuStorage,
    ls: &Layout,
) -> Result<CpuStorage> {
    let x = strided(src.f32s("scatter_add")?, ls)?;
    let ids = ids.indices("scatter_add", li)?;
    let (outer, size, inner) = split(shape, axis);
    let k = li.shape()[axis];
    check("scatter_add", &ids, size)?;
    let mut out = try_zeros(outer * size * inner)?;
    for o in 0..outer {
        for j in 0..k {
            for t in 0..inner {
                let p = (o * k + j) * inner + t;
                out[(o * size + ids[p] as usize) * inner + t] += x[p];
            }
        }
    }
    Ok(f32_storage(out))
}

/// Check that the values of `l` are valid u32 indices below `bound` (whole, not negative, finite,
/// below 2^32) and convert them; on the first value that is not, its flat position instead.
pub fn index_check(s: &CpuStorage, l: &Layout, bound: Option<usize>) -> Result<(CpuStorage, Option<usize>)> {
    let limit = bound.map_or(1u64 << 32, |b| (b as u64).min(1 << 32));
    let mut out: Vec<u32> = Vec::new();
    out.try_reserve_exact(l.numel())
        .map_err(|_| Error::OutOfMemory { bytes: l.numel() as u64 * 4, device: "cpu".into() })?;
    let whole = |v: f32| (v.is_finite() && v >= 0.0 && v.fract() == 0.0 && v < 4_294_967_296.0).then_some(v as u32);
    let mut bad = None;
    let mut visit = |i: usize, idx: Option<u32>| match idx {
        Some(u) if u64::from(u) < limit => {
            out.push(u);
            true
        }
        _ => {
            bad = Some(i);
            false
        }
    };
    let _ = match s {
        CpuStorage::F32(v) => l.offsets().enumerate().all(|(i, o)| visit(i, whole(v[o]))),
        CpuStorage::F16(v) => l.offsets().enumerate().all(|(i, o)| visit(i, whole(v[o].to_f32()))),
        CpuStorage::I32(v) => l.offsets().enumerate().all(|(i, o)| visit(i, u32::try_from(v[o]).ok())),
        CpuStorage::U32(v) => l.offsets().enumerate().all(|(i, o)| visit(i, Some(v[o]))),
    };
    Ok((CpuStorage::U32(std::sync::Arc::new(out)), bad))
}
