//! weft-parallel: tensor parallelism that trains to the same result as one device.
//!
//! - [`DeviceMesh`]: devices on named axes (`data`, `model`).
//! - [`InHost`]: collectives among the devices of one process (one thread per rank).
//! - [`autoconfig`]: the planner. It traces a model on the Meta device and gives every layer a
//!   style and every variable a placement, with reasons; the [`ShardingPlan`] prints as a table
//!   with per-device memory, and saves as JSON.
//! - [`ShardedModel`]: the same `compile` / `fit` / `evaluate` / `predict` as `weft_nn::Model`,
//!   run SPMD: one thread per rank, each holding only its shards.
//! - [`CoordinatedOptimizer`]: any optimizer, made to agree across ranks (shared norm, shared
//!   skip on a non-finite gradient, gradients averaged where the plan replicates).
//! - [`verify`]: trains sharded and on one device, and reports the largest differences.
//! - `mpi` (feature `mpi`): the collectives across processes and hosts, over MPI.

#![warn(missing_docs)]

mod comm;
mod coordinated;
mod groups;
mod mesh;
#[cfg(feature = "mpi")]
pub mod mpi;
mod plan;
mod sharded;
mod verify;

pub use comm::{FailureHook, InHost, World};
pub use coordinated::CoordinatedOptimizer;
pub use mesh::DeviceMesh;
pub use plan::Split;
pub use plan::{AutoConfig, CollectiveCost, DeviceMemory, LayerPlan, PlanInput, ShardingPlan, VarPlan, autoconfig};
pub use sharded::ShardedModel;
pub use verify::{BatchSource, Difference, VerifyOptions, VerifyReport, verify, verify_with};
