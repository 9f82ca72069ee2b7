//! The built-in layers.

mod attention;
mod batch_norm;
mod bidirectional;
mod conv;
mod dense;
mod einsum_dense;
mod embedding;
mod group_norm;
mod layer_norm;
mod merge;
mod pooling;
mod position;
mod recurrent;
mod simple;
mod transformer;
mod window_pooling;

pub use attention::{AttentionMasks, MultiHeadAttention};
pub use batch_norm::BatchNormalization;
pub use bidirectional::{Bidirectional, MergeMode, Reversible};
pub use conv::{Conv1D, Conv2D};
pub use dense::Dense;
pub use einsum_dense::EinsumDense;
pub use embedding::{Embedding, TiedHead};
pub use group_norm::GroupNormalization;
pub use layer_norm::{LayerNormalization, RMSNormalization};
pub use merge::{Add, Concatenate, Multiply};
pub use pooling::{GlobalAveragePooling1D, UnitNormalization};
pub use position::PositionEmbedding;
pub use recurrent::{GRU, LSTM, SimpleRNN};
pub use simple::{ActivationLayer, Cropping1D, Dropout, Flatten, Reshape};
pub use transformer::TransformerBlock;
pub use window_pooling::{
    AveragePooling1D, AveragePooling2D, GlobalAveragePooling2D, GlobalMaxPooling1D, GlobalMaxPooling2D, MaxPooling1D,
    MaxPooling2D,
};
