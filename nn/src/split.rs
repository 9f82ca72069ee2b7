//! What a layer declares about how it may be split over the model axis of a mesh.
//!
//! The planner in weft-parallel reads only this (never a layer's kind or name): a linear map says
//! which kernel axis a column or a row split cuts and which axis of its output or input that is;
//! an embedding names its table; an attention layer names the projections that make its heads and
//! the one that takes them back. A layer of one's own that declares [`SplitRule::Heads`] is split
//! by heads exactly as the built-in `MultiHeadAttention` is.

/// An axis a split can cut: the kernel's, and whether the matching axis of the tensor it makes
/// (a column split) or takes (a row split) is that tensor's last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitAxis {
    /// The kernel's axis.
    pub kernel: usize,
    /// Whether the matching axis of the output (column) or input (row) is its last: only then
    /// can a split output flow through elementwise ops into a row-split partner, or a row split
    /// take a split input as it comes.
    pub last: bool,
}

/// A linear map through one kernel (Dense, EinsumDense, a projection of one's own).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinearSplit {
    /// The kernel variable's name (`kernel`).
    pub kernel: String,
    /// The bias variable's name, when there is one.
    pub bias: Option<String>,
    /// The output axis the kernel alone makes (Megatron's column split), when splitting it keeps
    /// the function: `None` under an activation that needs the whole row (softmax).
    pub column: Option<SplitAxis>,
    /// The bias's axis that follows a column split; `None` when the bias does not span it (the
    /// column split is then refused: each part would see only part of the bias's gradient).
    pub column_bias: Option<usize>,
    /// The input axis the kernel sums over (a row split: partial sums, then one all-reduce).
    pub row: Option<SplitAxis>,
}

/// Attention split by heads: every projection that makes heads is split by whole heads (a column
/// split), each device attends with its heads, and the projection back is split by the same heads
/// (a row split, one all-reduce).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeadSplit {
    /// The number of heads.
    pub heads: usize,
    /// The sublayers (by name) that project the inputs to heads, each a [`SplitRule::Linear`]
    /// whose column axis holds the heads: an axis of exactly `heads` entries, or the last axis
    /// with the heads flat and head-major (`heads x head_dim`, as a Dense makes them; a fused
    /// query-key-value projection is three projections, not one). Nothing else inside the layer
    /// may have variables, or it is kept whole.
    pub projections: Vec<String>,
    /// The sublayer (by name) that takes the heads back, a [`SplitRule::Linear`] whose row axis
    /// holds them.
    pub output: String,
    /// The heads axis of the tensors the layer makes in between (scores, probabilities): a
    /// dropout on them is split along it.
    pub inner_axis: usize,
}

/// How a layer may be split, as [`Layer::split_rule`](crate::Layer::split_rule) declares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SplitRule {
    /// Stays whole on every device; `why` is shown in the plan (a layer norm normalises over
    /// the whole width, a layer of one's own declares nothing).
    Whole {
        /// Why.
        why: String,
    },
    /// A linear map: column- or row-split candidates.
    Linear(LinearSplit),
    /// An embedding table split by vocabulary rows (axis 0): masked lookups, one all-reduce.
    /// The layer builds its table with [`tp::variable`](crate::tp::variable) and looks ids up
    /// with [`tp::lookup`](crate::tp::lookup), which runs its part under `Style::Vocab` (look up
    /// the ids this rank holds, zero the rest, all-reduce), as `Embedding` does.
    Vocab {
        /// The table variable's name.
        table: String,
    },
    /// A projection onto an embedding's table (read from the embedding, no variables of its
    /// own): split by columns exactly as that table is split by vocabulary.
    Tied,
    /// Attention by heads.
    Heads(HeadSplit),
    /// No variables, and runs on a tensor split along its last axis as it comes when told
    /// where the split is (`Style::Split`): dropout draws its mask for the whole tensor and keeps
    /// its part, a reshape that keeps the last axis reshapes to its part of it. The layer reads
    /// where its part lies with [`tp::part`](crate::tp::part); a layer with variables that
    /// declares it is kept whole.
    Pointwise,
}

impl SplitRule {
    /// What a layer that declares nothing gets.
    pub fn undeclared(kind: &str) -> Self {
        SplitRule::Whole { why: format!("{kind} declares no split") }
    }
    /// The linear declaration, if this is one.
    pub fn linear(&self) -> Option<&LinearSplit> {
        match self {
            SplitRule::Linear(l) => Some(l),
            _ => None,
        }
    }
}
