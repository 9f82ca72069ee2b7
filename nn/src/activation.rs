//! Activation functions, by name, as Keras spells them.

use weft_core::{Result, Tensor};

/// An elementwise activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
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
}

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
        }
    }

    /// Lower-case name, as in summaries.
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
        }
    }
}
