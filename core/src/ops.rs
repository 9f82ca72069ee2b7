//! The primitive ops every backend implements. Everything else (mean, variance, cross-entropy, einsum,
//! one_hot, dropout...) is composed from these, so a new backend only has to provide this list.

use crate::fast_exp::exp;
pub use crate::unary_grads::GradFrom;

/// `$m!(..)` with every `UnaryOp` that takes no parameter: the one list for code that treats each
/// alike (the Cpu's loops, the tests' walk over every op). A new parameterless op goes here.
macro_rules! unit_unary_ops {
    ($m:ident) => {
        $m!(
            Identity,
            Neg,
            Abs,
            Exp,
            Log,
            Sqrt,
            Rsqrt,
            Square,
            Recip,
            Tanh,
            Sigmoid,
            Relu,
            GeluTanh,
            GeluErf,
            Silu,
            Sin,
            Cos,
            Step,
            Sign,
            Erf,
            Softsign,
            Softplus,
            LogSigmoid,
            Mish,
            Relu6,
            HardSigmoid,
            HardSilu
        )
    };
}
pub(crate) use unit_unary_ops;

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
            Tanh => tanh(x),
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
            Mish => nan_or(x, x * tanh(x.max(0.0) + (1.0 + exp(-x.abs())).ln())),
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

/// The error function: `x P(x^2) / Q(x^2)` with `x` clamped to [-4, 4] (beyond, erf is ±1 in
/// f32), a rational fit of degrees 13 and 8 made for weft (least squares, reweighted towards the
/// largest error). In f32 arithmetic it is within 5e-7 of erf, absolute and relative (so tiny
/// arguments keep their digits), and never beyond ±1. No `exp` and one division: about a third
/// of the cost of the Chebyshev-and-exp form it replaced, which in f32 was as close absolutely
/// (4.3e-7) but 0.7% off relatively near 0. The WGSL kernels use the same formula, so Gpu and Cpu
/// agree to rounding. Branch-free, so a loop of it vectorises.
#[inline(always)]
pub fn erf(x: f32) -> f32 {
    let x = x.clamp(-4.0, 4.0);
    let u = x * x;
    // P's constant term is 2/sqrt(pi) (in f32), so tiny arguments keep their digits.
    let p = 1.912_36e-8;
    let p = p * u - 1.956_946_6e-6;
    let p = p * u + 1.500_411e-4;
    let p = p * u + 4.095_430_5e-3;
    let p = p * u + 5.184_791_6e-2;
    let p = p * u + 0.209_502_13;
    let p = p * u + std::f32::consts::FRAC_2_SQRT_PI;
    let q = 1.047_343_6e-3;
    let q = q * u + 1.516_710_5e-2;
    let q = q * u + 0.118_961_01;
    let q = q * u + 0.518_997_4;
    let q = q * u + 1.0;
    (x * p / q).clamp(-1.0, 1.0)
}

/// tanh: `x P(x^2) / Q(x^2)` for `x` inside (-9, 9), ±1 from there on (within an ulp), a rational
/// fit of degrees 13 and 6 made for weft as `erf`'s was. In f32 arithmetic it is within 4e-7 of
/// tanh, absolute and relative, and never beyond ±1; NaN stays NaN. Branch-free, so a loop of it
/// vectorises (libm's `tanhf` is a call per value, about 20 ns). The WGSL kernels use the same
/// formula.
#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    let c = x.clamp(-9.0, 9.0);
    let u = c * c;
    let p = -8.467_661e-14;
    let p = p * u + 5.268_880_8e-11;
    let p = p * u - 2.020_458e-8;
    let p = p * u + 1.114_884_1e-5;
    let p = p * u + 3.103_411_8e-3;
    let p = p * u + 0.130_835_18;
    let p = p * u + 1.0;
    let q = 2.545_365e-4;
    let q = q * u + 2.449_299_2e-2;
    let q = q * u + 0.464_168_46;
    let q = q * u + 1.0;
    let y = (c * p / q).clamp(-1.0, 1.0);
    // Near the clamp the fit is two ulp short of 1; tanh is within an ulp of it from 9 on.
    if x.abs() >= 9.0 { 1.0f32.copysign(x) } else { y }
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

#[cfg(test)]
mod tests {
    use super::{erf, tanh};

    /// erf in f64 by its Taylor series (every term kept to 1e-13 for |x| up to 3.5) or, beyond,
    /// by the continued fraction of erfc.
    fn erf64(x: f64) -> f64 {
        let z = x.abs();
        let r = if z <= 3.5 {
            let (mut term, mut sum, mut n) = (z, z, 0.0);
            while term.abs() > 1e-17 * sum.abs() {
                n += 1.0;
                term *= -z * z / n;
                sum += term / (2.0 * n + 1.0);
            }
            sum * 2.0 / std::f64::consts::PI.sqrt()
        } else {
            // erfc(z) = exp(-z^2)/sqrt(pi) * 1/(z + 1/2/(z + 1/(z + 3/2/(z + ...)))).
            let mut f = z;
            for k in (1..60).rev() {
                f = z + (k as f64 / 2.0) / f;
            }
            1.0 - (-z * z).exp() / std::f64::consts::PI.sqrt() / f
        };
        r.copysign(x)
    }

    /// The largest error of `f` against `exact` (relative below 1, absolute above) from 1e-30 to
    /// `end`, asserting on the way that `f` is odd and never beyond ±1; and `f` at the specials.
    fn worst_error(f: fn(f32) -> f32, exact: fn(f64) -> f64, end: f32) -> (f64, f32) {
        let mut x = 1e-30f32;
        let mut worst = (0.0f64, 0.0f32);
        while x < end {
            let (got, want) = (f(x) as f64, exact(x as f64));
            let err = (got - want).abs() / want.abs().min(1.0);
            if err > worst.0 {
                worst = (err, x);
            }
            assert!(got.abs() <= 1.0, "f({x}) = {got}");
            assert_eq!(f(-x), -f(x), "not odd at {x}");
            x = if x < 1e-3 { x * 1.5 } else { x + end * 3e-5 };
        }
        assert_eq!((f(f32::INFINITY), f(f32::NEG_INFINITY), f(0.0)), (1.0, -1.0, 0.0));
        assert!(f(f32::NAN).is_nan());
        worst
    }

    /// Within 5e-7 of erf, absolute and relative, from 1e-30 to beyond the clamp; odd; never
    /// beyond ±1; NaN stays NaN.
    #[test]
    fn erf_is_within_5e7_absolute_and_relative() {
        let worst = worst_error(erf, erf64, 6.0);
        assert!(worst.0 < 5e-7, "largest error {} at {}", worst.0, worst.1);
    }

    /// Within 4e-7 of tanh, the same way.
    #[test]
    fn tanh_is_within_4e7_absolute_and_relative() {
        let worst = worst_error(tanh, f64::tanh, 12.0);
        assert!(worst.0 < 4e-7, "largest error {} at {}", worst.0, worst.1);
    }
}
