//! `Model::summary` in Keras 3's layout: a boxed table of the model's layers (each by its own
//! name and type, its output shape with `None` for the axes the model leaves free, and its
//! parameters, sublayers included), then the totals. With `expand_nested` each layer's sublayers
//! follow it, indented with `└`.

use crate::Layer;
use weft_core::trace::TraceNode;

/// One row: name (with its indent) and type, output shape, parameters.
struct Row {
    name: String,
    shape: String,
    params: usize,
}

/// The table for `net`, from the nodes of a trace of one call (`nodes`) and of calls with the
/// batch and, where the model allows, the other axes changed (`varied`): an axis whose size
/// differs between them is free, shown as `None`.
pub(crate) fn render(
    net: &dyn Layer,
    nodes: &[TraceNode],
    varied: &[&[TraceNode]],
    expand_nested: bool,
    optimizer_params: Option<usize>,
) -> String {
    let mut rows = Vec::new();
    let subs = net.sublayers();
    if subs.is_empty() {
        add_rows(net, "", 0, nodes, varied, expand_nested, None, &mut rows);
    } else {
        let mut previous: Option<String> = None;
        for s in subs {
            let sequential = net.kind() == "Sequential";
            previous =
                add_rows(s, net.name(), 0, nodes, varied, expand_nested, previous.filter(|_| sequential), &mut rows);
        }
    }
    let count = |trainable: bool| -> usize {
        net.variables().iter().filter(|(_, v)| v.is_trainable() == trainable).map(|(_, v)| v.numel()).sum()
    };
    table(net.name(), &rows, (count(true), count(false)), optimizer_params)
}

/// The row of `l` (and, expanded, its sublayers'); returns its output shape. A layer that
/// recorded no op of its own (dropout at inference) passes its input on: inside a Sequential,
/// the shape of the row before it (`previous`).
#[allow(clippy::too_many_arguments)]
fn add_rows(
    l: &dyn Layer,
    prefix: &str,
    level: usize,
    nodes: &[TraceNode],
    varied: &[&[TraceNode]],
    expand_nested: bool,
    previous: Option<String>,
    rows: &mut Vec<Row>,
) -> Option<String> {
    let path = crate::layer::join(prefix, l.name());
    let shape = output_shape(&path, nodes, varied).or(previous);
    let indent = if level == 0 { String::new() } else { format!("{}└ ", "   ".repeat(level)) };
    rows.push(Row {
        name: format!("{indent}{} ({})", l.name(), l.kind()),
        shape: shape.clone().unwrap_or_else(|| "?".into()),
        params: l.variables().iter().map(|(_, v)| v.numel()).sum(),
    });
    if expand_nested {
        let sequential = l.kind() == "Sequential";
        let mut prev: Option<String> = None;
        for s in l.sublayers() {
            prev = add_rows(s, &path, level + 1, nodes, varied, true, prev.filter(|_| sequential), rows);
        }
    }
    shape
}

/// The shape of the last tensor made inside `path`, `None` for axes whose size changed in a
/// varied trace (the batch always does).
fn output_shape(path: &str, nodes: &[TraceNode], varied: &[&[TraceNode]]) -> Option<String> {
    let inside = |n: &&TraceNode| n.scope == path || n.scope.starts_with(&format!("{path}/"));
    let shape = &nodes.iter().rev().find(inside)?.shape;
    let other: Vec<&Vec<usize>> = varied.iter().filter_map(|v| v.iter().rev().find(inside).map(|n| &n.shape)).collect();
    let dims: Vec<String> = shape
        .iter()
        .enumerate()
        .map(|(a, d)| {
            let free = a == 0 || other.iter().any(|o| o.len() == shape.len() && o[a] != *d);
            if free { "None".to_string() } else { d.to_string() }
        })
        .collect();
    Some(format!("({})", dims.join(", ")))
}

/// The boxed table and the totals, drawn as Keras draws them.
fn table(name: &str, rows: &[Row], (trainable, fixed): (usize, usize), optimizer_params: Option<usize>) -> String {
    let header = ["Layer (type)", "Output Shape", "Param #"];
    let cells: Vec<[String; 3]> = rows.iter().map(|r| [r.name.clone(), r.shape.clone(), thousands(r.params)]).collect();
    // Keras' widths when it does not print to a terminal (76 columns), wider where a cell needs it.
    let mut w = [31, 22, 13];
    for c in cells.iter().chain(std::iter::once(&header.map(String::from))) {
        for (i, s) in c.iter().enumerate() {
            w[i] = w[i].max(s.chars().count());
        }
    }
    let line = |l: &str, fill: &str, mid: &str, r: &str| {
        let parts: Vec<String> = w.iter().map(|&n| fill.repeat(n + 2)).collect();
        format!("{l}{}{r}\n", parts.join(mid))
    };
    let row = |c: &[String; 3], bar: &str| {
        format!("{bar} {:<a$} {bar} {:<b$} {bar} {:>p$} {bar}\n", c[0], c[1], c[2], a = w[0], b = w[1], p = w[2])
    };
    let mut s = format!("Model: \"{name}\"\n");
    s += &line("┏", "━", "┳", "┓");
    s += &row(&header.map(String::from), "┃");
    s += &line("┡", "━", "╇", "┩");
    for (i, c) in cells.iter().enumerate() {
        if i > 0 {
            s += &line("├", "─", "┼", "┤");
        }
        s += &row(c, "│");
    }
    s += &line("└", "─", "┴", "┘");
    let opt = optimizer_params.unwrap_or(0);
    let total = trainable + fixed + opt;
    s += &format!(" Total params: {} ({})\n", thousands(total), bytes(4 * total));
    s += &format!(" Trainable params: {} ({})\n", thousands(trainable), bytes(4 * trainable));
    s += &format!(" Non-trainable params: {} ({})\n", thousands(fixed), bytes(4 * fixed));
    if let Some(n) = optimizer_params {
        s += &format!(" Optimizer params: {} ({})\n", thousands(n), bytes(4 * n));
    }
    s
}

/// `1234567` as `1,234,567`.
pub(crate) fn thousands(n: usize) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A byte count as Keras writes it: two decimals and the largest unit under 1,024.
pub(crate) fn bytes(n: usize) -> String {
    let mut v = n as f64;
    for unit in ["B", "KB", "MB", "GB", "TB"] {
        if v < 1024.0 {
            return format!("{v:.2} {unit}");
        }
        v /= 1024.0;
    }
    format!("{v:.2} PB")
}
