//! Tracing: with tracing on, every op records a node (kind, inputs, output shape, and the path of
//! the layer scope it ran in). nn opens a scope per layer call; the parallel planner reads the
//! graph of a model run on the Meta device, so no data is ever allocated.

use crate::backprop::Op;
use crate::{DType, Result, TensorId};
use std::cell::RefCell;

/// One recorded op.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceNode {
    /// The output tensor.
    pub id: TensorId,
    /// Op kind, e.g. `matmul`, `unary/gelu_tanh`, `broadcast`.
    pub kind: String,
    /// Input tensors, in order.
    pub inputs: Vec<TensorId>,
    /// Output shape.
    pub shape: Vec<usize>,
    /// Output dtype.
    pub dtype: DType,
    /// The layer scope path, e.g. `block_0/mlp/up` (empty outside any scope).
    pub scope: String,
}

thread_local! {
    static TRACE: RefCell<Option<Vec<TraceNode>>> = const { RefCell::new(None) };
    static SCOPE: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

/// Keeps a scope open until dropped.
#[must_use = "the scope closes when this guard is dropped"]
pub struct ScopeGuard(());

impl Drop for ScopeGuard {
    fn drop(&mut self) {
        SCOPE.with(|s| s.borrow_mut().pop());
    }
}

/// Open a named scope; ops run while the guard lives are recorded under `outer/.../name`.
pub fn scope(name: &str) -> ScopeGuard {
    SCOPE.with(|s| s.borrow_mut().push(name.to_string()));
    ScopeGuard(())
}

/// Keeps a scope set by [`scope_at`] until dropped, then restores the one before it.
#[must_use = "the scope closes when this guard is dropped"]
pub struct PathGuard(Option<Vec<String>>);

impl Drop for PathGuard {
    fn drop(&mut self) {
        if let Some(prev) = self.0.take() {
            SCOPE.with(|s| *s.borrow_mut() = prev);
        }
    }
}

/// Set the whole scope path (`outer/.../name`) whatever scope is open, until the guard drops.
/// nn uses it to give a layer its path in the model even when a container around it opened no
/// scope of its own.
///
/// ```
/// use weft_core::trace;
/// let _outer = trace::scope("elsewhere");
/// {
///     let _g = trace::scope_at("model/block/dense");
///     assert_eq!(trace::current_scope(), "model/block/dense");
/// }
/// assert_eq!(trace::current_scope(), "elsewhere");
/// ```
pub fn scope_at(path: &str) -> PathGuard {
    let new: Vec<String> = if path.is_empty() { Vec::new() } else { path.split('/').map(str::to_string).collect() };
    PathGuard(Some(SCOPE.with(|s| std::mem::replace(&mut *s.borrow_mut(), new))))
}

/// The current scope path, segments joined by `/`.
pub fn current_scope() -> String {
    SCOPE.with(|s| s.borrow().join("/"))
}

/// Run `f` with tracing on and return its result with the recorded nodes, in execution order.
///
/// ```
/// use weft_core::{trace, Device, Tensor};
/// let x = Tensor::zeros(&[4, 8], &Device::Meta)?;
/// let w = Tensor::zeros(&[8, 16], &Device::Meta)?;
/// let (y, nodes) = trace::trace(|| {
///     let _s = trace::scope("dense");
///     x.matmul(&w)?.relu()
/// })?;
/// assert_eq!(y.dims(), &[4, 16]);
/// assert_eq!(nodes.iter().map(|n| n.kind.as_str()).collect::<Vec<_>>(), ["matmul", "unary/relu"]);
/// assert_eq!(nodes[0].scope, "dense");
/// # Ok::<(), weft_core::Error>(())
/// ```
pub fn trace<T>(f: impl FnOnce() -> Result<T>) -> Result<(T, Vec<TraceNode>)> {
    let prev = TRACE.with(|t| t.borrow_mut().replace(Vec::new()));
    let out = f();
    let nodes = TRACE.with(|t| std::mem::replace(&mut *t.borrow_mut(), prev)).unwrap_or_default();
    Ok((out?, nodes))
}

pub(crate) fn record(id: TensorId, op: &Op, shape: &[usize], dtype: DType) {
    TRACE.with(|t| {
        if let Some(nodes) = t.borrow_mut().as_mut() {
            nodes.push(TraceNode {
                id,
                kind: op.kind(),
                inputs: op.inputs().iter().map(|i| i.id()).collect(),
                shape: shape.to_vec(),
                dtype,
                scope: current_scope(),
            });
        }
    });
}
