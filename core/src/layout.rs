//! Where a tensor's elements sit in its storage: shape, strides (in elements) and an offset.
//!
//! Every view (transpose, permute, broadcast, narrow, reshape of a contiguous tensor, squeeze, unsqueeze)
//! is a new `Layout` over the same storage, so views cost no copy. Kernels read any layout and write
//! contiguous outputs.

use crate::{Error, Result};
use smallvec::SmallVec;

/// A runtime shape or stride list; most tensors have at most six dimensions, so no heap allocation.
pub type Dims = SmallVec<[usize; 6]>;

/// Shape, strides and offset of a tensor in its storage. Read-only outside core: a layout is
/// only ever made by the ops that check it against its storage, so safe code cannot build one
/// that reads outside its buffer.
///
/// ```compile_fail
/// // Not public: a layout of any strides and offset could point past its storage.
/// let l = weft_core::Layout::new(Default::default(), Default::default(), 1 << 40);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Layout {
    shape: Dims,
    strides: Dims,
    offset: usize,
}

/// The number of elements of `shape`, or an `Err` naming `op` and the shape when that number does
/// not fit a `usize` (a shape like `[2, 2^63 + 3]` would otherwise wrap to a small count).
pub fn checked_numel(op: &'static str, shape: &[usize]) -> Result<usize> {
    if shape.contains(&0) {
        return Ok(0);
    }
    shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d)).ok_or_else(|| {
        Error::invalid(op, format!("shape {shape:?} has more elements than a usize can count ({})", usize::MAX))
    })
}

/// Row-major strides of a shape.
pub fn contiguous_strides(shape: &[usize]) -> Dims {
    let mut strides: Dims = SmallVec::from_elem(0, shape.len());
    let mut acc = 1;
    for i in (0..shape.len()).rev() {
        strides[i] = acc;
        acc *= shape[i];
    }
    strides
}

/// The shape two shapes broadcast to (NumPy rules), or a `ShapeMismatch` naming `op`, or an
/// `Err` when the result has more elements than a `usize` counts.
pub fn broadcast_shape(op: &'static str, a: &[usize], b: &[usize]) -> Result<Dims> {
    let rank = a.len().max(b.len());
    let mut out: Dims = SmallVec::from_elem(1, rank);
    for i in 0..rank {
        let da = if i + a.len() >= rank { a[i + a.len() - rank] } else { 1 };
        let db = if i + b.len() >= rank { b[i + b.len() - rank] } else { 1 };
        out[i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => {
                return Err(Error::ShapeMismatch { op, lhs: a.to_vec(), rhs: b.to_vec() });
            }
        };
    }
    checked_numel(op, &out)?;
    Ok(out)
}

/// Merge adjacent axes that every operand walks as one run, and drop size-1 axes: elementwise
/// kernels then loop over as few axes as possible (a contiguous tensor becomes one axis).
/// `strides` holds one stride list per operand, all of `shape`'s rank.
pub fn coalesce(shape: &[usize], strides: &[&[usize]]) -> (Dims, Vec<Dims>) {
    let mut out_shape: Dims = SmallVec::new();
    let mut out_strides: Vec<Dims> = vec![SmallVec::new(); strides.len()];
    for axis in 0..shape.len() {
        let d = shape[axis];
        if d == 1 {
            continue;
        }
        let mergeable =
            !out_shape.is_empty() && strides.iter().zip(&out_strides).all(|(s, o)| *o.last().unwrap() == s[axis] * d);
        if mergeable {
            *out_shape.last_mut().unwrap() *= d;
            for (s, o) in strides.iter().zip(out_strides.iter_mut()) {
                *o.last_mut().unwrap() = s[axis];
            }
        } else {
            out_shape.push(d);
            for (s, o) in strides.iter().zip(out_strides.iter_mut()) {
                o.push(s[axis]);
            }
        }
    }
    if out_shape.is_empty() {
        out_shape.push(1);
        for o in out_strides.iter_mut() {
            o.push(1);
        }
    }
    (out_shape, out_strides)
}

/// Resolve a possibly negative axis against a rank.
pub fn resolve_axis(op: &'static str, axis: isize, rank: usize) -> Result<usize> {
    let r = rank as isize;
    let a = if axis < 0 { axis + r } else { axis };
    if a < 0 || a >= r {
        return Err(Error::invalid(op, format!("axis {axis} is out of range for rank {rank}")));
    }
    Ok(a as usize)
}

impl Layout {
    /// A contiguous row-major layout at offset 0.
    pub fn contiguous(shape: &[usize]) -> Self {
        Layout { shape: shape.into(), strides: contiguous_strides(shape), offset: 0 }
    }

    /// A layout from its parts; the caller guarantees it stays inside the storage.
    pub(crate) fn new(shape: Dims, strides: Dims, offset: usize) -> Self {
        Layout { shape, strides, offset }
    }

    /// The first `k` axes alone, from the same offset: its offsets are where each row (`k` =
    /// rank - 1) or each matrix (`k` = rank - 2) starts.
    pub(crate) fn leading(&self, k: usize) -> Self {
        Layout { shape: self.shape[..k].into(), strides: self.strides[..k].into(), offset: self.offset }
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    /// The strides, in elements.
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }
    /// The offset of the first element, in elements.
    pub fn offset(&self) -> usize {
        self.offset
    }
    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.shape.len()
    }
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Row-major and gap-free (dimensions of size 1 may have any stride).
    pub fn is_contiguous(&self) -> bool {
        let mut acc = 1;
        for i in (0..self.rank()).rev() {
            if self.shape[i] != 1 && self.strides[i] != acc {
                return false;
            }
            acc *= self.shape[i];
        }
        true
    }

    /// Swap two axes.
    pub fn transpose(&self, a: usize, b: usize) -> Result<Self> {
        let r = self.rank();
        if a >= r || b >= r {
            return Err(Error::invalid(
                "transpose",
                format!("axes ({a}, {b}) out of range for shape {:?}", self.shape),
            ));
        }
        let mut l = self.clone();
        l.shape.swap(a, b);
        l.strides.swap(a, b);
        Ok(l)
    }

    /// Reorder axes: output axis i is input axis `dims[i]`.
    pub fn permute(&self, dims: &[usize]) -> Result<Self> {
        let r = self.rank();
        let mut seen = vec![false; r];
        if dims.len() != r || dims.iter().any(|&d| d >= r || std::mem::replace(&mut seen[d], true)) {
            return Err(Error::invalid(
                "permute",
                format!("{dims:?} is not a permutation of the axes of shape {:?}", self.shape),
            ));
        }
        Ok(Layout {
            shape: dims.iter().map(|&d| self.shape[d]).collect(),
            strides: dims.iter().map(|&d| self.strides[d]).collect(),
            offset: self.offset,
        })
    }

    /// Keep `len` entries of `axis` starting at `start`.
    pub fn narrow(&self, axis: usize, start: usize, len: usize) -> Result<Self> {
        // Checked: `start + len` must not wrap around to a small, in-bounds end.
        let end = start.checked_add(len);
        if axis >= self.rank() || end.is_none_or(|e| e > self.shape[axis]) {
            return Err(Error::invalid(
                "narrow",
                format!("{len} entries from {start} of axis {axis} are out of bounds for shape {:?}", self.shape),
            ));
        }
        let mut l = self.clone();
        l.offset += start * self.strides[axis];
        l.shape[axis] = len;
        Ok(l)
    }

    /// View with a broadcast shape: new leading axes and size-1 axes get stride 0. A shape whose
    /// element count overflows `usize` is an `Err`.
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Self> {
        checked_numel("broadcast_to", shape)?;
        let err = || Error::ShapeMismatch { op: "broadcast_to", lhs: self.shape.to_vec(), rhs: shape.to_vec() };
        if shape.len() < self.rank() {
            return Err(err());
        }
        let lead = shape.len() - self.rank();
        let mut strides: Dims = SmallVec::from_elem(0, shape.len());
        for i in 0..self.rank() {
            let (have, want) = (self.shape[i], shape[lead + i]);
            strides[lead + i] = if have == want {
                self.strides[i]
            } else if have == 1 {
                0
            } else {
                return Err(err());
            };
        }
        Ok(Layout { shape: shape.into(), strides, offset: self.offset })
    }

    /// Reinterpret with a new shape of the same size, without moving data. `None` when the
    /// strides do not allow it (a group of old axes that merges into one new axis must be
    /// gap-free); the caller then copies. A permuted view whose merged axes stay together reshapes
    /// for free, which is what lets einsum reach matmul without copies.
    pub fn reshape(&self, shape: &[usize]) -> Option<Self> {
        if checked_numel("reshape", shape).ok() != Some(self.numel()) {
            return None;
        }
        if self.is_contiguous() || self.numel() == 0 {
            return Some(Layout { shape: shape.into(), strides: contiguous_strides(shape), offset: self.offset });
        }
        // Walk old and new axes (size-1 old axes dropped), matching groups of equal product.
        let old: Vec<(usize, usize)> =
            self.shape.iter().zip(&self.strides).filter(|(d, _)| **d != 1).map(|(&d, &s)| (d, s)).collect();
        let mut strides: Dims = SmallVec::from_elem(1, shape.len());
        let (mut oi, mut ni) = (0, 0);
        while ni < shape.len() && oi < old.len() {
            let (mut np, mut op) = (shape[ni], old[oi].0);
            let (mut nj, mut oj) = (ni + 1, oi + 1);
            while np != op {
                if np < op {
                    np *= shape[nj];
                    nj += 1;
                } else {
                    op *= old[oj].0;
                    oj += 1;
                }
            }
            if (oi..oj - 1).any(|k| old[k].1 != old[k + 1].1 * old[k + 1].0) {
                return None;
            }
            strides[nj - 1] = old[oj - 1].1;
            for k in (ni + 1..nj).rev() {
                strides[k - 1] = strides[k] * shape[k];
            }
            ni = nj;
            oi = oj;
        }
        Some(Layout { shape: shape.into(), strides, offset: self.offset })
    }

    /// Insert a size-1 axis at `axis`.
    pub fn unsqueeze(&self, axis: usize) -> Result<Self> {
        if axis > self.rank() {
            return Err(Error::invalid("unsqueeze", format!("axis {axis} is out of range for shape {:?}", self.shape)));
        }
        let mut l = self.clone();
        let stride = if axis < self.rank() { self.strides[axis] * self.shape[axis] } else { 1 };
        l.shape.insert(axis, 1);
        l.strides.insert(axis, stride);
        Ok(l)
    }

    /// Remove a size-1 axis.
    pub fn squeeze(&self, axis: usize) -> Result<Self> {
        if axis >= self.rank() || self.shape[axis] != 1 {
            return Err(Error::invalid("squeeze", format!("axis {axis} of shape {:?} is not of size 1", self.shape)));
        }
        let mut l = self.clone();
        l.shape.remove(axis);
        l.strides.remove(axis);
        Ok(l)
    }

    /// Storage offsets of every element, in row-major order of the shape.
    pub fn offsets(&self) -> StridedOffsets<'_> {
        StridedOffsets {
            layout: self,
            index: SmallVec::from_elem(0, self.rank()),
            next: Some(self.offset),
            left: self.numel(),
        }
    }

    /// The largest storage offset read, plus one (0 for an empty tensor).
    pub fn extent(&self) -> usize {
        if self.numel() == 0 {
            return 0;
        }
        self.offset + self.shape.iter().zip(&self.strides).map(|(&d, &s)| (d - 1) * s).sum::<usize>() + 1
    }
}

/// Iterator over the storage offsets of a layout's elements (row-major order).
pub struct StridedOffsets<'a> {
    layout: &'a Layout,
    index: Dims,
    next: Option<usize>,
    left: usize,
}

impl Iterator for StridedOffsets<'_> {
    type Item = usize;
    fn next(&mut self) -> Option<usize> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let cur = self.next?;
        let mut off = cur;
        for d in (0..self.layout.rank()).rev() {
            self.index[d] += 1;
            off += self.layout.strides[d];
            if self.index[d] < self.layout.shape[d] {
                self.next = Some(off);
                return Some(cur);
            }
            off -= self.layout.strides[d] * self.layout.shape[d];
            self.index[d] = 0;
        }
        self.next = None;
        Some(cur)
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transpose_offsets_walk_columns() {
        let l = Layout::contiguous(&[2, 3]).transpose(0, 1).unwrap();
        assert_eq!(l.offsets().collect::<Vec<_>>(), vec![0, 3, 1, 4, 2, 5]);
        assert!(!l.is_contiguous());
    }

    #[test]
    fn broadcast_and_narrow() {
        let l = Layout::contiguous(&[3, 1]).broadcast_to(&[2, 3, 2]).unwrap();
        assert_eq!(l.offsets().collect::<Vec<_>>(), vec![0, 0, 1, 1, 2, 2, 0, 0, 1, 1, 2, 2]);
        let n = Layout::contiguous(&[4, 5]).narrow(1, 2, 2).unwrap();
        assert_eq!(n.offsets().collect::<Vec<_>>(), vec![2, 3, 7, 8, 12, 13, 17, 18]);
        assert!(Layout::contiguous(&[3, 2]).broadcast_to(&[3, 3]).is_err());
    }

    #[test]
    fn reshape_without_copy_when_strides_allow() {
        // [2, 3, 4] permuted to [3, 2, 4]: merging the last two axes is free, the first two is not.
        let p = Layout::contiguous(&[2, 3, 4]).permute(&[1, 0, 2]).unwrap();
        let merged = p.reshape(&[3, 8]);
        assert!(merged.is_none(), "axes 0 and 1 of the permuted view are not adjacent in memory");
        let q = Layout::contiguous(&[2, 3, 4]).permute(&[0, 2, 1]).unwrap(); // [2, 4, 3]
        let r = q.reshape(&[2, 12]);
        assert!(r.is_none());
        let t = Layout::contiguous(&[6, 4]).transpose(0, 1).unwrap(); // [4, 6], strides [1, 4]
        let s = t.reshape(&[4, 2, 3]).unwrap();
        assert_eq!(s.offsets().collect::<Vec<_>>(), t.offsets().collect::<Vec<_>>());
    }

    #[test]
    fn coalesce_merges_runs_shared_by_every_operand() {
        let (s, st) = coalesce(&[2, 3, 4], &[&[12, 4, 1], &[0, 0, 1]]);
        assert_eq!((s.to_vec(), st[0].to_vec(), st[1].to_vec()), (vec![6, 4], vec![4, 1], vec![0, 1]));
        let (s, st) = coalesce(&[2, 1, 3], &[&[3, 9, 1]]);
        assert_eq!((s.to_vec(), st[0].to_vec()), (vec![6], vec![1]));
        let (s, _) = coalesce(&[1, 1], &[&[1, 1]]);
        assert_eq!(s.to_vec(), vec![1]);
    }

    #[test]
    fn broadcast_shapes() {
        assert_eq!(broadcast_shape("add", &[7, 1, 3], &[5, 1]).unwrap().to_vec(), vec![7, 5, 3]);
        assert!(broadcast_shape("add", &[2, 3], &[4]).is_err());
    }
}
