//! `ShardedModel`: a model split over a mesh, with the API of `weft_nn::Model`.
//!
//! SPMD: every rank holds the same layer structure (built by the same factory) with only its own
//! shards, on its own device, and runs the same code on its own thread. The layers find their
//! shard in the plan and call the collective ops; nothing else crosses between ranks. Each call
//! (`fit`, `evaluate`, ...) runs on every rank at once and returns rank 0's answer.

#[cfg(feature = "mpi")]
mod parts;

use crate::comm::{InHost, World};
use crate::coordinated::CoordinatedOptimizer;
use crate::{DeviceMesh, ShardingPlan};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use weft_core::{Error, Result, Tensor};
use weft_nn::checkpoint::parse_slot_key;
use weft_nn::optim::Optimizer;
use weft_nn::tp::{Placement, TpCtx};
use weft_nn::{FitOptions, History, Inputs, Layer, Loss, Metric, Model, OutputLoss};

/// Where a rank's coordinated optimizer leaves the gradients it records.
type GradSlot = Arc<Mutex<Vec<(String, Tensor)>>>;

/// A model split over the devices of a mesh.
///
/// ```
/// use weft_core::{Device, Tensor};
/// use weft_nn::{layers::Dense, optim::Adam, Activation, Loss, Sequential};
/// use weft_parallel::{AutoConfig, DeviceMesh, ShardedModel};
/// let net = || Sequential::new().add(Dense::new(16).activation(Activation::Relu)).add(Dense::new(4));
/// let mesh = DeviceMesh::cpus(2)?;
/// let plan = AutoConfig::new().min_params(0).plan(&net(), &[8, 6], 2, 1)?;
/// let mut model = ShardedModel::new(net, &mesh, &plan)?;
/// model.compile(Adam::new(0.01), Loss::MeanSquaredError, &[])?;
/// let x = Tensor::rand(-1.0, 1.0, &[8, 6], 0, &Device::Cpu)?;
/// let loss = model.train_on_batch(&x, &Tensor::zeros(&[8, 4], &Device::Cpu)?)?;
/// assert!(loss.is_finite());
/// # Ok::<(), weft_core::Error>(())
/// ```
pub struct ShardedModel {
    mesh: DeviceMesh,
    plan: ShardingPlan,
    /// This process's ranks (all of them, unless the mesh spans processes).
    ranks: Vec<Model>,
    /// Each local rank's rank in the mesh.
    global: Vec<usize>,
    world: Arc<World>,
    placements: HashMap<String, Placement>,
    recording: Arc<AtomicBool>,
    recorded: Vec<GradSlot>,
    /// One handle on each in-host group, to clear a failure.
    groups: Vec<InHost>,
}

impl ShardedModel {
    /// Build `net()` once per rank of `mesh`, each rank holding its shards of `plan` (made by
    /// [`autoconfig`](crate::autoconfig) for this model and this mesh's axes). The model is
    /// built here, so its weights are those `Model::build` draws on one device (`fit`'s seed then
    /// governs shuffling and dropout only).
    ///
    /// On a mesh that spans processes every process must call this together; a check that
    /// fails on one process fails it on every process (see [`Procs::vote`](crate::mpi::Procs::vote)).
    pub fn new<L: Layer + 'static>(net: impl Fn() -> L, mesh: &DeviceMesh, plan: &ShardingPlan) -> Result<Self> {
        // The checks one process could fail alone come first, then every process learns whether
        // all passed, before any of them waits in a collective.
        let checked = Self::check_new(&net, mesh, plan);
        let _plan_text = all_ok(mesh, "ShardedModel::new: checking the plan against the model", checked)?;
        // Processes that would train different plans are refused before anything is built.
        #[cfg(feature = "mpi")]
        if let Some(p) = mesh.procs() {
            p.agree_on("the sharding plan", &_plan_text)?;
        }
        let world = World::new();
        let comms = crate::groups::make(mesh, &world)?;
        // A rank of this process that fails tells the other processes too.
        #[cfg(feature = "mpi")]
        if let Some(p) = mesh.procs() {
            let p = p.clone();
            world.on_fail(Box::new(move |why| p.fail(why)));
        }
        let shards = plan.layer_shards();
        let mut ranks = Vec::with_capacity(comms.per_rank.len());
        let mut global = Vec::with_capacity(comms.per_rank.len());
        for ((g, dev), (model, data)) in mesh.local_ranks().into_iter().zip(comms.per_rank) {
            let tp = TpCtx { model, data, layers: shards.clone(), output: plan.output.clone() };
            let mut model = Model::new(net(), &dev);
            model.set_tensor_parallel(Arc::new(tp));
            ranks.push(model);
            global.push(g);
        }
        let recorded = (0..ranks.len()).map(|_| Arc::new(Mutex::new(Vec::new()))).collect();
        let mut me = ShardedModel {
            mesh: mesh.clone(),
            plan: plan.clone(),
            ranks,
            global,
            world,
            placements: plan.placements(),
            recording: Arc::new(AtomicBool::new(false)),
            recorded,
            groups: comms.in_host,
        };
        // Build every rank's shards (one forward pass on a one-row sample of every input), then
        // check them against the plan.
        let built = plan
            .sample_inputs(&weft_core::Device::Cpu)
            .and_then(|sample| me.run(|_, model| model.predict_outputs(&sample, 1).map(drop)))
            .and_then(|_| me.check_shapes());
        all_ok(mesh, "ShardedModel::new: building the shards", built)?;
        Ok(me)
    }

    /// What `new` checks before building: the mesh's axes, the plan's, and the plan against the
    /// traced model. Gives the plan's text (for processes to agree on).
    fn check_new<L: Layer + 'static>(net: &impl Fn() -> L, mesh: &DeviceMesh, plan: &ShardingPlan) -> Result<String> {
        let names: Vec<&str> = mesh.names().iter().map(String::as_str).collect();
        if !matches!(names.as_slice(), ["model"] | ["data"] | ["data", "model"]) {
            return Err(Error::invalid(
                "ShardedModel",
                format!("mesh axes {names:?}: use (\"model\"), (\"data\") or (\"data\", \"model\")"),
            ));
        }
        let (d, m) = (mesh.size("data"), mesh.size("model"));
        if (plan.data_axis, plan.model_axis) != (d, m) {
            return Err(Error::invalid(
                "ShardedModel",
                format!(
                    "the plan is for {} data x {} model ranks, the mesh has {d} x {m}",
                    plan.data_axis, plan.model_axis
                ),
            ));
        }
        // Checked against the traced model, not only its sizes: a hand-edited plan that pairs
        // layers across an op that does not keep the split is refused here.
        plan.check_model(&net())?;
        plan.to_json()
    }

    /// Plan `net()` for `mesh` with `cfg` (for inputs of `input_shape`, batch first) and build it
    /// split: the one call that takes a model from one device to several. `plan()` shows what was
    /// decided.
    ///
    /// ```
    /// use weft_nn::{layers::Dense, Activation, Sequential};
    /// use weft_parallel::{AutoConfig, DeviceMesh, ShardedModel};
    /// let net = || Sequential::new().add(Dense::new(512).activation(Activation::Relu)).add(Dense::new(128));
    /// let model = ShardedModel::auto(net, &DeviceMesh::cpus(2)?, &[16, 256], &AutoConfig::new())?;
    /// assert_eq!(model.plan().layers[0].style.name(), "column");
    /// # Ok::<(), weft_core::Error>(())
    /// ```
    pub fn auto<L: Layer + 'static>(
        net: impl Fn() -> L,
        mesh: &DeviceMesh,
        input_shape: &[usize],
        cfg: &crate::AutoConfig,
    ) -> Result<Self> {
        let plan = crate::autoconfig(&net(), input_shape, mesh, cfg)?;
        Self::new(net, mesh, &plan)
    }

    /// As [`auto`](Self::auto), for a model of several named inputs (each with its shape, batch
    /// first, and dtype).
    pub fn auto_inputs<L: Layer + 'static>(
        net: impl Fn() -> L,
        mesh: &DeviceMesh,
        inputs: &[crate::PlanInput],
        cfg: &crate::AutoConfig,
    ) -> Result<Self> {
        let plan = cfg.plan_inputs(&net(), inputs, mesh.size("model"), mesh.size("data"))?;
        Self::new(net, mesh, &plan)
    }

    fn check_shapes(&self) -> Result<()> {
        for (model, &rank) in self.ranks.iter().zip(&self.global) {
            let mi = self.mesh.coords(rank).1;
            let vars = model.variables();
            for (path, v) in &vars {
                let Some(p) = self.placements.get(path) else {
                    return Err(Error::invalid(
                        "ShardedModel",
                        format!("{path} is not in the plan: was it made for this model?"),
                    ));
                };
                let full = self.full_shape(path).unwrap_or_default();
                if p.local_shape(&full, mi) != v.dims() {
                    return Err(Error::invalid(
                        "ShardedModel",
                        format!(
                            "{path}: rank {rank} built shape {:?}, the plan wants {:?}",
                            v.dims(),
                            p.local_shape(&full, mi)
                        ),
                    ));
                }
            }
            if vars.len() != self.placements.len() {
                return Err(Error::invalid(
                    "ShardedModel",
                    format!(
                        "the model has {} variables, the plan {}: was it made for this model?",
                        vars.len(),
                        self.placements.len()
                    ),
                ));
            }
        }
        Ok(())
    }

    fn full_shape(&self, path: &str) -> Option<Vec<usize>> {
        self.plan.layers.iter().flat_map(|l| &l.variables).find(|v| v.path == path).map(|v| v.shape.clone())
    }

    /// Run `f` on every rank at once, one thread each. A rank that errs or panics fails the
    /// world, so the others leave their collectives with an `Err` instead of waiting; the error
    /// returned is the first rank's own (not a "another rank stopped" consequence).
    ///
    /// After a failure the ranks are checked: when every rank stopped with an error and they
    /// still agree on the optimizer's step count and the dropout step (as after a bad batch), the
    /// groups are cleared and the model stays usable; otherwise every later call is refused
    /// (load a checkpoint into a new `ShardedModel`).
    ///
    /// `f` must call the same collectives in the same order on every rank; a rank that returns
    /// `Ok` while the others still wait for it leaves them waiting.
    pub fn run<T: Send>(&mut self, f: impl Fn(usize, &mut Model) -> Result<T> + Sync) -> Result<Vec<T>> {
        if let Some(why) = self.world.failure() {
            return Err(Error::Collective(format!(
                "an earlier call left the ranks out of step ({why}); load a checkpoint into a new ShardedModel"
            )));
        }
        // Over processes every call starts by meeting the others on the world communicator: a
        // process that has ended (or is in another call) is an `Err` here, not a hang later.
        #[cfg(feature = "mpi")]
        if let Some(p) = self.mesh.procs() {
            p.agree("ShardedModel: starting a call on every rank", &[])?;
        }
        let first = self.global.first().copied().unwrap_or(0);
        let results = crate::comm::on_threads(self.ranks.iter_mut().collect(), &self.world, first, f);
        let all_failed = results.iter().all(|r| r.is_err());
        let mut out = Vec::with_capacity(results.len());
        let mut first: Option<Error> = None;
        for r in results {
            match r {
                Ok(v) => out.push(v),
                Err(e) => {
                    let consequence = matches!(&e, Error::Collective(m) if m.contains("stopped"));
                    if first.is_none() || (!consequence && matches!(&first, Some(Error::Collective(_)))) {
                        first = Some(e);
                    }
                }
            }
        }
        match first {
            Some(e) => {
                // Carry on only if every rank stopped with an error (none went on alone) and all
                // still agree on their optimizer step and their dropout step.
                let steps: Vec<(u64, u64)> = self
                    .ranks
                    .iter()
                    .map(|m| (m.optimizer().map_or(0, |o| o.iterations()), m.step_counter()))
                    .collect();
                // Across processes the others cannot be asked, so a failure there is final.
                if all_failed && steps.iter().all(|s| *s == steps[0]) && !self.spans_processes() {
                    self.groups.iter().for_each(InHost::reset);
                }
                Err(e)
            }
            None => Ok(out),
        }
    }

    /// Whether the mesh's ranks are in several processes.
    fn spans_processes(&self) -> bool {
        self.ranks.len() != self.mesh.len()
    }

    /// Refuse, before any rank starts, a batch the data axis cannot split.
    fn check_batch(&self, what: &str, rows: usize, x: &Inputs, y: Option<&Inputs>) -> Result<()> {
        let n = x.rows()?;
        if let Some(y) = y
            && y.rows()? != n
        {
            return Err(Error::invalid(
                "ShardedModel",
                format!(
                    "{what}: inputs of shapes {:?} and labels of shapes {:?} hold different numbers of samples",
                    x.shapes(),
                    y.shapes()
                ),
            ));
        }
        let d = self.mesh.size("data");
        if rows > 0 && rows < d {
            return Err(Error::invalid(
                "ShardedModel",
                format!("{what}: a batch of {rows} samples cannot be split over a data axis of {d}"),
            ));
        }
        Ok(())
    }

    /// Choose the optimizer (each rank gets a copy, wrapped in a [`CoordinatedOptimizer`]), the
    /// loss and the metrics.
    pub fn compile(
        &mut self,
        optimizer: impl Optimizer + Clone + 'static,
        loss: Loss,
        metrics: &[Metric],
    ) -> Result<()> {
        self.compile_with(optimizer, std::slice::from_ref(&loss), |model, opt| {
            model.compile(opt, loss.clone(), metrics)
        })
    }

    /// Choose the optimizer and each output's loss, weight and metrics, as
    /// [`Model::compile_outputs`].
    pub fn compile_outputs(
        &mut self,
        optimizer: impl Optimizer + Clone + 'static,
        outputs: &[OutputLoss],
    ) -> Result<()> {
        let losses: Vec<Loss> = outputs.iter().map(|o| o.loss.clone()).collect();
        self.compile_with(optimizer, &losses, |model, opt| model.compile_outputs(opt, outputs))
    }

    fn compile_with(
        &mut self,
        optimizer: impl Optimizer + Clone + 'static,
        losses: &[Loss],
        compile: impl Fn(&mut Model, CoordinatedOptimizer) -> Result<()>,
    ) -> Result<()> {
        // Checked once, whole, before any rank is changed (each rank's copy loses its clipping
        // to the coordinated wrapper).
        optimizer.validate()?;
        for loss in losses {
            self.plan.check_loss(loss)?;
        }
        let split: HashSet<String> =
            self.placements.iter().filter(|(_, p)| **p != Placement::Replicate).map(|(k, _)| k.clone()).collect();
        // A split variable's norm spans its ranks: clipping each shard to the norm would clip
        // the whole differently from one device.
        if let (Some(c), Some(first)) = (optimizer.clip_norm(), split.iter().min()) {
            return Err(Error::invalid(
                "ShardedModel::compile",
                format!(
                    "clip_norm({c}) clips each variable by its own norm, and {first} (and {} more) is split over ranks; use clip_global_norm, which weft computes over every rank, or clip_value",
                    split.len() - 1
                ),
            ));
        }
        // The coordinated optimizer clips each call's gradients; Keras clips the accumulated mean.
        if let (Some(c), Some(n)) = (optimizer.global_clipnorm(), optimizer.gradient_accumulation_steps()) {
            return Err(Error::invalid(
                "ShardedModel::compile",
                format!(
                    "clip_global_norm({c}) with gradient_accumulation_steps({n}) is not supported on a sharded model: clip each call's gradients with clip_value, or drop one of the two"
                ),
            ));
        }
        for (model, store) in self.ranks.iter_mut().zip(&self.recorded) {
            let tp = model.tensor_parallel().cloned().ok_or_else(|| Error::Msg("rank without a TpCtx".into()))?;
            let opt = CoordinatedOptimizer::new(
                Box::new(optimizer.clone()),
                tp.model.clone(),
                tp.data.clone(),
                split.clone(),
            )
            .with_recorder((self.recording.clone(), store.clone()));
            compile(model, opt)?;
        }
        Ok(())
    }

    /// Train, as `Model::fit`. The data axis splits each batch; only rank 0 prints. Each rank
    /// runs a copy of every callback (a callback that cannot be copied is an `Err`).
    pub fn fit(&mut self, x: impl Into<Inputs>, y: impl Into<Inputs>, opts: FitOptions) -> Result<History> {
        let (x, y): (Inputs, Inputs) = (x.into(), y.into());
        let (x, y) = (&x, &y);
        let prepared = self.prepare_fit(x, y, opts);
        let (per_rank, opts) = all_ok(&self.mesh, "ShardedModel::fit: checking the data and callbacks", prepared)?;
        let (epochs, batch_size, shuffle, seed) = (opts.epochs, opts.batch_size, opts.shuffle, opts.seed);
        let (validation_split, validation_freq, verbose) = (opts.validation_split, opts.validation_freq, opts.verbose);
        let (initial_epoch, steps_per_epoch) = (opts.initial_epoch, opts.steps_per_epoch);
        let validation_data = &opts.validation_data;
        let (sample_weight, class_weight) = (&opts.sample_weight, &opts.class_weight);
        let global = self.global.clone();
        let mut h = self.run(|r, model| {
            let callbacks = std::mem::take(&mut *per_rank[r].lock().unwrap_or_else(|p| p.into_inner()));
            let o = FitOptions {
                epochs,
                batch_size,
                shuffle,
                seed,
                validation_split,
                validation_data: validation_data.clone(),
                validation_freq,
                verbose: verbose && global[r] == 0,
                callbacks,
                initial_epoch,
                steps_per_epoch,
                sample_weight: sample_weight.clone(),
                class_weight: class_weight.clone(),
            };
            model.fit(x, y, o)
        })?;
        Ok(h.swap_remove(0))
    }

    /// Each rank's copies of the callbacks, after checking that every batch `fit` will make
    /// splits over the data axis.
    #[allow(clippy::type_complexity)]
    fn prepare_fit(
        &self,
        x: &Inputs,
        y: &Inputs,
        opts: FitOptions,
    ) -> Result<(Vec<Mutex<Vec<Box<dyn weft_nn::callback::Callback>>>>, FitOptions)> {
        // Every rank runs its own copy of each callback: they see the same history, and each
        // restores or saves through its own rank (ModelCheckpoint gathers, one rank writes).
        let mut per_rank: Vec<Mutex<Vec<Box<dyn weft_nn::callback::Callback>>>> = Vec::new();
        for r in 0..self.ranks.len() {
            let copies = opts
                .callbacks
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    if r == 0 {
                        return Ok(None);
                    }
                    c.clone_box().map(Some).ok_or_else(|| {
                        Error::invalid(
                            "ShardedModel::fit",
                            format!("callback {i} cannot be copied to every rank (clone_box)"),
                        )
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            per_rank.push(Mutex::new(copies.into_iter().flatten().collect()));
        }
        let mut opts = opts;
        *per_rank[0].get_mut().unwrap_or_else(|p| p.into_inner()) = std::mem::take(&mut opts.callbacks);
        // The batches fit will make: every one must split over the data axis.
        let n = x.rows()?;
        let train = match (&opts.validation_data, opts.validation_split) {
            // What Model::fit keeps for training, as Keras: floor(n * (1 - s)).
            (None, s) if s > 0.0 && n > 0 => weft_nn::data::training_rows(n, s),
            _ => n,
        };
        if opts.batch_size > 0 {
            self.check_batch("fit", opts.batch_size.min(train), x, Some(y))?;
            let last = train % opts.batch_size;
            self.check_batch("fit (the last batch of each epoch)", last, x, Some(y))?;
        }
        Ok((per_rank, opts))
    }

    /// One optimizer step on one batch; returns the batch loss.
    pub fn train_on_batch(&mut self, x: impl Into<Inputs>, y: impl Into<Inputs>) -> Result<f32> {
        let (x, y): (Inputs, Inputs) = (x.into(), y.into());
        let checked = x.rows().and_then(|rows| self.check_batch("train_on_batch", rows, &x, Some(&y)));
        all_ok(&self.mesh, "ShardedModel::train_on_batch: checking the batch", checked)?;
        Ok(self.run(|_, m| m.train_on_batch(&x, &y))?[0])
    }

    /// Mean loss and metrics over `(x, y)`.
    pub fn evaluate(
        &mut self,
        x: impl Into<Inputs>,
        y: impl Into<Inputs>,
        batch_size: usize,
    ) -> Result<(f32, Vec<(String, f32)>)> {
        let (x, y): (Inputs, Inputs) = (x.into(), y.into());
        let checked = self.check_batch("evaluate", 0, &x, Some(&y));
        all_ok(&self.mesh, "ShardedModel::evaluate: checking the data", checked)?;
        Ok(self.run(|_, m| m.evaluate(&x, &y, batch_size))?.swap_remove(0))
    }

    /// Whole outputs for `x` (gathered from the shards).
    pub fn predict(&mut self, x: impl Into<Inputs>, batch_size: usize) -> Result<Tensor> {
        let x: Inputs = x.into();
        Ok(self.run(|_, m| m.predict(&x, batch_size))?.swap_remove(0))
    }

    /// Every output for `x`, by name, whole, as [`Model::predict_outputs`].
    pub fn predict_outputs(&mut self, x: impl Into<Inputs>, batch_size: usize) -> Result<Inputs> {
        let x: Inputs = x.into();
        Ok(self.run(|_, m| m.predict_outputs(&x, batch_size))?.swap_remove(0))
    }

    /// The plan, then rank 0's summary of the model run on `x` (its shapes are its shards'), as
    /// [`Model::summary_for`] for a model of several inputs.
    pub fn summary_for(&mut self, x: impl Into<Inputs>) -> Result<String> {
        let x: Inputs = x.into();
        let s = self.run(|_, m| m.summary_for(&x))?.swap_remove(0);
        Ok(format!("{}\nRank 0 of {} ({}):\n{s}", self.plan, self.mesh.len(), self.mesh.describe()))
    }

    /// The plan, then rank 0's summary (its shapes are its shards').
    pub fn summary(&mut self, input_shape: &[usize]) -> Result<String> {
        let shape: Vec<usize> = std::iter::once(1).chain(input_shape.iter().copied()).collect();
        self.summary_for(weft_core::Tensor::zeros(&shape, &weft_core::Device::Cpu)?)
    }

    /// Keep each step's gradients (synchronized, before clipping) for [`gradients`](Self::gradients).
    pub fn record_gradients(&self, on: bool) {
        self.recording.store(on, Ordering::Relaxed);
    }

    /// The last recorded step's gradients, whole (gathered over the model axis), by variable path.
    pub fn gradients(&mut self) -> Result<Vec<(String, Tensor)>> {
        let placements = self.placements.clone();
        let stores = self.recorded.clone();
        let mut all = self.run(|r, m| {
            let tp = m.tensor_parallel().cloned().ok_or_else(|| Error::Msg("rank without a TpCtx".into()))?;
            let grads = stores[r].lock().unwrap_or_else(|p| p.into_inner()).clone();
            grads
                .into_iter()
                .map(|(p, g)| {
                    let whole = match placements.get(&p) {
                        Some(Placement::Shard { axis, .. }) => tp.model.all_gather(&g, *axis)?,
                        _ => g,
                    };
                    Ok((p, whole))
                })
                .collect::<Result<Vec<_>>>()
        })?;
        Ok(all.swap_remove(0))
    }

    /// Time each rank has spent in collectives so far, on average (copies to and from the host,
    /// waiting for the other ranks, reducing).
    pub fn collective_time(&self) -> std::time::Duration {
        self.world.collective_time() / self.ranks.len().max(1) as u32
    }

    /// The plan the model runs.
    pub fn plan(&self) -> &ShardingPlan {
        &self.plan
    }

    /// The mesh.
    pub fn mesh(&self) -> &DeviceMesh {
        &self.mesh
    }

    /// Each rank's model (its variables are its shards), to inspect: this process's ranks, when
    /// the mesh spans processes. Anything that communicates
    /// (`save_weights`, `call`, ...) must run on every rank at once, through [`run`](Self::run).
    pub fn ranks(&self) -> &[Model] {
        &self.ranks
    }

    /// Every variable and optimizer slot, whole (gathered over the model axis), as a checkpoint
    /// names them: variable paths, `optimizer/<slot>/<path>`, `optimizer/iterations`.
    pub fn full_state(&mut self) -> Result<Vec<(String, Tensor)>> {
        Ok(self.run(|_, m| m.whole_state(true))?.swap_remove(0))
    }

    /// Save whole weights (no optimizer state) to a safetensors file a single-device model loads.
    /// Over several processes, process 0 writes it, and every process returns its `Result`.
    pub fn save_weights(&mut self, path: impl AsRef<std::path::Path>) -> Result<()> {
        let state: Vec<(String, Tensor)> = self
            .full_state()?
            .into_iter()
            .filter(|(k, _)| !k.starts_with(weft_nn::checkpoint::OPTIMIZER_PREFIX))
            .collect();
        let written = if self.mesh.process() == 0 { weft_nn::checkpoint::save(path, &state) } else { Ok(()) };
        all_ok(&self.mesh, "ShardedModel::save_weights: writing the file", written)
    }

    /// Save whole weights and optimizer state: what `Model::load_checkpoint` reads, and what a
    /// `ShardedModel` on any mesh reads.
    /// The exact step counts go in the metadata, as `Model::save_checkpoint` writes them.
    ///
    /// Over several processes, each process writes the parts it holds to a file of its own and
    /// process 0 writes the index at `path` ([`weft_nn::checkpoint::Index`]); loading `path`
    /// gives whole tensors, on one device or on any mesh. Every process returns `Err` if any
    /// process's write failed, and then the checkpoint at `path` is still the one before.
    pub fn save_checkpoint(&mut self, path: impl AsRef<std::path::Path>) -> Result<()> {
        #[cfg(feature = "mpi")]
        if self.spans_processes() {
            return self.save_parts(path.as_ref());
        }
        let state = self.full_state()?;
        weft_nn::checkpoint::save_with_metadata(path, &state, &self.step_meta())
    }

    /// The step counts a checkpoint's metadata holds.
    fn step_meta(&self) -> Vec<(&'static str, String)> {
        use weft_nn::checkpoint::{ITERATIONS_META, STEP_META};
        let m = &self.ranks[0];
        let mut meta = vec![(STEP_META, m.step_counter().to_string())];
        if let Some(opt) = m.optimizer() {
            meta.push((ITERATIONS_META, opt.iterations().to_string()));
        }
        meta
    }

    /// Load a checkpoint (from one device or any mesh): each rank keeps its part of every whole
    /// tensor. Any mismatch is an `Err` and nothing changes. Optimizer state loads when the file
    /// has it and the model is compiled.
    pub fn load_checkpoint(&mut self, path: impl AsRef<std::path::Path>) -> Result<()> {
        let path = path.as_ref();
        let read = weft_nn::checkpoint::load_with_metadata(path);
        let (file, meta) = all_ok(&self.mesh, "ShardedModel::load_checkpoint: reading the file", read)?;
        self.load_state(&file, &meta, path)
    }

    /// Set weights (and optimizer state, for names a checkpoint gives it) from whole tensors,
    /// e.g. a one-device model's `whole_state`: each rank keeps its part. Checked as
    /// `load_checkpoint` checks a file.
    pub fn set_state(&mut self, state: &[(String, Tensor)]) -> Result<()> {
        let read = state
            .iter()
            .map(|(k, t)| Ok((k.clone(), (t.dims().to_vec(), t.to_vec::<f32>()?))))
            .collect::<Result<weft_nn::checkpoint::Loaded>>();
        let loaded = all_ok(&self.mesh, "ShardedModel::set_state: reading the tensors", read)?;
        self.load_state(&loaded, &Default::default(), std::path::Path::new("(tensors in memory)"))
    }

    fn load_state(
        &mut self,
        file: &weft_nn::checkpoint::Loaded,
        meta: &std::collections::HashMap<String, String>,
        path: &std::path::Path,
    ) -> Result<()> {
        let checked = self.check_state(file, meta, path);
        let (iterations, step) = all_ok(&self.mesh, "ShardedModel: checking the checkpoint", checked)?;
        let placements = self.placements.clone();
        let mesh = self.mesh.clone();
        let global = self.global.clone();
        self.run(|rank, m| {
            let mi = mesh.coords(global[rank]).1;
            let dev = m.device().clone();
            let local = |var: &str, shape: &[usize], values: &[f32]| -> Result<Tensor> {
                let full = Tensor::from_slice(values, shape, &weft_core::Device::Cpu)?;
                placements.get(var).unwrap_or(&Placement::Replicate).local(&full, mi)?.to_device(&dev)
            };
            // Make every local part first; only when every rank has made all of its parts (the
            // barriers) does any rank change anything, so a failure leaves every rank as it was.
            let mut weights = Vec::new();
            for (p, v) in m.variables() {
                let (shape, values) = &file[&p];
                weights.push((v, local(&p, shape, values)?));
            }
            let mut slots = Vec::new();
            if m.optimizer().is_some() {
                for (key, (shape, values)) in file {
                    if let Some((slot, var)) = parse_slot_key(key) {
                        slots.push((var.to_string(), slot.to_string(), local(var, shape, values)?));
                    }
                }
            }
            let tp = m.tensor_parallel().cloned().ok_or_else(|| Error::Msg("rank without a TpCtx".into()))?;
            tp.model.barrier()?;
            tp.data.barrier()?;
            for (v, t) in weights {
                v.set(&t)?;
            }
            if let Some(step) = step {
                m.set_step_counter(step);
            }
            if let Some(opt) = m.optimizer_mut() {
                for (var, slot, t) in slots {
                    opt.set_slot(&var, &slot, t);
                }
                if let Some(it) = iterations {
                    opt.set_iterations(it);
                }
            }
            Ok(())
        })?;
        Ok(())
    }

    /// The checkpoint's step counts, after checking every tensor's name and shape.
    fn check_state(
        &self,
        file: &weft_nn::checkpoint::Loaded,
        meta: &std::collections::HashMap<String, String>,
        path: &std::path::Path,
    ) -> Result<(Option<u64>, Option<u64>)> {
        let counts = weft_nn::checkpoint::resume_counts(file, meta, path)?;
        let expected: Vec<(String, Vec<usize>)> =
            self.plan.layers.iter().flat_map(|l| &l.variables).map(|v| (v.path.clone(), v.shape.clone())).collect();
        weft_nn::checkpoint::check_weights(file, &expected, path)?;
        for (key, (shape, _)) in file {
            if let Some((_, var)) = parse_slot_key(key)
                && let Some((_, want)) = expected.iter().find(|(p, _)| p == var)
                && shape != want
            {
                return Err(Error::Msg(format!(
                    "loading {}: {key} has shape {shape:?}, its variable {want:?}",
                    path.display()
                )));
            }
        }
        Ok(counts)
    }

    /// Load weights saved by `save_weights`, `save_checkpoint` or a single-device `Model`.
    pub fn load_weights(&mut self, path: impl AsRef<std::path::Path>) -> Result<()> {
        self.load_checkpoint(path)
    }
}

/// `local` when it holds on every process the mesh spans: a check only this process ran (its
/// file, its batch) is voted on, so that when one process fails it, every process returns `Err`
/// before any of them waits in a collective for it. On a mesh in one process, `local` itself.
fn all_ok<T>(mesh: &DeviceMesh, what: &str, local: Result<T>) -> Result<T> {
    #[cfg(feature = "mpi")]
    if let Some(p) = mesh.procs() {
        return p.all_ok(what, local);
    }
    let _ = (mesh, what);
    local
}
