//! weft-nn: what users write models against. Layers with named variables, Sequential, losses,
//! metrics, optimizers with learning-rate schedules, and a Keras-like `compile` / `fit` /
//! `evaluate` / `predict` loop.
//!
//! ```
//! use weft_core::{Device, Tensor};
//! use weft_nn::{layers::Dense, Activation, Loss, Model, Sequential, optim::Adam, FitOptions};
//! let dev = Device::Cpu;
//! let net = Sequential::new().add(Dense::new(8).activation(Activation::Relu)).add(Dense::new(1));
//! let mut model = Model::new(net, &dev);
//! model.compile(Adam::new(0.01), Loss::MeanSquaredError, &[])?;
//! let x = Tensor::rand(-1.0, 1.0, &[64, 2], 0, &dev)?;
//! let y = x.sum(&[1], true)?;
//! let history = model.fit(&x, &y, FitOptions { epochs: 3, batch_size: 16, verbose: false, ..Default::default() })?;
//! assert_eq!(history.loss.len(), 3);
//! # Ok::<(), weft_core::Error>(())
//! ```

#![warn(missing_docs)]

mod activation;
pub mod callback;
pub mod checkpoint;
mod ctx;
pub mod data;
mod functional;
pub mod import;
mod init;
mod inputs;
mod layer;
pub mod layers;
mod loss;
mod metric;
mod model;
pub mod models;
pub mod optim;
mod outputs;
mod penalty;
mod sample_weights;
pub mod scope;
mod sequential;
pub mod split;
mod summary;
pub mod tokenizer;
pub mod tp;

pub use activation::Activation;
pub use ctx::Ctx;
pub use functional::{Functional, Sym};
pub use init::{Distribution, FanMode, Initializer};
pub use inputs::Inputs;
pub use layer::{Layer, LayerInfo, check_paths, sublayer_variables};
pub use loss::{Loss, Reduction};
pub use metric::{Auc, AucCurve, Metric};
pub use model::{FitOptions, History, Model};
pub use outputs::OutputLoss;
pub use penalty::{Constraint, Regularizer};
pub use sequential::Sequential;
pub use split::SplitRule;
