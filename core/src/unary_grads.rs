//! The input gradients of the activations, each one pass over the data
//! ([`Tensor::unary_backward`](crate::Tensor::unary_backward)): `g * f'(v)`, with `f'` read from
//! the op's input, or for tanh and sigmoid from its output.
//!
//! Why: written as tensor ops, a GELU's gradient was 13 ops (a Mish's 9, an ELU's 8), each a
//! pass over the activations that wrote a temporary as large: on a GPU as many dispatches and
//! buffers, on the Cpu as many trips through memory. Each factor here runs the operations of
//! that chain in its order, without fused multiply-adds, so on the Cpu the values are the
//! chain's to the bit (a test holds the chain to it: `-v + 1`, exact, stands for the chain's
//! `v * -1 + 1`); the WGSL kernels (`unary_grad/<op>`) run the same formulas, to rounding.

use crate::fast_exp::exp;
use crate::ops::{UnaryOp, erf, tanh};

/// The value an op's one-pass gradient reads (see [`UnaryOp::fused_grad`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GradFrom {
    /// The op's input `x`.
    Input,
    /// The op's output `y` (tanh and sigmoid, whose derivative is cheapest from it).
    Output,
}

/// 1 / (1 + e^-x), as `UnaryOp::Sigmoid` computes it.
#[inline(always)]
fn sigmoid(x: f32) -> f32 {
    UnaryOp::Sigmoid.apply(x)
}

/// `x` when it is NaN, else `v`: the chains kept a NaN input's gradient NaN (a comparison alone
/// would make it 0).
#[inline(always)]
fn nan_or(x: f32, v: f32) -> f32 {
    if x.is_nan() { x } else { v }
}

/// 1 where `lo < x < hi`, else 0.
#[inline(always)]
fn inside(x: f32, lo: f32, hi: f32) -> f32 {
    if x > lo && x < hi { 1.0 } else { 0.0 }
}

impl UnaryOp {
    /// Whether weft works this op's input gradient out in one pass, and from which value; `None`
    /// for the others, whose gradients stay tensor ops (exp's, log's and affine's are one op;
    /// clamp's, the powers' and the reciprocals' a few) or which have none (step, sign).
    pub fn fused_grad(self) -> Option<GradFrom> {
        use UnaryOp::*;
        match self {
            Tanh | Sigmoid => Some(GradFrom::Output),
            Relu | GeluTanh | GeluErf | Silu | Erf | Softsign | Softplus | LogSigmoid | Mish | Relu6 | HardSigmoid
            | HardSilu | LeakyRelu(_) | Elu(_) => Some(GradFrom::Input),
            _ => None,
        }
    }

    /// The op's derivative at `v` (the value [`fused_grad`](Self::fused_grad) names: the input,
    /// or the output for tanh and sigmoid); NaN where `v` is NaN. At relu's, relu6's and hard
    /// sigmoid's kinks the flat side's slope (0), as JAX's; leaky relu's is 1 at 0, elu's alpha.
    /// Only for ops with a one-pass gradient (`v` itself for the others).
    #[inline(always)]
    pub(crate) fn grad_factor(self, v: f32) -> f32 {
        use UnaryOp::*;
        let x = v;
        match self {
            // (The output's step is the input's: relu's gradient may read either.)
            Relu => nan_or(x, if x > 0.0 { 1.0 } else { 0.0 }),
            Tanh => -(v * v) + 1.0,
            Sigmoid => v * (-v + 1.0),
            GeluTanh => {
                // With u = C (x + 0.044715 x³) and s = sigmoid(2u) (so tanh(u) = 2s - 1):
                // d/dx = s + 2 x s (1 - s) du/dx.
                const C: f32 = 0.797_884_6;
                let x2 = x * x;
                let s = sigmoid(x * (x2 * 0.044715 + 1.0) * (2.0 * C) + 0.0);
                let du = x2 * (3.0 * 0.044715 * C) + C;
                s + (x * (s * (-s + 1.0)) * du * 2.0 + 0.0)
            }
            GeluErf => {
                let cdf = erf(x * std::f32::consts::FRAC_1_SQRT_2 + 0.0) * 0.5 + 0.5;
                let pdf = exp(x * x * -0.5 + 0.0) * 0.398_942_3 + 0.0;
                cdf + x * pdf
            }
            Silu => {
                let s = sigmoid(x);
                s * (x * (-s + 1.0) + 1.0)
            }
            Erf => exp(-(x * x)) * std::f32::consts::FRAC_2_SQRT_PI + 0.0,
            Softsign => {
                let d = x.abs() + 1.0;
                1.0 / (d * d)
            }
            Softplus => sigmoid(x),
            LogSigmoid => -sigmoid(x) + 1.0,
            Mish => {
                let t = tanh(Softplus.apply(x));
                t + x * (-(t * t) + 1.0) * sigmoid(x)
            }
            Relu6 => nan_or(x, inside(x, 0.0, 6.0)),
            HardSigmoid => nan_or(x, inside(x, -3.0, 3.0) * (1.0 / 6.0) + 0.0),
            HardSilu => nan_or(x, HardSigmoid.apply(x) + (inside(x, -3.0, 3.0) * x * (1.0 / 6.0) + 0.0)),
            LeakyRelu(a) => {
                let pos = if x >= 0.0 { 1.0 } else { 0.0 };
                nan_or(x, pos * (1.0 - a) + a)
            }
            Elu(a) => {
                let pos = Step.apply(x);
                let neg = exp(nan_or(x, x.min(0.0))) * a + 0.0;
                pos + (-pos + 1.0) * neg
            }
            _ => v,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::GradFrom;
    use crate::backprop::composed_unary_grad;
    use crate::ops::UnaryOp;
    use crate::{Device, Result, Tensor};

    /// The ops without parameters, named once: their list, and a match without a wildcard that
    /// fails to compile until a new op is in it.
    macro_rules! every {
        ($($op:ident),*) => {{
            fn _listed(op: UnaryOp) {
                use UnaryOp::*;
                match op {
                    $($op)|* | LeakyRelu(_) | Elu(_) | Affine { .. } | Powf(_) | Clamp { .. } => {}
                }
            }
            vec![$(UnaryOp::$op),*]
        }};
    }

    /// One of every op (leaky relu and elu with two parameters each).
    fn every_op() -> Vec<UnaryOp> {
        use UnaryOp::*;
        let mut all = crate::ops::unit_unary_ops!(every);
        all.extend([LeakyRelu(0.2), LeakyRelu(-0.5), Elu(1.3), Elu(0.5), Affine { mul: 2.0, add: 1.0 }]);
        all.extend([Powf(2.5), Clamp { lo: -1.0, hi: 1.0 }]);
        all
    }

    /// Every op with a one-pass gradient has a GPU kernel, and the ops whose gradient autograd
    /// reads from their output (`reads_output_only`) are ones whose one pass reads the output, or
    /// relu (whose output's step is its input's): an input-reading formula given the output
    /// would be silently wrong.
    #[test]
    fn every_one_pass_gradient_has_a_kernel_and_reads_what_autograd_gives() {
        for op in every_op() {
            if op.fused_grad().is_some() {
                let kernel = format!("unary_grad/{}", op.name());
                assert!(weft_shaders::source(&kernel).is_some(), "no WGSL kernel {kernel}");
            }
            if crate::backprop::reads_output_only(op) {
                let ok = matches!(op.fused_grad(), None | Some(GradFrom::Output)) || op == UnaryOp::Relu;
                assert!(ok, "{op:?}: autograd gives its output, the one pass reads its input");
            }
        }
        let fused = every_op().into_iter().filter(|op| op.fused_grad().is_some()).count();
        assert_eq!(fused, weft_shaders::UNARY_GRADS.len() + 2, "a kernel per op (two ops twice in the list)");
    }

    /// The one-pass gradient of every activation gives the bits of the tensor ops it replaced
    /// (any NaN for a NaN), over ordinary values, the kinks, tiny and huge ones, the infinities
    /// and NaN, with gradients of either sign; an op without one is an `Err`.
    #[test]
    fn one_pass_gradients_equal_the_composed_ops() -> Result<()> {
        let dev = Device::Cpu;
        let mut xs: Vec<f32> = (0..4001).map(|i| (i as f32 - 2000.0) * 0.00731).collect();
        xs.extend([0.0, -0.0, 1e-40, -1e-40, 3.0, -3.0, 6.0, 2.999_999_8, 5.999_999_5, 88.7, -104.0, 1e30, -1e30]);
        xs.extend([f32::INFINITY, f32::NEG_INFINITY, f32::NAN]);
        let n = xs.len();
        let gs: Vec<f32> = (0..n).map(|i| [1.0, -0.37, 2.5e-3, 0.0, -7.5][i % 5]).collect();
        let x = Tensor::from_vec(xs, &[n], &dev)?;
        let g = Tensor::from_vec(gs, &[n], &dev)?;
        for op in every_op().into_iter().filter(|op| op.fused_grad().is_some()) {
            let out = x.unary(op)?;
            let v = if op.fused_grad() == Some(GradFrom::Output) { &out } else { &x };
            let got = v.unary_backward(op, &g)?.to_vec::<f32>()?;
            let want = composed_unary_grad(op, &x, &out, &g)?.expect("a gradient").to_vec::<f32>()?;
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                let same = a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
                assert!(same, "{op:?} at x = {}: one pass {a}, composed {b}", x.to_vec::<f32>()?[i]);
            }
        }
        let e = x.unary_backward(UnaryOp::Exp, &g).unwrap_err();
        assert!(e.to_string().contains("Exp"), "{e}");
        Ok(())
    }
}
