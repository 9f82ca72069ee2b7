//! The LSTM and GRU cell steps as one op each (`Tensor::lstm_cell`, `Tensor::gru_cell`) against
//! the tensor ops they replace: the same bits forward, the same gradients backward, over views of
//! every input, on one thread and on several; and bad shapes, dtypes and devices are `Err`s that
//! name them.

mod common;

use common::{assert_close, gru_composed, lstm_composed as composed};
use proptest::prelude::*;
use weft_core::{DType, Device, Result, Tensor, Var};

/// The tensors the gradients are taken of: z and c themselves, or tensors that z and c are views
/// of (see [`viewed`]).
fn inputs(rows: usize, u: usize, views: bool, seed: u64) -> (Var, Var) {
    let dev = Device::Cpu;
    let (zs, cs) = if views { (vec![4 * u, rows], vec![rows, u + 3]) } else { (vec![rows, 4 * u], vec![rows, u]) };
    let z = Tensor::rand(-4.0, 4.0, &zs, seed, &dev).unwrap();
    let c = Tensor::rand(-2.0, 2.0, &cs, seed + 1, &dev).unwrap();
    (Var::new(z).unwrap(), Var::new(c).unwrap())
}

/// z `[rows, 4u]` and c `[rows, u]` from [`inputs`]: the tensors, or views of them (z transposed
/// from `[4u, rows]`, c narrowed out of `[rows, u + 3]`: an offset and a row stride of its own).
fn viewed(z: &Var, c: &Var, u: usize, views: bool) -> (Tensor, Tensor) {
    let (z, c) = (z.as_tensor(), c.as_tensor());
    if views { (z.t().unwrap(), c.narrow(1, 2, u).unwrap()) } else { (z.clone(), c.clone()) }
}

/// The loss both ways: weighted sums of h and c', so both gradients reach the cell.
fn loss(h: &Tensor, c2: &Tensor, seed: u64) -> Result<Tensor> {
    let w = |t: &Tensor, s: u64| Tensor::rand(-1.0, 1.0, t.dims(), s, t.device());
    h.mul(&w(h, seed)?)?.sum_all()?.add(&c2.mul(&w(c2, seed + 1)?)?.sum_all()?)
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec::<f32>().unwrap().iter().map(|v| v.to_bits()).collect()
}

/// Forward bits and both gradients of the fused op against the composed ops.
fn check(rows: usize, u: usize, views: bool, seed: u64) {
    let what = format!("rows {rows} u {u} views {views}");
    let (zv, cv) = inputs(rows, u, views, seed);
    let (z, c) = viewed(&zv, &cv, u, views);
    let (h, c2) = Tensor::lstm_cell(&z, &c).unwrap();
    let (hw, c2w) = composed(&z, &c).unwrap();
    assert_eq!(bits(&h), bits(&hw), "{what}: h");
    assert_eq!(bits(&c2), bits(&c2w), "{what}: c'");
    let grads = loss(&h, &c2, seed).unwrap().backward().unwrap();
    let (zw, cw) = inputs(rows, u, views, seed);
    let (z, c) = viewed(&zw, &cw, u, views);
    let (hw, c2w) = composed(&z, &c).unwrap();
    let want = loss(&hw, &c2w, seed).unwrap().backward().unwrap();
    for (name, got, w) in [("dz", &zv, &zw), ("dc", &cv, &cw)] {
        let (got, w) = (grads.get(got).unwrap(), want.get(w).unwrap());
        assert_eq!(got.dims(), w.dims(), "{what}: {name}");
        assert_close(&got.to_vec::<f32>().unwrap(), &w.to_vec::<f32>().unwrap(), 1e-6, &format!("{what}: {name}"));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn the_fused_cell_matches_the_composed_ops(rows in prop::sample::select(vec![1usize, 3, 17]),
                                               u in prop::sample::select(vec![1usize, 5, 33]),
                                               views: bool, seed in 0u64..1000) {
        check(rows, u, views, seed);
    }
}

/// Steps large enough to be cut into several tasks (rows of 5 x 64 gradients, 2,048 values a
/// task), on one thread and on three.
#[test]
fn a_step_over_many_rows_matches_on_any_thread_count() {
    for threads in [1, 3] {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        pool.install(|| check(300, 64, true, 11));
    }
}

/// A NaN in one unit's gates or state gives NaN in that unit's h and c' alone, and infinite
/// pre-activations saturate the gates as the composed ops do (the same bits).
#[test]
fn nan_and_infinities_stay_where_they_were() {
    let u = 4;
    let mut z = Tensor::rand(-4.0, 4.0, &[2, 4 * u], 3, &Device::Cpu).unwrap().to_vec::<f32>().unwrap();
    z[1] = f32::NAN;
    z[u + 2] = f32::INFINITY;
    z[4 * u + 2 * u + 3] = f32::NEG_INFINITY;
    let z = Tensor::from_slice(&z, &[2, 4 * u], &Device::Cpu).unwrap();
    let c = Tensor::rand(-2.0, 2.0, &[2, u], 4, &Device::Cpu).unwrap();
    let (h, c2) = Tensor::lstm_cell(&z, &c).unwrap();
    let (hw, c2w) = composed(&z, &c).unwrap();
    assert_eq!(bits(&h), bits(&hw));
    assert_eq!(bits(&c2), bits(&c2w));
    let h = h.to_vec::<f32>().unwrap();
    assert!(h[1].is_nan() && h.iter().enumerate().all(|(i, v)| i == 1 || v.is_finite()), "{h:?}");
}

/// The trace of a step names the fused op and none of the ops it replaces.
#[test]
fn a_step_is_one_node() {
    let (zv, cv) = inputs(2, 3, false, 5);
    let (z, c) = viewed(&zv, &cv, 3, false);
    let (_, nodes) = weft_core::trace::trace(|| Tensor::lstm_cell(&z, &c)).unwrap();
    let kinds: Vec<&str> = nodes.iter().map(|n| n.kind.as_str()).collect();
    assert!(kinds.contains(&"lstm_cell"), "{kinds:?}");
    assert!(!kinds.iter().any(|k| k.contains("sigmoid") || k.contains("tanh")), "{kinds:?}");
}

#[test]
fn bad_shapes_dtypes_and_devices_are_errors_naming_them() {
    let dev = Device::Cpu;
    let z = Tensor::zeros(&[2, 12], &dev).unwrap();
    let err = Tensor::lstm_cell(&z, &Tensor::zeros(&[2, 4], &dev).unwrap()).unwrap_err().to_string();
    assert!(err.contains("lstm_cell") && err.contains("[2, 12]") && err.contains("[2, 4]"), "{err}");
    let err = Tensor::lstm_cell(&Tensor::zeros(&[12], &dev).unwrap(), &Tensor::zeros(&[3], &dev).unwrap());
    assert!(err.unwrap_err().to_string().contains("[12]"));
    let ints = Tensor::zeros(&[2, 3], &dev).unwrap().to_dtype(DType::U32).unwrap();
    let err = Tensor::lstm_cell(&z, &ints).unwrap_err().to_string();
    assert!(err.contains("lstm_cell") && err.to_lowercase().contains("u32"), "{err}");
    let meta = Tensor::zeros(&[2, 3], &Device::Meta).unwrap();
    let err = Tensor::lstm_cell(&z, &meta).unwrap_err().to_string();
    assert!(err.contains("lstm_cell"), "{err}");
    // On the Meta device alone it gives the shapes and no data.
    let (h, c2) = Tensor::lstm_cell(&Tensor::zeros(&[2, 12], &Device::Meta).unwrap(), &meta).unwrap();
    assert_eq!((h.dims(), c2.dims()), (&[2, 3][..], &[2, 3][..]));
}

/// x, hr and h for a GRU step as Vars, and the tensors fed to the cell: the Vars themselves, or
/// views of them (x transposed from `[3u, rows]`, hr and h narrowed out of wider tensors).
fn gru_inputs(rows: usize, u: usize, views: bool, seed: u64) -> ([Var; 3], [Tensor; 3]) {
    let dev = Device::Cpu;
    let shapes = if views {
        [vec![3 * u, rows], vec![rows, 3 * u + 2], vec![rows, u + 1]]
    } else {
        [vec![rows, 3 * u], vec![rows, 3 * u], vec![rows, u]]
    };
    let vars =
        [0, 1, 2].map(|k| Var::new(Tensor::rand(-3.0, 3.0, &shapes[k], seed + k as u64, &dev).unwrap()).unwrap());
    let t = |k: usize| vars[k].as_tensor().clone();
    let fed = if views {
        [t(0).t().unwrap(), t(1).narrow(1, 1, 3 * u).unwrap(), t(2).narrow(1, 1, u).unwrap()]
    } else {
        [t(0), t(1), t(2)]
    };
    (vars, fed)
}

/// Forward bits and the three gradients of the fused GRU step against the composed ops.
fn gru_check(rows: usize, u: usize, views: bool, seed: u64) {
    let what = format!("gru rows {rows} u {u} views {views}");
    // The loss reads the new state as the second half of a concatenation: its gradient reaches
    // the cell as a view (an offset of u, a row stride of 2u).
    let w = Tensor::rand(-1.0, 1.0, &[rows, 2 * u], seed + 9, &Device::Cpu).unwrap();
    let loss =
        |h: &Tensor| Tensor::concat(&[Tensor::ones(&[rows, u], &Device::Cpu)?, h.clone()], 1)?.mul(&w)?.sum_all();
    let (vars, [x, hr, h]) = gru_inputs(rows, u, views, seed);
    let got = Tensor::gru_cell(&x, &hr, &h).unwrap();
    let (wvars, [wx, whr, wh]) = gru_inputs(rows, u, views, seed);
    let want = gru_composed(&wx, &whr, &wh).unwrap();
    assert_eq!(bits(&got), bits(&want), "{what}: h'");
    let grads = loss(&got).unwrap().backward().unwrap();
    let wgrads = loss(&want).unwrap().backward().unwrap();
    for (k, name) in ["dx", "dhr", "dh"].iter().enumerate() {
        let (g, wg) = (grads.get(&vars[k]).unwrap(), wgrads.get(&wvars[k]).unwrap());
        assert_eq!(g.dims(), wg.dims(), "{what}: {name}");
        assert_close(&g.to_vec::<f32>().unwrap(), &wg.to_vec::<f32>().unwrap(), 1e-6, &format!("{what}: {name}"));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn the_fused_gru_step_matches_the_composed_ops(rows in prop::sample::select(vec![1usize, 3, 17]),
                                                   u in prop::sample::select(vec![1usize, 5, 33]),
                                                   views: bool, seed in 0u64..1000) {
        gru_check(rows, u, views, seed);
    }
}

/// A GRU step cut into several tasks (rows of 7 x 64 gradients), on one thread and on three.
#[test]
fn a_gru_step_over_many_rows_matches_on_any_thread_count() {
    for threads in [1, 3] {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        pool.install(|| gru_check(300, 64, true, 13));
    }
}

#[test]
fn a_gru_step_is_one_node_and_bad_input_names_itself() {
    let (_, [x, hr, h]) = gru_inputs(2, 3, false, 5);
    let (_, nodes) = weft_core::trace::trace(|| Tensor::gru_cell(&x, &hr, &h)).unwrap();
    let kinds: Vec<&str> = nodes.iter().map(|n| n.kind.as_str()).collect();
    assert!(kinds.contains(&"gru_cell") && !kinds.iter().any(|k| k.contains("sigmoid")), "{kinds:?}");
    let err = Tensor::gru_cell(&x, &hr.narrow(1, 0, 6).unwrap(), &h).unwrap_err().to_string();
    assert!(err.contains("gru_cell") && err.contains("[2, 6]") && err.contains("[2, 3]"), "{err}");
    let err = Tensor::gru_cell(&x, &hr, &h.to_dtype(DType::U32).unwrap()).unwrap_err().to_string();
    assert!(err.contains("gru_cell") && err.to_lowercase().contains("u32"), "{err}");
    let meta = |t: &Tensor| Tensor::zeros(t.dims(), &Device::Meta).unwrap();
    assert!(Tensor::gru_cell(&x, &meta(&hr), &h).unwrap_err().to_string().contains("gru_cell"));
    assert_eq!(Tensor::gru_cell(&meta(&x), &meta(&hr), &meta(&h)).unwrap().dims(), &[2, 3]);
}
