//! Shared by the core test binaries: one GPU device per binary, and comparison helpers.
#![allow(dead_code)]

use std::sync::OnceLock;
use weft_core::{Device, Result, Tensor};

/// One GPU device (any adapter, lavapipe included) shared by the tests of this binary.
/// Without an adapter: `None` with a note on a user's machine, a failure under `CI=true`.
pub fn gpu() -> Option<Device> {
    static GPU: OnceLock<Option<Device>> = OnceLock::new();
    GPU.get_or_init(|| match Device::best_gpu() {
        Ok(d) => {
            assert!(d.is_gpu());
            eprintln!("GPU tests run on {}", d.describe());
            Some(d)
        }
        Err(e) => {
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("CI=true but no GPU adapter could be opened: {e}");
            }
            eprintln!("note: skipping GPU tests, no adapter: {e}");
            None
        }
    })
    .clone()
}

/// Assert every element of `got` is within `tol` of `want`, relative to max(|want|, 1).
pub fn assert_close(got: &[f32], want: &[f32], tol: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = (g - w).abs() <= tol * w.abs().max(1.0) || (g.is_nan() && w.is_nan()) || g == w;
        assert!(ok, "{what}: element {i}: got {g}, want {w} (tolerance {tol})");
    }
}

/// Read an f32 tensor.
pub fn vals(t: &Tensor) -> Vec<f32> {
    t.to_vec::<f32>().expect("read f32 tensor")
}

/// The same data on two devices.
pub fn pair(data: &[f32], shape: &[usize], a: &Device, b: &Device) -> Result<(Tensor, Tensor)> {
    Ok((Tensor::from_slice(data, shape, a)?, Tensor::from_slice(data, shape, b)?))
}

/// An LSTM step `(h, c')` by tensor ops, as the LSTM layer forms it without `Tensor::lstm_cell`.
pub fn lstm_composed(z: &Tensor, c: &Tensor) -> Result<(Tensor, Tensor)> {
    let u = c.dims()[1];
    let gate = |k: usize| z.narrow(-1, k * u, u);
    let (i, f) = (gate(0)?.sigmoid()?, gate(1)?.sigmoid()?);
    let (g, o) = (gate(2)?.tanh()?, gate(3)?.sigmoid()?);
    let c2 = f.mul(c)?.add(&i.mul(&g)?)?;
    Ok((o.mul(&c2.tanh()?)?, c2))
}

/// A GRU step (reset after) by tensor ops, as the GRU layer forms it without `Tensor::gru_cell`.
pub fn gru_composed(x: &Tensor, hr: &Tensor, h: &Tensor) -> Result<Tensor> {
    let u = h.dims()[1];
    let gate = |t: &Tensor, k: usize| t.narrow(-1, k * u, u);
    let z = gate(x, 0)?.add(&gate(hr, 0)?)?.sigmoid()?;
    let r = gate(x, 1)?.add(&gate(hr, 1)?)?.sigmoid()?;
    let hh = gate(x, 2)?.add(&r.mul(&gate(hr, 2)?)?)?.tanh()?;
    hh.add(&z.mul(&h.sub(&hh)?)?)
}
