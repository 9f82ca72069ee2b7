//! The primitive ops every backend implements. Everything else (mean, variance, cross-entropy, einsum,
//! one_hot, dropout...) is composed from these, so a new backend only has to provide this list.

use crate::fast_exp::exp;

/// Elementwise unary ops; the parameterised ones carry their scalars.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum UnaryOp {
    /// Copy (used by `contiguous`).
    Identity,
    /// -x
    Neg,
    /// |x|
    Abs,
    /// e^x
    Exp,
    /// Natural logarithm.
    Log,
    /// Square root.
    Sqrt,
    /// 1 / sqrt(x)
    Rsqrt,
    /// x * x
    Square,
    /// 1 / x
    Recip,
    /// Hyperbolic tangent (NaN stays NaN).
    Tanh,
    /// 1 / (1 + e^-x)
    Sigmoid,
    /// max(x, 0); NaN stays NaN (as in NumPy and PyTorch).
    Relu,
    /// GELU, tanh approximation.
    GeluTanh,
    /// GELU with the error function (exact form).
    GeluErf,
    /// x * sigmoid(x)
    Silu,
    /// Sine.
    Sin,
    /// Cosine.
    Cos,
    /// 1 where x > 0, else 0 (relu's derivative); NaN stays NaN, so a NaN is not lost in backward.
    Step,
    /// Sign of x: -1, 0 or 1; NaN stays NaN.
    Sign,
    /// The error function.
    Erf,
    /// x / (1 + |x|)
    Softsign,
    /// log(1 + e^x), computed as max(x, 0) + log(1 + e^-|x|) so it never overflows.
    Softplus,
    /// log(sigmoid(x)) = -softplus(-x).
    LogSigmoid,
    /// x * tanh(softplus(x))
    Mish,
    /// min(max(x, 0), 6)
    Relu6,
    /// relu6(x + 3) / 6 (Keras 3's hard sigmoid).
    HardSigmoid,
    /// x * hard_sigmoid(x) (hard swish).
    HardSilu,
    /// x where x >= 0, else `slope * x`.
    LeakyRelu(f32),
    /// x where x > 0, else `alpha * (e^x - 1)`.
    Elu(f32),
    /// `x * mul + add`.
    Affine {
        /// Multiplier.
        mul: f32,
        /// Offset.
        add: f32,
    },
    /// `x ^ e`.
    Powf(f32),
    /// `min(max(x, lo), hi)`; NaN stays NaN.
    Clamp {
        /// Lower bound.
        lo: f32,
        /// Upper bound.
        hi: f32,
    },
}

impl UnaryOp {
    /// Kernel name, shared with the WGSL op table in weft-shaders.
    pub fn name(self) -> &'static str {
        use UnaryOp::*;
        match self {
            Identity => "identity",
            Neg => "neg",
            Abs => "abs",
            Exp => "exp",
            Log => "log",
            Sqrt => "sqrt",
            Rsqrt => "rsqrt",
            Square => "square",
            Recip => "recip",
            Tanh => "tanh",
            Sigmoid => "sigmoid",
            Relu => "relu",
            GeluTanh => "gelu_tanh",
            GeluErf => "gelu_erf",
            Silu => "silu",
            Sin => "sin",
            Cos => "cos",
            Step => "step",
            Sign => "sign",
            Erf => "erf",
            Softsign => "softsign",
            Softplus => "softplus",
            LogSigmoid => "log_sigmoid",
            Mish => "mish",
            Relu6 => "relu6",
            HardSigmoid => "hard_sigmoid",
            HardSilu => "hard_silu",
            LeakyRelu(_) => "leaky_relu",
            Elu(_) => "elu",
            Affine { .. } => "affine",
            Powf(_) => "powf",
            Clamp { .. } => "clamp",
        }
    }

    /// The two scalar parameters passed to the kernel (`p0`, `p1`).
    pub fn params(self) -> [f32; 2] {
        match self {
            UnaryOp::Affine { mul, add } => [mul, add],
            UnaryOp::Powf(e) => [e, 0.0],
            UnaryOp::LeakyRelu(a) | UnaryOp::Elu(a) => [a, 0.0],
            UnaryOp::Clamp { lo, hi } => [lo, hi],
            _ => [0.0, 0.0],
        }
    }

    /// The op on one value: the Cpu reference. NaN propagates through every op (Rust's `max`,
    /// `min` and comparisons would drop it, so those ops test for it first).
    #[inline(always)]
    pub fn apply(self, x: f32) -> f32 {
        use UnaryOp::*;
        match self {
            Identity => x,
            Neg => -x,
            Abs => x.abs(),
            Exp => exp(x),
            Log => x.ln(),
            Sqrt => x.sqrt(),
            Rsqrt => 1.0 / x.sqrt(),
            Square => x * x,
            Recip => 1.0 / x,
            Tanh => x.tanh(),
            Sigmoid => 1.0 / (1.0 + exp(-x)),
            Relu => nan_or(x, x.max(0.0)),
            // 0.5 x (1 + tanh(u)) written as x * sigmoid(2u): one exp instead of a (slow) tanh.
            GeluTanh => x / (1.0 + exp(-1.595_769_2 * (x + 0.044715 * x * x * x))),
            GeluErf => 0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2)),
            Silu => x / (1.0 + exp(-x)),
            Sin => x.sin(),
            Cos => x.cos(),
            Step => nan_or(x, if x > 0.0 { 1.0 } else { 0.0 }),
            Sign => nan_or(
                x,
                if x > 0.0 {
                    1.0
                } else if x < 0.0 {
                    -1.0
                } else {
                    0.0
                },
            ),
            Erf => erf(x),
            Softsign => x / (1.0 + x.abs()),
            Softplus => nan_or(x, x.max(0.0) + (1.0 + exp(-x.abs())).ln()),
            LogSigmoid => nan_or(x, x.min(0.0) - (1.0 + exp(-x.abs())).ln()),
            Mish => nan_or(x, x * (x.max(0.0) + (1.0 + exp(-x.abs())).ln()).tanh()),
            Relu6 => x.clamp(0.0, 6.0),
            HardSigmoid => ((x + 3.0) * (1.0 / 6.0)).clamp(0.0, 1.0),
            HardSilu => x * ((x + 3.0) * (1.0 / 6.0)).clamp(0.0, 1.0),
            LeakyRelu(a) => {
                if x >= 0.0 {
                    x
                } else {
                    a * x
                }
            }
            Elu(a) => {
                if x <= 0.0 {
                    a * (exp(x) - 1.0)
                } else {
                    x
                }
            }
            Affine { mul, add } => x * mul + add,
            Powf(e) => x.powf(e),
            Clamp { lo, hi } => nan_or(x, x.max(lo).min(hi)),
        }
    }
}

/// `x` when it is NaN, else `v`.
#[inline(always)]
fn nan_or(x: f32, v: f32) -> f32 {
    if x.is_nan() { x } else { v }
}

/// NumPy's maximum and minimum: NaN when either operand is NaN.
#[inline(always)]
fn nan_max(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() { a + b } else { a.max(b) }
}

#[inline(always)]
fn nan_min(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() { a + b } else { a.min(b) }
}

/// The error function, to 1.2e-7 absolute (Numerical Recipes' erfc Chebyshev fit). The WGSL
/// kernels use the same formula, so Gpu and Cpu agree to rounding. Branch-free (with the
/// vectorising `exp`), so a loop of it vectorises.
#[inline(always)]
pub fn erf(x: f32) -> f32 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -z * z - 1.265_512_2
        + t * (1.000_023_7
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_204 + t * (1.488_515_9 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let r = 1.0 - t * exp(poly);
    if x >= 0.0 { r } else { -r }
}

/// Elementwise binary ops (operands broadcast to one shape first). Comparisons give 1.0 or 0.0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    /// a + b
    Add,
    /// a - b
    Sub,
    /// a * b
    Mul,
    /// a / b
    Div,
    /// a ^ b
    Pow,
    /// max(a, b); NaN if either is NaN (NumPy's `maximum`).
    Maximum,
    /// min(a, b); NaN if either is NaN (NumPy's `minimum`).
    Minimum,
    /// a == b
    Eq,
    /// a != b
    Ne,
    /// a < b
    Lt,
    /// a <= b
    Le,
    /// a > b
    Gt,
    /// a >= b
    Ge,
}

impl BinaryOp {
    /// Kernel name, shared with the WGSL op table in weft-shaders.
    pub fn name(self) -> &'static str {
        use BinaryOp::*;
        match self {
            Add => "add",
            Sub => "sub",
            Mul => "mul",
            Div => "div",
            Pow => "pow",
            Maximum => "maximum",
            Minimum => "minimum",
            Eq => "eq",
            Ne => "ne",
            Lt => "lt",
            Le => "le",
            Gt => "gt",
            Ge => "ge",
        }
    }

    /// The op on one pair: the Cpu reference.
    #[inline(always)]
    pub fn apply(self, a: f32, b: f32) -> f32 {
        use BinaryOp::*;
        let c = |p: bool| if p { 1.0 } else { 0.0 };
        match self {
            Add => a + b,
            Sub => a - b,
            Mul => a * b,
            Div => a / b,
            Pow => a.powf(b),
            Maximum => nan_max(a, b),
            Minimum => nan_min(a, b),
            Eq => c(a == b),
            Ne => c(a != b),
            Lt => c(a < b),
            Le => c(a <= b),
            Gt => c(a > b),
            Ge => c(a >= b),
        }
    }

    /// Comparisons have no gradient.
    pub fn is_comparison(self) -> bool {
        matches!(self, BinaryOp::Eq | BinaryOp::Ne | BinaryOp::Lt | BinaryOp::Le | BinaryOp::Gt | BinaryOp::Ge)
    }
}

/// Reductions over a set of axes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum.
    Sum,
    /// Largest value (NaN if any is NaN).
    Max,
    /// Smallest value (NaN if any is NaN).
    Min,
    /// Index of the largest value (first on ties; the first NaN if any, as NumPy), over one
    /// axis; u32 output.
    ArgMax,
}

impl ReduceOp {
    /// Kernel name.
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::ArgMax => "argmax",
        }
    }
}
