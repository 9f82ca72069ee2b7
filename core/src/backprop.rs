//! Reverse-mode autograd. Each tensor made by an op keeps an [`Op`]: the inputs and what was done.
//! `backward` sorts the graph from the loss, walks it in reverse, and asks each op for the
//! gradients of its inputs, adding them up when a tensor is used more than once.

use crate::ops::{BinaryOp, GradFrom, ReduceOp, UnaryOp};
use crate::slice_grads::SliceGrad;
use crate::{DType, Error, Result, Tensor, TensorId};
use std::cell::Cell;
// Keyed by tensor ids, which no one picks: Fx's one multiply a key instead of SipHash (hashing
// was about 6% of a small MLP's training step).
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::sync::Arc;

/// A backward function for ops defined outside core (collectives, custom layers): given the
/// output's gradient, the gradient of each input (`None` where it has none).
pub type BackwardFn = Arc<dyn Fn(&Tensor) -> Result<Vec<Option<Tensor>>> + Send + Sync>;

/// How a tensor was made.
#[derive(Clone)]
pub enum Op {
    /// An elementwise unary op.
    Unary(Tensor, UnaryOp),
    /// An elementwise binary op (operands already broadcast).
    Binary(Tensor, Tensor, BinaryOp),
    /// `op(a + b)` in one pass (a layer's bias and activation; operands already broadcast).
    AddUnary(Tensor, Tensor, UnaryOp),
    /// Keepdim reduction over the axes.
    Reduce(Tensor, ReduceOp, Vec<usize>),
    /// Batched matmul (operands already broadcast).
    Matmul(Tensor, Tensor),
    /// `op(x @ w + b)` in one op, for `x` `[m, k]`, `w` `[k, n]` and `b` `[1, n]` (a dense layer in
    /// training on the Cpu or a GPU: see [`Tensor::matmul_add_unary`]), `op` one whose gradient is read
    /// from its output (identity, relu, tanh, sigmoid, exp).
    Dense {
        /// The layer's input.
        x: Tensor,
        /// Its kernel.
        w: Tensor,
        /// Its bias, as `[1, n]` (a view of its own per use).
        b: Tensor,
        /// Its activation.
        op: UnaryOp,
    },
    /// A reshape, squeeze or unsqueeze.
    Reshape(Tensor),
    /// An axis permutation.
    Permute(Tensor, Vec<usize>),
    /// A broadcast view.
    Broadcast(Tensor),
    /// Input, axis, start.
    Narrow(Tensor, usize, usize),
    /// A contiguous copy.
    Copy(Tensor),
    /// A dtype conversion.
    Cast(Tensor),
    /// A copy to another device.
    ToDevice(Tensor),
    /// Softmax over the last axis.
    Softmax(Tensor),
    /// Log-softmax over the last axis.
    LogSoftmax(Tensor),
    /// Layer norm over the last axis.
    LayerNorm {
        /// Input.
        x: Tensor,
        /// Scale.
        gamma: Tensor,
        /// Shift.
        beta: Tensor,
        /// Added to the variance.
        eps: f32,
    },
    /// Source, ids, axis.
    IndexSelect(Tensor, Tensor, usize),
    /// torch.gather: source, ids, axis.
    Gather(Tensor, Tensor, usize),
    /// Adjoint of index_select: source rows, ids, axis.
    IndexAdd(Tensor, Tensor, usize),
    /// Adjoint of gather: source, ids, axis.
    ScatterAdd(Tensor, Tensor, usize),
    /// Concatenation along an axis.
    Concat(Vec<Tensor>, usize),
    /// Mask (no gradient), on_true, on_false.
    Where(Tensor, Tensor, Tensor),
    /// An op defined elsewhere, with its own backward.
    Custom {
        /// Name shown in traces.
        name: &'static str,
        /// Inputs, in the order `backward` returns their gradients.
        inputs: Vec<Tensor>,
        /// Output gradient to input gradients.
        backward: BackwardFn,
    },
}

impl Op {
    /// The inputs, in order.
    pub fn inputs(&self) -> Vec<&Tensor> {
        use Op::*;
        match self {
            Unary(x, _)
            | Reduce(x, ..)
            | Reshape(x)
            | Permute(x, _)
            | Broadcast(x)
            | Narrow(x, ..)
            | Copy(x)
            | Cast(x)
            | ToDevice(x)
            | Softmax(x)
            | LogSoftmax(x) => vec![x],
            Binary(a, b, _) | AddUnary(a, b, _) | Matmul(a, b) => vec![a, b],
            IndexSelect(x, i, _) | Gather(x, i, _) | IndexAdd(x, i, _) | ScatterAdd(x, i, _) => {
                vec![x, i]
            }
            LayerNorm { x, gamma, beta, .. } => vec![x, gamma, beta],
            Dense { x, w, b, .. } => vec![x, w, b],
            Concat(xs, _) => xs.iter().collect(),
            Where(m, a, b) => vec![m, a, b],
            Custom { inputs, .. } => inputs.iter().collect(),
        }
    }

    /// A short name for traces and summaries, e.g. `matmul`, `unary/relu`.
    pub fn kind(&self) -> String {
        use Op::*;
        match self {
            Unary(_, op) => format!("unary/{}", op.name()),
            Binary(_, _, op) => format!("binary/{}", op.name()),
            AddUnary(_, _, op) => format!("add_unary/{}", op.name()),
            Reduce(_, op, _) => format!("reduce/{}", op.name()),
            Matmul(..) => "matmul".into(),
            Dense { op, .. } => format!("dense/{}", op.name()),
            Reshape(_) => "reshape".into(),
            Permute(..) => "permute".into(),
            Broadcast(_) => "broadcast".into(),
            Narrow(..) => "narrow".into(),
            Copy(_) => "copy".into(),
            Cast(_) => "cast".into(),
            ToDevice(_) => "to_device".into(),
            Softmax(_) => "softmax".into(),
            LogSoftmax(_) => "log_softmax".into(),
            LayerNorm { .. } => "layer_norm".into(),
            IndexSelect(..) => "index_select".into(),
            Gather(..) => "gather".into(),
            IndexAdd(..) => "index_add".into(),
            ScatterAdd(..) => "scatter_add".into(),
            Concat(..) => "concat".into(),
            Where(..) => "where".into(),
            Custom { name, .. } => (*name).into(),
        }
    }
}

thread_local! {
    static GRAD_ENABLED: Cell<bool> = const { Cell::new(true) };
    static IN_BACKWARD: Cell<bool> = const { Cell::new(false) };
}

/// Whether this thread is computing a backward pass (which records no gradients either): the Cpu
/// keeps packed copies of right matrices only outside it, since a training step's weights are new
/// storage every step.
pub(crate) fn in_backward() -> bool {
    IN_BACKWARD.with(|b| b.get())
}

/// Whether ops on this thread record their backward.
pub fn grad_enabled() -> bool {
    GRAD_ENABLED.with(|g| g.get())
}

/// Inference: no gradient recorded and outside a backward pass, where the Cpu keeps packed
/// copies of a product's right matrix (a model's weights) in their storage.
pub(crate) fn inference() -> bool {
    !grad_enabled() && !in_backward()
}

/// Run `f` without recording gradients (inference, optimizer updates).
///
/// ```
/// # use weft_core::{no_grad, Device, Tensor, Var};
/// let w = Var::new(Tensor::ones(&[2], &Device::Cpu)?)?;
/// let y = no_grad(|| w.as_tensor().mul_scalar(3.0))?;
/// assert!(!y.tracks_grad());
/// # Ok::<(), weft_core::Error>(())
/// ```
pub fn no_grad<T>(f: impl FnOnce() -> T) -> T {
    with_flag(&GRAD_ENABLED, false, f)
}

/// Run `f` with this thread's `flag` set to `value`, put back as it was afterwards (also when `f`
/// panics).
fn with_flag<T>(flag: &'static std::thread::LocalKey<Cell<bool>>, value: bool, f: impl FnOnce() -> T) -> T {
    struct Restore(&'static std::thread::LocalKey<Cell<bool>>, bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            self.0.with(|c| c.set(self.1));
        }
    }
    let _restore = Restore(flag, flag.with(|c| c.replace(value)));
    f()
}

/// Gradients keyed by tensor id.
#[derive(Default, Clone, Debug)]
pub struct GradStore {
    grads: HashMap<TensorId, Tensor>,
    /// Gradients left as the operands of a product (see [`Tensor::backward_deferring`]; during
    /// the pass also a dense layer's output's, until the layer works it out: `fuses_backward`).
    products: HashMap<TensorId, (Tensor, Tensor)>,
}

/// The gradients of slices of tensors, keyed by the sliced tensor's id, waiting to be put together
/// once that tensor's gradient is complete (see [`crate::slice_grads`]).
#[derive(Default)]
struct PendingSlices(HashMap<TensorId, (Tensor, Vec<SliceGrad>)>);

impl PendingSlices {
    fn push(&mut self, source: &Tensor, slice: SliceGrad) {
        self.0.entry(source.id()).or_insert_with(|| (source.clone(), Vec::new())).1.push(slice);
    }

    /// Add the slices of `id`'s tensor, put together, to its gradient in `store`.
    fn settle(&mut self, id: TensorId, store: &mut GradStore) -> Result<()> {
        if let Some((source, slices)) = self.0.remove(&id) {
            store.accumulate(&source, crate::slice_grads::assemble(source.dims(), slices)?)?;
        }
        Ok(())
    }
}

impl GradStore {
    /// The gradient of `t`, if it received one (and it was not left as a [`product`](Self::product)).
    pub fn get(&self, t: &Tensor) -> Option<&Tensor> {
        self.grads.get(&t.id())
    }
    /// The gradient of the tensor with this id.
    pub fn get_id(&self, id: TensorId) -> Option<&Tensor> {
        self.grads.get(&id)
    }
    /// The operands `(lhs, rhs)` of `t`'s gradient where [`Tensor::backward_deferring`] left it
    /// as the product `lhs @ rhs`, not worked out (and not in [`get`](Self::get)).
    pub fn product(&self, t: &Tensor) -> Option<(&Tensor, &Tensor)> {
        self.products.get(&t.id()).map(|(l, r)| (l, r))
    }
    /// The gradient of `t`, with a product left by [`Tensor::backward_deferring`] worked out.
    pub fn resolve(&self, t: &Tensor) -> Result<Option<Tensor>> {
        match (self.get(t), self.product(t)) {
            (Some(g), _) => Ok(Some(g.clone())),
            (None, Some((l, r))) => GradStore::multiply(l, r).map(Some),
            (None, None) => Ok(None),
        }
    }
    /// Works out a product [`Tensor::backward_deferring`] left, as the backward pass would have:
    /// the same kernel, so the same bits (outside a backward pass, a product of few rows may
    /// take the Cpu's inference kernel, which sums in another order).
    pub fn multiply(lhs: &Tensor, rhs: &Tensor) -> Result<Tensor> {
        with_flag(&IN_BACKWARD, true, || no_grad(|| lhs.matmul(rhs)))
    }
    /// Remove and return the gradient of `t` (one left as a [`product`](Self::product) is
    /// dropped, not worked out: [`resolve`](Self::resolve) it first).
    pub fn remove(&mut self, t: &Tensor) -> Option<Tensor> {
        self.products.remove(&t.id());
        self.grads.remove(&t.id())
    }
    /// Set the gradient of `t`.
    pub fn insert(&mut self, t: &Tensor, grad: Tensor) {
        self.products.remove(&t.id());
        self.grads.insert(t.id(), grad);
    }
    /// Number of gradients held (products included).
    pub fn len(&self) -> usize {
        self.grads.len() + self.products.len()
    }
    /// Whether no gradient is held.
    pub fn is_empty(&self) -> bool {
        self.grads.is_empty() && self.products.is_empty()
    }
    fn accumulate(&mut self, t: &Tensor, g: Tensor) -> Result<()> {
        // A product left as one is worked out first: the sum is the one an undeferred pass adds.
        let prev = match self.products.remove(&t.id()) {
            Some((l, r)) => Some(GradStore::multiply(&l, &r)?),
            None => self.grads.remove(&t.id()),
        };
        let g = match prev {
            Some(prev) => prev.add(&g)?,
            None => g,
        };
        self.grads.insert(t.id(), g);
        Ok(())
    }

    /// Leaves `t`'s gradient as `lhs @ rhs` when it has received none yet; else `false` (the
    /// caller works it out and adds it).
    fn defer(&mut self, t: &Tensor, lhs: Tensor, rhs: Tensor) -> bool {
        if self.grads.contains_key(&t.id()) || self.products.contains_key(&t.id()) {
            return false;
        }
        self.products.insert(t.id(), (lhs, rhs));
        true
    }
}

/// Tensors reachable from `root` that take part in the gradient, parents after children reversed:
/// the returned order lists every tensor after all tensors computed from it.
fn sorted_nodes(root: &Tensor) -> Vec<Tensor> {
    let mut order = Vec::new();
    let mut seen = HashSet::default();
    // Iterative post-order DFS, so deep graphs (long RNN-like chains) cannot overflow the stack.
    let mut stack: Vec<(Tensor, bool)> = vec![(root.clone(), false)];
    while let Some((t, expanded)) = stack.pop() {
        if expanded {
            order.push(t);
            continue;
        }
        if !seen.insert(t.id()) {
            continue;
        }
        stack.push((t.clone(), true));
        if let Some(op) = t.op() {
            for i in op.inputs() {
                if i.tracks_grad() && !seen.contains(&i.id()) {
                    stack.push((i.clone(), false));
                }
            }
        }
    }
    order.reverse();
    order
}

impl Tensor {
    /// Gradients of this scalar with respect to every tensor it depends on (vars included). A
    /// loss that ends in affine ops and negations (`mean`'s scale, `neg`) seeds their input with
    /// the constant gradient they pass it (the same bits, fewer ops); the loss then has no entry
    /// ([`backward_with`](Tensor::backward_with) runs every op and keeps it).
    ///
    /// ```
    /// # use weft_core::{Device, Tensor, Var};
    /// let w = Var::new(Tensor::from_vec(vec![3f32], &[1], &Device::Cpu)?)?;
    /// let loss = w.as_tensor().square()?.sum_all()?; // w^2
    /// let grads = loss.backward()?;
    /// assert_eq!(grads.get(w.as_tensor()).unwrap().to_vec::<f32>()?, vec![6.0]);
    /// # Ok::<(), weft_core::Error>(())
    /// ```
    pub fn backward(&self) -> Result<GradStore> {
        self.backward_deferring(&[])
    }

    /// Backward from this tensor with a given output gradient of its shape.
    pub fn backward_with(&self, grad: Tensor) -> Result<GradStore> {
        self.backward_from(grad, &HashSet::default())
    }

    /// [`backward`](Tensor::backward), except that the gradient of each tensor of `defer` that
    /// is a leaf (a variable) used once, as an operand of a 2-D matrix product (a dense layer's
    /// kernel), is left as the operands of the product that makes it (`x^T`, `dy`: see
    /// [`GradStore::product`]) rather than worked out: an optimizer that can fuse it with its
    /// update ([`Tensor::adam_step_of_product`]) then never stores it. Only where those operands
    /// are no larger than the gradient (a batch of rows no longer than the layer is wide), so
    /// that keeping them costs no memory. Used more than once, a tensor's gradient is worked out
    /// and summed as `backward` does: the same values.
    ///
    /// ```
    /// # use weft_core::{Device, Tensor, Var};
    /// let dev = Device::Cpu;
    /// let w = Var::new(Tensor::rand(-1.0, 1.0, &[8, 8], 1, &dev)?)?;
    /// let x = Tensor::rand(-1.0, 1.0, &[2, 8], 2, &dev)?; // 2 rows: x^T and dy are smaller than dw
    /// let loss = x.matmul(w.as_tensor())?.square()?.sum_all()?;
    /// let grads = loss.backward_deferring(&[w.as_tensor()])?;
    /// assert!(grads.get(w.as_tensor()).is_none());
    /// let (lhs, rhs) = grads.product(w.as_tensor()).unwrap();
    /// let whole = loss.backward()?;
    /// let want = whole.get(w.as_tensor()).unwrap().to_vec::<f32>()?;
    /// assert_eq!(lhs.matmul(rhs)?.to_vec::<f32>()?, want);
    /// # Ok::<(), weft_core::Error>(())
    /// ```
    pub fn backward_deferring(&self, defer: &[&Tensor]) -> Result<GradStore> {
        if self.numel() != 1 {
            return Err(Error::invalid("backward", format!("needs a one-element loss, got shape {:?}", self.dims())));
        }
        let leaves = defer.iter().filter(|t| t.op().is_none()).map(|t| t.id()).collect();
        // A loss that ends in affine ops and negations (a mean's 1/n, a sign) passes its input a
        // constant gradient: that tensor is seeded with it (one fill) instead of the loss with 1
        // and a dispatch per op on a GPU. The constant is worked out as their backward would
        // (`g * mul + 0`, `-g`, outermost first): the same bits, but where a GPU's kernels would
        // flush a subnormal product to zero. The loss itself then has no entry in the store.
        let (mut root, mut scale) = (self.clone(), 1.0f32);
        loop {
            let (x, next) = match root.op() {
                Some(Op::Unary(x, UnaryOp::Affine { mul, .. })) => (x, scale * mul + 0.0),
                Some(Op::Unary(x, UnaryOp::Neg)) => (x, -scale),
                _ => break,
            };
            if !x.tracks_grad() {
                break;
            }
            (scale, root) = (next, x.clone());
        }
        root.backward_from(Tensor::full(scale, root.dims(), root.device())?, &leaves)
    }

    /// Backward from `grad`, the gradients of `defer`'s tensors left as products where they can be.
    fn backward_from(&self, grad: Tensor, defer: &HashSet<TensorId>) -> Result<GradStore> {
        if grad.dims() != self.dims() {
            return Err(Error::ShapeMismatch { op: "backward", lhs: self.dims().to_vec(), rhs: grad.dims().to_vec() });
        }
        with_flag(&IN_BACKWARD, true, || {
            no_grad(|| {
                let mut store = GradStore::default();
                let mut slices = PendingSlices::default();
                store.insert(self, grad);
                for node in sorted_nodes(self) {
                    let Some(op) = node.op() else { continue };
                    // Every use of `node` is later in the graph, so its slices have all arrived.
                    slices.settle(node.id(), &mut store)?;
                    // Vars keep their gradient; intermediate gradients are dropped once used. A
                    // dense layer's output may have received its gradient as a product, left
                    // for the layer to work out with its backward (see below).
                    let incoming = match (store.get(&node), store.product(&node)) {
                        (Some(g), _) => Incoming::Tensor(g.clone()),
                        (None, Some((l, r))) => Incoming::Product(l.clone(), r.clone()),
                        (None, None) => continue,
                    };
                    if !node.is_var() && node.id() != self.id() {
                        store.remove(&node);
                    }
                    if let Op::Narrow(x, axis, start) = op {
                        if x.tracks_grad() {
                            slices.push(x, SliceGrad { axis: *axis, start: *start, grad: incoming.resolve()? });
                        }
                        continue;
                    }
                    // A dense layer: the activation's and the bias's gradients first (one pass),
                    // then the product's, as for a matmul node (whose kernel's may be deferred).
                    let product;
                    let (op, g) = match op {
                        Op::Dense { x, w, b, op: act } => {
                            let (d, db) = match incoming {
                                Incoming::Tensor(g) => dense_grads(*act, &node, &g)?,
                                Incoming::Product(l, r) => dense_grads_of_product(*act, &node, &l, &r)?,
                            };
                            if b.tracks_grad() {
                                store.accumulate(b, db.reshape(b.dims())?)?;
                            }
                            product = Op::Matmul(x.clone(), w.clone());
                            (&product, d)
                        }
                        _ => (op, incoming.resolve()?),
                    };
                    // Only inputs that take part in the gradient get one: the data fed to a model's
                    // first layer does not, and its matmul gradient is the largest of the step.
                    let inputs = op.inputs();
                    let mut need: smallvec::SmallVec<[bool; 4]> = inputs.iter().map(|i| i.tracks_grad()).collect();
                    if let Op::Matmul(a, b) = op
                        && !defer.is_empty()
                        && a.rank() == 2
                        && b.rank() == 2
                    {
                        // d(a @ b)/db = a^T @ g and d/da = g @ b^T, left as products where the
                        // operands kept are no larger than the gradient they stand for (else
                        // deferring would raise the step's peak memory). Snapshots: an operand
                        // that is a variable (or a view of one) keeps the values it had, whatever
                        // the optimizer sets later.
                        let (m, k, n) = (a.dims()[0], a.dims()[1], b.dims()[1]);
                        if need[1]
                            && defer.contains(&b.id())
                            && m * (k + n) <= k * n
                            && store.defer(b, a.t()?.snapshot(), g.snapshot())
                        {
                            need[1] = false;
                        }
                        if need[0]
                            && defer.contains(&a.id())
                            && n * (m + k) <= m * k
                            && store.defer(a, g.snapshot(), b.t()?.snapshot())
                        {
                            need[0] = false;
                        }
                    }
                    // The gradient of a dense layer's output read by this product (`a`) is left as
                    // the product `g @ b^T` while nothing else has added to it: the layer works it
                    // out with its activation's and bias's gradients (`dense_grads_of_product`),
                    // never storing it. A reader that comes later adds to the worked-out product,
                    // as an undeferred pass would. (`g` lives on until the layer's turn, most
                    // often the next node; `b^T` is a view.)
                    if let Op::Matmul(a, b) = op
                        && need[0]
                        && fuses_backward(a, &g)
                        && b.rank() == 2
                        && store.defer(a, g.clone(), b.t()?)
                    {
                        need[0] = false;
                    }
                    let grads = input_grads(op, &node, &g, &need)?;
                    for ((input, gi), need) in inputs.into_iter().zip(grads).zip(need) {
                        if let Some(gi) = gi.filter(|_| need) {
                            store.accumulate(input, gi)?;
                        }
                    }
                }
                // Leaves (vars, inputs) are never nodes with an op: their slices settle here.
                let ids: Vec<TensorId> = slices.0.keys().copied().collect();
                for id in ids {
                    slices.settle(id, &mut store)?;
                }
                Ok(store)
            })
        })
    }
}

/// Sum `g` (of a broadcast shape) back down to `shape`.
pub(crate) fn reduce_to(g: &Tensor, shape: &[usize]) -> Result<Tensor> {
    if g.dims() == shape {
        return Ok(g.clone());
    }
    let lead = g.rank() - shape.len();
    let mut axes: Vec<isize> = (0..lead as isize).collect();
    for (i, &d) in shape.iter().enumerate() {
        if d == 1 && g.dims()[lead + i] != 1 {
            axes.push((lead + i) as isize);
        }
    }
    g.sum(&axes, true)?.reshape(shape)
}

/// 1 where lo < x < hi, else 0.
fn open_interval(x: &Tensor, lo: f32, hi: f32) -> Result<Tensor> {
    x.cmp_scalar(BinaryOp::Gt, lo)?.mul(&x.cmp_scalar(BinaryOp::Lt, hi)?)
}

/// `d`, with NaN where `x` is NaN: comparisons give 0 for NaN, which would turn a NaN input into
/// a silent zero gradient; step keeps NaN, so this adds 0, or NaN.
fn keep_nan(x: &Tensor, d: Tensor) -> Result<Tensor> {
    d.add(&x.unary(UnaryOp::Step)?.mul_scalar(0.0)?)
}

/// Whether `unary_grad` of `op` reads only its output (then `x` may be given as the output).
pub(crate) fn reads_output_only(op: UnaryOp) -> bool {
    use UnaryOp as U;
    matches!(op, U::Identity | U::Exp | U::Tanh | U::Sigmoid | U::Relu)
}

/// The gradient of `op`'s input `x` given its output `out` and the output's gradient `g` (`None`
/// for the ops with none): in one pass for the activations ([`Tensor::unary_backward`]), else
/// as the tensor ops of [`composed_unary_grad`].
pub(crate) fn unary_grad(op: UnaryOp, x: &Tensor, out: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
    if let Some(from) = op.fused_grad()
        && g.dtype() == DType::F32
    {
        let v = if from == GradFrom::Output { out } else { x };
        if v.dtype() == DType::F32 && v.dims() == g.dims() {
            return Ok(Some(v.unary_backward(op, g)?));
        }
    }
    composed_unary_grad(op, x, out, g)
}

/// [`unary_grad`] as tensor ops, a pass each (the activations' one-pass gradients give these
/// values to the bit on the Cpu: a test holds them to it).
pub(crate) fn composed_unary_grad(op: UnaryOp, x: &Tensor, out: &Tensor, g: &Tensor) -> Result<Option<Tensor>> {
    use UnaryOp as U;
    Ok(Some(match op {
        U::Identity => g.clone(),
        U::Neg => g.neg()?,
        U::Abs => g.mul(&x.sign()?)?,
        U::Exp => g.mul(out)?,
        U::Log => g.div(x)?,
        U::Sqrt => g.div(out)?.mul_scalar(0.5)?,
        U::Rsqrt => g.mul(&out.div(x)?)?.mul_scalar(-0.5)?,
        U::Square => g.mul(x)?.mul_scalar(2.0)?,
        U::Recip => g.mul(&out.square()?)?.neg()?,
        U::Tanh => g.mul(&out.square()?.affine(-1.0, 1.0)?)?,
        U::Sigmoid => g.mul(&out.mul(&out.affine(-1.0, 1.0)?)?)?,
        // step(NaN) is NaN, so a NaN input gives a NaN gradient, not a silent zero.
        U::Relu => g.mul(&x.unary(U::Step)?)?,
        U::GeluTanh => {
            // With u = C (x + 0.044715 x³) and s = sigmoid(2u) (so tanh(u) = 2s - 1):
            // d/dx = s + 2 x s (1 - s) du/dx.
            const C: f32 = 0.797_884_6;
            let x2 = x.square()?;
            let s = x.mul(&x2.affine(0.044715, 1.0)?)?.mul_scalar(2.0 * C)?.sigmoid()?;
            let du = x2.affine(3.0 * 0.044715 * C, C)?;
            let right = x.mul(&s.mul(&s.affine(-1.0, 1.0)?)?)?.mul(&du)?.mul_scalar(2.0)?;
            g.mul(&s.add(&right)?)?
        }
        U::GeluErf => {
            let cdf = x.mul_scalar(std::f32::consts::FRAC_1_SQRT_2)?.erf()?.affine(0.5, 0.5)?;
            let pdf = x.square()?.mul_scalar(-0.5)?.exp()?.mul_scalar(0.398_942_3)?;
            g.mul(&cdf.add(&x.mul(&pdf)?)?)?
        }
        U::Silu => {
            let s = x.sigmoid()?;
            g.mul(&s.mul(&x.mul(&s.affine(-1.0, 1.0)?)?.add_scalar(1.0)?)?)?
        }
        U::Sin => g.mul(&x.cos()?)?,
        U::Cos => g.mul(&x.sin()?)?.neg()?,
        U::Step | U::Sign => return Ok(None),
        U::Erf => g.mul(&x.square()?.neg()?.exp()?.mul_scalar(std::f32::consts::FRAC_2_SQRT_PI)?)?,
        U::Softsign => g.mul(&x.abs()?.add_scalar(1.0)?.square()?.recip()?)?,
        U::Softplus => g.mul(&x.sigmoid()?)?,
        U::LogSigmoid => g.mul(&x.sigmoid()?.affine(-1.0, 1.0)?)?,
        U::Mish => {
            let t = x.softplus()?.tanh()?;
            let right = x.mul(&t.square()?.affine(-1.0, 1.0)?)?.mul(&x.sigmoid()?)?;
            g.mul(&t.add(&right)?)?
        }
        // The kinks take the flat side's gradient (0), as JAX's relu6 and hard_sigmoid.
        U::Relu6 => g.mul(&keep_nan(x, open_interval(x, 0.0, 6.0)?)?)?,
        U::HardSigmoid => g.mul(&keep_nan(x, open_interval(x, -3.0, 3.0)?.mul_scalar(1.0 / 6.0)?)?)?,
        U::HardSilu => {
            let slope = open_interval(x, -3.0, 3.0)?.mul(x)?.mul_scalar(1.0 / 6.0)?;
            g.mul(&keep_nan(x, x.hard_sigmoid()?.add(&slope)?)?)?
        }
        U::LeakyRelu(a) => {
            let pos = x.cmp_scalar(BinaryOp::Ge, 0.0)?;
            g.mul(&keep_nan(x, pos.affine(1.0 - a, a)?)?)?
        }
        U::Elu(a) => {
            // 1 where x > 0, else a e^x (from e^min(x, 0), which never overflows).
            let pos = x.unary(U::Step)?;
            let neg = x.clamp(f32::NEG_INFINITY, 0.0)?.exp()?.mul_scalar(a)?;
            g.mul(&pos.add(&pos.affine(-1.0, 1.0)?.mul(&neg)?)?)?
        }
        U::Affine { mul, .. } => g.mul_scalar(mul)?,
        U::Powf(e) => g.mul(&x.powf(e - 1.0)?)?.mul_scalar(e)?,
        U::Clamp { lo, hi } => {
            let inside = x.cmp_scalar(BinaryOp::Ge, lo)?.mul(&x.cmp_scalar(BinaryOp::Le, hi)?)?;
            // Comparisons give 0 for NaN, which would turn a NaN into a zero gradient; step
            // keeps NaN, so this adds 0, or NaN where x is NaN.
            let nan = x.unary(U::Step)?.mul_scalar(0.0)?;
            g.mul(&inside.add(&nan)?)?
        }
    }))
}

/// The gradient a node received: a tensor, or (for a dense layer's output on the Cpu) the
/// operands of the product that makes it.
enum Incoming {
    Tensor(Tensor),
    Product(Tensor, Tensor),
}

impl Incoming {
    /// The gradient as a tensor (a product worked out as the backward pass multiplies).
    fn resolve(self) -> Result<Tensor> {
        match self {
            Incoming::Tensor(g) => Ok(g),
            Incoming::Product(l, r) => GradStore::multiply(&l, &r),
        }
    }
}

/// Whether the gradient of `a`, read by a product whose output's gradient is `g`, is left as a
/// product for `a`'s layer to take through its backward with it: `a` is the 2-D output of a dense
/// layer on the Cpu whose activation's gradient is read from its output (the kernels that fuse
/// them), and so is `g`.
fn fuses_backward(a: &Tensor, g: &Tensor) -> bool {
    let fusable = |op: UnaryOp| op != UnaryOp::Identity && reads_output_only(op);
    a.rank() == 2
        && g.rank() == 2
        && matches!(a.op(), Some(Op::Dense { op, .. }) if fusable(*op))
        && [a, g].iter().all(|t| t.dtype() == DType::F32 && matches!(t.device(), crate::Device::Cpu))
}

/// [`dense_grads`] for the gradient `lhs @ rhs` of `out`: worked out with the product where weft's
/// Cpu kernel runs it, each block taken through the activation's gradient and into the bias's
/// sums as the kernel finishes it (`cpu::dense_grads_product`); otherwise (a product the kernel
/// leaves, a batch of fewer rows than a column sum's run) the product, then [`dense_grads`].
/// The same values either way.
fn dense_grads_of_product(op: UnaryOp, out: &Tensor, lhs: &Tensor, rhs: &Tensor) -> Result<(Tensor, Tensor)> {
    let fused = lhs.storage().act_bias_grads_of_product(
        lhs.layout(),
        &rhs.storage(),
        rhs.layout(),
        &out.storage(),
        out.layout(),
        op,
    )?;
    if let Some((d, db)) = fused {
        return Ok((f32_like(d, out, out.dims()), f32_like(db, out, &[out.dims()[1]])));
    }
    dense_grads(op, out, &GradStore::multiply(lhs, rhs)?)
}

/// An f32 tensor of `dims` over `storage`, on `like`'s device, with no gradient of its own (a
/// kernel's gradient output).
fn f32_like(storage: crate::storage::Storage, like: &Tensor, dims: &[usize]) -> Tensor {
    Tensor::from_storage(storage, dims, DType::F32, like.device().clone(), None)
}

/// The gradients of a dense layer's sum and bias, given its output `out = op(sum)` (`[m, n]`)
/// and the output's gradient `g`: on the Cpu in one pass (`cpu::dense_grads`), else as
/// [`unary_grad`] and [`reduce_to`], as `add_unary`'s backward takes them: the same values either
/// way.
fn dense_grads(op: UnaryOp, out: &Tensor, g: &Tensor) -> Result<(Tensor, Tensor)> {
    let n = out.dims()[1];
    // (The identity's gradient is `g` as it comes, a view or not: nothing to fuse; nor on a GPU,
    // where the copy would be thrown away.)
    if op != UnaryOp::Identity && matches!(out.device(), crate::Device::Cpu) {
        let gc = g.contiguous_from_zero()?;
        if let Some((d, db)) = gc.storage().act_bias_grads(gc.layout(), &out.storage(), out.layout(), op)? {
            let d = f32_like(d, out, out.dims());
            let db = match db {
                Some(db) => f32_like(db, out, &[n]),
                None => reduce_to(&d, &[n])?,
            };
            return Ok((d, db));
        }
    }
    let d = unary_grad(op, out, out, g)?.ok_or_else(|| Error::invalid("dense", format!("{op:?} has no gradient")))?;
    let db = reduce_to(&d, &[n])?;
    Ok((d, db))
}

/// Gradients of an op's inputs given the gradient `g` of its output `out`. An input whose
/// `need` is false may get `None` (the ops with two costly gradients skip it).
fn input_grads(op: &Op, out: &Tensor, g: &Tensor, need: &[bool]) -> Result<Vec<Option<Tensor>>> {
    let when = |i: usize, f: &dyn Fn() -> Result<Tensor>| -> Result<Option<Tensor>> {
        if need.get(i).copied().unwrap_or(true) { f().map(Some) } else { Ok(None) }
    };
    Ok(match op {
        Op::Unary(x, u) => vec![unary_grad(*u, x, out, g)?],
        Op::AddUnary(a, b, u) => {
            // The sum is not kept: the gradient of relu, tanh, sigmoid and exp is read from the
            // output (relu's from step(out), the same bits as from step of the sum); the others
            // compute the sum again.
            let d =
                if reads_output_only(*u) { unary_grad(*u, out, out, g)? } else { unary_grad(*u, &a.add(b)?, out, g)? };
            vec![d.clone(), d]
        }
        Op::Binary(a, b, op) => match op {
            BinaryOp::Add => vec![Some(g.clone()), Some(g.clone())],
            BinaryOp::Sub => vec![Some(g.clone()), Some(g.neg()?)],
            BinaryOp::Mul => vec![when(0, &|| g.mul(b))?, when(1, &|| g.mul(a))?],
            BinaryOp::Div => vec![when(0, &|| g.div(b))?, when(1, &|| g.mul(out)?.div(b)?.neg())?],
            BinaryOp::Pow => {
                let ga = g.mul(b)?.mul(&a.pow(&b.add_scalar(-1.0)?)?)?;
                let gb = g.mul(out)?.mul(&a.log()?)?;
                vec![Some(ga), Some(gb)]
            }
            BinaryOp::Maximum | BinaryOp::Minimum => {
                // Ties send the gradient to the left operand.
                let pick_a = if *op == BinaryOp::Maximum { a.ge(b)? } else { a.le(b)? };
                vec![Some(g.mul(&pick_a)?), Some(g.mul(&pick_a.affine(-1.0, 1.0)?)?)]
            }
            _ => vec![None, None],
        },
        Op::Reduce(x, op, _) => {
            let d = match op {
                ReduceOp::Sum => g.broadcast_to(x.dims())?,
                ReduceOp::Max | ReduceOp::Min => {
                    // Split the gradient evenly between tied extremes, as PyTorch's amax does.
                    let axes: Vec<isize> = reduced_axes(x, out);
                    let hit = x.eq(&out.broadcast_to(x.dims())?)?;
                    let count = hit.sum(&axes, true)?;
                    hit.div(&count)?.mul(&g.broadcast_to(x.dims())?)?
                }
                ReduceOp::ArgMax => return Ok(vec![None]),
            };
            vec![Some(d)]
        }
        Op::Matmul(a, b) => vec![when(0, &|| g.matmul(&b.t()?))?, when(1, &|| a.t()?.matmul(g))?],
        // (`backward_from` turns a dense node into a product first; this arm serves any other caller.)
        Op::Dense { x, w, b, op } => {
            let (d, db) = dense_grads(*op, out, g)?;
            let mut grads = input_grads(&Op::Matmul(x.clone(), w.clone()), out, &d, need)?;
            grads.push(Some(db.reshape(b.dims())?));
            grads
        }
        Op::Reshape(x) | Op::Copy(x) => vec![Some(g.reshape(x.dims())?)],
        Op::Permute(_, dims) => {
            let mut inv = vec![0; dims.len()];
            for (i, &d) in dims.iter().enumerate() {
                inv[d] = i;
            }
            vec![Some(g.permute(&inv)?)]
        }
        Op::Broadcast(x) => vec![Some(reduce_to(g, x.dims())?)],
        // backward_with collects slices instead (slice_grads); one alone is padded with zeros.
        Op::Narrow(x, axis, start) => {
            let slice = SliceGrad { axis: *axis, start: *start, grad: g.clone() };
            vec![Some(crate::slice_grads::assemble(x.dims(), vec![slice])?)]
        }
        // Only f32 sources take a gradient: integers have none, and f16 is a storage type here.
        Op::Cast(x) => vec![if x.dtype() == DType::F32 { Some(g.to_dtype(DType::F32)?) } else { None }],
        Op::ToDevice(x) => vec![Some(g.to_device(x.device())?)],
        // One op where the device has it (`Tensor::softmax_grad`), else composed.
        Op::Softmax(_) => match out.softmax_grad(g, false)? {
            Some(dx) => vec![Some(dx)],
            None => {
                let s = g.mul(out)?.sum(&[-1], true)?;
                vec![Some(out.mul(&g.sub(&s)?)?)]
            }
        },
        Op::LogSoftmax(_) => match out.softmax_grad(g, true)? {
            Some(dx) => vec![Some(dx)],
            None => {
                let s = g.sum(&[-1], true)?;
                vec![Some(g.sub(&out.exp()?.mul(&s)?)?)]
            }
        },
        Op::LayerNorm { x, gamma, eps, .. } => {
            if let Some((dx, gxhat)) = x.layer_norm_grad(gamma, g, *eps)? {
                let rows: Vec<isize> = (0..x.rank() as isize - 1).collect();
                return Ok(vec![Some(dx), when(1, &|| gxhat.sum(&rows, false))?, when(2, &|| g.sum(&rows, false))?]);
            }
            composed_layer_norm_grad(x, gamma, *eps, g)?.into_iter().map(Some).collect()
        }
        Op::IndexSelect(x, ids, axis) => vec![Some(g.index_add(x.dims(), *axis, ids)?), None],
        Op::Gather(x, ids, axis) => vec![Some(g.scatter_add(x.dims(), *axis, ids)?), None],
        Op::IndexAdd(_, ids, axis) => vec![Some(g.index_select(ids, *axis as isize)?), None],
        Op::ScatterAdd(_, ids, axis) => vec![Some(g.gather(*axis as isize, ids)?), None],
        Op::Concat(xs, axis) => {
            let mut start = 0;
            let mut out = Vec::with_capacity(xs.len());
            for x in xs {
                let len = x.dims()[*axis];
                out.push(Some(g.narrow(*axis as isize, start, len)?));
                start += len;
            }
            out
        }
        Op::Where(m, _, _) => {
            let zero = Tensor::scalar(0.0, g.device())?;
            vec![None, Some(Tensor::where_cond(m, g, &zero)?), Some(Tensor::where_cond(m, &zero, g)?)]
        }
        Op::Custom { backward, .. } => backward(g)?,
    })
}

/// Layer norm's backward as tensor ops (`[dx, dgamma, dbeta]`), where the device has no one-op
/// form (a GPU's rows too long for one workgroup); the one op
/// (`Tensor::layer_norm_grad`) gives these values to rounding.
pub(crate) fn composed_layer_norm_grad(x: &Tensor, gamma: &Tensor, eps: f32, g: &Tensor) -> Result<Vec<Tensor>> {
    let n = *x.dims().last().unwrap_or(&1) as f32;
    let mean = x.mean(&[-1], true)?;
    let xc = x.sub(&mean)?;
    let rstd = xc.square()?.mean(&[-1], true)?.add_scalar(eps)?.rsqrt()?;
    let xhat = xc.mul(&rstd)?;
    let rows: Vec<isize> = (0..x.rank() as isize - 1).collect();
    let dgamma = g.mul(&xhat)?.sum(&rows, false)?;
    let dbeta = g.sum(&rows, false)?;
    let dxhat = g.mul(gamma)?;
    let m1 = dxhat.sum(&[-1], true)?.mul_scalar(1.0 / n)?;
    let m2 = dxhat.mul(&xhat)?.sum(&[-1], true)?.mul_scalar(1.0 / n)?;
    let dx = dxhat.sub(&m1)?.sub(&xhat.mul(&m2)?)?.mul(&rstd)?;
    Ok(vec![dx, dgamma, dbeta])
}

fn reduced_axes(x: &Tensor, out: &Tensor) -> Vec<isize> {
    (0..x.rank()).filter(|&a| x.dims()[a] != out.dims()[a]).map(|a| a as isize).collect()
}
