//! Weights on disk in the safetensors format (the file Python's `safetensors` reads).
//!
//! Saving writes a temporary file beside the target and renames it over the target only once
//! it is complete, so a crash or a full disk never leaves a half-written checkpoint where a good
//! one was. Loading accepts f32, f16 and bf16 tensors (converted to f32).

use safetensors::tensor::{Dtype, SafeTensors, View};
use std::borrow::Cow;
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use weft_core::{DType, Error, Result, Tensor};

struct HostView {
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

impl View for &HostView {
    fn dtype(&self) -> Dtype {
        Dtype::F32
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.bytes)
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

fn io(path: &Path, what: &str, e: impl std::fmt::Display) -> Error {
    Error::Msg(format!("{what} {}: {e}", path.display()))
}

/// Write named f32 tensors to `path` (through a temporary file and a rename).
pub fn save(path: impl AsRef<Path>, tensors: &[(String, Tensor)]) -> Result<()> {
    let path = path.as_ref();
    let mut views = Vec::with_capacity(tensors.len());
    for (name, t) in tensors {
        let t = if t.dtype() == DType::F32 { t.clone() } else { t.to_dtype(DType::F32)? };
        let bytes = bytemuck::cast_slice(&t.to_vec::<f32>()?).to_vec();
        views.push((name.clone(), HostView { shape: t.dims().to_vec(), bytes }));
    }
    let data = safetensors::serialize(views.iter().map(|(n, v)| (n.as_str(), v)), None)
        .map_err(|e| io(path, "encoding", e))?;
    let tmp = PathBuf::from(format!("{}.tmp", path.display()));
    let mut f = std::fs::File::create(&tmp).map_err(|e| io(&tmp, "creating", e))?;
    f.write_all(&data).and_then(|_| f.sync_all()).map_err(|e| io(&tmp, "writing", e))?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(|e| io(path, "replacing", e))
}

/// Tensors read from a file: name to (shape, f32 values).
pub type Loaded = HashMap<String, (Vec<usize>, Vec<f32>)>;

/// Read every tensor of a safetensors file as (shape, f32 values), by name.
pub fn load(path: impl AsRef<Path>) -> Result<Loaded> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|e| io(path, "reading", e))?;
    let st = SafeTensors::deserialize(&bytes).map_err(|e| io(path, "not a complete safetensors file:", e))?;
    let mut out = HashMap::new();
    for (name, view) in st.tensors() {
        let data = view.data();
        let values: Vec<f32> = match view.dtype() {
            Dtype::F32 => bytemuck::pod_collect_to_vec(data),
            Dtype::F16 => data.chunks_exact(2).map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
            Dtype::BF16 => data.chunks_exact(2).map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
            other => {
                return Err(Error::Msg(format!(
                    "{}: tensor {name} has dtype {other:?}; weights must be f32, f16 or bf16",
                    path.display()
                )));
            }
        };
        out.insert(name, (view.shape().to_vec(), values));
    }
    Ok(out)
}

/// Names in a checkpoint that hold optimizer state start with this.
pub const OPTIMIZER_PREFIX: &str = "optimizer/";
/// The optimizer's step counter (stored as a one-element f32 tensor: exact to 2^24 steps).
pub const ITERATIONS_KEY: &str = "optimizer/iterations";

/// The name of optimizer slot `slot` of the variable at `var_path`: `optimizer/m/sequential/dense/kernel`.
pub fn slot_key(slot: &str, var_path: &str) -> String {
    format!("{OPTIMIZER_PREFIX}{slot}/{var_path}")
}

/// Split a slot name back into (slot, variable path).
pub fn parse_slot_key(key: &str) -> Option<(&str, &str)> {
    key.strip_prefix(OPTIMIZER_PREFIX).filter(|_| key != ITERATIONS_KEY)?.split_once('/')
}

/// Check that `file` holds a tensor of the right shape for every expected (name, shape) and
/// nothing else (optimizer entries aside); every problem is listed in one `Err`.
pub fn check_weights(file: &Loaded, expected: &[(String, Vec<usize>)], source: &Path) -> Result<()> {
    let mut problems = Vec::new();
    for (p, dims) in expected {
        match file.get(p) {
            None => problems.push(format!("missing from the file: {p} (shape {dims:?})")),
            Some((shape, _)) if shape != dims => {
                problems.push(format!("{p}: the file has shape {shape:?}, the model {dims:?}"))
            }
            Some(_) => {}
        }
    }
    let mut extra: Vec<&String> =
        file.keys().filter(|k| !k.starts_with(OPTIMIZER_PREFIX) && !expected.iter().any(|(p, _)| p == *k)).collect();
    extra.sort();
    problems.extend(extra.into_iter().map(|k| format!("not in the model: {k}")));
    for k in file.keys().filter(|k| k.starts_with(OPTIMIZER_PREFIX)) {
        if let Some((_, var)) = parse_slot_key(k)
            && !expected.iter().any(|(p, _)| p == var)
        {
            problems.push(format!("optimizer state for a variable not in the model: {k}"));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Error::Msg(format!("loading {}: {}", source.display(), problems.join("; "))))
    }
}
