//! Megatron's f and g by hand, on two ranks: a column-split layer then a row-split one, the
//! way every split MLP in weft runs, with nothing but tensors and the four collective ops.
//!
//! `y = gelu(x @ w1) @ w2` on one device, then on two ranks (threads of this process, talking
//! through `InHost`): rank r holds columns r of `w1` and rows r of `w2`. Three runs:
//!
//! - with f and g: the output, every gradient and the input's gradient equal one device;
//! - without g: each rank's output is only its partial sum;
//! - without f: the output is right, but the input's gradient on each rank holds only its own
//!   half, so whatever came before `x` would train on half a gradient, silently.
//!
//! `cargo run --release --example two_ranks`

use std::sync::Arc;
use weft::core::collectives::{copy_to_parallel, reduce_from_parallel};
use weft::parallel::InHost;
use weft::prelude::*;

const SPLIT: [usize; 2] = [4, 4]; // 8 hidden units, 4 per rank

/// What one run gives: the output and the gradients of `x`, `w1` (this rank's columns) and `w2`
/// (this rank's rows).
struct Run {
    y: Tensor,
    dx: Tensor,
    dw1: Tensor,
    dw2: Tensor,
}

/// The forward and backward pass of `gelu(x @ w1) @ w2` on whatever parts it is given, with f
/// before the first matmul and g after the second when `comm` is given and asked for.
fn run(x: &Tensor, w1: &Tensor, w2: &Tensor, comm: Option<(&Arc<dyn Collectives>, bool, bool)>) -> Result<Run> {
    let (x, w1, w2) = (Var::new(x.clone())?, Var::new(w1.clone())?, Var::new(w2.clone())?);
    let mut input = x.as_tensor().clone();
    if let Some((c, true, _)) = comm {
        input = copy_to_parallel(&input, c.clone()); // f: identity now, all-reduce of dx later
    }
    let partial = input.matmul(w1.as_tensor())?.gelu()?.matmul(w2.as_tensor())?;
    let y = match comm {
        Some((c, _, true)) => reduce_from_parallel(&partial, c.clone())?, // g: sum the partial outputs
        _ => partial,
    };
    // A loss of the whole output: every rank computes it on the same y.
    let grads = y.square()?.sum_all()?.backward()?;
    let grad = |v: &Var| grads.get(v.as_tensor()).cloned().ok_or_else(|| Error::Msg("no gradient".into()));
    Ok(Run { y: y.clone(), dx: grad(&x)?, dw1: grad(&w1)?, dw2: grad(&w2)? })
}

fn max_diff(a: &Tensor, b: &Tensor) -> Result<f32> {
    Ok(a.sub(b)?.abs()?.to_vec::<f32>()?.into_iter().fold(0.0, f32::max))
}

pub fn main() -> Result<()> {
    let dev = Device::Cpu;
    let x = Tensor::rand(-1.0, 1.0, &[4, 6], 1, &dev)?;
    let w1 = Tensor::rand(-0.5, 0.5, &[6, 8], 2, &dev)?;
    let w2 = Tensor::rand(-0.5, 0.5, &[8, 3], 3, &dev)?;
    let one = run(&x, &w1, &w2, None)?;

    println!("y = gelu(x @ w1) @ w2: x [4, 6], w1 [6, 8] split by columns {SPLIT:?}, w2 [8, 3] split by rows");
    println!(
        "{:<16} {:>10} {:>10} {:>10} {:>10}   (largest difference from one device, over both ranks)",
        "", "y", "dx", "dw1", "dw2"
    );
    let mut right = true;
    for (name, f, g) in [("with f and g", true, true), ("without g", true, false), ("without f", false, true)] {
        let ranks = InHost::run(2, |rank, comm| {
            let comm: Arc<dyn Collectives> = Arc::new(comm.clone());
            let start = rank * SPLIT[0];
            let mine =
                run(&x, &w1.narrow(1, start, SPLIT[rank])?, &w2.narrow(0, start, SPLIT[rank])?, Some((&comm, f, g)))?;
            Ok([
                max_diff(&mine.y, &one.y)?,
                max_diff(&mine.dx, &one.dx)?,
                max_diff(&mine.dw1, &one.dw1.narrow(1, start, SPLIT[rank])?)?,
                max_diff(&mine.dw2, &one.dw2.narrow(0, start, SPLIT[rank])?)?,
            ])
        });
        let mut worst = [0f32; 4];
        for r in ranks {
            for (w, d) in worst.iter_mut().zip(r?) {
                *w = w.max(d);
            }
        }
        println!("{name:<16} {:>10.2e} {:>10.2e} {:>10.2e} {:>10.2e}", worst[0], worst[1], worst[2], worst[3]);
        let exact = worst.iter().all(|d| *d < 1e-5);
        right &= exact == (f && g);
    }
    println!();
    println!("Without g each rank's y is its partial sum, and every gradient after it is wrong too.");
    println!("Without f, y and the weights' gradients are right (each rank's matmul sees the whole x),");
    println!("but dx on each rank is only its half of the sum: a layer before x would get half a gradient.");
    if !right {
        return Err(Error::Msg("the two-rank runs did not come out as described".into()));
    }
    Ok(())
}
