//! Dense: `activation(x @ kernel + bias)` over the last axis.

use crate::layer::kernel_and_bias;
use crate::penalty::{Penalties, penalty_options};
use crate::split::{LinearSplit, SplitAxis, SplitRule};
use crate::{Activation, Ctx, Initializer, Layer, tp};
use std::sync::OnceLock;
use weft_core::{Error, Result, Tensor, Var, trace};

/// A fully connected layer: `y = activation(x @ kernel + bias)`, `kernel: [in, units]`.
///
/// ```
/// use weft_core::{Device, Tensor};
/// use weft_nn::{layers::Dense, Activation, Ctx, Layer};
/// let layer = Dense::new(4).activation(Activation::Relu);
/// let x = Tensor::ones(&[2, 3], &Device::Cpu)?;
/// let y = layer.call(&x, &mut Ctx::inference())?;
/// assert_eq!(y.dims(), &[2, 4]);
/// assert_eq!(layer.variables()[0].1.dims(), &[3, 4]); // built from the input: kernel [3, 4]
/// # Ok::<(), weft_core::Error>(())
/// ```
pub struct Dense {
    name: String,
    units: usize,
    activation: Activation,
    use_bias: bool,
    kernel_init: Initializer,
    bias_init: Initializer,
    penalties: Penalties,
    vars: OnceLock<(Var, Option<Var>)>,
}

impl Dense {
    /// `units` outputs, no activation, with bias, Glorot-uniform kernel.
    pub fn new(units: usize) -> Self {
        Dense {
            name: String::new(),
            units,
            activation: Activation::Linear,
            use_bias: true,
            kernel_init: Initializer::GlorotUniform,
            bias_init: Initializer::Zeros,
            penalties: Penalties::default(),
            vars: OnceLock::new(),
        }
    }
    /// Set the activation.
    pub fn activation(mut self, a: Activation) -> Self {
        self.activation = a;
        self
    }
    /// With or without a bias.
    pub fn use_bias(mut self, b: bool) -> Self {
        self.use_bias = b;
        self
    }
    /// The kernel's initializer.
    pub fn kernel_initializer(mut self, i: Initializer) -> Self {
        self.kernel_init = i;
        self
    }
    /// The bias's initializer.
    pub fn bias_initializer(mut self, i: Initializer) -> Self {
        self.bias_init = i;
        self
    }
    penalty_options!(kernel: kernel_regularizer, kernel_constraint; bias: bias_regularizer, bias_constraint);
    fn penalties_mut(&mut self) -> &mut Penalties {
        &mut self.penalties
    }
    /// Give the layer a name (else Sequential names it `dense`, `dense_1`, ...).
    pub fn named(mut self, name: &str) -> Self {
        self.name = name.to_string();
        self
    }
}

impl Layer for Dense {
    fn call(&self, x: &Tensor, ctx: &mut Ctx) -> Result<Tensor> {
        let _scope = crate::scope::enter(self);
        let path = trace::current_scope();
        let shard = tp::shard_of(&ctx.tp, &path);
        let local_in = *x.dims().last().ok_or_else(|| Error::invalid("Dense", format!("{path}: input has no axes")))?;
        let (kernel, bias) = match self.vars.get() {
            Some(v) => v,
            None => {
                let in_dim = tp::full_input(shard.map(|s| &s.0.style), local_in);
                let seed = ctx.init_seed(&path);
                let k = tp::new_var(
                    shard,
                    &path,
                    "kernel",
                    x.device(),
                    self.kernel_init,
                    &[in_dim, self.units],
                    None,
                    seed,
                )?;
                let b = match self.use_bias {
                    true => Some(tp::new_var(
                        shard,
                        &path,
                        "bias",
                        x.device(),
                        self.bias_init,
                        &[self.units],
                        None,
                        seed ^ 1,
                    )?),
                    false => None,
                };
                let _ = self.vars.set((k, b));
                self.vars.get().expect("just set")
            }
        };
        let y = tp::linear_fused(
            self,
            ctx,
            x,
            (x.rank() - 1, x.rank() - 1),
            |x, epilogue| {
                if kernel.dims()[0] != *x.dims().last().unwrap_or(&0) {
                    return Err(Error::invalid(
                        "Dense",
                        format!(
                            "{path}: input of shape {:?} does not fit kernel of shape {:?}",
                            x.dims(),
                            kernel.dims()
                        ),
                    ));
                }
                match epilogue {
                    Some((b, op)) => x.matmul_add_unary(kernel, b, op),
                    None => x.matmul(kernel),
                }
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
        "Dense"
    }
    fn attributes(&self) -> Vec<(String, String)> {
        vec![("activation".into(), self.activation.name().into())]
    }
    fn variables(&self) -> Vec<(String, Var)> {
        kernel_and_bias(self.vars.get())
    }
    fn regularizers(&self) -> Vec<(String, crate::Regularizer)> {
        self.penalties.regularizers_of(|v| v == "kernel" || self.use_bias)
    }
    fn constraints(&self) -> Vec<(String, crate::Constraint)> {
        self.penalties.constraints_of(|v| v == "kernel" || self.use_bias)
    }
    /// Column: the units (unless softmax needs the whole row); row: the inputs.
    fn split_rule(&self) -> SplitRule {
        let axis = |kernel| SplitAxis { kernel, last: true };
        SplitRule::Linear(LinearSplit {
            kernel: "kernel".into(),
            bias: self.use_bias.then(|| "bias".into()),
            // An activity penalty needs the whole output: no column split then.
            column: (self.activation.is_elementwise() && self.penalties.activity.is_none()).then(|| axis(1)),
            column_bias: self.use_bias.then_some(0),
            row: Some(axis(0)),
        })
    }
}
