//! A tensor's memory on its device, and the dispatch of each primitive op to the backend that
//! owns it. This is the one place that matches on the backend; everything above works on `Tensor`.
//!
//! Every GPU result here `inherit`s the fault slots of its GPU inputs, so an index fault travels
//! with the values it spoiled (see `gpu/fault.rs`), and every GPU input layout is checked to fit
//! the kernels' u32 indexing first.

use crate::conv::{ConvPass, PoolKind, Window2d};
use crate::cpu::{self, CpuStorage};
use crate::gpu::{self, GpuStorage};
use crate::ops::{BinaryOp, ReduceOp, UnaryOp};
use crate::{DType, Error, Layout, Result};

/// Memory of one tensor (shared by its views). Cheap to clone.
#[derive(Debug, Clone)]
pub enum Storage {
    /// Host memory.
    Cpu(CpuStorage),
    /// A GPU buffer.
    Gpu(GpuStorage),
    /// No memory: Meta tensors only have shapes.
    Meta,
}

/// The first of `others` on another kind of device than `s` (the match arms that call it have
/// seen that one is).
fn first_other<'a>(s: &Storage, others: &[&'a Storage]) -> &'a Storage {
    let kind = std::mem::discriminant(s);
    others.iter().find(|o| std::mem::discriminant(**o) != kind).unwrap_or(&others[others.len() - 1])
}

fn mismatch(op: &'static str, a: &Storage, b: &Storage) -> Error {
    let name = |s: &Storage| match s {
        Storage::Cpu(_) => "cpu".to_string(),
        Storage::Gpu(g) => g.ctx.describe(),
        Storage::Meta => "meta".to_string(),
    };
    Error::DeviceMismatch { op, lhs: name(a), rhs: name(b) }
}

/// What sparse cross-entropy's backward needs of its forward
/// ([`Storage::log_softmax_pick`]), on the device that ran it.
pub enum Picked {
    /// Each row's label, max and log-sum-exp, on the host.
    Cpu(cpu::Picked),
    /// The labels and each row's max and log-sum-exp, on the GPU.
    Gpu(gpu::Picked),
}

impl Storage {
    /// Elementwise unary op.
    pub fn unary(&self, op: UnaryOp, l: &Layout) -> Result<Storage> {
        Ok(match self {
            Storage::Cpu(s) => Storage::Cpu(cpu::unary(op, s, l)?),
            Storage::Gpu(s) => {
                gpu::check_layout(op.name(), l)?;
                Storage::Gpu(gpu::unary(op, s, l)?.inherit(&[s]))
            }
            Storage::Meta => Storage::Meta,
        })
    }

    /// Elementwise binary op on two layouts of one shape.
    pub fn binary(&self, op: BinaryOp, la: &Layout, rhs: &Storage, lb: &Layout) -> Result<Storage> {
        Ok(match (self, rhs) {
            (Storage::Cpu(a), Storage::Cpu(b)) => Storage::Cpu(cpu::binary(op, a, la, b, lb)?),
            (Storage::Gpu(a), Storage::Gpu(b)) => {
                gpu::check_layout(op.name(), la)?;
                Storage::Gpu(gpu::binary(op, a, la, b, lb)?.inherit(&[a, b]))
            }
            (Storage::Meta, Storage::Meta) => Storage::Meta,
            _ => return Err(mismatch(op.name(), self, rhs)),
        })
    }

    /// `op(self + rhs)` on two layouts of one shape, in one pass.
    pub fn add_unary(&self, op: UnaryOp, la: &Layout, rhs: &Storage, lb: &Layout) -> Result<Storage> {
        Ok(match (self, rhs) {
            (Storage::Cpu(a), Storage::Cpu(b)) => Storage::Cpu(cpu::add_unary(op, a, la, b, lb)?),
            (Storage::Gpu(a), Storage::Gpu(b)) => {
                gpu::check_layout(op.name(), la)?;
                gpu::check_layout(op.name(), lb)?;
                Storage::Gpu(gpu::add_unary(op, a, la, b, lb)?.inherit(&[a, b]))
            }
            (Storage::Meta, Storage::Meta) => Storage::Meta,
            _ => return Err(mismatch("add_unary", self, rhs)),
        })
    }

    /// `g * op'(self)` on two layouts of one shape, in one pass (`self` is the op's input, or
    /// its output where `UnaryOp::fused_grad` says so).
    pub fn unary_grad(&self, op: UnaryOp, lv: &Layout, g: &Storage, lg: &Layout) -> Result<Storage> {
        Ok(match (self, g) {
            (Storage::Cpu(v), Storage::Cpu(g)) => Storage::Cpu(cpu::unary_grad(op, v, lv, g, lg)?),
            (Storage::Gpu(v), Storage::Gpu(g)) => {
                gpu::check_layout(op.name(), lv)?;
                gpu::check_layout(op.name(), lg)?;
                Storage::Gpu(gpu::unary_grad(op, v, lv, g, lg)?.inherit(&[v, g]))
            }
            (Storage::Meta, Storage::Meta) => Storage::Meta,
            _ => return Err(mismatch("unary_backward", self, g)),
        })
    }

    /// Layer norm's backward in one op where the backend has it (the Cpu; a GPU for rows one
    /// workgroup takes, with gamma compact from its buffer's start): `(dx, g * xhat)` for the input `self`, `gamma`
    /// and the output's gradient `g`; `None` elsewhere (autograd then composes it from tensor ops).
    pub fn layer_norm_grad(
        &self,
        lx: &Layout,
        (gamma, lgamma): (&Storage, &Layout),
        (g, lg): (&Storage, &Layout),
        eps: f32,
    ) -> Result<Option<(Storage, Storage)>> {
        Ok(match (self, gamma, g) {
            (Storage::Cpu(x), Storage::Cpu(w), Storage::Cpu(g)) => {
                let (dx, q) = cpu::layer_norm_grad((x, lx), (w, lgamma), (g, lg), eps)?;
                Some((Storage::Cpu(dx), Storage::Cpu(q)))
            }
            (Storage::Gpu(x), Storage::Gpu(w), Storage::Gpu(g))
                if lgamma.is_contiguous() && lgamma.offset() == 0 && lx.rank() > 0 =>
            {
                gpu::check_layout("layer_norm_grad", lx)?;
                gpu::check_layout("layer_norm_grad", lg)?;
                gpu::layer_norm_grad((x, lx), w, (g, lg), eps)?
                    .map(|(dx, q)| (Storage::Gpu(dx.inherit(&[x, w, g])), Storage::Gpu(q.inherit(&[x, w, g]))))
            }
            _ => None,
        })
    }

    /// Softmax's (`log`: log-softmax's) backward over the last axis in one op, from the
    /// forward's output (`self`, `ly`) and the output's gradient `g` (one shape, any layouts):
    /// the input's gradient, contiguous. `None` where the device has no kernel for these rows (a
    /// GPU's rows too long for a workgroup): autograd composes it.
    pub fn softmax_grad(&self, ly: &Layout, (g, lg): (&Storage, &Layout), log: bool) -> Result<Option<Storage>> {
        if ly.shape() != lg.shape() {
            return Ok(None);
        }
        Ok(match (self, g) {
            (Storage::Cpu(y), Storage::Cpu(g)) => Some(Storage::Cpu(cpu::softmax_grad((y, ly), (g, lg), log)?)),
            (Storage::Gpu(y), Storage::Gpu(g)) if ly.rank() > 0 && y.ctx.ordinal == g.ctx.ordinal => {
                gpu::check_layout("softmax_grad", ly)?;
                gpu::check_layout("softmax_grad", lg)?;
                gpu::softmax_grad((y, ly), (g, lg), log)?.map(|dx| Storage::Gpu(dx.inherit(&[y, g])))
            }
            _ => None,
        })
    }

    /// One LSTM cell step (see [`Tensor::lstm_cell`](crate::Tensor::lstm_cell)): `h` and the new
    /// state, `[rows, 2, u]`, from `self` (the gates' pre-activations `z`, `[rows, 4u]`, or with
    /// `second`, one share of them, the other `second`) and the state `c` (`[rows, u]`).
    pub fn lstm_cell(
        &self,
        lz: &Layout,
        second: Option<(&Storage, &Layout)>,
        (c, lc): (&Storage, &Layout),
    ) -> Result<Storage> {
        let other = second.map_or(self, |s| s.0);
        Ok(match (self, other, c) {
            (Storage::Cpu(z), Storage::Cpu(h), Storage::Cpu(c)) => {
                let gates = cpu::lstm::Gates::new((z, lz), second.map(|(_, l)| (h, l)))?;
                Storage::Cpu(cpu::lstm_cell(&gates, c, lc)?)
            }
            (Storage::Gpu(z), Storage::Gpu(h), Storage::Gpu(c)) => {
                for l in [Some(lz), second.map(|s| s.1), Some(lc)].into_iter().flatten() {
                    gpu::check_layout("lstm_cell", l)?;
                }
                let gates = ((z, lz), second.map(|(_, l)| (h, l)));
                Storage::Gpu(gpu::lstm_cell(gates, (c, lc))?.inherit(&[z, h, c]))
            }
            (Storage::Meta, Storage::Meta, Storage::Meta) => Storage::Meta,
            _ => return Err(mismatch("lstm_cell", self, first_other(self, &[other, c]))),
        })
    }

    /// The backward of [`lstm_cell`](Storage::lstm_cell): the gradients of `z` and `c` side by
    /// side, `[rows, 5u]`, from `self` (`z`, or with `second` one share of it), `c` and the
    /// output's gradient `g` (`[rows, 2, u]`).
    pub fn lstm_cell_grad(
        &self,
        lz: &Layout,
        second: Option<(&Storage, &Layout)>,
        (c, lc): (&Storage, &Layout),
        (g, lg): (&Storage, &Layout),
    ) -> Result<Storage> {
        let other = second.map_or(self, |s| s.0);
        Ok(match (self, other, c, g) {
            (Storage::Cpu(z), Storage::Cpu(h), Storage::Cpu(c), Storage::Cpu(g)) => {
                let gates = cpu::lstm::Gates::new((z, lz), second.map(|(_, l)| (h, l)))?;
                Storage::Cpu(cpu::lstm_cell_grad(&gates, (c, lc), (g, lg))?)
            }
            (Storage::Gpu(z), Storage::Gpu(h), Storage::Gpu(c), Storage::Gpu(g)) => {
                gpu::check_layout("lstm_cell", lg)?;
                let gates = ((z, lz), second.map(|(_, l)| (h, l)));
                Storage::Gpu(gpu::lstm_cell_grad(gates, (c, lc), (g, lg))?.inherit(&[z, h, c, g]))
            }
            (Storage::Meta, Storage::Meta, Storage::Meta, Storage::Meta) => Storage::Meta,
            _ => return Err(mismatch("lstm_cell", self, first_other(self, &[other, c, g]))),
        })
    }

    /// One GRU cell step (see [`Tensor::gru_cell`](crate::Tensor::gru_cell)): the new state,
    /// `[rows, u]`, from `self` (the gates' input share `x`, `[rows, 3u]`), the state's share `hr`
    /// (`[rows, 3u]`) and the state `h` (`[rows, u]`).
    pub fn gru_cell(
        &self,
        lx: &Layout,
        (hr, lr): (&Storage, &Layout),
        (h, lh): (&Storage, &Layout),
    ) -> Result<Storage> {
        Ok(match (self, hr, h) {
            (Storage::Cpu(x), Storage::Cpu(r), Storage::Cpu(h)) => {
                Storage::Cpu(cpu::gru_cell((x, lx), (r, lr), (h, lh))?)
            }
            (Storage::Gpu(x), Storage::Gpu(r), Storage::Gpu(h)) => {
                for l in [lx, lr, lh] {
                    gpu::check_layout("gru_cell", l)?;
                }
                Storage::Gpu(gpu::gru_cell((x, lx), (r, lr), (h, lh))?.inherit(&[x, r, h]))
            }
            (Storage::Meta, Storage::Meta, Storage::Meta) => Storage::Meta,
            _ => return Err(mismatch("gru_cell", self, first_other(self, &[hr, h]))),
        })
    }

    /// The backward of [`gru_cell`](Storage::gru_cell): the gradients of `x`, `hr` and `h` side by
    /// side, `[rows, 7u]`, from the same inputs and the new state's gradient `g` (`[rows, u]`).
    pub fn gru_cell_grad(
        &self,
        lx: &Layout,
        (hr, lr): (&Storage, &Layout),
        (h, lh): (&Storage, &Layout),
        (g, lg): (&Storage, &Layout),
    ) -> Result<Storage> {
        Ok(match (self, hr, h, g) {
            (Storage::Cpu(x), Storage::Cpu(r), Storage::Cpu(h), Storage::Cpu(g)) => {
                Storage::Cpu(cpu::gru_cell_grad((x, lx), (r, lr), (h, lh), (g, lg))?)
            }
            (Storage::Gpu(x), Storage::Gpu(r), Storage::Gpu(h), Storage::Gpu(g)) => {
                gpu::check_layout("gru_cell", lg)?;
                Storage::Gpu(gpu::gru_cell_grad((x, lx), (r, lr), (h, lh), (g, lg))?.inherit(&[x, r, h, g]))
            }
            (Storage::Meta, Storage::Meta, Storage::Meta, Storage::Meta) => Storage::Meta,
            _ => return Err(mismatch("gru_cell", self, first_other(self, &[hr, h, g]))),
        })
    }

    /// `mask != 0 ? a : b`; `self` is the mask.
    pub fn where_cond(&self, lm: &Layout, a: &Storage, la: &Layout, b: &Storage, lb: &Layout) -> Result<Storage> {
        Ok(match (self, a, b) {
            (Storage::Cpu(m), Storage::Cpu(x), Storage::Cpu(y)) => Storage::Cpu(cpu::where_cond(m, lm, x, la, y, lb)?),
            (Storage::Gpu(m), Storage::Gpu(x), Storage::Gpu(y)) => {
                gpu::check_layout("where_cond", la)?;
                Storage::Gpu(gpu::where_cond(m, lm, x, la, y, lb)?.inherit(&[m, x, y]))
            }
            (Storage::Meta, Storage::Meta, Storage::Meta) => Storage::Meta,
            _ => return Err(mismatch("where_cond", a, b)),
        })
    }

    /// Reduce `axes`; the output keeps them as size 1.
    pub fn reduce(&self, op: ReduceOp, l: &Layout, axes: &[usize]) -> Result<Storage> {
        Ok(match self {
            Storage::Cpu(s) => Storage::Cpu(cpu::reduce(op, s, l, axes)?),
            Storage::Gpu(s) => {
                gpu::check_layout(op.name(), l)?;
                Storage::Gpu(gpu::reduce(op, s, l, axes)?.inherit(&[s]))
            }
            Storage::Meta => Storage::Meta,
        })
    }

    /// Batched matmul of `[batch.., m, k]` and `[batch.., k, n]`.
    pub fn matmul(&self, la: &Layout, rhs: &Storage, lb: &Layout) -> Result<Storage> {
        Ok(match (self, rhs) {
            (Storage::Cpu(a), Storage::Cpu(b)) => Storage::Cpu(cpu::matmul(a, la, b, lb)?),
            (Storage::Gpu(a), Storage::Gpu(b)) => {
                gpu::check_layout("matmul", la)?;
                gpu::check_layout("matmul", lb)?;
                Storage::Gpu(gpu::matmul(a, la, b, lb)?.inherit(&[a, b]))
            }
            (Storage::Meta, Storage::Meta) => Storage::Meta,
            _ => return Err(mismatch("matmul", self, rhs)),
        })
    }

    /// Softmax or log-softmax over the last axis.
    pub fn softmax(&self, l: &Layout, log: bool) -> Result<Storage> {
        Ok(match self {
            Storage::Cpu(s) => Storage::Cpu(cpu::softmax(s, l, log)?),
            Storage::Gpu(s) => {
                gpu::check_layout("softmax", l)?;
                Storage::Gpu(gpu::softmax(s, l, log)?.inherit(&[s]))
            }
            Storage::Meta => Storage::Meta,
        })
    }

    /// Each row's log-softmax at its label (`ids`, one per row of `self`'s `[rows, classes]`;
    /// u32 on a GPU), with what its gradient needs, in one pass: on the Cpu the bits of the
    /// log-softmax and the gather, on a GPU one dispatch. `None` where the device has no such
    /// kernel (a GPU's rows too long for a workgroup), for the caller to run those two apart.
    pub fn log_softmax_pick(&self, l: &Layout, ids: &Storage, li: &Layout) -> Result<Option<(Storage, Picked)>> {
        Ok(match (self, ids) {
            (Storage::Cpu(x), Storage::Cpu(ids)) => {
                let (picked, p) = cpu::log_softmax_pick(x, l, ids, li)?;
                Some((Storage::Cpu(picked), Picked::Cpu(p)))
            }
            (Storage::Gpu(x), Storage::Gpu(ids)) if x.ctx.ordinal == ids.ctx.ordinal => {
                gpu::check_layout("cross_entropy", li)?;
                gpu::log_softmax_pick(x, l, ids, li)?.map(|(picked, p)| (Storage::Gpu(picked), Picked::Gpu(p)))
            }
            _ => None,
        })
    }

    /// The gradient of [`log_softmax_pick`](Storage::log_softmax_pick) for `self` (its `x`),
    /// given `g`, the gradient of the picks: one pass (on the Cpu, the bits of the composed ops'
    /// gradients).
    pub fn log_softmax_pick_grad(&self, l: &Layout, p: &Picked, g: &Storage, lg: &Layout) -> Result<Storage> {
        match (self, p, g) {
            (Storage::Cpu(x), Picked::Cpu(p), Storage::Cpu(g)) => {
                Ok(Storage::Cpu(cpu::log_softmax_pick_grad(x, l, p, g, lg)?))
            }
            (Storage::Gpu(x), Picked::Gpu(p), Storage::Gpu(g)) if x.ctx.ordinal == g.ctx.ordinal => {
                Ok(Storage::Gpu(gpu::log_softmax_pick_grad(x, l, p, g, lg)?))
            }
            _ => Err(mismatch("cross_entropy", self, g)),
        }
    }

    /// Layer norm over the last axis (gamma and beta contiguous vectors).
    pub fn layer_norm(
        &self,
        l: &Layout,
        g: &Storage,
        lg: &Layout,
        b: &Storage,
        lb: &Layout,
        eps: f32,
    ) -> Result<Storage> {
        Ok(match (self, g, b) {
            (Storage::Cpu(x), Storage::Cpu(g), Storage::Cpu(b)) => {
                Storage::Cpu(cpu::layer_norm(x, l, g, lg, b, lb, eps)?)
            }
            (Storage::Gpu(x), Storage::Gpu(g), Storage::Gpu(b)) => {
                gpu::check_layout("layer_norm", l)?;
                Storage::Gpu(gpu::layer_norm(x, l, g, b, eps)?.inherit(&[x, g, b]))
            }
            (Storage::Meta, Storage::Meta, Storage::Meta) => Storage::Meta,
            _ => return Err(mismatch("layer_norm", self, g)),
        })
    }

    /// One pass of a 2-D convolution (see [`ConvPass`]): `self` and `rhs` are (x, kernel),
    /// (dy, kernel) or (x, dy).
    pub fn conv2d(&self, pass: ConvPass, la: &Layout, rhs: &Storage, lb: &Layout, g: &Window2d) -> Result<Storage> {
        Ok(match (self, rhs) {
            (Storage::Cpu(a), Storage::Cpu(b)) => Storage::Cpu(match pass {
                ConvPass::Forward => cpu::conv2d(a, la, b, lb, g, None)?,
                ConvPass::InputGrad => cpu::conv2d_input_grad(a, la, b, lb, g)?,
                ConvPass::KernelGrad => cpu::conv2d_kernel_grad(a, la, b, lb, g)?,
            }),
            (Storage::Gpu(a), Storage::Gpu(b)) => Storage::Gpu(gpu::conv2d(pass, a, la, b, lb, g)?.inherit(&[a, b])),
            (Storage::Meta, Storage::Meta) => Storage::Meta,
            _ => return Err(mismatch("conv2d", self, rhs)),
        })
    }

    /// `op(a @ b + bias)` for `[m, k]` and `[k, n]` layouts and a bias of `n` adjacent values from
    /// `bias_offset`, the bias and activation applied to the product's output blocks while in
    /// cache (Cpu), or as the product's values are stored (GPU: by its kernel, where K is split by
    /// the slices' sum, where the product runs transposed by the pass that copies it out); `None`
    /// where none can, for the caller to run the ops one after another.
    pub fn matmul_add_unary(
        &self,
        la: &Layout,
        rhs: &Storage,
        lb: &Layout,
        (bias, bias_offset): (&Storage, usize),
        op: UnaryOp,
    ) -> Result<Option<Storage>> {
        match (self, rhs, bias) {
            (Storage::Cpu(a), Storage::Cpu(b), Storage::Cpu(bias)) => {
                let bias = cpu_bias(bias, bias_offset, lb.shape()[lb.rank() - 1], "matmul_add_unary")?;
                Ok(Some(Storage::Cpu(cpu::matmul_add_unary(a, la, b, lb, bias, op)?)))
            }
            (Storage::Gpu(a), Storage::Gpu(b), Storage::Gpu(c)) => {
                gpu::check_layout("matmul", la)?;
                gpu::check_layout("matmul", lb)?;
                let out = gpu::matmul_add_unary(a, la, b, lb, (c, bias_offset), op)?;
                Ok(out.map(|s| Storage::Gpu(s.inherit(&[a, b, c]))))
            }
            _ => Ok(None),
        }
    }

    /// A dense layer's backward through `op` and its bias in one pass: for the gradient `self`
    /// of `y = op(..)`, both `[rows, cols]` and compact from 0, the gradient of the sum and the
    /// bias's (the column sums; `None` where the reduction would sum them in another order, for
    /// the caller to reduce). Cpu storage, and an `op` other than the identity whose gradient is
    /// read from its output, only (`None` otherwise, for the caller to run the ops apart).
    pub fn act_bias_grads(
        &self,
        lg: &Layout,
        y: &Storage,
        ly: &Layout,
        op: UnaryOp,
    ) -> Result<Option<(Storage, Option<Storage>)>> {
        let (Storage::Cpu(g), Storage::Cpu(y)) = (self, y) else { return Ok(None) };
        let [rows, cols] = lg.shape() else { return Ok(None) };
        if ly.shape() != lg.shape() || !lg.is_contiguous() || !ly.is_contiguous() || lg.offset() + ly.offset() > 0 {
            return Ok(None);
        }
        let n = rows * cols;
        let (g, y) = (&g.f32s("dense backward")?[..n], &y.f32s("dense backward")?[..n]);
        let cpu = |v: Vec<f32>| Storage::Cpu(cpu::f32_storage(v));
        Ok(cpu::act_bias_grads(g, y, *rows, *cols, op)?.map(|(d, db)| (cpu(d), db.map(cpu))))
    }

    /// [`act_bias_grads`](Storage::act_bias_grads) for the gradient `self @ rhs` (2-D layouts)
    /// of `y = op(..)` (`[m, n]`, compact from 0), worked out with the product: its blocks become
    /// the sum's gradient as weft's kernel finishes them (`cpu::dense_grads_product`), never
    /// stored. Cpu storage where weft's kernel runs the product and the bias's sums are taken
    /// by columns only (`None` otherwise, for the caller to multiply, then run the backward).
    #[allow(clippy::too_many_arguments)]
    pub fn act_bias_grads_of_product(
        &self,
        la: &Layout,
        rhs: &Storage,
        lb: &Layout,
        y: &Storage,
        ly: &Layout,
        op: UnaryOp,
    ) -> Result<Option<(Storage, Storage)>> {
        #[cfg(target_arch = "x86_64")]
        {
            let (Storage::Cpu(a), Storage::Cpu(b), Storage::Cpu(y)) = (self, rhs, y) else { return Ok(None) };
            let (m, n) = (la.shape().first().copied(), lb.shape().get(1).copied());
            let (Some(m), Some(n)) = (m, n) else { return Ok(None) };
            if ly.shape() != [m, n] || !ly.is_contiguous() || ly.offset() > 0 {
                return Ok(None);
            }
            let Some(y) = y.f32s("dense backward")?.get(..m * n) else { return Ok(None) };
            let cpu = |v: Vec<f32>| Storage::Cpu(cpu::f32_storage(v));
            Ok(cpu::act_bias_grads_of_product((a, la), (b, lb), y, op)?.map(|(d, db)| (cpu(d), cpu(db))))
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (la, rhs, lb, y, ly, op);
            Ok(None)
        }
    }

    /// The forward convolution with `op(y + bias)` applied to each block of output rows while in
    /// cache: Cpu storage only (`None` otherwise, for the caller to run the two ops).
    pub fn conv2d_add_unary(
        &self,
        la: &Layout,
        rhs: &Storage,
        lb: &Layout,
        g: &Window2d,
        bias: &Storage,
        op: UnaryOp,
    ) -> Result<Option<Storage>> {
        let (Storage::Cpu(a), Storage::Cpu(b), Storage::Cpu(bias)) = (self, rhs, bias) else { return Ok(None) };
        let bias = cpu_bias(bias, 0, lb.shape()[3], "conv2d")?;
        Ok(Some(Storage::Cpu(cpu::conv2d(a, la, b, lb, g, Some((bias, op)))?)))
    }

    /// Max or average pooling, or (with `dy`) its input gradient.
    pub fn pool2d(&self, kind: PoolKind, l: &Layout, dy: Option<(&Storage, &Layout)>, g: &Window2d) -> Result<Storage> {
        Ok(match (self, dy) {
            (Storage::Cpu(x), None) => Storage::Cpu(cpu::pool2d(kind, x, l, g)?),
            (Storage::Cpu(x), Some((Storage::Cpu(d), ld))) => Storage::Cpu(cpu::pool2d_grad(kind, x, l, d, ld, g)?),
            (Storage::Gpu(x), None) => Storage::Gpu(gpu::pool2d(kind, x, l, g)?.inherit(&[x])),
            (Storage::Gpu(x), Some((Storage::Gpu(d), ld))) => {
                Storage::Gpu(gpu::pool2d_grad(kind, x, l, d, ld, g)?.inherit(&[x, d]))
            }
            (Storage::Meta, None | Some((Storage::Meta, _))) => Storage::Meta,
            (_, Some((d, _))) => return Err(mismatch("pool2d", self, d)),
        })
    }

    /// Entries `ids` of `axis` (`self` is the source).
    pub fn index_select(&self, l: &Layout, ids: &Storage, li: &Layout, axis: usize) -> Result<Storage> {
        Ok(match (self, ids) {
            (Storage::Cpu(s), Storage::Cpu(i)) => Storage::Cpu(cpu::index_select(s, l, i, li, axis)?),
            (Storage::Gpu(s), Storage::Gpu(i)) => {
                gpu::check_layout("index_select", l)?;
                gpu::check_layout("index_select", li)?;
                Storage::Gpu(gpu::index_select(s, l, i, li, axis)?.inherit(&[s, i]))
            }
            (Storage::Meta, Storage::Meta) => Storage::Meta,
            _ => return Err(mismatch("index_select", self, ids)),
        })
    }

    /// torch.gather along `axis` (`self` is the source).
    pub fn gather(&self, l: &Layout, ids: &Storage, li: &Layout, axis: usize) -> Result<Storage> {
        Ok(match (self, ids) {
            (Storage::Cpu(s), Storage::Cpu(i)) => Storage::Cpu(cpu::gather(s, l, i, li, axis)?),
            (Storage::Gpu(s), Storage::Gpu(i)) => {
                gpu::check_layout("gather", l)?;
                gpu::check_layout("gather", li)?;
                Storage::Gpu(gpu::gather(s, l, i, li, axis)?.inherit(&[s, i]))
            }
            (Storage::Meta, Storage::Meta) => Storage::Meta,
            _ => return Err(mismatch("gather", self, ids)),
        })
    }

    /// Zeros of `shape` plus `self`'s rows added at `ids` along `axis` (adjoint of index_select).
    pub fn index_add(&self, ls: &Layout, shape: &[usize], axis: usize, ids: &Storage, li: &Layout) -> Result<Storage> {
        Ok(match (self, ids) {
            (Storage::Cpu(s), Storage::Cpu(i)) => Storage::Cpu(cpu::index_add(shape, axis, i, li, s, ls)?),
            (Storage::Gpu(s), Storage::Gpu(i)) => {
                gpu::check_layout("index_add", ls)?;
                gpu::check_layout("index_add", li)?;
                Storage::Gpu(gpu::index_add(shape, axis, i, li, s, ls)?.inherit(&[s, i]))
            }
            (Storage::Meta, Storage::Meta) => Storage::Meta,
            _ => return Err(mismatch("index_add", self, ids)),
        })
    }

    /// Zeros of `shape` plus `self`'s elements added where `ids` point (adjoint of gather).
    pub fn scatter_add(
        &self,
        ls: &Layout,
        shape: &[usize],
        axis: usize,
        ids: &Storage,
        li: &Layout,
    ) -> Result<Storage> {
        Ok(match (self, ids) {
            (Storage::Cpu(s), Storage::Cpu(i)) => Storage::Cpu(cpu::scatter_add(shape, axis, i, li, s, ls)?),
            (Storage::Gpu(s), Storage::Gpu(i)) => {
                gpu::check_layout("scatter_add", ls)?;
                gpu::check_layout("scatter_add", li)?;
                Storage::Gpu(gpu::scatter_add(shape, axis, i, li, s, ls)?.inherit(&[s, i]))
            }
            (Storage::Meta, Storage::Meta) => Storage::Meta,
            _ => return Err(mismatch("scatter_add", self, ids)),
        })
    }

    /// Convert the elements of `l` from `from` to `to` (contiguous output).
    pub fn cast(&self, l: &Layout, from: DType, to: DType) -> Result<Storage> {
        Ok(match self {
            Storage::Cpu(s) => Storage::Cpu(cpu::cast(s, l, to)?),
            Storage::Gpu(s) => {
                gpu::check_layout("cast", l)?;
                Storage::Gpu(gpu::cast(s, l, from, to)?.inherit(&[s]))
            }
            Storage::Meta => Storage::Meta,
        })
    }

    /// The values of `l` (of dtype `from`) as u32 indices, checked to be whole, not negative,
    /// finite and below `bound`; with the flat position of the first value that is not, if any
    /// (the indices are then not to be used). `later`: (what the values are, whether a GPU may
    /// leave the verdict to the first read of a result, see `Tensor::to_index_later`).
    pub fn index_check(
        &self,
        l: &Layout,
        from: DType,
        bound: Option<usize>,
        later: (&str, bool),
    ) -> Result<(Storage, Option<usize>)> {
        Ok(match self {
            Storage::Cpu(s) => {
                let (out, bad) = cpu::index_check(s, l, bound)?;
                (Storage::Cpu(out), bad)
            }
            Storage::Gpu(s) => {
                let (out, bad) = gpu::index_check(s, l, from, bound, later)?;
                (Storage::Gpu(out), bad)
            }
            Storage::Meta => (Storage::Meta, None),
        })
    }

    /// A contiguous copy of `l`.
    pub fn contiguous(&self, l: &Layout, dtype: DType) -> Result<Storage> {
        self.cast(l, dtype, dtype)
    }

    /// Write each part (storage, layout) into its slice of a new contiguous f32 tensor of `shape`,
    /// the parts laid one after another along `axis` (on a GPU, six parts to a dispatch).
    pub fn concat(parts: &[(Storage, Layout)], shape: &[usize], axis: usize) -> Result<Storage> {
        let out_layout = Layout::contiguous(shape);
        let numel = out_layout.numel();
        match parts.first().map(|p| &p.0) {
            None | Some(Storage::Meta) => Ok(Storage::Meta),
            Some(Storage::Cpu(_)) => {
                let mut out = crate::cpu::try_zeros(numel)?;
                let mut start = 0;
                for (s, l) in parts {
                    let Storage::Cpu(s) = s else {
                        return Err(mismatch("concat", &parts[0].0, s));
                    };
                    let dst = out_layout.narrow(axis, start, l.shape()[axis])?;
                    cpu::copy_into(s, l, &mut out, &dst)?;
                    start += l.shape()[axis];
                }
                Ok(Storage::Cpu(crate::cpu::f32_storage(out)))
            }
            Some(Storage::Gpu(first)) => {
                let mut on_gpu = Vec::with_capacity(parts.len());
                for (s, l) in parts {
                    match s {
                        Storage::Gpu(g) if g.ctx.ordinal == first.ctx.ordinal => on_gpu.push((g, l)),
                        _ => return Err(mismatch("concat", &parts[0].0, s)),
                    }
                }
                Ok(Storage::Gpu(gpu::concat(&on_gpu, shape, axis)?))
            }
        }
    }

    /// The elements of `l` as contiguous host bytes.
    pub fn read_bytes(&self, l: &Layout, dtype: DType) -> Result<Vec<u8>> {
        match self {
            Storage::Cpu(s) => Ok(s.gather_bytes(l)),
            Storage::Gpu(s) => s.read_bytes(l, dtype),
            Storage::Meta => Err(Error::MetaData { op: "to_vec" }),
        }
    }
}

/// The `n` values of a fused op's bias from `offset`: adjacent, its storage may be longer (a view
/// of a larger tensor, a GRU's recurrent half); shorter is an Err naming `op`.
fn cpu_bias<'a>(bias: &'a cpu::CpuStorage, offset: usize, n: usize, op: &'static str) -> Result<&'a [f32]> {
    bias.f32s(op)?
        .get(offset..offset + n)
        .ok_or_else(|| crate::Error::invalid(op, format!("a bias of fewer than the output's {n} columns")))
}
