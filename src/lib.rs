//! weft: a pure-Rust deep learning framework whose kernels are hand-written WGSL compute shaders
//! run through wgpu, with tensor parallelism built in.
//!
//! This crate re-exports the workspace's crates; `use weft::prelude::*` brings in what a program
//! usually needs.
//!
//! ```
//! use weft::prelude::*;
//! let x = Tensor::ones(&[2, 3], &Device::Cpu)?;
//! assert_eq!(x.sum_all()?.to_scalar::<f32>()?, 6.0);
//! # Ok::<(), weft::Error>(())
//! ```

pub use weft_core as core;
pub use weft_core::{DType, Device, Error, Result, Tensor, Var, devices, no_grad, trace};
pub use weft_nn as nn;
pub use weft_parallel as parallel;

/// The names most programs use.
pub mod prelude {
    pub use weft_core::collectives::{Collectives, ReduceKind};
    pub use weft_core::{DType, Device, Error, GradStore, Result, Tensor, Var, devices, no_grad};
}
