//! A plan checked against the model it is for. A plan loaded from JSON or edited by hand has only
//! its own word for what the model does; here the model is traced on the Meta device and every
//! split is followed through its ops, so a plan that would train a different function (a column
//! split whose output reaches its row partner through a transpose, say) is refused, not run.

use super::autoconfig::{INNER, heads_inner, heads_parts};
use super::geometry::geometry;
use super::graph::{Flow, LayerNode, inside};
use super::traced::Traced;
use super::{LayerPlan, ShardingPlan};
use std::collections::HashSet;
use weft_core::{Error, Result};
use weft_nn::tp::{Placement, Style, split_sizes};
use weft_nn::{Layer, SplitRule};

fn bad(what: String) -> Error {
    Error::invalid("ShardingPlan", what)
}

impl ShardingPlan {
    /// [`check`](Self::check), then the plan against `net` (a fresh, unbuilt model: it is traced
    /// on the Meta device, so nothing is allocated):
    ///
    /// - every layer the plan names is in the model, with the same kind and variables, and its
    ///   style fits the kind (a column split cuts the kernel's output axis, a row split its input
    ///   axis, a vocabulary split an embedding's rows);
    /// - attention splits by heads as a whole (query, key, value by columns, the output by rows,
    ///   the same sizes), and a tied head splits with its embedding;
    /// - a column-split output left split reaches the row-split layers that take it (or the model's
    ///   output, when the plan says the output is split) through shard-preserving ops only, with
    ///   the same sizes, and every dropout on the way is split like the tensor;
    /// - every row-split layer that takes its input split, and every `Split` layer, lies on such a
    ///   path.
    ///
    /// An `Err` names the layers and the op between them.
    pub fn check_model(&self, net: &dyn Layer) -> Result<()> {
        self.check()?;
        let traced = Traced::with_inputs(net, &self.input_specs())?;
        let mut c = Checker { plan: self, t: &traced, done: HashSet::new(), output_reached: false };
        c.run()
    }
}

struct Checker<'a> {
    plan: &'a ShardingPlan,
    t: &'a Traced,
    /// Layers whose split is accounted for (a row partner, a dropout on a path, attention).
    done: HashSet<String>,
    output_reached: bool,
}

impl<'a> Checker<'a> {
    fn style(&self, path: &str) -> Style {
        self.plan.layer(path).map_or(Style::Replicated, |l| l.style.clone())
    }

    fn run(&mut self) -> Result<()> {
        if self.plan.model != self.t.root {
            return Err(bad(format!("the plan is for the model {:?}, not {:?}", self.plan.model, self.t.root)));
        }
        for l in &self.plan.layers {
            self.fits(l)?;
        }
        let t = self.t;
        for att in &t.layers {
            if let SplitRule::Heads(h) = &att.split {
                self.attention(att, h)?;
            }
        }
        for head in t.layers.iter().filter(|l| l.split == SplitRule::Tied) {
            self.tied(head)?;
        }
        for l in &self.plan.layers {
            if let Style::Column { sizes, gather: false } = &l.style
                && !self.done.contains(&l.path)
            {
                self.column(l, sizes)?;
            }
        }
        for l in self.plan.layers.iter().filter(|l| !self.done.contains(&l.path)) {
            match &l.style {
                Style::Row { scatter: false, .. } => return Err(self.unfed_row(l)),
                Style::Split { .. } => {
                    return Err(bad(format!(
                        "{} is split, but no split tensor reaches it: a split dropout lies between a column-split \
                         layer and its row partner, or inside attention split by heads",
                        l.path
                    )));
                }
                _ => {}
            }
        }
        if let (Some(sizes), false) = (&self.plan.output, self.output_reached) {
            return Err(bad(format!(
                "the plan says the model's output leaves split {sizes:?}, but no column-split layer leaves it split"
            )));
        }
        Ok(())
    }

    /// The layer is in the model, and its style fits its kind and variables.
    fn fits(&self, l: &LayerPlan) -> Result<()> {
        let Some(node) = self.t.layer(&l.path) else {
            // A scope inside attention (its dropout) runs split when attention runs by heads:
            // `attention` checks that.
            let g = &self.t.graph;
            if l.kind == INNER && l.variables.is_empty() && g.nodes.iter().any(|n| n.scope == l.path) {
                return Ok(());
            }
            return Err(bad(format!(
                "{} is not a layer of {:?}: was the plan made for this model?",
                l.path, self.t.root
            )));
        };
        if node.kind != l.kind {
            return Err(bad(format!("{} is a {} in the model, a {} in the plan", l.path, node.kind, l.kind)));
        }
        let theirs: HashSet<(&str, &[usize])> = node.vars.iter().map(|(p, s, _)| (p.as_str(), s.as_slice())).collect();
        let ours: HashSet<(&str, &[usize])> =
            l.variables.iter().map(|v| (v.path.as_str(), v.shape.as_slice())).collect();
        if theirs != ours {
            let (mut t, mut o): (Vec<_>, Vec<_>) = (theirs.into_iter().collect(), ours.into_iter().collect());
            t.sort();
            o.sort();
            return Err(bad(format!("{}: the model has the variables {t:?}, the plan {o:?}", l.path)));
        }
        let cannot = |why: &str| Err(bad(format!("{} ({}) cannot run as {}: {why}", l.path, l.kind, l.style.name())));
        let axis_of = |name: &str| match node.var(name).and_then(|(p, ..)| l.variables.iter().find(|v| v.path == *p)) {
            Some(v) => match &v.placement {
                Placement::Shard { axis, .. } => Some(*axis),
                Placement::Replicate => None,
            },
            None => None,
        };
        match (&l.style, &node.split) {
            (Style::Replicated, _) => Ok(()),
            (Style::Column { .. }, SplitRule::Tied) => Ok(()),
            (Style::Column { .. } | Style::Row { .. }, SplitRule::Linear(_)) => {
                let Some(g) = geometry(node) else { return cannot("no kernel axis to split") };
                let (kernel, bias) = match &l.style {
                    Style::Column { .. } => match g.col {
                        Some(c) => (c.kernel, g.col_bias),
                        None => {
                            return cannot(
                                "a column split needs an output axis the kernel alone makes, an elementwise activation and a bias along it",
                            );
                        }
                    },
                    _ => match g.row {
                        Some(r) => (r.kernel, None),
                        None => return cannot("a row split needs an input axis the kernel sums over"),
                    },
                };
                let axis_at = |path: &str| match l.variables.iter().find(|v| v.path == path).map(|v| &v.placement) {
                    Some(Placement::Shard { axis, .. }) => Some(*axis),
                    _ => None,
                };
                if axis_at(&g.kernel) != Some(kernel) || g.bias.as_deref().is_some_and(|b| axis_at(b) != bias) {
                    return cannot(&format!(
                        "its kernel must be split on axis {kernel} and its bias {}",
                        bias.map_or("replicated".to_string(), |b| format!("on axis {b}"))
                    ));
                }
                Ok(())
            }
            (Style::Vocab { .. }, SplitRule::Vocab { table }) if axis_of(table) == Some(0) => Ok(()),
            (Style::Vocab { .. }, SplitRule::Vocab { .. }) => cannot("its table must be split on axis 0"),
            (Style::Split { .. }, _) if node.vars.is_empty() => Ok(()),
            _ => cannot("the style does not fit how the layer declares it splits"),
        }
    }

    /// Attention split by heads is split as a whole: every projection to heads by columns and
    /// the projection back by rows, all by the same whole heads; what runs inside on the split
    /// heads (its dropout) is split along the heads axis it declares.
    fn attention(&mut self, att: &LayerNode, h: &weft_nn::split::HeadSplit) -> Result<()> {
        let declared: Vec<String> =
            h.projections.iter().chain([&h.output]).map(|n| format!("{}/{n}", att.path)).collect();
        let styles: Vec<Style> = declared.iter().map(|p| self.style(p)).collect();
        let last = styles.len() - 1;
        let by_heads = styles[..last].iter().any(|s| matches!(s, Style::Column { gather: false, .. }))
            || matches!(styles[last], Style::Row { scatter: false, .. });
        if !by_heads {
            // Kept whole (or its parts split on their own, checked like any linear layer).
            return Ok(());
        }
        let (projs, o) = heads_parts(&self.t.layers, att, h)?;
        let paths: Vec<String> = projs.iter().chain([&o]).map(|(l, _)| l.path.clone()).collect();
        // Per-device heads, from the first projection's split and its entries per head.
        let unit = |g: &super::geometry::Geometry, column: bool| {
            (if column { g.col } else { g.row }).map_or(1, |c| c.size / h.heads.max(1))
        };
        let heads: Vec<usize> = match &styles[0] {
            Style::Column { sizes, .. } => sizes.iter().map(|s| s / unit(&projs[0].1, true)).collect(),
            _ => split_sizes(h.heads, self.plan.model_axis),
        };
        let times = |u: usize| heads.iter().map(|s| s * u).collect::<Vec<usize>>();
        for (i, s) in styles.iter().enumerate() {
            let want = if i < last {
                Style::Column { sizes: times(unit(&projs[i].1, true)), gather: false }
            } else {
                Style::Row { sizes: times(unit(&o.1, false)), scatter: false }
            };
            if *s != want {
                return Err(bad(format!(
                    "{}: attention split by heads splits {} by columns and {} by rows, all by the same whole heads \
                     {heads:?}; the plan has {} as {s:?}, where {want:?} fits",
                    att.path,
                    h.projections.join(", "),
                    h.output,
                    paths[i]
                )));
            }
        }
        let parts: Vec<&str> = paths.iter().map(String::as_str).collect();
        let inner = heads_inner(&self.t.graph, &self.t.layers, &att.path, &parts);
        let split = Style::Split { axis: h.inner_axis, sizes: heads.clone() };
        for s in &inner {
            if self.style(s) != split {
                return Err(bad(format!(
                    "{s} runs on the split heads of {}, so it must be split like them ({split:?}); otherwise its \
                     dropout mask differs from the one a single device draws",
                    att.path
                )));
            }
            self.done.insert(s.clone());
        }
        self.done.extend(paths);
        Ok(())
    }

    /// A tied head splits with its table, or neither does.
    fn tied(&self, head: &LayerNode) -> Result<()> {
        let Some(emb) = self.t.tied_table(&head.path) else { return Ok(()) };
        let (h, e) = (self.style(&head.path), self.style(&emb.path));
        let fits = match (&h, &e) {
            (Style::Replicated, Style::Replicated) => true,
            (Style::Column { sizes: a, .. }, Style::Vocab { sizes: b }) => a == b,
            _ => false,
        };
        if fits {
            return Ok(());
        }
        Err(bad(format!(
            "{} is tied to {}: it splits by columns exactly as the table splits by vocabulary, or neither splits \
             (the plan has {} {h:?} and {} {e:?})",
            head.path,
            emb.path,
            h.name(),
            e.name()
        )))
    }

    /// The row layer at `scope` (not yet accounted for) that takes `t` split as its input.
    fn row_taking(&self, scope: &str, t: weft_core::TensorId) -> Option<String> {
        let m = self.plan.layers.iter().find(|m| {
            matches!(m.style, Style::Row { scatter: false, .. })
                && !self.done.contains(&m.path)
                && inside(scope, &m.path)
        })?;
        (self.t.graph.layer_input(&m.path) == Some(t)).then(|| m.path.clone())
    }

    /// A column split left split reaches only row partners (or the output), through ops that
    /// keep the split.
    fn column(&mut self, l: &LayerPlan, sizes: &[usize]) -> Result<()> {
        let node = self.t.layer(&l.path).expect("checked by fits");
        if node.split != SplitRule::Tied && geometry(node).and_then(|g| g.col).is_none_or(|c| !c.last) {
            return Err(bad(format!(
                "{} leaves its output split on an axis that is not the last: only attention by heads does that; \
                 gather it (column+gather)",
                l.path
            )));
        }
        let g = &self.t.graph;
        let Some(out) = g.layer_output(&l.path) else { return Ok(()) };
        let dropout = |scope: &str| {
            self.t.layers.iter().find(|d| d.split == SplitRule::Pointwise && d.path == scope).map(|d| d.path.clone())
        };
        let (flow, _, drops) = g.follow(out, |scope, t| self.row_taking(scope, t), dropout);
        match flow {
            Flow::Into(rows) => {
                for m in &rows {
                    let p = self.plan.layer(m).expect("a planned row");
                    let node = self.t.layer(m).expect("checked by fits");
                    if let Style::Row { sizes: theirs, .. } = &p.style
                        && theirs != sizes
                    {
                        return Err(bad(format!(
                            "{} leaves its output split {sizes:?}, but {m} takes it split {theirs:?}",
                            l.path
                        )));
                    }
                    if geometry(node).and_then(|g| g.row).is_none_or(|r| !r.last) {
                        return Err(bad(format!(
                            "{m} takes {}'s split output, but its kernel does not sum over its input's last axis",
                            l.path
                        )));
                    }
                    self.done.insert(m.clone());
                }
            }
            Flow::Output if self.plan.output.as_deref() == Some(sizes) => self.output_reached = true,
            Flow::Output => {
                return Err(bad(format!(
                    "{} leaves the model's output split {sizes:?}, but the plan's output says {:?}: the loss would \
                     read a part as the whole",
                    l.path, self.plan.output
                )));
            }
            Flow::Breaks(op) => return Err(self.broken(l, out, &op)),
        }
        for d in drops {
            let axis = g.layer_input(&d).and_then(|i| g.shape(i)).map_or(0, |s| s.len().saturating_sub(1));
            let want = Style::Split { axis, sizes: sizes.to_vec() };
            if self.style(&d) != want {
                return Err(bad(format!(
                    "{d} is on {}'s split output, so it must be split like it ({want:?}); otherwise its dropout \
                     mask differs from the one a single device draws",
                    l.path
                )));
            }
            self.done.insert(d);
        }
        self.done.insert(l.path.clone());
        Ok(())
    }

    /// The error for a split that meets an op that needs the whole tensor: names the column
    /// layer, the op, and the row layers after it.
    fn broken(&self, l: &LayerPlan, out: weft_core::TensorId, op: &str) -> Error {
        let g = &self.t.graph;
        let after = g.downstream(out);
        let rows: Vec<&str> = self
            .plan
            .layers
            .iter()
            .filter(|m| matches!(m.style, Style::Row { scatter: false, .. }))
            .filter(|m| g.layer_input(&m.path).is_some_and(|i| after.contains(&i)))
            .map(|m| m.path.as_str())
            .collect();
        let partner = match rows.as_slice() {
            [] => String::new(),
            r => format!(" on its way to the row-split {}", r.join(", ")),
        };
        bad(format!(
            "{} is column-split and leaves its output split, but{partner} it meets {op}, which does not keep the \
             split: gather it (column+gather), or split the layers after it some other way",
            l.path
        ))
    }

    /// The error for a row layer that expects a split input no column layer gives it.
    fn unfed_row(&self, l: &LayerPlan) -> Error {
        let g = &self.t.graph;
        let from = g.layer_input(&l.path).and_then(|i| g.producer(i)).map_or("the model's input".to_string(), |n| {
            let at = if n.scope.is_empty() { String::new() } else { format!(" in {}", n.scope) };
            format!("{} of shape {:?}{at}", n.kind, n.shape)
        });
        bad(format!(
            "{} is row-split and takes its input split, but no column-split layer leaves it split: it comes whole \
             from {from}; scatter it (row+scatter) or pair it with the column layer before it",
            l.path
        ))
    }
}
