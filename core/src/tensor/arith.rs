//! Elementwise arithmetic: unary ops, binary ops with NumPy broadcasting, scalar forms,
//! comparisons, `where_cond`, and dtype casts.

use super::Tensor;
use crate::backprop::Op;
use crate::layout::broadcast_shape;
use crate::ops::{BinaryOp, UnaryOp};
use crate::{DType, Error, Result};

macro_rules! unary_methods {
    ($($(#[$doc:meta])* $name:ident => $op:ident),* $(,)?) => {
        impl Tensor {
            $($(#[$doc])* pub fn $name(&self) -> Result<Tensor> { self.unary(UnaryOp::$op) })*
        }
    };
}

unary_methods! {
    /// -x
    neg => Neg,
    /// |x|
    abs => Abs,
    /// e^x
    exp => Exp,
    /// Natural logarithm.
    log => Log,
    /// Square root.
    sqrt => Sqrt,
    /// 1 / sqrt(x)
    rsqrt => Rsqrt,
    /// x * x
    square => Square,
    /// 1 / x
    recip => Recip,
    /// Hyperbolic tangent; NaN stays NaN.
    tanh => Tanh,
    /// 1 / (1 + e^-x)
    sigmoid => Sigmoid,
    /// max(x, 0); NaN stays NaN.
    relu => Relu,
    /// GELU, tanh approximation (GPT-2's form).
    gelu => GeluTanh,
    /// GELU with the exact error function (Keras' `approximate=False`).
    gelu_erf => GeluErf,
    /// x * sigmoid(x)
    silu => Silu,
    /// Sine.
    sin => Sin,
    /// Cosine.
    cos => Cos,
    /// Sign: -1, 0 or 1.
    sign => Sign,
    /// The error function.
    erf => Erf,
    /// x / (1 + |x|)
    softsign => Softsign,
    /// log(1 + e^x), without overflow.
    softplus => Softplus,
    /// log(sigmoid(x)), without overflow.
    log_sigmoid => LogSigmoid,
    /// x * tanh(softplus(x))
    mish => Mish,
    /// min(max(x, 0), 6)
    relu6 => Relu6,
    /// relu6(x + 3) / 6
    hard_sigmoid => HardSigmoid,
    /// x * hard_sigmoid(x)
    hard_silu => HardSilu,
}

impl Tensor {
    /// x where x >= 0, else `slope * x` (Keras' `leaky_relu`, default slope 0.2).
    pub fn leaky_relu(&self, slope: f32) -> Result<Tensor> {
        self.unary(UnaryOp::LeakyRelu(slope))
    }

    /// x where x > 0, else `alpha * (e^x - 1)` (Keras' `elu`, default alpha 1).
    pub fn elu(&self, alpha: f32) -> Result<Tensor> {
        self.unary(UnaryOp::Elu(alpha))
    }
}

macro_rules! binary_methods {
    ($($(#[$doc:meta])* $name:ident => $op:ident),* $(,)?) => {
        impl Tensor {
            $($(#[$doc])* pub fn $name(&self, rhs: &Tensor) -> Result<Tensor> { self.binary(BinaryOp::$op, rhs) })*
        }
    };
}

binary_methods! {
    /// a + b (broadcasting)
    add => Add,
    /// a - b (broadcasting)
    sub => Sub,
    /// a * b (broadcasting)
    mul => Mul,
    /// a / b (broadcasting)
    div => Div,
    /// a ^ b (broadcasting)
    pow => Pow,
    /// Elementwise maximum (broadcasting); NaN where either operand is NaN, as NumPy.
    maximum => Maximum,
    /// Elementwise minimum (broadcasting); NaN where either operand is NaN, as NumPy.
    minimum => Minimum,
    /// 1.0 where a == b, else 0.0
    eq => Eq,
    /// 1.0 where a != b, else 0.0
    ne => Ne,
    /// 1.0 where a < b, else 0.0
    lt => Lt,
    /// 1.0 where a <= b, else 0.0
    le => Le,
    /// 1.0 where a > b, else 0.0
    gt => Gt,
    /// 1.0 where a >= b, else 0.0
    ge => Ge,
}

impl Tensor {
    /// Apply a primitive unary op.
    pub fn unary(&self, op: UnaryOp) -> Result<Tensor> {
        self.expect_f32(op.name())?;
        let storage = self.storage().unary(op, self.layout())?;
        Ok(Tensor::from_storage(
            storage,
            self.dims(),
            self.dtype(),
            self.device().clone(),
            Some(Op::Unary(self.clone(), op)),
        ))
    }

    /// Apply a primitive binary op, broadcasting both operands to a common shape.
    pub fn binary(&self, op: BinaryOp, rhs: &Tensor) -> Result<Tensor> {
        self.same_device(rhs, op.name())?;
        self.expect_f32(op.name())?;
        rhs.expect_f32(op.name())?;
        let shape = broadcast_shape(op.name(), self.dims(), rhs.dims())?;
        let (a, b) = (self.broadcast_to(&shape)?, rhs.broadcast_to(&shape)?);
        let storage = a.storage().binary(op, a.layout(), &b.storage(), b.layout())?;
        Ok(Tensor::from_storage(storage, &shape, self.dtype(), self.device().clone(), Some(Op::Binary(a, b, op))))
    }

    /// `op(self + rhs)` in one pass over the data, `rhs` broadcast to `self`'s shape: a layer's
    /// bias and activation without the sum in between going through memory. The same values as
    /// `self.add(rhs)?.unary(op)`. For the identity it is `add` itself (the same node: a linear
    /// layer's bias is an `add` whichever way it is given).
    ///
    /// ```
    /// # use weft_core::{Device, Tensor, ops::UnaryOp};
    /// let x = Tensor::from_vec(vec![-2f32, 1.0, 0.5, -0.5], &[2, 2], &Device::Cpu)?;
    /// let bias = Tensor::from_vec(vec![1f32, -1.0], &[2], &Device::Cpu)?;
    /// assert_eq!(x.add_unary(&bias, UnaryOp::Relu)?.to_vec::<f32>()?, vec![0.0, 0.0, 1.5, 0.0]);
    /// # Ok::<(), weft_core::Error>(())
    /// ```
    pub fn add_unary(&self, rhs: &Tensor, op: UnaryOp) -> Result<Tensor> {
        let what = "add_unary";
        self.same_device(rhs, what)?;
        self.expect_f32(what)?;
        rhs.expect_f32(what)?;
        let shape = broadcast_shape(what, self.dims(), rhs.dims())?;
        if shape.as_slice() != self.dims() {
            return Err(Error::ShapeMismatch { op: what, lhs: self.dims().to_vec(), rhs: rhs.dims().to_vec() });
        }
        let b = rhs.broadcast_to(&shape)?;
        if op == UnaryOp::Identity {
            return self.add(&b);
        }
        let storage = self.storage().add_unary(op, self.layout(), &b.storage(), b.layout())?;
        let node = Op::AddUnary(self.clone(), b, op);
        Ok(Tensor::from_storage(storage, &shape, self.dtype(), self.device().clone(), Some(node)))
    }

    /// The input gradient of the unary op `op` in one pass: `g * op'(v)` elementwise, where `v`
    /// (`self`) is the op's input, or its output for tanh and sigmoid (see
    /// [`UnaryOp::fused_grad`]), and `g` the output's gradient, of `self`'s shape. Autograd takes
    /// this path for the activations; no graph is recorded through it. `Err` for an op without a
    /// one-pass gradient, or for another shape, dtype or device.
    ///
    /// ```
    /// # use weft_core::{Device, Tensor, ops::UnaryOp};
    /// let x = Tensor::from_vec(vec![-1f32, 0.5, 2.0], &[3], &Device::Cpu)?;
    /// let g = Tensor::from_vec(vec![1f32, 1.0, 3.0], &[3], &Device::Cpu)?;
    /// assert_eq!(x.unary_backward(UnaryOp::Relu, &g)?.to_vec::<f32>()?, vec![0.0, 1.0, 3.0]);
    /// # Ok::<(), weft_core::Error>(())
    /// ```
    pub fn unary_backward(&self, op: UnaryOp, g: &Tensor) -> Result<Tensor> {
        let what = "unary_backward";
        self.same_device(g, what)?;
        self.expect_f32(what)?;
        g.expect_f32(what)?;
        if self.dims() != g.dims() {
            return Err(Error::ShapeMismatch { op: what, lhs: self.dims().to_vec(), rhs: g.dims().to_vec() });
        }
        if op.fused_grad().is_none() {
            return Err(Error::invalid(what, format!("{op:?} has no one-pass gradient (see UnaryOp::fused_grad)")));
        }
        let storage = self.storage().unary_grad(op, self.layout(), &g.storage(), g.layout())?;
        Ok(Tensor::from_storage(storage, self.dims(), DType::F32, self.device().clone(), None))
    }

    /// x * mul + add, in one kernel.
    pub fn affine(&self, mul: f32, add: f32) -> Result<Tensor> {
        self.unary(UnaryOp::Affine { mul, add })
    }
    /// x + v
    pub fn add_scalar(&self, v: f32) -> Result<Tensor> {
        self.affine(1.0, v)
    }
    /// x - v
    pub fn sub_scalar(&self, v: f32) -> Result<Tensor> {
        self.affine(1.0, -v)
    }
    /// x * v
    pub fn mul_scalar(&self, v: f32) -> Result<Tensor> {
        self.affine(v, 0.0)
    }
    /// x / v
    pub fn div_scalar(&self, v: f32) -> Result<Tensor> {
        self.affine(1.0 / v, 0.0)
    }
    /// x ^ e
    pub fn powf(&self, e: f32) -> Result<Tensor> {
        self.unary(UnaryOp::Powf(e))
    }
    /// min(max(x, lo), hi); NaN stays NaN.
    pub fn clamp(&self, lo: f32, hi: f32) -> Result<Tensor> {
        if lo.is_nan() || hi.is_nan() {
            return Err(Error::invalid("clamp", format!("the bounds must be numbers, got {lo} and {hi}")));
        }
        if lo > hi {
            return Err(Error::invalid("clamp", format!("lower bound {lo} is above upper bound {hi}")));
        }
        self.unary(UnaryOp::Clamp { lo, hi })
    }

    /// Compare with a scalar: `op` is one of the comparison ops.
    pub fn cmp_scalar(&self, op: BinaryOp, v: f32) -> Result<Tensor> {
        self.binary(op, &Tensor::scalar(v, self.device())?)
    }

    /// `mask != 0 ? on_true : on_false`, all three broadcast to one shape.
    pub fn where_cond(mask: &Tensor, on_true: &Tensor, on_false: &Tensor) -> Result<Tensor> {
        mask.same_device(on_true, "where_cond")?;
        mask.same_device(on_false, "where_cond")?;
        for t in [mask, on_true, on_false] {
            t.expect_f32("where_cond")?;
        }
        let s = broadcast_shape("where_cond", mask.dims(), on_true.dims())?;
        let shape = broadcast_shape("where_cond", &s, on_false.dims())?;
        let (m, a, b) = (mask.broadcast_to(&shape)?, on_true.broadcast_to(&shape)?, on_false.broadcast_to(&shape)?);
        let storage = m.storage().where_cond(m.layout(), &a.storage(), a.layout(), &b.storage(), b.layout())?;
        Ok(Tensor::from_storage(storage, &shape, DType::F32, mask.device().clone(), Some(Op::Where(m.detach(), a, b))))
    }

    /// Replace elements where `mask != 0` by `value` (e.g. -inf above the diagonal for a causal mask).
    pub fn masked_fill(&self, mask: &Tensor, value: f32) -> Result<Tensor> {
        Tensor::where_cond(mask, &Tensor::scalar(value, self.device())?, self)
    }

    /// Convert to another dtype (f32 <-> f16 rounds to nearest; float -> integer truncates).
    ///
    /// A plain cast: it validates nothing. Float to `U32` turns -1.0 into 0 and 2.7 into 2 (and
    /// NaN into 0 on the Cpu, anything on a GPU). For labels and ids use
    /// [`to_index`](Tensor::to_index), which refuses such values.
    pub fn to_dtype(&self, dtype: DType) -> Result<Tensor> {
        if dtype == self.dtype() {
            return Ok(self.clone());
        }
        let storage = self.storage().cast(self.layout(), self.dtype(), dtype)?;
        Ok(Tensor::from_storage(storage, self.dims(), dtype, self.device().clone(), Some(Op::Cast(self.clone()))))
    }
}
