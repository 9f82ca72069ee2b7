//! The `Optimizer` trait, the shared step (gradient clipping, decoupled weight decay, slots),
//! and the update rules of SGD, Adam, AdamW and RMSprop (Keras' formulas and defaults; the
//! other rules are in `adaptive.rs`).

use super::LearningRate;
// Keyed by variables' paths and slot names, which no one picks adversarially: Fx's hash, not
// SipHash (looked up for every variable every step).
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use weft_core::ops::BinaryOp;
use weft_core::optim_ops::AdamStep;
use weft_core::{Error, GradStore, Result, Tensor, Var, flushing_subnormals, no_grad};

/// Updates variables from their gradients.
pub trait Optimizer: Send {
    /// One update of `params` (path, variable) from `grads`; variables without a gradient are left alone.
    fn apply(&mut self, params: &[(String, Var)], grads: &GradStore) -> Result<()>;
    /// Calls of `apply` so far (with gradient accumulation, each update takes several).
    fn iterations(&self) -> u64;
    /// The learning rate the next step will use.
    fn learning_rate(&self) -> f32;
    /// Train at `lr` from the next step on (callbacks such as `ReduceLROnPlateau` do). `Err` when
    /// the rate follows a schedule (as in Keras, a schedule's rate is not set by hand) or `lr`
    /// is not a finite number of at least 0.
    fn set_learning_rate(&mut self, lr: f32) -> Result<()> {
        Err(Error::invalid("optimizer", format!("this optimizer cannot set its learning rate to {lr}")))
    }
    /// A state slot of the variable at `path` (e.g. `m` and `v` for Adam).
    fn slot(&self, path: &str, name: &str) -> Option<Tensor>;
    /// Every slot as (variable path, slot name, value), sorted.
    fn slots(&self) -> Vec<(String, String, Tensor)>;
    /// Replace (or create) a slot, e.g. when resuming from a checkpoint.
    fn set_slot(&mut self, path: &str, name: &str, value: Tensor);
    /// Set the step counter (the schedules read it), e.g. when resuming from a checkpoint.
    fn set_iterations(&mut self, n: u64);
    /// The global-norm clipping threshold, if any.
    fn global_clipnorm(&self) -> Option<f32>;
    /// The per-variable norm clipping threshold (Keras' `clipnorm`), if any.
    fn clip_norm(&self) -> Option<f32> {
        None
    }
    /// Change the global-norm clipping threshold (`None`: no clipping). A coordinated optimizer
    /// takes clipping over, because the norm of a split model spans every rank.
    fn set_global_clipnorm(&mut self, max_norm: Option<f32>);
    /// The last step of training (`fit` calls it at the end): with an EMA, the weights take
    /// their moving averages (Keras' `finalize_variable_values`).
    fn finalize(&mut self, params: &[(String, Var)]) -> Result<()> {
        let _ = params;
        Ok(())
    }
    /// Keras' `gradient_accumulation_steps`, when set.
    fn gradient_accumulation_steps(&self) -> Option<u64> {
        None
    }
    /// Whether the last `apply` left everything as it was on purpose (a coordinated optimizer
    /// skips a step whose gradients are not finite on every rank): `fit` then keeps the layers'
    /// state (moving statistics) as it was too.
    fn last_step_skipped(&self) -> bool {
        false
    }
    /// A copy of this whole optimizer as it stands (counters, schedule, slots), which the model
    /// puts back in its place when a step it has already applied turns out to fail (a loss or
    /// gradient that is not finite, read back after the update). It must share no mutable state
    /// with `self` (a wrapper copies itself, not only what it wraps); slots may share their
    /// tensors, so this copies no data (a slot held twice is never written in place: see
    /// `Var::adam_step_in_place`). `None`, the
    /// default, makes the model read the step's figures back and check them before the update
    /// instead: on a GPU, a wait in mid-step.
    fn fork(&self) -> Option<Box<dyn Optimizer>> {
        None
    }
    /// The gradients the last `apply` checked in its own pass over them, as (variable path, a
    /// `[1]` tensor: 0 when every value of that variable's gradient was finite, NaN when any was
    /// not). On a GPU, where the step applies before it checks, the training step takes these
    /// instead of reading those gradients a second time (Adam's one pass does both, where the
    /// adapter allows: see [`Tensor::adam_step_checked`]); a variable not listed is checked by
    /// the step. (On the Cpu the step checks every gradient before the update, on the host.) Only a
    /// gradient used just as `apply` received it may be listed, not one clipped, scaled or
    /// accumulated first. The default lists none.
    fn gradient_checks(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }
    /// Whether `apply` takes gradients left as products ([`GradStore::product`]: a dense layer's
    /// `x^T @ dy`) and works each out inside its own update, so that the training step may leave
    /// them so ([`Tensor::backward_deferring`](weft_core::Tensor::backward_deferring)). Adam does
    /// on the Cpu (see [`Tensor::adam_step_of_product`]), when it uses the gradients as given (no
    /// clipping, no accumulation) and without AMSGrad. The training step checks such gradients
    /// by a bound, without working them out (`GradStore::surely_finite`). The default is `false`.
    fn fuses_products(&self) -> bool {
        false
    }
    /// Check the hyper-parameters (learning rate and schedule, betas, epsilon, clipping, decay):
    /// `compile` calls this, so a bad value is an `Err` naming it before any step runs.
    fn validate(&self) -> Result<()> {
        Ok(())
    }
}

/// A variable's gradient as a rule receives it.
#[derive(Clone, Copy)]
pub(super) enum Grad<'a> {
    /// Worked out.
    Tensor(&'a Tensor),
    /// Left as the product `lhs @ rhs` (see [`Optimizer::fuses_products`]).
    Product(&'a Tensor, &'a Tensor),
}

impl Grad<'_> {
    /// The gradient worked out (a product multiplied).
    pub(super) fn tensor(self) -> Result<Tensor> {
        match self {
            Grad::Tensor(g) => Ok(g.clone()),
            Grad::Product(l, r) => GradStore::multiply(l, r),
        }
    }
}

/// `Err` unless `lo <= v <= hi` (with `hi_open`, `v < hi`) and `v` is finite.
pub(super) fn check_range(what: &str, v: f32, lo: f32, hi: f32, hi_open: bool) -> Result<()> {
    let ok = v.is_finite() && v >= lo && if hi_open { v < hi } else { v <= hi };
    if ok {
        return Ok(());
    }
    if hi == f32::MAX {
        return Err(Error::invalid("optimizer", format!("{what} must be a finite number of at least {lo}, got {v}")));
    }
    let close = if hi_open { ")" } else { "]" };
    Err(Error::invalid("optimizer", format!("{what} must be in [{lo}, {hi}{close}, got {v}")))
}

/// What every optimizer shares: schedule, clipping, weight decay, step count, slots.
#[derive(Default, Clone)]
pub(super) struct Base {
    lr: Option<LearningRate>,
    pub(super) clip_global_norm: Option<f32>,
    pub(super) clip_norm: Option<f32>,
    pub(super) clip_value: Option<f32>,
    pub(super) weight_decay: f32,
    /// Substrings of the paths of variables weight decay leaves alone.
    pub(super) exclude_from_decay: Vec<String>,
    /// Updates applied so far (what schedules and bias corrections count).
    pub(super) iterations: u64,
    /// Keras' `gradient_accumulation_steps`: gradients summed over this many calls, then one
    /// update with their mean.
    pub(super) accumulate: Option<u64>,
    /// Gradients summed toward the next update (0 .. accumulate).
    pub(super) pending: u64,
    /// Keras' `use_ema` with its `ema_momentum`.
    pub(super) ema: Option<f32>,
    /// Keras' `ema_overwrite_frequency` (only with `ema`).
    pub(super) ema_overwrite: Option<u64>,
    pub(super) slots: HashMap<String, HashMap<String, Tensor>>,
    /// The rule applies weight decay itself, in its own pass over the weights (Adam's fused
    /// update): the step then hands it the weights undecayed and the factor in `decay`.
    pub(super) folds_decay: bool,
    /// The weight decay factor for the variable the rule is called for (`1 - lr * wd`, or 1);
    /// only read where `folds_decay`.
    pub(super) decay: f32,
    /// The last step's gradient checks made by the rule itself (see
    /// [`Optimizer::gradient_checks`]); `None` when the step changed the gradients first.
    pub(super) checks: Option<Vec<(String, Tensor)>>,
    /// The variable the rule is called for, where the rule may leave it to be written in place
    /// at the step's end (see `in_place.rs`); set by the step for each variable.
    pub(super) may_defer: Option<Var>,
    /// The updates the rules left to be written in place at the step's end.
    pub(super) deferred: Vec<super::in_place::Deferred>,
    /// While a staged step runs: each slot it changed, with what it held before (`None`: made
    /// by this step), newest last, so that a step that fails puts every one back.
    undo: Option<Vec<(String, &'static str, Option<Tensor>)>>,
}

/// What a staged step leaves to do once it has worked everything out: the variables' new
/// values, and the updates to write in place.
struct Staged<'a> {
    sets: Vec<(&'a Var, Tensor)>,
    deferred: Vec<super::in_place::Deferred>,
}

impl Base {
    pub(super) fn new(lr: LearningRate) -> Self {
        Base { lr: Some(lr), ..Default::default() }
    }
    pub(super) fn set_lr(&mut self, lr: f32) -> Result<()> {
        check_range("the learning rate", lr, 0.0, f32::MAX, false)?;
        match &self.lr {
            None | Some(LearningRate::Constant(_)) => {
                self.lr = Some(LearningRate::Constant(lr));
                Ok(())
            }
            Some(s) => Err(Error::invalid(
                "optimizer",
                format!("the learning rate follows a schedule ({s:?}); a schedule's rate cannot be set to {lr}"),
            )),
        }
    }
    pub(super) fn lr(&self) -> f32 {
        // Keras reads a schedule at the count of calls (its `_iterations`).
        self.lr.as_ref().map_or(0.0, |l| l.at(self.calls()))
    }
    pub(super) fn validate(&self) -> Result<()> {
        if let Some(lr) = &self.lr {
            lr.validate()?;
        }
        if let Some(c) = self.clip_global_norm {
            check_range("the global clipping norm", c, f32::MIN_POSITIVE, f32::MAX, false)?;
        }
        if let Some(c) = self.clip_norm {
            check_range("clip_norm", c, f32::MIN_POSITIVE, f32::MAX, false)?;
        }
        if let Some(c) = self.clip_value {
            check_range("clip_value", c, 0.0, f32::MAX, false)?;
        }
        let set = [self.clip_global_norm.is_some(), self.clip_norm.is_some(), self.clip_value.is_some()];
        if set.iter().filter(|&&s| s).count() > 1 {
            return Err(Error::invalid(
                "optimizer",
                "set at most one of clip_global_norm, clip_norm and clip_value (as Keras allows one of global_clipnorm, clipnorm, clipvalue)",
            ));
        }
        if self.accumulate.is_some_and(|n| n < 2) {
            return Err(Error::invalid("optimizer", "gradient_accumulation_steps must be at least 2"));
        }
        if let Some(m) = self.ema {
            check_range("ema_momentum", m, 0.0, 1.0, false)?;
        }
        if self.ema_overwrite == Some(0) {
            return Err(Error::invalid("optimizer", "ema_overwrite_frequency must be at least 1"));
        }
        check_range("weight_decay", self.weight_decay, 0.0, f32::MAX, false)
    }

    /// Calls of `apply` so far (Keras' `_iterations`): the updates times the accumulation
    /// steps, plus the gradients waiting for the next update.
    pub(super) fn calls(&self) -> u64 {
        self.iterations * self.accumulate.unwrap_or(1) + self.pending
    }
    pub(super) fn set_calls(&mut self, n: u64) {
        let k = self.accumulate.unwrap_or(1);
        (self.iterations, self.pending) = (n / k, n % k);
    }

    /// Keras' EMA after a call, given every trainable variable's value after it (`new`, the
    /// variable's own when this call left it): each average moves toward it by `1 - momentum`
    /// (taken whole while no update has been applied), and every `ema_overwrite_frequency`-th
    /// update the weights take their averages. Only the slots change here; the values to put in
    /// the variables come back, so the caller sets everything at once.
    fn track_average<'v>(
        &mut self,
        new: Vec<(&str, &'v Var, Tensor)>,
        updates_before: u64,
    ) -> Result<Vec<(&'v Var, Tensor)>> {
        let Some(momentum) = self.ema else { return Ok(new.into_iter().map(|(_, v, t)| (v, t)).collect()) };
        let m = if updates_before == 0 { 0.0 } else { momentum };
        let mut averages = Vec::with_capacity(new.len());
        for (path, _, value) in &new {
            averages.push(match self.slots.get(*path).and_then(|s| s.get("ema")) {
                Some(a) => a.mul_scalar(m)?.add(&value.mul_scalar(1.0 - m)?)?,
                // A snapshot: the variable's own tensor would follow its later updates.
                None => value.snapshot(),
            });
        }
        let overwrite = self.ema_overwrite.is_some_and(|k| (updates_before + 1).is_multiple_of(k));
        let mut sets = Vec::with_capacity(new.len());
        for ((path, var, value), avg) in new.into_iter().zip(averages) {
            sets.push((var, if overwrite { avg.clone() } else { value }));
            self.set_slot(path, "ema", avg);
        }
        Ok(sets)
    }

    /// The weights take their moving averages (Keras' `finalize_variable_values`, at the end
    /// of `fit`); nothing without EMA.
    pub(super) fn finalize(&self, params: &[(String, Var)]) -> Result<()> {
        if self.ema.is_none() {
            return Ok(());
        }
        for (path, var) in params {
            if let Some(avg) = self.slots.get(path).and_then(|s| s.get("ema")) {
                var.set(avg)?;
            }
        }
        Ok(())
    }
    /// A copy to stage a step in, holding the slots (moved, not copied) and recording what it
    /// changes in them ([`rolled_back`](Self::rolled_back) undoes it).
    fn staging(&mut self) -> Base {
        let slots = std::mem::take(&mut self.slots);
        let mut staged = self.clone();
        staged.slots = slots;
        staged.undo = Some(Vec::new());
        staged
    }

    /// The slots as they were before this staged copy changed them.
    fn rolled_back(mut self) -> HashMap<String, HashMap<String, Tensor>> {
        for (path, name, before) in self.undo.take().unwrap_or_default().into_iter().rev() {
            let map = self.slots.entry(path.clone()).or_default();
            match before {
                Some(t) => {
                    map.insert(name.to_string(), t);
                }
                None => {
                    map.remove(name);
                    if map.is_empty() {
                        self.slots.remove(&path);
                    }
                }
            }
        }
        self.slots
    }

    pub(super) fn slot(&mut self, path: &str, name: &'static str, like: &Tensor) -> Result<Tensor> {
        self.slot_from(path, name, like, 0.0)
    }
    /// The slot, made full of `init` on first use.
    pub(super) fn slot_from(&mut self, path: &str, name: &'static str, like: &Tensor, init: f32) -> Result<Tensor> {
        // (Looked up by reference first: the map's keys are made only once, on first use.)
        if let Some(t) = self.slots.get(path).and_then(|s| s.get(name)) {
            return Ok(t.clone());
        }
        let z = Tensor::full(init, like.dims(), like.device())?;
        self.set_slot(path, name, z.clone());
        Ok(z)
    }
    /// Whether the rules get the gradients as `apply` received them: no accumulation, no
    /// clipping (only then may a rule's own check stand for the step's, or a product be fused).
    pub(super) fn uses_as_given(&self) -> bool {
        self.accumulate.is_none()
            && self.clip_norm.is_none()
            && self.clip_value.is_none()
            && self.clip_global_norm.is_none()
    }

    /// Keep a rule's check of the gradient of `path` (when the step gave the rule the
    /// gradient as `apply` received it).
    pub(super) fn note_check(&mut self, path: &str, check: Option<Tensor>) {
        if let (Some(list), Some(c)) = (self.checks.as_mut(), check) {
            list.push((path.to_string(), c));
        }
    }
    /// Put `t` in a slot (recording what it held while a staged step runs).
    pub(super) fn set_slot(&mut self, path: &str, name: &'static str, t: Tensor) {
        let before = match self.slots.get_mut(path).and_then(|s| s.get_mut(name)) {
            Some(old) => Some(std::mem::replace(old, t)),
            None => {
                self.slots.entry(path.to_string()).or_default().insert(name.to_string(), t);
                None
            }
        };
        if let Some(undo) = self.undo.as_mut() {
            undo.push((path.to_string(), name, before));
        }
    }

    /// Run one step: gather gradients, clip them by global norm, decay weights, then call
    /// `rule(base, path, weight, grad, lr)` for the new weight of each variable.
    ///
    /// The step is staged: new weights and slots are all computed first and only then put in
    /// place, so a step that fails part way changes no weight, slot or counter. An update a rule
    /// may write over the old buffers (Adam's on the Cpu) is left to that end too
    /// (`in_place.rs`). On the Cpu it
    /// flushes subnormal values to zero ([`on_the_cpu_flushing`]): a moment decaying toward 0
    /// would otherwise slow every later update many times over.
    pub(super) fn step(
        &mut self,
        params: &[(String, Var)],
        grads: &GradStore,
        rule: impl FnMut(&mut Base, &str, &Tensor, Grad<'_>, f32) -> Result<Tensor>,
    ) -> Result<()> {
        on_the_cpu_flushing(params, || self.staged_step(params, grads, rule))
    }

    /// [`step`](Self::step)'s work, in its floating-point mode.
    fn staged_step(
        &mut self,
        params: &[(String, Var)],
        grads: &GradStore,
        mut rule: impl FnMut(&mut Base, &str, &Tensor, Grad<'_>, f32) -> Result<Tensor>,
    ) -> Result<()> {
        no_grad(|| {
            self.checks = None;
            // A gradient left as a product goes to the rule as one when it is used as given;
            // else it is worked out here, like any other.
            let mut products: Vec<(&String, &Var, (&Tensor, &Tensor))> = Vec::new();
            let mut pairs: Vec<(&String, &Var, Tensor)> = Vec::new();
            for (path, var) in params {
                let resolved;
                let g = match (grads.get(var), grads.product(var)) {
                    (None, Some((l, r))) if self.uses_as_given() => {
                        let (a, b) = (l.dims(), r.dims());
                        if a.len() != 2 || b.len() != 2 || a[1] != b[0] || [a[0], b[1]] != var.dims() {
                            return Err(Error::invalid(
                                "optimizer",
                                format!("{path}: gradient {a:?} @ {b:?} for a variable of shape {:?}", var.dims()),
                            ));
                        }
                        products.push((path, var, (l, r)));
                        continue;
                    }
                    (None, Some(_)) => {
                        resolved = grads.resolve(var)?;
                        resolved.as_ref()
                    }
                    (g, _) => g,
                };
                if let Some(g) = g {
                    if g.dims() != var.dims() {
                        return Err(Error::invalid(
                            "optimizer",
                            format!(
                                "{path}: gradient of shape {:?} for a variable of shape {:?}",
                                g.dims(),
                                var.dims()
                            ),
                        ));
                    }
                    pairs.push((path, var, g.clone()));
                }
            }
            // The slots move to the staged copy (not copied: a step's own cost on a small
            // model), which records what it changes, to be put back if the step fails.
            let mut staged = self.staging();
            let updates_before = self.iterations;
            let mut run = |staged: &mut Base| -> Result<Staged<'_>> {
                if let Some(n) = self.accumulate {
                    // Keras: this call's gradients join the sum; only every n-th call updates,
                    // with the mean (clipped and applied as one step's gradients would be).
                    let mut sums = Vec::with_capacity(pairs.len());
                    for (path, _, g) in &pairs {
                        sums.push(match staged.slots.get(path.as_str()).and_then(|s| s.get("accumulated_gradient")) {
                            Some(acc) => acc.add(g)?,
                            None => g.clone(),
                        });
                    }
                    if self.pending + 1 < n {
                        for ((path, _, _), sum) in pairs.iter().zip(sums) {
                            staged.set_slot(path, "accumulated_gradient", sum);
                        }
                        staged.pending += 1;
                        let same = params.iter().map(|(p, v)| (p.as_str(), v, v.as_tensor().clone())).collect();
                        return Ok(Staged { sets: staged.track_average(same, updates_before)?, deferred: Vec::new() });
                    }
                    for (p, sum) in pairs.iter_mut().zip(sums) {
                        staged.set_slot(p.0, "accumulated_gradient", Tensor::zeros(sum.dims(), sum.device())?);
                        p.2 = sum.mul_scalar(1.0 / n as f32)?;
                    }
                    staged.pending = 0;
                }
                // Keras' clipnorm: each gradient scaled to a norm of at most c (on the device:
                // g * c / max(|g|, c)); clipvalue: each value clamped to [-c, c].
                if let Some(c) = self.clip_norm {
                    for p in pairs.iter_mut() {
                        let norm = p.2.square()?.sum_all()?.sqrt()?;
                        p.2 = p.2.mul_scalar(c)?.div(&norm.clamp(c, f32::INFINITY)?)?;
                    }
                }
                if let Some(c) = self.clip_value {
                    for p in pairs.iter_mut() {
                        p.2 = p.2.clamp(-c, c)?;
                    }
                }
                if let Some(clip) = self.clip_global_norm
                    && let Some((_, _, first)) = pairs.first()
                {
                    // On the device, with nothing read back: every gradient times clip / norm when
                    // the norm is past the bound, else times exactly 1 (a division of clip by itself
                    // need not be 1 on a GPU).
                    let dev = first.device().clone();
                    let mut sq = Tensor::zeros(&[], &dev)?;
                    for (_, _, g) in &pairs {
                        sq = sq.add(&g.square()?.sum_all()?)?;
                    }
                    let norm = sq.sqrt()?;
                    let scale = Tensor::where_cond(
                        &norm.cmp_scalar(BinaryOp::Gt, clip)?,
                        &Tensor::scalar(clip, &dev)?.div(&norm)?,
                        &Tensor::scalar(1.0, &dev)?,
                    )?;
                    for p in pairs.iter_mut() {
                        p.2 = p.2.mul(&scale)?;
                    }
                }
                // A rule's own check stands for the step's only when it saw the gradients as given.
                staged.checks = self.uses_as_given().then(Vec::new);
                staged.deferred = Vec::new();
                let buffers = super::in_place::Buffers::of(params, self);
                let lr = self.lr();
                let mut updated: HashMap<&str, Tensor> =
                    HashMap::with_capacity_and_hasher(pairs.len(), Default::default());
                let given = pairs.iter().map(|(p, v, g)| (*p, *v, Grad::Tensor(g)));
                for (path, var, g) in given.chain(products.iter().map(|&(p, v, (l, r))| (p, v, Grad::Product(l, r)))) {
                    let mut w = var.as_tensor().clone();
                    // Keras matches the names given against the variable's own name (`kernel`).
                    let name = path.rsplit('/').next().unwrap_or(path.as_str());
                    staged.decay = 1.0;
                    if self.weight_decay != 0.0 && !self.exclude_from_decay.iter().any(|e| name.contains(e.as_str())) {
                        if self.folds_decay {
                            // One pass over the weights, not two (the same bits: w * decay first).
                            staged.decay = 1.0 - lr * self.weight_decay;
                        } else {
                            w = w.mul_scalar(1.0 - lr * self.weight_decay)?;
                        }
                    }
                    staged.may_defer = buffers.may_defer(var, g);
                    let deferred = staged.deferred.len();
                    let new = rule(staged, path, &w, g, lr)?;
                    if staged.deferred.len() == deferred {
                        updated.insert(path.as_str(), new);
                    }
                }
                // Every value (new weights, averages) is worked out before any variable is set.
                let values = params
                    .iter()
                    .map(|(p, v)| {
                        let t = updated.remove(p.as_str()).unwrap_or_else(|| v.as_tensor().clone());
                        (p.as_str(), v, t)
                    })
                    .collect();
                let sets = staged.track_average(values, updates_before)?;
                staged.iterations += 1;
                staged.may_defer = None;
                Ok(Staged { sets, deferred: std::mem::take(&mut staged.deferred) })
            };
            // The slots go back whatever ends the step early, a panic too (a sharded model's
            // ranks turn one into an `Err` and train on).
            let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(&mut staged)));
            let Staged { sets, deferred } = match out {
                Ok(Ok(done)) => done,
                Ok(Err(e)) => {
                    self.slots = staged.rolled_back();
                    return Err(e);
                }
                Err(panic) => {
                    self.slots = staged.rolled_back();
                    std::panic::resume_unwind(panic);
                }
            };
            staged.undo = None;
            // The old state goes first, so that the slots the deferred updates write are held
            // once; the other variables are set before them (no deferred gradient reads them).
            *self = staged;
            // (A deferred variable's value is its own tensor: nothing to set.)
            let own: HashSet<_> = deferred.iter().map(|d| d.var().id()).collect();
            for (var, value) in sets {
                if !own.contains(&var.id()) {
                    var.set(&value)?;
                }
            }
            self.write_deferred(deferred)
        })
    }
}

/// `f` in a [`flushing_subnormals`] scope where any of the variables is on the Cpu (a GPU's
/// kernels keep their own mode, and a program on a GPU alone need not start the Cpu's threads):
/// how the optimizers' steps run, the built-in ones and a coordinated one over shards.
pub fn on_the_cpu_flushing<R>(params: &[(String, Var)], f: impl FnOnce() -> R) -> R {
    if params.iter().any(|(_, v)| matches!(v.device(), weft_core::Device::Cpu)) { flushing_subnormals(f) } else { f() }
}

macro_rules! optimizer_common {
    ($t:ident) => {
        impl $t {
            /// Clip gradients so their global L2 norm (over all variables) is at most `max_norm`
            /// (Keras' `global_clipnorm`).
            pub fn clip_global_norm(mut self, max_norm: f32) -> Self {
                self.base.clip_global_norm = Some(max_norm);
                self
            }
            /// Clip each variable's gradient to an L2 norm of at most `max_norm` (Keras'
            /// `clipnorm`). Not on a model split over devices, whose norms span ranks.
            pub fn clip_norm(mut self, max_norm: f32) -> Self {
                self.base.clip_norm = Some(max_norm);
                self
            }
            /// Clamp every gradient value to `[-limit, limit]` (Keras' `clipvalue`).
            pub fn clip_value(mut self, limit: f32) -> Self {
                self.base.clip_value = Some(limit);
                self
            }
            /// Decoupled weight decay: each step scales weights by `1 - lr * wd` before the update.
            pub fn weight_decay(mut self, wd: f32) -> Self {
                self.base.weight_decay = wd;
                self
            }
            /// Leave out of weight decay every variable whose own name (the last segment of its
            /// path: `bias`, `gamma`) contains one of `names` (Keras'
            /// `exclude_from_weight_decay(var_names=..)`).
            pub fn exclude_from_weight_decay(mut self, names: &[&str]) -> Self {
                self.base.exclude_from_decay = names.iter().map(|n| n.to_string()).collect();
                self
            }
            /// Sum the gradients of `steps` calls (at least 2) and update once with their mean
            /// (Keras' `gradient_accumulation_steps`): a batch `steps` times larger in memory of
            /// one. Schedules and bias corrections count updates.
            pub fn gradient_accumulation_steps(mut self, steps: u64) -> Self {
                self.base.accumulate = Some(steps);
                self
            }
            /// Keep an exponential moving average of the weights (Keras' `use_ema` with
            /// `ema_momentum`, default 0.99), which the weights take at the end of `fit`.
            pub fn ema(mut self, momentum: f32) -> Self {
                self.base.ema = Some(momentum);
                self
            }
            /// With [`ema`](Self::ema) (ignored without it, as in Keras): the weights take their
            /// averages every `steps` updates too (Keras' `ema_overwrite_frequency`).
            pub fn ema_overwrite_frequency(mut self, steps: u64) -> Self {
                self.base.ema_overwrite = Some(steps);
                self
            }
        }
    };
}

/// The `Optimizer` impl of a rule type. `optimizer_trait!(T)`: its `rule` takes each gradient
/// worked out (`&Tensor`); `optimizer_trait!(T, fuses)`: it takes [`Grad`] as given, products
/// included, and `T::fuses` tells when it may (see [`Optimizer::fuses_products`]).
macro_rules! optimizer_trait {
    ($t:ident) => {
        optimizer_trait!(@impl $t, worked_out);
    };
    ($t:ident, fuses) => {
        optimizer_trait!(@impl $t, fuses);
    };
    (@rule worked_out, $hp:ident, $b:ident, $path:ident, $w:ident, $g:ident, $lr:ident) => {
        Self::rule(&$hp, $b, $path, $w, &$g.tensor()?, $lr)
    };
    (@rule fuses, $hp:ident, $b:ident, $path:ident, $w:ident, $g:ident, $lr:ident) => {
        Self::rule(&$hp, $b, $path, $w, $g, $lr)
    };
    (@fuses worked_out, $s:ident) => {
        false
    };
    (@fuses fuses, $s:ident) => {
        $s.fuses()
    };
    (@impl $t:ident, $how:ident) => {
        impl Optimizer for $t {
            fn apply(&mut self, params: &[(String, Var)], grads: &GradStore) -> Result<()> {
                let hp = self.hyper();
                self.base.step(params, grads, |b, path, w, g, lr| optimizer_trait!(@rule $how, hp, b, path, w, g, lr))
            }
            fn fuses_products(&self) -> bool {
                optimizer_trait!(@fuses $how, self)
            }
            fn iterations(&self) -> u64 {
                self.base.calls()
            }
            fn learning_rate(&self) -> f32 {
                self.base.lr()
            }
            fn set_learning_rate(&mut self, lr: f32) -> Result<()> {
                self.base.set_lr(lr)
            }
            fn slot(&self, path: &str, name: &str) -> Option<Tensor> {
                self.base.slots.get(path)?.get(name).cloned()
            }
            fn slots(&self) -> Vec<(String, String, Tensor)> {
                let mut all: Vec<_> = self
                    .base
                    .slots
                    .iter()
                    .flat_map(|(p, s)| s.iter().map(move |(n, t)| (p.clone(), n.clone(), t.clone())))
                    .collect();
                all.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
                all
            }
            fn set_slot(&mut self, path: &str, name: &str, value: Tensor) {
                self.base.slots.entry(path.to_string()).or_default().insert(name.to_string(), value);
            }
            fn set_iterations(&mut self, n: u64) {
                self.base.set_calls(n);
            }
            fn finalize(&mut self, params: &[(String, Var)]) -> Result<()> {
                self.base.finalize(params)
            }
            fn gradient_accumulation_steps(&self) -> Option<u64> {
                self.base.accumulate
            }
            fn global_clipnorm(&self) -> Option<f32> {
                self.base.clip_global_norm
            }
            fn clip_norm(&self) -> Option<f32> {
                self.base.clip_norm
            }
            fn set_global_clipnorm(&mut self, max_norm: Option<f32>) {
                self.base.clip_global_norm = max_norm;
            }
            fn validate(&self) -> Result<()> {
                self.base.validate()?;
                self.check()
            }
            fn fork(&self) -> Option<Box<dyn Optimizer>> {
                Some(Box::new(self.clone()))
            }
            fn gradient_checks(&self) -> Vec<(String, Tensor)> {
                self.base.checks.clone().unwrap_or_default()
            }
        }
    };
}

/// Stochastic gradient descent, with optional (Nesterov) momentum.
#[derive(Clone)]
pub struct Sgd {
    base: Base,
    momentum: f32,
    nesterov: bool,
}

impl Sgd {
    /// Plain SGD at `lr` (a number or a schedule).
    pub fn new(lr: impl Into<LearningRate>) -> Self {
        Sgd { base: Base::new(lr.into()), momentum: 0.0, nesterov: false }
    }
    /// Momentum: `v = momentum * v - lr * g; w += v`.
    pub fn momentum(mut self, m: f32) -> Self {
        self.momentum = m;
        self
    }
    /// Nesterov momentum: `w += momentum * v - lr * g`.
    pub fn nesterov(mut self, on: bool) -> Self {
        self.nesterov = on;
        self
    }
    fn hyper(&self) -> (f32, bool) {
        (self.momentum, self.nesterov)
    }
    fn check(&self) -> Result<()> {
        check_range("momentum", self.momentum, 0.0, 1.0, false)
    }
    fn rule(hp: &(f32, bool), b: &mut Base, path: &str, w: &Tensor, g: &Tensor, lr: f32) -> Result<Tensor> {
        let (momentum, nesterov) = *hp;
        if momentum == 0.0 {
            return w.sub(&g.mul_scalar(lr)?);
        }
        let v = b.slot(path, "momentum", w)?.mul_scalar(momentum)?.sub(&g.mul_scalar(lr)?)?;
        b.set_slot(path, "momentum", v.clone());
        if nesterov { w.add(&v.mul_scalar(momentum)?)?.sub(&g.mul_scalar(lr)?) } else { w.add(&v) }
    }
}
optimizer_common!(Sgd);
optimizer_trait!(Sgd);
pub(super) use {optimizer_common, optimizer_trait};

impl Default for Sgd {
    /// Keras' default learning rate, 0.01.
    fn default() -> Self {
        Sgd::new(0.01)
    }
}

/// Adam (Kingma & Ba), with Keras' defaults: beta1 0.9, beta2 0.999, epsilon 1e-7.
#[derive(Clone)]
pub struct Adam {
    base: Base,
    beta1: f32,
    beta2: f32,
    epsilon: f32,
    amsgrad: bool,
}

impl Default for Adam {
    /// Keras' default learning rate, 0.001.
    fn default() -> Self {
        Adam::new(1e-3)
    }
}

impl Adam {
    /// Adam at `lr` (a number or a schedule).
    pub fn new(lr: impl Into<LearningRate>) -> Self {
        // Adam's fused update decays the weights in its pass (AdamW).
        let base = Base { folds_decay: true, ..Base::new(lr.into()) };
        Adam { base, beta1: 0.9, beta2: 0.999, epsilon: 1e-7, amsgrad: false }
    }
    /// AMSGrad: divide by the largest second moment seen so far (slot `vhat`), not the
    /// current one.
    pub fn amsgrad(mut self, on: bool) -> Self {
        self.amsgrad = on;
        self
    }
    /// Set beta1, beta2 and epsilon.
    pub fn betas(mut self, beta1: f32, beta2: f32, epsilon: f32) -> Self {
        (self.beta1, self.beta2, self.epsilon) = (beta1, beta2, epsilon);
        self
    }
    fn hyper(&self) -> (f32, f32, f32, bool) {
        (self.beta1, self.beta2, self.epsilon, self.amsgrad)
    }
    fn check(&self) -> Result<()> {
        check_range("beta_1", self.beta1, 0.0, 1.0, true)?;
        check_range("beta_2", self.beta2, 0.0, 1.0, true)?;
        check_range("epsilon", self.epsilon, 0.0, f32::MAX, false)
    }
    /// Whether a step may hand this optimizer its gradients as products (see
    /// [`Optimizer::fuses_products`]): only without AMSGrad, whose update is not one fused pass.
    fn fuses(&self) -> bool {
        !self.amsgrad && self.base.uses_as_given()
    }
    fn rule(hp: &(f32, f32, f32, bool), b: &mut Base, path: &str, w: &Tensor, g: Grad<'_>, lr: f32) -> Result<Tensor> {
        let (b1, b2, eps, amsgrad) = *hp;
        // Bias correction folded into the step size, as Keras does.
        let t = (b.iterations + 1).min(i32::MAX as u64) as i32;
        let lr_t = lr * (1.0 - b2.powi(t)).sqrt() / (1.0 - b1.powi(t));
        let (m, v) = (b.slot(path, "m", w)?, b.slot(path, "v", w)?);
        // AdamW's decay (see `Base::folds_decay`), 1 without.
        let decay = b.decay;
        if amsgrad {
            let g = &g.tensor()?;
            let w = &if decay != 1.0 { w.mul_scalar(decay)? } else { w.clone() };
            let m = m.add(&g.sub(&m)?.mul_scalar(1.0 - b1)?)?;
            let v = v.add(&g.square()?.sub(&v)?.mul_scalar(1.0 - b2)?)?;
            let vhat = b.slot(path, "vhat", w)?.maximum(&v)?;
            let w = w.sub(&m.mul_scalar(lr_t)?.div(&vhat.sqrt()?.add_scalar(eps)?)?)?;
            b.set_slot(path, "m", m);
            b.set_slot(path, "v", v);
            b.set_slot(path, "vhat", vhat);
            return Ok(w);
        }
        // One fused pass: m' = m + (g - m)(1 - b1), v' = v + (g² - v)(1 - b2), w' = w - lr_t m' / (sqrt(v') + eps).
        let step = AdamStep { lr_t, beta1: b1, beta2: b2, eps, decay };
        // Written in place at the step's end where it may be (the slots made above).
        if b.defer(path, w, g, [&m, &v], step) {
            return Ok(w.clone());
        }
        // A gradient left as a product (a dense layer's x^T @ dy) is summed inside the same pass.
        let (w, m, v, check) = match g {
            Grad::Tensor(g) => w.adam_step_checked(g, &m, &v, step)?,
            Grad::Product(lhs, rhs) => w.adam_step_of_product(lhs, rhs, &m, &v, step)?,
        };
        b.note_check(path, check);
        b.set_slot(path, "m", m);
        b.set_slot(path, "v", v);
        Ok(w)
    }
}
optimizer_common!(Adam);
optimizer_trait!(Adam, fuses);

/// AdamW: Adam with decoupled weight decay (Keras' default decay 0.004).
pub struct AdamW;

impl AdamW {
    /// An Adam with weight decay 0.004 at `lr`; change it with `.weight_decay(..)`.
    #[allow(clippy::new_ret_no_self)]
    pub fn new(lr: impl Into<LearningRate>) -> Adam {
        Adam::new(lr).weight_decay(0.004)
    }
}

/// RMSprop with Keras' defaults: rho 0.9, epsilon 1e-7.
#[derive(Clone)]
pub struct RMSprop {
    base: Base,
    rho: f32,
    epsilon: f32,
    momentum: f32,
    centered: bool,
}

impl Default for RMSprop {
    /// Keras' default learning rate, 0.001.
    fn default() -> Self {
        RMSprop::new(1e-3)
    }
}

impl RMSprop {
    /// RMSprop at `lr` (a number or a schedule).
    pub fn new(lr: impl Into<LearningRate>) -> Self {
        RMSprop { base: Base::new(lr.into()), rho: 0.9, epsilon: 1e-7, momentum: 0.0, centered: false }
    }
    /// Set rho (the decay of the squared-gradient average) and epsilon.
    pub fn rho(mut self, rho: f32, epsilon: f32) -> Self {
        (self.rho, self.epsilon) = (rho, epsilon);
        self
    }
    /// Momentum on the update: `u = momentum * u + step; w -= u` (slot `momentum`).
    pub fn momentum(mut self, m: f32) -> Self {
        self.momentum = m;
        self
    }
    /// Centered: divide by the estimated variance of the gradient (its squared average minus
    /// its average squared, slot `average_gradient`) rather than its squared average.
    pub fn centered(mut self, on: bool) -> Self {
        self.centered = on;
        self
    }
    fn hyper(&self) -> (f32, f32, f32, bool) {
        (self.rho, self.epsilon, self.momentum, self.centered)
    }
    fn check(&self) -> Result<()> {
        check_range("rho", self.rho, 0.0, 1.0, true)?;
        check_range("epsilon", self.epsilon, 0.0, f32::MAX, false)?;
        check_range("momentum", self.momentum, 0.0, 1.0, false)
    }
    fn rule(hp: &(f32, f32, f32, bool), b: &mut Base, path: &str, w: &Tensor, g: &Tensor, lr: f32) -> Result<Tensor> {
        let (rho, eps, momentum, centered) = *hp;
        let v = b.slot(path, "velocity", w)?.mul_scalar(rho)?.add(&g.square()?.mul_scalar(1.0 - rho)?)?;
        // Keras puts epsilon inside the square root: g / sqrt(v + eps).
        let mut denominator = v.add_scalar(eps)?;
        if centered {
            let avg = b.slot(path, "average_gradient", w)?.mul_scalar(rho)?.add(&g.mul_scalar(1.0 - rho)?)?;
            denominator = denominator.sub(&avg.square()?)?;
            b.set_slot(path, "average_gradient", avg);
        }
        let update = g.div(&denominator.sqrt()?)?.mul_scalar(lr)?;
        b.set_slot(path, "velocity", v);
        if momentum > 0.0 {
            let u = b.slot(path, "momentum", w)?.mul_scalar(momentum)?.add(&update)?;
            b.set_slot(path, "momentum", u.clone());
            return w.sub(&u);
        }
        w.sub(&update)
    }
}
optimizer_common!(RMSprop);
optimizer_trait!(RMSprop);

/// A boxed optimizer is an optimizer: one chosen at run time (from a list, a config file)
/// compiles like any other.
///
/// ```
/// use weft_nn::optim::{Adam, Optimizer, Sgd};
/// let pick = |adam: bool| -> Box<dyn Optimizer> { if adam { Box::new(Adam::new(1e-3)) } else { Box::new(Sgd::new(0.1)) } };
/// let mut m = weft_nn::Model::new(weft_nn::Sequential::new().add(weft_nn::layers::Dense::new(1)), &weft_core::Device::Cpu);
/// m.compile(pick(true), weft_nn::Loss::MeanSquaredError, &[])?;
/// # Ok::<(), weft_core::Error>(())
/// ```
impl Optimizer for Box<dyn Optimizer> {
    fn apply(&mut self, params: &[(String, Var)], grads: &GradStore) -> Result<()> {
        (**self).apply(params, grads)
    }
    fn iterations(&self) -> u64 {
        (**self).iterations()
    }
    fn learning_rate(&self) -> f32 {
        (**self).learning_rate()
    }
    fn set_learning_rate(&mut self, lr: f32) -> Result<()> {
        (**self).set_learning_rate(lr)
    }
    fn slot(&self, path: &str, name: &str) -> Option<Tensor> {
        (**self).slot(path, name)
    }
    fn slots(&self) -> Vec<(String, String, Tensor)> {
        (**self).slots()
    }
    fn set_slot(&mut self, path: &str, name: &str, value: Tensor) {
        (**self).set_slot(path, name, value)
    }
    fn set_iterations(&mut self, n: u64) {
        (**self).set_iterations(n)
    }
    fn global_clipnorm(&self) -> Option<f32> {
        (**self).global_clipnorm()
    }
    fn set_global_clipnorm(&mut self, max_norm: Option<f32>) {
        (**self).set_global_clipnorm(max_norm)
    }
    fn validate(&self) -> Result<()> {
        (**self).validate()
    }
    fn clip_norm(&self) -> Option<f32> {
        (**self).clip_norm()
    }
    fn last_step_skipped(&self) -> bool {
        (**self).last_step_skipped()
    }
    fn finalize(&mut self, params: &[(String, Var)]) -> Result<()> {
        (**self).finalize(params)
    }
    fn gradient_accumulation_steps(&self) -> Option<u64> {
        (**self).gradient_accumulation_steps()
    }
    fn fork(&self) -> Option<Box<dyn Optimizer>> {
        (**self).fork()
    }
    fn gradient_checks(&self) -> Vec<(String, Tensor)> {
        (**self).gradient_checks()
    }
    fn fuses_products(&self) -> bool {
        (**self).fuses_products()
    }
}
