//! `ShardingPlan`: every layer's style, every variable's placement and the reason for it, the
//! memory each device will need, and the collectives one training step makes. Made by
//! [`autoconfig`](crate::autoconfig); printed as a table; saved and loaded as JSON.

mod autoconfig;
mod check;
mod cost;
mod geometry;
mod graph;
mod table;
mod traced;

pub use autoconfig::{AutoConfig, Split, autoconfig};

use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use weft_core::{DType, Error, Result};
use weft_nn::Loss;
use weft_nn::tp::{LayerShard, Placement, Style};

/// Whether `loss` runs on a split output as it is (vocabulary-parallel cross-entropy); any other
/// loss gathers the output first.
pub(crate) fn vocab_parallel(loss: &Loss) -> bool {
    *loss == vocab_loss()
}

/// The one loss that runs vocabulary-parallel.
fn vocab_loss() -> Loss {
    Loss::SparseCategoricalCrossentropy { from_logits: true }
}

/// A variable's place in the plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VarPlan {
    /// Full path, e.g. `tiny_gpt/block_0/mlp/up/kernel`.
    pub path: String,
    /// The whole variable's shape.
    pub shape: Vec<usize>,
    /// Where its values live.
    pub placement: Placement,
}

/// A layer's place in the plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayerPlan {
    /// Full layer path, e.g. `tiny_gpt/block_0/mlp/up`.
    pub path: String,
    /// Layer kind, e.g. `Dense`.
    pub kind: String,
    /// How it runs.
    pub style: Style,
    /// Its own variables.
    pub variables: Vec<VarPlan>,
    /// Why.
    pub reason: String,
}

/// Bytes one device holds during training (an estimate for activations).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceMemory {
    /// Rank on the model axis.
    pub rank: usize,
    /// Weights.
    pub params: u64,
    /// Gradients (one per weight).
    pub grads: u64,
    /// Optimizer slots.
    pub optimizer: u64,
    /// Forward activations kept for the backward pass, for the planned batch.
    pub activations: u64,
}

impl DeviceMemory {
    /// Everything.
    pub fn total(&self) -> u64 {
        self.params + self.grads + self.optimizer + self.activations
    }
}

/// One collective of a training step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CollectiveCost {
    /// `all_reduce`, `all_gather`.
    pub op: String,
    /// The mesh axis it runs over: `model` or `data`.
    pub axis: String,
    /// `forward`, `backward` or `optimizer`.
    pub pass: String,
    /// The layer (or `optimizer`) that calls it.
    pub at: String,
    /// The whole tensor's shape.
    pub shape: Vec<usize>,
    /// The whole tensor's size in bytes.
    pub bytes: u64,
}

/// One named input of a model: its shape (batch first) and dtype (`f32`, `u32` or `i32`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanInput {
    /// The input's name (empty for a model of one input).
    pub name: String,
    /// Its shape, batch first.
    pub shape: Vec<usize>,
    /// Its dtype's name.
    pub dtype: String,
}

impl PlanInput {
    /// An input called `name` of `shape` and `dtype`.
    pub fn new(name: &str, shape: &[usize], dtype: DType) -> Self {
        PlanInput { name: name.to_string(), shape: shape.to_vec(), dtype: dtype.name().to_string() }
    }
    /// Zeros of this input's shape and dtype on `device`.
    pub fn zeros(&self, device: &weft_core::Device) -> Result<weft_core::Tensor> {
        let z = weft_core::Tensor::zeros(&self.shape, device)?;
        match self.dtype.as_str() {
            "f32" => Ok(z),
            "u32" => z.to_dtype(DType::U32),
            "i32" => z.to_dtype(DType::I32),
            other => Err(Error::invalid("PlanInput", format!("input {:?} has dtype {other}", self.name))),
        }
    }
}

/// The plan of one model on one mesh. It prints as a table (`{plan}`) and travels as JSON.
///
/// ```
/// use weft_nn::{layers::Dense, Activation, Sequential};
/// use weft_parallel::{AutoConfig, ShardingPlan};
/// let net = Sequential::new().add(Dense::new(1024).activation(Activation::Relu)).add(Dense::new(256));
/// let plan = AutoConfig::new().plan(&net, &[8, 256], 4, 1)?;
/// assert!(plan.to_string().contains("paired with sequential/dense_1"));
/// assert_eq!(plan.memory[0].params, 4 * (256 * 256 + 256 + 256 * 256 + 256)); // a quarter of each kernel, plus a bias
/// assert_eq!(ShardingPlan::from_json(&plan.to_json()?)?, plan);
/// # Ok::<(), weft_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardingPlan {
    /// The model's root name.
    pub model: String,
    /// Ranks the weights are split over (the mesh's `model` axis).
    pub model_axis: usize,
    /// Ranks the batch is split over (the mesh's `data` axis).
    pub data_axis: usize,
    /// The input shape it was planned for (batch first; the first input's, for several).
    pub input_shape: Vec<usize>,
    /// Every named input it was planned for (empty for a model of one input: `input_shape`).
    #[serde(default)]
    pub inputs: Vec<PlanInput>,
    /// Every layer with variables, and every layer that runs on a split tensor, in call order.
    pub layers: Vec<LayerPlan>,
    /// When the model's output leaves split along its last axis: the entries per rank.
    pub output: Option<Vec<usize>>,
    /// Optimizer slots per variable the memory figures assume (Adam: 2).
    pub optimizer_slots: usize,
    /// The loss the plan was made for (`AutoConfig::loss`), as `{:?}` writes it; `None` when it
    /// was not given, and then the collectives of the vocabulary-parallel loss are listed as
    /// conditional (they run only if the loss is sparse cross-entropy from logits).
    #[serde(default)]
    pub loss: Option<String>,
    /// Per model-axis rank.
    pub memory: Vec<DeviceMemory>,
    /// One training step's collectives.
    pub collectives: Vec<CollectiveCost>,
}

impl ShardingPlan {
    /// The inputs the plan was made for, named (a single input has the name "" and f32 zeros
    /// stand in for it when tracing: every layer takes f32 ids too).
    pub fn input_specs(&self) -> Vec<PlanInput> {
        if self.inputs.is_empty() {
            vec![PlanInput::new("", &self.input_shape, DType::F32)]
        } else {
            self.inputs.clone()
        }
    }

    /// One row of zeros of every input (what a model is built from before it trains).
    pub fn sample_inputs(&self, device: &weft_core::Device) -> Result<weft_nn::Inputs> {
        let mut sample = weft_nn::Inputs::new();
        for spec in self.input_specs() {
            let mut one = spec.clone();
            if let Some(b) = one.shape.first_mut() {
                *b = 1;
            }
            sample = sample.with(&spec.name, one.zeros(device)?);
        }
        Ok(sample)
    }

    /// The plan as JSON.
    pub fn to_json(&self) -> Result<String> {
        serde_json::to_string_pretty(self).map_err(|e| Error::Msg(format!("ShardingPlan::to_json: {e}")))
    }

    /// A plan from JSON written by `to_json` (or by hand), with its sizes checked; what it does
    /// to a model is checked by [`check_model`](Self::check_model).
    pub fn from_json(json: &str) -> Result<Self> {
        let plan: ShardingPlan =
            serde_json::from_str(json).map_err(|e| Error::Msg(format!("ShardingPlan::from_json: {e}")))?;
        plan.check()?;
        Ok(plan)
    }

    /// Save as JSON (through a temporary file and a rename).
    pub fn save(&self, path: impl AsRef<std::path::Path>) -> Result<()> {
        let path = path.as_ref();
        let tmp = std::path::PathBuf::from(format!("{}.tmp", path.display()));
        std::fs::write(&tmp, self.to_json()?).map_err(|e| Error::Msg(format!("writing {}: {e}", tmp.display())))?;
        std::fs::rename(&tmp, path).map_err(|e| Error::Msg(format!("replacing {}: {e}", path.display())))
    }

    /// Load a plan saved by `save`.
    pub fn load(path: impl AsRef<std::path::Path>) -> Result<Self> {
        let path = path.as_ref();
        let s = std::fs::read_to_string(path).map_err(|e| Error::Msg(format!("reading {}: {e}", path.display())))?;
        Self::from_json(&s)
    }

    /// Every split's sizes have one entry per model rank and sum to the axis they split; every
    /// style's sizes likewise. This reads the plan alone: [`check_model`](Self::check_model)
    /// also checks it against the model.
    pub fn check(&self) -> Result<()> {
        let bad = |what: String| Err(Error::invalid("ShardingPlan", what));
        let ok_sizes = |s: &[usize]| s.len() == self.model_axis && s.iter().all(|&x| x > 0);
        for l in &self.layers {
            let sizes = match &l.style {
                Style::Replicated => None,
                Style::Column { sizes, .. } | Style::Row { sizes, .. } | Style::Vocab { sizes } => Some(sizes),
                Style::Split { axis, sizes } => {
                    if *axis > 8 {
                        return bad(format!("{}: split axis {axis} is not an axis of an activation", l.path));
                    }
                    Some(sizes)
                }
            };
            if let Some(s) = sizes.filter(|s| !ok_sizes(s)) {
                return bad(format!(
                    "{}: style {} has sizes {s:?}, which do not give each of {} ranks a part",
                    l.path,
                    l.style.name(),
                    self.model_axis
                ));
            }
            for v in &l.variables {
                if let (Some(style), Placement::Shard { sizes, .. }) = (sizes, &v.placement)
                    && style != sizes
                {
                    return bad(format!("{}: split {sizes:?}, but its layer's style says {style:?}", v.path));
                }
            }
            let split_vars = l.variables.iter().filter(|v| v.placement != Placement::Replicate).count();
            if matches!(l.style, Style::Replicated) && split_vars > 0 {
                return bad(format!("{}: a replicated layer with split variables", l.path));
            }
        }
        if let Some(s) = self.output.as_ref().filter(|s| !ok_sizes(s)) {
            return bad(format!("the output's sizes {s:?} do not give each of {} ranks a part", self.model_axis));
        }
        for l in &self.layers {
            for v in &l.variables {
                if let Placement::Shard { axis, sizes } = &v.placement
                    && (sizes.len() != self.model_axis || v.shape.get(*axis) != Some(&sizes.iter().sum()))
                {
                    return Err(Error::invalid(
                        "ShardingPlan",
                        format!(
                            "{}: sizes {sizes:?} do not split axis {axis} of {:?} over {} ranks",
                            v.path, v.shape, self.model_axis
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Refuse a loss that would run differently from what the plan lists: a plan made for
    /// vocabulary-parallel cross-entropy keeps the output split, and any other loss would gather it.
    pub fn check_loss(&self, loss: &Loss) -> Result<()> {
        let planned_vocab = self.loss.as_deref().map(|l| l == format!("{:?}", vocab_loss()));
        if self.output.is_some() && planned_vocab.is_some() && planned_vocab != Some(vocab_parallel(loss)) {
            return Err(Error::invalid(
                "ShardingPlan",
                format!(
                    "the plan was made for the loss {}, which {} the split output, but the model is compiled with \
                     {loss:?}: plan again with AutoConfig::loss({loss:?})",
                    self.loss.as_deref().unwrap_or_default(),
                    if planned_vocab == Some(true) { "runs on" } else { "gathers" }
                ),
            ));
        }
        Ok(())
    }

    /// Whether the loss's collectives are listed only on condition (the plan keeps the output
    /// split, and was made without a loss).
    pub fn loss_is_conditional(&self) -> bool {
        self.output.is_some() && self.loss.is_none()
    }

    /// The placement of every variable, by full path.
    pub fn placements(&self) -> HashMap<String, Placement> {
        self.layers.iter().flat_map(|l| l.variables.iter().map(|v| (v.path.clone(), v.placement.clone()))).collect()
    }

    /// What each layer needs at run time, by layer path (replicated layers are left out).
    pub fn layer_shards(&self) -> HashMap<String, LayerShard> {
        self.layers
            .iter()
            .filter(|l| l.style != Style::Replicated)
            .map(|l| {
                let vars = l
                    .variables
                    .iter()
                    .map(|v| {
                        (
                            v.path.strip_prefix(&format!("{}/", l.path)).unwrap_or(&v.path).to_string(),
                            v.placement.clone(),
                        )
                    })
                    .collect();
                (l.path.clone(), LayerShard { style: l.style.clone(), vars })
            })
            .collect()
    }

    /// The layer at `path`.
    pub fn layer(&self, path: &str) -> Option<&LayerPlan> {
        self.layers.iter().find(|l| l.path == path)
    }

    /// Total bytes of the step's collectives over the model axis.
    pub fn collective_bytes(&self) -> u64 {
        self.collectives.iter().map(|c| c.bytes).sum()
    }
}
