//! weft's WGSL compute shaders, one file per kernel family, and the few text substitutions that
//! specialise them (the op expression of an elementwise kernel, the element types of a cast).
//!
//! Every kernel starts with [`COMMON`] (the `info` binding and the strided-index helper). A kernel
//! is named by its family and variant; [`source`] returns the complete WGSL for a name, and
//! [`all_kernels`] lists every name so a test can validate each one with naga.
//!
//! ```
//! let wgsl = weft_shaders::source("unary/relu").unwrap();
//! assert!(wgsl.contains("max(x, 0.0)"));
//! ```

/// The prelude of every kernel.
pub const COMMON: &str = include_str!("../wgsl/common.wgsl");
/// Elementwise unary template (`{{OP}}` of `x`, `p0`, `p1`).
pub const UNARY: &str = include_str!("../wgsl/unary.wgsl");
/// Elementwise binary template (`{{OP}}` of `a`, `b`).
pub const BINARY: &str = include_str!("../wgsl/binary.wgsl");
/// Ternary select.
pub const WHERE: &str = include_str!("../wgsl/where.wgsl");
/// Strided 32-bit copy.
pub const COPY: &str = include_str!("../wgsl/copy.wgsl");
/// Up to six strided views joined along an axis (a concat) in one pass.
pub const CONCAT: &str = include_str!("../wgsl/concat.wgsl");
/// Constant fill.
pub const FILL: &str = include_str!("../wgsl/fill.wgsl");
/// Dtype conversion template.
pub const CAST: &str = include_str!("../wgsl/cast.wgsl");
/// Counter-based uniform random numbers.
pub const RAND: &str = include_str!("../wgsl/rand.wgsl");
/// Reductions template.
pub const REDUCE: &str = include_str!("../wgsl/reduce.wgsl");
/// Softmax / log-softmax template.
pub const SOFTMAX: &str = include_str!("../wgsl/softmax.wgsl");
/// Softmax's and log-softmax's backward template (`{{TERM}}` of `y`, `g`; `{{OUT}}` of `y`, `g`, `s`).
pub const SOFTMAX_GRAD: &str = include_str!("../wgsl/softmax_grad.wgsl");
/// Sparse cross-entropy's forward: each row's log-softmax at its label.
pub const CROSS_ENTROPY: &str = include_str!("../wgsl/cross_entropy.wgsl");
/// Sparse cross-entropy's backward: the logits' gradient.
pub const CROSS_ENTROPY_GRAD: &str = include_str!("../wgsl/cross_entropy_grad.wgsl");
/// A softmax row's max and exponentials' sum (with SOFTMAX and CROSS_ENTROPY, and ROW_TREE).
pub const ROW_MAX_SUM: &str = include_str!("../wgsl/row_max_sum.wgsl");
/// A workgroup's max or sum of its partial values (with ROW_MAX_SUM and SOFTMAX_GRAD).
pub const ROW_TREE: &str = include_str!("../wgsl/row_tree.wgsl");
/// Layer norm.
pub const LAYER_NORM: &str = include_str!("../wgsl/layer_norm.wgsl");
/// A short layer-norm row's mean and squared deviations (with LAYER_NORM and LAYER_NORM_GRAD).
pub const ROW_STATS: &str = include_str!("../wgsl/row_stats.wgsl");
/// Layer norm's backward (the input's gradient and `g * xhat`).
pub const LAYER_NORM_GRAD: &str = include_str!("../wgsl/layer_norm_grad.wgsl");
/// One LSTM cell step (h and the new state from the gates' pre-activations and the state).
pub const LSTM_CELL: &str = include_str!("../wgsl/lstm_cell.wgsl");
/// The LSTM cell step's backward (the gradients of the pre-activations and of the state).
pub const LSTM_CELL_GRAD: &str = include_str!("../wgsl/lstm_cell_grad.wgsl");
/// An LSTM unit's four gates and state (with LSTM_CELL and LSTM_CELL_GRAD).
pub const LSTM_GATES: &str = include_str!("../wgsl/lstm_gates.wgsl");
/// One GRU cell step (`reset_after`: the new state from the gates' two shares and the state).
pub const GRU_CELL: &str = include_str!("../wgsl/gru_cell.wgsl");
/// The GRU cell step's backward (the gradients of both shares and of the state).
pub const GRU_CELL_GRAD: &str = include_str!("../wgsl/gru_cell_grad.wgsl");
/// A GRU unit's gates (with GRU_CELL and GRU_CELL_GRAD).
pub const GRU_GATES: &str = include_str!("../wgsl/gru_gates.wgsl");
/// Tiled batched matmul.
pub const MATMUL: &str = include_str!("../wgsl/matmul.wgsl");
/// index_select and gather.
pub const INDEX: &str = include_str!("../wgsl/index.wgsl");
/// index_add and scatter_add.
pub const INDEX_ADD: &str = include_str!("../wgsl/index_add.wgsl");
/// The checked conversion of labels and ids to u32 indices.
pub const INDEX_CHECK: &str = include_str!("../wgsl/index_check.wgsl");
/// The tiled matmul with vec4 tile loads.
pub const MATMUL_VEC4: &str = include_str!("../wgsl/matmul_vec4.wgsl");
/// Register-blocked batched matmul without workgroup memory.
pub const MATMUL_DIRECT: &str = include_str!("../wgsl/matmul_direct.wgsl");
/// 2-D convolution and its input and kernel gradients (entry points `forward`, `input_grad`,
/// `kernel_grad`).
pub const CONV: &str = include_str!("../wgsl/conv.wgsl");
/// Max and average pooling (entry points `max_pool`, `avg_pool`).
pub const POOL: &str = include_str!("../wgsl/pool.wgsl");
/// The input gradient of pooling (entry points `max_grad`, `avg_grad`).
pub const POOL_GRAD: &str = include_str!("../wgsl/pool_grad.wgsl");
/// The window helpers both pooling kernels include.
pub const POOL_TAPS: &str = include_str!("../wgsl/pool_taps.wgsl");
/// Fused Adam update.
pub const ADAM: &str = include_str!("../wgsl/adam.wgsl");
/// A pure-FMA loop: the adapter's arithmetic ceiling, for benchmarks.
pub const FMA_PEAK: &str = include_str!("../wgsl/fma_peak.wgsl");

/// Unary ops: name and WGSL expression of `x` (and the parameters `p0`, `p1`).
pub const UNARY_OPS: &[(&str, &str)] = &[
    ("identity", "x"),
    ("neg", "-x"),
    ("abs", "abs(x)"),
    ("exp", "exp(x)"),
    ("log", "log(x)"),
    ("sqrt", "sqrt(x)"),
    ("rsqrt", "inverseSqrt(x)"),
    ("square", "x * x"),
    ("recip", "1.0 / x"),
    ("tanh", "tanh_(x)"),
    ("sigmoid", "sigmoid_(x)"),
    ("relu", "select(max(x, 0.0), x, is_nan_(x))"),
    ("gelu_tanh", "x / (1.0 + exp(-1.5957692 * (x + 0.044715 * x * x * x)))"),
    ("gelu_erf", "0.5 * x * (1.0 + erf_(x * 0.70710677))"),
    ("silu", "x / (1.0 + exp(-x))"),
    ("sin", "sin(x)"),
    ("cos", "cos(x)"),
    ("step", "select(select(0.0, 1.0, x > 0.0), x, is_nan_(x))"),
    ("sign", "select(sign(x), x, is_nan_(x))"),
    ("erf", "erf_(x)"),
    ("softsign", "x / (1.0 + abs(x))"),
    ("softplus", "select(max(x, 0.0) + log(1.0 + exp(-abs(x))), x, is_nan_(x))"),
    ("log_sigmoid", "select(min(x, 0.0) - log(1.0 + exp(-abs(x))), x, is_nan_(x))"),
    ("mish", "select(x * tanh_(max(x, 0.0) + log(1.0 + exp(-abs(x)))), x, is_nan_(x))"),
    ("relu6", "select(min(max(x, 0.0), 6.0), x, is_nan_(x))"),
    ("hard_sigmoid", "select(min(max((x + 3.0) * (1.0 / 6.0), 0.0), 1.0), x, is_nan_(x))"),
    ("hard_silu", "select(x * min(max((x + 3.0) * (1.0 / 6.0), 0.0), 1.0), x, is_nan_(x))"),
    // NaN fails both comparisons, so it takes the branch that keeps it.
    ("leaky_relu", "select(x, p0 * x, x < 0.0)"),
    ("elu", "select(x, p0 * (exp(min(x, 0.0)) - 1.0), x <= 0.0)"),
    ("affine", "x * p0 + p1"),
    ("powf", "pow_(x, p0)"),
    ("clamp", "select(min(max(x, p0), p1), x, is_nan_(x))"),
];

/// The activations' one-pass input gradients (`unary_grad/<op>`): the body of
/// `dun(x, p0, p1)`, the op's derivative at `x` (its input, or for tanh and sigmoid its output),
/// in the operations of the Cpu's `UnaryOp::grad_factor`. The kernel makes a NaN `x`'s gradient
/// NaN around every one (WGSL may assume there is none, so comparisons alone would drop it).
pub const UNARY_GRADS: &[(&str, &str)] = &[
    ("relu", "return select(0.0, 1.0, x > 0.0);"),
    ("tanh", "return x * x * -1.0 + 1.0;"),
    ("sigmoid", "return x * (x * -1.0 + 1.0);"),
    (
        "gelu_tanh",
        "let x2 = x * x;
    let s = 1.0 / (1.0 + exp(-(x * (x2 * 0.044715 + 1.0) * 1.5957692)));
    let du = x2 * 0.10703222 + 0.7978846;
    return s + x * (s * (s * -1.0 + 1.0)) * du * 2.0;",
    ),
    (
        "gelu_erf",
        "let cdf = erf_(x * 0.70710677) * 0.5 + 0.5;
    let pdf = exp(x * x * -0.5) * 0.3989423;
    return cdf + x * pdf;",
    ),
    (
        "silu",
        "let s = 1.0 / (1.0 + exp(-x));
    return s * (x * (s * -1.0 + 1.0) + 1.0);",
    ),
    ("erf", "return exp(-(x * x)) * 1.1283792;"),
    ("softsign", "let d = abs(x) + 1.0;\n    return 1.0 / (d * d);"),
    ("softplus", "return 1.0 / (1.0 + exp(-x));"),
    ("log_sigmoid", "return 1.0 / (1.0 + exp(-x)) * -1.0 + 1.0;"),
    (
        "mish",
        "let t = tanh_(max(x, 0.0) + log(1.0 + exp(-abs(x))));
    let s = 1.0 / (1.0 + exp(-x));
    return t + x * (t * t * -1.0 + 1.0) * s;",
    ),
    ("relu6", "return select(0.0, 1.0, x > 0.0 && x < 6.0);"),
    ("hard_sigmoid", "return select(0.0, 1.0 / 6.0, x > -3.0 && x < 3.0);"),
    (
        "hard_silu",
        "let inside = select(0.0, 1.0, x > -3.0 && x < 3.0);
    let hs = min(max((x + 3.0) * (1.0 / 6.0), 0.0), 1.0);
    return hs + inside * x * (1.0 / 6.0);",
    ),
    ("leaky_relu", "return select(0.0, 1.0, x >= 0.0) * (1.0 - p0) + p0;"),
    (
        "elu",
        "let pos = select(0.0, 1.0, x > 0.0);
    return pos + (pos * -1.0 + 1.0) * (exp(min(x, 0.0)) * p0);",
    ),
];

/// Binary ops: name and WGSL expression of `a` and `b`.
pub const BINARY_OPS: &[(&str, &str)] = &[
    ("add", "a + b"),
    ("sub", "a - b"),
    ("mul", "a * b"),
    ("div", "a / b"),
    ("pow", "pow_(a, b)"),
    ("maximum", "max_(a, b)"),
    ("minimum", "min_(a, b)"),
    ("eq", "select(0.0, 1.0, a == b)"),
    ("ne", "select(0.0, 1.0, a != b)"),
    ("lt", "select(0.0, 1.0, a < b)"),
    ("le", "select(0.0, 1.0, a <= b)"),
    ("gt", "select(0.0, 1.0, a > b)"),
    ("ge", "select(0.0, 1.0, a >= b)"),
];

/// Reductions: name, initial value, combine body (of `acc`, `ai`, `v`, `vi`), and whether the
/// partials carry an index (argmax).
const REDUCE_OPS: &[(&str, &str, &str, bool)] = &[
    ("sum", "0.0", "return Pair(acc + v, 0u);", false),
    ("max", "bitcast<f32>(0xff800000u)", "return Pair(max_(acc, v), 0u);", false),
    ("min", "bitcast<f32>(0x7f800000u)", "return Pair(min_(acc, v), 0u);", false),
    ("argmax", "bitcast<f32>(0xff800000u)", ARGMAX_COMBINE, true),
];

/// argmax's combine: a NaN beats any number, and between two NaNs or two equal values the
/// lower index wins (NumPy: the first maximum, or the first NaN).
const ARGMAX_COMBINE: &str = "let an = is_nan_(acc);
    let vn = is_nan_(v);
    if (an || vn) {
        if (an && vn && vi < ai) {
            return Pair(v, vi);
        }
        if (an) {
            return Pair(acc, ai);
        }
        return Pair(v, vi);
    }
    if (v > acc || (v == acc && vi < ai)) {
        return Pair(v, vi);
    }
    return Pair(acc, ai);";

/// The index bindings of a reduction whose partials carry one (argmax), and the no-op helpers
/// of one that does not.
const REDUCE_WITH_INDEX: &str = "@group(0) @binding(3) var<storage, read> xi_buf: array<u32>;
@group(0) @binding(4) var<storage, read_write> out_i: array<u32>;

// The index of the element at `off`: its position `r` in the run on the first pass, the index
// a partial carries on later passes.
fn index_at(off: u32, r: u32) -> u32 {
    if (info[7] != 0u) {
        return xi_buf[off];
    }
    return r;
}

fn store_index(o: u32, i: u32) {
    out_i[o] = i;
}";
const REDUCE_WITHOUT_INDEX: &str = "fn index_at(off: u32, r: u32) -> u32 {
    return 0u;
}

fn store_index(o: u32, i: u32) {}";

/// Casts: name, input type, output type, conversion of `v`.
const CASTS: &[(&str, &str, &str, &str)] = &[
    ("f32_f16", "f32", "f16", "f16(v)"),
    ("f16_f32", "f16", "f32", "f32(v)"),
    // A plain cast: negatives become 0, fractions are cut. `Tensor::to_index` is the checked one.
    ("f32_u32", "f32", "u32", "u32(max(v, 0.0))"),
    ("f32_i32", "f32", "i32", "i32(v)"),
    ("u32_f32", "u32", "f32", "f32(v)"),
    ("i32_f32", "i32", "f32", "f32(v)"),
    ("u32_i32", "u32", "i32", "bitcast<i32>(v)"),
    ("i32_u32", "i32", "u32", "bitcast<u32>(v)"),
];

/// Index checks: input type, and the check of `v` (returns (index, 1) or (0, 0)).
const INDEX_CHECKS: &[(&str, &str)] = &[
    (
        "f32",
        "if (!is_finite_(v) || v < 0.0 || v >= 4294967296.0 || floor(v) != v) {
        return vec2(0u, 0u);
    }
    return vec2(u32(v), 1u);",
    ),
    ("i32", "return vec2(u32(max(v, 0)), select(1u, 0u, v < 0));"),
    ("u32", "return vec2(v, 1u);"),
];

/// The register-blocked matmul for a `tm x tn` block per invocation in workgroups of `wx x wy`
/// invocations (16 x 16 or 64 x 1): the template with its setup, inner step and stores written
/// out as named scalars. `None` for a block outside 1..=16 or another workgroup shape.
pub fn matmul_direct_source(tm: usize, tn: usize, (wx, wy): (usize, usize)) -> Option<String> {
    if !(1..=16).contains(&tm) || !(1..=16).contains(&tn) || ![(16, 16), (64, 1)].contains(&(wx, wy)) {
        return None;
    }
    let mut setup = Vec::new();
    for i in 0..tm {
        setup.push(format!("    let ra_{i} = a_base + min(row0 + {i}u, m - 1u) * a_rs;"));
    }
    for j in 0..tn {
        setup.push(format!("    let cb_{j} = b_base + min(col0 + {}u, n - 1u) * b_cs;", wx * j));
    }
    for i in 0..tm {
        let row: Vec<String> = (0..tn).map(|j| format!("var c_{i}_{j} = 0.0;")).collect();
        setup.push(format!("    {}", row.join(" ")));
    }
    let mut step = Vec::new();
    for i in 0..tm {
        step.push(format!("        let a_{i} = a[ra_{i} + ka];"));
    }
    for j in 0..tn {
        step.push(format!("        let b_{j} = b[cb_{j} + kb];"));
    }
    for i in 0..tm {
        let row: Vec<String> = (0..tn).map(|j| format!("c_{i}_{j} = c_{i}_{j} + a_{i} * b_{j};")).collect();
        step.push(format!("        {}", row.join(" ")));
    }
    let mut store = Vec::new();
    for i in 0..tm {
        for j in 0..tn {
            let (r, col) = (format!("row0 + {i}u"), format!("col0 + {}u", wx * j));
            store.push(format!(
                "    if ({r} < m && {col} < n) {{ c[out + ({r}) * n + {col}] = epilogue(c_{i}_{j}, {col}); }}"
            ));
        }
    }
    Some(
        MATMUL_DIRECT
            .replace("{{WX}}", &wx.to_string())
            .replace("{{WY}}", &wy.to_string())
            .replace("{{TM}}", &tm.to_string())
            .replace("{{TN}}", &tn.to_string())
            .replace("{{SETUP}}", &setup.join("\n"))
            .replace("{{STEP}}", &step.join("\n"))
            .replace("{{STORE}}", &store.join("\n")),
    )
}

/// What a reduction stores for the value `v` of output `o`: `v` itself, or with an op (a split
/// product's sum), `op(v + bias[o % columns])` from a bias at binding 3 (its first value at info
/// 40, the columns at 41) and the op's parameters at info 42 and 43.
fn reduce_finish(op: Option<&str>) -> Option<String> {
    store_hook(op, "finish(o: u32, v: f32)", 3, "info[40] + o % info[41]", 42)
}

/// What a matmul kernel stores for the sum `v` of output column `col`: `v` itself, or with an
/// op, `op(v + bias[col])` from a bias at binding 4 (its first value at info 25) and the op's
/// parameters at info 23 and 24 (after the product's own info).
fn matmul_epilogue(op: Option<&str>) -> Option<String> {
    store_hook(op, "epilogue(v: f32, col: u32)", 4, "info[25] + col", 23)
}

/// A kernel's store hook `fn {signature} -> f32`: `v` itself, or with an op, `op(v + bias[{at}])`
/// (the sum `add_unary` forms, so the same bits as the two ops) from a bias at `binding` and the
/// op's parameters at info `params` and `params + 1`; `None` for an unknown op.
fn store_hook(op: Option<&str>, signature: &str, binding: u32, at: &str, params: u32) -> Option<String> {
    let Some(op) = op else {
        return Some(format!("fn {signature} -> f32 {{\n    return v;\n}}\n"));
    };
    Some(format!(
        "@group(0) @binding({binding}) var<storage, read> bias: array<f32>;\n{}\
         fn {signature} -> f32 {{\n    return un(v + bias[{at}], param({params}u), param({}u));\n}}\n",
        un_fn(op)?,
        params + 1
    ))
}

/// `fn un(x, p0, p1)`: the unary op `op` of UNARY_OPS as a WGSL function; `None` for an unknown op.
fn un_fn(op: &str) -> Option<String> {
    let expr = UNARY_OPS.iter().find(|(n, _)| *n == op)?.1;
    Some(format!("fn un(x: f32, p0: f32, p1: f32) -> f32 {{\n    return {expr};\n}}\n"))
}

fn with_common(body: &str) -> String {
    // `enable` directives must come before any declaration.
    if let Some(rest) = body.strip_prefix("enable f16;\n") {
        format!("enable f16;\n{COMMON}\n{rest}")
    } else {
        format!("{COMMON}\n{body}")
    }
}

/// The complete WGSL of a kernel named `family/variant`, e.g. `unary/exp`, `binary/add`,
/// `reduce/argmax`, `softmax/log`, `cast/f32_f16`, `matmul/tiled`; `None` for an unknown name.
pub fn source(name: &str) -> Option<String> {
    let (family, variant) = name.split_once('/').unwrap_or((name, ""));
    let body = match family {
        "unary" => {
            let expr = UNARY_OPS.iter().find(|(n, _)| *n == variant)?.1;
            UNARY.replace("{{OP}}", expr)
        }
        "binary" => {
            let expr = BINARY_OPS.iter().find(|(n, _)| *n == variant)?.1;
            BINARY.replace("{{OP}}", expr)
        }
        // `op(a + b)` in one pass (a dense layer's bias and activation): the binary kernel whose
        // op applies the unary one, with that op's parameters after the binary info (28, 29).
        "add_unary" => {
            format!("{}\n{}", BINARY.replace("{{OP}}", "un(a + b, param(28u), param(29u))"), un_fn(variant)?)
        }
        // `b * op'(a)` in one pass (an activation's input gradient): the binary kernel whose op
        // multiplies the output's gradient `b` by the derivative at `a`, parameters as add_unary's.
        "unary_grad" => {
            let body = UNARY_GRADS.iter().find(|(n, _)| *n == variant)?.1;
            let dun = format!("fn dun(x: f32, p0: f32, p1: f32) -> f32 {{\n    {body}\n}}\n");
            format!("{}\n{dun}", BINARY.replace("{{OP}}", "b * select(dun(a, param(28u), param(29u)), a, is_nan_(a))"))
        }
        // `reduce/sum`, or with a bias and an op applied to each value stored, `reduce/sum/relu`.
        "reduce" => {
            let (variant, op) = variant.split_once('/').map_or((variant, None), |(v, op)| (v, Some(op)));
            let (_, init, combine, with_index) = REDUCE_OPS.iter().find(|r| r.0 == variant)?;
            if op.is_some() && variant != "sum" {
                return None;
            }
            let index = if *with_index { REDUCE_WITH_INDEX } else { REDUCE_WITHOUT_INDEX };
            let body = REDUCE.replace("{{INDEX}}", index).replace("{{INIT}}", init).replace("{{COMBINE}}", combine);
            format!("{body}\n{}", reduce_finish(op)?)
        }
        "softmax" => match variant {
            "softmax" => format!("{}\n{ROW_MAX_SUM}\n{ROW_TREE}", SOFTMAX.replace("{{OUT}}", "exp(v - m) / s")),
            "log" => format!("{}\n{ROW_MAX_SUM}\n{ROW_TREE}", SOFTMAX.replace("{{OUT}}", "v - m - log(s)")),
            _ => return None,
        },
        "softmax_grad" => match variant {
            "softmax" => {
                format!("{}\n{ROW_TREE}", SOFTMAX_GRAD.replace("{{TERM}}", "g * y").replace("{{OUT}}", "y * (g - s)"))
            }
            // (A NaN in y stays out of the sum: tested on the bits, as exp may not keep it.)
            "log" => format!(
                "{}\n{ROW_TREE}",
                SOFTMAX_GRAD.replace("{{TERM}}", "g").replace("{{OUT}}", "select(g - exp(y) * s, y, is_nan_(y))")
            ),
            _ => return None,
        },
        "cast" => {
            let (_, i, o, conv) = CASTS.iter().find(|c| c.0 == variant)?;
            let body = CAST.replace("{{IN}}", i).replace("{{OUT}}", o).replace("{{CONV}}", conv);
            if variant.contains("f16") { format!("enable f16;\n{body}") } else { body }
        }
        "where" if variant.is_empty() => WHERE.to_string(),
        "copy" if variant.is_empty() => COPY.to_string(),
        "concat" if variant.is_empty() => CONCAT.to_string(),
        "cross_entropy" if variant.is_empty() => format!("{CROSS_ENTROPY}\n{ROW_MAX_SUM}\n{ROW_TREE}"),
        "cross_entropy_grad" if variant.is_empty() => CROSS_ENTROPY_GRAD.to_string(),
        "fill" if variant.is_empty() => FILL.to_string(),
        "rand" if variant.is_empty() => RAND.to_string(),
        "layer_norm" if variant.is_empty() => format!("{LAYER_NORM}\n{ROW_STATS}"),
        "layer_norm_grad" if variant.is_empty() => format!("{LAYER_NORM_GRAD}\n{ROW_STATS}"),
        "gru_cell" if variant.is_empty() => format!("{GRU_CELL}\n{GRU_GATES}"),
        "gru_cell_grad" if variant.is_empty() => format!("{GRU_CELL_GRAD}\n{GRU_GATES}"),
        "lstm_cell" if variant.is_empty() => format!("{LSTM_CELL}\n{LSTM_GATES}"),
        "lstm_cell_grad" if variant.is_empty() => format!("{LSTM_CELL_GRAD}\n{LSTM_GATES}"),
        // `matmul/direct8x8`, or with a bias and an op applied to each value stored,
        // `matmul/direct8x8/relu` (a dense layer's forward in one pass).
        "matmul" => {
            let (variant, op) = variant.split_once('/').map_or((variant, None), |(v, op)| (v, Some(op)));
            let body = match variant {
                "tiled" => MATMUL.to_string(),
                "tiled_vec4" => MATMUL_VEC4.to_string(),
                _ => {
                    // `direct8x8`, `rows1x4`: the workgroup's shape and the register block are
                    // in the name.
                    let (block, wg) = match variant.strip_prefix("direct") {
                        Some(block) => (block, (16, 16)),
                        None => (variant.strip_prefix("rows")?, (64, 1)),
                    };
                    let (tm, tn) = block.split_once('x')?;
                    matmul_direct_source(tm.parse().ok()?, tn.parse().ok()?, wg)?
                }
            };
            format!("{body}\n{}", matmul_epilogue(op)?)
        }
        "index" if variant.is_empty() => INDEX.to_string(),
        "index_add" if variant.is_empty() => INDEX_ADD.to_string(),
        "index_check" => {
            let (ty, check) = INDEX_CHECKS.iter().find(|c| c.0 == variant)?;
            INDEX_CHECK.replace("{{IN}}", ty).replace("{{CHECK}}", check)
        }
        "fma_peak" if variant.is_empty() => FMA_PEAK.to_string(),
        "adam" if variant.is_empty() => ADAM.to_string(),
        "conv" if variant.is_empty() => CONV.to_string(),
        "pool" if variant.is_empty() => format!("{POOL}\n{POOL_TAPS}"),
        "pool_grad" if variant.is_empty() => format!("{POOL_GRAD}\n{POOL_TAPS}"),
        _ => return None,
    };
    Some(with_common(&body))
}

/// Every kernel name [`source`] knows.
pub fn all_kernels() -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    names.extend(UNARY_OPS.iter().map(|(n, _)| format!("unary/{n}")));
    names.extend(BINARY_OPS.iter().map(|(n, _)| format!("binary/{n}")));
    names.extend(UNARY_OPS.iter().map(|(n, _)| format!("add_unary/{n}")));
    names.extend(UNARY_GRADS.iter().map(|(n, _)| format!("unary_grad/{n}")));
    names.extend(REDUCE_OPS.iter().map(|r| format!("reduce/{}", r.0)));
    names.extend(UNARY_OPS.iter().map(|(n, _)| format!("reduce/sum/{n}")));
    names.extend(CASTS.iter().map(|c| format!("cast/{}", c.0)));
    names.extend(INDEX_CHECKS.iter().map(|c| format!("index_check/{}", c.0)));
    names.extend(["softmax/softmax", "softmax/log", "softmax_grad/softmax", "softmax_grad/log"].map(String::from));
    // Each matmul as it is and with an epilogue; every op's epilogue on the tiled kernel.
    for v in ["tiled", "tiled_vec4", "direct4x4", "direct8x8", "direct16x16", "rows1x4", "rows4x4"] {
        names.extend([format!("matmul/{v}"), format!("matmul/{v}/relu")]);
    }
    names.extend(UNARY_OPS.iter().filter(|(n, _)| *n != "relu").map(|(n, _)| format!("matmul/tiled/{n}")));
    names.extend(
        [
            "where",
            "copy",
            "concat",
            "cross_entropy",
            "cross_entropy_grad",
            "fill",
            "rand",
            "layer_norm",
            "layer_norm_grad",
            "gru_cell",
            "gru_cell_grad",
            "lstm_cell",
            "lstm_cell_grad",
            "index",
            "index_add",
            "fma_peak",
            "adam",
            "conv",
            "pool",
            "pool_grad",
        ]
        .map(String::from),
    );
    names
}
