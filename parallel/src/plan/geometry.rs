//! How a Dense or EinsumDense kernel can split: which kernel axis a column or a row split cuts,
//! and which axis of the output or input that is. Read by the planner and by the plan check.

use super::graph::LayerNode;

/// The split axes of a kernel.
#[derive(Debug, Clone, Copy)]
pub struct Geometry {
    /// (kernel axis, output axis, size, output is split on its last axis)
    pub col: Option<(usize, usize, usize, bool)>,
    /// (kernel axis, input axis, size, input is split on its last axis)
    pub row: Option<(usize, usize, usize, bool)>,
    /// Bias axis that follows a column split.
    pub col_bias: Option<usize>,
}

/// The geometry of a layer, with a column split ruled out where it would change the function.
pub fn geometry(l: &LayerNode) -> Option<Geometry> {
    let g = raw_geometry(l)?;
    // A column split applies the activation to its own slice: softmax needs the whole row.
    // A bias that does not span the split letter would collect only part of its gradient.
    let elementwise = l.attr("activation").is_none_or(|a| a != "softmax");
    let bias_ok = l.var("bias").is_none() || g.col_bias.is_some();
    Some(Geometry { col: g.col.filter(|_| elementwise && bias_ok), ..g })
}

/// The geometry read from the kernel's shape (Dense) or the equation (EinsumDense).
pub fn raw_geometry(l: &LayerNode) -> Option<Geometry> {
    let kernel = &l.var("kernel")?.1;
    match l.kind.as_str() {
        "Dense" => Some(Geometry {
            col: Some((1, 0, kernel[1], true)),
            row: Some((0, 0, kernel[0], true)),
            col_bias: l.var("bias").map(|_| 0),
        }),
        "EinsumDense" => {
            let eq = l.attr("equation")?;
            let (lhs, out) = eq.split_once("->")?;
            let (inp, ker) = lhs.split_once(',')?;
            let (inp, ker, out): (Vec<char>, Vec<char>, Vec<char>) =
                (inp.chars().collect(), ker.chars().collect(), out.chars().collect());
            let col = ker.iter().enumerate().find(|(_, c)| out.contains(c) && !inp.contains(c)).map(|(k, c)| {
                let o = out.iter().position(|x| x == c).unwrap_or(0);
                (k, o, kernel[k], o + 1 == out.len())
            });
            let row = ker.iter().enumerate().find(|(_, c)| inp.contains(c) && !out.contains(c)).map(|(k, c)| {
                let i = inp.iter().position(|x| x == c).unwrap_or(0);
                (k, i, kernel[k], i + 1 == inp.len())
            });
            let col_bias = col.and_then(|(_, o, size, _)| {
                let b = &l.var("bias")?.1;
                let first = out.len().checked_sub(b.len())?;
                let axis = o.checked_sub(first)?;
                (b[axis] == size).then_some(axis)
            });
            Some(Geometry { col, row, col_bias })
        }
        _ => None,
    }
}
