//! On a GPU the training step applies its update before it reads anything back, and undoes a
//! step that then fails: the device runs forward, backward and update as one stream of work,
//! with one wait at the end. On the Cpu it checks first. Either way a refused step leaves
//! weights, slots, moving statistics and counters exactly as they were.

mod common;
use common::gpu;
use weft_core::{Device, GradStore, Result, Tensor, Var};
use weft_nn::layers::{BatchNormalization, Dense};
use weft_nn::optim::{Adam, Optimizer, Sgd};
use weft_nn::{Activation, FitOptions, Loss, Model, Sequential};

#[path = "common/state.rs"]
mod state;
use state::state;

/// Dense, batch norm (moving statistics: state updates), Dense.
fn model(dev: &Device, optimizer: impl Optimizer + 'static) -> Model {
    let net = Sequential::new()
        .add(Dense::new(8).activation(Activation::Relu).named("d1"))
        .add(BatchNormalization::new().named("bn"))
        .add(Dense::new(3).named("d2"));
    let mut m = Model::new(net, dev);
    m.compile(optimizer, Loss::SparseCategoricalCrossentropy { from_logits: true }, &[]).unwrap();
    m.build(&[4]).unwrap();
    m
}

fn batch(dev: &Device, seed: u64, poison: bool) -> (Tensor, Tensor) {
    let mut x = Tensor::rand(-1.0, 1.0, &[6, 4], seed, &Device::Cpu).unwrap().to_vec::<f32>().unwrap();
    if poison {
        x[5] = f32::NAN;
    }
    let x = Tensor::from_vec(x, &[6, 4], dev).unwrap();
    let y = Tensor::from_vec(vec![0u32, 1, 2, 1, 0, 2], &[6], dev).unwrap();
    (x, y)
}

fn gpu_of(dev: &Device) -> std::sync::Arc<weft_core::gpu::GpuContext> {
    match dev {
        Device::Gpu(g) => g.clone(),
        other => panic!("not a GPU: {other:?}"),
    }
}

#[test]
fn on_a_gpu_a_step_records_all_its_work_before_its_one_wait() {
    let Some(dev) = gpu() else { return };
    // Global-norm clipping too: its norm is worked out on the device, not read back.
    let mut m = model(&dev, Adam::new(0.01).clip_global_norm(0.5));
    let (x, y) = batch(&dev, 1, false);
    m.train_on_batch(&x, &y).unwrap();
    let g = gpu_of(&dev);
    for seed in 2..4 {
        let (x, y) = batch(&dev, seed, false);
        let kernel = m.variables()[0].1.to_vec::<f32>().unwrap();
        let a = g.activity();
        m.train_on_batch(&x, &y).unwrap();
        let after = g.activity();
        assert_eq!(after.waits - a.waits, 1, "one wait per step: {a:?} -> {after:?}");
        assert_eq!(after.since_last_wait, 0, "work recorded after the step's wait (the update ran after the read)");
        assert!(after.dispatches > a.dispatches);
        assert_ne!(m.variables()[0].1.to_vec::<f32>().unwrap(), kernel, "the step changed nothing");
    }
    // fit: one wait per batch (beyond a fixed number per call: fit checks every label before
    // its first step).
    let mut fit_waits = |n: usize| {
        let x = Tensor::rand(-1.0, 1.0, &[n, 4], 7, &dev).unwrap();
        let y = Tensor::from_vec((0..n as u32).map(|i| i % 3).collect::<Vec<_>>(), &[n], &dev).unwrap();
        let before = g.activity();
        let opts = FitOptions { epochs: 1, batch_size: 4, verbose: false, shuffle: false, ..Default::default() };
        m.fit(&x, &y, opts).unwrap();
        g.activity().waits - before.waits
    };
    let (three, six) = (fit_waits(12), fit_waits(24));
    assert_eq!(six - three, 3, "fit of 3 batches waited {three} times, of 6 batches {six} times");
}

/// Each optimizer configuration's own state: slots created by the first step, an EMA slot,
/// accumulated gradients, momentum.
fn optimizers() -> Vec<(&'static str, Box<dyn Optimizer>)> {
    vec![
        ("adam", Box::new(Adam::new(0.01))),
        (
            "adam+ema+accumulation+clip",
            Box::new(Adam::new(0.01).ema(0.9).gradient_accumulation_steps(2).clip_global_norm(1.0)),
        ),
        ("sgd+momentum", Box::new(Sgd::new(0.1).momentum(0.9))),
    ]
}

#[test]
fn a_step_that_fails_after_its_update_is_undone_exactly() {
    for dev in [Some(Device::Cpu), gpu()].into_iter().flatten() {
        for (name, opt) in optimizers() {
            for good_first in [0, 1, 2] {
                let mut m = model(&dev, opt.fork().expect("built-in optimizers fork"));
                for s in 0..good_first {
                    let (x, y) = batch(&dev, 10 + s, false);
                    m.train_on_batch(&x, &y).unwrap();
                }
                let before = state(&m);
                let (x, y) = batch(&dev, 20, true);
                let err = m.train_on_batch(&x, &y).unwrap_err().to_string();
                assert!(err.contains("not applied"), "{name} on {dev:?}: {err}");
                assert_eq!(state(&m), before, "{name} on {dev:?} after {good_first} good steps");
                if good_first == 0 {
                    assert!(m.optimizer().unwrap().slots().is_empty(), "{name}: a refused first step made slots");
                }
                // It trains on as if the refused step had never been tried.
                let mut twin = model(&dev, opt.fork().unwrap());
                for s in 0..good_first {
                    let (x, y) = batch(&dev, 10 + s, false);
                    twin.train_on_batch(&x, &y).unwrap();
                }
                let (x, y) = batch(&dev, 30, false);
                assert_eq!(m.train_on_batch(&x, &y).unwrap(), twin.train_on_batch(&x, &y).unwrap());
                assert_eq!(state(&m), state(&twin), "{name} on {dev:?}");
            }
        }
    }
}

/// An optimizer of the user's without `fork`: the step checks its figures before the update.
struct NoFork(Sgd);

impl Optimizer for NoFork {
    fn apply(&mut self, params: &[(String, Var)], grads: &GradStore) -> Result<()> {
        self.0.apply(params, grads)
    }
    fn iterations(&self) -> u64 {
        self.0.iterations()
    }
    fn learning_rate(&self) -> f32 {
        self.0.learning_rate()
    }
    fn slot(&self, path: &str, name: &str) -> Option<Tensor> {
        self.0.slot(path, name)
    }
    fn slots(&self) -> Vec<(String, String, Tensor)> {
        self.0.slots()
    }
    fn set_slot(&mut self, path: &str, name: &str, value: Tensor) {
        self.0.set_slot(path, name, value)
    }
    fn set_iterations(&mut self, n: u64) {
        self.0.set_iterations(n)
    }
    fn global_clipnorm(&self) -> Option<f32> {
        None
    }
    fn set_global_clipnorm(&mut self, _: Option<f32>) {}
}

#[test]
fn an_optimizer_that_cannot_fork_is_checked_before_its_update() {
    for dev in [Some(Device::Cpu), gpu()].into_iter().flatten() {
        let mut m = model(&dev, NoFork(Sgd::new(0.1).momentum(0.9)));
        let (x, y) = batch(&dev, 1, false);
        m.train_on_batch(&x, &y).unwrap();
        let before = state(&m);
        let (x, y) = batch(&dev, 2, true);
        assert!(m.train_on_batch(&x, &y).unwrap_err().to_string().contains("not applied"));
        assert_eq!(state(&m), before);
        if let Device::Gpu(g) = &dev {
            // The update is recorded after the read.
            let (x, y) = batch(&dev, 3, false);
            m.train_on_batch(&x, &y).unwrap();
            assert!(g.activity().since_last_wait > 0);
        }
    }
}
