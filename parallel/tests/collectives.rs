//! The plan's list of collectives is what a training step runs: each model is trained one step
//! on ranks whose model-axis communicator counts every collective, and rank 0's calls (op and
//! whole shape) must equal the plan's list, no more and no fewer.

mod common;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use weft_core::{Collectives, DType, Device, ReduceKind, Result, SingleRank, Tensor};
use weft_nn::layers::{Dense, Dropout, Embedding, LayerNormalization, TransformerBlock};
use weft_nn::optim::Adam;
use weft_nn::tp::{Placement, TpCtx};
use weft_nn::{Activation, Layer, Loss, Model, Sequential};
use weft_parallel::{AutoConfig, CoordinatedOptimizer, InHost, ShardingPlan, Split};

type Log = Arc<Mutex<Vec<(String, Vec<usize>)>>>;

/// A communicator that logs each call with the shape of the whole tensor it makes.
struct Counting {
    inner: InHost,
    log: Log,
}

impl Counting {
    fn note(&self, op: &str, shape: &[usize]) {
        self.log.lock().unwrap().push((op.to_string(), shape.to_vec()));
    }
}

impl Collectives for Counting {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn world_size(&self) -> usize {
        self.inner.world_size()
    }
    fn all_reduce(&self, x: &Tensor, kind: ReduceKind) -> Result<Tensor> {
        self.note("all_reduce", x.dims());
        self.inner.all_reduce(x, kind)
    }
    fn all_gather(&self, x: &Tensor, axis: usize) -> Result<Tensor> {
        let y = self.inner.all_gather(x, axis)?;
        self.note("all_gather", y.dims());
        Ok(y)
    }
    fn reduce_scatter(&self, x: &Tensor, axis: usize, sizes: &[usize], kind: ReduceKind) -> Result<Tensor> {
        self.note("reduce_scatter", x.dims());
        self.inner.reduce_scatter(x, axis, sizes, kind)
    }
    fn broadcast(&self, x: &Tensor, root: usize) -> Result<Tensor> {
        self.note("broadcast", x.dims());
        self.inner.broadcast(x, root)
    }
    fn barrier(&self) -> Result<()> {
        self.note("barrier", &[]);
        self.inner.barrier()
    }
}

/// The model-axis collectives rank 0 calls in one training step, sorted.
fn run_step<L: Layer + 'static>(
    net: impl Fn() -> L + Sync,
    plan: &ShardingPlan,
    loss: Loss,
    x: &Tensor,
    y: &Tensor,
) -> Vec<(String, Vec<usize>)> {
    let split: HashSet<String> =
        plan.placements().into_iter().filter(|(_, p)| *p != Placement::Replicate).map(|(k, _)| k).collect();
    let sample: Vec<usize> = plan.input_shape[1..].to_vec();
    let mut logs = InHost::run(plan.model_axis, |_, comm| {
        let log = Log::default();
        let model: Arc<dyn Collectives> = Arc::new(Counting { inner: comm.clone(), log: log.clone() });
        let data: Arc<dyn Collectives> = Arc::new(SingleRank);
        let tp = TpCtx {
            model: model.clone(),
            data: data.clone(),
            layers: plan.layer_shards(),
            output: plan.output.clone(),
        };
        let mut m = Model::new(net(), &Device::Cpu);
        m.set_tensor_parallel(Arc::new(tp));
        let opt =
            CoordinatedOptimizer::new(Box::new(Adam::new(0.01).clip_global_norm(1.0)), model, data, split.clone());
        m.compile(opt, loss.clone(), &[])?;
        m.build(&sample)?;
        log.lock().unwrap().clear();
        m.train_on_batch(x, y)?;
        let mut calls = log.lock().unwrap().clone();
        calls.sort();
        Ok(calls)
    });
    logs.remove(0).unwrap()
}

/// The plan's model-axis collectives, sorted like `run_step`'s.
fn listed(plan: &ShardingPlan) -> Vec<(String, Vec<usize>)> {
    let mut l: Vec<_> =
        plan.collectives.iter().filter(|c| c.axis == "model").map(|c| (c.op.clone(), c.shape.clone())).collect();
    l.sort();
    l
}

fn rand(shape: &[usize], seed: u64) -> Tensor {
    Tensor::rand(-1.0, 1.0, shape, seed, &Device::Cpu).unwrap()
}

#[test]
fn an_mse_model_whose_last_layer_is_split_lists_what_it_runs() {
    // A layer kept whole, then a split one whose output is the model's: MSE needs it whole, so
    // it is gathered, and no vocabulary-parallel loss runs.
    let net = || Sequential::new().add(Dense::new(8).activation(Activation::Relu)).add(Dense::new(600));
    let (x, y) = (rand(&[4, 16], 1), rand(&[4, 600], 2));
    let cfg = AutoConfig::new().min_params(1000).override_layer("*/dense", Split::Replicate);
    let plan = cfg.clone().loss(Loss::MeanSquaredError).plan(&net(), &[4, 16], 2, 1).unwrap();
    assert_eq!(plan.output, None, "{plan}");
    let ran = run_step(net, &plan, Loss::MeanSquaredError, &x, &y);
    assert_eq!(listed(&plan), ran, "{plan}");
    assert_eq!(ran.len(), 4, "f backward, the gather, replicated gradients, the norm: {plan}");
    assert!(ran.contains(&("all_reduce".to_string(), vec![2])), "the global norm's all-reduce is of 2 values");

    // Planned without the loss, the output stays split and the vocabulary-parallel loss's three
    // collectives are listed on a condition, and the table says so: under MSE they do not run.
    let plan = cfg.plan(&net(), &[4, 16], 2, 1).unwrap();
    assert!(plan.output.is_some(), "{plan}");
    let conditional = plan.collectives.iter().filter(|c| c.at.contains("if sparse cross-entropy")).count();
    assert_eq!((plan.collectives.len(), conditional), (6, 3), "{plan}");
    assert!(plan.to_string().contains("planned without a loss"), "{plan}");
    assert_eq!(run_step(net, &plan, Loss::MeanSquaredError, &x, &y).len(), 4);
    assert!(plan.check_loss(&Loss::MeanSquaredError).is_ok(), "a plan without a loss takes any");
    // A plan made for the vocabulary-parallel loss refuses another.
    let lm_plan = cfg.loss(Loss::SparseCategoricalCrossentropy { from_logits: true }).plan(&net(), &[4, 16], 2, 1);
    let e = lm_plan.unwrap().check_loss(&Loss::MeanSquaredError).unwrap_err().to_string();
    assert!(e.contains("AutoConfig::loss(MeanSquaredError)"), "{e}");
}

#[test]
fn a_paired_mlp_and_a_fan_out_list_what_they_run() {
    let mlp = || {
        Sequential::new()
            .add(LayerNormalization::new())
            .add(Dense::new(24).activation(Activation::Gelu))
            .add(Dropout::new(0.1))
            .add(Dense::new(6))
    };
    let cfg = AutoConfig::new().min_params(0).loss(Loss::MeanSquaredError);
    let plan = cfg.plan(&mlp(), &[4, 10], 2, 1).unwrap();
    assert_eq!(listed(&plan), run_step(mlp, &plan, Loss::MeanSquaredError, &rand(&[4, 10], 1), &rand(&[4, 6], 2)));

    let fork = || common::Fork::new(12, 5);
    let plan = cfg.plan(&fork(), &[4, 10], 3, 1).unwrap();
    assert_eq!(listed(&plan), run_step(fork, &plan, Loss::MeanSquaredError, &rand(&[4, 10], 1), &rand(&[4, 5], 2)));
}

#[test]
fn a_language_model_with_the_vocabulary_parallel_loss_lists_what_it_runs() {
    let lm = || {
        let tokens = Embedding::new(13, 16).named("tokens");
        let head = tokens.tied_head().named("head");
        Sequential::new()
            .named("lm")
            .add(tokens)
            .add(TransformerBlock::new(4, 4, 22).causal(true).named("block_0"))
            .add(LayerNormalization::new().named("ln_f"))
            .add(head)
    };
    let loss = Loss::SparseCategoricalCrossentropy { from_logits: true };
    let cfg = AutoConfig::new().min_params(0).input_dtype(DType::U32).loss(loss.clone());
    let plan = cfg.plan(&lm(), &[2, 6], 2, 1).unwrap();
    assert!(plan.output.is_some(), "{plan}");
    let ids: Vec<u32> = (0..12).map(|i| (i * 5 + 1) % 13).collect();
    let x = Tensor::from_vec(ids.clone(), &[2, 6], &Device::Cpu).unwrap();
    let y = Tensor::from_vec(ids.iter().map(|i| (i + 1) % 13).collect(), &[2, 6], &Device::Cpu).unwrap();
    assert_eq!(listed(&plan), run_step(lm, &plan, loss.clone(), &x, &y), "{plan}");

    // The same model planned for a loss that needs whole logits: its head is gathered instead.
    let plan =
        cfg.clone().loss(Loss::CategoricalCrossentropy { from_logits: true }).plan(&lm(), &[2, 6], 2, 1).unwrap();
    assert_eq!(plan.output, None, "{plan}");
    let one_hot = Tensor::rand(0.0, 1.0, &[2, 6, 13], 3, &Device::Cpu).unwrap();
    let ran = run_step(lm, &plan, Loss::CategoricalCrossentropy { from_logits: true }, &x, &one_hot);
    assert_eq!(listed(&plan), ran, "{plan}");
}
