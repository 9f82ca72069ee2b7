//! The plan's figures: bytes per device (weights, gradients, optimizer state, activations) and
//! the collectives of one training step.

use super::graph::{Graph, LayerNode};
use super::{CollectiveCost, DeviceMemory, ShardingPlan};
use std::collections::HashMap;
use weft_nn::SplitRule;
use weft_nn::tp::{Placement, Style};

fn numel(s: &[usize]) -> u64 {
    s.iter().product::<usize>() as u64
}

/// Ops that make a view of their input rather than a new buffer.
fn is_view(kind: &str) -> bool {
    matches!(kind, "reshape" | "permute" | "broadcast" | "narrow")
}

pub(super) fn estimate(plan: &mut ShardingPlan, graph: &Graph, layers: &[LayerNode]) {
    let (n, data) = (plan.model_axis, plan.data_axis);
    // Scopes whose activations are split, with their sizes: column layers (before any gather),
    // split dropouts, and attention whose projections are split by heads.
    let mut split_scopes: HashMap<String, Vec<usize>> = HashMap::new();
    for l in &plan.layers {
        match &l.style {
            Style::Column { sizes, gather: false } | Style::Split { sizes, .. } => {
                split_scopes.insert(l.path.clone(), sizes.clone());
            }
            Style::Column { gather: true, .. } | Style::Row { .. } | Style::Vocab { .. } | Style::Replicated => {}
        }
    }
    for att in layers {
        if let SplitRule::Heads(h) = &att.split
            && let Some(first) = h.projections.first()
            && let Some(Style::Column { sizes, gather: false }) =
                plan.layer(&format!("{}/{first}", att.path)).map(|l| &l.style)
        {
            split_scopes.insert(att.path.clone(), sizes.clone());
        }
    }
    let input_bytes: u64 = graph.inputs.iter().map(|(_, s)| 4 * numel(s)).sum();
    plan.memory = (0..n)
        .map(|r| {
            let params: u64 = plan
                .layers
                .iter()
                .flat_map(|l| &l.variables)
                .map(|v| 4 * numel(&v.placement.local_shape(&v.shape, r)))
                .sum();
            let mut act = input_bytes;
            for node in graph.nodes.iter().filter(|nd| graph.is_data(nd.id) && !is_view(&nd.kind)) {
                let full = 4 * numel(&node.shape);
                act += match split_scopes.get(&node.scope) {
                    Some(sizes) => full * sizes[r] as u64 / sizes.iter().sum::<usize>().max(1) as u64,
                    None => full,
                };
            }
            DeviceMemory {
                rank: r,
                params,
                grads: params,
                optimizer: plan.optimizer_slots as u64 * params,
                activations: act / data as u64,
            }
        })
        .collect();

    let mut cs = Vec::new();
    let shape_of = |id: Option<weft_core::TensorId>| -> Vec<usize> {
        match id {
            Some(i) => graph.shape(i).map(<[usize]>::to_vec).unwrap_or_default(),
            None => Vec::new(),
        }
    };
    let mut add = |op: &str, axis: &str, pass: &str, at: &str, shape: Vec<usize>, div: usize| {
        let bytes = 4 * numel(&shape) / div.max(1) as u64;
        cs.push(CollectiveCost { op: op.into(), axis: axis.into(), pass: pass.into(), at: at.into(), shape, bytes });
    };
    if n > 1 {
        // Column layers that take the very same tensor share one f (see weft_nn::tp::linear):
        // its all-reduce is counted once, at the first of them.
        let mut f_at: HashMap<weft_core::TensorId, Vec<&str>> = HashMap::new();
        for l in &plan.layers {
            if let (Style::Column { .. }, Some(i)) = (&l.style, graph.layer_input(&l.path)) {
                f_at.entry(i).or_default().push(&l.path);
            }
        }
        for l in &plan.layers {
            let input = graph.layer_input(&l.path);
            let has_grad = input.is_some_and(|i| !graph.is_input(i) && graph.is_data(i));
            let out = shape_of(graph.layer_output(&l.path));
            match &l.style {
                Style::Column { gather, .. } => {
                    let sharing = input.and_then(|i| f_at.get(&i)).map_or(&[][..], |v| v.as_slice());
                    if has_grad && sharing.first().is_none_or(|first| *first == l.path) {
                        let at = match sharing {
                            [_, rest @ ..] if !rest.is_empty() => {
                                format!("{} (shares one f with {})", l.path, rest.join(", "))
                            }
                            _ => l.path.clone(),
                        };
                        add("all_reduce", "model", "backward", &at, shape_of(input), data);
                    }
                    if *gather {
                        add("all_gather", "model", "forward", &l.path, out, data);
                    }
                }
                Style::Row { scatter, .. } => {
                    add("all_reduce", "model", "forward", &l.path, out, data);
                    if *scatter && has_grad {
                        add("all_gather", "model", "backward", &l.path, shape_of(input), data);
                    }
                }
                Style::Vocab { .. } => add("all_reduce", "model", "forward", &l.path, out, data),
                Style::Replicated | Style::Split { .. } => {}
            }
        }
        if let Some(sizes) = &plan.output {
            let out = shape_of(graph.outputs.first().copied());
            let vocab = plan.loss.as_ref().is_none_or(|l| *l == format!("{:?}", super::vocab_loss()));
            if vocab {
                // Without a loss the plan cannot know: these run only under the vocabulary-parallel loss.
                let when = if plan.loss.is_none() { ", if sparse cross-entropy from logits" } else { "" };
                let rows: Vec<usize> = out[..out.len().saturating_sub(1)].to_vec();
                let mut maxes = rows.clone();
                maxes.push(sizes.len());
                add("all_gather", "model", "forward", &format!("loss (row maxima){when}"), maxes, data);
                add("all_reduce", "model", "forward", &format!("loss (partition function){when}"), rows.clone(), data);
                add("all_reduce", "model", "forward", &format!("loss (label logits){when}"), rows, data);
            } else {
                add("all_gather", "model", "forward", "loss (the output gathered whole)", out, data);
            }
        }
        let replicated: usize = plan
            .layers
            .iter()
            .flat_map(|l| &l.variables)
            .filter(|v| v.placement == Placement::Replicate)
            .map(|v| numel(&v.shape) as usize)
            .sum();
        if replicated > 0 {
            add("all_reduce", "model", "optimizer", "replicated gradients (mean, against drift)", vec![replicated], 1);
        }
        // One all-reduce of (split squares, replicated squares / N): see coordinated.rs.
        add("all_reduce", "model", "optimizer", "squared gradient norm (split, replicated / N)", vec![2], 1);
    }
    if data > 1 {
        let local: u64 = plan.memory.first().map_or(0, |m| m.params / 4);
        add("all_reduce", "data", "optimizer", "every gradient (sum of the batch parts)", vec![local as usize], 1);
    }
    plan.collectives = cs;
}
