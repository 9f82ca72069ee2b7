//! weft-nn: layers, losses, optimizers and the Keras-like training loop (issue #3; not built yet).
