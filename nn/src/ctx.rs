//! The context a layer is called with: training or inference, where its randomness comes from,
//! and the state updates its training calls record.

use weft_core::{Tensor, Var};

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
    /// New values for non-trainable variables (a batch norm's moving statistics) that training
    /// calls recorded: `fit` puts them in place only once the step they belong to is applied,
    /// so a failed or skipped step changes no state. A training loop of one's own calls
    /// [`commit_updates`](Ctx::commit_updates) after its optimizer step.
    pub updates: Vec<(Var, Tensor)>,
    /// Losses the layers added while running (an activity regularizer's penalty, Keras'
    /// `add_loss`): `fit` and `evaluate` add them to the loss.
    pub losses: Vec<Tensor>,
}

impl Ctx {
    /// Inference context.
    pub fn inference() -> Self {
        Ctx { training: false, seed: 0, step: 0, tp: None, batch_part: None, updates: Vec::new(), losses: Vec::new() }
    }

    /// Training context with a seed.
    pub fn training(seed: u64) -> Self {
        Ctx { training: true, seed, step: 0, tp: None, batch_part: None, updates: Vec::new(), losses: Vec::new() }
    }

    /// Record `value` as the next value of the non-trainable `var` (put in place by
    /// [`commit_updates`](Ctx::commit_updates)).
    pub fn record_update(&mut self, var: &Var, value: Tensor) {
        self.updates.push((var.clone(), value));
    }

    /// The value recorded last for `var` and not yet committed: a layer called twice in one
    /// step (a shared layer) moves its state on from there, as Keras' second call does.
    pub fn pending(&self, var: &Var) -> Option<&Tensor> {
        self.updates.iter().rev().find(|(v, _)| v.id() == var.id()).map(|(_, t)| t)
    }

    /// Add a loss (a 0-d tensor) to the batch's (Keras' `add_loss`).
    pub fn add_loss(&mut self, loss: Tensor) {
        self.losses.push(loss);
    }

    /// Put every recorded update in place, in the order recorded, and forget them.
    ///
    /// ```
    /// use weft_core::{Device, Tensor, Var};
    /// use weft_nn::Ctx;
    /// let v = Var::non_trainable(Tensor::zeros(&[2], &Device::Cpu)?)?;
    /// let mut ctx = Ctx::training(0);
    /// ctx.record_update(&v, Tensor::ones(&[2], &Device::Cpu)?);
    /// assert_eq!(v.to_vec::<f32>()?, vec![0.0; 2]); // not yet
    /// ctx.commit_updates()?;
    /// assert_eq!(v.to_vec::<f32>()?, vec![1.0; 2]);
    /// # Ok::<(), weft_core::Error>(())
    /// ```
    pub fn commit_updates(&mut self) -> weft_core::Result<()> {
        let updates = std::mem::take(&mut self.updates);
        // Checked first, so an update that does not fit changes no variable.
        check_updates(&updates)?;
        for (v, t) in updates {
            v.set(&t)?;
        }
        Ok(())
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

/// An `Err` naming the first update whose value does not fit its variable.
pub(crate) fn check_updates(updates: &[(Var, Tensor)]) -> weft_core::Result<()> {
    // Everything `Var::set` would refuse: the step's update may already be written when these
    // are committed, so a refusal must come now.
    let wrong = |(v, t): &&(Var, Tensor)| t.dims() != v.dims() || t.device() != v.device() || t.dtype() != v.dtype();
    match updates.iter().find(wrong) {
        Some((v, t)) => Err(weft_core::Error::invalid(
            "commit_updates",
            format!(
                "a {:?} value of shape {:?} on {} for a {:?} variable of shape {:?} on {}",
                t.dtype(),
                t.dims(),
                t.device().describe(),
                v.dtype(),
                v.dims(),
                v.device().describe()
            ),
        )),
        None => Ok(()),
    }
}
