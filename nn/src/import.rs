//! Importing a safetensors file written by another framework (PyTorch, Hugging Face, JAX):
//! name-mapping rules, per-tensor transforms, strict or lenient, with a report.
//!
//! A rule maps source names to model paths with wildcards: in the source pattern `*` matches a
//! run of characters without `.` or `/` and `**` any run, and the n-th `*` of the target is
//! replaced by what the n-th wildcard of the source matched. Transforms run on a matched tensor before its shape
//! is checked: a PyTorch `Linear` weight is `[out, in]` and a weft kernel `[in, out]`
//! (`Transform::Transpose`); with `reshape` a tensor whose element count matches is reshaped,
//! row-major, to the variable's shape (splitting `[in, heads * dim]` into `[in, heads, dim]`).
//!
//! Nothing is set until every mapped tensor has been read, transformed and checked, so an import
//! that returns `Err` changes no variable, in strict and lenient mode alike.
//!
//! ```
//! use weft_nn::import::{Importer, Transform};
//! let imp = Importer::new()
//!     .rule("encoder.layer.*.attention.self.query.weight", "bert/layer_*/attention/query/kernel")
//!     .transform("**.weight", Transform::Transpose)
//!     .skip("**.position_ids");
//! assert_eq!(
//!     imp.target_of("encoder.layer.3.attention.self.query.weight").as_deref(),
//!     Some("bert/layer_3/attention/query/kernel")
//! );
//! ```

use safetensors::tensor::{Dtype, SafeTensors};
use std::fmt;
use std::path::Path;
use weft_core::{Error, Result, Tensor, Var};

/// A change applied to a source tensor before it is checked against its variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transform {
    /// Swap the two axes of a matrix (PyTorch `Linear` `[out, in]` to a kernel `[in, out]`).
    Transpose,
    /// A PyTorch convolution weight `[out, in, k..]` to weft's (and Keras') kernel
    /// `[k.., in, out]`: `Conv1d` `[out, in, k]` to `[k, in, out]`, `Conv2d` `[out, in, kh, kw]`
    /// to `[kh, kw, in, out]`.
    ConvKernel,
}

/// Strict: every model variable must be found and every source tensor used (or skipped).
/// Lenient: load what maps, and report the rest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Missing variables and unused tensors are an `Err`.
    #[default]
    Strict,
    /// Missing variables keep their values; unused tensors are reported.
    Lenient,
}

/// What an import did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ImportReport {
    /// (source name, model path, transforms applied, reshaped to the variable's shape).
    pub mapped: Vec<(String, String, Vec<Transform>, bool)>,
    /// Source tensors a `skip` pattern matched.
    pub skipped: Vec<String>,
    /// Model variables no source tensor mapped to.
    pub missing: Vec<String>,
    /// Source tensors that matched no rule or whose target is not a model variable.
    pub unused: Vec<String>,
}

impl fmt::Display for ImportReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "imported {} tensors; skipped {}, missing {}, unused {}",
            self.mapped.len(),
            self.skipped.len(),
            self.missing.len(),
            self.unused.len()
        )?;
        for (src, dst, t, reshaped) in &self.mapped {
            let mut how: Vec<String> = t.iter().map(|t| format!("{t:?}").to_lowercase()).collect();
            if *reshaped {
                how.push("reshape".into());
            }
            let how = if how.is_empty() { String::new() } else { format!(" ({})", how.join(", ")) };
            writeln!(f, "  mapped   {src} -> {dst}{how}")?;
        }
        for (what, list) in [("skipped", &self.skipped), ("missing", &self.missing), ("unused", &self.unused)] {
            for n in list {
                writeln!(f, "  {what:<8} {n}")?;
            }
        }
        Ok(())
    }
}

/// Name-mapping rules, transforms and skips for importing a foreign checkpoint.
#[derive(Debug, Clone, Default)]
pub struct Importer {
    rules: Vec<(String, String)>,
    transforms: Vec<(String, Transform)>,
    skips: Vec<String>,
    reshape: bool,
    mode: Mode,
}

impl Importer {
    /// No rules: names must equal model paths. Strict.
    pub fn new() -> Self {
        Importer::default()
    }
    /// Map source names matching `from` to `to` (first matching rule wins; wildcards as described
    /// in the module docs). A name no rule matches is taken as a model path as it is.
    pub fn rule(mut self, from: &str, to: &str) -> Self {
        self.rules.push((from.to_string(), to.to_string()));
        self
    }
    /// Apply `t` to source tensors whose name matches `pattern` (every matching transform, in order).
    pub fn transform(mut self, pattern: &str, t: Transform) -> Self {
        self.transforms.push((pattern.to_string(), t));
        self
    }
    /// Leave out source tensors whose name matches `pattern` (integer buffers such as
    /// `position_ids`, heads the model does not have).
    pub fn skip(mut self, pattern: &str) -> Self {
        self.skips.push(pattern.to_string());
        self
    }
    /// Reshape a tensor whose element count matches its variable to the variable's shape.
    pub fn reshape_to_fit(mut self, on: bool) -> Self {
        self.reshape = on;
        self
    }
    /// Strict (the default) or lenient.
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// The model path a source name maps to (`None` when a skip matches it).
    pub fn target_of(&self, source: &str) -> Option<String> {
        if self.skips.iter().any(|p| glob(p, source).is_some()) {
            return None;
        }
        for (from, to) in &self.rules {
            if let Some(caps) = glob(from, source) {
                let mut out = String::new();
                let mut caps = caps.into_iter();
                for (i, part) in to.split('*').enumerate() {
                    if i > 0 {
                        out += caps.next().unwrap_or_default();
                    }
                    out += part;
                }
                return Some(out);
            }
        }
        Some(source.to_string())
    }

    /// Import `path` into `vars` (model path, variable), e.g. `model.variables()`. Returns what
    /// was mapped, skipped, missing and unused; see [`Mode`] for what is an `Err`.
    pub fn load(&self, path: impl AsRef<Path>, vars: &[(String, Var)]) -> Result<ImportReport> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|e| Error::Msg(format!("reading {}: {e}", path.display())))?;
        let st = SafeTensors::deserialize(&bytes)
            .map_err(|e| Error::Msg(format!("{}: not a complete safetensors file: {e}", path.display())))?;
        let mut report = ImportReport::default();
        let mut staged: Vec<(&Var, Tensor)> = Vec::new();
        let mut problems = Vec::new();
        let mut names: Vec<String> = st.names().into_iter().map(str::to_string).collect();
        names.sort();
        for name in names {
            let Some(target) = self.target_of(&name) else {
                report.skipped.push(name);
                continue;
            };
            let Some((_, var)) = vars.iter().find(|(p, _)| *p == target) else {
                report.unused.push(name);
                continue;
            };
            if report.mapped.iter().any(|m| m.1 == target) {
                problems.push(format!("{name} maps to {target}, which another tensor already fills"));
                continue;
            }
            let view = st.tensor(&name).map_err(|e| Error::Msg(format!("{}: {name}: {e}", path.display())))?;
            let (mut shape, mut values) = match to_f32(view.dtype(), view.data()) {
                Some(v) => (view.shape().to_vec(), v),
                None => {
                    problems.push(format!("{name}: dtype {:?} cannot be loaded into a variable", view.dtype()));
                    continue;
                }
            };
            let mut applied = Vec::new();
            for (_, t) in self.transforms.iter().filter(|(p, _)| glob(p, &name).is_some()) {
                match t {
                    Transform::Transpose => {
                        let [r, c] = shape[..] else {
                            problems.push(format!("{name}: cannot transpose a tensor of shape {shape:?}"));
                            continue;
                        };
                        values = (0..r * c).map(|i| values[(i % r) * c + i / r]).collect();
                        shape = vec![c, r];
                    }
                    Transform::ConvKernel => {
                        if shape.len() < 3 {
                            problems.push(format!("{name}: a convolution weight has 3 or more axes, not {shape:?}"));
                            continue;
                        }
                        let r = shape.len();
                        let order: Vec<usize> = (2..r).chain([1, 0]).collect();
                        let t = Tensor::from_vec(values, &shape, &weft_core::Device::Cpu)?.permute(&order)?;
                        shape = t.dims().to_vec();
                        values = t.contiguous()?.to_vec::<f32>()?;
                    }
                }
                applied.push(*t);
            }
            let want = var.dims().to_vec();
            let reshaped = shape != want && self.reshape && splits_or_merges(&shape, &want);
            if shape != want && !reshaped {
                problems
                    .push(format!("{name} -> {target}: shape {shape:?} (after {applied:?}), the variable {want:?}"));
                continue;
            }
            staged.push((var, Tensor::from_slice(&values, &want, var.device())?));
            report.mapped.push((name, target, applied, reshaped));
        }
        report.missing =
            vars.iter().filter(|(p, _)| !report.mapped.iter().any(|m| &m.1 == p)).map(|(p, _)| p.clone()).collect();
        if self.mode == Mode::Strict {
            problems.extend(report.missing.iter().map(|p| format!("no tensor for the variable {p}")));
            problems.extend(report.unused.iter().map(|n| format!("{n} maps to no variable")));
        }
        if !problems.is_empty() {
            return Err(Error::Msg(format!(
                "importing {}: nothing was loaded: {}",
                path.display(),
                problems.join("; ")
            )));
        }
        for (var, t) in staged {
            var.set(&t)?;
        }
        Ok(report)
    }
}

/// Whether `to` is `from` with axes split or merged (each axis of one is a run of whole axes of
/// the other), the rank changed: `[384, 384]` to `[384, 12, 32]` is; `[1536, 384]` to
/// `[384, 1536]`, a missing transpose, is not.
fn splits_or_merges(from: &[usize], to: &[usize]) -> bool {
    if from.len() == to.len() || from.iter().product::<usize>() != to.iter().product::<usize>() {
        return false;
    }
    let (mut i, mut j) = (0, 0);
    while i < from.len() && j < to.len() {
        let (mut a, mut b) = (from[i], to[j]);
        let (i0, j0) = (i, j);
        while a != b {
            if a < b {
                i += 1;
                match from.get(i) {
                    Some(&f) => a *= f,
                    None => return false,
                }
            } else {
                j += 1;
                match to.get(j) {
                    Some(&t) => b *= t,
                    None => return false,
                }
            }
        }
        // One side of each group is a single axis: a split (1 -> many) or a merge (many -> 1).
        if i > i0 && j > j0 {
            return false;
        }
        i += 1;
        j += 1;
    }
    from[i..].iter().chain(&to[j..]).all(|&d| d == 1)
}

/// The values of a safetensors tensor as f32 (integers converted exactly up to 2^24).
fn to_f32(dtype: Dtype, data: &[u8]) -> Option<Vec<f32>> {
    let v = match dtype {
        Dtype::F32 => bytemuck::pod_collect_to_vec(data),
        Dtype::F64 => {
            data.chunks_exact(8).map(|b| f64::from_le_bytes(b.try_into().unwrap_or_default()) as f32).collect()
        }
        Dtype::F16 => data.chunks_exact(2).map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
        Dtype::BF16 => data.chunks_exact(2).map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
        Dtype::I64 => {
            data.chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().unwrap_or_default()) as f32).collect()
        }
        Dtype::I32 => {
            data.chunks_exact(4).map(|b| i32::from_le_bytes(b.try_into().unwrap_or_default()) as f32).collect()
        }
        _ => return None,
    };
    Some(v)
}

/// One piece of a pattern.
#[derive(Clone, Copy)]
enum Piece<'p> {
    Lit(&'p [u8]),
    /// `*`: one or more characters other than `.` and `/`.
    Star,
    /// `**`: one or more characters of any kind.
    Stars,
}

fn pieces(pattern: &str) -> Vec<Piece<'_>> {
    let b = pattern.as_bytes();
    let (mut out, mut i) = (Vec::new(), 0);
    while i < b.len() {
        if b[i] == b'*' {
            let double = b.get(i + 1) == Some(&b'*');
            out.push(if double { Piece::Stars } else { Piece::Star });
            i += if double { 2 } else { 1 };
        } else {
            let end = b[i..].iter().position(|&c| c == b'*').map_or(b.len(), |k| i + k);
            out.push(Piece::Lit(&b[i..end]));
            i = end;
        }
    }
    out
}

/// Match `name` against `pattern` (`*` within a segment, `**` across segments, each one or more
/// characters) and return what each wildcard matched, shortest first. A table of (piece, position)
/// outcomes keeps the cost polynomial whatever the pattern (no exponential backtracking).
fn glob<'a>(pattern: &str, name: &'a str) -> Option<Vec<&'a str>> {
    let ps = pieces(pattern);
    let n = name.as_bytes();
    // ok[i][j]: pieces i.. match name[j..].
    let mut ok = vec![vec![false; n.len() + 1]; ps.len() + 1];
    ok[ps.len()][n.len()] = true;
    for i in (0..ps.len()).rev() {
        for j in (0..=n.len()).rev() {
            ok[i][j] = match ps[i] {
                Piece::Lit(l) => n[j..].starts_with(l) && ok[i + 1][j + l.len()],
                Piece::Star => {
                    let run = n[j..].iter().take_while(|&&c| c != b'.' && c != b'/').count();
                    (1..=run).any(|k| ok[i + 1][j + k])
                }
                Piece::Stars => (j + 1..=n.len()).any(|k| ok[i + 1][k]),
            };
        }
    }
    if !ok[0][0] {
        return None;
    }
    let (mut caps, mut j) = (Vec::new(), 0);
    for (i, p) in ps.iter().enumerate() {
        match p {
            Piece::Lit(l) => j += l.len(),
            Piece::Star | Piece::Stars => {
                let k = (j + 1..=n.len()).find(|&k| ok[i + 1][k])?;
                caps.push(&name[j..k]);
                j = k;
            }
        }
    }
    Some(caps)
}

#[cfg(test)]
mod tests {
    use super::glob;

    #[test]
    fn globs_capture_within_a_segment() {
        assert_eq!(glob("a.*.b", "a.12.b"), Some(vec!["12"]));
        assert_eq!(glob("a.*.b", "a.1.2.b"), None);
        assert_eq!(glob("*.weight", "encoder.weight"), Some(vec!["encoder"]));
        assert_eq!(glob("*.weight", "encoder.layer.weight"), None);
        assert_eq!(glob("l*_x*", "l3_x7"), Some(vec!["3", "7"]));
        assert_eq!(glob("exact", "exact"), Some(vec![]));
        assert_eq!(glob("exact", "exactly"), None);
        assert_eq!(glob("a*", "a"), None);
        assert_eq!(glob("**.weight", "encoder.layer.0.weight"), Some(vec!["encoder.layer.0"]));
        // Many stars against a long name answer at once.
        let long = "a".repeat(200);
        assert_eq!(glob(&"*a".repeat(24), &long).map(|c| c.len()), Some(24));
        assert_eq!(glob(&format!("{}b", "*a".repeat(24)), &long), None);
    }

    #[test]
    fn only_splits_and_merges_of_axes_reshape() {
        use super::splits_or_merges;
        assert!(splits_or_merges(&[384, 384], &[384, 12, 32]));
        assert!(splits_or_merges(&[384, 384], &[12, 32, 384]));
        assert!(splits_or_merges(&[384], &[12, 32]));
        assert!(!splits_or_merges(&[1536, 384], &[384, 1536]));
        assert!(!splits_or_merges(&[384, 384], &[384, 6, 32]));
        assert!(!splits_or_merges(&[6, 4], &[4, 3, 2]));
    }
}
