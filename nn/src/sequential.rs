//! Sequential: layers applied one after another.

use crate::layer::sublayer_variables;
use crate::{Ctx, Layer};
use std::collections::HashMap;
use weft_core::{Result, Tensor, Var};

/// A stack of layers, each fed the previous one's output. Unnamed layers get Keras-style names
/// (`dense`, `dense_1`, ...), so variable paths are stable: `sequential/dense_1/kernel`.
pub struct Sequential {
    name: String,
    layers: Vec<Box<dyn Layer>>,
    counts: HashMap<&'static str, usize>,
}

impl Default for Sequential {
    fn default() -> Self {
        Sequential::new()
    }
}

impl Sequential {
    /// An empty stack named `sequential`.
    pub fn new() -> Self {
        Sequential { name: "sequential".into(), layers: Vec::new(), counts: HashMap::new() }
    }

    /// Append a layer (Keras' `model.add`).
    #[allow(clippy::should_implement_trait)]
    pub fn add(mut self, mut layer: impl Layer + 'static) -> Self {
        if layer.name().is_empty() {
            // Keras-style names that skip any name already taken (by a layer named by hand), so
            // an unnamed layer never collides; a clash between two hand-given names is refused
            // when the model is compiled or built (`check_paths`).
            let taken: Vec<&str> = self.layers.iter().map(|l| l.name()).collect();
            let name = auto_name(layer.kind(), &mut self.counts, &taken);
            layer.set_name(name);
        }
        self.layers.push(Box::new(layer));
        self
    }

    /// Give the stack a name (default `sequential`).
    pub fn named(mut self, name: &str) -> Self {
        self.name = name.to_string();
        self
    }
}

/// The next Keras-style name for a layer of `kind` (`dense`, `dense_1`, ...), skipping names in
/// `taken`; `counts` keeps the next suffix per kind.
pub(crate) fn auto_name(kind: &'static str, counts: &mut HashMap<&'static str, usize>, taken: &[&str]) -> String {
    let snake = to_snake(kind);
    let n = counts.entry(kind).or_insert(0);
    loop {
        let candidate = if *n == 0 { snake.clone() } else { format!("{snake}_{n}") };
        *n += 1;
        if !taken.contains(&candidate.as_str()) {
            return candidate;
        }
    }
}

/// Keras' snake case: `_` before a capital that starts a word (`MultiHeadAttention` ->
/// `multi_head_attention`) or follows a small letter; digits join the word before them
/// (`Conv2D` -> `conv2d`).
pub(crate) fn to_snake(kind: &str) -> String {
    let c: Vec<char> = kind.chars().collect();
    let mut s = String::new();
    for (i, &ch) in c.iter().enumerate() {
        let starts_word = c.get(i + 1).is_some_and(|n| n.is_lowercase());
        let after_small = i > 0 && c[i - 1].is_lowercase();
        if ch.is_uppercase() && i > 0 && (starts_word || after_small) {
            s.push('_');
        }
        s.push(ch.to_ascii_lowercase());
    }
    s
}

impl Layer for Sequential {
    fn call(&self, x: &Tensor, ctx: &mut Ctx) -> Result<Tensor> {
        let _scope = crate::scope::enter(self);
        let mut h = x.clone();
        for l in &self.layers {
            h = crate::scope::call(l.as_ref(), &h, ctx)?;
        }
        Ok(h)
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn set_name(&mut self, name: String) {
        self.name = name;
    }
    fn kind(&self) -> &'static str {
        "Sequential"
    }
    fn variables(&self) -> Vec<(String, Var)> {
        sublayer_variables(self.sublayers())
    }
    fn sublayers(&self) -> Vec<&dyn Layer> {
        self.layers.iter().map(|l| l.as_ref()).collect()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn names_are_keras_snake_case() {
        for (kind, want) in [
            ("Dense", "dense"),
            ("MultiHeadAttention", "multi_head_attention"),
            ("Conv2D", "conv2d"),
            ("GlobalAveragePooling1D", "global_average_pooling1d"),
            ("HTTPServer", "http_server"),
        ] {
            assert_eq!(super::to_snake(kind), want);
        }
    }
}
