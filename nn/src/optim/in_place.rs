//! Adam's updates written over the variables' and moments' own buffers, at the end of the
//! optimizer's step (see [`Var::adam_step_in_place`] for when a buffer may be written).
//!
//! Why at the end: a step changes nothing unless it all succeeds (see `Base::step`). A rule that
//! may write in place only leaves its update here ([`Base::defer`]); the other rules then work
//! their new values out, and only once every one has, and the old state is dropped (so that the
//! moments' handles are held once), are these written ([`Base::write_deferred`]), after the
//! other variables are set. What is left to fail then is what an update out of place, taken
//! where a buffer turns out to be shared after all, can: running out of memory (which leaves
//! the step part applied, and says so in no other way than its `Err`).
//!
//! Why only some: a variable is written in place only where no gradient still to be read reads
//! any variable's buffers (a gradient `dy @ w^T` of another variable would read the new `w`),
//! and without EMA (whose first average is a snapshot of the weights) or gradient accumulation
//! (whose summed gradient the step has not checked). A training step on the Cpu checks every
//! gradient as given before the update (clipping may still turn a finite one near f32's largest
//! into NaN, as it did out of place); one that keeps copies to
//! undo the step (on a GPU) holds the buffers, which are then updated out of place as before.

use super::rules::{Base, Grad};
use rustc_hash::FxHashSet as HashSet;
use weft_core::optim_ops::{AdamGrad, AdamStep};
use weft_core::{DType, Device, Error, Result, Tensor, TensorId, Var};

/// An Adam update left for the step's end.
#[derive(Clone)]
pub(super) struct Deferred {
    path: String,
    var: Var,
    grad: Operands,
    step: AdamStep,
}

/// A deferred update's gradient, as the rule received it.
#[derive(Clone)]
enum Operands {
    Tensor(Tensor),
    Product(Tensor, Tensor),
}

/// The buffers of a step's variables, which no gradient of a deferred update may read.
pub(super) struct Buffers {
    ids: HashSet<usize>,
    /// Variables listed more than once (a tied weight under two paths): each listing's update
    /// is worked out from the old values, as the rules do, not written one over the other.
    twice: HashSet<TensorId>,
    /// Whether the optimizer's settings allow deferring at all.
    open: bool,
}

impl Buffers {
    /// The buffers of `params`, for a step of `base`'s settings.
    pub(super) fn of(params: &[(String, Var)], base: &Base) -> Self {
        let open = base.ema.is_none() && base.accumulate.is_none();
        let (mut ids, mut seen, mut twice) = (HashSet::default(), HashSet::default(), HashSet::default());
        if open {
            for (_, v) in params {
                ids.extend(v.buffer_ids().into_iter().filter(|&id| id != 0));
                if !seen.insert(v.id()) {
                    twice.insert(v.id());
                }
            }
        }
        Buffers { ids, twice, open }
    }

    /// `var`, where its update with gradient `g` may be left to be written in place.
    pub(super) fn may_defer(&self, var: &Var, g: Grad<'_>) -> Option<Var> {
        let reads = |t: &Tensor| t.buffer_ids().iter().any(|id| self.ids.contains(id));
        let may = self.open
            && matches!(var.device(), Device::Cpu)
            && !self.twice.contains(&var.id())
            && match g {
                Grad::Tensor(t) => !reads(t),
                Grad::Product(l, r) => !reads(l) && !reads(r),
            };
        may.then(|| var.clone())
    }
}

impl Deferred {
    /// The variable the update writes.
    pub(super) fn var(&self) -> &Var {
        &self.var
    }
}

impl Base {
    /// Leave Adam's update of the variable at `path` (weight `w`, moments `m` and `v`, already
    /// in the slots) for the step's end, where the step allows it for this variable and all
    /// three are what an update in place takes (f32 on the Cpu, of one shape, contiguous from
    /// their buffers' start), with a gradient of f32 on the Cpu that fits: anything else is the rule's own pass's to report now, before any
    /// variable changes. Whether it did.
    pub(super) fn defer(&mut self, path: &str, w: &Tensor, g: Grad<'_>, [m, v]: [&Tensor; 2], step: AdamStep) -> bool {
        let Some(var) = self.may_defer.take() else { return false };
        // (A rule that scaled the weights first, not folding decay into its pass, updates
        // values the variable does not hold: not deferred.)
        if w.id() != var.id() {
            return false;
        }
        let fits = |t: &Tensor| {
            t.dims() == w.dims()
                && t.dtype() == DType::F32
                && matches!(t.device(), Device::Cpu)
                && t.is_contiguous()
                && t.layout().offset() == 0
        };
        let here = |t: &Tensor| t.dtype() == DType::F32 && matches!(t.device(), Device::Cpu);
        let grad_fits = match g {
            Grad::Tensor(t) => t.dims() == w.dims() && here(t),
            Grad::Product(l, r) => l.dims()[0] == w.dims()[0] && r.dims()[1] == w.dims()[1] && here(l) && here(r),
        };
        if ![w, m, v].into_iter().all(fits) || !grad_fits {
            return false;
        }
        let grad = match g {
            Grad::Tensor(t) => Operands::Tensor(t.clone()),
            Grad::Product(l, r) => Operands::Product(l.clone(), r.clone()),
        };
        self.deferred.push(Deferred { path: path.to_string(), var, grad, step });
        true
    }

    /// Write the deferred updates: in place where the buffers allow, else out of place (new
    /// tensors set as a rule's would be). The slots stay in place whatever happens.
    pub(super) fn write_deferred(&mut self, deferred: Vec<Deferred>) -> Result<()> {
        if deferred.is_empty() {
            return Ok(());
        }
        for d in deferred {
            let Some(slots) = self.slots.get_mut(&d.path) else {
                return Err(Error::invalid("optimizer", format!("{}: its update lost its slots", d.path)));
            };
            let (Some(mut m), Some(mut v)) = (slots.remove("m"), slots.remove("v")) else {
                return Err(Error::invalid("optimizer", format!("{}: its update lost its moments", d.path)));
            };
            // The moments go back whatever ends the write, a panic too.
            let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| write(&d, &mut m, &mut v)));
            slots.insert("m".into(), m);
            slots.insert("v".into(), v);
            let out = out.unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            self.note_check(&d.path, out?);
        }
        Ok(())
    }
}

/// One deferred update: in place, or out of place where a buffer is shared after all (another
/// thread took a snapshot, say); the gradient's check.
fn write(d: &Deferred, m: &mut Tensor, v: &mut Tensor) -> Result<Option<Tensor>> {
    let var = &d.var;
    let grad = match &d.grad {
        Operands::Tensor(g) => AdamGrad::Tensor(g),
        Operands::Product(l, r) => AdamGrad::Product(l, r),
    };
    if let Some(check) = var.adam_step_in_place(grad, m, v, d.step)? {
        return Ok(Some(check));
    }
    let w = var.as_tensor();
    let (w, new_m, new_v, check) = match &d.grad {
        Operands::Tensor(g) => w.adam_step_checked(g, m, v, d.step)?,
        Operands::Product(l, r) => w.adam_step_of_product(l, r, m, v, d.step)?,
    };
    var.set(&w)?;
    (*m, *v) = (new_m, new_v);
    Ok(check)
}
