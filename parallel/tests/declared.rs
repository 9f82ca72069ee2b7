//! Layers of one's own are planned from what they declare (`Layer::split_rule`), never from
//! their kind or name, and their containers need no `trace::scope` call:
//!
//! - an attention layer written from four plain Dense layers (heads flat in their outputs), with
//!   a dropout on its probabilities, declares its heads and gets the by-heads split with the same
//!   collectives as the built-in MultiHeadAttention; trained sharded over 2 and 3 devices (4 heads
//!   over 3: uneven) it equals one device, weights drawn by the shards themselves included;
//! - a linear layer of one's own, built with `tp::variable` and run with `tp::linear`, is paired
//!   column then row like Dense;
//! - a layer that calls itself `MultiHeadAttention` but declares nothing is not split by heads;
//! - a declaration the layer cannot honour keeps the layer whole with the reason in the plan, and
//!   is an `Err` naming it when a split is asked for;
//! - only what runs on the split heads is split, and weights a declaration does not name keep
//!   the layer whole.

use std::sync::OnceLock;
use weft_core::{Device, Result, Tensor, Var};
use weft_nn::layers::{Dense, Dropout, LayerNormalization, MultiHeadAttention};
use weft_nn::optim::Adam;
use weft_nn::split::{HeadSplit, LinearSplit, SplitAxis};
use weft_nn::{Activation, Ctx, Initializer, Layer, Loss, Sequential, SplitRule, sublayer_variables, tp};
use weft_parallel::{AutoConfig, DeviceMesh, ShardingPlan, Split, VerifyOptions, verify_with};

/// Self-attention from plain Dense layers; it opens no scope of its own.
struct MyAttention {
    name: String,
    kind: &'static str,
    heads: usize,
    head_dim: usize,
    declare: bool,
    q: Dense,
    k: Dense,
    v: Dense,
    o: Dense,
    drop: Dropout,
    /// A dropout on the whole output, inside the layer (after the output projection).
    resid: Dropout,
    /// A normalisation of each head's queries (weights outside the projections).
    qk_norm: Option<LayerNormalization>,
}

impl MyAttention {
    fn new(name: &str, heads: usize, head_dim: usize, width: usize) -> Self {
        MyAttention {
            name: name.into(),
            kind: "MyAttention",
            heads,
            head_dim,
            declare: true,
            q: Dense::new(heads * head_dim).named("q"),
            k: Dense::new(heads * head_dim).named("k"),
            v: Dense::new(heads * head_dim).named("v"),
            o: Dense::new(width).named("o"),
            drop: Dropout::new(0.1).named("dropout"),
            resid: Dropout::new(0.0).named("resid_dropout"),
            qk_norm: None,
        }
    }
}

impl Layer for MyAttention {
    fn call(&self, x: &Tensor, ctx: &mut Ctx) -> Result<Tensor> {
        let (b, t) = (x.dims()[0], x.dims()[1]);
        // The heads this device holds: as many as its projections give it.
        let heads = |y: Tensor| {
            let h = y.dims()[2] / self.head_dim;
            y.reshape(&[b, t, h, self.head_dim])
        };
        let mut q = heads(self.q.call(x, ctx)?)?.mul_scalar(1.0 / (self.head_dim as f32).sqrt())?;
        if let Some(n) = &self.qk_norm {
            q = n.call(&q, ctx)?;
        }
        let k = heads(self.k.call(x, ctx)?)?;
        let v = heads(self.v.call(x, ctx)?)?;
        let probs = Tensor::einsum("bthd,bshd->bhts", &[&q, &k])?.softmax(-1)?;
        let probs = self.drop.call(&probs, ctx)?;
        let out = Tensor::einsum("bhts,bshd->bthd", &[&probs, &v])?;
        let h = out.dims()[2];
        self.resid.call(&self.o.call(&out.reshape(&[b, t, h * self.head_dim])?, ctx)?, ctx)
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn set_name(&mut self, name: String) {
        self.name = name;
    }
    fn kind(&self) -> &'static str {
        self.kind
    }
    fn variables(&self) -> Vec<(String, Var)> {
        sublayer_variables(self.sublayers())
    }
    fn sublayers(&self) -> Vec<&dyn Layer> {
        let mut v: Vec<&dyn Layer> = vec![&self.q, &self.k, &self.v, &self.o, &self.drop, &self.resid];
        if let Some(n) = &self.qk_norm {
            v.push(n);
        }
        v
    }
    fn split_rule(&self) -> SplitRule {
        if !self.declare {
            return SplitRule::undeclared(self.kind);
        }
        SplitRule::Heads(HeadSplit {
            heads: self.heads,
            projections: vec!["q".into(), "k".into(), "v".into()],
            output: "o".into(),
            inner_axis: 1,
        })
    }
}

/// A block of one's own: attention, then an MLP, each with a residual; no scope either.
struct MyBlock {
    name: String,
    attn: Box<dyn Layer>,
    up: Dense,
    down: Dense,
}

impl Layer for MyBlock {
    fn call(&self, x: &Tensor, ctx: &mut Ctx) -> Result<Tensor> {
        let x = x.add(&self.attn.call(x, ctx)?)?;
        x.add(&self.down.call(&self.up.call(&x, ctx)?, ctx)?)
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn set_name(&mut self, name: String) {
        self.name = name;
    }
    fn kind(&self) -> &'static str {
        "MyBlock"
    }
    fn variables(&self) -> Vec<(String, Var)> {
        sublayer_variables(self.sublayers())
    }
    fn sublayers(&self) -> Vec<&dyn Layer> {
        vec![self.attn.as_ref(), &self.up, &self.down]
    }
}

const WIDTH: usize = 8;

fn net_with(attn: impl Layer + 'static) -> Sequential {
    let block = MyBlock {
        name: "block".into(),
        attn: Box::new(attn),
        up: Dense::new(16).activation(Activation::Gelu).named("up"),
        down: Dense::new(WIDTH).named("down"),
    };
    Sequential::new().named("net").add(Dense::new(WIDTH).named("embed")).add(block).add(Dense::new(3).named("head"))
}

fn mine() -> Sequential {
    net_with(MyAttention::new("attn", 4, 3, WIDTH))
}

fn plan(net: &dyn Layer, n: usize) -> ShardingPlan {
    AutoConfig::new().min_params(0).loss(Loss::MeanSquaredError).plan(net, &[4, 5, 6], n, 1).unwrap()
}

#[test]
fn an_attention_layer_of_ones_own_is_split_by_the_heads_it_declares() {
    let p = plan(&mine(), 2);
    for name in ["q", "k", "v"] {
        let l = p.layer(&format!("net/block/attn/{name}")).unwrap();
        // 4 heads of 3 over 2 devices: 2 heads, 6 columns each.
        assert_eq!(l.style, tp::Style::Column { sizes: vec![6, 6], gather: false }, "{p}");
    }
    assert_eq!(p.layer("net/block/attn/o").unwrap().style, tp::Style::Row { sizes: vec![6, 6], scatter: false });
    assert_eq!(p.layer("net/block/attn/dropout").unwrap().style, tp::Style::Split { axis: 1, sizes: vec![2, 2] });
    // The MLP inside the block (which opened no scope) is found and paired.
    assert_eq!(p.layer("net/block/up").unwrap().style.name(), "column", "{p}");
    assert_eq!(p.layer("net/block/down").unwrap().style.name(), "row", "{p}");

    // The same collectives as the built-in attention in its place: one shared f backward, one
    // all-reduce forward.
    let builtin = plan(&net_with(MultiHeadAttention::new(4, 3).dropout(0.1).named("attn")), 2);
    let at = |p: &ShardingPlan| {
        let mut v: Vec<(String, String, u64)> = p
            .collectives
            .iter()
            .filter(|c| c.at.starts_with("net/block/attn"))
            .map(|c| (c.op.clone(), c.pass.clone(), c.bytes))
            .collect();
        v.sort();
        v
    };
    assert_eq!(at(&p), at(&builtin), "{p}\n{builtin}");
    assert_eq!(at(&p).len(), 2, "{p}");
    p.check_model(&mine()).unwrap();
}

#[test]
fn an_attention_layer_of_ones_own_trains_sharded_as_on_one_device() {
    let x = Tensor::rand(-1.0, 1.0, &[16, 5, 6], 1, &Device::Cpu).unwrap();
    let y = Tensor::rand(-1.0, 1.0, &[16, 5, 3], 2, &Device::Cpu).unwrap();
    for n in [2, 3] {
        let mesh = DeviceMesh::cpus(n).unwrap();
        let p = plan(&mine(), n);
        let options = VerifyOptions { own_init: true, ..VerifyOptions::rows(&x, &y, 4, 8).unwrap() };
        let report = verify_with(mine, &mesh, &p, Adam::new(0.01), Loss::MeanSquaredError, options).unwrap();
        assert!(report.max_rel() < 1e-4, "{n} devices:\n{report}\n{p}");
        assert!(report.losses.last().unwrap().0 < report.losses[0].0, "the loss did not fall: {report}");
    }
}

#[test]
fn the_planner_reads_declarations_not_kinds() {
    let mut pretender = MyAttention::new("attn", 4, 3, WIDTH);
    pretender.kind = "MultiHeadAttention";
    pretender.declare = false;
    let p = plan(&net_with(pretender), 2);
    let q = p.layer("net/block/attn/q").unwrap();
    assert_ne!(q.style, tp::Style::Column { sizes: vec![6, 6], gather: false }, "{p}");
    assert!(p.layers.iter().all(|l| !matches!(l.style, tp::Style::Split { .. })), "{p}");

    // 5 heads cannot come out of projections of 12 columns: the attention stays whole and the
    // plan says why; asked to split it anyway, the planner refuses by name.
    let liar = || net_with(MyAttention { heads: 5, ..MyAttention::new("attn", 4, 3, WIDTH) });
    let p = plan(&liar(), 2);
    let q = p.layer("net/block/attn/q").unwrap();
    assert_eq!(q.style, tp::Style::Replicated, "{p}");
    assert!(
        q.reason.contains("net/block/attn declares 5 heads") && q.reason.contains("net/block/attn/q"),
        "{}",
        q.reason
    );
    let forced = AutoConfig::new().min_params(0).override_layer("net/block/attn", Split::Column);
    let err = forced.plan(&liar(), &[4, 5, 6], 2, 1).unwrap_err().to_string();
    assert!(err.contains("net/block/attn declares 5 heads"), "{err}");
}

/// `activation(x @ kernel)` with its own weights, through the public helpers.
struct MyLinear {
    name: String,
    units: usize,
    activation: Activation,
    kernel: OnceLock<Var>,
}

impl MyLinear {
    fn new(name: &str, units: usize, activation: Activation) -> Self {
        MyLinear { name: name.into(), units, activation, kernel: OnceLock::new() }
    }
}

impl Layer for MyLinear {
    fn call(&self, x: &Tensor, ctx: &mut Ctx) -> Result<Tensor> {
        let kernel = match self.kernel.get() {
            Some(k) => k,
            None => {
                // Under a row split the input arrives split: the kernel is made for the whole.
                let shape = [tp::input_size(self, ctx, x.dims()[x.rank() - 1]), self.units];
                let k = tp::variable(self, ctx, "kernel", x.device(), Initializer::GlorotUniform, &shape, 7)?;
                self.kernel.get_or_init(|| k)
            }
        };
        let last = x.rank() - 1;
        tp::linear(self, ctx, x, (last, last), |x| x.matmul(kernel), None, self.activation)
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn set_name(&mut self, name: String) {
        self.name = name;
    }
    fn kind(&self) -> &'static str {
        "MyLinear"
    }
    fn variables(&self) -> Vec<(String, Var)> {
        self.kernel.get().map(|k| vec![("kernel".to_string(), k.clone())]).unwrap_or_default()
    }
    fn split_rule(&self) -> SplitRule {
        SplitRule::Linear(LinearSplit {
            kernel: "kernel".into(),
            bias: None,
            column: Some(SplitAxis { kernel: 1, last: true }),
            column_bias: None,
            row: Some(SplitAxis { kernel: 0, last: true }),
        })
    }
}

#[test]
fn a_linear_layer_of_ones_own_pairs_like_dense_and_trains_as_on_one_device() {
    let net = || {
        Sequential::new().named("net").add(MyLinear::new("up", 12, Activation::Relu)).add(MyLinear::new(
            "down",
            4,
            Activation::Linear,
        ))
    };
    let p = AutoConfig::new().min_params(0).loss(Loss::MeanSquaredError).plan(&net(), &[4, 6], 2, 1).unwrap();
    assert_eq!(p.layer("net/up").unwrap().style, tp::Style::Column { sizes: vec![6, 6], gather: false }, "{p}");
    assert_eq!(p.layer("net/down").unwrap().style, tp::Style::Row { sizes: vec![6, 6], scatter: false }, "{p}");
    let x = Tensor::rand(-1.0, 1.0, &[16, 6], 3, &Device::Cpu).unwrap();
    let y = Tensor::rand(-1.0, 1.0, &[16, 4], 4, &Device::Cpu).unwrap();
    let mesh = DeviceMesh::cpus(2).unwrap();
    let options = VerifyOptions { own_init: true, ..VerifyOptions::rows(&x, &y, 4, 6).unwrap() };
    let report = verify_with(net, &mesh, &p, Adam::new(0.01), Loss::MeanSquaredError, options).unwrap();
    assert!(report.max_rel() < 1e-4, "{report}\n{p}");
}

/// Only what runs on the split heads is split like them: a dropout on the whole output inside
/// the layer stays whole (2 heads over 2 devices: one head each, where a wrong split would
/// broadcast silently), a dropout that never runs is not in the plan's way, and weights the
/// declaration does not name (a norm of the queries) keep the whole attention whole, with the
/// reason, rather than train on part of their gradient.
#[test]
fn only_what_runs_on_the_split_heads_is_split() {
    let x = Tensor::rand(-1.0, 1.0, &[16, 5, 6], 1, &Device::Cpu).unwrap();
    let y = Tensor::rand(-1.0, 1.0, &[16, 5, 3], 2, &Device::Cpu).unwrap();
    let resid = || {
        let mut a = MyAttention::new("attn", 2, 3, WIDTH);
        a.resid = Dropout::new(0.3).named("resid_dropout");
        net_with(a)
    };
    let p = plan(&resid(), 2);
    assert_eq!(p.layer("net/block/attn/dropout").unwrap().style, tp::Style::Split { axis: 1, sizes: vec![1, 1] });
    assert!(p.layer("net/block/attn/resid_dropout").is_none_or(|l| l.style == tp::Style::Replicated), "{p}");
    let mesh = DeviceMesh::cpus(2).unwrap();
    let options = VerifyOptions { own_init: true, ..VerifyOptions::rows(&x, &y, 4, 6).unwrap() };
    let report = verify_with(resid, &mesh, &p, Adam::new(0.01), Loss::MeanSquaredError, options).unwrap();
    assert!(report.max_rel() < 1e-4, "{report}\n{p}");

    // The attention's own dropout at rate 0 draws nothing: the plan still checks.
    let quiet = || {
        let mut a = MyAttention::new("attn", 4, 3, WIDTH);
        a.drop = Dropout::new(0.0).named("dropout");
        net_with(a)
    };
    plan(&quiet(), 2).check_model(&quiet()).unwrap();

    let normed = || {
        let mut a = MyAttention::new("attn", 4, 3, WIDTH);
        a.qk_norm = Some(LayerNormalization::new().named("qk_norm"));
        net_with(a)
    };
    let p = plan(&normed(), 2);
    let q = p.layer("net/block/attn/q").unwrap();
    assert_eq!(q.style, tp::Style::Replicated, "{p}");
    assert!(q.reason.contains("net/block/attn/qk_norm has variables"), "{}", q.reason);
    p.check_model(&normed()).unwrap();
    let options = VerifyOptions { own_init: true, ..VerifyOptions::rows(&x, &y, 4, 4).unwrap() };
    let report = verify_with(normed, &mesh, &p, Adam::new(0.01), Loss::MeanSquaredError, options).unwrap();
    assert!(report.max_rel() < 1e-4, "{report}\n{p}");
}

/// A reshape that keeps the last axis between a column layer and its row partner stays on the
/// split (it is told where the split is and reshapes to its part), and trains as one device,
/// with a fixed target and with an inferred one.
#[test]
fn a_reshape_that_keeps_the_last_axis_runs_on_the_split() {
    use weft_nn::layers::Reshape;
    for target in [[2isize, 4, 16], [2, -1, 16]] {
        let net = move || {
            Sequential::new()
                .named("net")
                .add(Dense::new(16).activation(Activation::Relu).named("up"))
                .add(Reshape::new(&target).named("reshape"))
                .add(Dense::new(3).named("down"))
        };
        let p = AutoConfig::new().min_params(0).loss(Loss::MeanSquaredError).plan(&net(), &[4, 8, 5], 2, 1).unwrap();
        assert_eq!(p.layer("net/up").unwrap().style.name(), "column", "{p}");
        assert_eq!(p.layer("net/reshape").unwrap().style, tp::Style::Split { axis: 2, sizes: vec![8, 8] }, "{p}");
        assert_eq!(p.layer("net/down").unwrap().style.name(), "row", "{p}");
        let x = Tensor::rand(-1.0, 1.0, &[16, 8, 5], 3, &Device::Cpu).unwrap();
        let y = Tensor::rand(-1.0, 1.0, &[16, 2, 4, 3], 4, &Device::Cpu).unwrap();
        let options = VerifyOptions { own_init: true, ..VerifyOptions::rows(&x, &y, 4, 4).unwrap() };
        let report =
            verify_with(net, &DeviceMesh::cpus(2).unwrap(), &p, Adam::new(0.01), Loss::MeanSquaredError, options)
                .unwrap();
        assert!(report.max_rel() < 1e-4, "{report}\n{p}");
    }
}

/// An embedding of one's own: a table built with `tp::variable` and read with `tp::lookup`, and,
/// when `extra`, a scale of its own besides the table.
struct MyTable {
    name: String,
    vocab: usize,
    width: usize,
    extra: bool,
    table: OnceLock<Var>,
    scale: OnceLock<Var>,
}

impl MyTable {
    fn new(name: &str, vocab: usize, width: usize) -> Self {
        MyTable { name: name.into(), vocab, width, extra: false, table: OnceLock::new(), scale: OnceLock::new() }
    }
}

impl Layer for MyTable {
    fn call(&self, ids: &Tensor, ctx: &mut Ctx) -> Result<Tensor> {
        let table = match self.table.get() {
            Some(t) => t,
            None => {
                let shape = [self.vocab, self.width];
                let t = tp::variable(self, ctx, "table", ids.device(), Initializer::Uniform(0.5), &shape, 11)?;
                self.table.get_or_init(|| t)
            }
        };
        let rows = tp::lookup(self, ctx, table, ids)?;
        if !self.extra {
            return Ok(rows);
        }
        let scale = match self.scale.get() {
            Some(s) => s,
            None => {
                let s = tp::variable(self, ctx, "scale", ids.device(), Initializer::Ones, &[self.width], 0)?;
                self.scale.get_or_init(|| s)
            }
        };
        rows.mul(scale)
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn set_name(&mut self, name: String) {
        self.name = name;
    }
    fn kind(&self) -> &'static str {
        "MyTable"
    }
    fn variables(&self) -> Vec<(String, Var)> {
        let mut v: Vec<(String, Var)> =
            self.table.get().map(|t| ("table".to_string(), t.clone())).into_iter().collect();
        v.extend(self.scale.get().map(|s| ("scale".to_string(), s.clone())));
        v
    }
    fn split_rule(&self) -> SplitRule {
        SplitRule::Vocab { table: "table".into() }
    }
}

/// Scales feature i of the last axis by 1 + i/10: pointwise, but which features a rank holds
/// matters, so it reads its part with `tp::part` (ignoring it would scale every part as the first).
struct MyRamp {
    name: String,
}

impl Layer for MyRamp {
    fn call(&self, x: &Tensor, ctx: &mut Ctx) -> Result<Tensor> {
        let last = x.dims()[x.rank() - 1];
        let (start, whole) = match tp::part(self, ctx) {
            Some(p) => {
                assert_eq!((p.axis, p.len), (x.rank() - 1, last), "the part is this rank's slice of the last axis");
                (p.start, p.whole)
            }
            None => (0, last),
        };
        let ramp: Vec<f32> = (0..whole).map(|i| 1.0 + i as f32 / 10.0).collect();
        let ramp = Tensor::from_vec(ramp, &[whole], x.device())?.narrow(0, start, last)?;
        x.mul(&ramp)
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn set_name(&mut self, name: String) {
        self.name = name;
    }
    fn kind(&self) -> &'static str {
        "MyRamp"
    }
    fn variables(&self) -> Vec<(String, Var)> {
        Vec::new()
    }
    fn split_rule(&self) -> SplitRule {
        SplitRule::Pointwise
    }
}

/// Layers of one's own that declare `Vocab` and `Pointwise` run their part through the public
/// helpers (`tp::lookup`, `tp::part`) and train sharded as on one device (7 rows over 2 and 3
/// devices, 12 features: uneven parts); a vocabulary layer with weights besides its table stays
/// whole, with the reason, and a forced vocabulary split of it is refused by name.
#[test]
fn vocab_and_pointwise_layers_of_ones_own_run_their_part_through_the_helpers() {
    let net = |extra: bool| {
        move || {
            let mut t = MyTable::new("embed", 7, 6);
            t.extra = extra;
            Sequential::new()
                .named("net")
                .add(t)
                .add(Dense::new(12).activation(Activation::Relu).named("up"))
                .add(MyRamp { name: "ramp".into() })
                .add(Dense::new(3).named("down"))
        }
    };
    let ids =
        Tensor::from_vec((0..16 * 5).map(|i| ((i * 5 + i / 7) % 7) as f32).collect(), &[16, 5], &Device::Cpu).unwrap();
    let y = Tensor::rand(-1.0, 1.0, &[16, 5, 3], 4, &Device::Cpu).unwrap();
    for n in [2, 3] {
        let p =
            AutoConfig::new().min_params(0).loss(Loss::MeanSquaredError).plan(&net(false)(), &[4, 5], n, 1).unwrap();
        assert_eq!(p.layer("net/embed").unwrap().style, tp::Style::Vocab { sizes: tp::split_sizes(7, n) }, "{p}");
        assert_eq!(p.layer("net/up").unwrap().style.name(), "column", "{p}");
        assert_eq!(
            p.layer("net/ramp").unwrap().style,
            tp::Style::Split { axis: 2, sizes: tp::split_sizes(12, n) },
            "{p}"
        );
        assert_eq!(p.layer("net/down").unwrap().style.name(), "row", "{p}");
        let options = VerifyOptions { own_init: true, ..VerifyOptions::rows(&ids, &y, 4, 6).unwrap() };
        let report = verify_with(
            net(false),
            &DeviceMesh::cpus(n).unwrap(),
            &p,
            Adam::new(0.01),
            Loss::MeanSquaredError,
            options,
        )
        .unwrap();
        assert!(report.max_rel() < 1e-4, "{n} devices:\n{report}\n{p}");
    }

    let p = AutoConfig::new().min_params(0).loss(Loss::MeanSquaredError).plan(&net(true)(), &[4, 5], 2, 1).unwrap();
    let e = p.layer("net/embed").unwrap();
    assert_eq!(e.style, tp::Style::Replicated, "{p}");
    assert!(e.reason.contains("net/embed has variables besides its table \"table\""), "{}", e.reason);
    let forced = AutoConfig::new().min_params(0).override_layer("net/embed", Split::Vocab);
    let err = forced.plan(&net(true)(), &[4, 5], 2, 1).unwrap_err().to_string();
    assert!(err.contains("net/embed") && err.contains("variables besides its table"), "{err}");
}
