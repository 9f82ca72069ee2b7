//! Regularizers and constraints, and what a layer that takes them keeps: its settings, the
//! builder methods that set them, and the activity penalty it adds while running.

mod constraint;
pub(crate) mod in_model;
mod regularizer;

pub use constraint::Constraint;
pub use regularizer::Regularizer;

use crate::Ctx;
use weft_core::{Result, Tensor};

/// A layer's regularizers and constraints, by the name of the variable they act on (`kernel`,
/// `bias`, `embeddings`), and its activity regularizer.
#[derive(Debug, Clone, Default)]
pub(crate) struct Penalties {
    pub(crate) regularizers: Vec<(&'static str, Regularizer)>,
    pub(crate) constraints: Vec<(&'static str, Constraint)>,
    pub(crate) activity: Option<Regularizer>,
}

impl Penalties {
    pub(crate) fn regularize(&mut self, var: &'static str, r: Regularizer) {
        self.regularizers.retain(|(v, _)| *v != var);
        self.regularizers.push((var, r));
    }
    pub(crate) fn constrain(&mut self, var: &'static str, c: Constraint) {
        self.constraints.retain(|(v, _)| *v != var);
        self.constraints.push((var, c));
    }
    /// The regularizers of the variables the layer has (`has` says which).
    pub(crate) fn regularizers_of(&self, has: impl Fn(&str) -> bool) -> Vec<(String, Regularizer)> {
        self.regularizers.iter().filter(|(v, _)| has(v)).map(|(v, r)| (v.to_string(), *r)).collect()
    }
    /// The constraints of the variables the layer has.
    pub(crate) fn constraints_of(&self, has: impl Fn(&str) -> bool) -> Vec<(String, Constraint)> {
        self.constraints.iter().filter(|(v, _)| has(v)).map(|(v, c)| (v.to_string(), c.clone())).collect()
    }
    /// Add the activity penalty of output `y` to the context's losses: the regularizer of `y`
    /// over its batch size (Keras 3).
    pub(crate) fn activity(&self, y: &Tensor, ctx: &mut Ctx) -> Result<()> {
        if let Some(r) = &self.activity {
            let mut p = r.penalty(y)?;
            if let Some(&b) = y.dims().first().filter(|&&b| b > 0) {
                p = p.mul_scalar(1.0 / b as f32)?;
            }
            ctx.add_loss(p);
        }
        Ok(())
    }
}

/// Builder methods for a layer with a `penalties_mut(&mut self) -> &mut Penalties`: a
/// regularizer and a constraint for each named variable (`kernel` gives `kernel_regularizer`
/// and `kernel_constraint`), and `activity_regularizer`.
macro_rules! penalty_options {
    ($($var:ident: $reg:ident, $con:ident);+) => {
        $(
            #[doc = concat!("A penalty on `", stringify!($var), "` added to the loss (Keras' `", stringify!($reg), "`).")]
            pub fn $reg(mut self, r: $crate::Regularizer) -> Self {
                self.penalties_mut().regularize(stringify!($var), r);
                self
            }
            #[doc = concat!("A projection of `", stringify!($var), "` after every optimizer step (Keras' `", stringify!($con), "`).")]
            pub fn $con(mut self, c: $crate::Constraint) -> Self {
                self.penalties_mut().constrain(stringify!($var), c);
                self
            }
        )+
        /// A penalty on the layer's output added to the loss, over the batch size (Keras'
        /// `activity_regularizer`).
        pub fn activity_regularizer(mut self, r: $crate::Regularizer) -> Self {
            self.penalties_mut().activity = Some(r);
            self
        }
    };
}
pub(crate) use penalty_options;
