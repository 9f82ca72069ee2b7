//! What a model does with its layers' regularizers and constraints: the penalty added to each
//! batch's loss, and the projections after each applied step. On a sharded model a variable
//! split over the model axis is penalised and projected as the whole variable would be.

use crate::layer::join;
use crate::tp::{Placement, TpCtx};
use crate::{Layer, Regularizer};
use std::collections::HashMap;
use std::sync::Arc;
use weft_core::collectives::reduce_from_parallel;
use weft_core::{Error, ReduceKind, Result, Tensor, Var, no_grad};

/// The split axis of the variable at `path` (relative to `net`), on a sharded model.
fn split_axis(net: &dyn Layer, tp: Option<&Arc<TpCtx>>, path: &str) -> Option<usize> {
    let full = join(net.name(), path);
    let (layer, name) = full.rsplit_once('/')?;
    match tp?.layers.get(layer)?.vars.get(name)? {
        Placement::Shard { axis, .. } => Some(*axis),
        Placement::Replicate => None,
    }
}

/// The variables of `net` by relative path; an `Err` names a regularized or constrained path
/// that is not among them.
fn find<'a>(vars: &'a HashMap<String, Var>, path: &str, what: &'static str) -> Result<&'a Var> {
    vars.get(path).ok_or_else(|| Error::invalid(what, format!("{path}: no such variable (is the model built?)")))
}

/// The sum of every weight penalty of `net`: a split variable's parts are penalised on their
/// ranks and the penalties summed over the model axis (the gradient reaching each rank's part).
pub(crate) fn weight_penalty(net: &dyn Layer, tp: Option<&Arc<TpCtx>>) -> Result<Option<Tensor>> {
    let regs: Vec<(String, Regularizer)> = net.regularizers();
    if regs.is_empty() {
        return Ok(None);
    }
    let vars: HashMap<String, Var> = net.variables().into_iter().collect();
    let mut total: Option<Tensor> = None;
    for (path, r) in regs {
        let mut p = r.penalty(find(&vars, &path, "regularizer")?)?;
        if let (Some(_), Some(tp)) = (split_axis(net, tp, &path), tp) {
            p = reduce_from_parallel(&p, tp.model.clone())?;
        }
        total = Some(match total {
            Some(t) => t.add(&p)?,
            None => p,
        });
    }
    Ok(total)
}

/// Check every constraint of `net` against its variable (before a step is applied).
pub(crate) fn check_constraints(net: &dyn Layer) -> Result<()> {
    let cons = net.constraints();
    if cons.is_empty() {
        return Ok(());
    }
    let vars: HashMap<String, Var> = net.variables().into_iter().collect();
    for (path, c) in &cons {
        c.check(find(&vars, path, "constraint")?.dims())
            .map_err(|e| Error::invalid("constraint", format!("{path}: {e}")))?;
    }
    Ok(())
}

/// Project every constrained variable of `net` (after an applied step). The new values are all
/// computed before any is set, so an `Err` changes nothing.
pub(crate) fn apply_constraints(net: &dyn Layer, tp: Option<&Arc<TpCtx>>) -> Result<()> {
    let cons = net.constraints();
    if cons.is_empty() {
        return Ok(());
    }
    let vars: HashMap<String, Var> = net.variables().into_iter().collect();
    let mut staged = Vec::with_capacity(cons.len());
    no_grad(|| -> Result<()> {
        for (path, c) in &cons {
            let var = find(&vars, path, "constraint")?;
            // A norm over the split axis sums the parts' squares over the model axis.
            let split = split_axis(net, tp, path).filter(|a| c.axes().contains(a));
            let sum_parts = |t: Tensor| match (split, tp) {
                (Some(_), Some(tp)) => tp.model.all_reduce(&t, ReduceKind::Sum),
                _ => Ok(t),
            };
            let v = c
                .project(var.as_tensor(), &sum_parts)
                .map_err(|e| Error::invalid("constraint", format!("{path}: {e}")))?;
            staged.push((var.clone(), v));
        }
        Ok(())
    })?;
    for (var, v) in staged {
        var.set(&v)?;
    }
    Ok(())
}
