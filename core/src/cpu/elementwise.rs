//! Elementwise ops on the Cpu: read any layout, write a contiguous result.

use super::{CpuStorage, f32_storage, strided, take};
use crate::ops::{BinaryOp, UnaryOp};
use crate::{DType, Layout, Result};
use half::f16;
use rayon::prelude::*;
use std::sync::Arc;

const PAR_MIN: usize = 1 << 15;

/// `op(x)` for every element.
pub fn unary(op: UnaryOp, s: &CpuStorage, l: &Layout) -> Result<CpuStorage> {
    let x = strided(s.f32s(op.name())?, l);
    let mut out = take(x.len());
    if x.len() >= PAR_MIN {
        out.par_extend(x.par_iter().map(|&v| op.apply(v)));
    } else {
        out.extend(x.iter().map(|&v| op.apply(v)));
    }
    Ok(f32_storage(out))
}

/// `op(a, b)` for two layouts of the same shape (broadcasting is done by the caller with views).
pub fn binary(
    op: BinaryOp,
    a: &CpuStorage,
    la: &Layout,
    b: &CpuStorage,
    lb: &Layout,
) -> Result<CpuStorage> {
    let x = strided(a.f32s(op.name())?, la);
    let y = strided(b.f32s(op.name())?, lb);
    let mut out = take(x.len());
    if x.len() >= PAR_MIN {
        out.par_extend(
            x.par_iter()
                .zip(y.par_iter())
                .map(|(&p, &q)| op.apply(p, q)),
        );
    } else {
        out.extend(x.iter().zip(y.iter()).map(|(&p, &q)| op.apply(p, q)));
    }
    Ok(f32_storage(out))
}

/// `mask != 0 ? a : b`, all three of one shape.
pub fn where_cond(
    m: &CpuStorage,
    lm: &Layout,
    a: &CpuStorage,
    la: &Layout,
    b: &CpuStorage,
    lb: &Layout,
) -> Result<CpuStorage> {
    let m = strided(m.f32s("where_cond")?, lm);
    let x = strided(a.f32s("where_cond")?, la);
    let y = strided(b.f32s("where_cond")?, lb);
    Ok(f32_storage(
        m.iter()
            .zip(x.iter().zip(y.iter()))
            .map(|(&c, (&p, &q))| if c != 0.0 { p } else { q })
            .collect(),
    ))
}

/// Convert to another dtype (f32 <-> f16 rounds to nearest; float -> integer truncates toward zero).
pub fn cast(s: &CpuStorage, l: &Layout, to: DType) -> Result<CpuStorage> {
    let as_f32: Vec<f32> = match s {
        CpuStorage::F32(v) => l.offsets().map(|o| v[o]).collect(),
        CpuStorage::F16(v) => l.offsets().map(|o| v[o].to_f32()).collect(),
        CpuStorage::U32(v) => l.offsets().map(|o| v[o] as f32).collect(),
        CpuStorage::I32(v) => l.offsets().map(|o| v[o] as f32).collect(),
    };
    // Integers convert directly, so values above 2^24 survive an integer-to-integer cast.
    Ok(match (s, to) {
        (CpuStorage::U32(v), DType::U32) => {
            CpuStorage::U32(Arc::new(l.offsets().map(|o| v[o]).collect()))
        }
        (CpuStorage::I32(v), DType::I32) => {
            CpuStorage::I32(Arc::new(l.offsets().map(|o| v[o]).collect()))
        }
        (CpuStorage::U32(v), DType::I32) => {
            CpuStorage::I32(Arc::new(l.offsets().map(|o| v[o] as i32).collect()))
        }
        (CpuStorage::I32(v), DType::U32) => {
            CpuStorage::U32(Arc::new(l.offsets().map(|o| v[o] as u32).collect()))
        }
        (_, DType::F32) => f32_storage(as_f32),
        (_, DType::F16) => {
            CpuStorage::F16(Arc::new(as_f32.iter().map(|&x| f16::from_f32(x)).collect()))
        }
        (_, DType::U32) => CpuStorage::U32(Arc::new(as_f32.iter().map(|&x| x as u32).collect())),
        (_, DType::I32) => CpuStorage::I32(Arc::new(as_f32.iter().map(|&x| x as i32).collect())),
    })
}

/// Copy the elements of `src` (layout `ls`) into `dst` at the positions of layout `ld` (same shape).
pub fn copy_into(src: &CpuStorage, ls: &Layout, dst: &mut [f32], ld: &Layout) -> Result<()> {
    let x = src.f32s("copy_into")?;
    for (o_src, o_dst) in ls.offsets().zip(ld.offsets()) {
        dst[o_dst] = x[o_src];
    }
    Ok(())
}

/// `n` uniform values in [0, 1) of stream `key`, starting at counter `start`.
pub fn rand_uniform(n: usize, key: u32, start: u32) -> CpuStorage {
    f32_storage(
        (0..n as u32)
            .map(|i| crate::rng::uniform(key, start.wrapping_add(i)))
            .collect(),
    )
}
