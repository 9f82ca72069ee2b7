//! `Model`: a layer plus an optimizer, a loss and metrics, with Keras' `compile`, `fit`,
//! `evaluate`, `predict` and `summary`.

mod step;

use crate::callback::{Callback, Control};
use crate::data::Dataset;
use crate::layer::join;
use crate::optim::Optimizer;
use crate::outputs::Heads;
use crate::sample_weights;
use crate::tp::{Placement, TpCtx, split_sizes, split_start, vocab_parallel_cross_entropy};
use crate::{Ctx, Inputs, Layer, Loss, Metric, OutputLoss};
use std::collections::{BTreeMap, HashMap};
use std::io::IsTerminal;
use std::sync::Arc;
use weft_core::ReduceKind;
use weft_core::collectives::gather_from_parallel;
use weft_core::{DType, Device, Error, Result, Tensor, Var, no_grad, trace};

/// Options of [`Model::fit`].
pub struct FitOptions {
    /// Passes over the data.
    pub epochs: usize,
    /// Samples per training step.
    pub batch_size: usize,
    /// Shuffle the samples every epoch (seeded by `seed`).
    pub shuffle: bool,
    /// Seed of the shuffle, the dropout masks and the initial weights.
    pub seed: u64,
    /// Hold out this fraction of the samples (the last ones, as Keras does) for validation.
    pub validation_split: f32,
    /// Validation data given explicitly (wins over `validation_split`): inputs and labels, each
    /// one tensor or several by name (`(x.into(), y.into())`).
    pub validation_data: Option<(Inputs, Inputs)>,
    /// Validate after every `validation_freq`-th epoch only (Keras' `validation_freq`; 1: every
    /// epoch). The History's validation series then hold those epochs' figures, and a callback
    /// that monitors one skips the epochs without it.
    pub validation_freq: usize,
    /// Show progress: a bar per epoch on a terminal, one line per epoch otherwise.
    pub verbose: bool,
    /// Called after every epoch (EarlyStopping, ModelCheckpoint, closures).
    pub callbacks: Vec<Box<dyn Callback>>,
    /// The epoch to start at (Keras' `initial_epoch`): training runs epochs `initial_epoch` to
    /// `epochs - 1`, each shuffled as it would be in an uninterrupted run, so a run resumed from a
    /// checkpoint of epoch k continues with `initial_epoch: k`.
    pub initial_epoch: usize,
    /// Batches per epoch (`None`: all of them). As in Keras, the epochs walk on through the data:
    /// each takes the batches after the last one's, a new (reshuffled) pass starting where one
    /// ends.
    pub steps_per_epoch: Option<usize>,
    /// A weight for each training sample (Keras' `sample_weight`, `[samples]`): each loss is
    /// reduced with them as its [`Reduction`](crate::Reduction) says (the weighted sum over the
    /// number of values, by default). `validation_split` splits them with the samples, so the
    /// validation loss is weighted too. The metrics are not weighted, as Keras' `metrics`.
    pub sample_weight: Option<Tensor>,
    /// A weight for each class (Keras' `class_weight`), on a model of one output: each training
    /// sample weighs its class's weight (1 for a class not listed); validation samples are not
    /// weighted. Not together with `sample_weight`.
    pub class_weight: Option<HashMap<usize, f32>>,
}

impl Default for FitOptions {
    fn default() -> Self {
        FitOptions {
            epochs: 1,
            batch_size: 32,
            shuffle: true,
            seed: 0,
            validation_split: 0.0,
            validation_data: None,
            validation_freq: 1,
            verbose: true,
            callbacks: Vec::new(),
            initial_epoch: 0,
            steps_per_epoch: None,
            sample_weight: None,
            class_weight: None,
        }
    }
}

/// Per-epoch figures from [`Model::fit`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct History {
    /// Mean training loss of each epoch.
    pub loss: Vec<f32>,
    /// Training metrics of each epoch, by name.
    pub metrics: BTreeMap<String, Vec<f32>>,
    /// Validation loss of each epoch (empty without validation data).
    pub val_loss: Vec<f32>,
    /// Validation metrics of each epoch, by name.
    pub val_metrics: BTreeMap<String, Vec<f32>>,
    /// The epochs (indices into `loss`) the validation series hold, when `validation_freq`
    /// skipped some; empty when every epoch was validated.
    pub val_epochs: Vec<usize>,
}

impl History {
    /// The history as Keras' `history.history`: flat keys `loss`, each metric by the name it was
    /// compiled with (`accuracy`), and `val_` before each of those.
    ///
    /// ```
    /// use weft_nn::History;
    /// let mut h = History::default();
    /// h.loss.push(0.5);
    /// h.val_metrics.insert("accuracy".into(), vec![0.75]);
    /// let flat = h.flat();
    /// assert_eq!(flat["loss"], vec![0.5]);
    /// assert_eq!(flat["val_accuracy"], vec![0.75]);
    /// ```
    pub fn flat(&self) -> BTreeMap<String, Vec<f32>> {
        let mut out = BTreeMap::new();
        out.insert("loss".to_string(), self.loss.clone());
        for (k, v) in &self.metrics {
            out.insert(k.clone(), v.clone());
        }
        if !self.val_loss.is_empty() {
            out.insert("val_loss".to_string(), self.val_loss.clone());
        }
        for (k, v) in &self.val_metrics {
            out.insert(format!("val_{k}"), v.clone());
        }
        out
    }

    /// One series by its Keras key (`loss`, `val_loss`, `accuracy`, `val_accuracy`, ...).
    pub fn get(&self, key: &str) -> Option<Vec<f32>> {
        self.series(key).map(<[f32]>::to_vec)
    }

    /// The series of `key`, borrowed (what `flat` holds under it, without copying them all).
    fn series(&self, key: &str) -> Option<&[f32]> {
        match key {
            "loss" => Some(&self.loss),
            "val_loss" => (!self.val_loss.is_empty()).then_some(&self.val_loss[..]),
            _ => match key.strip_prefix("val_").and_then(|k| self.val_metrics.get(k)) {
                Some(v) => Some(v),
                None => self.metrics.get(key).map(Vec::as_slice),
            },
        }
    }

    /// The value of `key` at the latest epoch, if it was recorded then (validation figures are
    /// not recorded at every epoch under `validation_freq`).
    pub fn latest(&self, key: &str) -> Option<f32> {
        let series = self.series(key)?;
        let now = self.loss.len().checked_sub(1)?;
        let recorded = match key.starts_with("val_") && !self.val_epochs.is_empty() {
            true => self.val_epochs.last() == Some(&now),
            false => series.len() == self.loss.len(),
        };
        recorded.then(|| series.last().copied()).flatten()
    }
}

/// How a rank's loss on its part of a batch makes its share of the whole batch's loss (the sum
/// over a data axis).
enum Share {
    /// A mean over the part: weighted by the part's fraction of the batch.
    Part,
    /// A sum: as it is.
    Sum,
    /// A sum, to be divided by this divisor summed over the axis.
    Over(Tensor),
}

/// A trainable model.
pub struct Model {
    net: Box<dyn Layer>,
    device: Device,
    optimizer: Option<Box<dyn Optimizer>>,
    /// Shared, so a step reads it without copying it.
    heads: Option<Arc<Heads>>,
    ctx: Ctx,
    tp: Option<Arc<TpCtx>>,
    /// Whether the last step failed because its loss was not finite (`TerminateOnNaN` ends
    /// `fit` on it instead of returning the error).
    loss_not_finite: bool,
}

impl Model {
    /// A model running `net` on `device`.
    pub fn new(net: impl Layer + 'static, device: &Device) -> Self {
        Model {
            net: Box::new(net),
            device: device.clone(),
            optimizer: None,
            heads: None,
            ctx: Ctx::training(0),
            tp: None,
            loss_not_finite: false,
        }
    }

    /// Run as one rank of a sharded model (weft-parallel calls this on each rank's model): layers
    /// build and run their shards, the loss and metrics see whole outputs, and a data axis splits
    /// each batch.
    pub fn set_tensor_parallel(&mut self, tp: Arc<TpCtx>) {
        self.ctx.tp = Some(tp.clone());
        self.tp = Some(tp);
    }

    /// The tensor-parallel context, on a rank of a sharded model.
    pub fn tensor_parallel(&self) -> Option<&Arc<TpCtx>> {
        self.tp.as_ref()
    }

    /// The optimizer, mutable (to restore its slots).
    pub fn optimizer_mut(&mut self) -> Option<&mut (dyn Optimizer + 'static)> {
        self.optimizer.as_deref_mut()
    }

    /// Training steps taken so far (dropout masks are drawn from it).
    pub fn step_counter(&self) -> u64 {
        self.ctx.step
    }

    /// Set the training-step counter (what a checkpoint restores, so dropout masks continue).
    pub fn set_step_counter(&mut self, step: u64) {
        self.ctx.step = step;
    }

    /// The loss chosen at compile (of the first output with a loss, on a model of several).
    pub fn loss(&self) -> Option<Loss> {
        self.heads.as_ref().and_then(|h| h.list.first()).map(|(_, o)| o.loss.clone())
    }

    fn inference_ctx(&self) -> Ctx {
        Ctx { tp: self.tp.clone(), ..Ctx::inference() }
    }

    /// The model output whole: a split output is all-gathered (differentiably).
    fn whole(&self, pred: &Tensor) -> Result<Tensor> {
        match self.tp.as_ref().and_then(|tp| tp.output.as_ref().map(|s| (tp, s))) {
            Some((tp, sizes)) => gather_from_parallel(pred, tp.model.clone(), pred.rank() - 1, sizes),
            None => Ok(pred.clone()),
        }
    }

    /// The loss of a prediction; on a split output, sparse cross-entropy from logits runs on the
    /// shards (vocabulary-parallel), any other loss on the gathered output.
    fn loss_of(&self, loss_fn: &Loss, pred: &Tensor, y: &Tensor) -> Result<Tensor> {
        if let (Some(tp), Loss::SparseCategoricalCrossentropy { from_logits: true }) = (&self.tp, loss_fn)
            && let Some(sizes) = &tp.output
        {
            let labels = y.to_index("labels", Some(sizes.iter().sum()))?;
            return vocab_parallel_cross_entropy(pred, &labels, sizes, &tp.model);
        }
        loss_fn.compute(&self.whole(pred)?, y)
    }

    /// The loss of a prediction (the batch's mean: [`Share::Part`]), or, for a loss with weights
    /// or options, its weighted sum and what it is divided by (see [`Loss::weighted_parts`]).
    fn loss_parts(
        &self,
        loss_fn: &Loss,
        pred: &Tensor,
        y: &Tensor,
        weights: Option<&Tensor>,
    ) -> Result<(Tensor, Share)> {
        if weights.is_none() && !loss_fn.has_options() {
            return Ok((self.loss_of(loss_fn, pred, y)?, Share::Part));
        }
        Ok(match loss_fn.weighted_parts(&self.whole(pred)?, y, weights)? {
            (sum, Some(over)) => (sum, Share::Over(over)),
            (sum, None) => (sum, Share::Sum),
        })
    }

    /// Every label of a sparse loss must name a class of its output: checked over all of them
    /// before anything trains, so that a bad label in the last batch (or in the validation data,
    /// read after the first epoch) cannot fail `fit` after steps were applied. One row goes
    /// through the model to learn how many classes each output has.
    fn check_label_values(&self, op: &'static str, heads: &Heads, x: &Inputs, y: &Inputs, seed: u64) -> Result<()> {
        let sparse = |l: &Loss| matches!(l.base().0, Loss::SparseCategoricalCrossentropy { .. });
        if !heads.list.iter().any(|(_, o)| sparse(&o.loss)) {
            return Ok(());
        }
        let labels = heads.labels(op, y)?;
        let one = x.narrow(0, 1)?.to_device(&self.device)?;
        // Initial weights are drawn from the context's seed: the one this fit trains with.
        let mut ctx = self.inference_ctx();
        ctx.seed = seed;
        let preds = no_grad(|| self.forward(&one, &mut ctx))?;
        for ((at, o), y) in heads.list.iter().zip(&labels) {
            let Some(pred) = preds.get(*at).filter(|_| sparse(&o.loss)) else { continue };
            let classes = match self.tp.as_ref().and_then(|tp| tp.output.as_ref()) {
                // Logits left split over the vocabulary: their whole width.
                Some(sizes) => sizes.iter().sum(),
                None => pred.dims().last().copied().unwrap_or(0),
            };
            // Labels left out by `ignore_class` need name no class.
            let y = match o.loss.base().1 {
                Some(c) => {
                    let y = as_f32(y)?;
                    y.mul(&y.cmp_scalar(weft_core::ops::BinaryOp::Ne, c as f32)?)?
                }
                None => y.clone(),
            };
            y.to_index(&format!("{op}: labels"), Some(classes))?;
        }
        Ok(())
    }

    /// This rank's rows of a batch on a data axis, with their fraction of the batch.
    fn data_part(&mut self, x: &Inputs, y: &Inputs) -> Result<(Inputs, Inputs, f32)> {
        let Some(tp) = self.tp.as_ref().filter(|tp| tp.data.world_size() > 1) else {
            return Ok((x.clone(), y.clone(), 1.0));
        };
        let (n, d) = (x.rows()?, tp.data.world_size());
        if n < d {
            return Err(Error::invalid(
                "fit",
                format!("a batch of {n} samples cannot be split over a data axis of {d}: use batches of at least {d}"),
            ));
        }
        let sizes = split_sizes(n, d);
        let (s, len) = (split_start(&sizes, tp.data.rank()), sizes[tp.data.rank()]);
        self.ctx.batch_part = Some((s, n));
        Ok((x.narrow(s, len)?, y.narrow(s, len)?, len as f32 / n as f32))
    }

    /// Choose the optimizer, the loss and the metrics. Hyper-parameters out of range (a negative
    /// or NaN learning rate, `beta_1 = 1`, a bad schedule) and layers whose paths collide are an
    /// `Err`, and then the model is unchanged.
    ///
    /// On a model of several outputs, `loss` and `metrics` apply to each (Keras' one loss for
    /// all); [`compile_outputs`](Self::compile_outputs) gives each its own.
    pub fn compile(&mut self, optimizer: impl Optimizer + 'static, loss: Loss, metrics: &[Metric]) -> Result<()> {
        let heads = Heads::every(&self.net.output_names(), loss, metrics);
        self.compile_heads(Box::new(optimizer), heads)
    }

    /// Choose the optimizer and, for each output by name, its loss, weight and metrics (Keras'
    /// `loss={..}, loss_weights={..}, metrics={..}`). The total loss is the weighted sum; the
    /// history reports each output's loss and metrics under `{output}_loss`, `{output}_{metric}`.
    /// An `Err` names an output the model does not have, one given twice, or a bad weight.
    ///
    /// ```
    /// use weft_core::{Device, Tensor};
    /// use weft_nn::layers::Dense;
    /// use weft_nn::{optim::Adam, FitOptions, Functional, Inputs, Loss, Metric, Model, OutputLoss};
    /// let mut g = Functional::new("net");
    /// let x = g.input("x");
    /// let h = g.apply(Dense::new(8), &[x]);
    /// let (price, kind) = (g.apply(Dense::new(1), &[h]), g.apply(Dense::new(3), &[h]));
    /// let mut model = Model::new(g.outputs(&[("price", price), ("kind", kind)])?, &Device::Cpu);
    /// let ce = Loss::SparseCategoricalCrossentropy { from_logits: true };
    /// model.compile_outputs(
    ///     Adam::new(0.01),
    ///     &[OutputLoss::new("price", Loss::MeanSquaredError), OutputLoss::new("kind", ce).weight(0.5).metrics(&[Metric::Accuracy])],
    /// )?;
    /// let x = Tensor::rand(-1.0, 1.0, &[16, 4], 0, &Device::Cpu)?;
    /// let y = Inputs::from([("price", x.sum(&[1], true)?), ("kind", Tensor::zeros(&[16], &Device::Cpu)?)]);
    /// let h = model.fit(&x, y, FitOptions { epochs: 2, batch_size: 8, verbose: false, ..Default::default() })?;
    /// assert!(h.get("price_loss").is_some() && h.get("kind_accuracy").is_some());
    /// # Ok::<(), weft_core::Error>(())
    /// ```
    pub fn compile_outputs(&mut self, optimizer: impl Optimizer + 'static, outputs: &[OutputLoss]) -> Result<()> {
        let heads = Heads::named(&self.net.output_names(), outputs)?;
        self.compile_heads(Box::new(optimizer), heads)
    }

    fn compile_heads(&mut self, optimizer: Box<dyn Optimizer>, heads: Heads) -> Result<()> {
        optimizer.validate()?;
        crate::layer::check_paths(self.net.as_ref())?;
        if heads.list.len() > 1
            && let Some(tp) = &self.tp
            && tp.output.is_some()
        {
            return Err(Error::invalid("compile", "a model of several outputs cannot leave one split"));
        }
        // Each figure has its own History key: two metrics of one name would share a series
        // (and one named like a loss would hide it).
        let mut seen = std::collections::HashSet::new();
        for name in heads.metric_names() {
            let reserved = name == "loss" || name.ends_with("_loss") || name.starts_with("val_");
            if reserved || !seen.insert(name.clone()) {
                let why = if reserved { "is a name fit gives losses and validation figures" } else { "is given twice" };
                return Err(Error::invalid(
                    "compile",
                    format!("the metric name {name:?} {why}: give each metric (Metric::custom) a name of its own"),
                ));
            }
        }
        for m in heads.metrics() {
            m.validate()?;
        }
        self.optimizer = Some(optimizer);
        self.heads = Some(Arc::new(heads));
        Ok(())
    }

    /// The device the model runs on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The optimizer, once compiled (to read its slots and learning rate).
    pub fn optimizer(&self) -> Option<&dyn Optimizer> {
        self.optimizer.as_deref()
    }

    /// Every variable with its full path, e.g. `sequential/dense/kernel`.
    pub fn variables(&self) -> Vec<(String, Var)> {
        self.net.variables().into_iter().map(|(p, v)| (join(self.net.name(), &p), v)).collect()
    }

    /// The variables an optimizer trains (all but the non-trainable state, such as a batch
    /// norm's moving statistics), with their full paths.
    pub fn trainable_variables(&self) -> Vec<(String, Var)> {
        self.variables().into_iter().filter(|(_, v)| v.is_trainable()).collect()
    }

    /// The forward pass in inference mode, on one input or several named ones.
    pub fn call(&self, x: impl Into<Inputs>) -> Result<Tensor> {
        let mut ctx = self.inference_ctx();
        let x = x.into().to_device(&self.device)?;
        self.whole(&self.one_output("call", self.forward(&x, &mut ctx)?)?)
    }

    /// The network on `x`, its inputs put in the order the network names them: every output.
    fn forward(&self, x: &Inputs, ctx: &mut Ctx) -> Result<Vec<Tensor>> {
        // The losses the layers add are this batch's.
        ctx.losses.clear();
        let _s = crate::scope::root(self.net.as_ref());
        self.net.call_outputs(&x.ordered(&self.net.input_names())?, &[], ctx)
    }

    /// The output of a model that has one; an `Err` pointing to the per-output call otherwise.
    fn one_output(&self, op: &'static str, mut outs: Vec<Tensor>) -> Result<Tensor> {
        match outs.len() {
            1 => Ok(outs.swap_remove(0)),
            _ => Err(Error::invalid(
                op,
                format!(
                    "the model has the outputs {:?}: use predict_outputs to get each by name",
                    self.net.output_names()
                ),
            )),
        }
    }

    fn parts(&mut self) -> Result<(&mut Box<dyn Optimizer>, Arc<Heads>)> {
        match (self.optimizer.as_mut(), self.heads.clone()) {
            (Some(o), Some(h)) => Ok((o, h)),
            _ => Err(Error::invalid("fit", "call compile(optimizer, loss, metrics) first")),
        }
    }

    /// One optimizer step on one batch; returns the batch loss (the weighted sum over the
    /// outputs, on a model of several). A batch whose loss is not finite is an `Err`, and then
    /// no weight, slot or counter has changed.
    pub fn train_on_batch(&mut self, x: impl Into<Inputs>, y: impl Into<Inputs>) -> Result<f32> {
        let (x, y) = (x.into(), y.into());
        check_rows("train_on_batch", &x, &y)?;
        let (x, y) = (x.to_device(&self.device)?, y.to_device(&self.device)?);
        Ok(self.step(&x, &y, &mut [])?.0)
    }

    /// The loss of each head on `preds`, and their weighted sum. On a data axis (`part` of the
    /// batch here) each rank's loss is its share of the whole batch's: scaled by `part`, or,
    /// for a loss with weights or options, divided by the divisor summed over the axis (`sync`).
    fn head_losses(
        &self,
        heads: &Heads,
        preds: &[Tensor],
        labels: &[Tensor],
        weights: Option<&Tensor>,
        (part, sync): (f32, bool),
    ) -> Result<(Tensor, Vec<Tensor>)> {
        let mut per = Vec::with_capacity(heads.list.len());
        let mut total: Option<Tensor> = None;
        for ((at, o), y) in heads.list.iter().zip(labels) {
            let pred = preds.get(*at).ok_or_else(|| {
                Error::invalid(
                    "fit",
                    format!("the model gave {} outputs, the loss of {:?} wants #{at}", preds.len(), o.output),
                )
            })?;
            let (mut l, share) = self.loss_parts(&o.loss, pred, y, weights)?;
            match share {
                Share::Over(over) => {
                    let over = match self.tp.as_ref().filter(|_| sync) {
                        Some(tp) => no_grad(|| tp.data.all_reduce(&over, ReduceKind::Sum))?,
                        None => over,
                    };
                    l = l.div(&over)?;
                }
                // On a data axis each rank's loss is weighted by its share of the batch, so that
                // the sum over the axis (which the optimizer takes of the gradients) is the mean.
                Share::Part if part != 1.0 => l = l.mul_scalar(part)?,
                Share::Part | Share::Sum => {}
            }
            let w = if o.weight == 1.0 { l.clone() } else { l.mul_scalar(o.weight)? };
            total = Some(match total {
                Some(t) => t.add(&w)?,
                None => w,
            });
            per.push(l);
        }
        let total = total.ok_or_else(|| Error::invalid("fit", "no output has a loss"))?;
        Ok((total, per))
    }

    /// `loss` plus the weight penalties of the layers' regularizers and the losses the layers
    /// added (`added`: activity penalties), as Keras adds `model.losses`; on a data axis each
    /// rank adds its `part`, so the ranks' shares sum to the penalty once.
    fn with_penalties(&self, loss: Tensor, added: Vec<Tensor>, part: f32) -> Result<Tensor> {
        let mut p = crate::penalty::in_model::weight_penalty(self.net.as_ref(), self.tp.as_ref())?;
        for a in added {
            p = Some(match p {
                Some(p) => p.add(&a)?,
                None => a,
            });
        }
        match p {
            Some(p) if part != 1.0 => loss.add(&p.mul_scalar(part)?),
            Some(p) => loss.add(&p),
            None => Ok(loss),
        }
    }

    /// A metric's running state summed over the data axis.
    fn sum_over_data(&self, state: Vec<f64>) -> Result<Vec<f64>> {
        let Some(tp) = self.tp.as_ref().filter(|tp| tp.data.world_size() > 1) else { return Ok(state) };
        let v: Vec<f32> = state.iter().map(|s| *s as f32).collect();
        let t = tp.data.all_reduce(&Tensor::from_vec(v, &[state.len()], &Device::Cpu)?, ReduceKind::Sum)?;
        Ok(t.to_vec::<f32>()?.into_iter().map(f64::from).collect())
    }

    /// Train for `opts.epochs` passes over `(x, y)` (first axis: samples): one input and one
    /// label tensor, or several of each by name (labels by output name, on a model of several
    /// outputs). Integer labels are accepted for sparse losses. Arguments are checked before
    /// anything changes, the values of sparse labels (training and validation) included; a batch
    /// that fails part way through (a non-finite loss or gradient) returns `Err` with that
    /// batch's step not applied, and the steps before it kept, as Keras keeps them.
    pub fn fit(&mut self, x: impl Into<Inputs>, y: impl Into<Inputs>, mut opts: FitOptions) -> Result<History> {
        let (x, y): (Inputs, Inputs) = (x.into(), y.into());
        let heads = self.parts()?.1;
        crate::layer::check_paths(self.net.as_ref())?;
        check_rows("fit", &x, &y)?;
        heads.labels("fit", &y)?;
        if opts.batch_size == 0 {
            return Err(Error::invalid("fit", "batch_size must be at least 1"));
        }
        if opts.validation_freq == 0 {
            return Err(Error::invalid("fit", "validation_freq must be at least 1"));
        }
        if opts.steps_per_epoch == Some(0) {
            return Err(Error::invalid("fit", "steps_per_epoch must be at least 1"));
        }
        let s = opts.validation_split;
        if !(0.0..1.0).contains(&s) {
            return Err(Error::invalid("fit", format!("validation_split must be in [0, 1), got {s}")));
        }
        // The training data first: on a model not yet built, its row builds the layers (with
        // the seed of this fit, as its first step would), never a validation row of another width.
        self.check_label_values("fit", &heads, &x, &y, opts.seed)?;
        if let Some((vx, vy)) = &opts.validation_data {
            check_rows("fit (validation_data)", vx, vy)?;
            heads.labels("fit (validation_data)", vy)?;
            self.check_label_values("fit (validation_data)", &heads, vx, vy, opts.seed)?;
        }
        let weights = match (&opts.sample_weight, &opts.class_weight) {
            (Some(_), Some(_)) => {
                return Err(Error::invalid("fit", "give sample_weight or class_weight, not both (as Keras)"));
            }
            (Some(w), None) => Some(sample_weights::check("fit", w, x.rows()?)?),
            (None, Some(cw)) => match heads.labels("fit", &y)?.as_slice() {
                // Only the training rows: Keras weighs no validation row by its class.
                [labels] => {
                    let n = labels.dims().first().copied().unwrap_or(0);
                    let train = match (&opts.validation_data, opts.validation_split) {
                        (None, s) if s > 0.0 => crate::data::training_rows(n, s),
                        _ => n,
                    };
                    Some(sample_weights::from_classes(labels, cw, train)?)
                }
                _ => {
                    return Err(Error::invalid(
                        "fit",
                        "class_weight weighs the classes of a model of one output; give sample_weight instead",
                    ));
                }
            },
            (None, None) => None,
        };
        let y = match weights {
            Some(w) => sample_weights::attach(&y, w),
            None => y,
        };
        // Data moves to the device once; each batch is then one gather there.
        let all = Dataset::new(x.to_device(&self.device)?, &y)?;
        let n = all.len();
        let (train, val) = match (&opts.validation_data, opts.validation_split) {
            (Some((vx, vy)), _) => (all, Some(Dataset::new(vx.to_device(&self.device)?, vy)?)),
            (None, s) if s > 0.0 => {
                // The last samples, as Keras does: it keeps floor(n * (1 - s)) for training.
                let keep = crate::data::training_rows(n, s);
                if keep == 0 || keep == n {
                    return Err(Error::invalid(
                        "fit",
                        format!(
                            "validation_split {s} of {n} samples leaves {keep} to train on and {} to validate",
                            n - keep
                        ),
                    ));
                }
                (all.slice(0, keep)?, Some(all.slice(keep, n - keep)?))
            }
            _ => (all, None),
        };
        let batches = train.len().div_ceil(opts.batch_size);
        if let Some(k) = opts.steps_per_epoch.filter(|&k| k > batches) {
            return Err(Error::invalid(
                "fit",
                format!(
                    "steps_per_epoch {k}, but {} training samples in batches of {} give {batches} per epoch",
                    train.len(),
                    opts.batch_size
                ),
            ));
        }
        // The History's keys, as Keras names them, for the callbacks to check against.
        let mut keys = vec!["loss".to_string()];
        if heads.list.len() > 1 {
            keys.extend(heads.list.iter().map(|(_, o)| heads.figure(o, "loss")));
        }
        keys.extend(heads.metric_names());
        if val.is_some() {
            keys.extend(keys.clone().iter().map(|k| format!("val_{k}")));
        }
        for cb in opts.callbacks.iter_mut() {
            cb.on_train_begin(&keys, self)?;
        }
        // Only now, with every argument checked, does the model's seed change.
        self.ctx.seed = opts.seed;
        let train_n = train.len();
        let names = heads.metric_names();
        let per_output = heads.list.len() > 1;
        let mut history = History::default();
        let stop_on_non_finite = opts.callbacks.iter().any(|c| c.stops_on_non_finite_loss());
        'epochs: for epoch in opts.initial_epoch..opts.epochs {
            let start = std::time::Instant::now();
            for cb in opts.callbacks.iter_mut() {
                let current = self.optimizer.as_ref().map_or(0.0, |o| o.learning_rate());
                if let Some(lr) = cb.learning_rate(epoch, current, &history)? {
                    self.optimizer_mut()
                        .ok_or_else(|| {
                            Error::invalid("fit", "a callback set the learning rate, but nothing is compiled")
                        })?
                        .set_learning_rate(lr)?;
                }
            }
            let mut loss_sum = 0f64;
            let mut head_sums = vec![0f64; if per_output { heads.list.len() } else { 0 }];
            let mut counts: Vec<Vec<f64>> = heads.metrics().map(|m| vec![0.0; m.state_len()]).collect();
            let per_pass = train_n.div_ceil(opts.batch_size);
            let steps = per_pass.min(opts.steps_per_epoch.unwrap_or(usize::MAX));
            let bar =
                (opts.verbose && std::io::stdout().is_terminal()).then(|| progress_bar(epoch, opts.epochs, steps));
            let mut seen = 0usize;
            // With steps_per_epoch, epochs walk on through the data, as Keras' do: epoch e takes
            // batches e * steps onward of passes that are each shuffled afresh (without it, pass
            // and epoch are one). Derived from the epoch, so a resumed run continues exactly.
            let first = epoch * steps;
            let (pass, skip) = (first / per_pass.max(1), first % per_pass.max(1));
            let order_of =
                |p: usize| train.batches(opts.batch_size, opts.shuffle.then(|| opts.seed.wrapping_add(p as u64)));
            // The next pass's order is drawn only when this epoch runs into it.
            let spill = (skip + steps > per_pass).then(|| order_of(pass + 1));
            for b in order_of(pass).starting_at(skip).chain(spill.into_iter().flatten()).take(steps) {
                let (bx, by) = b?;
                let len = bx.rows()?;
                let (l, per) = match self.step(&bx, &by, &mut counts) {
                    Err(_) if self.loss_not_finite && stop_on_non_finite => {
                        if opts.verbose {
                            println!(
                                "Epoch {}: a batch's loss was not finite; training stops (TerminateOnNaN)",
                                epoch + 1
                            );
                        }
                        break 'epochs;
                    }
                    other => other?,
                };
                if !l.is_finite() {
                    return Err(Error::invalid("fit", format!("the loss became {l} at epoch {}", epoch + 1)));
                }
                loss_sum += l as f64 * len as f64;
                for (s, v) in head_sums.iter_mut().zip(per) {
                    *s += v as f64 * len as f64;
                }
                seen += len;
                if let Some(bar) = &bar {
                    let now: Vec<f32> = heads.metrics().zip(&counts).map(|(m, c)| m.result(c)).collect();
                    bar.set_message(running_line(loss_sum / seen as f64, &names, &now));
                    bar.inc(1);
                }
            }
            if let Some(bar) = bar {
                bar.finish_and_clear();
            }
            let seen = seen.max(1) as f64;
            history.loss.push((loss_sum / seen) as f32);
            for ((_, o), s) in heads.list.iter().zip(&head_sums) {
                history.metrics.entry(heads.figure(o, "loss")).or_default().push((s / seen) as f32);
            }
            for ((name, m), c) in names.iter().zip(heads.metrics()).zip(&counts) {
                history.metrics.entry(name.clone()).or_default().push(m.result(c));
            }
            if let Some(v) = val.as_ref().filter(|_| (epoch + 1) % opts.validation_freq == 0) {
                let (vx, vy) = v.inputs();
                let (vl, vm) = self.evaluate(vx, vy, opts.batch_size)?;
                if opts.validation_freq > 1 {
                    history.val_epochs.push(history.loss.len() - 1);
                }
                history.val_loss.push(vl);
                for (name, v) in vm {
                    history.val_metrics.entry(name).or_default().push(v);
                }
            }
            if opts.verbose {
                println!("{}", epoch_line(epoch, opts.epochs, &history, start.elapsed()));
            }
            let mut stop = false;
            for cb in opts.callbacks.iter_mut() {
                stop |= cb.on_epoch_end(epoch, &history, self)? == Control::Stop;
            }
            if let Some(tp) = &self.tp {
                // Every rank of a sharded model stops together, or none does.
                let flag = Tensor::from_vec(vec![f32::from(u8::from(stop))], &[1], &Device::Cpu)?;
                let any = tp.data.all_reduce(&tp.model.all_reduce(&flag, ReduceKind::Max)?, ReduceKind::Max)?;
                stop = any.to_vec::<f32>()?[0] > 0.0;
            }
            if stop {
                break;
            }
        }
        // With an EMA the weights take their averages (Keras' finalize_variable_values).
        if opts.epochs > opts.initial_epoch {
            let vars = self.trainable_variables();
            self.parts()?.0.finalize(&vars)?;
        }
        for cb in opts.callbacks.iter_mut() {
            cb.on_train_end(&history, self)?;
        }
        Ok(history)
    }

    /// Mean loss and metrics over `(x, y)`, in batches, without training. On a model of several
    /// outputs the loss is the weighted total, and the figures start with each output's loss
    /// (`{output}_loss`).
    pub fn evaluate(
        &mut self,
        x: impl Into<Inputs>,
        y: impl Into<Inputs>,
        batch_size: usize,
    ) -> Result<(f32, Vec<(String, f32)>)> {
        let (x, y): (Inputs, Inputs) = (x.into(), y.into());
        let heads = self.parts()?.1;
        check_rows("evaluate", &x, &y)?;
        check_batch_size("evaluate", batch_size)?;
        let (y, weights) = sample_weights::take(&y);
        let labels = heads.labels("evaluate", &y)?;
        let weights = weights.map(|w| w.to_device(&self.device)).transpose()?;
        let x = x.to_device(&self.device)?;
        let labels: Vec<Tensor> = labels.iter().map(|l| as_f32(&l.to_device(&self.device)?)).collect::<Result<_>>()?;
        let n = x.rows()?;
        // On a data axis each batch is split over the ranks as in `fit` (a batch smaller than
        // the axis is taken whole by every rank and counted by the first), so that a loss whose
        // value depends on the batch (a sum, a weighted mean) is the one device's; the sums are
        // added up at the end.
        let data =
            self.tp.as_ref().filter(|tp| tp.data.world_size() > 1).map(|tp| (tp.data.rank(), tp.data.world_size()));
        let per_output = heads.list.len() > 1;
        // [total, each output's loss (several outputs), each metric's running state]
        let states: usize = heads.metrics().map(Metric::state_len).sum();
        let mut sums = vec![0f64; 1 + if per_output { heads.list.len() } else { 0 } + states];
        no_grad(|| -> Result<()> {
            let mut ctx = self.inference_ctx();
            for s in (0..n).step_by(batch_size.max(1)) {
                let len = batch_size.min(n - s);
                let (lo, mine, part, sync, counted) = match data {
                    Some((r, d)) if len >= d => {
                        let sizes = split_sizes(len, d);
                        (s + split_start(&sizes, r), sizes[r], sizes[r] as f32 / len as f32, true, true)
                    }
                    Some((r, _)) => (s, len, 1.0, false, r == 0),
                    None => (s, len, 1.0, false, true),
                };
                let bx = x.narrow(lo, mine)?;
                let by: Vec<Tensor> = labels.iter().map(|l| l.narrow(0, lo, mine)).collect::<Result<_>>()?;
                let bw = weights.as_ref().map(|w| w.narrow(0, lo, mine)).transpose()?;
                let preds = self.forward(&bx, &mut ctx)?;
                let (total, per) = self.head_losses(&heads, &preds, &by, bw.as_ref(), (part, sync))?;
                let total = self.with_penalties(total, std::mem::take(&mut ctx.losses), part)?;
                if !counted {
                    continue;
                }
                sums[0] += total.to_scalar::<f32>()? as f64 * len as f64;
                let mut i = 1;
                if per_output {
                    for l in &per {
                        sums[i] += l.to_scalar::<f32>()? as f64 * len as f64;
                        i += 1;
                    }
                }
                for ((at, o), y) in heads.list.iter().zip(&by) {
                    if o.metrics.is_empty() {
                        continue;
                    }
                    let pred = self.whole(&preds[*at])?;
                    for m in &o.metrics {
                        for v in m.update(&pred, y, o.loss.base().1)? {
                            sums[i] += v;
                            i += 1;
                        }
                    }
                }
            }
            Ok(())
        })?;
        if let Some(tp) = self.tp.as_ref().filter(|_| data.is_some()) {
            let v: Vec<f32> = sums.iter().map(|s| *s as f32).collect();
            let total = tp.data.all_reduce(&Tensor::from_vec(v, &[sums.len()], &Device::Cpu)?, ReduceKind::Sum)?;
            sums = total.to_vec::<f32>()?.into_iter().map(f64::from).collect();
        }
        let mean = |s: f64| (s / n.max(1) as f64) as f32;
        let mut figures = Vec::new();
        let mut i = 1;
        if per_output {
            for (_, o) in &heads.list {
                figures.push((heads.figure(o, "loss"), mean(sums[i])));
                i += 1;
            }
        }
        for (name, m) in heads.metric_names().into_iter().zip(heads.metrics()) {
            figures.push((name, m.result(&sums[i..i + m.state_len()])));
            i += m.state_len();
        }
        Ok((mean(sums[0]), figures))
    }

    /// [`evaluate`](Self::evaluate) with a weight per sample (Keras' `sample_weight`): the loss
    /// is reduced with them, the metrics are not weighted.
    ///
    /// ```
    /// use weft_core::{Device, Tensor};
    /// use weft_nn::{layers::Dense, optim::Sgd, Loss, Model, Sequential};
    /// let mut m = Model::new(Sequential::new().add(Dense::new(1)), &Device::Cpu);
    /// m.compile(Sgd::new(0.1), Loss::MeanSquaredError, &[])?;
    /// let (x, y) = (Tensor::ones(&[4, 2], &Device::Cpu)?, Tensor::zeros(&[4, 1], &Device::Cpu)?);
    /// let none = Tensor::zeros(&[4], &Device::Cpu)?;
    /// assert_eq!(m.evaluate_weighted(&x, &y, &none, 2)?.0, 0.0);
    /// # Ok::<(), weft_core::Error>(())
    /// ```
    pub fn evaluate_weighted(
        &mut self,
        x: impl Into<Inputs>,
        y: impl Into<Inputs>,
        sample_weight: &Tensor,
        batch_size: usize,
    ) -> Result<(f32, Vec<(String, f32)>)> {
        let (x, y): (Inputs, Inputs) = (x.into(), y.into());
        let w = sample_weights::check("evaluate", sample_weight, x.rows()?)?;
        self.evaluate(x, sample_weights::attach(&y, w), batch_size)
    }

    /// On a data axis: this rank's rows `lo..hi` of `n` (`None` off a data axis, or when `n` is
    /// too small to give every rank a row).
    fn data_rows(&self, n: usize) -> Option<(usize, usize)> {
        let tp = self.tp.as_ref().filter(|tp| tp.data.world_size() > 1)?;
        let d = tp.data.world_size();
        if n < d {
            return None;
        }
        let sizes = split_sizes(n, d);
        let lo = split_start(&sizes, tp.data.rank());
        Some((lo, lo + sizes[tp.data.rank()]))
    }

    /// Outputs for `x`, computed in batches, without training. On a data axis each rank predicts
    /// its own rows and the parts are gathered. A model of several outputs gives them with
    /// [`predict_outputs`](Self::predict_outputs).
    pub fn predict(&self, x: impl Into<Inputs>, batch_size: usize) -> Result<Tensor> {
        let outs = self.predict_outputs(x, batch_size)?;
        self.one_output("predict", outs.entries().iter().map(|(_, t)| t.clone()).collect())
    }

    /// Every output for `x`, by name (a model of one unnamed output gives it under ""), computed
    /// in batches without training.
    pub fn predict_outputs(&self, x: impl Into<Inputs>, batch_size: usize) -> Result<Inputs> {
        let x: Inputs = x.into();
        check_batch_size("predict", batch_size)?;
        let n = x.rows()?;
        if n == 0 {
            return Err(Error::invalid("predict", format!("inputs of shapes {:?} hold no samples", x.shapes())));
        }
        let x = x.to_device(&self.device)?;
        let rows = self.data_rows(n);
        let (lo, hi) = rows.unwrap_or((0, n));
        let mut names = self.net.output_names();
        if names.is_empty() {
            names.push(String::new());
        }
        no_grad(|| {
            let mut ctx = self.inference_ctx();
            let mut outs: Vec<Vec<Tensor>> = vec![Vec::new(); names.len()];
            for s in (lo..hi).step_by(batch_size.max(1)) {
                let preds = self.forward(&x.narrow(s, batch_size.min(hi - s))?, &mut ctx)?;
                for (o, p) in outs.iter_mut().zip(preds) {
                    o.push(self.whole(&p)?);
                }
            }
            let mut all = Inputs::new();
            for (name, parts) in names.iter().zip(outs) {
                let mine = Tensor::concat(&parts, 0)?;
                let whole = match (rows, &self.tp) {
                    (Some(_), Some(tp)) => tp.data.all_gather(&mine, 0)?,
                    _ => mine,
                };
                all = all.with(name, whole);
            }
            Ok(all)
        })
    }

    /// Build every layer's variables by running the model once on zeros of `[1, input_shape..]`.
    pub fn build(&self, input_shape: &[usize]) -> Result<()> {
        self.build_for(&self.zeros_for(input_shape)?)
    }

    /// Build every layer's variables by running the model once on `x` (one input or several
    /// named ones: a model of several inputs is built from a sample of each).
    pub fn build_for(&self, x: impl Into<Inputs>) -> Result<()> {
        let x = x.into().to_device(&self.device)?;
        no_grad(|| self.forward(&x, &mut self.inference_ctx()))?;
        crate::layer::check_paths(self.net.as_ref())
    }

    fn zeros_for(&self, input_shape: &[usize]) -> Result<Tensor> {
        let shape: Vec<usize> = std::iter::once(1).chain(input_shape.iter().copied()).collect();
        Tensor::zeros(&shape, &self.device)
    }

    /// Every variable (and, with `optimizer`, every optimizer slot and the step counter) whole,
    /// under the names a checkpoint uses. On a rank of a sharded model the split tensors are
    /// all-gathered over the model axis, so every rank of the group must call this together.
    pub fn whole_state(&self, optimizer: bool) -> Result<Vec<(String, Tensor)>> {
        use crate::checkpoint::{ITERATIONS_KEY, slot_key};
        crate::layer::check_paths(self.net.as_ref())?;
        let placements: HashMap<String, &Placement> = match &self.tp {
            Some(tp) => {
                tp.layers.iter().flat_map(|(lp, s)| s.vars.iter().map(move |(rel, p)| (join(lp, rel), p))).collect()
            }
            None => HashMap::new(),
        };
        let whole = |path: &str, t: &Tensor| -> Result<Tensor> {
            match (placements.get(path), &self.tp) {
                (Some(Placement::Shard { axis, .. }), Some(tp)) => tp.model.all_gather(t, *axis),
                _ => Ok(t.clone()),
            }
        };
        let mut all = Vec::new();
        for (p, v) in self.variables() {
            all.push((p.clone(), whole(&p, v.as_tensor())?));
        }
        if let (true, Some(opt)) = (optimizer, &self.optimizer) {
            for (p, name, t) in opt.slots() {
                all.push((slot_key(&name, &p), whole(&p, &t)?));
            }
            all.push((
                ITERATIONS_KEY.to_string(),
                Tensor::from_vec(vec![opt.iterations() as f32], &[1], &Device::Cpu)?,
            ));
        }
        Ok(all)
    }

    /// Whether this model writes files: always on one device; on a sharded model, only the
    /// first rank (the others take part in gathering the tensors).
    pub(crate) fn writes(&self) -> bool {
        self.tp.as_ref().is_none_or(|tp| tp.model.rank() == 0 && tp.data.rank() == 0)
    }

    /// Save every variable, by path, to a safetensors file (written to a temporary file, then renamed).
    pub fn save_weights(&self, path: impl AsRef<std::path::Path>) -> Result<()> {
        let vars = self.whole_state(false)?;
        if vars.is_empty() {
            return Err(Error::invalid("save_weights", "the model has no variables yet: build it or train it first"));
        }
        if self.writes() { crate::checkpoint::save(path, &vars) } else { Ok(()) }
    }

    /// Load weights saved by `save_weights` (or any safetensors file with the same names and
    /// shapes; f16 and bf16 are converted). Every missing name, unexpected name and wrong shape is
    /// listed in one `Err`, and then no variable is changed.
    pub fn load_weights(&self, path: impl AsRef<std::path::Path>) -> Result<()> {
        self.ready_to_load()?;
        self.set_weights(&crate::checkpoint::load(&path)?, path.as_ref())
    }

    fn ready_to_load(&self) -> Result<()> {
        crate::layer::check_paths(self.net.as_ref())?;
        if self.variables().is_empty() {
            return Err(Error::invalid(
                "load_weights",
                "the model has no variables yet: call build(input_shape) first",
            ));
        }
        Ok(())
    }

    /// Every variable from `file` (read from `source`), checked whole first; each tensor is made
    /// before any variable changes.
    fn set_weights(&self, file: &crate::checkpoint::Loaded, source: &std::path::Path) -> Result<()> {
        let vars = self.variables();
        let expected: Vec<(String, Vec<usize>)> = vars.iter().map(|(p, v)| (p.clone(), v.dims().to_vec())).collect();
        crate::checkpoint::check_weights(file, &expected, source)?;
        let mut made = Vec::with_capacity(vars.len());
        for (p, v) in &vars {
            let (shape, values) = &file[p];
            made.push((v, Tensor::from_slice(values, shape, v.device())?));
        }
        for (v, t) in made {
            v.set(&t)?;
        }
        Ok(())
    }

    /// Save the weights and the optimizer's state (its slots under `optimizer/<slot>/<variable
    /// path>` and its step counter), so that training resumes exactly where it stopped.
    ///
    /// The file's metadata also holds the exact step counts: the optimizer's (`weft.iterations`)
    /// and the dropout step (`weft.step`), so a resumed run draws the masks it would have drawn.
    pub fn save_checkpoint(&self, path: impl AsRef<std::path::Path>) -> Result<()> {
        use crate::checkpoint::{ITERATIONS_META, STEP_META};
        let all = self.whole_state(true)?;
        if all.is_empty() {
            return Err(Error::invalid(
                "save_checkpoint",
                "the model has no variables yet: build it or train it first",
            ));
        }
        let mut meta = vec![(STEP_META, self.ctx.step.to_string())];
        if let Some(opt) = &self.optimizer {
            meta.push((ITERATIONS_META, opt.iterations().to_string()));
        }
        if self.writes() { crate::checkpoint::save_with_metadata(path, &all, &meta) } else { Ok(()) }
    }

    /// Load what `save_checkpoint` wrote (weights, and the optimizer's slots and step counter
    /// when the file has them; compile first). Any mismatch is an `Err` and nothing changes.
    pub fn load_checkpoint(&mut self, path: impl AsRef<std::path::Path>) -> Result<()> {
        use crate::checkpoint::{parse_slot_key, resume_counts};
        let (file, meta) = crate::checkpoint::load_with_metadata(&path)?;
        let (iterations, step) = resume_counts(&file, &meta, path.as_ref())?;
        let vars = self.variables();
        for (key, (shape, _)) in &file {
            if let Some((_, var)) = parse_slot_key(key)
                && let Some((_, v)) = vars.iter().find(|(p, _)| p == var)
                && shape.as_slice() != v.dims()
            {
                return Err(Error::Msg(format!(
                    "loading {}: {key} has shape {shape:?}, its variable {:?}",
                    path.as_ref().display(),
                    v.dims()
                )));
            }
        }
        // Every tensor is made on the device before anything is replaced, so a failure here
        // leaves the model as it was.
        let mut slots = Vec::new();
        for (key, (shape, values)) in &file {
            if let Some((slot, var)) = parse_slot_key(key)
                && let Some((_, v)) = vars.iter().find(|(p, _)| p == var)
            {
                slots.push((var.to_string(), slot.to_string(), Tensor::from_slice(values, shape, v.device())?));
            }
        }
        if self.optimizer.is_none() && (iterations.is_some() || !slots.is_empty()) {
            return Err(Error::invalid(
                "load_checkpoint",
                format!(
                    "{} holds optimizer state but the model is not compiled: compile first, or use load_weights for the weights alone",
                    path.as_ref().display()
                ),
            ));
        }
        self.ready_to_load()?;
        // The file was read once, above; its weights go in from memory.
        self.set_weights(&file, path.as_ref())?;
        if let Some(step) = step {
            self.ctx.step = step;
        }
        let Some(opt) = self.optimizer.as_mut() else { return Ok(()) };
        for (var, slot, t) in slots {
            opt.set_slot(&var, &slot, t);
        }
        if let Some(it) = iterations {
            opt.set_iterations(it);
        }
        Ok(())
    }

    /// Keras' summary table: each of the model's layers by its own name and type, its output
    /// shape (`None` for the batch, as for a Keras model whose `Input` has `input_shape`), and
    /// its parameters (a layer's sublayers included); then the totals, with the optimizer's
    /// state once it has trained. `input_shape` is one sample's.
    pub fn summary(&self, input_shape: &[usize]) -> Result<String> {
        self.summary_probing(&self.zeros_for(input_shape)?.into(), false, false)
    }

    /// [`summary`](Self::summary) of the model run on `x`: one input, or a sample of each of
    /// several named ones (ids, attention mask, ...), which is how a model of several inputs
    /// shows its shapes.
    ///
    /// ```
    /// use weft_core::{Device, Tensor};
    /// use weft_nn::layers::{Concatenate, Dense};
    /// use weft_nn::{Functional, Inputs, Model};
    /// let mut g = Functional::new("two");
    /// let (a, b) = (g.input("a"), g.input("b"));
    /// let j = g.apply(Concatenate::new(-1), &[a, b]);
    /// let out = g.apply(Dense::new(2), &[j]);
    /// let model = Model::new(g.output(out)?, &Device::Cpu);
    /// let x = Inputs::from([("a", Tensor::zeros(&[1, 3], &Device::Cpu)?), ("b", Tensor::zeros(&[1, 4], &Device::Cpu)?)]);
    /// let table = model.summary_for(x)?;
    /// assert!(table.contains("│ dense (Dense)") && table.contains("(None, 2)") && table.contains("Total params: 16"));
    /// # Ok::<(), weft_core::Error>(())
    /// ```
    pub fn summary_for(&self, x: impl Into<Inputs>) -> Result<String> {
        self.summary_probing(&x.into(), false, true)
    }

    /// The summary with, when `expand_nested`, every layer's sublayers on rows of their own
    /// under it (Keras' `summary(expand_nested=True)`). From a sample `x` the shapes show `None`
    /// for every axis the model accepts at other sizes (a sequence length), as for a Keras
    /// `Input` declared with `None` there.
    pub fn summary_with(&self, x: impl Into<Inputs>, expand_nested: bool) -> Result<String> {
        self.summary_probing(&x.into(), expand_nested, true)
    }

    /// The summary; `probe` runs the model again with every axis one longer to find the free
    /// ones, else only the batch is free.
    fn summary_probing(&self, x: &Inputs, expand_nested: bool, probe: bool) -> Result<String> {
        let x = x.to_device(&self.device)?;
        let run = |x: &Inputs| no_grad(|| trace::trace(|| self.forward(x, &mut self.inference_ctx())));
        let (_, nodes) = run(&x)?;
        // The free axes: those whose size follows the input's. Every axis of every input grows
        // by one; a model that takes only one size along some axis is run again with the
        // batch alone grown.
        let grown = |all: bool| {
            x.map(|t| {
                let dims: Vec<usize> =
                    t.dims().iter().enumerate().map(|(a, &d)| if a == 0 || all { d + 1 } else { d }).collect();
                Tensor::zeros(&dims, t.device())?.to_dtype(t.dtype())
            })
        };
        let probed = if probe { run(&grown(true)?).ok() } else { None };
        let varied = match probed {
            Some((_, n)) => n,
            None => run(&grown(false)?).map(|(_, n)| n).unwrap_or_default(),
        };
        let slots = self.optimizer.as_ref().map(|o| o.slots()).filter(|s| !s.is_empty());
        let optimizer_params = slots.map(|s| s.iter().map(|(_, _, t)| t.numel()).sum::<usize>());
        Ok(crate::summary::render(self.net.as_ref(), &nodes, &[&varied], expand_nested, optimizer_params))
    }
}

/// Inputs and targets must hold the same positive number of samples along their first axis.
fn check_rows(op: &'static str, x: &Inputs, y: &Inputs) -> Result<()> {
    let shapes = |what: &str, t: &Inputs| match t.shapes().as_slice() {
        [one] => format!("{what} of shape {one:?}"),
        many => format!("{what} of shapes {many:?}"),
    };
    let n = x.rows().map_err(|e| Error::invalid(op, e.to_string()))?;
    let m = y.rows().map_err(|e| Error::invalid(op, format!("labels: {e}")))?;
    if m != n {
        return Err(Error::invalid(
            op,
            format!(
                "{} and {} must have the same number of samples along their first axis",
                shapes("x", x),
                shapes("y", y)
            ),
        ));
    }
    if n == 0 {
        return Err(Error::invalid(op, format!("{} holds no samples", shapes("x", x))));
    }
    Ok(())
}

fn check_batch_size(op: &'static str, batch_size: usize) -> Result<()> {
    if batch_size == 0 {
        return Err(Error::invalid(op, "batch_size must be at least 1"));
    }
    Ok(())
}

fn as_f32(t: &Tensor) -> Result<Tensor> {
    if t.dtype() == DType::F32 { Ok(t.clone()) } else { t.to_dtype(DType::F32) }
}

fn progress_bar(epoch: usize, epochs: usize, steps: usize) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(steps as u64);
    let style = indicatif::ProgressStyle::with_template(&format!(
        "Epoch {}/{epochs} {{bar:30}} {{pos}}/{{len}} [{{elapsed}}<{{eta}}, {{per_sec}}] {{msg}}",
        epoch + 1
    ));
    if let Ok(style) = style {
        bar.set_style(style);
    }
    bar
}

fn running_line(loss: f64, names: &[String], figures: &[f32]) -> String {
    let mut s = format!("loss: {loss:.4}");
    for (m, v) in names.iter().zip(figures) {
        s += &format!(" - {m}: {v:.4}");
    }
    s
}

/// The latest epoch's figures (the History starts at `initial_epoch`, and holds validation
/// figures only for the epochs that ran it).
fn epoch_line(epoch: usize, epochs: usize, h: &History, took: std::time::Duration) -> String {
    let mut s = format!("Epoch {}/{epochs} - {:.1}s", epoch + 1, took.as_secs_f32());
    for (k, _) in h.flat() {
        if let Some(v) = h.latest(&k) {
            s += &format!(" - {k}: {v:.4}");
        }
    }
    s
}
