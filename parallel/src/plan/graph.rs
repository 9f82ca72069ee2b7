//! The traced graph of a model, read by layer: where each layer's ops are, what it takes and
//! gives, and where a split output can flow without being gathered.

use std::collections::{HashMap, HashSet};
use weft_core::TensorId;
use weft_core::trace::TraceNode;

/// A leaf layer (one with no sublayers) or a container, as the planner sees it.
#[derive(Debug, Clone)]
pub struct LayerNode {
    /// Full path.
    pub path: String,
    /// Kind, e.g. `Dense`.
    pub kind: String,
    /// Own variables: (full path, shape, tensor id when built).
    pub vars: Vec<(String, Vec<usize>, Option<TensorId>)>,
    /// Whether it has sublayers.
    pub container: bool,
    /// How it declares it may split.
    pub split: weft_nn::SplitRule,
}

impl LayerNode {
    /// Parameters of its own variables.
    pub fn params(&self) -> usize {
        self.vars.iter().map(|(_, s, _)| s.iter().product::<usize>()).sum()
    }
    /// The variable whose path ends with `/name` (`name` may have segments of its own).
    pub fn var(&self, name: &str) -> Option<&(String, Vec<usize>, Option<TensorId>)> {
        self.vars
            .iter()
            .find(|(p, _, _)| p.strip_suffix(name).is_some_and(|rest| rest.is_empty() || rest.ends_with('/')))
    }
}

/// Where a split tensor goes.
#[derive(Debug, Clone, PartialEq)]
pub enum Flow {
    /// Into one or more layers (as each one's input), through shard-preserving ops only; in the
    /// order the walk met them.
    Into(Vec<String>),
    /// Out of the model, through shard-preserving ops only.
    Output,
    /// Into an op that needs it whole.
    Breaks(String),
}

/// The trace, indexed.
pub struct Graph {
    pub nodes: Vec<TraceNode>,
    consumers: HashMap<TensorId, Vec<usize>>,
    produced: HashMap<TensorId, usize>,
    data: HashSet<TensorId>,
    /// The model's inputs, with their shapes.
    pub inputs: Vec<(TensorId, Vec<usize>)>,
    /// The model's outputs (several for a functional model of several).
    pub outputs: Vec<TensorId>,
    var_ids: HashSet<TensorId>,
}

/// Whether an op recorded in `scope` ran inside the layer at `path`.
pub fn inside(scope: &str, path: &str) -> bool {
    scope == path || (scope.starts_with(path) && scope.as_bytes().get(path.len()) == Some(&b'/'))
}

impl Graph {
    pub fn new(
        nodes: Vec<TraceNode>,
        inputs: Vec<(TensorId, Vec<usize>)>,
        outputs: Vec<TensorId>,
        var_ids: HashSet<TensorId>,
    ) -> Self {
        let mut consumers: HashMap<TensorId, Vec<usize>> = HashMap::new();
        let mut produced = HashMap::new();
        let mut data: HashSet<TensorId> = inputs.iter().map(|(id, _)| *id).collect();
        for (i, n) in nodes.iter().enumerate() {
            for &id in &n.inputs {
                consumers.entry(id).or_default().push(i);
            }
            produced.insert(n.id, i);
            if n.inputs.iter().any(|id| data.contains(id) || var_ids.contains(id)) {
                data.insert(n.id);
            }
        }
        Graph { nodes, consumers, produced, data, inputs, outputs, var_ids }
    }

    /// Whether `id` is one of the model's inputs.
    pub fn is_input(&self, id: TensorId) -> bool {
        self.inputs.iter().any(|(i, _)| *i == id)
    }

    /// Indices of the nodes recorded inside the layer at `path`.
    pub fn region(&self, path: &str) -> Vec<usize> {
        (0..self.nodes.len()).filter(|&i| inside(&self.nodes[i].scope, path)).collect()
    }

    /// The data tensor a layer takes: the first input of its region made outside it from the
    /// model input or the weights.
    pub fn layer_input(&self, path: &str) -> Option<TensorId> {
        let region = self.region(path);
        let mine: HashSet<TensorId> = region.iter().map(|&i| self.nodes[i].id).collect();
        region.iter().flat_map(|&i| self.nodes[i].inputs.iter().copied()).find(|id| {
            !mine.contains(id) && !self.var_ids.contains(id) && (self.data.contains(id) || self.is_input(*id))
        })
    }

    /// The tensor a layer gives: the last one made in its region.
    pub fn layer_output(&self, path: &str) -> Option<TensorId> {
        self.region(path).last().map(|&i| self.nodes[i].id)
    }

    /// The shape of a tensor made by a node, or of a model input.
    pub fn shape(&self, id: TensorId) -> Option<&[usize]> {
        match self.produced.get(&id) {
            Some(&i) => Some(self.nodes[i].shape.as_slice()),
            None => self.inputs.iter().find(|(i, _)| *i == id).map(|(_, s)| s.as_slice()),
        }
    }

    /// The node that made `id`.
    pub fn producer(&self, id: TensorId) -> Option<&TraceNode> {
        self.produced.get(&id).map(|&i| &self.nodes[i])
    }

    /// Every tensor computed from `from` (itself included).
    pub fn downstream(&self, from: TensorId) -> HashSet<TensorId> {
        let (mut seen, mut work) = (HashSet::from([from]), vec![from]);
        while let Some(t) = work.pop() {
            for &c in self.consumers.get(&t).map(Vec::as_slice).unwrap_or(&[]) {
                if seen.insert(self.nodes[c].id) {
                    work.push(self.nodes[c].id);
                }
            }
        }
        seen
    }

    /// Whether `id` is computed from the input or the weights (as opposed to a constant or a mask).
    pub fn is_data(&self, id: TensorId) -> bool {
        self.data.contains(&id)
    }

    /// Where the tensor `from` (split along its last axis) flows. `accepts(scope, id)` names the
    /// layer, if any, that an op in `scope` belongs to and that takes `id` split as its input;
    /// `dropout(scope)` whether a scope is a Dropout layer (which draws its mask for the whole
    /// tensor and so preserves a split). Also returns the nodes passed through and the Dropout
    /// scopes on the way.
    pub fn follow(
        &self,
        from: TensorId,
        accepts: impl Fn(&str, TensorId) -> Option<String>,
        dropout: impl Fn(&str) -> Option<String>,
    ) -> (Flow, Vec<usize>, Vec<String>) {
        let mut work = vec![from];
        let mut seen: HashSet<TensorId> = HashSet::new();
        let (mut into, mut out, mut passed, mut drops) = (Vec::<String>::new(), false, Vec::new(), Vec::new());
        while let Some(t) = work.pop() {
            if !seen.insert(t) {
                continue;
            }
            if self.outputs.contains(&t) {
                out = true;
            }
            for &c in self.consumers.get(&t).map(Vec::as_slice).unwrap_or(&[]) {
                let n = &self.nodes[c];
                if let Some(layer) = accepts(&n.scope, t) {
                    if !into.contains(&layer) {
                        into.push(layer);
                    }
                    continue;
                }
                let others: Vec<TensorId> = n.inputs.iter().copied().filter(|&i| i != t).collect();
                let drop_scope = dropout(&n.scope);
                // Views and copies that leave the last axis alone keep it split.
                let last_kept = self.shape(t).and_then(|s| s.last()).is_some_and(|l| n.shape.last() == Some(l));
                let keeps = n.kind.starts_with("unary/")
                    || matches!(n.kind.as_str(), "copy" | "cast")
                    // Pooling acts on each channel (the last axis) alone.
                    || (matches!(n.kind.as_str(), "max_pool" | "avg_pool") && last_kept)
                    || (matches!(n.kind.as_str(), "narrow" | "reshape" | "broadcast") && last_kept)
                    || (n.kind.starts_with("binary/")
                        && drop_scope.is_some()
                        && others.iter().all(|&o| !self.is_data(o)));
                if !keeps {
                    let at = if n.scope.is_empty() { String::new() } else { format!(" in {}", n.scope) };
                    return (Flow::Breaks(format!("{} of shape {:?}{at}", n.kind, n.shape)), passed, drops);
                }
                if let Some(d) = drop_scope
                    && !drops.contains(&d)
                {
                    drops.push(d);
                }
                passed.push(c);
                work.push(n.id);
            }
        }
        let flow = match (into.is_empty(), out) {
            (false, false) => Flow::Into(into),
            (true, true) => Flow::Output,
            (true, false) => Flow::Breaks("nothing uses it".into()),
            (false, true) => Flow::Breaks(format!("it leaves the model as well as feeding {}", into.join(", "))),
        };
        (flow, passed, drops)
    }
}
