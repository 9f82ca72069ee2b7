//! Activation functions, by name, as Keras spells them.

use weft_core::{Error, Result, Tensor};

/// An activation: every one but the softmaxes is elementwise.
///
/// ```
/// use weft_core::{Device, Tensor};
/// use weft_nn::Activation;
/// let x = Tensor::from_vec(vec![-2.0f32, 0.0, 3.0], &[3], &Device::Cpu)?;
/// assert_eq!(Activation::LeakyRelu(0.2).apply(&x)?.to_vec::<f32>()?, vec![-0.4, 0.0, 3.0]);
/// assert_eq!(Activation::from_name("leaky_relu")?, Activation::LeakyRelu(0.2));
/// # Ok::<(), weft_core::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Activation {
    /// The identity.
    #[default]
    Linear,
    /// max(x, 0)
    Relu,
    /// GELU with the exact error function: what Keras' `"gelu"` and PyTorch's `GELU()` compute.
    Gelu,
    /// GELU with the exact error function (the same as [`Activation::Gelu`]; kept for code that
    /// names it explicitly).
    GeluErf,
    /// GELU, tanh approximation (Keras' `gelu(approximate=True)`, PyTorch's
    /// `GELU(approximate="tanh")`, GPT-2's `gelu_new`).
    GeluTanh,
    /// Hyperbolic tangent.
    Tanh,
    /// Logistic sigmoid.
    Sigmoid,
    /// x * sigmoid(x)
    Silu,
    /// Softmax over the last axis.
    Softmax,
    /// Log of the softmax over the last axis (computed stably, not as `log(softmax)`).
    LogSoftmax,
    /// x where x >= 0, else `slope * x`; Keras' default slope is 0.2.
    LeakyRelu(f32),
    /// x where x > 0, else `alpha * (e^x - 1)`; Keras' default alpha is 1.
    Elu(f32),
    /// `SELU_SCALE * elu(x, SELU_ALPHA)` (self-normalising; pair with `lecun_normal` weights).
    Selu,
    /// log(1 + e^x)
    Softplus,
    /// x / (1 + |x|)
    Softsign,
    /// min(max(x, 0), 6)
    Relu6,
    /// relu6(x + 3) / 6: Keras 3's hard sigmoid (Keras 2's slope was 0.2).
    HardSigmoid,
    /// x * hard_sigmoid(x) (hard swish).
    HardSilu,
    /// x * tanh(softplus(x))
    Mish,
    /// log(sigmoid(x))
    LogSigmoid,
    /// e^x
    Exponential,
}

/// SELU's alpha (Klambauer et al. 2017), as Keras and PyTorch spell it.
pub const SELU_ALPHA: f32 = 1.673_263_2;
/// SELU's scale.
pub const SELU_SCALE: f32 = 1.050_701;

impl Activation {
    /// Apply to a tensor.
    pub fn apply(self, x: &Tensor) -> Result<Tensor> {
        match self {
            Activation::Linear => Ok(x.clone()),
            Activation::Relu => x.relu(),
            Activation::Gelu | Activation::GeluErf => x.gelu_erf(),
            Activation::GeluTanh => x.gelu(),
            Activation::Tanh => x.tanh(),
            Activation::Sigmoid => x.sigmoid(),
            Activation::Silu => x.silu(),
            Activation::Softmax => x.softmax(-1),
            Activation::LogSoftmax => x.log_softmax(-1),
            Activation::LeakyRelu(slope) => x.leaky_relu(slope),
            Activation::Elu(alpha) => x.elu(alpha),
            Activation::Selu => x.elu(SELU_ALPHA)?.mul_scalar(SELU_SCALE),
            Activation::Softplus => x.softplus(),
            Activation::Softsign => x.softsign(),
            Activation::Relu6 => x.relu6(),
            Activation::HardSigmoid => x.hard_sigmoid(),
            Activation::HardSilu => x.hard_silu(),
            Activation::Mish => x.mish(),
            Activation::LogSigmoid => x.log_sigmoid(),
            Activation::Exponential => x.exp(),
        }
    }

    /// The core op this activation is, where it is one (what a layer fuses with its bias add).
    pub fn as_unary(self) -> Option<weft_core::ops::UnaryOp> {
        use weft_core::ops::UnaryOp as U;
        Some(match self {
            Activation::Linear => U::Identity,
            Activation::Relu => U::Relu,
            Activation::Gelu | Activation::GeluErf => U::GeluErf,
            Activation::GeluTanh => U::GeluTanh,
            Activation::Tanh => U::Tanh,
            Activation::Sigmoid => U::Sigmoid,
            Activation::Silu => U::Silu,
            _ => return None,
        })
    }

    /// Whether each output depends on its own input alone (all but the softmaxes): only then
    /// can a layer split by output columns apply it to its slice.
    pub fn is_elementwise(self) -> bool {
        !matches!(self, Activation::Softmax | Activation::LogSoftmax)
    }

    /// Lower-case name, as in summaries (Keras' names, where Keras has the activation).
    pub fn name(self) -> &'static str {
        match self {
            Activation::Linear => "linear",
            Activation::Relu => "relu",
            Activation::Gelu => "gelu",
            Activation::GeluErf => "gelu_erf",
            Activation::GeluTanh => "gelu_tanh",
            Activation::Tanh => "tanh",
            Activation::Sigmoid => "sigmoid",
            Activation::Silu => "silu",
            Activation::Softmax => "softmax",
            Activation::LogSoftmax => "log_softmax",
            Activation::LeakyRelu(_) => "leaky_relu",
            Activation::Elu(_) => "elu",
            Activation::Selu => "selu",
            Activation::Softplus => "softplus",
            Activation::Softsign => "softsign",
            Activation::Relu6 => "relu6",
            Activation::HardSigmoid => "hard_sigmoid",
            Activation::HardSilu => "hard_silu",
            Activation::Mish => "mish",
            Activation::LogSigmoid => "log_sigmoid",
            Activation::Exponential => "exponential",
        }
    }

    /// The activation Keras calls `name` (with Keras' default parameters), e.g. from a Keras
    /// config: `"relu"`, `"leaky_relu"` (slope 0.2), `"swish"` (= silu), `"hard_swish"`, ...
    /// An unknown name is an `Err` listing the known ones.
    pub fn from_name(name: &str) -> Result<Activation> {
        const ALL: [Activation; 20] = [
            Activation::Linear,
            Activation::Relu,
            Activation::Gelu,
            Activation::GeluTanh,
            Activation::Tanh,
            Activation::Sigmoid,
            Activation::Silu,
            Activation::Softmax,
            Activation::LogSoftmax,
            Activation::LeakyRelu(0.2),
            Activation::Elu(1.0),
            Activation::Selu,
            Activation::Softplus,
            Activation::Softsign,
            Activation::Relu6,
            Activation::HardSigmoid,
            Activation::HardSilu,
            Activation::Mish,
            Activation::LogSigmoid,
            Activation::Exponential,
        ];
        let alias = match name {
            "swish" => "silu",
            "hard_swish" => "hard_silu",
            "gelu_erf" => "gelu",
            "none" | "identity" => "linear",
            other => other,
        };
        ALL.iter().copied().find(|a| a.name() == alias).ok_or_else(|| {
            let known: Vec<&str> = ALL.iter().map(|a| a.name()).collect();
            Error::invalid("Activation::from_name", format!("no activation {name:?}; known: {}", known.join(", ")))
        })
    }
}
