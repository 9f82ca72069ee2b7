//! A model's outputs as training sees them: the loss of each, its weight in the total, its
//! metrics, and the labels that go with it (Keras' `loss={..}`, `loss_weights={..}`,
//! `metrics={..}` and a dict of targets).

use crate::{Inputs, Loss, Metric};
use weft_core::{Error, Result, Tensor};

/// One output's part of the training objective, for [`Model::compile_outputs`](crate::Model::compile_outputs).
///
/// ```
/// use weft_nn::{Loss, Metric, OutputLoss};
/// let kind = OutputLoss::new("kind", Loss::SparseCategoricalCrossentropy { from_logits: true })
///     .weight(0.5)
///     .metrics(&[Metric::Accuracy]);
/// assert_eq!(kind.weight, 0.5);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct OutputLoss {
    /// The output's name, as the functional model names it.
    pub output: String,
    /// Its loss.
    pub loss: Loss,
    /// Its weight in the total loss (1 by default).
    pub weight: f32,
    /// Metrics of this output.
    pub metrics: Vec<Metric>,
}

impl OutputLoss {
    /// `loss` on the output called `output`, weight 1, no metrics.
    pub fn new(output: &str, loss: Loss) -> Self {
        OutputLoss { output: output.to_string(), loss, weight: 1.0, metrics: Vec::new() }
    }
    /// Its weight in the total loss.
    pub fn weight(mut self, w: f32) -> Self {
        self.weight = w;
        self
    }
    /// Its metrics.
    pub fn metrics(mut self, m: &[Metric]) -> Self {
        self.metrics = m.to_vec();
        self
    }
}

/// The compiled objective: one head per output that has a loss, with the output's position.
#[derive(Debug, Clone)]
pub(crate) struct Heads {
    pub list: Vec<(usize, OutputLoss)>,
    /// The model names its outputs (several of them): figures are reported per output.
    pub named: bool,
}

impl Heads {
    /// The same loss and metrics on every output of a model with outputs `names` (empty: one).
    pub fn every(names: &[String], loss: Loss, metrics: &[Metric]) -> Self {
        let names: Vec<String> = if names.is_empty() { vec![String::new()] } else { names.to_vec() };
        let list =
            names.iter().enumerate().map(|(i, n)| (i, OutputLoss::new(n, loss.clone()).metrics(metrics))).collect();
        Heads { list, named: names.len() > 1 || !names[0].is_empty() }
    }

    /// Losses for the outputs named in `specs`, checked against the model's outputs `names`.
    pub fn named(names: &[String], specs: &[OutputLoss]) -> Result<Self> {
        let err = |what: String| Err(Error::invalid("compile_outputs", what));
        if specs.is_empty() {
            return err("give a loss for at least one output".into());
        }
        let mut list = Vec::new();
        for (i, s) in specs.iter().enumerate() {
            let at = match names.iter().position(|n| *n == s.output) {
                Some(at) => at,
                None if names.is_empty() && specs.len() == 1 => 0,
                None => return err(format!("the model has no output {:?}; its outputs are {names:?}", s.output)),
            };
            if specs[..i].iter().any(|o| o.output == s.output) {
                return err(format!("the output {:?} is given two losses", s.output));
            }
            if !(s.weight.is_finite() && s.weight >= 0.0) {
                return err(format!(
                    "the weight of output {:?} is {}: it must be finite and not negative",
                    s.output, s.weight
                ));
            }
            list.push((at, s.clone()));
        }
        Ok(Heads { list, named: !names.is_empty() })
    }

    /// The labels of each head from `y`: by output name, or the one label of a one-output model
    /// whatever its name. An `Err` names a missing label, or one that no output takes.
    pub fn labels(&self, op: &'static str, y: &Inputs) -> Result<Vec<Tensor>> {
        if let ([(_, t)], [(_, _)]) = (y.entries(), self.list.as_slice())
            && (!self.named || y.entries()[0].0.is_empty())
        {
            // One output with a loss takes one unnamed label, whatever the output is called.
            return Ok(vec![t.clone()]);
        }
        if !self.named {
            return match y.entries() {
                [(_, t)] => Ok(vec![t.clone()]),
                many => {
                    Err(Error::invalid(op, format!("the model has one output, but {} labels were given", many.len())))
                }
            };
        }
        let names: Vec<&str> = self.list.iter().map(|(_, o)| o.output.as_str()).collect();
        if let Some((n, _)) = y.entries().iter().find(|(n, _)| !names.contains(&n.as_str())) {
            if n.is_empty() {
                return Err(Error::invalid(
                    op,
                    format!(
                        "the model's outputs with a loss are {names:?}: give the labels by output name (Inputs::from([(name, labels), ..]))"
                    ),
                ));
            }
            return Err(Error::invalid(op, format!("labels {n:?} name no output with a loss; those are {names:?}")));
        }
        names
            .iter()
            .map(|n| {
                y.get(n).cloned().ok_or_else(|| {
                    Error::invalid(op, format!("no labels for the output {n:?}: pass labels named {names:?}"))
                })
            })
            .collect()
    }

    /// The name of a figure of head `o` (`loss`, `accuracy`): prefixed by the output's name
    /// when the model names its outputs, as Keras does.
    pub fn figure(&self, o: &OutputLoss, what: &str) -> String {
        if self.named { format!("{}_{what}", o.output) } else { what.to_string() }
    }

    /// Every metric's name, in the order the counts are kept.
    pub fn metric_names(&self) -> Vec<String> {
        self.list.iter().flat_map(|(_, o)| o.metrics.iter().map(move |m| self.figure(o, m.name()))).collect()
    }

    /// Every metric of every head, in the order of [`metric_names`](Self::metric_names).
    pub fn metrics(&self) -> impl Iterator<Item = &crate::Metric> {
        self.list.iter().flat_map(|(_, o)| o.metrics.iter())
    }
}
