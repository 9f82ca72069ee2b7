//! The planner: snapshots of the plans of reference models, the pairing rule, and its errors.

mod common;

use common::Fork;
use weft_core::{DType, Device, Tensor, Var, trace};
use weft_nn::layers::{
    Dense, Dropout, Embedding, Flatten, LayerNormalization, MultiHeadAttention, PositionEmbedding, Reshape,
    TransformerBlock,
};
use weft_nn::tp::Style;
use weft_nn::{Activation, Ctx, Layer, Sequential};
use weft_parallel::{AutoConfig, DeviceMesh, ShardedModel, ShardingPlan, Split};

fn plan(net: &dyn Layer, input: &[usize], n: usize) -> ShardingPlan {
    AutoConfig::new().plan(net, input, n, 1).unwrap()
}

fn mlp() -> Sequential {
    Sequential::new()
        .add(LayerNormalization::new())
        .add(Dense::new(1024).activation(Activation::Gelu))
        .add(Dropout::new(0.1))
        .add(Dense::new(256))
}

#[test]
fn mlp_plan() {
    insta::assert_snapshot!("mlp", plan(&mlp(), &[32, 256], 2).to_string());
}

#[test]
fn transformer_block_plan() {
    let net = Sequential::new().named("gpt").add(TransformerBlock::new(8, 64, 2048).causal(true).named("block_0"));
    insta::assert_snapshot!("transformer_block", plan(&net, &[8, 128, 512], 4).to_string());
}

/// A custom model with a Sequential inside: paths nest, pairing looks through the containers.
struct Encoder {
    stem: Dense,
    body: Sequential,
    head: Dense,
}

impl Encoder {
    fn new() -> Self {
        Encoder {
            stem: Dense::new(512).activation(Activation::Relu).named("stem"),
            body: Sequential::new()
                .named("body")
                .add(Dense::new(2048).activation(Activation::Gelu).named("expand"))
                .add(Dense::new(512).named("project")),
            head: Dense::new(10).named("head"),
        }
    }
}

impl Layer for Encoder {
    fn call(&self, x: &Tensor, ctx: &mut Ctx) -> weft_core::Result<Tensor> {
        let h = self.stem.call(x, ctx)?;
        let h = h.add(&self.body.call(&h, ctx)?)?;
        self.head.call(&h, ctx)
    }
    fn name(&self) -> &str {
        "encoder"
    }
    fn set_name(&mut self, _: String) {}
    fn kind(&self) -> &'static str {
        "Encoder"
    }
    fn variables(&self) -> Vec<(String, Var)> {
        weft_nn::sublayer_variables(self.sublayers())
    }
    fn sublayers(&self) -> Vec<&dyn Layer> {
        vec![&self.stem, &self.body, &self.head]
    }
}

#[test]
fn nested_custom_model_plan() {
    insta::assert_snapshot!("nested", plan(&Encoder::new(), &[16, 256], 2).to_string());
}

#[test]
fn einsum_dense_attention_plan() {
    // 6 heads over 4 devices: split unevenly by whole heads.
    let net = Sequential::new().add(MultiHeadAttention::new(6, 64).named("attention"));
    let p = plan(&net, &[4, 16, 384], 4);
    assert_eq!(
        p.layer("sequential/attention/query").unwrap().style,
        Style::Column { sizes: vec![2, 2, 1, 1], gather: false }
    );
    insta::assert_snapshot!("einsum_attention", p.to_string());
}

fn lm(vocab: usize) -> Sequential {
    let tokens = Embedding::new(vocab, 128).named("tokens");
    let head = tokens.tied_head().named("head");
    Sequential::new()
        .named("lm")
        .add(tokens)
        .add(PositionEmbedding::new(16).named("positions"))
        .add(TransformerBlock::new(3, 40, 1000).named("block_0"))
        .add(LayerNormalization::new().named("ln_f"))
        .add(head)
}

#[test]
fn indivisible_sizes_plan() {
    // Vocabulary 1003, 3 heads, MLP 1000 over 3 devices... and 2.
    let p = AutoConfig::new().input_dtype(DType::U32).plan(&lm(1003), &[4, 16], 3, 1).unwrap();
    assert_eq!(p.layer("lm/tokens").unwrap().style, Style::Vocab { sizes: vec![335, 334, 334] });
    assert_eq!(
        p.layer("lm/block_0/mlp/up").unwrap().style,
        Style::Column { sizes: vec![334, 333, 333], gather: false }
    );
    assert_eq!(p.output, Some(vec![335, 334, 334]), "the tied head's logits stay split for the loss");
    insta::assert_snapshot!("indivisible", p.to_string());
    // 3 heads cannot split over 4 devices by whole heads: attention stays whole, with its reason.
    let p = AutoConfig::new().input_dtype(DType::U32).plan(&lm(1003), &[4, 16], 4, 1).unwrap();
    let q = p.layer("lm/block_0/attention/query").unwrap();
    assert_eq!(q.style, Style::Replicated);
    assert!(q.reason.contains("3 heads"), "{}", q.reason);
}

#[test]
fn column_gelu_row_is_one_all_reduce_each_way_and_no_gather() {
    let p = plan(&mlp(), &[32, 256], 2);
    assert_eq!(p.layer("sequential/dense").unwrap().style.name(), "column");
    assert_eq!(p.layer("sequential/dense_1").unwrap().style.name(), "row");
    assert_eq!(p.layer("sequential/dropout").unwrap().style.name(), "split");
    let count = |op: &str, pass: &str| p.collectives.iter().filter(|c| c.op == op && c.pass == pass).count();
    assert_eq!(count("all_reduce", "forward"), 1, "{p}");
    assert_eq!(count("all_reduce", "backward"), 1, "{p}");
    assert_eq!(count("all_gather", "forward") + count("all_gather", "backward"), 0, "{p}");

    // And at run time: the traced forward pass of a rank calls f once and g once, nothing else.
    let mesh = DeviceMesh::cpus(2).unwrap();
    let mut model = ShardedModel::new(mlp, &mesh, &p).unwrap();
    let x = Tensor::rand(-1.0, 1.0, &[32, 256], 0, &Device::Cpu).unwrap();
    let kinds = model
        .run(|_, m| {
            let (_, nodes) = trace::trace(|| m.call(&x))?;
            Ok(nodes.into_iter().map(|n| n.kind).filter(|k| k.contains("parallel")).collect::<Vec<_>>())
        })
        .unwrap();
    assert_eq!(kinds[0], vec!["copy_to_parallel", "reduce_from_parallel"]);
}

#[test]
fn a_column_layer_whose_output_changes_shape_is_gathered() {
    let net =
        Sequential::new().add(Dense::new(1024)).add(Reshape::new(&[32, 32])).add(Flatten::new()).add(Dense::new(64));
    let p = plan(&net, &[8, 512], 2);
    let first = p.layer("sequential/dense").unwrap();
    assert_eq!(first.style.name(), "column+gather", "{p}");
    assert!(first.reason.contains("reshape"), "{}", first.reason);
    assert!(p.collectives.iter().any(|c| c.op == "all_gather" && c.at == "sequential/dense"));
}

#[test]
fn small_layers_stay_replicated_with_a_reason() {
    let net = Sequential::new().add(Dense::new(8)).add(Dense::new(4));
    let p = plan(&net, &[2, 8], 2);
    for l in &p.layers {
        assert_eq!(l.style, Style::Replicated);
        assert!(l.reason.contains("not worth"), "{}", l.reason);
    }
}

#[test]
fn overrides_win_and_bad_ones_are_errors_that_name_them() {
    let p = AutoConfig::new().override_layer("*/dense_1", Split::Replicate).plan(&mlp(), &[32, 256], 2, 1).unwrap();
    assert_eq!(p.layer("sequential/dense_1").unwrap().style, Style::Replicated);
    // The column layer lost its partner: it is gathered (or row-split) instead.
    assert!(matches!(
        p.layer("sequential/dense").unwrap().style,
        Style::Column { gather: true, .. } | Style::Row { .. }
    ));

    let e =
        AutoConfig::new().override_layer("*/nothing_here", Split::Column).plan(&mlp(), &[32, 256], 2, 1).unwrap_err();
    assert!(e.to_string().contains("*/nothing_here"), "{e}");

    let tiny = Sequential::new().add(Dense::new(2));
    let e = AutoConfig::new().override_layer("*/dense", Split::Column).plan(&tiny, &[4, 8], 3, 1).unwrap_err();
    assert!(e.to_string().contains("sequential/dense") && e.to_string().contains("3 devices"), "{e}");
}

#[test]
fn plans_round_trip_through_json() {
    let p = AutoConfig::new().input_dtype(DType::U32).plan(&lm(1003), &[4, 16], 3, 1).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("plan.json");
    p.save(&path).unwrap();
    assert_eq!(ShardingPlan::load(&path).unwrap(), p);
    // A plan edited into nonsense is refused with the variable named.
    let mut bad = p.clone();
    bad.layers[0].variables[0].placement = weft_nn::tp::Placement::Shard { axis: 0, sizes: vec![336, 334, 334] };
    let e = ShardingPlan::from_json(&bad.to_json().unwrap()).unwrap_err();
    assert!(e.to_string().contains("lm/tokens/embeddings"), "{e}");
}

#[test]
fn a_seven_billion_parameter_decoder_plans_in_under_a_second_without_allocating() {
    let start = std::time::Instant::now();
    let tokens = Embedding::new(32000, 4096).named("tokens");
    let head = tokens.tied_head().named("head");
    let mut net = Sequential::new().named("decoder").add(tokens);
    for i in 0..32 {
        net = net.add(TransformerBlock::new(32, 128, 16384).causal(true).named(&format!("block_{i}")));
    }
    let net = net.add(LayerNormalization::new().named("ln_f")).add(head);
    let p = AutoConfig::new().input_dtype(DType::U32).plan(&net, &[8, 2048], 8, 1).unwrap();
    let params: usize = p.layers.iter().flat_map(|l| &l.variables).map(|v| v.shape.iter().product::<usize>()).sum();
    assert!(params > 6_000_000_000, "{params}");
    assert!(p.memory[0].params < (params as u64 * 4) / 7, "weights are split about 8 ways");
    assert!(start.elapsed().as_secs_f32() < 5.0, "took {:?}", start.elapsed());
}

#[test]
fn a_transformer_block_calls_f_and_g_once_each_for_attention_and_for_the_mlp() {
    let net = || Sequential::new().named("gpt").add(TransformerBlock::new(4, 8, 64).named("block_0"));
    let p = AutoConfig::new().min_params(0).plan(&net(), &[2, 5, 32], 2, 1).unwrap();
    let mut model = ShardedModel::new(net, &DeviceMesh::cpus(2).unwrap(), &p).unwrap();
    let x = Tensor::rand(-1.0, 1.0, &[2, 5, 32], 0, &Device::Cpu).unwrap();
    let kinds = model
        .run(|_, m| {
            let (_, nodes) = trace::trace(|| m.call(&x))?;
            Ok(nodes.into_iter().map(|n| n.kind).filter(|k| k.contains("parallel")).collect::<Vec<_>>())
        })
        .unwrap();
    let fg = ["copy_to_parallel", "reduce_from_parallel"];
    assert_eq!(kinds[0], [fg, fg].concat(), "query, key and value share one f");
    let backward = p.collectives.iter().filter(|c| c.pass == "backward").count();
    assert_eq!(backward, 2, "{p}");
}

#[test]
fn a_softmax_or_a_bias_that_misses_the_split_axis_is_never_column_split() {
    let net = Sequential::new().add(Dense::new(1000).activation(Activation::Softmax));
    let p = plan(&net, &[8, 512], 2);
    assert!(!matches!(p.layers[0].style, Style::Column { .. }), "{p}");
    // Heads projection whose bias spans only the last axis: a split on the heads would leave
    // each rank a partial bias gradient.
    let net = Sequential::new().add(weft_nn::layers::EinsumDense::new("abc,cde->abde", &[0, 8, 64]).bias_axes("e"));
    let p = plan(&net, &[4, 16, 256], 2);
    assert!(!matches!(p.layers[0].style, Style::Column { .. }), "{p}");
}

#[test]
fn overrides_reach_through_containers_and_attention_splits_as_a_whole() {
    let net = || Sequential::new().named("gpt").add(TransformerBlock::new(8, 64, 2048).named("block_0"));
    let p =
        AutoConfig::new().override_layer("gpt/block_0", Split::Replicate).plan(&net(), &[2, 16, 512], 2, 1).unwrap();
    assert!(p.layers.iter().all(|l| l.style == Style::Replicated), "{p}");
    let e = AutoConfig::new()
        .override_layer("*/attention/query", Split::Replicate)
        .plan(&net(), &[2, 16, 512], 2, 1)
        .unwrap_err()
        .to_string();
    assert!(e.contains("gpt/block_0/attention") && e.contains("together"), "{e}");
}

#[test]
fn one_rank_on_the_model_axis_replicates_everything() {
    let p = AutoConfig::new().plan(&mlp(), &[32, 256], 1, 2).unwrap();
    assert!(p.layers.iter().all(|l| l.style == Style::Replicated));
    assert!(p.collectives.iter().all(|c| c.axis == "data"), "{p}");
}

#[test]
fn a_plan_whose_styles_do_not_fit_the_mesh_is_refused() {
    let p = plan(&mlp(), &[32, 256], 2);
    let mut bad = p.clone();
    bad.layers[1].style = Style::Column { sizes: vec![1024], gather: false };
    let e = ShardingPlan::from_json(&bad.to_json().unwrap()).unwrap_err().to_string();
    assert!(e.contains("sequential/dense"), "{e}");
}

#[test]
fn an_override_on_a_container_applies_where_it_fits() {
    let p = AutoConfig::new()
        .input_dtype(DType::U32)
        .override_layer("lm", Split::Row)
        .plan(&lm(1003), &[4, 16], 2, 1)
        .unwrap();
    assert!(matches!(p.layer("lm/block_0/mlp/up").unwrap().style, Style::Row { .. }), "{p}");
    assert_eq!(
        p.layer("lm/tokens").unwrap().style.name(),
        "vocab",
        "Row does not fit an embedding: it keeps its own rule"
    );
}

#[test]
fn a_column_layer_feeding_two_row_layers_stays_split_into_both() {
    // up -> left, and up -> dropout -> right: both can take the split as is.
    let p = AutoConfig::new().min_params(0).plan(&Fork::new(64, 16), &[8, 32], 2, 1).unwrap();
    let style = |path: &str| p.layer(path).unwrap().style.clone();
    assert_eq!(style("fork/up"), Style::Column { sizes: vec![32, 32], gather: false }, "{p}");
    assert_eq!(style("fork/left"), Style::Row { sizes: vec![32, 32], scatter: false });
    assert_eq!(style("fork/right"), Style::Row { sizes: vec![32, 32], scatter: false });
    assert_eq!(style("fork/dropout"), Style::Split { axis: 1, sizes: vec![32, 32] });
    // One all-reduce forward per row layer; no all-gather; the model input needs no f backward.
    let model: Vec<(&str, &str)> =
        p.collectives.iter().filter(|c| c.pass != "optimizer").map(|c| (c.op.as_str(), c.at.as_str())).collect();
    assert_eq!(model, [("all_reduce", "fork/left"), ("all_reduce", "fork/right")], "{p}");
    p.check_model(&Fork::new(64, 16)).unwrap();
    insta::assert_snapshot!("fork", p.to_string());

    // With one branch forced whole, the other cannot pair alone: up is gathered (or row-split).
    let p = AutoConfig::new().min_params(0).override_layer("*/right", Split::Replicate).plan(
        &Fork::new(64, 16),
        &[8, 32],
        2,
        1,
    );
    let p = p.unwrap();
    assert!(!matches!(p.layer("fork/up").unwrap().style, Style::Column { gather: false, .. }), "{p}");
    assert!(!matches!(p.layer("fork/left").unwrap().style, Style::Row { scatter: false, .. }), "{p}");
}
