//! A model shared by the planner and equivalence tests: a column layer whose output fans out to
//! two layers that can each take it split.

use weft_core::{Tensor, Var};
use weft_nn::layers::{Dense, Dropout};
use weft_nn::{Activation, Ctx, Layer};

/// `left(up(x)) + right(dropout(up(x)))`: `up` can stay split into both branches.
pub struct Fork {
    up: Dense,
    left: Dense,
    drop: Dropout,
    right: Dense,
}

impl Fork {
    /// `up` of `hidden` units, both branches of `out`.
    pub fn new(hidden: usize, out: usize) -> Self {
        Fork {
            up: Dense::new(hidden).activation(Activation::Gelu).named("up"),
            left: Dense::new(out).named("left"),
            drop: Dropout::new(0.25).named("dropout"),
            right: Dense::new(out).named("right"),
        }
    }
}

impl Layer for Fork {
    fn call(&self, x: &Tensor, ctx: &mut Ctx) -> weft_core::Result<Tensor> {
        let h = self.up.call(x, ctx)?;
        let l = self.left.call(&h, ctx)?;
        let r = self.right.call(&self.drop.call(&h, ctx)?, ctx)?;
        l.add(&r)
    }
    fn name(&self) -> &str {
        "fork"
    }
    fn set_name(&mut self, _: String) {}
    fn kind(&self) -> &'static str {
        "Fork"
    }
    fn variables(&self) -> Vec<(String, Var)> {
        weft_nn::sublayer_variables(self.sublayers())
    }
    fn sublayers(&self) -> Vec<&dyn Layer> {
        vec![&self.up, &self.left, &self.drop, &self.right]
    }
}
