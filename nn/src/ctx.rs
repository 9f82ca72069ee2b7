//! The context a layer is called with: training or inference, and where its randomness comes from.

/// Passed to every `Layer::call`.
#[derive(Debug, Clone)]
pub struct Ctx {
    /// True during `fit`: dropout is active.
    pub training: bool,
    /// Base seed for initializers and dropout.
    pub seed: u64,
    /// Counts calls, so each training step draws a fresh dropout mask from the same seed.
    pub step: u64,
    /// Set on each rank of a sharded model: the collectives and every layer's shard.
    pub tp: Option<std::sync::Arc<crate::tp::TpCtx>>,
    /// On a data axis: (first row, rows of the whole batch) of this rank's part of the batch, so
    /// that dropout draws the whole batch's mask and keeps its rows.
    pub batch_part: Option<(usize, usize)>,
}

impl Ctx {
    /// Inference context.
    pub fn inference() -> Self {
        Ctx { training: false, seed: 0, step: 0, tp: None, batch_part: None }
    }

    /// Training context with a seed.
    pub fn training(seed: u64) -> Self {
        Ctx { training: true, seed, step: 0, tp: None, batch_part: None }
    }

    /// The seed of the initial weights of the layer at `path`: per path and base seed, never per
    /// step, so a model draws the same weights whether it is built before training (by `predict`,
    /// or split over devices) or by its first training step.
    pub fn init_seed(&self, path: &str) -> u64 {
        mix(path, self.seed, 0)
    }

    /// A seed for the layer at `path`, different per path and per step, stable across runs (what
    /// dropout draws its masks from).
    pub fn seed_for(&self, path: &str) -> u64 {
        mix(path, self.seed, self.step)
    }
}

/// FNV-1a over the path, mixed with the base seed and the step.
fn mix(path: &str, seed: u64, step: u64) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in path.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
    }
    h ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ step.rotate_left(32)
}
