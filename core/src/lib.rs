//! weft-core: tensors on a GPU (WGSL kernels through wgpu), the Cpu reference backend, or Meta
//! (shapes only); the primitive ops; reverse-mode autograd; tracing; and the collectives
//! interface that tensor-parallel layers call.
//!
//! ```
//! use weft_core::{Device, Tensor, Var};
//! let dev = Device::Cpu; // or Device::default(), or Device::gpu(0)
//! let w = Var::new(Tensor::randn(0.0, 0.1, &[3, 2], 0, &dev)?)?;
//! let x = Tensor::ones(&[4, 3], &dev)?;
//! let loss = x.matmul(&w)?.relu()?.sum_all()?;
//! let grads = loss.backward()?;
//! assert_eq!(grads.get(&w).unwrap().dims(), &[3, 2]);
//! # Ok::<(), weft_core::Error>(())
//! ```

#![warn(missing_docs)]

pub mod backprop;
pub mod collectives;
pub mod conv;
pub(crate) mod cpu;
mod device;
mod dtype;
mod einsum;
mod error;
mod fast_exp;
pub mod gpu;
mod grad_bound;
pub mod layout;
pub mod ops;
pub mod optim_ops;
pub mod rng;
mod slice_grads;
pub(crate) mod storage;
mod subnormals;
mod tensor;
mod threads;
pub mod trace;
mod unary_grads;
mod var;

pub use backprop::{GradStore, no_grad};
pub use collectives::{Collectives, ReduceKind, SingleRank};
pub use device::{AdapterSummary, Device, devices};
pub use dtype::{DType, WithDType};
pub use error::{Error, Result};
pub use gpu::MemoryStats;
pub use layout::Layout;
pub use subnormals::flushing_subnormals;
pub use tensor::{HostF32, Tensor, TensorId};
pub use threads::{par_chunks_mut, set_num_threads};
pub use var::Var;
