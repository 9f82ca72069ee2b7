//! Model architectures built from weft's layers, with importers for their published checkpoints.

pub mod bert;
