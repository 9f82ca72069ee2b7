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
pub use weft_core::{DType, Device, Error, Result, Tensor, Var, devices, no_grad, set_num_threads, trace};
pub use weft_nn as nn;
pub use weft_parallel as parallel;

/// The names most programs use.
pub mod prelude {
    pub use weft_core::collectives::{Collectives, ReduceKind};
    pub use weft_core::{DType, Device, Error, GradStore, Result, Tensor, Var, devices, no_grad};
}

/// The guide's chapters, so that every `rust` block in them runs as a doctest and cannot drift
/// from the API (`tests/guide.rs` checks the blocks it quotes from source files).
#[cfg(doctest)]
mod guide {
    #[doc = include_str!("../docs/01-tensors-and-layouts.md")]
    mod tensors_and_layouts {}
    #[doc = include_str!("../docs/02-dispatching-a-kernel.md")]
    mod dispatching_a_kernel {}
    #[doc = include_str!("../docs/03-autograd.md")]
    mod autograd {}
    #[doc = include_str!("../docs/04-layers-and-the-fit-loop.md")]
    mod layers_and_the_fit_loop {}
    #[doc = include_str!("../docs/05-tensor-parallelism.md")]
    mod tensor_parallelism {}
    #[doc = include_str!("../docs/06-bringing-a-pretrained-model.md")]
    mod bringing_a_pretrained_model {}
}
