//! EinsumDense: a dense layer whose product is any einsum equation, with Keras' semantics.

use crate::layer::kernel_and_bias;
use crate::penalty::{Penalties, penalty_options};
use crate::split::{LinearSplit, SplitAxis, SplitRule};
use crate::tp::{self, LayerShard, Placement};
use crate::{Activation, Ctx, Initializer, Layer};
use std::sync::Arc;
use std::sync::OnceLock;
use weft_core::collectives::Collectives;
use weft_core::ops::UnaryOp;
use weft_core::{Error, Result, Tensor, Var, trace};

/// `activation(einsum(equation, x, kernel) + bias)`, as Keras' EinsumDense.
///
/// The equation names the input, the kernel and the output, e.g. `abc,cd->abd` (a Dense over
/// the last axis of a 3-D input) or `abc,cde->abde` (a projection to heads). `output_shape` gives
/// the output's sizes without the batch axis (0 where the size comes from the input, Keras' `None`);
/// kernel sizes come from the input for letters it has and from `output_shape` for the rest. `bias_axes` names the output letters the bias spans
/// (empty: no bias).
///
/// ```
/// use weft_core::{Device, Tensor};
/// use weft_nn::{layers::EinsumDense, Ctx, Layer};
/// let heads = EinsumDense::new("abc,cde->abde", &[5, 2, 4]).bias_axes("de");
/// let y = heads.call(&Tensor::ones(&[3, 5, 8], &Device::Cpu)?, &mut Ctx::inference())?;
/// assert_eq!(y.dims(), &[3, 5, 2, 4]);
/// assert_eq!(heads.variables()[0].1.dims(), &[8, 2, 4]);
/// # Ok::<(), weft_core::Error>(())
/// ```
pub struct EinsumDense {
    name: String,
    equation: String,
    output_shape: Vec<usize>,
    bias_axes: String,
    activation: Activation,
    kernel_init: Initializer,
    penalties: Penalties,
    vars: OnceLock<(Var, Option<Var>)>,
}

impl EinsumDense {
    /// A layer for `equation` with the output sizes after the batch axis.
    pub fn new(equation: &str, output_shape: &[usize]) -> Self {
        EinsumDense {
            name: String::new(),
            equation: equation.replace(' ', ""),
            output_shape: output_shape.to_vec(),
            bias_axes: String::new(),
            activation: Activation::Linear,
            kernel_init: Initializer::GlorotUniform,
            penalties: Penalties::default(),
            vars: OnceLock::new(),
        }
    }
    /// Output letters the bias spans.
    pub fn bias_axes(mut self, axes: &str) -> Self {
        self.bias_axes = axes.to_string();
        self
    }
    /// Set the activation.
    pub fn activation(mut self, a: Activation) -> Self {
        self.activation = a;
        self
    }
    /// The kernel's initializer.
    pub fn kernel_initializer(mut self, i: Initializer) -> Self {
        self.kernel_init = i;
        self
    }
    /// Give the layer a name.
    pub fn named(mut self, name: &str) -> Self {
        self.name = name.to_string();
        self
    }
    penalty_options!(kernel: kernel_regularizer, kernel_constraint; bias: bias_regularizer, bias_constraint);
    fn penalties_mut(&mut self) -> &mut Penalties {
        &mut self.penalties
    }

    /// (input, kernel, output) letters.
    fn spec(&self) -> Result<(Vec<char>, Vec<char>, Vec<char>)> {
        let bad = || {
            // The layer's path inside a call, its name outside one.
            let scope = weft_core::trace::current_scope();
            let at = if scope.is_empty() { self.name.clone() } else { scope };
            Error::invalid(
                "EinsumDense",
                format!("{at}: equation {:?} is not of the form `in,kernel->out`", self.equation),
            )
        };
        let (lhs, out) = self.equation.split_once("->").ok_or_else(bad)?;
        let (inp, ker) = lhs.split_once(',').ok_or_else(bad)?;
        Ok((inp.chars().collect(), ker.chars().collect(), out.chars().collect()))
    }

    /// In inference (no gradient recorded), an equation that is a dense layer's product (the
    /// input's last letters summed against the kernel's first, in order, the output the input's
    /// other letters then the kernel's, the bias spanning the kernel's) as one matrix product
    /// with its bias and activation applied in it ([`Tensor::matmul_add_unary`]); `None`
    /// otherwise, for the einsum.
    fn as_dense(&self, x: &Tensor, kernel: &Tensor, bias: &Tensor, op: UnaryOp) -> Result<Option<Tensor>> {
        if weft_core::backprop::grad_enabled() {
            return Ok(None);
        }
        let (inp, ker, out) = self.spec()?;
        let summed = inp.iter().filter(|c| ker.contains(c)).count();
        let (rows, cols) = (inp.len() - summed, ker.len() - summed);
        let dense = summed > 0
            && inp[rows..] == ker[..summed]
            && out.len() == rows + cols
            && out[..rows] == inp[..rows]
            && out[rows..] == ker[summed..]
            && x.rank() == inp.len()
            && kernel.rank() == ker.len()
            && x.dims()[rows..] == kernel.dims()[..summed]
            && bias.dims() == &kernel.dims()[summed..];
        if !dense {
            return Ok(None);
        }
        let m: usize = x.dims()[..rows].iter().product();
        let (k, n): (usize, usize) = (x.dims()[rows..].iter().product(), bias.numel());
        let shape: Vec<usize> = x.dims()[..rows].iter().chain(&kernel.dims()[summed..]).copied().collect();
        let y = x.reshape(&[m, k])?.matmul_add_unary(&kernel.reshape(&[k, n])?, &bias.reshape(&[n])?, op)?;
        Ok(Some(y.reshape(&shape)?))
    }

    /// Under a split: the input axis and the output axis of the kernel's split letter (either may be absent).
    fn split_axes(
        &self,
        shard: Option<(&LayerShard, &Arc<dyn Collectives>)>,
    ) -> Result<(Option<usize>, Option<usize>)> {
        let (inp, ker, out) = self.spec()?;
        match shard.and_then(|s| s.0.vars.get("kernel")) {
            Some(Placement::Shard { axis, .. }) => {
                let c = *ker.get(*axis).ok_or_else(|| {
                    Error::invalid(
                        "EinsumDense",
                        format!("kernel split axis {axis} is not an axis of {:?}", self.equation),
                    )
                })?;
                Ok((inp.iter().position(|&l| l == c), out.iter().position(|&l| l == c)))
            }
            _ => Ok((None, None)),
        }
    }

    fn build(
        &self,
        x: &Tensor,
        path: &str,
        ctx: &Ctx,
        shard: Option<(&LayerShard, &Arc<dyn Collectives>)>,
    ) -> Result<(Var, Option<Var>)> {
        let (inp, ker, out) = self.spec()?;
        let err = |msg: String| Error::invalid("EinsumDense", format!("{path}: {msg}"));
        if inp.len() != x.rank() {
            return Err(err(format!(
                "equation {:?} wants a rank-{} input, got shape {:?}",
                self.equation,
                inp.len(),
                x.dims()
            )));
        }
        // A row split receives its input already split: build from the whole size.
        let mut dims = x.dims().to_vec();
        if let (Some(i), Some((LayerShard { style: tp::Style::Row { sizes, scatter: false }, .. }, _))) =
            (self.split_axes(shard)?.0, shard)
        {
            dims[i] = sizes.iter().sum();
        }
        if self.output_shape.len() + 1 != out.len() {
            return Err(err(format!(
                "output_shape {:?} must give the {} output axes after the batch",
                self.output_shape,
                out.len() - 1
            )));
        }
        let size_of = |c: char| -> Result<usize> {
            if let Some(i) = inp.iter().position(|&l| l == c) {
                Ok(dims[i])
            } else if let Some(i) = out.iter().position(|&l| l == c).filter(|&i| i > 0) {
                Ok(self.output_shape[i - 1])
            } else {
                Err(err(format!("kernel axis '{c}' is in neither the input nor the output")))
            }
        };
        let kshape = ker.iter().map(|&c| size_of(c)).collect::<Result<Vec<_>>>()?;
        let seed = ctx.init_seed(path);
        // Keras gives the initializer the fans of the kernel's axes: an axis whose letter the
        // output has counts toward fan_out, one only the input has toward fan_in (not the shape's
        // last two axes, as for a convolution).
        let (mut fan_in, mut fan_out) = (1usize, 1usize);
        for (c, n) in ker.iter().zip(&kshape) {
            if out.contains(c) {
                fan_out *= n;
            } else {
                fan_in *= n;
            }
        }
        let kernel =
            tp::new_var(shard, path, "kernel", x.device(), self.kernel_init, &kshape, Some((fan_in, fan_out)), seed)?;
        let bias = if self.bias_axes.is_empty() {
            None
        } else {
            // Keras: the bias spans the output from its first bias axis to the end, size 1 where
            // an axis is not a bias axis, so it broadcasts over the rest.
            let first = out.iter().position(|c| self.bias_axes.contains(*c)).ok_or_else(|| {
                err(format!("bias axes {:?} are not output axes of {:?}", self.bias_axes, self.equation))
            })?;
            for c in self.bias_axes.chars() {
                match out.iter().position(|&l| l == c) {
                    Some(i) if i > 0 && i <= self.output_shape.len() => {}
                    Some(0) => {
                        return Err(err(format!(
                            "bias axis '{c}' is the batch axis of {:?}: a bias cannot span the batch",
                            self.equation
                        )));
                    }
                    _ => {
                        return Err(err(format!(
                            "bias axis '{c}' is not an output axis of {:?} with a size in output_shape {:?}",
                            self.equation, self.output_shape
                        )));
                    }
                }
            }
            let bshape: Vec<usize> = out[first..]
                .iter()
                .map(|&c| match out.iter().position(|&l| l == c) {
                    Some(i) if self.bias_axes.contains(c) => self.output_shape[i - 1],
                    _ => 1,
                })
                .collect();
            Some(tp::new_var(shard, path, "bias", x.device(), Initializer::Zeros, &bshape, None, 0)?)
        };
        Ok((kernel, bias))
    }
}

impl Layer for EinsumDense {
    fn call(&self, x: &Tensor, ctx: &mut Ctx) -> Result<Tensor> {
        let _scope = crate::scope::enter(self);
        let path = trace::current_scope();
        let shard = tp::shard_of(&ctx.tp, &path);
        let (kernel, bias) = match self.vars.get() {
            Some(v) => v,
            None => {
                let built = self.build(x, &path, ctx, shard)?;
                let _ = self.vars.set(built);
                self.vars.get().expect("just set")
            }
        };
        let (in_axis, out_axis) = self.split_axes(shard)?;
        let y = tp::linear_fused(
            self,
            ctx,
            x,
            (in_axis.unwrap_or(0), out_axis.unwrap_or(0)),
            |x, epilogue| {
                let kernel = kernel.as_tensor();
                let with = |e: Error| Error::invalid("EinsumDense", format!("{path}: {e}"));
                let Some((b, op)) = epilogue else { return Tensor::einsum(&self.equation, &[x, kernel]).map_err(with) };
                if let Some(y) = self.as_dense(x, kernel, b, op).map_err(with)? {
                    return Ok(y);
                }
                Tensor::einsum(&self.equation, &[x, kernel]).map_err(with)?.add_unary(b, op)
            },
            bias.as_ref().map(|b| b.as_tensor()),
            self.activation,
        )?;
        self.penalties.activity(&y, ctx)?;
        Ok(y)
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn set_name(&mut self, name: String) {
        self.name = name;
    }
    fn kind(&self) -> &'static str {
        "EinsumDense"
    }
    fn attributes(&self) -> Vec<(String, String)> {
        vec![
            ("equation".into(), self.equation.clone()),
            ("bias_axes".into(), self.bias_axes.clone()),
            ("activation".into(), self.activation.name().into()),
        ]
    }
    fn variables(&self) -> Vec<(String, Var)> {
        kernel_and_bias(self.vars.get())
    }
    fn regularizers(&self) -> Vec<(String, crate::Regularizer)> {
        self.penalties.regularizers_of(|v| v == "kernel" || !self.bias_axes.is_empty())
    }
    fn constraints(&self) -> Vec<(String, crate::Constraint)> {
        self.penalties.constraints_of(|v| v == "kernel" || !self.bias_axes.is_empty())
    }
    /// Column: the first kernel letter the output has and the input does not; row: the first
    /// the input has and the output does not (a letter in all three cannot be split).
    fn split_rule(&self) -> SplitRule {
        let Ok((inp, ker, out)) = self.spec() else {
            return SplitRule::Whole { why: format!("equation {:?} cannot be read", self.equation) };
        };
        let find = |made: &[char], summed: &[char]| {
            ker.iter().enumerate().find(|(_, c)| made.contains(c) && !summed.contains(c)).map(|(k, c)| {
                let at = made.iter().position(|x| x == c).unwrap_or(0);
                (SplitAxis { kernel: k, last: at + 1 == made.len() }, *c, at)
            })
        };
        let column = find(&out, &inp);
        let bias = !self.bias_axes.is_empty();
        // The bias spans the output from its first letter on; it follows a column split when it
        // spans the split letter.
        let first = out.iter().position(|c| self.bias_axes.contains(*c));
        let column_bias = match (column, first) {
            (Some((_, c, at)), Some(first)) if self.bias_axes.contains(c) && at >= first => Some(at - first),
            _ => None,
        };
        SplitRule::Linear(LinearSplit {
            kernel: "kernel".into(),
            bias: bias.then(|| "bias".into()),
            column: column
                .map(|c| c.0)
                .filter(|_| self.activation.is_elementwise() && self.penalties.activity.is_none()),
            column_bias,
            row: find(&inp, &out).map(|r| r.0),
        })
    }
}
