//! The planner: trace the model on the Meta device (no data is allocated), then decide every
//! layer's style, in this order:
//!
//! 1. overrides by path pattern (they win over everything below);
//! 2. attention by heads: every layer that declares [`SplitRule::Heads`] has its projections
//!    column-split by whole heads and its output projection row-split;
//! 3. embeddings by vocabulary ([`SplitRule::Vocab`]), with any tied projection
//!    ([`SplitRule::Tied`]) on the same shards;
//! 4. every other linear layer ([`SplitRule::Linear`]), in call order: column-split, and paired with the
//!    layers its output reaches through shard-preserving ops, when every one of them can be
//!    row-split (one or several: a fan-out stays split into each); output layers stay split only
//!    for the vocabulary-parallel loss (see [`AutoConfig::loss`]); unpaired, split the way that
//!    moves fewer bytes; too small, replicated;
//! 5. everything else replicated.
//!
//! The planner reads only what each layer declares ([`Layer::split_rule`]), never its kind or
//! its name: a layer of one's own is planned exactly as a built-in one that declares the same.

use super::geometry::{Geometry, geometry};
use super::graph::{Flow, Graph, LayerNode};
use super::traced::Traced;
use super::{LayerPlan, PlanInput, ShardingPlan, VarPlan};
use crate::DeviceMesh;
use std::collections::{HashMap, HashSet};
use weft_core::{DType, Error, Result, TensorId};
use weft_nn::split::HeadSplit;
use weft_nn::tp::{Placement, Style, split_sizes};
use weft_nn::{Layer, Loss, SplitRule};

/// The kind a plan gives a scope that runs inside a layer without being one of its described
/// sublayers (attention's dropout on the probabilities).
pub(super) const INNER: &str = "inside attention by heads";

/// A style an override asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// Keep the layer whole on every device.
    Replicate,
    /// Split the kernel's output axis (attention: by heads).
    Column,
    /// Split the kernel's input axis.
    Row,
    /// Split an embedding table by vocabulary.
    Vocab,
}

/// The planner's settings.
///
/// ```
/// use weft_parallel::{AutoConfig, Split};
/// let cfg = AutoConfig::new().min_params(0).override_layer("*/mlp/down", Split::Replicate);
/// # let _ = cfg;
/// ```
#[derive(Debug, Clone)]
pub struct AutoConfig {
    min_params: usize,
    overrides: Vec<(String, Split)>,
    optimizer_slots: usize,
    input_dtype: DType,
    loss: Option<Loss>,
}

impl Default for AutoConfig {
    fn default() -> Self {
        AutoConfig {
            min_params: 65_536,
            overrides: Vec::new(),
            optimizer_slots: 2,
            input_dtype: DType::F32,
            loss: None,
        }
    }
}

impl AutoConfig {
    /// Defaults: layers under 65,536 parameters stay whole, Adam's two slots, f32 inputs.
    pub fn new() -> Self {
        Self::default()
    }
    /// Layers (or pairs) with fewer parameters than this stay replicated.
    pub fn min_params(mut self, n: usize) -> Self {
        self.min_params = n;
        self
    }
    /// Force `split` on every layer whose path matches `pattern` (`*` matches any run of
    /// characters, `/` included). A pattern that matches no layer is an `Err` when planning.
    pub fn override_layer(mut self, pattern: &str, split: Split) -> Self {
        self.overrides.push((pattern.to_string(), split));
        self
    }
    /// Optimizer slots per variable, for the memory figures (SGD 0 or 1, Adam 2).
    pub fn optimizer_slots(mut self, n: usize) -> Self {
        self.optimizer_slots = n;
        self
    }
    /// The dtype of the model's input (`U32` for token ids).
    pub fn input_dtype(mut self, d: DType) -> Self {
        self.input_dtype = d;
        self
    }
    /// The loss the model will be compiled with. Only sparse cross-entropy from logits runs on a
    /// split output (vocabulary-parallel); given any other loss, a layer whose output is the
    /// model's is gathered (or split by rows) like any unpaired layer. Without it the plan keeps
    /// such an output split and lists the vocabulary-parallel loss's collectives as conditional.
    pub fn loss(mut self, loss: Loss) -> Self {
        self.loss = Some(loss);
        self
    }

    /// Plan `net` for inputs of `input_shape` (batch first) over `model` ranks splitting weights
    /// and `data` ranks splitting the batch. Nothing is allocated: `net` runs on the Meta device,
    /// so pass a fresh (unbuilt) model.
    pub fn plan(&self, net: &dyn Layer, input_shape: &[usize], model: usize, data: usize) -> Result<ShardingPlan> {
        let mut plan = self.plan_inputs(net, &[PlanInput::new("", input_shape, self.input_dtype)], model, data)?;
        plan.inputs.clear();
        Ok(plan)
    }

    /// Plan `net` for several named inputs (a functional model's: token ids, attention mask,
    /// ...), each with its shape (batch first) and dtype; see [`AutoConfig::plan`].
    pub fn plan_inputs(
        &self,
        net: &dyn Layer,
        inputs: &[PlanInput],
        model: usize,
        data: usize,
    ) -> Result<ShardingPlan> {
        if model == 0 || data == 0 {
            return Err(Error::invalid(
                "autoconfig",
                format!("a plan needs at least one device on each axis, got {model} model x {data} data devices"),
            ));
        }
        let input_shape = inputs.first().map(|i| i.shape.clone()).unwrap_or_default();
        let Traced { root, graph, layers } = Traced::with_inputs(net, inputs)?;
        let graph = &graph;
        let layers = &layers;
        let mut p = Planner { cfg: self, n: model, graph, layers, decided: HashMap::new(), output: None };
        p.check_overrides()?;
        if model > 1 {
            p.attention()?;
            p.embeddings()?;
            p.dense()?;
        }
        p.rest();
        let output = p.output.clone();
        let mut decided = std::mem::take(&mut p.decided);
        let mut plan_layers: Vec<LayerPlan> = layers
            .iter()
            .filter_map(|l| {
                let (style, placements, reason) = decided.remove(&l.path)?;
                let variables = l
                    .vars
                    .iter()
                    .map(|(path, shape, _)| VarPlan {
                        path: path.clone(),
                        shape: shape.clone(),
                        placement: placements.get(path).cloned().unwrap_or(Placement::Replicate),
                    })
                    .collect();
                Some(LayerPlan { path: l.path.clone(), kind: l.kind.clone(), style, variables, reason })
            })
            .collect();
        // What is left ran in a scope that is not a described layer (attention's dropout): it
        // must reach the ranks all the same, or it would draw its mask for its part only.
        plan_layers.extend(decided.into_iter().map(|(path, (style, _, reason))| LayerPlan {
            path,
            kind: INNER.into(),
            style,
            variables: Vec::new(),
            reason,
        }));
        // Call order: by each layer's first op.
        let first = |path: &str| graph.region(path).first().copied().unwrap_or(usize::MAX);
        plan_layers.sort_by_key(|l| first(&l.path));
        let mut plan = ShardingPlan {
            model: root,
            model_axis: model,
            data_axis: data,
            input_shape,
            inputs: inputs.to_vec(),
            layers: plan_layers,
            output,
            optimizer_slots: self.optimizer_slots,
            loss: self.loss.as_ref().map(|l| format!("{l:?}")),
            memory: Vec::new(),
            collectives: Vec::new(),
        };
        super::cost::estimate(&mut plan, graph, layers);
        plan.check()?;
        Ok(plan)
    }
}

/// Plan `net` for `mesh` (its `model` and `data` axes); see [`AutoConfig::plan`].
///
/// ```
/// use weft_nn::{layers::Dense, Activation, Sequential};
/// use weft_parallel::{autoconfig, AutoConfig, DeviceMesh};
/// use weft_nn::tp::Style;
/// let net = Sequential::new().add(Dense::new(512).activation(Activation::Gelu)).add(Dense::new(256));
/// let plan = autoconfig(&net, &[32, 256], &DeviceMesh::cpus(2)?, &AutoConfig::new())?;
/// assert_eq!(plan.layers[0].style.name(), "column"); // paired: no all-gather
/// assert_eq!(plan.layers[1].style.name(), "row");
/// # Ok::<(), weft_core::Error>(())
/// ```
pub fn autoconfig(net: &dyn Layer, input_shape: &[usize], mesh: &DeviceMesh, cfg: &AutoConfig) -> Result<ShardingPlan> {
    cfg.plan(net, input_shape, mesh.size("model"), mesh.size("data"))
}

/// The scopes inside the attention at `att` that act on its split heads: every op that takes a
/// tensor computed from a projection's output, before the output projection (`parts`: the
/// projections, the output last). Only scopes that are not layers (attention's own dropout) or
/// that declare [`SplitRule::Pointwise`] count; the attention's own scope runs on its part of
/// the heads as it is.
pub(super) fn heads_inner(graph: &Graph, layers: &[LayerNode], att: &str, parts: &[&str]) -> Vec<String> {
    let Some((out, projs)) = parts.split_last() else { return Vec::new() };
    let mut split: HashSet<TensorId> = projs.iter().filter_map(|p| graph.layer_output(p)).collect();
    let mut scopes: Vec<String> = Vec::new();
    // Over the whole graph: the attention's own ops may be recorded under its parent (a layer
    // of one's own need not open its scope); only scopes inside it are collected.
    for n in &graph.nodes {
        if super::graph::inside(&n.scope, out) || projs.iter().any(|p| super::graph::inside(&n.scope, p)) {
            continue;
        }
        if n.inputs.iter().any(|t| split.contains(t)) {
            split.insert(n.id);
            let counts = n.scope != att
                && super::graph::inside(&n.scope, att)
                && layers
                    .iter()
                    .find(|l| l.path == n.scope)
                    .is_none_or(|l| l.split == SplitRule::Pointwise && l.vars.is_empty());
            if counts && !scopes.contains(&n.scope) {
                scopes.push(n.scope.clone());
            }
        }
    }
    scopes
}

/// A sublayer with its kernel's geometry.
pub(super) type Part<'a> = (&'a LayerNode, Geometry);

/// The projections to heads and the projection back that `att` declares, with their
/// geometries; an `Err` naming the declaration's fault when they are missing or cannot split by
/// whole heads.
pub(super) fn heads_parts<'a>(
    layers: &'a [LayerNode],
    att: &LayerNode,
    h: &HeadSplit,
) -> Result<(Vec<Part<'a>>, Part<'a>)> {
    let bad =
        |what: String| Error::invalid("autoconfig", format!("{} declares {} heads, but {what}", att.path, h.heads));
    let part = |name: &str, column: bool| -> Result<Part<'a>> {
        let path = format!("{}/{name}", att.path);
        let l = layers.iter().find(|l| l.path == path).ok_or_else(|| bad(format!("it has no sublayer {name:?}")))?;
        let g = geometry(l).ok_or_else(|| bad(format!("{path} is not a built linear layer")))?;
        let cut = if column { g.col } else { g.row };
        match cut {
            // A heads axis of its own (attention's [.., heads, head_dim]) must hold the heads
            // exactly; a flat one (Dense to heads x head_dim) whole heads of equal size.
            Some(c) if !c.last && c.size != h.heads => Err(bad(format!(
                "{path} splits an axis of {} entries, not one of the heads (a head's own axis cannot be split)",
                c.size
            ))),
            Some(c) if h.heads > 0 && c.size % h.heads == 0 => Ok((l, g)),
            Some(c) => Err(bad(format!(
                "{path} has {} entries on its {} axis, not a multiple of the heads",
                c.size,
                if column { "column" } else { "row" }
            ))),
            None => Err(bad(format!(
                "{path} cannot be split by {}",
                if column { "columns (its output axis)" } else { "rows (its input axis)" }
            ))),
        }
    };
    if h.projections.is_empty() {
        return Err(bad("names no projection to heads".into()));
    }
    let projs = h.projections.iter().map(|p| part(p, true)).collect::<Result<Vec<_>>>()?;
    let out = part(&h.output, false)?;
    // Anything else with weights inside would see split heads yet be kept whole.
    let declared: Vec<&str> = projs.iter().chain([&out]).map(|(l, _)| l.path.as_str()).collect();
    if let Some(l) = layers.iter().find(|l| {
        super::graph::inside(&l.path, &att.path)
            && !l.vars.is_empty()
            && !declared.iter().any(|d| super::graph::inside(&l.path, d))
    }) {
        return Err(bad(format!(
            "{} has variables ({}) and is not one of its projections",
            l.path,
            l.vars.iter().map(|v| v.0.as_str()).collect::<Vec<_>>().join(", ")
        )));
    }
    Ok((projs, out))
}

/// `*` matches any run of characters.
fn glob(pattern: &str, s: &str) -> bool {
    // Greedy matching that returns only to the last star: at most pattern x text steps, however
    // many stars (trying every split at every star is exponential: 24 stars never finished).
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), s.chars().collect());
    let (mut i, mut j) = (0, 0);
    let mut star: Option<(usize, usize)> = None; // (pattern index after the star, text index it took from)
    while j < t.len() {
        if i < p.len() && p[i] == '*' {
            star = Some((i + 1, j));
            i += 1;
        } else if i < p.len() && p[i] == t[j] {
            i += 1;
            j += 1;
        } else if let Some((si, sj)) = star {
            // The last star takes one more character.
            star = Some((si, sj + 1));
            i = si;
            j = sj + 1;
        } else {
            return false;
        }
    }
    p[i..].iter().all(|&c| c == '*')
}

type Decision = (Style, HashMap<String, Placement>, String);

struct Planner<'a> {
    cfg: &'a AutoConfig,
    n: usize,
    graph: &'a Graph,
    layers: &'a [LayerNode],
    decided: HashMap<String, Decision>,
    output: Option<Vec<usize>>,
}

impl<'a> Planner<'a> {
    fn layer(&self, path: &str) -> Option<&'a LayerNode> {
        let layers: &'a [LayerNode] = self.layers;
        layers.iter().find(|l| l.path == path)
    }

    /// The override for a layer: one naming it, or naming a container it is in (the last one
    /// given wins).
    ///
    /// An override that names the layer itself always applies (and is an `Err` later if it cannot
    /// be made). One inherited from a container applies only where it fits what the layer
    /// declares (`Row` on a block splits its linear layers, not its embedding).
    fn forced(&self, path: &str) -> Option<Split> {
        let prefixes: Vec<&str> = path.match_indices('/').map(|(i, _)| &path[..i]).collect();
        let rule = self.layer(path).map(|l| &l.split);
        let fits = |s: Split| match (s, rule) {
            (Split::Replicate, _) => true,
            (Split::Column, Some(SplitRule::Heads(_))) => true,
            (Split::Column, Some(SplitRule::Linear(l))) => l.column.is_some(),
            (Split::Row, Some(SplitRule::Linear(l))) => l.row.is_some(),
            (Split::Vocab, Some(SplitRule::Vocab { .. })) => true,
            _ => false,
        };
        self.cfg
            .overrides
            .iter()
            .rev()
            .find_map(|(p, s)| (glob(p, path) || (prefixes.iter().any(|q| glob(p, q)) && fits(*s))).then_some(*s))
    }

    fn check_overrides(&self) -> Result<()> {
        for (pattern, _) in &self.cfg.overrides {
            if !self.layers.iter().any(|l| glob(pattern, &l.path)) {
                let some: Vec<&str> =
                    self.layers.iter().filter(|l| !l.vars.is_empty()).map(|l| l.path.as_str()).take(8).collect();
                return Err(Error::invalid(
                    "autoconfig",
                    format!("override {pattern:?} names no layer; layers with weights include {some:?}"),
                ));
            }
        }
        Ok(())
    }

    fn bad_split(&self, path: &str, what: &str) -> Error {
        Error::invalid("autoconfig", format!("{path}: cannot {what} over {} devices", self.n))
    }

    fn column(&self, g: &Geometry, sizes: &[usize], gather: bool) -> Decision {
        let k = g.col.expect("column geometry").kernel;
        let mut p = HashMap::from([(g.kernel.clone(), Placement::Shard { axis: k, sizes: sizes.to_vec() })]);
        if let (Some(path), Some(b)) = (&g.bias, g.col_bias) {
            p.insert(path.clone(), Placement::Shard { axis: b, sizes: sizes.to_vec() });
        }
        (Style::Column { sizes: sizes.to_vec(), gather }, p, String::new())
    }

    fn row(&self, g: &Geometry, sizes: &[usize], scatter: bool) -> Decision {
        let k = g.row.expect("row geometry").kernel;
        let p = HashMap::from([(g.kernel.clone(), Placement::Shard { axis: k, sizes: sizes.to_vec() })]);
        (Style::Row { sizes: sizes.to_vec(), scatter }, p, String::new())
    }

    fn set(&mut self, path: &str, mut d: Decision, reason: String) {
        d.2 = reason;
        self.decided.insert(path.to_string(), d);
    }

    fn replicate(&mut self, path: &str, reason: String) {
        self.decided.insert(path.to_string(), (Style::Replicated, HashMap::new(), reason));
    }

    /// The layer at `scope` when it declares [`SplitRule::Pointwise`] (dropout): it runs split
    /// on a split tensor.
    fn pointwise(&self, scope: &str) -> Option<String> {
        self.layers
            .iter()
            .find(|d| d.path == scope && d.split == SplitRule::Pointwise && d.vars.is_empty())
            .map(|d| d.path.clone())
    }

    fn attention(&mut self) -> Result<()> {
        let layers: &'a [LayerNode] = self.layers;
        for att in layers {
            let SplitRule::Heads(h) = &att.split else { continue };
            let forced = self.forced(&att.path);
            // Whatever has weights in it: replicated together when it cannot split by heads.
            let weighted: Vec<&LayerNode> =
                layers.iter().filter(|l| super::graph::inside(&l.path, &att.path) && !l.vars.is_empty()).collect();
            if forced == Some(Split::Replicate) {
                for l in &weighted {
                    self.replicate(&l.path, format!("override on {}: replicated", att.path));
                }
                continue;
            }
            let (projs, o) = match heads_parts(layers, att, h) {
                Ok(parts) => parts,
                Err(e) if forced.is_some() => return Err(e),
                Err(e) => {
                    for l in &weighted {
                        self.replicate(&l.path, format!("not split by heads: {e}"));
                    }
                    continue;
                }
            };
            let each: Vec<Option<Split>> = projs.iter().chain([&o]).map(|(l, _)| self.forced(&l.path)).collect();
            if each.iter().any(|f| *f != each[0]) {
                return Err(Error::invalid(
                    "autoconfig",
                    format!(
                        "{}: its projections ({}, {}) split together; override {} itself",
                        att.path,
                        h.projections.join(", "),
                        h.output,
                        att.path
                    ),
                ));
            }
            if matches!(forced, Some(Split::Row | Split::Vocab)) {
                return Err(self.bad_split(&att.path, "split attention except by heads (Split::Column)"));
            }
            let params: usize = projs.iter().chain([&o]).map(|(l, _)| l.params()).sum();
            let heads = h.heads;
            let all: Vec<&LayerNode> = projs.iter().chain([&o]).map(|(l, _)| *l).collect();
            if heads < self.n {
                if forced.is_some() {
                    return Err(self.bad_split(&att.path, &format!("split {heads} heads by whole heads")));
                }
                for l in &all {
                    self.replicate(
                        &l.path,
                        format!("{heads} heads cannot be split over {} devices by whole heads", self.n),
                    );
                }
                continue;
            }
            if params < self.cfg.min_params && forced.is_none() {
                for l in &all {
                    self.replicate(
                        &l.path,
                        format!(
                            "attention of {params} parameters (< {}): not worth the communication",
                            self.cfg.min_params
                        ),
                    );
                }
                continue;
            }
            let sizes = split_sizes(heads, self.n);
            let times = |unit: usize| sizes.iter().map(|s| s * unit).collect::<Vec<usize>>();
            let by = format!("attention by heads ({heads} heads -> {sizes:?})");
            for (l, g) in &projs {
                let d = self.column(g, &times(g.col.expect("checked").size / heads), false);
                self.set(&l.path, d, format!("{by}: column, each device computes its heads"));
            }
            let d = self.row(&o.1, &times(o.1.row.expect("checked").size / heads), false);
            self.set(&o.0.path, d, format!("{by}: row, one all-reduce of the heads' sum"));
            // What runs inside it on the split heads (dropout on the probabilities): split along
            // the heads axis it declares.
            let parts: Vec<&str> = all.iter().map(|l| l.path.as_str()).collect();
            let extra = heads_inner(self.graph, layers, &att.path, &parts);
            for s in extra {
                self.decided.insert(
                    s,
                    (
                        Style::Split { axis: h.inner_axis, sizes: sizes.clone() },
                        HashMap::new(),
                        format!("{by}: on the split heads"),
                    ),
                );
            }
        }
        Ok(())
    }

    fn embeddings(&mut self) -> Result<()> {
        let layers: &'a [LayerNode] = self.layers;
        for e in layers {
            let SplitRule::Vocab { table } = &e.split else { continue };
            let forced = self.forced(&e.path);
            // A table the layer does not have, or weights besides it (which would train on part
            // of their gradient): the layer stays whole, with the reason, or a forced split is refused.
            let found = e.var(table).cloned();
            let fault = match &found {
                None => Some(format!("{} declares a vocabulary table {table:?} it does not have", e.path)),
                Some(_) if e.vars.len() > 1 => Some(format!(
                    "{} has variables besides its table {table:?}: a vocabulary split would train them on part of their gradient",
                    e.path
                )),
                Some(_) => None,
            };
            if let Some(why) = fault {
                if matches!(forced, Some(Split::Vocab)) {
                    return Err(self.bad_split(&e.path, &format!("split it by vocabulary: {why}")));
                }
                self.replicate(&e.path, why);
                continue;
            }
            let Some((table_path, shape, Some(table_id))) = found else { continue };
            let heads: Vec<&LayerNode> = layers
                .iter()
                .filter(|l| {
                    l.split == SplitRule::Tied
                        && self.graph.region(&l.path).iter().any(|&i| self.graph.nodes[i].inputs.contains(&table_id))
                })
                .collect();
            let vocab = shape[0];
            let params = e.params();
            let why_not = if forced == Some(Split::Replicate) {
                Some("override: replicated".to_string())
            } else if matches!(forced, Some(Split::Column | Split::Row)) {
                return Err(self.bad_split(&e.path, "split an embedding by columns or rows (use Split::Vocab)"));
            } else if vocab < self.n {
                if forced.is_some() {
                    return Err(self.bad_split(&e.path, &format!("split a vocabulary of {vocab}")));
                }
                Some(format!("a vocabulary of {vocab} cannot be split over {} devices", self.n))
            } else if params < self.cfg.min_params && forced.is_none() {
                Some(format!("{params} parameters (< {}): not worth the communication", self.cfg.min_params))
            } else {
                None
            };
            if let Some(why) = why_not {
                self.replicate(&e.path, why.clone());
                for h in heads {
                    self.replicate(&h.path, format!("tied to {}, which is replicated", e.path));
                }
                continue;
            }
            let sizes = split_sizes(vocab, self.n);
            let p = HashMap::from([(table_path.clone(), Placement::Shard { axis: 0, sizes: sizes.clone() })]);
            self.set(
                &e.path,
                (Style::Vocab { sizes: sizes.clone() }, p, String::new()),
                format!("vocabulary {vocab} -> {sizes:?}: masked lookup, then one all-reduce"),
            );
            for h in heads {
                let out = self.graph.layer_output(&h.path);
                let flow = out.map(|o| self.graph.follow(o, |_, _| None, |_| None).0);
                let (gather, why) = match (flow, self.whole_output()) {
                    (Some(Flow::Output), Some(why)) => (true, format!("gathered: {why}")),
                    (Some(Flow::Output), None) => {
                        self.output = Some(sizes.clone());
                        (false, "the logits stay split for vocabulary-parallel cross-entropy".to_string())
                    }
                    (Some(Flow::Breaks(w)), _) => (true, format!("gathered: its output goes to {w}")),
                    _ => (true, "gathered".to_string()),
                };
                self.decided.insert(
                    h.path.clone(),
                    (
                        Style::Column { sizes: sizes.clone(), gather },
                        HashMap::new(),
                        format!("tied to {} (same shards); {why}", e.path),
                    ),
                );
            }
        }
        Ok(())
    }

    fn dense(&mut self) -> Result<()> {
        let layers: &'a [LayerNode] = self.layers;
        let mut order: Vec<&LayerNode> = layers.iter().filter(|l| l.split.linear().is_some()).collect();
        order.sort_by_key(|l| self.graph.region(&l.path).first().copied().unwrap_or(usize::MAX));
        for l in order {
            if self.decided.contains_key(&l.path) {
                continue;
            }
            let forced = self.forced(&l.path);
            let Some(g) = geometry(l).filter(|g| g.col.is_some() || g.row.is_some()) else {
                let why = match geometry(l) {
                    Some(g) if !g.extra.is_empty() => {
                        format!("it has variables its declaration does not name ({})", g.extra.join(", "))
                    }
                    _ => "no kernel axis to split".to_string(),
                };
                if forced.is_some_and(|f| f != Split::Replicate) {
                    return Err(self.bad_split(&l.path, &format!("split it: {why}")));
                }
                self.replicate(&l.path, why);
                continue;
            };
            match forced {
                Some(Split::Replicate) => {
                    self.replicate(&l.path, "override: replicated".into());
                    continue;
                }
                Some(Split::Vocab) => return Err(self.bad_split(&l.path, "split a dense layer by vocabulary")),
                Some(Split::Row) => {
                    let Some(size) = g.row.map(|r| r.size).filter(|&s| s >= self.n) else {
                        return Err(self.bad_split(&l.path, "split the kernel's input axis"));
                    };
                    let d = self.row(&g, &split_sizes(size, self.n), true);
                    self.set(
                        &l.path,
                        d,
                        "override: row, its input arrives whole and each device takes its part".into(),
                    );
                    continue;
                }
                Some(Split::Column) if g.col.is_none_or(|c| c.size < self.n) => {
                    return Err(self.bad_split(&l.path, "split the kernel's output axis"));
                }
                _ => {}
            }
            self.auto_dense(l, &g, forced == Some(Split::Column))?;
        }
        Ok(())
    }

    /// A row-split candidate that takes `t` as its input in `scope`: a linear layer whose input
    /// splits on its last axis into `size` entries.
    fn accepts(&self, scope: &str, t: TensorId, size: usize) -> Option<String> {
        let m = self
            .layers
            .iter()
            .filter(|m| m.split.linear().is_some())
            .find(|m| scope == m.path || scope.starts_with(&format!("{}/", m.path)))?;
        if self.decided.contains_key(&m.path) || matches!(self.forced(&m.path), Some(Split::Replicate | Split::Column))
        {
            return None;
        }
        let g = geometry(m)?;
        let r = g.row?;
        (r.last && r.size == size && self.graph.layer_input(&m.path) == Some(t)).then(|| m.path.clone())
    }

    fn auto_dense(&mut self, l: &LayerNode, g: &Geometry, forced_col: bool) -> Result<()> {
        let n = self.n;
        let min = self.cfg.min_params;
        let params = l.params();
        let out = self.graph.layer_output(&l.path);
        let input = self.graph.layer_input(&l.path);
        // Try the pairing: a column split whose output reaches one row-splittable layer.
        if let (Some(super::geometry::Cut { size, last: true, .. }), Some(out)) = (g.col.filter(|c| c.size >= n), out) {
            let is_dropout = |scope: &str| self.pointwise(scope);
            let (flow, _, drops) = self.graph.follow(out, |scope, t| self.accepts(scope, t, size), is_dropout);
            let sizes = split_sizes(size, n);
            // Only a vocabulary-parallel loss takes the model's output split.
            let flow = match (flow, self.whole_output()) {
                (Flow::Output, Some(why)) => Flow::Breaks(why),
                (f, _) => f,
            };
            match flow {
                Flow::Into(ref ms) => {
                    let rows: Vec<&LayerNode> = ms.iter().map(|m| self.layer(m).expect("a layer")).collect();
                    let pair = params + rows.iter().map(|m| m.params()).sum::<usize>();
                    if pair >= min || forced_col || rows.iter().any(|m| self.forced(&m.path) == Some(Split::Row)) {
                        self.pair(l, g, &rows, &sizes, &drops, out);
                        return Ok(());
                    }
                }
                Flow::Output if params >= min || forced_col => {
                    let d = self.column(g, &sizes, false);
                    self.output = Some(sizes.clone());
                    self.set(
                        &l.path,
                        d,
                        format!(
                            "column {size} -> {sizes:?}; the output stays split for vocabulary-parallel cross-entropy"
                        ),
                    );
                    return Ok(());
                }
                _ => {}
            }
            if let Flow::Breaks(why) = &flow
                && (params >= min || forced_col)
            {
                return self.unpaired(l, g, input, Some(out), why, forced_col);
            }
        } else if params >= min || forced_col {
            return self.unpaired(l, g, input, out, "its output is not split on its last axis", forced_col);
        }
        self.replicate(&l.path, format!("{params} parameters (< {min}): not worth the communication"));
        Ok(())
    }

    /// Why the model's output cannot stay split: the loss, when given, is not the
    /// vocabulary-parallel one.
    fn whole_output(&self) -> Option<String> {
        if self.graph.outputs.len() > 1 {
            return Some(format!("the model has {} outputs, each leaves whole", self.graph.outputs.len()));
        }
        let loss = self.cfg.loss.as_ref().filter(|l| !super::vocab_parallel(l))?;
        Some(format!("the loss ({loss:?}) needs the whole output"))
    }

    /// Column-split `l` and row-split every layer its output reaches (`rows`), with the dropouts
    /// on the way split like the tensor.
    fn pair(
        &mut self,
        l: &LayerNode,
        g: &Geometry,
        rows: &[&LayerNode],
        sizes: &[usize],
        drops: &[String],
        out: TensorId,
    ) {
        let names: Vec<&str> = rows.iter().map(|m| m.path.as_str()).collect();
        let names = names.join(", ");
        let size: usize = sizes.iter().sum();
        let why = match rows {
            [_] => "one all-reduce forward and one backward, no all-gather".to_string(),
            _ => format!("each of the {} takes it split (one all-reduce forward each), no all-gather", rows.len()),
        };
        let d = self.column(g, sizes, false);
        self.set(&l.path, d, format!("column {size} -> {sizes:?}, paired with {names}: {why}"));
        for m in rows {
            let gm = geometry(m).expect("row geometry");
            let d = self.row(&gm, sizes, false);
            self.set(&m.path, d, format!("row, paired with {}: takes its split output as is", l.path));
        }
        for d in drops {
            let input = self.graph.layer_input(d).and_then(|i| self.graph.shape(i));
            let axis = input.or(self.graph.shape(out)).map_or(0, |s| s.len().saturating_sub(1));
            self.decided.insert(
                d.clone(),
                (
                    Style::Split { axis, sizes: sizes.to_vec() },
                    HashMap::new(),
                    match rows {
                        [_] => format!("between {} and {names}: masks drawn whole, split like the tensor", l.path),
                        _ => format!("on the split output of {}: masks drawn whole, split like the tensor", l.path),
                    },
                ),
            );
        }
    }

    /// A large layer with no partner: column-split then gathered, or row-split with its input
    /// scattered, whichever moves fewer bytes per step.
    fn unpaired(
        &mut self,
        l: &LayerNode,
        g: &Geometry,
        input: Option<TensorId>,
        out: Option<TensorId>,
        why: &str,
        forced_col: bool,
    ) -> Result<()> {
        let n = self.n;
        let bytes = |id: Option<TensorId>| {
            id.and_then(|i| self.graph.shape(i)).map_or(0u64, |s| 4 * s.iter().product::<usize>() as u64)
        };
        let in_bytes = if input.is_some_and(|i| self.graph.is_input(i)) { 0 } else { bytes(input) };
        let out_bytes = bytes(out);
        // An all-gather moves a tensor once, an all-reduce twice (reduce-scatter + all-gather);
        // the input's gradient only moves when the input has one.
        let col_cost = out_bytes + 2 * in_bytes;
        let row_cost = 2 * out_bytes + in_bytes;
        let col_ok = g.col.is_some_and(|c| c.size >= n);
        let row_ok = g.row.is_some_and(|r| r.size >= n && r.last);
        let mb = |b: u64| b as f64 / (1 << 20) as f64;
        if col_ok && (forced_col || !row_ok || col_cost <= row_cost) {
            let size = g.col.expect("col").size;
            let d = self.column(g, &split_sizes(size, n), true);
            self.set(
                &l.path,
                d,
                format!(
                    "column + all-gather ({why}): {:.2} MiB per step against {:.2} for row",
                    mb(col_cost),
                    mb(row_cost)
                ),
            );
        } else if row_ok {
            let size = g.row.expect("row").size;
            let d = self.row(g, &split_sizes(size, n), true);
            self.set(
                &l.path,
                d,
                format!(
                    "row, input scattered ({why}): {:.2} MiB per step against {:.2} for column",
                    mb(row_cost),
                    mb(col_cost)
                ),
            );
        } else {
            self.replicate(&l.path, format!("no axis splits over {n} devices"));
        }
        Ok(())
    }

    fn rest(&mut self) {
        let layers: &'a [LayerNode] = self.layers;
        let left: Vec<&LayerNode> = layers
            .iter()
            .filter(|l| !l.container && !l.vars.is_empty() && !self.decided.contains_key(&l.path))
            .collect();
        for l in left {
            let why = match &l.split {
                _ if self.n == 1 => "one rank on the model axis: nothing to split".to_string(),
                SplitRule::Whole { why } => format!("{why}: replicated ({} parameters)", l.params()),
                _ => format!("no split applies: replicated ({} parameters)", l.params()),
            };
            self.replicate(&l.path, why);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::glob;

    #[test]
    fn glob_matches_runs() {
        assert!(glob("*/mlp/up", "gpt/block_0/mlp/up"));
        assert!(glob("gpt/*/attention*", "gpt/block_1/attention/query"));
        assert!(!glob("*/mlp/up", "gpt/block_0/mlp/down"));
        assert!(glob("exact", "exact"));
        assert!(glob("*é/x", "blöck_é/x") && !glob("*é/y", "blöck_é/x"));
        assert!(glob("a*b*c", "aXbYbZc") && !glob("a*b*c", "aXbYbZ") && glob("**", "") && glob("a*", "a"));
        // Many stars against a long path that does not match answer at once.
        let start = std::time::Instant::now();
        assert!(!glob(&"*a".repeat(24), &format!("{}b", "a".repeat(60))));
        assert!(glob(&"*a".repeat(24), &"a".repeat(60)));
        assert!(start.elapsed() < std::time::Duration::from_secs(1));
    }
}
