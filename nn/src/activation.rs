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
    /// GELU, tanh approximation.
    Gelu,
    /// GELU with the exact error function.
    GeluErf,
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
            Activation::Gelu => x.gelu(),
            Activation::GeluErf => x.gelu_erf(),
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
            Activation::Tanh => "tanh",
            Activation::Sigmoid => "sigmoid",
            Activation::Silu => "silu",
            Activation::Softmax => "softmax",
        }
    }
}
