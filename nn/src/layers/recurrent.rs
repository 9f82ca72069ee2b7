//! Recurrent layers: SimpleRNN, GRU and LSTM, run step by step over the time axis of
//! `[batch, time, features]`, each step built from matmuls and activations, an LSTM's or a GRU's
//! gates and state update with Keras' default activations as one op
//! (`Tensor::lstm_cell_of_shares`, `Tensor::gru_cell`), the biases added by the products
//! (`Tensor::matmul_add_unary`); the gradient flows back through time by the same autograd as
//! everything else.

use crate::penalty::{Penalties, penalty_options};
use crate::split::SplitRule;
use crate::{Activation, Ctx, Initializer, Layer, tp};
use std::sync::OnceLock;
use weft_core::ops::{BinaryOp, UnaryOp};
use weft_core::{DType, Error, Result, Tensor, Var, trace};

/// Which cell a recurrent layer runs.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Cell {
    Simple,
    Gru { reset_after: bool },
    Lstm { unit_forget_bias: bool },
}

impl Cell {
    /// Blocks of `units` in the kernels: one per gate.
    fn gates(self) -> usize {
        match self {
            Cell::Simple => 1,
            Cell::Gru { .. } => 3,
            Cell::Lstm { .. } => 4,
        }
    }
}

/// What the three layers share: the settings, the variables and the loop over time.
struct Recurrent {
    name: String,
    units: usize,
    cell: Cell,
    activation: Activation,
    recurrent_activation: Activation,
    use_bias: bool,
    return_sequences: bool,
    go_backwards: bool,
    zero_output_for_mask: bool,
    dropout: f32,
    recurrent_dropout: f32,
    kernel_init: Initializer,
    recurrent_init: Initializer,
    bias_init: Initializer,
    penalties: Penalties,
    vars: OnceLock<(Var, Var, Option<Var>)>,
}

impl Recurrent {
    fn new(units: usize, cell: Cell) -> Self {
        Recurrent {
            name: String::new(),
            units,
            cell,
            activation: Activation::Tanh,
            recurrent_activation: Activation::Sigmoid,
            use_bias: true,
            return_sequences: false,
            go_backwards: false,
            zero_output_for_mask: false,
            dropout: 0.0,
            recurrent_dropout: 0.0,
            kernel_init: Initializer::GlorotUniform,
            recurrent_init: Initializer::Orthogonal(1.0),
            bias_init: Initializer::Zeros,
            penalties: Penalties::default(),
            vars: OnceLock::new(),
        }
    }

    /// The bias's shape: GRU's `reset_after` keeps an input and a recurrent bias, `[2, 3 units]`.
    fn bias_shape(&self) -> Vec<usize> {
        let n = self.cell.gates() * self.units;
        match self.cell {
            Cell::Gru { reset_after: true } => vec![2, n],
            _ => vec![n],
        }
    }

    fn build(&self, layer: &dyn Layer, ctx: &Ctx, x: &Tensor, path: &str) -> Result<&(Var, Var, Option<Var>)> {
        if let Some(v) = self.vars.get() {
            return Ok(v);
        }
        let (u, n, dev) = (self.units, self.cell.gates() * self.units, x.device());
        let seed = ctx.init_seed(path);
        let kernel = tp::variable(layer, ctx, "kernel", dev, self.kernel_init, &[x.dims()[2], n], seed)?;
        let recurrent = tp::variable(layer, ctx, "recurrent_kernel", dev, self.recurrent_init, &[u, n], seed ^ 2)?;
        let bias = match (self.use_bias, self.cell) {
            (false, _) => None,
            // Keras' unit_forget_bias: the forget gate's block starts at 1.
            (true, Cell::Lstm { unit_forget_bias: true }) => {
                let part = |len: usize, s: u64| self.bias_init.init(&[len], s, dev);
                let b = Tensor::concat(&[part(u, seed ^ 3)?, Tensor::ones(&[u], dev)?, part(2 * u, seed ^ 4)?], 0)?;
                Some(Var::new(b)?)
            }
            (true, _) => Some(tp::variable(layer, ctx, "bias", dev, self.bias_init, &self.bias_shape(), seed ^ 1)?),
        };
        let _ = self.vars.set((kernel, recurrent, bias));
        Ok(self.vars.get().expect("just set"))
    }

    fn forward(&self, layer: &dyn Layer, x: &Tensor, mask: Option<&Tensor>, ctx: &mut Ctx) -> Result<Tensor> {
        let _scope = crate::scope::enter(layer);
        let path = trace::current_scope();
        let kind = layer.kind();
        if x.rank() != 3 || x.dims()[1] == 0 || self.units == 0 {
            return Err(Error::invalid(
                kind,
                format!(
                    "{path}: expects [batch, time, features] with at least one step, and units > 0; got shape {:?}",
                    x.dims()
                ),
            ));
        }
        let (b, steps) = (x.dims()[0], x.dims()[1]);
        let (kernel, recurrent, bias) = self.build(layer, ctx, x, &path)?;
        let n = self.cell.gates() * self.units;
        if kernel.dims() != [x.dims()[2], n] {
            return Err(Error::invalid(
                kind,
                format!("{path}: input of shape {:?} does not fit kernel of shape {:?}", x.dims(), kernel.dims()),
            ));
        }
        let keep = match mask {
            Some(m) if m.dims() != &x.dims()[..2] => {
                return Err(Error::invalid(
                    kind,
                    format!("{path}: a mask of shape {:?} for an input of shape {:?}", m.dims(), x.dims()),
                ));
            }
            Some(m) => Some(m.to_device(x.device())?.to_dtype(DType::F32)?.cmp_scalar(BinaryOp::Ne, 0.0)?),
            None => None,
        };
        // The input's share of every step at once: one matmul, [batch, time, gates x units].
        let (input_bias, recurrent_bias) = match (bias, self.cell) {
            (Some(b), Cell::Gru { reset_after: true }) => {
                (Some(b.narrow(0, 0, 1)?.reshape(&[n])?), Some(b.narrow(0, 1, 1)?.reshape(&[n])?))
            }
            (Some(b), _) => (Some(b.as_tensor().clone()), None),
            (None, _) => (None, None),
        };
        for (what, rate) in [("dropout", self.dropout), ("recurrent_dropout", self.recurrent_dropout)] {
            if !(0.0..1.0).contains(&rate) {
                return Err(Error::invalid(kind, format!("{path}: {what} must be in [0, 1), got {rate}")));
            }
        }
        // Keras' dropout: one mask for the inputs and one for the state, kept over every step.
        let x = match step_mask(ctx, &path, self.dropout, 0, b, x.dims()[2], x.device())? {
            Some(m) => x.mul(&m.unsqueeze(1)?)?,
            None => x.clone(),
        };
        // The input bias added by the product as it stores (one op).
        let xs = match &input_bias {
            Some(ib) => x.matmul_add_unary(kernel, ib, UnaryOp::Identity)?,
            None => x.matmul(kernel)?,
        };
        let state_mask = step_mask(ctx, &path, self.recurrent_dropout, 1, b, self.units, x.device())?;
        let u = self.units;
        let gate = |t: &Tensor, i: usize| t.narrow(-1, i * u, u);
        let (act, ract) = (self.activation, self.recurrent_activation);
        // Keras' default activations: an LSTM's or a reset-after GRU's step is one op each way
        // (Tensor::lstm_cell_of_shares, Tensor::gru_cell).
        let fused = (act, ract) == (Activation::Tanh, Activation::Sigmoid);
        let mut h = Tensor::zeros(&[b, u], x.device())?;
        let mut c = Tensor::zeros(&[b, u], x.device())?;
        let mut outputs = Vec::with_capacity(if self.return_sequences { steps } else { 0 });
        let mut last = None;
        let order: Vec<usize> = if self.go_backwards { (0..steps).rev().collect() } else { (0..steps).collect() };
        for t in order {
            let xt = xs.narrow(1, t, 1)?.squeeze(1)?;
            let hd = match &state_mask {
                Some(m) => h.mul(m)?,
                None => h.clone(),
            };
            let (h_new, c_new) = match self.cell {
                Cell::Simple => {
                    let hz = hd.matmul(recurrent)?;
                    // The sum and the activation in one pass where the activation is one op.
                    let h = match act.as_unary() {
                        Some(op) => xt.add_unary(&hz, op)?,
                        None => act.apply(&xt.add(&hz)?)?,
                    };
                    (h, None)
                }
                Cell::Lstm { .. } => {
                    let hz = hd.matmul(recurrent)?;
                    if fused {
                        // The two shares of the gates added in the step.
                        let (h, c_new) = Tensor::lstm_cell_of_shares(&xt, &hz, &c)?;
                        (h, Some(c_new))
                    } else {
                        let z = xt.add(&hz)?;
                        let (i, f) = (ract.apply(&gate(&z, 0)?)?, ract.apply(&gate(&z, 1)?)?);
                        let (g, o) = (act.apply(&gate(&z, 2)?)?, ract.apply(&gate(&z, 3)?)?);
                        let c_new = f.mul(&c)?.add(&i.mul(&g)?)?;
                        (o.mul(&act.apply(&c_new)?)?, Some(c_new))
                    }
                }
                Cell::Gru { reset_after } => {
                    let hr = if reset_after {
                        // The recurrent bias added by the product as it stores (one op).
                        match &recurrent_bias {
                            Some(rb) => hd.matmul_add_unary(recurrent, rb, UnaryOp::Identity)?,
                            None => hd.matmul(recurrent)?,
                        }
                    } else {
                        hd.matmul(&recurrent.narrow(1, 0, 2 * u)?)?
                    };
                    if reset_after && fused {
                        (Tensor::gru_cell(&xt, &hr, &h)?, None)
                    } else {
                        let z = ract.apply(&gate(&xt, 0)?.add(&gate(&hr, 0)?)?)?;
                        let r = ract.apply(&gate(&xt, 1)?.add(&gate(&hr, 1)?)?)?;
                        let candidate = if reset_after {
                            r.mul(&gate(&hr, 2)?)?
                        } else {
                            r.mul(&hd)?.matmul(&recurrent.narrow(1, 2 * u, u)?)?
                        };
                        let hh = act.apply(&gate(&xt, 2)?.add(&candidate)?)?;
                        // h = z h + (1 - z) hh
                        (hh.add(&z.mul(&h.sub(&hh)?)?)?, None)
                    }
                }
            };
            // A masked step carries the state (and the output) on unchanged, as Keras does.
            let carry = |new: Tensor, old: &Tensor| -> Result<Tensor> {
                match &keep {
                    Some(k) => {
                        let m = k.narrow(1, t, 1)?;
                        old.add(&m.mul(&new.sub(old)?)?)
                    }
                    None => Ok(new),
                }
            };
            h = carry(h_new, &h)?;
            if let Some(c_new) = c_new {
                c = carry(c_new, &c)?;
            }
            // A masked step's output is the last one's, or 0 with zero_output_for_mask.
            let out = match (&keep, self.zero_output_for_mask) {
                (Some(k), true) => h.mul(&k.narrow(1, t, 1)?)?,
                _ => h.clone(),
            };
            if self.return_sequences {
                outputs.push(out);
            } else {
                last = Some(out);
            }
        }
        let y = match last {
            _ if self.return_sequences => Tensor::stack(&outputs, 1)?,
            Some(out) => out,
            None => h,
        };
        self.penalties.activity(&y, ctx)?;
        Ok(y)
    }

    /// A fresh copy (no weights) running the other way: the backward half of a `Bidirectional`.
    fn reversed(&self) -> Recurrent {
        Recurrent {
            name: String::new(),
            go_backwards: !self.go_backwards,
            penalties: self.penalties.clone(),
            vars: OnceLock::new(),
            ..*self
        }
    }

    fn variables(&self) -> Vec<(String, Var)> {
        let Some((k, r, b)) = self.vars.get() else { return Vec::new() };
        let mut v = vec![("kernel".to_string(), k.clone()), ("recurrent_kernel".to_string(), r.clone())];
        v.extend(b.iter().map(|b| ("bias".to_string(), b.clone())));
        v
    }
}

/// A dropout mask of `[rows, width]` for a training call (`None` otherwise), drawn for the whole
/// batch and cut to this rank's rows on a data axis, so every rank drops what one device would.
fn step_mask(
    ctx: &Ctx,
    path: &str,
    rate: f32,
    salt: u64,
    rows: usize,
    width: usize,
    dev: &weft_core::Device,
) -> Result<Option<Tensor>> {
    if !ctx.training || rate == 0.0 {
        return Ok(None);
    }
    let seed = ctx.seed_for(path) ^ salt.wrapping_mul(0x9e37_79b9);
    let total = ctx.batch_part.map_or(rows, |(_, total)| total);
    let mut m = Tensor::ones(&[total, width], dev)?.dropout(rate, seed, true)?;
    if let Some((start, _)) = ctx.batch_part {
        m = m.narrow(0, start, rows)?;
    }
    Ok(Some(m))
}

/// The builder methods and the `Layer` impl the three layers share.
macro_rules! recurrent_layer {
    ($t:ident, $kind:literal) => {
        impl $t {
            /// The activation of the candidate state and of the output (default tanh).
            pub fn activation(mut self, a: Activation) -> Self {
                self.0.activation = a;
                self
            }
            /// The activation of the gates (default sigmoid; SimpleRNN has none).
            pub fn recurrent_activation(mut self, a: Activation) -> Self {
                self.0.recurrent_activation = a;
                self
            }
            /// With or without biases.
            pub fn use_bias(mut self, on: bool) -> Self {
                self.0.use_bias = on;
                self
            }
            /// Return the output of every step, `[batch, time, units]` (default: the last
            /// step's, `[batch, units]`); the input's mask then passes on.
            pub fn return_sequences(mut self, on: bool) -> Self {
                self.0.return_sequences = on;
                self
            }
            /// Run from the last step to the first (the outputs of every step come in that
            /// order, as Keras gives them).
            pub fn go_backwards(mut self, on: bool) -> Self {
                self.0.go_backwards = on;
                self
            }
            /// Give a masked step the output 0 rather than the step before's (Keras'
            /// `zero_output_for_mask`; a `Bidirectional` returning sequences sets it).
            pub fn zero_output_for_mask(mut self, on: bool) -> Self {
                self.0.zero_output_for_mask = on;
                self
            }
            /// The fraction of the inputs dropped while training (Keras' `dropout`): one mask for
            /// every step.
            pub fn dropout(mut self, rate: f32) -> Self {
                self.0.dropout = rate;
                self
            }
            /// The fraction of the state dropped before each recurrent product while training
            /// (Keras' `recurrent_dropout`): one mask for every step.
            pub fn recurrent_dropout(mut self, rate: f32) -> Self {
                self.0.recurrent_dropout = rate;
                self
            }
            /// The input kernel's initializer (default Glorot uniform).
            pub fn kernel_initializer(mut self, i: Initializer) -> Self {
                self.0.kernel_init = i;
                self
            }
            /// The recurrent kernel's initializer (default orthogonal).
            pub fn recurrent_initializer(mut self, i: Initializer) -> Self {
                self.0.recurrent_init = i;
                self
            }
            /// The bias's initializer (default zeros).
            pub fn bias_initializer(mut self, i: Initializer) -> Self {
                self.0.bias_init = i;
                self
            }
            /// Give the layer a name.
            pub fn named(mut self, name: &str) -> Self {
                self.0.name = name.to_string();
                self
            }
            penalty_options!(
                kernel: kernel_regularizer, kernel_constraint;
                recurrent_kernel: recurrent_regularizer, recurrent_constraint;
                bias: bias_regularizer, bias_constraint
            );
            fn penalties_mut(&mut self) -> &mut Penalties {
                &mut self.0.penalties
            }
        }

        impl super::bidirectional::Reversible for $t {
            fn reversed(&self) -> Box<dyn Layer> {
                Box::new($t(self.0.reversed()))
            }
            fn returns_sequences(&self) -> bool {
                self.0.return_sequences
            }
            fn set_zero_output_for_mask(&mut self, on: bool) {
                self.0.zero_output_for_mask = on;
            }
        }

        impl Layer for $t {
            fn call(&self, x: &Tensor, ctx: &mut Ctx) -> Result<Tensor> {
                self.0.forward(self, x, None, ctx)
            }
            fn call_with(&self, inputs: &[Tensor], masks: &[Option<Tensor>], ctx: &mut Ctx) -> Result<Tensor> {
                let [x] = inputs else {
                    return Err(Error::invalid($kind, format!("{} takes one input, got {}", self.0.name, inputs.len())));
                };
                self.0.forward(self, x, masks.first().and_then(Option::as_ref), ctx)
            }
            fn name(&self) -> &str {
                &self.0.name
            }
            fn set_name(&mut self, name: String) {
                self.0.name = name;
            }
            fn kind(&self) -> &'static str {
                $kind
            }
            fn variables(&self) -> Vec<(String, Var)> {
                self.0.variables()
            }
            fn regularizers(&self) -> Vec<(String, crate::Regularizer)> {
                self.0.penalties.regularizers_of(|v| v != "bias" || self.0.use_bias)
            }
            fn constraints(&self) -> Vec<(String, crate::Constraint)> {
                self.0.penalties.constraints_of(|v| v != "bias" || self.0.use_bias)
            }
            fn split_rule(&self) -> SplitRule {
                SplitRule::Whole { why: "each step needs the whole state of the one before".into() }
            }
        }
    };
}

/// Keras' `SimpleRNN`: `h_t = activation(x_t kernel + h_{t-1} recurrent_kernel + bias)`.
///
/// ```
/// use weft_core::{Device, Tensor};
/// use weft_nn::{layers::SimpleRNN, Ctx, Layer};
/// let rnn = SimpleRNN::new(4).return_sequences(true);
/// let y = rnn.call(&Tensor::ones(&[2, 5, 3], &Device::Cpu)?, &mut Ctx::inference())?;
/// assert_eq!(y.dims(), &[2, 5, 4]);
/// # Ok::<(), weft_core::Error>(())
/// ```
pub struct SimpleRNN(Recurrent);

impl SimpleRNN {
    /// `units` outputs, tanh.
    pub fn new(units: usize) -> Self {
        SimpleRNN(Recurrent::new(units, Cell::Simple))
    }
}

recurrent_layer!(SimpleRNN, "SimpleRNN");

/// Keras' `GRU` (gates in Keras' order: update, reset, candidate), by default with
/// `reset_after` (the reset gate applied after the recurrent matmul, a bias of `[2, 3 units]`:
/// the form cuDNN and Keras 3 use).
///
/// ```
/// use weft_core::{Device, Tensor};
/// use weft_nn::{layers::GRU, Ctx, Layer};
/// let gru = GRU::new(4);
/// let y = gru.call(&Tensor::ones(&[2, 5, 3], &Device::Cpu)?, &mut Ctx::inference())?;
/// assert_eq!(y.dims(), &[2, 4]);
/// assert_eq!(gru.variables()[2].1.dims(), &[2, 12]); // bias: input and recurrent
/// # Ok::<(), weft_core::Error>(())
/// ```
pub struct GRU(Recurrent);

impl GRU {
    /// `units` outputs, tanh and sigmoid, `reset_after`.
    pub fn new(units: usize) -> Self {
        GRU(Recurrent::new(units, Cell::Gru { reset_after: true }))
    }
    /// Apply the reset gate after the recurrent matmul (default, Keras 3) or before it (the
    /// original GRU, one bias of `[3 units]`).
    pub fn reset_after(mut self, on: bool) -> Self {
        self.0.cell = Cell::Gru { reset_after: on };
        self
    }
}

recurrent_layer!(GRU, "GRU");

/// Keras' `LSTM` (gates in Keras' order: input, forget, cell, output), by default with
/// `unit_forget_bias` (the forget gate's bias starts at 1).
///
/// ```
/// use weft_core::{Device, Tensor};
/// use weft_nn::{layers::LSTM, Ctx, Layer};
/// let lstm = LSTM::new(4);
/// let y = lstm.call(&Tensor::ones(&[2, 5, 3], &Device::Cpu)?, &mut Ctx::inference())?;
/// assert_eq!(y.dims(), &[2, 4]);
/// assert_eq!(lstm.variables()[0].1.dims(), &[3, 16]); // kernel: four gates
/// # Ok::<(), weft_core::Error>(())
/// ```
pub struct LSTM(Recurrent);

impl LSTM {
    /// `units` outputs, tanh and sigmoid, `unit_forget_bias`.
    pub fn new(units: usize) -> Self {
        LSTM(Recurrent::new(units, Cell::Lstm { unit_forget_bias: true }))
    }
    /// Start the forget gate's bias at 1 (default) rather than at the bias initializer's value.
    pub fn unit_forget_bias(mut self, on: bool) -> Self {
        self.0.cell = Cell::Lstm { unit_forget_bias: on };
        self
    }
}

recurrent_layer!(LSTM, "LSTM");
