//! Functional models split over devices train exactly as on one device:
//!
//! - two outputs (a shared trunk, a regression head and a classification head): the same
//!   weighted losses per epoch, per output, and the same predictions. The one-device model is
//!   built by its first training step and the sharded one before training: initial weights do
//!   not depend on when;
//! - three named inputs (token ids with a padding mask, and features) through fan-outs and
//!   every merge (`Add`, `Multiply`, `Concatenate`) and masked pooling.

use weft_core::{Device, Tensor};
use weft_nn::layers::{Add, Concatenate, Dense, Embedding, GlobalAveragePooling1D, Multiply};
use weft_nn::optim::Adam;
use weft_nn::{Activation, FitOptions, Functional, Inputs, Loss, Metric, Model, OutputLoss};
use weft_parallel::{AutoConfig, DeviceMesh, PlanInput, ShardedModel, VerifyOptions, verify_with};

const CE: Loss = Loss::SparseCategoricalCrossentropy { from_logits: true };

fn two_heads() -> Functional {
    let mut g = Functional::new("shop");
    let x = g.input("x");
    let h = g.apply(Dense::new(24).activation(Activation::Gelu).named("up"), &[x]);
    let h = g.apply(Dense::new(8).named("down"), &[h]);
    let price = g.apply(Dense::new(1).named("price_head"), &[h]);
    let kind = g.apply(Dense::new(12).named("kind_head"), &[h]);
    g.outputs(&[("price", price), ("kind", kind)]).unwrap()
}

fn losses() -> Vec<OutputLoss> {
    vec![
        OutputLoss::new("price", Loss::MeanSquaredError).weight(2.0),
        OutputLoss::new("kind", CE).metrics(&[Metric::Accuracy]),
    ]
}

fn two_heads_data(n: usize) -> (Tensor, Inputs) {
    let x = Tensor::rand(-1.0, 1.0, &[n, 6], 1, &Device::Cpu).unwrap();
    let kind: Vec<u32> = (0..n as u32).map(|i| (i * 5 + 1) % 12).collect();
    let y = Inputs::from([
        ("price", x.sum(&[1], true).unwrap()),
        ("kind", Tensor::from_vec(kind, &[n], &Device::Cpu).unwrap()),
    ]);
    (x, y)
}

#[test]
fn a_two_output_model_trains_sharded_as_on_one_device() {
    let (x, y) = two_heads_data(48);
    let opts = || FitOptions { epochs: 3, batch_size: 12, verbose: false, ..Default::default() };
    let mut one = Model::new(two_heads(), &Device::Cpu);
    one.compile_outputs(Adam::new(0.01), &losses()).unwrap();
    let h1 = one.fit(&x, &y, opts()).unwrap();
    let p1 = one.predict_outputs(&x, 16).unwrap();
    for d in [2, 3] {
        let cfg = AutoConfig::new().min_params(0);
        let plan =
            cfg.plan_inputs(&two_heads(), &[PlanInput::new("x", &[12, 6], weft_core::DType::F32)], d, 1).unwrap();
        // The heads' outputs leave whole: the up/down pair is split.
        assert_eq!(plan.layer("shop/up").unwrap().style.name(), "column", "{plan}");
        assert_eq!(plan.layer("shop/down").unwrap().style.name(), "row", "{plan}");
        assert!(plan.output.is_none(), "{plan}");
        let mut sharded = ShardedModel::new(two_heads, &DeviceMesh::cpus(d).unwrap(), &plan).unwrap();
        sharded.compile_outputs(Adam::new(0.01), &losses()).unwrap();
        let h = sharded.fit(&x, &y, opts()).unwrap();
        for (k, v1) in h1.flat() {
            let v = h.get(&k).unwrap_or_else(|| panic!("no {k} on {d} devices"));
            for (a, b) in v1.iter().zip(&v) {
                assert!((a - b).abs() <= 1e-4 * a.abs().max(1.0), "{k} on {d} devices: {v1:?} vs {v:?}");
            }
        }
        let p = sharded.predict_outputs(&x, 16).unwrap();
        for name in ["price", "kind"] {
            let (a, b) =
                (p1.get(name).unwrap().to_vec::<f32>().unwrap(), p.get(name).unwrap().to_vec::<f32>().unwrap());
            let worst = a.iter().zip(&b).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
            assert!(worst < 1e-4, "{name} on {d} devices differs by {worst}");
        }
    }
}

/// Ids with a padding mask and a feature vector; fan-outs into every merge.
fn towers() -> Functional {
    let mut g = Functional::new("towers");
    let ids = g.input("ids");
    let keep = g.input("keep");
    let feats = g.input("feats");
    let e = g.apply(Embedding::new(40, 16).named("embed"), &[ids]);
    let e = g.mask(e, keep);
    let up = g.apply(Dense::new(32).activation(Activation::Gelu).named("up"), &[e]);
    let down = g.apply(Dense::new(16).named("down"), &[up]);
    let s = g.apply(Add::new(), &[e, down]);
    let pooled = g.apply(GlobalAveragePooling1D::new(), &[s]);
    let f = g.apply(Dense::new(16).activation(Activation::Relu).named("feat"), &[feats]);
    let gate = g.apply(Dense::new(16).activation(Activation::Sigmoid).named("gate"), &[feats]);
    let both = g.apply(Multiply::new(), &[f, gate]);
    let joined = g.apply(Concatenate::new(-1), &[pooled, both]);
    let out = g.apply(Dense::new(1).named("out"), &[joined]);
    g.output(out).unwrap()
}

fn towers_data(n: usize) -> (Inputs, Tensor) {
    let ids: Vec<u32> = (0..n * 5).map(|i| (i * 7 % 37) as u32 + 1).collect();
    let keep: Vec<f32> = (0..n * 5).map(|i| if i % 5 < 2 + (i / 5) % 4 { 1.0 } else { 0.0 }).collect();
    let feats = Tensor::rand(-1.0, 1.0, &[n, 4], 5, &Device::Cpu).unwrap();
    let y = feats.sum(&[1], true).unwrap().tanh().unwrap();
    let x = Inputs::from([
        ("ids", Tensor::from_vec(ids, &[n, 5], &Device::Cpu).unwrap()),
        ("keep", Tensor::from_vec(keep, &[n, 5], &Device::Cpu).unwrap()),
        ("feats", feats),
    ]);
    (x, y)
}

fn towers_specs() -> [PlanInput; 3] {
    [
        PlanInput::new("ids", &[8, 5], weft_core::DType::U32),
        PlanInput::new("keep", &[8, 5], weft_core::DType::F32),
        PlanInput::new("feats", &[8, 4], weft_core::DType::F32),
    ]
}

#[test]
fn a_functional_model_with_several_inputs_fan_outs_and_merges_trains_sharded_as_on_one_device() {
    let (x, y) = towers_data(32);
    let opts = || FitOptions { epochs: 3, batch_size: 8, verbose: false, ..Default::default() };
    let mut one = Model::new(towers(), &Device::Cpu);
    one.compile(Adam::new(0.01), Loss::MeanSquaredError, &[]).unwrap();
    let h1 = one.fit(&x, &y, opts()).unwrap();
    let p1 = one.predict(&x, 16).unwrap().to_vec::<f32>().unwrap();
    let specs = towers_specs();
    for d in [2, 3] {
        let cfg = AutoConfig::new().min_params(0).loss(Loss::MeanSquaredError);
        let mut sharded = ShardedModel::auto_inputs(towers, &DeviceMesh::cpus(d).unwrap(), &specs, &cfg).unwrap();
        let plan = sharded.plan().clone();
        assert_eq!(plan.layer("towers/embed").unwrap().style.name(), "vocab", "{plan}");
        assert_eq!(plan.layer("towers/up").unwrap().style.name(), "column", "{plan}");
        assert_eq!(plan.layer("towers/down").unwrap().style.name(), "row", "{plan}");
        sharded.compile(Adam::new(0.01), Loss::MeanSquaredError, &[]).unwrap();
        let h = sharded.fit(&x, &y, opts()).unwrap();
        for (a, b) in h1.loss.iter().zip(&h.loss) {
            assert!((a - b).abs() <= 1e-4 * a.abs().max(1.0), "{d} devices: {:?} vs {:?}", h1.loss, h.loss);
        }
        let p = sharded.predict(&x, 16).unwrap().to_vec::<f32>().unwrap();
        let worst = p1.iter().zip(&p).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
        assert!(worst < 1e-4, "{d} devices: predictions differ by {worst}");
    }
}

/// `verify` takes named inputs, named labels and a loss per output: tensor by tensor, from each
/// side's own initial weights, on fresh batches.
#[test]
fn verify_takes_several_inputs_and_outputs() {
    let mesh = DeviceMesh::cpus(2).unwrap();
    let (x, y) = towers_data(32);
    let cfg = AutoConfig::new().min_params(0).loss(Loss::MeanSquaredError);
    let plan = cfg.plan_inputs(&towers(), &towers_specs(), 2, 1).unwrap();
    let options = VerifyOptions { own_init: true, ..VerifyOptions::rows(&x, &y, 8, 6).unwrap() };
    let report = verify_with(towers, &mesh, &plan, Adam::new(0.01), Loss::MeanSquaredError, options).unwrap();
    assert!(report.max_rel() < 1e-4, "{report}");

    let (x, y) = two_heads_data(48);
    let plan = AutoConfig::new().min_params(0).plan(&two_heads(), &[12, 6], 2, 1).unwrap();
    let options = VerifyOptions { outputs: losses(), ..VerifyOptions::rows(&x, y, 12, 6).unwrap() };
    let report = verify_with(two_heads, &mesh, &plan, Adam::new(0.01), Loss::MeanSquaredError, options).unwrap();
    assert!(report.max_rel() < 1e-4, "{report}");
    let outputs: Vec<&str> =
        report.differences.iter().filter(|d| d.what == "output").map(|d| d.path.as_str()).collect();
    assert_eq!(outputs, ["predict(x) \"price\"", "predict(x) \"kind\""]);
}
