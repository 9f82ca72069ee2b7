//! `Inputs`: what a model is fed: one tensor, or several by name (ids, attention mask, token
//! types), all sharing their first (sample) axis.

use weft_core::{Device, Error, Result, Tensor};

/// A model's inputs. A plain `&Tensor` converts into one unnamed input, so single-input code reads
/// as before; several inputs are named, and a functional model takes them by name.
///
/// ```
/// use weft_core::{Device, Tensor};
/// use weft_nn::Inputs;
/// let ids = Tensor::zeros(&[4, 7], &Device::Cpu)?;
/// let mask = Tensor::ones(&[4, 7], &Device::Cpu)?;
/// let x = Inputs::from([("input_ids", ids), ("attention_mask", mask)]);
/// assert_eq!(x.rows()?, 4);
/// assert_eq!(x.narrow(1, 2)?.get("attention_mask").unwrap().dims(), &[2, 7]);
/// # Ok::<(), weft_core::Error>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct Inputs {
    entries: Vec<(String, Tensor)>,
}

impl Inputs {
    /// No inputs yet.
    pub fn new() -> Self {
        Self::default()
    }
    /// Add an input called `name`.
    pub fn with(mut self, name: &str, t: Tensor) -> Self {
        self.entries.push((name.to_string(), t));
        self
    }
    /// The input called `name`.
    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.entries.iter().find(|(n, _)| n == name).map(|(_, t)| t)
    }
    /// (name, tensor) pairs in the order given (a single unnamed input has the name "").
    pub fn entries(&self) -> &[(String, Tensor)] {
        &self.entries
    }
    /// The number of samples: the first axis every input shares. An `Err` names the inputs
    /// whose first axes differ, or a 0-dimensional input.
    pub fn rows(&self) -> Result<usize> {
        self.check_unique()?;
        let Some((n0, t0)) = self.entries.first() else {
            return Err(Error::invalid("inputs", "no inputs were given"));
        };
        let rows = |n: &str, t: &Tensor| {
            t.dims().first().copied().ok_or_else(|| {
                Error::invalid("inputs", format!("input {n:?} of shape {:?} has no sample axis", t.dims()))
            })
        };
        let r = rows(n0, t0)?;
        for (n, t) in &self.entries[1..] {
            if rows(n, t)? != r {
                return Err(Error::invalid(
                    "inputs",
                    format!(
                        "input {n:?} of shape {:?} and input {n0:?} of shape {:?} hold different numbers of samples",
                        t.dims(),
                        t0.dims()
                    ),
                ));
            }
        }
        Ok(r)
    }
    /// Two inputs of one name would make one of them unreachable: an `Err` naming it.
    fn check_unique(&self) -> Result<()> {
        for (i, (n, _)) in self.entries.iter().enumerate() {
            if self.entries[..i].iter().any(|(m, _)| m == n) {
                return Err(Error::invalid("inputs", format!("two inputs are named {n:?}")));
            }
        }
        Ok(())
    }
    /// The shapes, for error messages.
    pub fn shapes(&self) -> Vec<Vec<usize>> {
        self.entries.iter().map(|(_, t)| t.dims().to_vec()).collect()
    }
    /// Samples `start..start + len` of every input.
    pub fn narrow(&self, start: usize, len: usize) -> Result<Inputs> {
        self.map(|t| t.narrow(0, start, len))
    }
    /// The samples `ids` (a u32 vector) of every input, in that order. Integer inputs (token
    /// ids) are gathered as f32 and cast back: exact below 2^24.
    pub fn index_select(&self, ids: &Tensor) -> Result<Inputs> {
        self.map(|t| {
            let ids = ids.to_device(t.device())?;
            match t.dtype() {
                weft_core::DType::F32 => t.index_select(&ids, 0),
                d => t.to_dtype(weft_core::DType::F32)?.index_select(&ids, 0)?.to_dtype(d),
            }
        })
    }
    /// Every input on `device`.
    pub fn to_device(&self, device: &Device) -> Result<Inputs> {
        self.map(|t| t.to_device(device))
    }
    /// Apply `f` to every input.
    pub fn map(&self, f: impl Fn(&Tensor) -> Result<Tensor>) -> Result<Inputs> {
        let entries = self.entries.iter().map(|(n, t)| Ok((n.clone(), f(t)?))).collect::<Result<_>>()?;
        Ok(Inputs { entries })
    }
    /// The tensors in the order of `names` (a model's input names). A model without names takes
    /// exactly one input, whatever it is called. Missing and unexpected names are one `Err`.
    pub fn ordered(&self, names: &[String]) -> Result<Vec<Tensor>> {
        self.check_unique()?;
        if names.is_empty() {
            return match self.entries.as_slice() {
                [(_, t)] => Ok(vec![t.clone()]),
                _ => Err(Error::invalid(
                    "inputs",
                    format!(
                        "the model takes one input, got {} ({:?})",
                        self.entries.len(),
                        self.entries.iter().map(|(n, _)| n).collect::<Vec<_>>()
                    ),
                )),
            };
        }
        if let ([(n, t)], [only]) = (self.entries.as_slice(), names)
            && (n.is_empty() || n == only)
        {
            return Ok(vec![t.clone()]);
        }
        let missing: Vec<&String> = names.iter().filter(|n| self.get(n).is_none()).collect();
        let extra: Vec<&String> = self.entries.iter().map(|(n, _)| n).filter(|n| !names.contains(n)).collect();
        if !missing.is_empty() || !extra.is_empty() {
            return Err(Error::invalid(
                "inputs",
                format!("the model takes inputs {names:?}; missing {missing:?}, not the model's {extra:?}"),
            ));
        }
        Ok(names.iter().filter_map(|n| self.get(n).cloned()).collect())
    }
}

impl From<&Tensor> for Inputs {
    fn from(t: &Tensor) -> Self {
        Inputs::new().with("", t.clone())
    }
}

impl From<Tensor> for Inputs {
    fn from(t: Tensor) -> Self {
        Inputs::new().with("", t)
    }
}

impl From<&Inputs> for Inputs {
    fn from(x: &Inputs) -> Self {
        x.clone()
    }
}

impl<const N: usize> From<[(&str, Tensor); N]> for Inputs {
    fn from(items: [(&str, Tensor); N]) -> Self {
        items.into_iter().fold(Inputs::new(), |acc, (n, t)| acc.with(n, t))
    }
}

impl From<Vec<(&str, Tensor)>> for Inputs {
    fn from(items: Vec<(&str, Tensor)>) -> Self {
        items.into_iter().fold(Inputs::new(), |acc, (n, t)| acc.with(n, t))
    }
}
