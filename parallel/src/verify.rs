//! `verify`: train a model sharded and on one device from the same weights and data, and report
//! per tensor the largest difference of outputs, gradients, weights and optimizer state.

mod batches;
#[cfg(test)]
mod tests;

use crate::{DeviceMesh, ShardedModel, ShardingPlan};
use std::collections::HashMap;
use weft_core::{Error, GradStore, Result, Tensor, Var};
use weft_nn::optim::Optimizer;
use weft_nn::{Inputs, Layer, Loss, Model, OutputLoss};

/// Makes the batch `(x, y)` of each step (counted from 0): inputs and labels, each one tensor or
/// several by name.
pub type BatchSource<'a> = Box<dyn FnMut(usize) -> Result<(Inputs, Inputs)> + 'a>;

/// What `verify_with` trains on, and how.
pub struct VerifyOptions<'a> {
    /// Optimizer steps.
    pub steps: usize,
    /// The batch `(x, y)` of each step (counted from 0): both sides train on the same one.
    pub batches: BatchSource<'a>,
    /// Let the sharded model keep the weights it draws itself (each split variable only its own
    /// part, by `Initializer::init_part`) instead of being handed the one-device weights, and
    /// compare them before the first step (`initial weight`): this checks initialisation too.
    pub own_init: bool,
    /// A model of several outputs: each output's loss, weight and metrics (as
    /// `Model::compile_outputs`), in place of the one loss `verify_with` is given.
    pub outputs: Vec<OutputLoss>,
}

impl VerifyOptions<'static> {
    /// `steps` steps on batches of `batch` rows of `(x, y)` (first axis: samples), taken in a
    /// seeded order that is shuffled afresh on every pass over the rows, so that the model
    /// cannot memorise one batch. With `batch` at least the number of rows, every step trains on
    /// all of them.
    pub fn rows(x: impl Into<Inputs>, y: impl Into<Inputs>, batch: usize, steps: usize) -> Result<Self> {
        Ok(VerifyOptions {
            steps,
            batches: batches::rows(&x.into(), &y.into(), batch)?,
            own_init: false,
            outputs: Vec::new(),
        })
    }
}

/// The largest difference between one tensor on one device and sharded.
#[derive(Debug, Clone, PartialEq)]
pub struct Difference {
    /// `loss`, `output`, `gradient`, `weight`, `initial weight` (with `own_init`), or `slot <name>`.
    pub what: String,
    /// The variable's path (or the step for losses).
    pub path: String,
    /// max |one device - sharded|.
    pub max_abs: f32,
    /// `max_abs` over the largest |value| of the one-device tensor.
    pub max_rel: f32,
    /// The variable's one-device gradient is zero up to rounding (under 1e-6 of the model's
    /// largest), so the loss does not depend on it: the attention key bias, for one, since softmax
    /// ignores a constant added to every score. Adam turns such rounding noise into steps of its
    /// own, which no two orders of summation reproduce; these entries are compared in absolute
    /// terms and left out of `max_rel()`.
    pub zero_gradient: bool,
}

/// What `verify` found.
#[derive(Debug, Clone, PartialEq)]
pub struct VerifyReport {
    /// (one device, sharded) loss of every step.
    pub losses: Vec<(f32, f32)>,
    /// Every compared tensor.
    pub differences: Vec<Difference>,
}

impl VerifyReport {
    /// The largest relative difference (of the variables whose gradient is not zero).
    pub fn max_rel(&self) -> f32 {
        self.differences.iter().filter(|d| !d.zero_gradient).map(|d| d.max_rel).fold(0.0, f32::max)
    }
    /// The largest absolute difference of the variables whose gradient is zero up to rounding.
    pub fn zero_gradient_max_abs(&self) -> f32 {
        self.differences.iter().filter(|d| d.zero_gradient).map(|d| d.max_abs).fold(0.0, f32::max)
    }
    /// The entry with the largest relative difference (gradients not zero).
    pub fn worst(&self) -> Option<&Difference> {
        self.differences.iter().filter(|d| !d.zero_gradient).max_by(|a, b| a.max_rel.total_cmp(&b.max_rel))
    }
}

impl std::fmt::Display for VerifyReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "{:<12}{:<52}{:>12}{:>12}", "tensor", "path", "max abs", "max rel")?;
        for d in &self.differences {
            let note = if d.zero_gradient { "  (zero gradient: rounding noise)" } else { "" };
            writeln!(f, "{:<12}{:<52}{:>12.3e}{:>12.3e}{note}", d.what, d.path, d.max_abs, d.max_rel)?;
        }
        if let Some(w) = self.worst() {
            writeln!(f, "largest relative difference: {:.3e} ({} {})", w.max_rel, w.what, w.path)?;
        }
        Ok(())
    }
}

fn compare(what: &str, path: &str, a: &Tensor, b: &Tensor) -> Result<Difference> {
    if a.dims() != b.dims() {
        return Err(Error::ShapeMismatch { op: "verify", lhs: a.dims().to_vec(), rhs: b.dims().to_vec() });
    }
    let (a, b) = (a.to_vec::<f32>()?, b.to_vec::<f32>()?);
    let max_abs = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max);
    let scale = a.iter().map(|x| x.abs()).fold(0.0, f32::max);
    Ok(Difference {
        what: what.into(),
        path: path.into(),
        max_abs,
        max_rel: if scale > 0.0 { max_abs / scale } else { max_abs },
        zero_gradient: false,
    })
}

/// Keeps the last step's gradients of the optimizer it wraps.
struct Recording {
    inner: Box<dyn Optimizer>,
    last: std::sync::Arc<std::sync::Mutex<Vec<(String, Tensor)>>>,
}

impl Optimizer for Recording {
    fn apply(&mut self, params: &[(String, Var)], grads: &GradStore) -> Result<()> {
        let got = params.iter().filter_map(|(p, v)| grads.get(v).map(|g| (p.clone(), g.clone()))).collect();
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = got;
        self.inner.apply(params, grads)
    }
    crate::coordinated::delegate_state!(inner);
    fn last_step_skipped(&self) -> bool {
        self.inner.last_step_skipped()
    }
    fn global_clipnorm(&self) -> Option<f32> {
        self.inner.global_clipnorm()
    }
    fn set_global_clipnorm(&mut self, max_norm: Option<f32>) {
        self.inner.set_global_clipnorm(max_norm)
    }
}

/// Train `net()` for `steps` steps twice: on the mesh's first device alone, and sharded over
/// `mesh` by `plan`, both starting from the one-device model's weights, with the same optimizer,
/// loss and batches. Each step takes a fresh batch of the plan's batch size from the rows of
/// `(x, y)` (see `VerifyOptions::rows`: give more rows than one batch, or every step repeats
/// the same one and the last gradients shrink toward rounding noise as the model memorises it).
/// Report each step's two losses and, after the last step, the largest difference of the
/// outputs, every gradient, every weight and every optimizer slot. The plan is first checked
/// against the model ([`ShardingPlan::check_model`]) and the loss.
///
/// ```
/// use weft_core::{Device, Tensor};
/// use weft_nn::{layers::Dense, optim::Adam, Activation, Loss, Sequential};
/// use weft_parallel::{verify, AutoConfig, DeviceMesh};
/// let net = || Sequential::new().add(Dense::new(12).activation(Activation::Tanh)).add(Dense::new(3));
/// let mesh = DeviceMesh::cpus(2)?;
/// let plan = AutoConfig::new().min_params(0).plan(&net(), &[8, 5], 2, 1)?;
/// let x = Tensor::rand(-1.0, 1.0, &[32, 5], 1, &Device::Cpu)?; // four batches of 8
/// let y = Tensor::rand(-1.0, 1.0, &[32, 3], 2, &Device::Cpu)?;
/// let report = verify(net, &mesh, &plan, Adam::new(0.01), Loss::MeanSquaredError, (&x, &y), 3)?;
/// assert!(report.max_rel() < 1e-4, "{report}");
/// # Ok::<(), weft_core::Error>(())
/// ```
pub fn verify<L: Layer + 'static>(
    net: impl Fn() -> L,
    mesh: &DeviceMesh,
    plan: &ShardingPlan,
    optimizer: impl Optimizer + Clone + 'static,
    loss: Loss,
    data: (impl Into<Inputs>, impl Into<Inputs>),
    steps: usize,
) -> Result<VerifyReport> {
    let batch = plan.input_shape.first().copied().unwrap_or(1);
    verify_with(net, mesh, plan, optimizer, loss, VerifyOptions::rows(data.0, data.1, batch, steps)?)
}

/// [`verify`] with the batches made by `options` (any source: a closure per step), and
/// optionally with each side drawing its own initial weights.
pub fn verify_with<L: Layer + 'static>(
    net: impl Fn() -> L,
    mesh: &DeviceMesh,
    plan: &ShardingPlan,
    optimizer: impl Optimizer + Clone + 'static,
    loss: Loss,
    mut options: VerifyOptions<'_>,
) -> Result<VerifyReport> {
    plan.check_model(&net())?;
    plan.check_loss(&loss)?;
    let dev = &mesh.devices()[0];
    let mut one = Model::new(net(), dev);
    let last = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let recording = Recording { inner: Box::new(optimizer.clone()), last: last.clone() };
    let mut sharded = ShardedModel::new(&net, mesh, plan)?;
    if options.outputs.is_empty() {
        one.compile(recording, loss.clone(), &[])?;
        sharded.compile(optimizer, loss, &[])?;
    } else {
        one.compile_outputs(recording, &options.outputs)?;
        sharded.compile_outputs(optimizer, &options.outputs)?;
    }
    one.build_for(plan.sample_inputs(dev)?)?;
    let mut diffs = Vec::new();
    if options.own_init {
        let state: HashMap<String, Tensor> = sharded.full_state()?.into_iter().collect();
        for (p, v) in one.variables() {
            let other = state.get(&p).ok_or_else(|| Error::Msg(format!("verify: no sharded weight {p}")))?;
            diffs.push(compare("initial weight", &p, v.as_tensor(), other)?);
        }
    } else {
        // Start from the one-device weights, so that what follows compares training alone.
        sharded.set_state(&one.whole_state(false)?)?;
    }

    let steps = options.steps;
    let mut losses = Vec::with_capacity(steps);
    let mut x_last = None;
    for step in 0..steps {
        let (x, y) = (options.batches)(step)?;
        sharded.record_gradients(step + 1 == steps);
        let (l1, l2) = (one.train_on_batch(&x, &y)?, sharded.train_on_batch(&x, &y)?);
        losses.push((l1, l2));
        let d = (l1 - l2).abs();
        diffs.push(Difference {
            what: "loss".into(),
            path: format!("step {}", step + 1),
            max_abs: d,
            max_rel: d / l1.abs().max(f32::MIN_POSITIVE),
            zero_gradient: false,
        });
        x_last = Some(x);
    }
    let Some(x) = x_last else { return Ok(VerifyReport { losses, differences: diffs }) };
    // The last step's gradients (before clipping, on both sides).
    let g1 = last.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let g2: HashMap<String, Tensor> = sharded.gradients()?.into_iter().collect();
    for (p, g) in &g1 {
        let other = g2.get(p).ok_or_else(|| Error::Msg(format!("verify: no sharded gradient for {p}")))?;
        diffs.push(compare("gradient", p, g, other)?);
    }
    // Outputs, weights and optimizer state after the last step.
    let n = x.rows()?;
    let (mine, theirs) = (one.predict_outputs(&x, n)?, sharded.predict_outputs(&x, n)?);
    for ((name, a), (_, b)) in mine.entries().iter().zip(theirs.entries()) {
        let what = if name.is_empty() { "predict(x)".to_string() } else { format!("predict(x) {name:?}") };
        diffs.push(compare("output", &what, a, b)?);
    }
    let state: HashMap<String, Tensor> = sharded.full_state()?.into_iter().collect();
    for (p, v) in one.variables() {
        let other = state.get(&p).ok_or_else(|| Error::Msg(format!("verify: no sharded weight {p}")))?;
        diffs.push(compare("weight", &p, v.as_tensor(), other)?);
    }
    if let Some(opt) = one.optimizer() {
        for (p, name, t) in opt.slots() {
            let key = weft_nn::checkpoint::slot_key(&name, &p);
            let other = state.get(&key).ok_or_else(|| Error::Msg(format!("verify: no sharded slot {key}")))?;
            diffs.push(compare(&format!("slot {name}"), &p, &t, other)?);
        }
    }
    // Mark the variables the loss does not depend on (see `Difference::zero_gradient`).
    let scale = |t: &Tensor| -> Result<f32> { Ok(t.to_vec::<f32>()?.iter().fold(0f32, |m, v| m.max(v.abs()))) };
    let mut largest = 0f32;
    let mut gscale = HashMap::new();
    for (p, g) in &g1 {
        let s = scale(g)?;
        largest = largest.max(s);
        gscale.insert(p.clone(), s);
    }
    // Initial weights are drawn, not trained: no rounding for Adam to magnify.
    for d in diffs.iter_mut().filter(|d| !matches!(d.what.as_str(), "loss" | "output" | "initial weight")) {
        d.zero_gradient = gscale.get(&d.path).is_some_and(|&s| s <= 1e-6 * largest);
    }
    Ok(VerifyReport { losses, differences: diffs })
}
