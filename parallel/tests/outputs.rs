//! A model of two outputs (a shared trunk, a regression head and a classification head) trains
//! sharded over 2 and 3 Cpu devices exactly as on one device: the same weighted losses per
//! epoch, per output, and the same predictions. The one-device model is built by its first
//! training step and the sharded one before training: initial weights do not depend on when.

use weft_core::{Device, Tensor};
use weft_nn::layers::Dense;
use weft_nn::optim::Adam;
use weft_nn::{Activation, FitOptions, Functional, Inputs, Loss, Metric, Model, OutputLoss};
use weft_parallel::{AutoConfig, DeviceMesh, PlanInput, ShardedModel};

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

#[test]
fn a_two_output_model_trains_sharded_as_on_one_device() {
    let n = 48;
    let x = Tensor::rand(-1.0, 1.0, &[n, 6], 1, &Device::Cpu).unwrap();
    let kind: Vec<u32> = (0..n as u32).map(|i| (i * 5 + 1) % 12).collect();
    let y = Inputs::from([
        ("price", x.sum(&[1], true).unwrap()),
        ("kind", Tensor::from_vec(kind, &[n], &Device::Cpu).unwrap()),
    ]);
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
