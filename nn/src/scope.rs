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

/// By layer address: (kind, name, path) of the layers there, path `None` when two layers collide
/// on all three (a layer's first field is a sublayer at the same address).
type Paths = HashMap<usize, Vec<(&'static str, String, Option<String>)>>;

/// What the outermost call on this thread knows.
struct Call {
    paths: Paths,
    /// The layers entered and not yet left, innermost last: entering the innermost again (a
    /// layer's helper entering it a second time) keeps its path.
    entered: Vec<(usize, &'static str)>,
    /// Inputs already entered by f in this call, by the tensor they came from.
    copies: HashMap<TensorId, Tensor>,
}

thread_local! {
    static CALL: RefCell<Option<Call>> = const { RefCell::new(None) };
}

/// Keeps a layer's scope open until dropped; the outermost one also ends the call's state.
#[must_use = "the scope closes when this guard is dropped"]
pub struct LayerScope {
    _path: trace::PathGuard,
    root: bool,
}

impl Drop for LayerScope {
    fn drop(&mut self) {
        CALL.with(|c| {
            let mut c = c.borrow_mut();
            if self.root {
                c.take();
            } else if let Some(c) = c.as_mut() {
                c.entered.pop();
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

fn walk(layer: &dyn Layer, path: &str, out: &mut Paths) {
    let entries = out.entry(address(layer)).or_default();
    match entries.iter_mut().find(|(k, n, _)| *k == layer.kind() && n == layer.name()) {
        // The same layer reached twice by one path is fine; by two, its path is ambiguous.
        Some((_, _, p)) if p.as_deref() != Some(path) => *p = None,
        Some(_) => {}
        None => entries.push((layer.kind(), layer.name().to_string(), Some(path.to_string()))),
    }
    for s in layer.sublayers() {
        walk(s, &join(path, s.name()), out);
    }
}

/// Open `layer`'s scope for its call: the path its model's tree gives it, or its name under the
/// current scope. Every built-in layer opens its own at the start of `call`; a layer of one's
/// own may too (it then records its own ops under its path), but its sublayers get their paths
/// either way.
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
    let root = CALL.with(|c| c.borrow().is_none());
    if root {
        let mut paths = HashMap::new();
        walk(layer, &join(&trace::current_scope(), layer.name()), &mut paths);
        CALL.with(|c| *c.borrow_mut() = Some(Call { paths, entered: Vec::new(), copies: HashMap::new() }));
    }
    let me = (address(layer), layer.kind());
    let (known, again) = CALL.with(|c| {
        let mut c = c.borrow_mut();
        let Some(c) = c.as_mut() else { return (None, false) };
        let again = !root && c.entered.last() == Some(&me);
        c.entered.push(me);
        let known = c.paths.get(&me.0).and_then(|entries| {
            entries.iter().find(|(k, n, _)| *k == layer.kind() && n == layer.name()).and_then(|e| e.2.clone())
        });
        (known, again)
    });
    let path = match (known, again) {
        (Some(p), _) => p,
        // Entered again from inside itself: it stays where it is.
        (None, true) => trace::current_scope(),
        (None, false) => join(&trace::current_scope(), layer.name()),
    };
    LayerScope { _path: trace::scope_at(&path), root }
}

/// Call `layer` on `x` in its scope: what a container does with a sublayer of its own (the
/// sublayer's own ops are then recorded under its path even if it opens no scope itself).
pub fn call(layer: &dyn Layer, x: &Tensor, ctx: &mut Ctx) -> Result<Tensor> {
    let _s = enter(layer);
    layer.call(x, ctx)
}

/// `x` entered by Megatron's f (identity forward, all-reduce of its gradient backward), once per
/// tensor in the outermost call: column-split layers that take the same tensor share it.
pub(crate) fn copy_once(x: &Tensor, comm: &Arc<dyn Collectives>) -> Tensor {
    let cached = CALL.with(|c| c.borrow().as_ref().and_then(|c| c.copies.get(&x.id()).cloned()));
    if let Some(t) = cached {
        return t;
    }
    let t = copy_to_parallel(x, comm.clone());
    CALL.with(|c| {
        if let Some(c) = c.borrow_mut().as_mut() {
            c.copies.insert(x.id(), t.clone());
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

    #[test]
    fn paths_come_from_the_tree_and_entering_twice_keeps_one_segment() {
        let net = crate::Sequential::new()
            .named("net")
            .add(Bare { listed: Dense::new(3).named("listed"), late: std::sync::OnceLock::new() });
        let x = Tensor::ones(&[1, 4], &Device::Meta).unwrap();
        let (_, nodes) = trace::trace(|| call(&net, &x, &mut Ctx::inference())).unwrap();
        let scopes: std::collections::BTreeSet<&str> = nodes.iter().map(|n| n.scope.as_str()).collect();
        // Dense enters itself, then tp::linear enters it again: one segment each time.
        assert_eq!(scopes.into_iter().collect::<Vec<_>>(), ["net/bare/late", "net/bare/listed"]);
        assert!(CALL.with(|c| c.borrow().is_none()), "the call's state ends with the outermost scope");
        assert_eq!(trace::current_scope(), "");
    }
}
