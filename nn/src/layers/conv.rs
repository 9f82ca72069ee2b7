//! Conv1D and Conv2D: `activation(conv(x, kernel) + bias)` over channels-last input, with
//! Keras' kernel layout (`[k, c_in, filters]`, `[kh, kw, c_in, filters]`), so Keras weights load
//! as they are. Split like Dense: by output channels (column) or input channels (row).

use crate::layer::kernel_and_bias;
use crate::penalty::{Penalties, penalty_options};
use crate::split::{LinearSplit, SplitAxis, SplitRule};
use crate::{Activation, Ctx, Initializer, Layer, tp};
use std::sync::OnceLock;
use weft_core::conv::Padding;
use weft_core::ops::UnaryOp;
use weft_core::{Error, Result, Tensor, Var, trace};

/// What the two convolution layers share: settings in (height, width) order, a 1-D layer using
/// the width only.
struct Conv {
    name: String,
    filters: usize,
    kernel: [usize; 2],
    strides: [usize; 2],
    dilation: [usize; 2],
    padding: Padding,
    groups: usize,
    activation: Activation,
    use_bias: bool,
    kernel_init: Initializer,
    bias_init: Initializer,
    penalties: Penalties,
    vars: OnceLock<(Var, Option<Var>)>,
}

impl Conv {
    fn new(filters: usize, kernel: [usize; 2]) -> Self {
        Conv {
            name: String::new(),
            filters,
            kernel,
            strides: [1, 1],
            dilation: [1, 1],
            padding: Padding::Valid,
            groups: 1,
            activation: Activation::Linear,
            use_bias: true,
            kernel_init: Initializer::GlorotUniform,
            bias_init: Initializer::Zeros,
            penalties: Penalties::default(),
            vars: OnceLock::new(),
        }
    }

    /// The forward pass of `layer` (whose settings these are); `one_d` for Conv1D.
    fn call(&self, layer: &dyn Layer, kind: &'static str, x: &Tensor, ctx: &mut Ctx, one_d: bool) -> Result<Tensor> {
        let _scope = crate::scope::enter(layer);
        let path = trace::current_scope();
        let want = if one_d { 3 } else { 4 };
        if x.rank() != want {
            let axes = if one_d { "[batch, steps, channels]" } else { "[batch, height, width, channels]" };
            return Err(Error::invalid(kind, format!("{path}: expects {axes}, got shape {:?}", x.dims())));
        }
        if self.filters == 0 {
            return Err(Error::invalid(kind, format!("{path}: filters must be at least 1")));
        }
        let g = self.groups;
        if g == 0 || !self.filters.is_multiple_of(g) || !x.dims()[want - 1].is_multiple_of(g) {
            return Err(Error::invalid(
                kind,
                format!(
                    "{path}: {g} groups must divide the input's {} channels and the {} filters",
                    x.dims()[want - 1],
                    self.filters
                ),
            ));
        }
        if !one_d && self.padding == Padding::Causal {
            return Err(Error::invalid(kind, format!("{path}: causal padding is for Conv1D only")));
        }
        let shard = tp::shard_of(&ctx.tp, &path);
        let local_in = x.dims()[want - 1];
        let (kernel, bias) = match self.vars.get() {
            Some(v) => v,
            None => {
                // A grouped kernel takes each group's channels only (Keras' `groups`).
                let c_in = tp::full_input(shard.map(|s| &s.0.style), local_in) / g;
                let mut shape = if one_d { vec![self.kernel[1]] } else { self.kernel.to_vec() };
                shape.extend([c_in, self.filters]);
                let seed = ctx.init_seed(&path);
                let k = tp::new_var(shard, &path, "kernel", x.device(), self.kernel_init, &shape, None, seed)?;
                let b = match self.use_bias {
                    true => Some(tp::new_var(
                        shard,
                        &path,
                        "bias",
                        x.device(),
                        self.bias_init,
                        &[self.filters],
                        None,
                        seed ^ 1,
                    )?),
                    false => None,
                };
                let _ = self.vars.set((k, b));
                self.vars.get().expect("just set")
            }
        };
        let last = x.rank() - 1;
        let product = |x: &Tensor, epilogue: Option<(&Tensor, UnaryOp)>| {
            let k_in = kernel.dims()[kernel.rank() - 2];
            if x.dims()[last] != k_in * g {
                return Err(Error::invalid(
                    kind,
                    format!("{path}: input of shape {:?} does not fit kernel of shape {:?}", x.dims(), kernel.dims()),
                ));
            }
            let conv = |x: &Tensor, k: &Tensor| {
                if one_d {
                    x.conv1d(k, self.strides[1], self.dilation[1], self.padding)
                } else {
                    x.conv2d(k, self.strides, self.dilation, self.padding)
                }
            };
            let (s, d, p) = (self.strides, self.dilation, self.padding);
            let with = |e: Error| Error::invalid(kind, format!("{path}: {e}"));
            match (g, epilogue) {
                // Bias and activation applied to the output blocks while in cache.
                (1, Some((b, op))) if one_d => return x.conv1d_add_unary(kernel, b, op, s[1], d[1], p).map_err(with),
                (1, Some((b, op))) => return x.conv2d_add_unary(kernel, b, op, s, d, p).map_err(with),
                (1, None) => return conv(x, kernel).map_err(with),
                _ => {}
            }
            // Each group: its input channels through its block of filters, side by side.
            let (c, f) = (k_in, self.filters / g);
            let parts = (0..g)
                .map(|i| conv(&x.narrow(last as isize, i * c, c)?, &kernel.narrow(-1, i * f, f)?))
                .collect::<Result<Vec<_>>>()
                .map_err(with)?;
            let y = Tensor::concat(&parts, -1)?;
            match epilogue {
                Some((b, op)) => y.add_unary(b, op),
                None => Ok(y),
            }
        };
        let bias = bias.as_ref().map(|b| b.as_tensor());
        let y = tp::linear_fused(layer, ctx, x, (last, last), product, bias, self.activation)?;
        self.penalties.activity(&y, ctx)?;
        Ok(y)
    }

    fn attributes(&self, one_d: bool) -> Vec<(String, String)> {
        let pick = |v: [usize; 2]| if one_d { v[1].to_string() } else { format!("{}x{}", v[0], v[1]) };
        let mut a = vec![("kernel".into(), pick(self.kernel))];
        if self.strides != [1, 1] {
            a.push(("strides".into(), pick(self.strides)));
        }
        if self.dilation != [1, 1] {
            a.push(("dilation".into(), pick(self.dilation)));
        }
        a.push(("padding".into(), format!("{:?}", self.padding).to_lowercase()));
        a.push(("activation".into(), self.activation.name().into()));
        a
    }

    /// Column: the output channels (the kernel's last axis, the output's last); row: the input
    /// channels (the kernel's second to last, the input's last).
    fn split_rule(&self, rank: usize) -> SplitRule {
        if self.groups > 1 {
            return SplitRule::Whole { why: "a grouped convolution's filters each see one group of channels".into() };
        }
        let axis = |kernel| SplitAxis { kernel, last: true };
        SplitRule::Linear(LinearSplit {
            kernel: "kernel".into(),
            bias: self.use_bias.then(|| "bias".into()),
            column: (self.activation.is_elementwise() && self.penalties.activity.is_none()).then(|| axis(rank - 1)),
            column_bias: self.use_bias.then_some(0),
            row: Some(axis(rank - 2)),
        })
    }
}

/// The builder methods and the `Layer` impl both layers share.
macro_rules! conv_layer {
    ($t:ident, $kind:literal, $one_d:expr, $window:ty, $to2:expr) => {
        impl $t {
            /// Step between windows (Keras' `strides`; default 1).
            pub fn strides(mut self, s: $window) -> Self {
                self.0.strides = $to2(s);
                self
            }
            /// Step between a window's taps (Keras' `dilation_rate`; default 1).
            pub fn dilation_rate(mut self, d: $window) -> Self {
                self.0.dilation = $to2(d);
                self
            }
            /// Cut the channels into `groups` (Keras' `groups`, default 1): each block of filters
            /// sees one block of the input's channels; both counts must divide by it.
            pub fn groups(mut self, groups: usize) -> Self {
                self.0.groups = groups;
                self
            }
            /// How the input is padded (default `Valid`).
            pub fn padding(mut self, p: Padding) -> Self {
                self.0.padding = p;
                self
            }
            /// Set the activation.
            pub fn activation(mut self, a: Activation) -> Self {
                self.0.activation = a;
                self
            }
            /// With or without a bias.
            pub fn use_bias(mut self, b: bool) -> Self {
                self.0.use_bias = b;
                self
            }
            /// The kernel's initializer (default Glorot uniform, over Keras' receptive-field fans).
            pub fn kernel_initializer(mut self, i: Initializer) -> Self {
                self.0.kernel_init = i;
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
            penalty_options!(kernel: kernel_regularizer, kernel_constraint; bias: bias_regularizer, bias_constraint);
            fn penalties_mut(&mut self) -> &mut Penalties {
                &mut self.0.penalties
            }
        }

        impl Layer for $t {
            fn call(&self, x: &Tensor, ctx: &mut Ctx) -> Result<Tensor> {
                self.0.call(self, $kind, x, ctx, $one_d)
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
            fn attributes(&self) -> Vec<(String, String)> {
                self.0.attributes($one_d)
            }
            fn variables(&self) -> Vec<(String, Var)> {
                kernel_and_bias(self.0.vars.get())
            }
            fn regularizers(&self) -> Vec<(String, crate::Regularizer)> {
                self.0.penalties.regularizers_of(|v| v == "kernel" || self.0.use_bias)
            }
            fn constraints(&self) -> Vec<(String, crate::Constraint)> {
                self.0.penalties.constraints_of(|v| v == "kernel" || self.0.use_bias)
            }
            /// A convolution does not carry a mask on (as in Keras).
            fn output_mask(&self, _: &[Tensor], _: &[Option<Tensor>], _: &Tensor) -> Result<Option<Tensor>> {
                Ok(None)
            }
            fn split_rule(&self) -> SplitRule {
                self.0.split_rule(if $one_d { 3 } else { 4 })
            }
        }
    };
}

/// A 2-D convolution: `[batch, h, w, c_in]` to `[batch, out_h, out_w, filters]`, kernel
/// `[kh, kw, c_in, filters]` built from the input's channels on the first call.
///
/// ```
/// use weft_core::{conv::Padding, Device, Tensor};
/// use weft_nn::{layers::Conv2D, Activation, Ctx, Layer};
/// let conv = Conv2D::new(8, [3, 3]).padding(Padding::Same).strides([2, 2]).activation(Activation::Relu);
/// let y = conv.call(&Tensor::ones(&[2, 8, 8, 3], &Device::Cpu)?, &mut Ctx::inference())?;
/// assert_eq!(y.dims(), &[2, 4, 4, 8]);
/// assert_eq!(conv.variables()[0].1.dims(), &[3, 3, 3, 8]);
/// # Ok::<(), weft_core::Error>(())
/// ```
pub struct Conv2D(Conv);

impl Conv2D {
    /// `filters` output channels from windows of `kernel_size` (height, width).
    pub fn new(filters: usize, kernel_size: [usize; 2]) -> Self {
        Conv2D(Conv::new(filters, kernel_size))
    }
}

conv_layer!(Conv2D, "Conv2D", false, [usize; 2], |v: [usize; 2]| v);

/// A 1-D convolution over time: `[batch, steps, c_in]` to `[batch, out_steps, filters]`, kernel
/// `[kernel_size, c_in, filters]`; `Padding::Causal` lets step t see steps up to t only.
///
/// ```
/// use weft_core::{conv::Padding, Device, Tensor};
/// use weft_nn::{layers::Conv1D, Ctx, Layer};
/// let conv = Conv1D::new(4, 3).padding(Padding::Causal).dilation_rate(2);
/// let y = conv.call(&Tensor::ones(&[2, 10, 5], &Device::Cpu)?, &mut Ctx::inference())?;
/// assert_eq!(y.dims(), &[2, 10, 4]);
/// # Ok::<(), weft_core::Error>(())
/// ```
pub struct Conv1D(Conv);

impl Conv1D {
    /// `filters` output channels from windows of `kernel_size` steps.
    pub fn new(filters: usize, kernel_size: usize) -> Self {
        Conv1D(Conv::new(filters, [1, kernel_size]))
    }
}

conv_layer!(Conv1D, "Conv1D", true, usize, |v: usize| [1, v]);
