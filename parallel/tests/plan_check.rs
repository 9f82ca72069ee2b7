//! A plan edited by hand (or loaded from JSON) is checked against the traced model: a column
//! split must reach its row partner through ops that keep the split, or the plan is refused with
//! both layers and the op named. A legal hand-made pairing is still accepted.

mod common;

use weft_core::{DType, Device, Tensor, Var};
use weft_nn::layers::{Dense, Dropout, Embedding, MultiHeadAttention, TransformerBlock};
use weft_nn::optim::Adam;
use weft_nn::tp::{Placement, Style};
use weft_nn::{Activation, Ctx, Layer, Loss, Sequential};
use weft_parallel::{AutoConfig, DeviceMesh, LayerPlan, ShardingPlan, Split, verify};

/// A layer without weights that applies one op to its input.
struct Op {
    name: String,
    f: fn(&Tensor) -> weft_core::Result<Tensor>,
}

impl Layer for Op {
    fn call(&self, x: &Tensor, _: &mut Ctx) -> weft_core::Result<Tensor> {
        let _scope = weft_nn::scope::enter(self);
        (self.f)(x)
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn set_name(&mut self, name: String) {
        self.name = name;
    }
    fn kind(&self) -> &'static str {
        "Op"
    }
    fn variables(&self) -> Vec<(String, Var)> {
        Vec::new()
    }
}

/// `[4, 16, 8] -> dense (16) -> op -> dropout -> dense_1 (8)`: the op sits between a layer that
/// could be column-split and one that could be row-split.
fn around(name: &str, f: fn(&Tensor) -> weft_core::Result<Tensor>) -> Sequential {
    Sequential::new()
        .add(Dense::new(16).activation(Activation::Gelu))
        .add(Op { name: name.to_string(), f })
        .add(Dropout::new(0.1))
        .add(Dense::new(8))
}

const INPUT: [usize; 3] = [4, 16, 8];

/// Pair `col` and `row` by hand (Dense layers over 2 ranks), with the dropout split too.
fn pair_by_hand(p: &mut ShardingPlan, col: &str, row: &str, dropout: Option<&str>) {
    let width = p.layer(row).unwrap().variables[0].shape[0];
    let sizes = weft_nn::tp::split_sizes(width, p.model_axis);
    let shard = |axis| Placement::Shard { axis, sizes: sizes.clone() };
    for l in p.layers.iter_mut() {
        if l.path == col {
            l.style = Style::Column { sizes: sizes.clone(), gather: false };
            l.variables[0].placement = shard(1);
            l.variables[1].placement = shard(0);
        } else if l.path == row {
            l.style = Style::Row { sizes: sizes.clone(), scatter: false };
            l.variables[0].placement = shard(0);
            l.variables[1].placement = Placement::Replicate;
        }
    }
    // A weightless layer is in a plan only when it is split.
    if let Some(d) = dropout {
        p.layers.push(LayerPlan {
            path: d.to_string(),
            kind: "Dropout".into(),
            style: Style::Split { axis: INPUT.len() - 1, sizes },
            variables: Vec::new(),
            reason: "by hand".into(),
        });
    }
}

/// The planner's own plan for `net`, with both dense layers kept whole.
fn whole_plan(net: &dyn Layer) -> ShardingPlan {
    AutoConfig::new().min_params(0).override_layer("*/dense*", Split::Replicate).plan(net, &INPUT, 2, 1).unwrap()
}

fn refused(net: impl Fn() -> Sequential + Copy, op: &str) -> String {
    let mut p = whole_plan(&net());
    pair_by_hand(&mut p, "sequential/dense", "sequential/dense_1", None);
    // Its sizes are consistent, so JSON alone accepts it...
    let p = ShardingPlan::from_json(&p.to_json().unwrap()).unwrap();
    // ...but the model says otherwise.
    let e = p.check_model(&net()).unwrap_err().to_string();
    assert!(e.contains("sequential/dense ") && e.contains("sequential/dense_1") && e.contains(op), "{e}");
    // verify checks the plan before training anything.
    let x = Tensor::rand(-1.0, 1.0, &INPUT, 1, &Device::Cpu).unwrap();
    let y = Tensor::rand(-1.0, 1.0, &[4, 16, 8], 2, &Device::Cpu).unwrap();
    let mesh = DeviceMesh::cpus(2).unwrap();
    let v = verify(net, &mesh, &p, Adam::new(0.01), Loss::MeanSquaredError, (&x, &y), 1).unwrap_err().to_string();
    assert_eq!(v, e);
    e
}

#[test]
fn a_transpose_between_a_hand_paired_column_and_row_is_refused_naming_both_and_the_op() {
    let e = refused(|| around("transpose", |x| x.transpose(1, 2)), "permute");
    assert!(e.contains("sequential/transpose"), "the op's scope: {e}");
}

#[test]
fn a_softmax_or_a_reduction_over_the_split_axis_between_a_pair_is_refused() {
    refused(|| around("softmax", |x| x.softmax(-1)), "softmax");
    // Centring over the last axis: a mean of one rank's part is not the mean of the row.
    refused(|| around("centre", |x| x.sub(&x.mean(&[-1], true)?)), "sequential/centre");
}

#[test]
fn a_legal_hand_made_pairing_is_accepted_and_trains_like_one_device() {
    let net = || around("scale", |x| x.mul_scalar(0.5));
    let mut p = whole_plan(&net());
    pair_by_hand(&mut p, "sequential/dense", "sequential/dense_1", Some("sequential/dropout"));
    p.check_model(&net()).unwrap();
    // It is the plan the planner makes itself.
    let auto = AutoConfig::new().min_params(0).plan(&net(), &INPUT, 2, 1).unwrap();
    let styles = |p: &ShardingPlan| {
        let mut s: Vec<_> = p.layers.iter().map(|l| (l.path.clone(), l.style.clone())).collect();
        s.sort_by(|a, b| a.0.cmp(&b.0));
        s
    };
    assert_eq!(styles(&p), styles(&auto));
    let x = Tensor::rand(-1.0, 1.0, &[16, 16, 8], 1, &Device::Cpu).unwrap();
    let y = Tensor::rand(-1.0, 1.0, &[16, 16, 8], 2, &Device::Cpu).unwrap();
    let mesh = DeviceMesh::cpus(2).unwrap();
    let report = verify(net, &mesh, &p, Adam::new(0.01), Loss::MeanSquaredError, (&x, &y), 4).unwrap();
    assert!(report.max_rel() < 1e-4, "{report}");
}

#[test]
fn a_dropout_left_whole_on_a_split_tensor_is_refused() {
    let net = || around("scale", |x| x.mul_scalar(0.5));
    let mut p = whole_plan(&net());
    pair_by_hand(&mut p, "sequential/dense", "sequential/dense_1", None);
    let e = p.check_model(&net()).unwrap_err().to_string();
    assert!(e.contains("sequential/dropout") && e.contains("mask"), "{e}");
}

#[test]
fn a_row_split_without_a_column_partner_or_a_misdeclared_output_is_refused() {
    let net = || around("scale", |x| x.mul_scalar(0.5));
    let mut p = whole_plan(&net());
    pair_by_hand(&mut p, "sequential/nothing", "sequential/dense_1", None);
    let e = p.check_model(&net()).unwrap_err().to_string();
    assert!(e.contains("sequential/dense_1") && e.contains("no column-split layer"), "{e}");

    // The last layer left split, but the plan says the output is whole: the loss would read a
    // part as the whole.
    let mut p = AutoConfig::new().min_params(0).plan(&net(), &INPUT, 2, 1).unwrap();
    assert_eq!(p.output, None);
    let last = p.layers.iter_mut().find(|l| l.path == "sequential/dense_1").unwrap();
    last.style = Style::Column { sizes: vec![4, 4], gather: true };
    last.variables[0].placement = Placement::Shard { axis: 1, sizes: vec![4, 4] };
    last.variables[1].placement = Placement::Shard { axis: 0, sizes: vec![4, 4] };
    p.check_model(&net()).unwrap_err(); // its input arrives split: dense is still paired with it
    let mut p =
        AutoConfig::new().min_params(0).override_layer("*/dense", Split::Replicate).plan(&net(), &INPUT, 2, 1).unwrap();
    assert_eq!(p.output, Some(vec![4, 4]), "{p}");
    p.output = None;
    let e = p.check_model(&net()).unwrap_err().to_string();
    assert!(e.contains("sequential/dense_1") && e.contains("output"), "{e}");
}

#[test]
fn attention_splits_by_heads_as_a_whole_and_a_tied_head_with_its_table() {
    let net = || Sequential::new().named("m").add(MultiHeadAttention::new(4, 8).named("attention"));
    let p = AutoConfig::new().min_params(0).plan(&net(), &[2, 5, 32], 2, 1).unwrap();
    p.check_model(&net()).unwrap();
    let mut bad = p.clone();
    let key = bad.layers.iter_mut().find(|l| l.path == "m/attention/key").unwrap();
    key.style = Style::Replicated;
    key.variables.iter_mut().for_each(|v| v.placement = Placement::Replicate);
    let e = bad.check_model(&net()).unwrap_err().to_string();
    assert!(e.contains("m/attention") && e.contains("m/attention/key"), "{e}");

    let lm = || {
        let tokens = Embedding::new(12, 8).named("tokens");
        let head = tokens.tied_head().named("head");
        Sequential::new().named("lm").add(tokens).add(Dense::new(8).named("mix")).add(head)
    };
    let p = AutoConfig::new().min_params(0).input_dtype(DType::U32).plan(&lm(), &[2, 5], 2, 1).unwrap();
    p.check_model(&lm()).unwrap();
    let mut bad = p.clone();
    let head = bad.layers.iter_mut().find(|l| l.path == "lm/head").unwrap();
    head.style = Style::Column { sizes: vec![7, 5], gather: false };
    bad.output = Some(vec![7, 5]);
    let e = bad.check_model(&lm()).unwrap_err().to_string();
    assert!(e.contains("lm/head") && e.contains("lm/tokens"), "{e}");
}

#[test]
fn a_plan_for_another_model_is_refused() {
    let p = whole_plan(&around("scale", |x| x.mul_scalar(0.5)));
    let other = Sequential::new().add(Dense::new(12)).add(Dense::new(8));
    let e = p.check_model(&other).unwrap_err().to_string();
    assert!(e.contains("sequential/dense"), "{e}");
    let e = p.check_model(&Sequential::new().named("other").add(Dense::new(16))).unwrap_err().to_string();
    assert!(e.contains("\"other\""), "{e}");
}

#[test]
fn every_plan_the_planner_makes_passes_the_model_check() {
    let gpt = || Sequential::new().named("gpt").add(TransformerBlock::new(4, 8, 64).dropout(0.1).named("block_0"));
    for n in [2, 3, 4] {
        let p = AutoConfig::new().min_params(0).plan(&gpt(), &[2, 5, 32], n, 1).unwrap();
        p.check_model(&gpt()).unwrap_or_else(|e| panic!("{e}\n{p}"));
        let p = AutoConfig::new().min_params(0).plan(&common::Fork::new(12, 5), &[4, 9], n, 1).unwrap();
        p.check_model(&common::Fork::new(12, 5)).unwrap_or_else(|e| panic!("{e}\n{p}"));
    }
    let deep = || {
        Sequential::new()
            .add(Dense::new(64).activation(Activation::Relu))
            .add(Dense::new(64).activation(Activation::Tanh))
            .add(Dense::new(64))
            .add(Dense::new(8))
    };
    for loss in [None, Some(Loss::MeanSquaredError)] {
        let cfg = AutoConfig::new().min_params(0);
        let cfg = if let Some(l) = loss { cfg.loss(l) } else { cfg };
        let p = cfg.plan(&deep(), &[4, 16], 2, 1).unwrap();
        p.check_model(&deep()).unwrap_or_else(|e| panic!("{e}\n{p}"));
    }
}

#[test]
fn attention_dropout_is_split_with_the_heads() {
    // The dropout on the probabilities is no described sublayer of the attention: the plan must
    // still carry its split, or each rank draws a mask for its own heads alone.
    let net = || Sequential::new().named("m").add(MultiHeadAttention::new(4, 8).dropout(0.3).named("attention"));
    let p = AutoConfig::new().min_params(0).plan(&net(), &[4, 5, 16], 2, 1).unwrap();
    let d = p.layer("m/attention/attention_dropout").unwrap_or_else(|| panic!("{p}"));
    assert_eq!(d.style, Style::Split { axis: 1, sizes: vec![2, 2] });
    p.check_model(&net()).unwrap();
    let x = Tensor::rand(-1.0, 1.0, &[16, 5, 16], 1, &Device::Cpu).unwrap();
    let y = Tensor::rand(-1.0, 1.0, &[16, 5, 16], 2, &Device::Cpu).unwrap();
    let mesh = DeviceMesh::cpus(2).unwrap();
    let report = verify(net, &mesh, &p, Adam::new(0.01), Loss::MeanSquaredError, (&x, &y), 3).unwrap();
    assert!(report.max_rel() < 1e-4, "{report}");
    // Without it, the plan is refused.
    let mut bad = p.clone();
    bad.layers.retain(|l| l.path != "m/attention/attention_dropout");
    let e = bad.check_model(&net()).unwrap_err().to_string();
    assert!(e.contains("m/attention/attention_dropout"), "{e}");
}
