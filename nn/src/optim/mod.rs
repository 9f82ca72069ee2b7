//! Optimizers. Each keeps its state in named slots per variable path (`m`, `v`, `momentum`),
//! inspectable with `slot`, and reads its learning-rate schedule at every step.

mod adaptive;
mod in_place;
mod rules;
mod schedule;

pub use adaptive::{Adagrad, Adamax, Lion, Nadam};
pub use rules::{Adam, AdamW, Optimizer, RMSprop, Sgd, on_the_cpu_flushing};
pub use schedule::LearningRate;
