//! Saving a checkpoint in parts, over a mesh that spans processes: each process writes the
//! tensor parts its ranks hold to a file of its own, and process 0 writes the index
//! (`weft_nn::checkpoint::Index`). Nothing is gathered: a process writes only what it holds.
//!
//! Which rank writes what is worked out the same way on every process from the plan alone, so
//! process 0 can write the index without hearing from the others. A split tensor's part `mi` is
//! held by every data-parallel copy of model index `mi`; the copies take turns by tensor, so the
//! writing spreads over the data axis too. A replicated tensor goes to one rank, by turns.

use super::ShardedModel;
use std::path::Path;
use weft_core::{Error, Result, Tensor};
use weft_nn::checkpoint::{ITERATIONS_KEY, Index, IndexPart, SHARD_ID_META, part_key, slot_key};
use weft_nn::tp::{Placement, split_start};

/// One tensor of the checkpoint: its name, the variable whose placement it follows, whole shape.
struct Entry {
    name: String,
    var: Option<String>,
    shape: Vec<usize>,
}

impl ShardedModel {
    /// `save_checkpoint` over several processes.
    pub(super) fn save_parts(&mut self, path: &Path) -> Result<()> {
        let procs = self.mesh.procs().cloned().ok_or_else(|| Error::Msg("save_parts: one process".into()))?;
        let (me, n) = (procs.rank(), procs.size());
        // One id for the save, the same on every process: the largest of their clocks and pids.
        let clock = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let mine = (clock as u64) ^ ((std::process::id() as u64) << 40);
        let id = format!("{:016x}", procs.max_u64("save_checkpoint: choosing the save's id", &[mine])?[0]);
        let planned = self.plan_parts(path, &id, n);
        let (index, writes) = procs.all_ok("save_checkpoint: laying out the parts", planned)?;
        // This process's parts, to its own file.
        let written = self.write_parts(path, &id, me, n, &writes);
        if let Err(e) = procs.all_ok("save_checkpoint: writing the parts", written) {
            // No index will name this save's parts: take this process's away.
            let _ = std::fs::remove_file(path.with_file_name(Index::part_file_name(path, &id, me, n)));
            return Err(e);
        }
        // Process 0 replaces the index; the files of the save before go once it is replaced.
        let replaced = match me {
            0 => Index::read(path).and_then(|old| index.write(path).map(|_| old)),
            _ => Ok(None),
        };
        let old = procs.all_ok("save_checkpoint: writing the index", replaced)?;
        // Only files named after this index (a copy of an index elsewhere names another's).
        if let Some(old) = old {
            let dir = path.parent().unwrap_or(Path::new("."));
            let own = format!("{}.", path.file_name().map_or("".into(), |n| n.to_string_lossy().into_owned()));
            for stale in old.files().difference(&index.files()).filter(|f| f.starts_with(&own)) {
                // Best effort: a file left behind takes room but breaks nothing.
                let _ = std::fs::remove_file(dir.join(stale));
            }
        }
        Ok(())
    }

    /// Every tensor of the checkpoint, in the order every process lists them.
    fn entries(&self) -> Result<Vec<Entry>> {
        let m = &self.ranks[0];
        let mut out = Vec::new();
        for (path, _) in m.variables() {
            let shape = self.full_shape(&path).ok_or_else(|| Error::Msg(format!("{path} is not in the plan")))?;
            out.push(Entry { name: path.clone(), var: Some(path), shape });
        }
        if let Some(opt) = m.optimizer() {
            for (path, slot, _) in opt.slots() {
                let shape = self.full_shape(&path).ok_or_else(|| Error::Msg(format!("{path} is not in the plan")))?;
                out.push(Entry { name: slot_key(&slot, &path), var: Some(path), shape });
            }
            out.push(Entry { name: ITERATIONS_KEY.into(), var: None, shape: vec![1] });
        }
        Ok(out)
    }

    /// The index of this save, and each part's writer: (tensor number, global rank, axis and
    /// start, key in the part file).
    #[allow(clippy::type_complexity)]
    fn plan_parts(&self, path: &Path, id: &str, n: usize) -> Result<(Index, Vec<(usize, usize, usize, String)>)> {
        let (d, m) = (self.mesh.size("data"), self.mesh.size("model"));
        let per_process = self.mesh.len() / n;
        let mut index = Index::new(id, &self.step_meta());
        let mut writes = Vec::new();
        for (t, e) in self.entries()?.iter().enumerate() {
            let placement = e.var.as_ref().and_then(|v| self.placements.get(v)).unwrap_or(&Placement::Replicate);
            let parts: Vec<(usize, usize, usize, String)> = match placement {
                Placement::Shard { axis, sizes } => (0..m)
                    .map(|mi| {
                        let start = split_start(sizes, mi);
                        ((t + mi) % d * m + mi, *axis, start, part_key(&e.name, *axis, start))
                    })
                    .collect(),
                Placement::Replicate => vec![(t % (d * m), 0, 0, e.name.clone())],
            };
            for (g, axis, start, key) in parts {
                let file = Index::part_file_name(path, id, g / per_process, n);
                index.add_part(&e.name, &e.shape, IndexPart { file, key: key.clone(), axis, start });
                writes.push((t, g, axis, key));
            }
        }
        Ok((index, writes))
    }

    /// Write this process's parts of `writes` to its part file (none when it holds no part).
    fn write_parts(
        &self,
        path: &Path,
        id: &str,
        me: usize,
        n: usize,
        writes: &[(usize, usize, usize, String)],
    ) -> Result<()> {
        let entries = self.entries()?;
        let mut tensors: Vec<(String, Tensor)> = Vec::new();
        for (t, g, _, key) in writes {
            let Some(local) = self.global.iter().position(|x| x == g) else { continue };
            let e = &entries[*t];
            let model = &self.ranks[local];
            let value = match (&e.var, e.name.as_str()) {
                (_, ITERATIONS_KEY) => {
                    let it = model.optimizer().map_or(0, |o| o.iterations());
                    Tensor::from_vec(vec![it as f32], &[1], &weft_core::Device::Cpu)?
                }
                (Some(var), name) if name == var => model
                    .variables()
                    .into_iter()
                    .find(|(p, _)| p == var)
                    .map(|(_, v)| v.as_tensor().clone())
                    .ok_or_else(|| Error::Msg(format!("rank {g} has no variable {var}")))?,
                (Some(var), name) => model
                    .optimizer()
                    .and_then(|o| o.slots().into_iter().find(|(p, s, _)| p == var && slot_key(s, p) == name))
                    .map(|(_, _, t)| t)
                    .ok_or_else(|| Error::Msg(format!("rank {g} has no optimizer state {name}")))?,
                (None, name) => return Err(Error::Msg(format!("save_checkpoint: {name} has no variable"))),
            };
            tensors.push((key.clone(), value));
        }
        if tensors.is_empty() {
            return Ok(());
        }
        let file = path.with_file_name(Index::part_file_name(path, id, me, n));
        weft_nn::checkpoint::save_with_metadata(file, &tensors, &[(SHARD_ID_META, id.to_string())])
    }
}
