//! Weights on disk in the safetensors format (the file Python's `safetensors` reads).
//!
//! Saving writes a temporary file beside the target (its name unique to this process, thread
//! and call, so two saves to one path never share it) and renames it over the target only once
//! it is complete, so a crash or a full disk never leaves a half-written checkpoint where a good
//! one was. Loading accepts f32, f16 and bf16 tensors (converted to f32).
//!
//! weft writes a checksum of every tensor's name, shape and data into the file's metadata
//! (`weft.checksums`) and verifies it on load, so a flipped bit is an `Err` naming the tensor,
//! never a silently different weight. Files without checksums (written elsewhere) still load.

mod index;

pub use index::{Index, IndexPart, IndexTensor, SHARD_ID_META, part_key};

use safetensors::tensor::{Dtype, SafeTensors, View};
use std::borrow::Cow;
use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
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

/// The metadata key under which weft stores per-tensor checksums.
pub const CHECKSUMS_KEY: &str = "weft.checksums";

/// Write named f32 tensors to `path` (through a temporary file and a rename).
pub fn save(path: impl AsRef<Path>, tensors: &[(String, Tensor)]) -> Result<()> {
    save_with_metadata(path, tensors, &[])
}

/// Write named f32 tensors and extra string metadata to `path` (through a unique temporary
/// file and a rename), with a checksum of every tensor.
pub fn save_with_metadata(path: impl AsRef<Path>, tensors: &[(String, Tensor)], meta: &[(&str, String)]) -> Result<()> {
    let path = path.as_ref();
    let mut views = Vec::with_capacity(tensors.len());
    let mut sums = serde_json::Map::new();
    for (name, t) in tensors {
        let t = if t.dtype() == DType::F32 { t.clone() } else { t.to_dtype(DType::F32)? };
        let bytes = bytemuck::cast_slice(&t.to_vec::<f32>()?).to_vec();
        sums.insert(name.clone(), checksum(t.dims(), &bytes).into());
        views.push((name.clone(), HostView { shape: t.dims().to_vec(), bytes }));
    }
    let mut info: HashMap<String, String> = meta.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
    info.insert(CHECKSUMS_KEY.into(), serde_json::Value::Object(sums).to_string());
    let data = safetensors::serialize(views.iter().map(|(n, v)| (n.as_str(), v)), Some(info))
        .map_err(|e| io(path, "encoding", e))?;
    write_atomically(path, &data)
}

/// Write `data` to a temporary file beside `path` whose name no other save shares, then rename
/// it over `path`: readers see the old file or the new one, never a mixture.
pub(crate) fn write_atomically(path: &Path, data: &[u8]) -> Result<()> {
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let file_name = path.file_name().map_or("checkpoint".into(), |n| n.to_string_lossy().into_owned());
    let tmp = path.with_file_name(format!(".{file_name}.{}.{call}.tmp", std::process::id()));
    let written = std::fs::File::create(&tmp)
        .map_err(|e| io(&tmp, "creating", e))
        .and_then(|mut f| f.write_all(data).and_then(|_| f.sync_all()).map_err(|e| io(&tmp, "writing", e)))
        .and_then(|_| std::fs::rename(&tmp, path).map_err(|e| io(path, "replacing", e)));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// A 64-bit checksum of a tensor's shape and bytes. Each 8-byte word goes through a bijection
/// of the running state (xor, then multiply by an odd constant), so changing any one word, a
/// single flipped bit included, always changes the result.
fn checksum(shape: &[usize], bytes: &[u8]) -> String {
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut mix = |w: u64| h = (h ^ w).wrapping_mul(PRIME).rotate_left(29);
    mix(shape.len() as u64);
    shape.iter().for_each(|&d| mix(d as u64));
    mix(bytes.len() as u64);
    let mut words = bytes.chunks_exact(8);
    for w in words.by_ref() {
        mix(u64::from_le_bytes(w.try_into().unwrap_or_default()));
    }
    let mut tail = [0u8; 8];
    tail[..words.remainder().len()].copy_from_slice(words.remainder());
    mix(u64::from_le_bytes(tail));
    format!("{h:016x}")
}

/// Tensors read from a file: name to (shape, f32 values).
pub type Loaded = HashMap<String, (Vec<usize>, Vec<f32>)>;

/// Read every tensor of a safetensors file as (shape, f32 values), by name.
pub fn load(path: impl AsRef<Path>) -> Result<Loaded> {
    Ok(load_with_metadata(path)?.0)
}

/// Read every tensor of a safetensors file (as [`load`]) and its string metadata. When the file
/// carries weft's checksums, every tensor is verified: a damaged one is an `Err` naming it.
///
/// `path` may also be the index of a checkpoint saved in parts (by a model split over several
/// processes, see [`Index`]): the parts are read from the files it names and put together, so
/// the caller gets whole tensors either way.
pub fn load_with_metadata(path: impl AsRef<Path>) -> Result<(Loaded, HashMap<String, String>)> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|e| io(path, "reading", e))?;
    if let Some(index) = Index::parse(&bytes, path)? {
        return index.load(path);
    }
    load_bytes(&bytes, path)
}

/// The tensors and metadata of one safetensors file's bytes (read from `path`), checked.
fn load_bytes(bytes: &[u8], path: &Path) -> Result<(Loaded, HashMap<String, String>)> {
    let st = SafeTensors::deserialize(bytes).map_err(|e| io(path, "not a complete safetensors file:", e))?;
    let (_, header) = SafeTensors::read_metadata(bytes).map_err(|e| io(path, "not a complete safetensors file:", e))?;
    let meta = header.metadata().clone().unwrap_or_default();
    let sums: Option<serde_json::Map<String, serde_json::Value>> = match meta.get(CHECKSUMS_KEY) {
        Some(text) => Some(
            serde_json::from_str(text)
                .map_err(|e| Error::Msg(format!("{}: its {CHECKSUMS_KEY} metadata is damaged: {e}", path.display())))?,
        ),
        None => None,
    };
    let mut out = HashMap::new();
    for (name, view) in st.tensors() {
        let data = view.data();
        if let Some(sums) = &sums {
            let ok = match (view.dtype(), sums.get(&name).and_then(|v| v.as_str())) {
                (Dtype::F32, Some(expected)) => checksum(view.shape(), data) == expected,
                _ => false,
            };
            if !ok {
                return Err(Error::Msg(format!(
                    "{}: tensor {name} fails its checksum: the file is damaged (its data or header changed after it was written)",
                    path.display()
                )));
            }
        }
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
    if let Some(sums) = &sums
        && let Some(gone) = sums.keys().find(|k| !out.contains_key(*k))
    {
        return Err(Error::Msg(format!("{}: tensor {gone} is listed in the checksums but missing", path.display())));
    }
    Ok((out, meta))
}

/// Names in a checkpoint that hold optimizer state start with this.
pub const OPTIMIZER_PREFIX: &str = "optimizer/";
/// The optimizer's step counter (stored as a one-element f32 tensor: exact to 2^24 steps).
pub const ITERATIONS_KEY: &str = "optimizer/iterations";

/// Metadata key of the optimizer's exact step count.
pub const ITERATIONS_META: &str = "weft.iterations";
/// Metadata key of the model's training-step counter (the dropout masks are drawn from it).
pub const STEP_META: &str = "weft.step";

/// The optimizer's step count and the model's step counter stored in a checkpoint, checked:
/// a count must be a whole number in range (an f32 tensor holds counts exactly only up to 2^24,
/// so a larger or fractional `optimizer/iterations` is refused unless the metadata has it exactly).
pub fn resume_counts(
    file: &Loaded,
    meta: &HashMap<String, String>,
    source: &Path,
) -> Result<(Option<u64>, Option<u64>)> {
    const MAX: u64 = i32::MAX as u64;
    let parse = |key: &str| -> Result<Option<u64>> {
        match meta.get(key) {
            None => Ok(None),
            Some(v) => match v.parse::<u64>() {
                Ok(n) if n <= MAX => Ok(Some(n)),
                _ => Err(Error::Msg(format!(
                    "loading {}: metadata {key} = {v:?} is not a step count (0..={MAX})",
                    source.display()
                ))),
            },
        }
    };
    let mut iterations = parse(ITERATIONS_META)?;
    if let Some((shape, values)) = file.get(ITERATIONS_KEY) {
        let v = match values.as_slice() {
            [v] => *v,
            _ => {
                return Err(Error::Msg(format!(
                    "loading {}: {ITERATIONS_KEY} has shape {shape:?}, expected [1]",
                    source.display()
                )));
            }
        };
        let exact = v.is_finite() && v >= 0.0 && v.fract() == 0.0;
        match iterations {
            Some(n) if exact && n as f32 == v => {}
            Some(n) => {
                return Err(Error::Msg(format!(
                    "loading {}: {ITERATIONS_KEY} = {v} disagrees with metadata {ITERATIONS_META} = {n}",
                    source.display()
                )));
            }
            None if exact && v <= (1u32 << 24) as f32 => iterations = Some(v as u64),
            None => {
                return Err(Error::Msg(format!(
                    "loading {}: {ITERATIONS_KEY} = {v} is not a step count (a whole number from 0 to 2^24)",
                    source.display()
                )));
            }
        }
    }
    Ok((iterations, parse(STEP_META)?))
}

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
