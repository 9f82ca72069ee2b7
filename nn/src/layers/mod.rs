//! The built-in layers.

mod attention;
mod dense;
mod einsum_dense;
mod embedding;
mod layer_norm;
mod merge;
mod pooling;
mod position;
mod simple;
mod transformer;

pub use attention::{AttentionMasks, MultiHeadAttention};
pub use dense::Dense;
pub use einsum_dense::EinsumDense;
pub use embedding::{Embedding, TiedHead};
pub use layer_norm::LayerNormalization;
pub use merge::{Add, Concatenate, Multiply};
pub use pooling::{GlobalAveragePooling1D, UnitNormalization};
pub use position::PositionEmbedding;
pub use simple::{ActivationLayer, Cropping1D, Dropout, Flatten, Reshape};
pub use transformer::TransformerBlock;
