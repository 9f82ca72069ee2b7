//! What a failed call must leave alone: a model's weights, its optimizer's slots and step count,
//! and its own step counter. Shared by the hostile-input tests (`nn/tests/hostile.rs`, and the
//! workspace's `tests/hostile_table.rs` through `#[path]`).

use weft_nn::Model;

/// Weights, slots, the optimizer's step count and the model's step counter, as plain values.
pub type State = (Vec<(String, Vec<f32>)>, Vec<(String, String, Vec<f32>)>, u64, u64);

/// The state of a compiled model.
pub fn state(m: &Model) -> State {
    let w = m.variables().into_iter().map(|(p, v)| (p, v.to_vec::<f32>().unwrap())).collect();
    let opt = m.optimizer().expect("a compiled model");
    let s = opt.slots().into_iter().map(|(p, n, t)| (p, n, t.to_vec::<f32>().unwrap())).collect();
    (w, s, opt.iterations(), m.step_counter())
}
