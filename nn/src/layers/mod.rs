//! The built-in layers.

mod dense;
mod simple;

pub use dense::Dense;
pub use simple::{ActivationLayer, Dropout, Flatten};
