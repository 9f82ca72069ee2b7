//! `CoordinatedOptimizer`: wraps any optimizer so the ranks of a sharded model take the same step.
//!
//! Per step, before the wrapped optimizer's own update (which runs on each rank's shards, on its
//! device, with its slots there: 1/N of the optimizer state per rank, and nothing through the host):
//!
//! 1. on a data axis, every gradient is summed over it (each rank's loss was weighted by its
//!    share of the batch, so the sum is the gradient of the batch mean);
//! 2. gradients of replicated variables are averaged over the model axis: in exact arithmetic
//!    they agree already, and the mean stops rounding from letting the copies drift apart;
//! 3. the squared global norm is one all-reduce of (sum over split gradients, sum over replicated
//!    gradients / N), so a replicated variable counts once however many ranks hold it;
//! 4. a non-finite norm (an inf or NaN anywhere, on any rank) skips the step on every rank;
//! 5. clipping scales every gradient by the same factor on every rank.
//!
//! The step counter and the learning-rate schedule are the wrapped optimizer's own, and advance
//! identically on every rank because every rank applies (or skips) every step.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use weft_core::{Collectives, GradStore, ReduceKind, Result, Tensor, Var, no_grad};
use weft_nn::optim::Optimizer;

/// The `Optimizer` methods that read or restore state, passed to the wrapped optimizer `$inner`.
macro_rules! delegate_state {
    ($inner:ident) => {
        fn iterations(&self) -> u64 {
            self.$inner.iterations()
        }
        fn learning_rate(&self) -> f32 {
            self.$inner.learning_rate()
        }
        fn set_learning_rate(&mut self, lr: f32) -> Result<()> {
            self.$inner.set_learning_rate(lr)
        }
        fn slot(&self, path: &str, name: &str) -> Option<Tensor> {
            self.$inner.slot(path, name)
        }
        fn slots(&self) -> Vec<(String, String, Tensor)> {
            self.$inner.slots()
        }
        fn set_slot(&mut self, path: &str, name: &str, value: Tensor) {
            self.$inner.set_slot(path, name, value)
        }
        fn set_iterations(&mut self, n: u64) {
            self.$inner.set_iterations(n)
        }
        fn validate(&self) -> Result<()> {
            self.$inner.validate()
        }
        fn finalize(&mut self, params: &[(String, Var)]) -> Result<()> {
            self.$inner.finalize(params)
        }
        fn gradient_accumulation_steps(&self) -> Option<u64> {
            self.$inner.gradient_accumulation_steps()
        }
    };
}
pub(crate) use delegate_state;

/// An optimizer for one rank of a sharded model. `ShardedModel::compile` makes one per rank;
/// alone, over a group of one, it is the optimizer it wraps.
///
/// ```
/// use std::sync::Arc;
/// use weft_core::{Device, SingleRank, Tensor, Var};
/// use weft_nn::optim::{Optimizer, Sgd};
/// use weft_parallel::CoordinatedOptimizer;
/// let w = Var::new(Tensor::ones(&[2], &Device::Cpu)?)?;
/// let loss = w.as_tensor().square()?.sum_all()?; // gradient 2w = [2, 2], norm 2.83
/// let grads = loss.backward()?;
/// let one = Arc::new(SingleRank);
/// let sgd = Sgd::new(0.5).clip_global_norm(1.0); // the wrapper takes over the clipping
/// let mut opt = CoordinatedOptimizer::new(Box::new(sgd), one.clone(), one, ["w".to_string()].into());
/// opt.apply(&[("w".to_string(), w.clone())], &grads)?;
/// let v = w.to_vec::<f32>()?;
/// assert!((v[0] - (1.0 - 0.5 * 2.0 / 8f32.sqrt())).abs() < 1e-6);
/// # Ok::<(), weft_core::Error>(())
/// ```
pub struct CoordinatedOptimizer {
    inner: Box<dyn Optimizer>,
    model: Arc<dyn Collectives>,
    data: Arc<dyn Collectives>,
    split: HashSet<String>,
    clip: Option<f32>,
    skipped: u64,
    last_skipped: bool,
    recorder: Option<Recorder>,
}

/// Where a coordinated optimizer leaves each step's gradients when asked to.
pub type Recorder = (Arc<AtomicBool>, Arc<Mutex<Vec<(String, Tensor)>>>);

impl CoordinatedOptimizer {
    /// Wrap `inner` for a rank whose model-axis and data-axis groups are `model` and `data`;
    /// `split` lists the paths of the variables split over the model axis. The wrapper takes
    /// over `inner`'s global-norm clipping, since the norm spans every rank.
    pub fn new(
        mut inner: Box<dyn Optimizer>,
        model: Arc<dyn Collectives>,
        data: Arc<dyn Collectives>,
        split: HashSet<String>,
    ) -> Self {
        let clip = inner.global_clipnorm();
        inner.set_global_clipnorm(None);
        CoordinatedOptimizer { inner, model, data, split, clip, skipped: 0, last_skipped: false, recorder: None }
    }

    /// Steps skipped because a gradient was not finite.
    pub fn skipped_steps(&self) -> u64 {
        self.skipped
    }

    /// While `flag` is set, leave each step's synchronized gradients (before clipping) in `store`.
    pub fn with_recorder(mut self, recorder: Recorder) -> Self {
        self.recorder = Some(recorder);
        self
    }

    /// `apply`'s work: the gradients all-reduced over the data ranks (and the replicated ones
    /// over the model ranks), the global norm over every rank, a step skipped where it is not
    /// finite, the clipping, then the inner optimizer.
    fn reduce_clip_apply(&mut self, params: &[(String, Var)], grads: &GradStore) -> Result<()> {
        no_grad(|| {
            let mut vars: Vec<(&String, &Var)> = Vec::new();
            let mut gs: Vec<Tensor> = Vec::new();
            for (path, var) in params {
                if let Some(g) = grads.get(var) {
                    vars.push((path, var));
                    gs.push(g.clone());
                }
            }
            if self.data.world_size() > 1 {
                gs = Self::all_reduce_many(self.data.as_ref(), &gs, ReduceKind::Sum)?;
            }
            let is_split: Vec<bool> = vars.iter().map(|(p, _)| self.split.contains(*p)).collect();
            if self.model.world_size() > 1 {
                let idx: Vec<usize> = (0..gs.len()).filter(|&i| !is_split[i]).collect();
                let rep: Vec<Tensor> = idx.iter().map(|&i| gs[i].clone()).collect();
                for (i, g) in idx.into_iter().zip(Self::all_reduce_many(self.model.as_ref(), &rep, ReduceKind::Mean)?) {
                    gs[i] = g;
                }
            }
            // Squared norm: split parts summed over the ranks, replicated ones counted once.
            let dev = gs.first().map(|g| g.device().clone()).unwrap_or(weft_core::Device::Cpu);
            let (mut split_sq, mut rep_sq) = (Tensor::zeros(&[], &dev)?, Tensor::zeros(&[], &dev)?);
            for (g, s) in gs.iter().zip(&is_split) {
                let sq = g.square()?.sum_all()?;
                if *s { split_sq = split_sq.add(&sq)? } else { rep_sq = rep_sq.add(&sq)? }
            }
            let n = self.model.world_size() as f32;
            let both = Tensor::stack(&[split_sq, rep_sq.mul_scalar(1.0 / n)?], 0)?;
            let total = self.model.all_reduce(&both, ReduceKind::Sum)?.sum_all()?.to_scalar::<f32>()?;
            if let Some((flag, store)) = &self.recorder
                && flag.load(Ordering::Relaxed)
            {
                *store.lock().unwrap_or_else(|p| p.into_inner()) =
                    vars.iter().map(|(p, _)| p.to_string()).zip(gs.iter().cloned()).collect();
            }
            self.last_skipped = !total.is_finite();
            if self.last_skipped {
                self.skipped += 1;
                return Ok(());
            }
            let norm = total.sqrt();
            if let Some(c) = self.clip
                && norm > c
            {
                gs = gs.iter().map(|g| g.mul_scalar(c / norm)).collect::<Result<_>>()?;
            }
            let mut store = GradStore::default();
            for ((_, var), g) in vars.iter().zip(gs) {
                store.insert(var.as_tensor(), g);
            }
            self.inner.apply(params, &store)
        })
    }

    /// One all-reduce for many tensors: flattened, joined, reduced, and cut back.
    fn all_reduce_many(comm: &dyn Collectives, ts: &[Tensor], kind: ReduceKind) -> Result<Vec<Tensor>> {
        if ts.is_empty() {
            return Ok(Vec::new());
        }
        let flat: Vec<Tensor> = ts.iter().map(|t| t.reshape(&[t.numel()])).collect::<Result<_>>()?;
        let joined = comm.all_reduce(&Tensor::concat(&flat, 0)?, kind)?;
        let mut at = 0;
        ts.iter()
            .map(|t| {
                let part = joined.narrow(0, at, t.numel())?.reshape(t.dims());
                at += t.numel();
                part
            })
            .collect()
    }
}

impl Optimizer for CoordinatedOptimizer {
    fn apply(&mut self, params: &[(String, Var)], grads: &GradStore) -> Result<()> {
        // (In the mode of the inner optimizer's step, so that the clipping here flushes as a
        // single device's does.)
        weft_nn::optim::on_the_cpu_flushing(params, || self.reduce_clip_apply(params, grads))
    }
    delegate_state!(inner);
    fn last_step_skipped(&self) -> bool {
        self.last_skipped
    }
    fn global_clipnorm(&self) -> Option<f32> {
        self.clip
    }
    fn set_global_clipnorm(&mut self, max_norm: Option<f32>) {
        self.clip = max_norm;
    }
}
