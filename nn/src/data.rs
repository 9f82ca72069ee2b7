//! Data helpers: CSV loading and seeded splits.

use crate::Inputs;
use weft_core::{DType, Error, Result, Tensor};

/// Rows of numbers from a CSV file (no header, comma-separated): the values row-major, with the
/// row and column counts. A ragged row or a field that is not a number is an `Err` naming its line.
pub fn read_csv(path: impl AsRef<std::path::Path>) -> Result<(Vec<f32>, usize, usize)> {
    let path = path.as_ref();
    let text = std::fs::read_to_string(path).map_err(|e| Error::Msg(format!("reading {}: {e}", path.display())))?;
    let mut values = Vec::new();
    let (mut rows, mut cols) = (0, 0);
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let before = values.len();
        for field in line.split(',') {
            let v = field
                .trim()
                .parse::<f32>()
                .map_err(|_| Error::Msg(format!("{}:{}: {field:?} is not a number", path.display(), i + 1)))?;
            values.push(v);
        }
        let n = values.len() - before;
        if rows == 0 {
            cols = n;
        } else if n != cols {
            return Err(Error::Msg(format!("{}:{}: {n} fields, but the first row has {cols}", path.display(), i + 1)));
        }
        rows += 1;
    }
    Ok((values, rows, cols))
}

/// The rows `fit` trains on when it holds out `validation_split` of `n`: Keras' floor(n * (1 - s)),
/// with `s` taken as the decimal the user wrote (0.2f32 is 0.20000000298 in binary, and
/// 10 * (1 - that) would floor to 7, not Keras' 8).
///
/// ```
/// assert_eq!(weft_nn::data::training_rows(10, 0.2), 8);
/// assert_eq!(weft_nn::data::training_rows(7, 0.3), 4);
/// ```
pub fn training_rows(n: usize, validation_split: f32) -> usize {
    let s: f64 = validation_split.to_string().parse().unwrap_or(validation_split as f64);
    (n as f64 * (1.0 - s)).floor() as usize
}

/// `0..n` in a seeded random order (Fisher–Yates with the counter-based generator, so the same
/// seed gives the same order on every machine).
pub fn shuffled(n: usize, seed: u64) -> Vec<u32> {
    let mut order: Vec<u32> = (0..n as u32).collect();
    let key = weft_core::rng::seed_key(seed);
    for i in (1..n).rev() {
        let j = ((weft_core::rng::uniform(key, i as u32) * (i + 1) as f32) as usize).min(i);
        order.swap(i, j);
    }
    order
}

/// A seeded shuffle of `0..n` cut into (train: the first `1 - test_fraction`, test: the last
/// `test_fraction`, rounded). A fraction outside [0, 1] (or NaN) is an `Err`.
///
/// ```
/// let (train, test) = weft_nn::data::train_test_split(10, 0.2, 7)?;
/// assert_eq!((train.len(), test.len()), (8, 2));
/// assert!(weft_nn::data::train_test_split(10, 1.5, 7).is_err());
/// # Ok::<(), weft_core::Error>(())
/// ```
pub fn train_test_split(n: usize, test_fraction: f32, seed: u64) -> Result<(Vec<u32>, Vec<u32>)> {
    if !(0.0..=1.0).contains(&test_fraction) {
        return Err(Error::invalid(
            "train_test_split",
            format!("test_fraction must be in [0, 1], got {test_fraction}"),
        ));
    }
    let mut order = shuffled(n, seed);
    let test_rows = (((n as f64) * test_fraction as f64).round() as usize).min(n);
    let test = order.split_off(n - test_rows);
    Ok((order, test))
}

/// Samples in memory: inputs and targets sharing their first axis, cut into batches on their
/// device (one gather per batch). Integer targets are carried as f32 (exact below 2^24) so a
/// batch is gathered with one kernel; the sparse losses and metrics read them back as labels.
///
/// ```
/// use weft_core::{Device, Tensor};
/// use weft_nn::data::Dataset;
/// let x = Tensor::rand(0.0, 1.0, &[10, 3], 0, &Device::Cpu)?;
/// let y = Tensor::from_vec((0..10u32).collect(), &[10], &Device::Cpu)?;
/// let data = Dataset::new(&x, &y)?;
/// let sizes: Vec<usize> = data.batches(4, Some(7)).map(|b| b.and_then(|(_, y)| y.rows())).collect::<Result<_, _>>()?;
/// assert_eq!(sizes, [4, 4, 2]);
/// # Ok::<(), weft_core::Error>(())
/// ```
#[derive(Clone)]
pub struct Dataset {
    x: Inputs,
    y: Inputs,
}

impl Dataset {
    /// Pair inputs and targets (each one tensor, or several named ones); every first axis must
    /// match.
    pub fn new(x: impl Into<Inputs>, y: impl Into<Inputs>) -> Result<Self> {
        let (x, y): (Inputs, Inputs) = (x.into(), y.into());
        let n = x.rows()?;
        if y.rows()? != n {
            return Err(Error::invalid(
                "Dataset",
                format!(
                    "inputs of shapes {:?} and targets of shapes {:?} hold different numbers of samples",
                    x.shapes(),
                    y.shapes()
                ),
            ));
        }
        // Integer inputs (token ids) and labels are held as f32, exact below 2^24, so one gather
        // kernel serves every batch; embeddings and sparse losses take f32 ids and check them.
        let x = x.map(|t| if t.dtype() == DType::F32 { Ok(t.clone()) } else { t.to_dtype(DType::F32) })?;
        let y = y.map(|t| if t.dtype() == DType::F32 { Ok(t.clone()) } else { t.to_dtype(DType::F32) })?;
        let device = x.entries()[0].1.device().clone();
        Ok(Dataset { y: y.to_device(&device)?, x })
    }
    /// Number of samples.
    pub fn len(&self) -> usize {
        self.x.entries()[0].1.dims()[0]
    }
    /// Whether there are no samples.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The first (for a single-input data set, the only) input, and the first targets.
    pub fn tensors(&self) -> (&Tensor, &Tensor) {
        (&self.x.entries()[0].1, &self.y.entries()[0].1)
    }
    /// Every input, and every target.
    pub fn inputs(&self) -> (&Inputs, &Inputs) {
        (&self.x, &self.y)
    }
    /// The samples `start..start + len`, in order.
    pub fn slice(&self, start: usize, len: usize) -> Result<Dataset> {
        Ok(Dataset { x: self.x.narrow(start, len)?, y: self.y.narrow(start, len)? })
    }
    /// Batches of `batch_size` (the last may be smaller), in order or shuffled by `shuffle_seed`.
    pub fn batches(&self, batch_size: usize, shuffle_seed: Option<u64>) -> Batches<'_> {
        let order = match shuffle_seed {
            Some(seed) => shuffled(self.len(), seed),
            None => (0..self.len() as u32).collect(),
        };
        Batches { data: self, order, pos: 0, batch_size: batch_size.max(1) }
    }
}

/// Iterator over the batches of a [`Dataset`].
pub struct Batches<'a> {
    data: &'a Dataset,
    order: Vec<u32>,
    pos: usize,
    batch_size: usize,
}

impl Batches<'_> {
    /// The same batches from batch `n` on (the first `n` skipped without being gathered).
    pub fn starting_at(mut self, n: usize) -> Self {
        self.pos = n.saturating_mul(self.batch_size).min(self.order.len());
        self
    }
}

impl Iterator for Batches<'_> {
    type Item = Result<(Inputs, Inputs)>;
    fn next(&mut self) -> Option<Self::Item> {
        if self.pos >= self.order.len() {
            return None;
        }
        let ids = &self.order[self.pos..(self.pos + self.batch_size).min(self.order.len())];
        self.pos += ids.len();
        let gather = || -> Result<(Inputs, Inputs)> {
            let t = Tensor::from_slice(ids, &[ids.len()], self.data.x.entries()[0].1.device())?;
            Ok((self.data.x.index_select(&t)?, self.data.y.index_select(&t)?))
        };
        Some(gather())
    }
}
