//! verify's batches from the rows of a data set: a fresh batch every step, the same on both sides.

use super::BatchSource;
use weft_core::{DType, Device, Error, Result, Tensor};
use weft_nn::Inputs;
use weft_nn::data::{Dataset, shuffled};

/// Seeds the row order of each pass (any fixed value: both sides read the same batches).
const SEED: u64 = 0x5eed_ba7c;

/// Step `s` takes rows `s * batch ..` of an endless sequence of passes over the rows, each pass
/// in its own seeded order, so batches never repeat a pass's row twice before it ends.
pub fn rows(x: &Inputs, y: &Inputs, batch: usize) -> Result<BatchSource<'static>> {
    // Dataset holds the rows as f32 (one gather kernel for ids and labels too); each batch goes
    // back to the caller's dtypes.
    let data = Dataset::new(x, y)?;
    let dtypes = |t: &Inputs| t.entries().iter().map(|(_, t)| t.dtype()).collect::<Vec<DType>>();
    let (dx, dy) = (dtypes(x), dtypes(y));
    let n = data.len();
    if n == 0 || batch == 0 {
        return Err(Error::invalid("verify", format!("batches of {batch} from {n} rows")));
    }
    if batch >= n {
        // One batch holds every row: train on the data as given.
        let (x, y) = (x.clone(), y.clone());
        return Ok(Box::new(move |_| Ok((x.clone(), y.clone()))));
    }
    let mut pass: Option<(usize, Vec<u32>)> = None;
    Ok(Box::new(move |step| {
        let mut ids = Vec::with_capacity(batch);
        for i in step * batch..(step + 1) * batch {
            let p = i / n;
            if pass.as_ref().is_none_or(|(q, _)| *q != p) {
                pass = Some((p, shuffled(n, SEED ^ p as u64)));
            }
            ids.push(pass.as_ref().map_or(0, |(_, order)| order[i % n]));
        }
        let (x, y) = data.inputs();
        let device = x.entries()[0].1.device();
        let t = Tensor::from_slice(&ids, &[ids.len()], &Device::Cpu)?.to_device(device)?;
        let back = |part: &Inputs, dtypes: &[DType]| -> Result<Inputs> {
            let mut out = Inputs::new();
            for ((name, v), d) in part.index_select(&t)?.entries().iter().zip(dtypes) {
                out = out.with(name, v.to_dtype(*d)?);
            }
            Ok(out)
        };
        Ok((back(x, &dx)?, back(y, &dy)?))
    }))
}
