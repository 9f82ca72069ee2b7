//! One training step: forward, loss, backward, update, and the check that makes a failed step
//! change nothing.
//!
//! The step reads back its losses and up to two figures per gradient, and refuses a step whose
//! loss or gradient is not finite. When the optimizer can [`fork`](Optimizer::fork) (every
//! built-in one can) and the model is on one GPU, the update is applied *before* that read:
//! the device runs forward, backward and update as one stream of work, with no wait in between,
//! and a step that then turns out to fail is undone on the host by putting back the variables'
//! tensors and the optimizer as they were (keeping them holds their buffers, so the update
//! writes new ones: no copy is made). Otherwise (on the Cpu, where reading first costs no wait;
//! a user's optimizer without `fork`; a model split over devices, whose coordinated optimizer
//! skips bad steps itself) the figures are checked first, and the optimizer may write its update
//! over the weights' own buffers (Adam does: `Var::adam_step_in_place`). On the Cpu a dense
//! layer's weight gradient left as a product is checked by a bound, not worked out
//! (`GradStore::product_surely_finite`).

use super::Model;
use crate::optim::Optimizer;
use crate::outputs::Heads;
use crate::{Inputs, sample_weights};
use weft_core::{Error, GradStore, ReduceKind, Result, Tensor, Var, no_grad};

/// What a step hands back: the loss and, on a model of several outputs, each output's loss.
type Figures = (f32, Vec<f32>);

impl Model {
    /// Forward, loss, backward and update; returns the loss and, on a model of several outputs,
    /// each output's loss. An `Err` for the batch (a loss or gradient not finite, a bad label, a
    /// refused update) leaves every weight, slot and counter as it was: on a GPU by undoing the
    /// step, on the Cpu by checking before the update. (On the Cpu an update that then fails,
    /// out of memory, may leave it part applied.)
    pub(super) fn step(&mut self, x: &Inputs, y: &Inputs, counts: &mut [Vec<f64>]) -> Result<Figures> {
        self.ctx.training = true;
        self.ctx.step += 1;
        self.loss_not_finite = false;
        let out = self.step_inner(x, y, counts);
        if out.is_err() {
            // A step that failed did not happen: the next one draws the same dropout masks (on a
            // sharded model, every rank's counter stays equal however far each got).
            self.ctx.step -= 1;
        }
        out
    }

    fn step_inner(&mut self, x: &Inputs, y: &Inputs, counts: &mut [Vec<f64>]) -> Result<Figures> {
        let heads = self.parts()?.1;
        let (x, y, part) = self.data_part(x, y)?;
        let (y, weights) = sample_weights::take(&y);
        let labels = heads.labels("fit", &y)?;
        let mut ctx = std::mem::replace(&mut self.ctx, crate::Ctx::inference());
        let preds = self.forward(&x, &mut ctx);
        // State updates (moving statistics) wait for the step to be applied.
        let updates = std::mem::take(&mut ctx.updates);
        let added = std::mem::take(&mut ctx.losses);
        self.ctx = ctx;
        let preds = preds?;
        let sync = self.tp.as_ref().is_some_and(|tp| tp.data.world_size() > 1);
        let (loss, per) = self.head_losses(&heads, &preds, &labels, weights.as_ref(), (part, sync))?;
        let loss = self.with_penalties(loss, added, part)?;
        // Every variable (kept for an undo below) and, of them, what the optimizer trains.
        let all = self.variables();
        let vars: Vec<(String, Var)> = all.iter().filter(|(_, v)| v.is_trainable()).cloned().collect();
        // On one Cpu, an optimizer that works dense layers' weight gradients out inside its own
        // update (Adam) gets them as products: never stored (see `Optimizer::fuses_products`).
        let fuse = self.tp.is_none() && !loss.device().is_gpu() && self.parts()?.0.fuses_products();
        let grads = if fuse {
            loss.backward_deferring(&vars.iter().map(|(_, v)| v.as_tensor()).collect::<Vec<_>>())?
        } else {
            loss.backward()?
        };
        let mut figs = vec![loss.detach().reshape(&[1])?];
        if per.len() > 1 {
            for l in &per {
                figs.push(l.detach().reshape(&[1])?);
            }
        }
        let mut losses = if figs.len() == 1 { figs[0].clone() } else { Tensor::concat(&figs, 0)? };
        if let Some(tp) = self.tp.as_ref().filter(|tp| tp.data.world_size() > 1) {
            losses = tp.data.all_reduce(&losses, ReduceKind::Sum)?;
        }
        // A finite loss can still have a NaN or infinite gradient (sqrt or a division at 0): on
        // one device it is refused rather than written into every weight (a sharded model's
        // coordinated optimizer skips such a step on every rank instead). The losses and each
        // gradient's figures (see `gradient_figures`) come back in one read.
        let one_device = self.tp.is_none();
        let checked = |done| if one_device { gradient_figures(&vars, &grads, done) } else { Ok(Vec::new()) };
        let k = figs.len();
        let wanted = !counts.is_empty();
        let metrics = |m: &Model| m.count_metrics(&heads, &preds, &labels, wanted);
        // On the Cpu, reading the figures first costs no wait, and lets the optimizer write its
        // update over the weights' own buffers (nothing kept to undo it holds them).
        let on_gpu = loss.device().is_gpu() || vars.iter().any(|(_, v)| v.device().is_gpu());
        let forked = if self.tp.is_none() && on_gpu { self.parts()?.0.fork() } else { None };
        let Some(optimizer_before) = forked else {
            // Everything that can fail runs before the update: the figures are read and checked
            // (which also reports a bad label or id found on a GPU), and the metrics counted.
            let read = Read::new(losses, k, checked(Vec::new())?)?;
            let figures = self.read_figures(&read, &grads)?;
            let batch = metrics(self)?;
            // The step's graph goes before the update: views of the weights in it would hold
            // their buffers (and make the update copy them).
            drop((read, preds, loss, per));
            self.update(&vars, &grads, updates)?;
            add_counts(counts, batch);
            return Ok(figures);
        };
        // Applied first, checked after; undone on the host if anything fails.
        let kept: Vec<(Var, Tensor)> = all
            .into_iter()
            .map(|(_, v)| v)
            .chain(updates.iter().map(|(v, _)| v.clone()))
            .map(|v| {
                let t = v.as_tensor().snapshot();
                (v, t)
            })
            .collect();
        let out = self.update(&vars, &grads, updates).and_then(|()| {
            // The optimizer's own pass may have checked gradients already (Adam):
            // those are not read a second time.
            let done = self.parts()?.0.gradient_checks();
            let read = Read::new(losses, k, checked(done)?)?;
            Ok((self.read_figures(&read, &grads)?, metrics(self)?))
        });
        match out {
            Ok((figures, batch)) => {
                add_counts(counts, batch);
                Ok(figures)
            }
            Err(e) => {
                // Everything is put back even if one variable refuses (it cannot: same shape,
                // dtype and device), and the step's own error is the one reported.
                self.optimizer = Some(optimizer_before);
                let refused: Vec<String> =
                    kept.iter().filter_map(|(v, t)| v.set(t).err()).map(|u| u.to_string()).collect();
                if refused.is_empty() {
                    Err(e)
                } else {
                    Err(Error::invalid("fit", format!("{e}; undoing the step failed too: {}", refused.join("; "))))
                }
            }
        }
    }

    /// Read the step's figures back (one read) and check them: `Err` naming the loss or the
    /// variable whose gradient is not finite.
    fn read_figures(&mut self, read: &Read, grads: &GradStore) -> Result<Figures> {
        let figures = read.figures.to_vec::<f32>()?;
        let k = read.losses;
        let not_applied = "the step was not applied (weights, optimizer state and counters are unchanged)";
        if let Some(v) = figures[..k].iter().find(|v| !v.is_finite()) {
            self.loss_not_finite = true;
            return Err(Error::invalid("fit", format!("the loss of this batch is {v}; {not_applied}")));
        }
        let mut at = k;
        for c in &read.checked {
            let n = c.figures.len();
            let mine = &figures[at..at + n];
            at += n;
            if mine.iter().all(|v| v.is_finite()) {
                continue;
            }
            // A one-value figure (a check, or the Cpu's infinity for a gradient it could not
            // tell finite) does not say which value: the largest and smallest do (any NaN shows
            // in both, +inf in the first, -inf in the second).
            let ends = if c.one_value() {
                // (A gradient left as a product is worked out now: its bound could not tell.)
                let g = grads.resolve(c.var.as_tensor())?.unwrap_or_else(|| c.var.as_tensor().clone());
                Tensor::concat(&gradient_ends(&g)?, 0)?.to_vec::<f32>()?
            } else {
                mine.to_vec()
            };
            if let Some(v) = ends.into_iter().find(|v| !v.is_finite()) {
                return Err(Error::invalid("fit", format!("the gradient of {} holds {v}; {not_applied}", c.path)));
            }
        }
        Ok((figures[0], figures[1..k].to_vec()))
    }

    /// Each metric's count on this batch (nothing when `wanted` is false).
    fn count_metrics(&self, heads: &Heads, preds: &[Tensor], labels: &[Tensor], wanted: bool) -> Result<Vec<Vec<f64>>> {
        let mut batch = Vec::new();
        if !wanted {
            return Ok(batch);
        }
        for ((at, o), y) in heads.list.iter().zip(labels) {
            // Metrics need the whole output; without metrics a split output is never gathered.
            let pred = no_grad(|| self.whole(&preds[*at]))?;
            for m in &o.metrics {
                batch.push(self.sum_over_data(m.update(&pred, y, o.loss.base().1)?)?);
            }
        }
        Ok(batch)
    }

    /// The optimizer's update, the layers' constraints and state updates (moving statistics).
    fn update(&mut self, vars: &[(String, Var)], grads: &GradStore, updates: Vec<(Var, Tensor)>) -> Result<()> {
        crate::ctx::check_updates(&updates)?;
        crate::penalty::in_model::check_constraints(self.net.as_ref())?;
        let optimizer = self.parts()?.0;
        optimizer.apply(vars, grads)?;
        if !optimizer.last_step_skipped() {
            crate::penalty::in_model::apply_constraints(self.net.as_ref(), self.tp.as_ref())?;
            self.ctx.updates = updates;
            self.ctx.commit_updates()?;
        }
        Ok(())
    }
}

fn add_counts(counts: &mut [Vec<f64>], batch: Vec<Vec<f64>>) {
    for (c, b) in counts.iter_mut().zip(batch) {
        c.iter_mut().zip(b).for_each(|(c, b)| *c += b);
    }
}

/// The step's figures on the device, not yet read: the losses first (`losses` of them), then
/// each checked gradient's.
struct Read<'a> {
    figures: Tensor,
    losses: usize,
    checked: Vec<GradientCheck<'a>>,
}

impl<'a> Read<'a> {
    /// The losses (`[k]`) and the checks' figures, joined for one read.
    fn new(losses: Tensor, k: usize, checked: Vec<GradientCheck<'a>>) -> Result<Self> {
        let mut parts = vec![losses];
        parts.extend(checked.iter().flat_map(|c| c.figures.iter().cloned()));
        Ok(Read { figures: Tensor::concat(&parts, 0)?, losses: k, checked })
    }
}

/// What the step reads back to check one gradient for NaN and infinities.
struct GradientCheck<'a> {
    path: &'a str,
    var: &'a Var,
    /// One `[1]` figure that is finite when the whole gradient is: the optimizer's own check
    /// where it made one (0 or NaN; on a GPU found by bit tests). On the Cpu none where the
    /// host tells the gradient finite without an op (`GradStore::surely_finite`), else an
    /// infinity (unknown: the read then looks at the values). Else, on a GPU, whose shader
    /// arithmetic may assume there is no NaN or infinity, the largest and smallest value (two
    /// `[1]` tensors, found by the reductions' bit tests), which go into the step's one read as
    /// they are (no concat of their own).
    figures: Vec<Tensor>,
}

impl GradientCheck<'_> {
    /// Whether the figure is one value (a check, or the Cpu's infinity) rather than the
    /// gradient's ends.
    fn one_value(&self) -> bool {
        self.figures.len() == 1
    }
}

/// Each gradient's check: the optimizer's (`done`, by path) where it made one, else its figures
/// worked out here.
fn gradient_figures<'a>(
    vars: &'a [(String, Var)],
    grads: &GradStore,
    done: Vec<(String, Tensor)>,
) -> Result<Vec<GradientCheck<'a>>> {
    let mut done: std::collections::HashMap<String, Tensor> = done.into_iter().collect();
    no_grad(|| {
        vars.iter()
            .filter(|(_, v)| grads.get(v).is_some() || grads.product(v).is_some())
            .map(|(p, v)| {
                let gpu = v.as_tensor().device().is_gpu();
                let figures = match done.remove(p.as_str()) {
                    Some(c) => vec![c],
                    // On the Cpu, told on the host with no op (a product by a bound, not worked
                    // out: `GradStore::surely_finite`): nothing to read. Where that cannot tell,
                    // an infinity has the read below look at the gradient's values.
                    _ if !gpu && grads.surely_finite(v)? => Vec::new(),
                    _ if !gpu => vec![Tensor::full(f32::INFINITY, &[1], v.device())?],
                    // (On a GPU, where no gradient is left as a product; worked out all the same.)
                    _ => {
                        let Some(g) = grads.resolve(v)? else {
                            return Err(Error::invalid("fit", format!("the gradient of {p} went missing")));
                        };
                        gradient_ends(&g)?.into()
                    }
                };
                Ok(GradientCheck { path: p, var: v, figures })
            })
            .collect()
    })
}

/// The largest and the smallest value of a gradient, each a `[1]` tensor on its device.
fn gradient_ends(g: &Tensor) -> Result<[Tensor; 2]> {
    no_grad(|| {
        let axes: Vec<isize> = (0..g.rank() as isize).collect();
        Ok([g.max(&axes, false)?.reshape(&[1])?, g.min(&axes, false)?.reshape(&[1])?])
    })
}
