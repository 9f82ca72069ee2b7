//! A model traced on the Meta device (no data is allocated): its op graph and its layers, for the
//! planner and for checking a plan against the model.

use super::PlanInput;
use super::graph::{Graph, LayerNode};
use std::collections::{HashMap, HashSet};
use weft_core::{Device, Result, TensorId, no_grad, trace};
use weft_nn::{Ctx, Inputs, Layer, LayerInfo};

/// The traced graph and every layer (containers included), parents before their sublayers.
pub struct Traced {
    /// The model's root name.
    pub root: String,
    /// The ops of one training-mode forward pass.
    pub graph: Graph,
    /// Every layer.
    pub layers: Vec<LayerNode>,
}

impl Traced {
    /// Trace `net` (fresh: unbuilt) on named inputs.
    pub fn with_inputs(net: &dyn Layer, specs: &[PlanInput]) -> Result<Self> {
        let mut x = Inputs::new();
        for s in specs {
            x = x.with(&s.name, s.zeros(&Device::Meta)?);
        }
        let xs = x.ordered(&net.input_names())?;
        let mut ctx = Ctx::training(0);
        let (y, nodes) = no_grad(|| {
            trace::trace(|| {
                let _s = weft_nn::scope::root(net);
                net.call_outputs(&xs, &[], &mut ctx)
            })
        })?;
        let root = net.name().to_string();
        let vars: HashMap<String, TensorId> =
            net.variables().into_iter().map(|(p, v)| (join(&root, &p), v.id())).collect();
        let mut layers = Vec::new();
        walk(&net.describe(), "", &vars, &mut layers);
        let var_ids: HashSet<TensorId> = vars.values().copied().collect();
        let inputs = xs.iter().map(|t| (t.id(), t.dims().to_vec())).collect();
        Ok(Traced { root, graph: Graph::new(nodes, inputs, y.iter().map(|t| t.id()).collect(), var_ids), layers })
    }

    /// The layer at `path`.
    pub fn layer(&self, path: &str) -> Option<&LayerNode> {
        self.layers.iter().find(|l| l.path == path)
    }

    /// The embedding (a layer that declares a vocabulary split) whose table the tied projection
    /// at `path` reads.
    pub fn tied_table(&self, path: &str) -> Option<&LayerNode> {
        tied_table(&self.layers, &self.graph, path)
    }
}

/// `a/b`, or `b` alone at the root.
pub fn join(a: &str, b: &str) -> String {
    if a.is_empty() { b.to_string() } else { format!("{a}/{b}") }
}

fn walk(info: &LayerInfo, prefix: &str, vars: &HashMap<String, TensorId>, out: &mut Vec<LayerNode>) {
    let path = join(prefix, &info.name);
    let own = info
        .variables
        .iter()
        .map(|(rel, shape)| {
            let full = join(&path, rel);
            let id = vars.get(&full).copied();
            (full, shape.clone(), id)
        })
        .collect();
    out.push(LayerNode {
        path: path.clone(),
        kind: info.kind.clone(),
        vars: own,
        container: !info.sublayers.is_empty(),
        split: info.split.clone(),
    });
    for s in &info.sublayers {
        walk(s, &path, vars, out);
    }
}

/// The layer declaring a vocabulary split whose table the ops of the layer at `path` read.
pub fn tied_table<'a>(layers: &'a [LayerNode], graph: &Graph, path: &str) -> Option<&'a LayerNode> {
    let region = graph.region(path);
    layers.iter().find(|e| {
        let weft_nn::SplitRule::Vocab { table } = &e.split else { return false };
        e.var(table).and_then(|v| v.2).is_some_and(|id| region.iter().any(|&i| graph.nodes[i].inputs.contains(&id)))
    })
}
