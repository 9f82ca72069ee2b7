//! A checkpoint saved in parts: a model split over several processes has each process write
//! the tensors and tensor parts it holds to a file of its own, and one index (a JSON file at the
//! checkpoint's path) says where every part of every tensor lies. Loading the index gives whole
//! tensors, so one device, and any other layout, reads it as it reads a single file.
//!
//! Every part file carries the save's id in its name and its metadata. A save writes its parts
//! to new files, then replaces the index, then removes the files of the save before: a crash at
//! any point leaves a complete checkpoint (the old index and its files, or the new ones), and an
//! index never reads a part of another save.

use super::{Loaded, io, load_bytes, write_atomically};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use weft_core::{Error, Result};

/// The `format` field of an index.
const FORMAT: &str = "weft.checkpoint-index/1";

/// Metadata key of a part file: the id of the save it belongs to.
pub const SHARD_ID_META: &str = "weft.save_id";

/// Where one part of a tensor lies: in file `file`, under the name `key`, covering the entries
/// from `start` along `axis` (a whole tensor is one part at axis 0, start 0).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct IndexPart {
    /// The part file's name (beside the index).
    pub file: String,
    /// The part's name in that file.
    pub key: String,
    /// The axis the tensor is cut along.
    pub axis: usize,
    /// The part's first entry along `axis`.
    pub start: usize,
}

/// A whole tensor's shape and its parts.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct IndexTensor {
    /// The whole tensor's shape.
    pub shape: Vec<usize>,
    /// Its parts; together they cover it exactly once.
    pub parts: Vec<IndexPart>,
}

/// The index of a checkpoint saved in parts.
///
/// ```
/// use weft_core::{Device, Tensor};
/// use weft_nn::checkpoint::{self, Index, IndexPart, IndexTensor};
/// let dir = tempfile::tempdir()?;
/// let path = dir.path().join("model.safetensors");
/// // Two processes each wrote one half of a [2, 4] tensor, cut along axis 1.
/// let mut index = Index::new("abc", &[]);
/// for (p, start) in [(0, 0), (1, 2)] {
///     let file = Index::part_file_name(&path, "abc", p, 2);
///     let key = checkpoint::part_key("w", 1, start);
///     let half = Tensor::full(p as f32, &[2, 2], &Device::Cpu)?;
///     checkpoint::save_with_metadata(dir.path().join(&file), &[(key.clone(), half)], &[(checkpoint::SHARD_ID_META, "abc".into())])?;
///     index.add_part("w", &[2, 4], IndexPart { file, key, axis: 1, start });
/// }
/// index.write(&path)?;
/// let whole = checkpoint::load(&path)?;
/// assert_eq!(whole["w"].1, vec![0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Index {
    /// Always `weft.checkpoint-index/1`: how a reader tells an index from a safetensors file.
    pub format: String,
    /// The save's id, also in every part file's name and metadata.
    pub save_id: String,
    /// The checkpoint's string metadata (step counts), as a single file holds it.
    pub metadata: BTreeMap<String, String>,
    /// Every tensor, by name.
    pub tensors: BTreeMap<String, IndexTensor>,
}

/// The name of the part of tensor `name` that starts at `start` along `axis`, in a part file.
pub fn part_key(name: &str, axis: usize, start: usize) -> String {
    format!("{name}@{axis}:{start}")
}

impl Index {
    /// An empty index for the save `save_id`, with `metadata`.
    pub fn new(save_id: &str, metadata: &[(&str, String)]) -> Index {
        Index {
            format: FORMAT.into(),
            save_id: save_id.into(),
            metadata: metadata.iter().map(|(k, v)| (k.to_string(), v.clone())).collect(),
            tensors: BTreeMap::new(),
        }
    }

    /// Record a part of tensor `name`, whose whole shape is `shape`.
    pub fn add_part(&mut self, name: &str, shape: &[usize], part: IndexPart) {
        let t = self
            .tensors
            .entry(name.to_string())
            .or_insert_with(|| IndexTensor { shape: shape.to_vec(), parts: vec![] });
        t.parts.push(part);
    }

    /// The file name process `process` of `processes` writes its parts of save `save_id` to,
    /// beside the index at `index_path`: `model.safetensors` gives
    /// `model.safetensors.<id>.part-1-of-2`.
    pub fn part_file_name(index_path: &Path, save_id: &str, process: usize, processes: usize) -> String {
        let base = index_path.file_name().map_or("checkpoint".into(), |n| n.to_string_lossy().into_owned());
        format!("{base}.{save_id}.part-{process}-of-{processes}")
    }

    /// The part files this index names.
    pub fn files(&self) -> BTreeSet<String> {
        self.tensors.values().flat_map(|t| t.parts.iter().map(|p| p.file.clone())).collect()
    }

    /// Write the index to `path`, atomically (a temporary file, then a rename).
    pub fn write(&self, path: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self).map_err(|e| io(path, "encoding the index", e))?;
        write_atomically(path, text.as_bytes())
    }

    /// The index in `bytes` (read from `path`), or `None` when they are not an index (a
    /// safetensors file starts with its header's length, never with `{`).
    pub fn parse(bytes: &[u8], path: &Path) -> Result<Option<Index>> {
        if bytes.first() != Some(&b'{') {
            return Ok(None);
        }
        let Ok(value) = serde_json::from_slice::<serde_json::Value>(bytes) else { return Ok(None) };
        if value.get("format").and_then(|f| f.as_str()) != Some(FORMAT) {
            return Ok(None);
        }
        serde_json::from_value(value)
            .map(Some)
            .map_err(|e| Error::Msg(format!("{}: a damaged checkpoint index: {e}", path.display())))
    }

    /// The index at `path`, if that file is one (`None` when it is missing or another file;
    /// `Err` when it cannot be read).
    pub fn read(path: &Path) -> Result<Option<Index>> {
        match std::fs::read(path) {
            Ok(bytes) => Index::parse(&bytes, path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io(path, "reading", e)),
        }
    }

    /// Every tensor whole (read from the part files beside the index at `path`), and the
    /// metadata. A part file of another save, a missing or damaged part, and parts that do not
    /// cover their tensor exactly once are each an `Err` naming the file and tensor.
    pub fn load(&self, path: &Path) -> Result<(Loaded, HashMap<String, String>)> {
        let dir = path.parent().unwrap_or(Path::new("."));
        let mut files: HashMap<String, Loaded> = HashMap::new();
        for name in self.files() {
            if name.contains('/') || name.contains('\\') || name == "." || name == ".." || name.is_empty() {
                return Err(Error::Msg(format!("{}: part file {name:?} is not a plain name", path.display())));
            }
            let file = dir.join(&name);
            let bytes = std::fs::read(&file).map_err(|e| {
                io(
                    &file,
                    &format!("reading a part of the checkpoint {} (saved by another process?):", path.display()),
                    e,
                )
            })?;
            let (tensors, meta) = load_bytes(&bytes, &file)?;
            if meta.get(SHARD_ID_META) != Some(&self.save_id) {
                return Err(Error::Msg(format!(
                    "{}: part file {name} belongs to save {:?}, the index to save {:?} (files of two saves were mixed)",
                    path.display(),
                    meta.get(SHARD_ID_META),
                    self.save_id
                )));
            }
            files.insert(name, tensors);
        }
        let mut out = Loaded::new();
        for (name, t) in &self.tensors {
            out.insert(name.clone(), (t.shape.clone(), assemble(name, t, &files, path)?));
        }
        Ok((out, self.metadata.iter().map(|(k, v)| (k.clone(), v.clone())).collect()))
    }
}

/// Tensor `name`'s values, put together from its parts.
fn assemble(name: &str, t: &IndexTensor, files: &HashMap<String, Loaded>, path: &Path) -> Result<Vec<f32>> {
    let bad = |why: String| Error::Msg(format!("{}: tensor {name} (shape {:?}): {why}", path.display(), t.shape));
    let numel: usize = t.shape.iter().product();
    let mut out = vec![0f32; numel];
    let mut covered: Vec<(usize, usize)> = Vec::new();
    let mut axis_of = None;
    if t.parts.is_empty() {
        return Err(bad("the index lists no part of it".into()));
    }
    for part in &t.parts {
        let (shape, values) = files
            .get(&part.file)
            .and_then(|f| f.get(&part.key))
            .ok_or_else(|| bad(format!("part {} is missing from {}", part.key, part.file)))?;
        if t.shape.is_empty() {
            // A scalar has one part: itself.
            if !shape.is_empty() || t.parts.len() != 1 {
                return Err(bad(format!("part {} of a scalar has shape {shape:?}", part.key)));
            }
            out.copy_from_slice(values);
            return Ok(out);
        }
        let a = part.axis;
        let len = shape.get(a).copied().unwrap_or(0);
        let fits = a < t.shape.len()
            && shape.len() == t.shape.len()
            && shape.iter().zip(&t.shape).enumerate().all(|(i, (s, w))| i == a || s == w)
            && part.start + len <= t.shape[a]
            && axis_of.is_none_or(|x| x == a);
        if !fits {
            return Err(bad(format!(
                "part {} in {} has shape {shape:?} at {} along axis {a}, which does not fit",
                part.key, part.file, part.start
            )));
        }
        axis_of = Some(a);
        let outer: usize = t.shape[..a].iter().product();
        let inner: usize = t.shape[a + 1..].iter().product();
        for o in 0..outer {
            let dst = (o * t.shape[a] + part.start) * inner;
            out[dst..dst + len * inner].copy_from_slice(&values[o * len * inner..(o + 1) * len * inner]);
        }
        covered.push((part.start, len));
    }
    covered.sort_unstable();
    let mut at = 0;
    for (start, len) in covered {
        if start != at {
            return Err(bad(format!("its parts leave a gap or overlap at entry {at}")));
        }
        at += len;
    }
    let whole = axis_of.map_or(0, |a| t.shape[a]);
    if at != whole {
        return Err(bad(format!("its parts cover {at} of {whole} entries")));
    }
    Ok(out)
}
