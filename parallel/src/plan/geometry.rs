//! How a linear layer's kernel can split, read from what the layer declares
//! ([`SplitRule::Linear`](weft_nn::SplitRule)) and its variables' shapes. Read by the planner
//! and by the plan check.

use super::graph::LayerNode;

/// One way to cut a kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cut {
    /// The kernel's axis.
    pub kernel: usize,
    /// Its size.
    pub size: usize,
    /// Whether the matching axis of the output (column) or input (row) is the last.
    pub last: bool,
}

/// The split axes of a kernel, with the variables' full paths.
#[derive(Debug, Clone)]
pub struct Geometry {
    /// The column split (output axis), when it keeps the function.
    pub col: Option<Cut>,
    /// The row split (input axis).
    pub row: Option<Cut>,
    /// The bias axis that follows a column split.
    pub col_bias: Option<usize>,
    /// The kernel's full path.
    pub kernel: String,
    /// The bias's full path, when the layer has one.
    pub bias: Option<String>,
    /// Variables of the layer that its declaration does not name: then it cannot split (each
    /// would see split activations yet be kept whole, and collect part of its gradient).
    pub extra: Vec<String>,
}

/// The geometry of a linear layer, with a column split ruled out where it would change the
/// function: a bias that does not span the split axis would collect only part of its gradient.
/// `None` for a layer that declares no linear split or has not built its kernel.
pub fn geometry(l: &LayerNode) -> Option<Geometry> {
    let lin = l.split.linear()?;
    let (kernel, shape, _) = l.var(&lin.kernel)?;
    let cut =
        |a: weft_nn::split::SplitAxis| shape.get(a.kernel).map(|&size| Cut { kernel: a.kernel, size, last: a.last });
    let bias = lin.bias.as_ref().and_then(|b| l.var(b));
    let col = lin.column.and_then(cut);
    // A bias follows a column split only along an axis of the split's size.
    let col_bias =
        lin.column_bias.filter(|&b| bias.is_some_and(|(_, s, _)| col.is_some_and(|c| s.get(b) == Some(&c.size))));
    let bias_ok = bias.is_none() || col_bias.is_some();
    let extra: Vec<String> =
        l.vars.iter().map(|v| &v.0).filter(|p| *p != kernel && bias.is_none_or(|b| b.0 != **p)).cloned().collect();
    let whole = !extra.is_empty();
    Some(Geometry {
        col: col.filter(|_| bias_ok && !whole),
        row: lin.row.and_then(cut).filter(|_| !whole),
        col_bias,
        kernel: kernel.clone(),
        bias: bias.map(|b| b.0.clone()),
        extra,
    })
}
