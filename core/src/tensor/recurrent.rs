//! The step of a recurrent cell as one op: an LSTM's or a GRU's gates and state update.

use super::Tensor;
use crate::backprop::Op;
use crate::storage::Storage;
use crate::{DType, Error, Layout, Result};
use std::sync::Arc;

impl Tensor {
    /// One step of an LSTM cell with Keras' default activations, from the gates' pre-activations
    /// `z` (`[rows, 4u]`, the gates in Keras' order i, f, g, o: `x W + h U + b`) and the state `c`
    /// (`[rows, u]`): `c' = sigmoid(z_f) c + sigmoid(z_i) tanh(z_g)` and
    /// `h = sigmoid(z_o) tanh(c')`, returned as `(h, c')`.
    ///
    /// One node each way where composed it is about ten ops forward and twenty backward (one
    /// dispatch each on a GPU); `h` and `c'` are views of one `[rows, 2, u]` output.
    ///
    /// ```
    /// use weft_core::{Device, Tensor};
    /// let z = Tensor::zeros(&[2, 12], &Device::Cpu)?;
    /// let c = Tensor::ones(&[2, 3], &Device::Cpu)?;
    /// let (h, c2) = Tensor::lstm_cell(&z, &c)?;
    /// // All gates at sigmoid(0) = 0.5 and tanh(0) = 0: c' = 0.5 c, h = 0.5 tanh(c').
    /// assert_eq!(c2.to_vec::<f32>()?, vec![0.5; 6]);
    /// assert!((h.to_vec::<f32>()?[0] - 0.5 * 0.5f32.tanh()).abs() < 1e-6);
    /// # Ok::<(), weft_core::Error>(())
    /// ```
    pub fn lstm_cell(z: &Tensor, c: &Tensor) -> Result<(Tensor, Tensor)> {
        Tensor::lstm_step(z, None, c)
    }

    /// [`lstm_cell`](Tensor::lstm_cell) with the gates' pre-activations given as two shares of
    /// one shape, `x` (the input's, `x W + b`) and `h` (the state's, `h U`), added in the step:
    /// the bits of `lstm_cell(&x.add(h)?, c)` without a pass (a dispatch on a GPU) for the sum.
    ///
    /// ```
    /// use weft_core::{Device, Tensor};
    /// let x = Tensor::rand(-1.0, 1.0, &[2, 12], 1, &Device::Cpu)?;
    /// let h = Tensor::rand(-1.0, 1.0, &[2, 12], 2, &Device::Cpu)?;
    /// let c = Tensor::ones(&[2, 3], &Device::Cpu)?;
    /// let (h1, c1) = Tensor::lstm_cell_of_shares(&x, &h, &c)?;
    /// let (h2, c2) = Tensor::lstm_cell(&x.add(&h)?, &c)?;
    /// assert_eq!((h1.to_vec::<f32>()?, c1.to_vec::<f32>()?), (h2.to_vec::<f32>()?, c2.to_vec::<f32>()?));
    /// # Ok::<(), weft_core::Error>(())
    /// ```
    pub fn lstm_cell_of_shares(x: &Tensor, h: &Tensor, c: &Tensor) -> Result<(Tensor, Tensor)> {
        Tensor::lstm_step(x, Some(h), c)
    }

    /// The LSTM step of `z` (or of `z + second`) and `c`.
    fn lstm_step(z: &Tensor, second: Option<&Tensor>, c: &Tensor) -> Result<(Tensor, Tensor)> {
        for t in [Some(z), second, Some(c)].into_iter().flatten() {
            t.expect_f32("lstm_cell")?;
            z.same_device(t, "lstm_cell")?;
        }
        let fits = c.rank() == 2
            && z.rank() == 2
            && Some(z.dims()[1]) == c.dims()[1].checked_mul(4)
            && z.dims()[0] == c.dims()[0];
        if !fits || second.is_some_and(|h| h.dims() != z.dims()) {
            let shares = second.map_or(String::new(), |h| format!(" and {:?}", h.dims()));
            return Err(Error::invalid(
                "lstm_cell",
                format!(
                    "gates of shape {:?}{shares} for a state of shape {:?}: want [rows, 4u] and [rows, u]",
                    z.dims(),
                    c.dims()
                ),
            ));
        }
        let (rows, u) = (c.dims()[0], c.dims()[1]);
        let storage = with_share(second, |h| z.storage().lstm_cell(z.layout(), h, (&c.storage(), c.layout())))?;
        let (zb, hb, cb) = (z.clone(), second.cloned(), c.clone());
        let backward = Arc::new(move |g: &Tensor| -> Result<Vec<Option<Tensor>>> {
            zb.same_device(g, "lstm_cell")?;
            let d = with_share(hb.as_ref(), |h| {
                zb.storage().lstm_cell_grad(zb.layout(), h, (&cb.storage(), cb.layout()), (&g.storage(), g.layout()))
            })?;
            let d = Tensor::from_storage(d, &[rows, 5 * u], DType::F32, zb.device().clone(), None);
            let dz = d.narrow(1, 0, 4 * u)?;
            // Both shares of a sum get its gradient.
            let mut grads = vec![Some(dz.clone())];
            if hb.is_some() {
                grads.push(Some(dz));
            }
            grads.push(Some(d.narrow(1, 4 * u, u)?));
            Ok(grads)
        });
        let mut inputs = vec![z.clone()];
        inputs.extend(second.cloned());
        inputs.push(c.clone());
        let node = Op::Custom { name: "lstm_cell", inputs, backward };
        let out = Tensor::from_storage(storage, &[rows, 2, u], DType::F32, z.device().clone(), Some(node));
        // c' first: h is the last tensor made, the layer's output where a region's last is read
        // as its output (`Model::summary`, the planner's graph).
        let c2 = out.narrow(1, 1, 1)?.squeeze(1)?;
        Ok((out.narrow(1, 0, 1)?.squeeze(1)?, c2))
    }

    /// One step of a GRU cell as Keras runs it by default (`reset_after`, tanh and sigmoid), from
    /// the input's share of the gates `x` (`[rows, 3u]`: `x W + b`, gates in Keras' order z, r, h),
    /// the state's share `hr` (`[rows, 3u]`: `h U + b_r`) and the state `h` (`[rows, u]`):
    /// `z = sigmoid(x_z + hr_z)`, `r = sigmoid(x_r + hr_r)`, `hh = tanh(x_h + r hr_h)`, and the
    /// new state `hh + z (h - hh)`.
    ///
    /// One node each way where composed it is about ten ops forward and eighteen backward.
    ///
    /// ```
    /// use weft_core::{Device, Tensor};
    /// let (x, hr) = (Tensor::zeros(&[2, 9], &Device::Cpu)?, Tensor::zeros(&[2, 9], &Device::Cpu)?);
    /// let h = Tensor::ones(&[2, 3], &Device::Cpu)?;
    /// // z = 0.5 and hh = tanh(0) = 0: the state halves.
    /// assert_eq!(Tensor::gru_cell(&x, &hr, &h)?.to_vec::<f32>()?, vec![0.5; 6]);
    /// # Ok::<(), weft_core::Error>(())
    /// ```
    pub fn gru_cell(x: &Tensor, hr: &Tensor, h: &Tensor) -> Result<Tensor> {
        for t in [x, hr, h] {
            t.expect_f32("gru_cell")?;
            x.same_device(t, "gru_cell")?;
        }
        let three = h.rank() == 2
            && h.dims()[1].checked_mul(3).is_some_and(|n| [x, hr].iter().all(|t| t.dims() == [h.dims()[0], n]));
        if !three {
            return Err(Error::invalid(
                "gru_cell",
                format!(
                    "shares of the gates of shapes {:?} and {:?} for a state of shape {:?}: want [rows, 3u] twice and [rows, u]",
                    x.dims(),
                    hr.dims(),
                    h.dims()
                ),
            ));
        }
        let (rows, u) = (h.dims()[0], h.dims()[1]);
        let storage = x.storage().gru_cell(x.layout(), (&hr.storage(), hr.layout()), (&h.storage(), h.layout()))?;
        let (xb, rb, hb) = (x.clone(), hr.clone(), h.clone());
        let backward = Arc::new(move |g: &Tensor| -> Result<Vec<Option<Tensor>>> {
            xb.same_device(g, "gru_cell")?;
            let d = xb.storage().gru_cell_grad(
                xb.layout(),
                (&rb.storage(), rb.layout()),
                (&hb.storage(), hb.layout()),
                (&g.storage(), g.layout()),
            )?;
            let d = Tensor::from_storage(d, &[rows, 7 * u], DType::F32, xb.device().clone(), None);
            Ok(vec![Some(d.narrow(1, 0, 3 * u)?), Some(d.narrow(1, 3 * u, 3 * u)?), Some(d.narrow(1, 6 * u, u)?)])
        });
        let node = Op::Custom { name: "gru_cell", inputs: vec![x.clone(), hr.clone(), h.clone()], backward };
        Ok(Tensor::from_storage(storage, &[rows, u], DType::F32, x.device().clone(), Some(node)))
    }
}

/// `f` given the storage and layout of the second share of an LSTM's gates, where there is one.
fn with_share<T>(h: Option<&Tensor>, f: impl FnOnce(Option<(&Storage, &Layout)>) -> Result<T>) -> Result<T> {
    match h {
        Some(h) => f(Some((&h.storage(), h.layout()))),
        None => f(None),
    }
}
