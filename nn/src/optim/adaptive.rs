//! Adagrad, Adamax, Nadam and Lion, with Keras' formulas and defaults. Each rule is elementwise
//! tensor ops, so it runs on any device, and on a model split over devices each rank updates its
//! own shard.

use super::LearningRate;
use super::rules::{Base, Optimizer, check_range, optimizer_common, optimizer_trait};
use weft_core::{GradStore, Result, Tensor, Var};

/// Adagrad: steps shrink with the sum of squared gradients so far (slot `accumulator`, starting
/// at Keras' 0.1); epsilon 1e-7.
///
/// ```
/// use weft_nn::optim::{Adagrad, Optimizer};
/// let opt = Adagrad::new(0.01).initial_accumulator(0.1);
/// assert_eq!(opt.learning_rate(), 0.01);
/// ```
#[derive(Clone)]
pub struct Adagrad {
    base: Base,
    initial: f32,
    epsilon: f32,
}

impl Adagrad {
    /// Adagrad at `lr` (a number or a schedule).
    pub fn new(lr: impl Into<LearningRate>) -> Self {
        Adagrad { base: Base::new(lr.into()), initial: 0.1, epsilon: 1e-7 }
    }
    /// The accumulator's starting value (Keras' `initial_accumulator_value`).
    pub fn initial_accumulator(mut self, v: f32) -> Self {
        self.initial = v;
        self
    }
    /// Set epsilon.
    pub fn epsilon(mut self, eps: f32) -> Self {
        self.epsilon = eps;
        self
    }
    fn hyper(&self) -> (f32, f32) {
        (self.initial, self.epsilon)
    }
    fn check(&self) -> Result<()> {
        check_range("initial_accumulator_value", self.initial, 0.0, f32::MAX, false)?;
        check_range("epsilon", self.epsilon, 0.0, f32::MAX, false)
    }
    fn rule(hp: &(f32, f32), b: &mut Base, path: &str, w: &Tensor, g: &Tensor, lr: f32) -> Result<Tensor> {
        let (initial, eps) = *hp;
        let acc = b.slot_from(path, "accumulator", w, initial)?.add(&g.square()?)?;
        let w = w.sub(&g.div(&acc.add_scalar(eps)?.sqrt()?)?.mul_scalar(lr)?)?;
        b.set_slot(path, "accumulator", acc);
        Ok(w)
    }
}
optimizer_common!(Adagrad);
optimizer_trait!(Adagrad);

/// Adamax: Adam with the infinity norm in place of the second moment (slots `m` and `u`);
/// beta1 0.9, beta2 0.999, epsilon 1e-7.
#[derive(Clone)]
pub struct Adamax {
    base: Base,
    beta1: f32,
    beta2: f32,
    epsilon: f32,
}

impl Adamax {
    /// Adamax at `lr` (a number or a schedule).
    pub fn new(lr: impl Into<LearningRate>) -> Self {
        Adamax { base: Base::new(lr.into()), beta1: 0.9, beta2: 0.999, epsilon: 1e-7 }
    }
    /// Set beta1, beta2 and epsilon.
    pub fn betas(mut self, beta1: f32, beta2: f32, epsilon: f32) -> Self {
        (self.beta1, self.beta2, self.epsilon) = (beta1, beta2, epsilon);
        self
    }
    fn hyper(&self) -> (f32, f32, f32) {
        (self.beta1, self.beta2, self.epsilon)
    }
    fn check(&self) -> Result<()> {
        check_range("beta_1", self.beta1, 0.0, 1.0, true)?;
        check_range("beta_2", self.beta2, 0.0, 1.0, true)?;
        check_range("epsilon", self.epsilon, 0.0, f32::MAX, false)
    }
    fn rule(hp: &(f32, f32, f32), b: &mut Base, path: &str, w: &Tensor, g: &Tensor, lr: f32) -> Result<Tensor> {
        let (b1, b2, eps) = *hp;
        let t = (b.iterations + 1).min(i32::MAX as u64) as i32;
        let m = b.slot(path, "m", w)?;
        let m = m.add(&g.sub(&m)?.mul_scalar(1.0 - b1)?)?;
        let u = b.slot(path, "u", w)?.mul_scalar(b2)?.maximum(&g.abs()?)?;
        let step = m.mul_scalar(lr / (1.0 - b1.powi(t)))?.div(&u.add_scalar(eps)?)?;
        b.set_slot(path, "m", m);
        b.set_slot(path, "u", u);
        w.sub(&step)
    }
}
optimizer_common!(Adamax);
optimizer_trait!(Adamax);

/// Nadam: Adam with Nesterov momentum (Dozat), Keras' momentum schedule
/// `mu_t = beta1 (1 - 0.5 * 0.96^t)`; beta1 0.9, beta2 0.999, epsilon 1e-7.
#[derive(Clone)]
pub struct Nadam {
    base: Base,
    beta1: f32,
    beta2: f32,
    epsilon: f32,
}

impl Nadam {
    /// Nadam at `lr` (a number or a schedule).
    pub fn new(lr: impl Into<LearningRate>) -> Self {
        Nadam { base: Base::new(lr.into()), beta1: 0.9, beta2: 0.999, epsilon: 1e-7 }
    }
    /// Set beta1, beta2 and epsilon.
    pub fn betas(mut self, beta1: f32, beta2: f32, epsilon: f32) -> Self {
        (self.beta1, self.beta2, self.epsilon) = (beta1, beta2, epsilon);
        self
    }
    /// (beta1, beta2, epsilon, the product of mu_1 .. mu_t for this step's t). The product is
    /// worked out from the step count (not kept as state), so a resumed run has it exactly; it
    /// falls below 1e-30 within a few hundred steps, and is 0 from there.
    fn hyper(&self) -> (f32, f32, f32, f64) {
        let t = self.base.iterations + 1;
        let mut product = 1f64;
        for s in 1..=t {
            product *= self.mu(s);
            if product < 1e-30 {
                product = 0.0;
                break;
            }
        }
        (self.beta1, self.beta2, self.epsilon, product)
    }
    fn mu(&self, step: u64) -> f64 {
        self.beta1 as f64 * (1.0 - 0.5 * 0.96f64.powf(step as f64))
    }
    fn check(&self) -> Result<()> {
        check_range("beta_1", self.beta1, 0.0, 1.0, true)?;
        check_range("beta_2", self.beta2, 0.0, 1.0, true)?;
        check_range("epsilon", self.epsilon, 0.0, f32::MAX, false)
    }
    fn rule(hp: &(f32, f32, f32, f64), b: &mut Base, path: &str, w: &Tensor, g: &Tensor, lr: f32) -> Result<Tensor> {
        let (b1, b2, eps, product) = *hp;
        let t = b.iterations + 1;
        let mu = |s: u64| b1 as f64 * (1.0 - 0.5 * 0.96f64.powf(s as f64));
        let (mu_t, mu_next) = (mu(t), mu(t + 1));
        let (m, v) = (b.slot(path, "m", w)?, b.slot(path, "v", w)?);
        let m = m.add(&g.sub(&m)?.mul_scalar(1.0 - b1)?)?;
        let v = v.add(&g.square()?.sub(&v)?.mul_scalar(1.0 - b2)?)?;
        let m_hat = m
            .mul_scalar((mu_next / (1.0 - product * mu_next)) as f32)?
            .add(&g.mul_scalar(((1.0 - mu_t) / (1.0 - product)) as f32)?)?;
        let v_hat = v.mul_scalar((1.0 / (1.0 - (b2 as f64).powf(t as f64))) as f32)?;
        let step = m_hat.mul_scalar(lr)?.div(&v_hat.sqrt()?.add_scalar(eps)?)?;
        b.set_slot(path, "m", m);
        b.set_slot(path, "v", v);
        w.sub(&step)
    }
}
optimizer_common!(Nadam);
optimizer_trait!(Nadam);

/// Lion (Chen et al. 2023): the sign of an interpolated momentum, so every step moves each
/// weight by the learning rate exactly (use a learning rate 3-10x smaller than Adam's);
/// beta1 0.9, beta2 0.99 (slot `m`).
#[derive(Clone)]
pub struct Lion {
    base: Base,
    beta1: f32,
    beta2: f32,
}

impl Lion {
    /// Lion at `lr` (a number or a schedule).
    pub fn new(lr: impl Into<LearningRate>) -> Self {
        Lion { base: Base::new(lr.into()), beta1: 0.9, beta2: 0.99 }
    }
    /// Set beta1 (the update's interpolation) and beta2 (the momentum's decay).
    pub fn betas(mut self, beta1: f32, beta2: f32) -> Self {
        (self.beta1, self.beta2) = (beta1, beta2);
        self
    }
    fn hyper(&self) -> (f32, f32) {
        (self.beta1, self.beta2)
    }
    fn check(&self) -> Result<()> {
        check_range("beta_1", self.beta1, 0.0, 1.0, false)?;
        check_range("beta_2", self.beta2, 0.0, 1.0, false)
    }
    fn rule(hp: &(f32, f32), b: &mut Base, path: &str, w: &Tensor, g: &Tensor, lr: f32) -> Result<Tensor> {
        let (b1, b2) = *hp;
        let m = b.slot(path, "m", w)?;
        let direction = m.mul_scalar(b1)?.add(&g.mul_scalar(1.0 - b1)?)?.sign()?;
        b.set_slot(path, "m", m.mul_scalar(b2)?.add(&g.mul_scalar(1.0 - b2)?)?);
        w.sub(&direction.mul_scalar(lr)?)
    }
}
optimizer_common!(Lion);
optimizer_trait!(Lion);

macro_rules! keras_default {
    ($($t:ident),*) => {
        $(impl Default for $t {
            /// Keras' default learning rate, 0.001.
            fn default() -> Self {
                $t::new(1e-3)
            }
        })*
    };
}
keras_default!(Adagrad, Adamax, Nadam, Lion);
