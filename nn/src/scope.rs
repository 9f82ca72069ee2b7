//! Layer scopes: the path a layer runs under comes from the model's tree of layers, not from
//! every container on the way remembering to open a scope.
//!
//! A layer's path (`model/block/attention/query`) names its variables, seeds its initializer and
//! its dropout, and finds its shard in a split model. The outermost layer called on a thread
//! walks its tree once (through [`Layer::sublayers`]) and every layer called inside that call
//! runs under the path the tree gives it, so a container of one's own that opens no scope still
//! gives its sublayers their whole paths. A layer the tree does not list (one made during its
//! parent's first call) takes its name under the current scope.
//!
//! The same per-call state lets column-split layers that take the very same tensor share one f
//! (one all-reduce of the input's gradient, not one per layer): attention's query, key and value,
//! whoever wrote the attention layer.

use crate::{Ctx, Layer};
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;
use weft_core::collectives::{Collectives, copy_to_parallel};
use weft_core::{Result, Tensor, TensorId, trace};

/// One layer of the tree: where it lives, what it is, and its path (`None` when two layers
/// collide on address, kind and name: a layer whose first field is a sublayer of the same kind
/// and name).
struct Entry {
    size: usize,
    kind: &'static str,
    name: String,
    path: Option<String>,
}

/// What the outermost call of one model on this thread knows.
struct Frame {
    /// The tree, by layer address.
    paths: HashMap<usize, Vec<Entry>>,
    /// The layers entered and not yet left, innermost last: entering the innermost again (a
    /// layer's helper entering it a second time) keeps its path.
    entered: Vec<(usize, &'static str)>,
    /// Inputs already entered by f in this call, by the tensor they came from and the group.
    copies: HashMap<(TensorId, usize), Tensor>,
}

thread_local! {
    /// One frame per model being called, innermost last (a model called inside another's
    /// forward pass, a frozen encoder say, has paths of its own).
    static FRAMES: RefCell<Vec<Frame>> = const { RefCell::new(Vec::new()) };
}

/// Keeps a layer's scope open until dropped; the outermost one of a model also ends its frame.
#[must_use = "the scope closes when this guard is dropped"]
pub struct LayerScope {
    _path: trace::PathGuard,
    /// The frames below this scope's (it pops back to them), or the entered depth to return to.
    restore: Restore,
}

enum Restore {
    Frames(usize),
    Entered(usize),
}

impl Drop for LayerScope {
    fn drop(&mut self) {
        FRAMES.with(|f| {
            let mut f = f.borrow_mut();
            match self.restore {
                Restore::Frames(n) => f.truncate(n),
                Restore::Entered(n) => {
                    if let Some(top) = f.last_mut() {
                        top.entered.truncate(n);
                    }
                }
            }
        });
    }
}

fn address(layer: &dyn Layer) -> usize {
    layer as *const dyn Layer as *const () as usize
}

fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() { name.to_string() } else { format!("{prefix}/{name}") }
}

fn walk(layer: &dyn Layer, path: &str, out: &mut HashMap<usize, Vec<Entry>>) {
    let entries = out.entry(address(layer)).or_default();
    match entries.iter_mut().find(|e| e.kind == layer.kind() && e.name == layer.name()) {
        // The same layer reached twice by one path is fine; by two, its path is ambiguous.
        Some(e) if e.path.as_deref() != Some(path) => e.path = None,
        Some(_) => {}
        None => entries.push(Entry {
            size: std::mem::size_of_val(layer),
            kind: layer.kind(),
            name: layer.name().to_string(),
            path: Some(path.to_string()),
        }),
    }
    for s in layer.sublayers() {
        walk(s, &join(path, s.name()), out);
    }
}

/// A new frame for `layer`, the outermost of a model: its tree walked, its path `path`.
fn frame(layer: &dyn Layer, path: &str) -> Frame {
    let mut paths = HashMap::new();
    walk(layer, path, &mut paths);
    Frame { paths, entered: Vec::new(), copies: HashMap::new() }
}

impl Frame {
    /// The path of the layer at `at` of this kind and name: from the tree, or, for a layer made
    /// during its parent's call (not in the tree yet) and held in the parent's own memory, under
    /// the nearest layer of the tree whose memory holds it.
    fn path(&self, at: usize, size: usize, kind: &str, name: &str) -> Option<String> {
        if let Some(e) = self.paths.get(&at).and_then(|es| es.iter().find(|e| e.kind == kind && e.name == name)) {
            return e.path.clone();
        }
        let holder = self
            .paths
            .iter()
            .flat_map(|(a, es)| es.iter().map(move |e| (*a, e)))
            .filter(|(a, e)| *a <= at && at + size <= a + e.size && e.size > size)
            // The tightest holder; of a container and its only field (same memory), the field.
            .min_by_key(|(_, e)| (e.size, std::cmp::Reverse(e.path.as_ref().map_or(0, |p| p.matches('/').count()))))?;
        holder.1.path.as_ref().map(|p| join(p, name))
    }
}

/// Open `layer`'s scope for its call: the path its model's tree gives it, or its name under the
/// current scope. Every built-in layer opens its own at the start of `call`; a layer of one's
/// own may too (it then records its own ops under its path), but its sublayers get their paths
/// either way. A layer that makes sublayers during its call should keep them in its own memory
/// (a `OnceLock` field, as attention keeps its output projection) or open its scope: that is
/// how they are found before the tree lists them.
///
/// ```
/// use weft_core::{trace, Device, Tensor};
/// use weft_nn::{layers::Dense, scope, Ctx, Layer, Sequential};
/// let net = Sequential::new().named("net").add(Dense::new(2).named("d"));
/// let _s = scope::enter(&net);
/// assert_eq!(trace::current_scope(), "net");
/// # Ok::<(), weft_core::Error>(())
/// ```
pub fn enter(layer: &dyn Layer) -> LayerScope {
    if FRAMES.with(|f| f.borrow().is_empty()) {
        return root(layer);
    }
    let (at, size, kind, name) = (address(layer), std::mem::size_of_val(layer), layer.kind(), layer.name());
    let (known, again, depth) = FRAMES.with(|f| {
        let mut f = f.borrow_mut();
        let top = f.last_mut().expect("a frame");
        let again = top.entered.last() == Some(&(at, kind));
        let depth = top.entered.len();
        top.entered.push((at, kind));
        (top.path(at, size, kind, name), again, depth)
    });
    let path = match (known, again) {
        (Some(p), _) => p,
        // Entered again from inside itself: it stays where it is.
        (None, true) => trace::current_scope(),
        (None, false) => join(&trace::current_scope(), name),
    };
    LayerScope { _path: trace::scope_at(&path), restore: Restore::Entered(depth) }
}

/// Open the scope of `layer` as a model of its own: a new frame whose paths start at its name,
/// whatever model (if any) is being called around it. `Model` calls its network through this,
/// so a model called inside another's forward pass keeps its own paths, seeds and shards.
pub fn root(layer: &dyn Layer) -> LayerScope {
    let path = layer.name().to_string();
    // Everything that runs code of the layer's (its tree) runs before the frame is pushed.
    let mut new = frame(layer, &path);
    new.entered.push((address(layer), layer.kind()));
    let guard = trace::scope_at(&path);
    let below = FRAMES.with(|f| {
        let mut f = f.borrow_mut();
        f.push(new);
        f.len() - 1
    });
    LayerScope { _path: guard, restore: Restore::Frames(below) }
}

/// Call `layer` on `x` in its scope: what a container does with a sublayer of its own (the
/// sublayer's own ops are then recorded under its path even if it opens no scope itself).
pub fn call(layer: &dyn Layer, x: &Tensor, ctx: &mut Ctx) -> Result<Tensor> {
    let _s = enter(layer);
    layer.call(x, ctx)
}

/// `x` entered by Megatron's f (identity forward, all-reduce of its gradient backward), once per
/// tensor and group in the model's call: column-split layers that take the same tensor share it.
pub(crate) fn copy_once(x: &Tensor, comm: &Arc<dyn Collectives>) -> Tensor {
    let key = (x.id(), Arc::as_ptr(comm) as *const () as usize);
    let cached = FRAMES.with(|f| f.borrow().last().and_then(|t| t.copies.get(&key).cloned()));
    if let Some(t) = cached {
        return t;
    }
    let t = copy_to_parallel(x, comm.clone());
    FRAMES.with(|f| {
        if let Some(top) = f.borrow_mut().last_mut() {
            top.copies.insert(key, t.clone());
        }
    });
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::Dense;
    use weft_core::{Device, Var};

    /// A container that opens no scope, with one sublayer it lists and one it makes during its
    /// first call (as attention makes its output projection) and does not list.
    struct Bare {
        listed: Dense,
        late: std::sync::OnceLock<Dense>,
    }

    impl Layer for Bare {
        fn call(&self, x: &Tensor, ctx: &mut Ctx) -> Result<Tensor> {
            let h = self.listed.call(x, ctx)?;
            self.late.get_or_init(|| Dense::new(2).named("late")).call(&h, ctx)
        }
        fn name(&self) -> &str {
            "bare"
        }
        fn set_name(&mut self, _: String) {}
        fn kind(&self) -> &'static str {
            "Bare"
        }
        fn variables(&self) -> Vec<(String, Var)> {
            Vec::new()
        }
        fn sublayers(&self) -> Vec<&dyn Layer> {
            vec![&self.listed]
        }
    }

    /// A container of one's own around `Bare`, opening no scope either.
    struct Outer {
        bare: Bare,
    }

    impl Layer for Outer {
        fn call(&self, x: &Tensor, ctx: &mut Ctx) -> Result<Tensor> {
            self.bare.call(x, ctx)
        }
        fn name(&self) -> &str {
            "outer"
        }
        fn set_name(&mut self, _: String) {}
        fn kind(&self) -> &'static str {
            "Outer"
        }
        fn variables(&self) -> Vec<(String, Var)> {
            Vec::new()
        }
        fn sublayers(&self) -> Vec<&dyn Layer> {
            vec![&self.bare]
        }
    }

    #[test]
    fn paths_come_from_the_tree_and_entering_twice_keeps_one_segment() {
        let bare = Bare { listed: Dense::new(3).named("listed"), late: std::sync::OnceLock::new() };
        let net = crate::Sequential::new().named("net").add(Outer { bare });
        let x = Tensor::ones(&[1, 4], &Device::Meta).unwrap();
        for _ in 0..2 {
            let (_, nodes) = trace::trace(|| call(&net, &x, &mut Ctx::inference())).unwrap();
            let scopes: std::collections::BTreeSet<&str> = nodes.iter().map(|n| n.scope.as_str()).collect();
            // Dense enters itself, then tp::linear enters it again: one segment each time. The
            // late layer, not in the tree on the first call, is found in its parent's memory.
            assert_eq!(scopes.into_iter().collect::<Vec<_>>(), ["net/outer/bare/late", "net/outer/bare/listed"]);
        }
        assert!(FRAMES.with(|f| f.borrow().is_empty()), "the call's state ends with the outermost scope");
        assert_eq!(trace::current_scope(), "");
        // A model called inside another's call keeps its own paths.
        let other = crate::Sequential::new().named("other").add(Dense::new(2).named("d"));
        let (_, nodes) = trace::trace(|| {
            let _outer = root(&net);
            let _inner = root(&other);
            other.call(&x, &mut Ctx::inference())
        })
        .unwrap();
        assert!(nodes.iter().all(|n| n.scope == "other/d"), "{:?}", nodes.iter().map(|n| &n.scope).collect::<Vec<_>>());
    }
}
