//! Resident memory of MLP training on the Cpu (784-1024-1024-10, ReLU, softmax cross-entropy,
//! Adam, batch 256, 20 batches of random data an epoch, through `Model::fit`): the process's
//! resident set after 100 and after 1,000 steps, and its peak (Linux' VmRSS and VmHWM). Flat
//! memory means the two readings agree; `benches/peers/memory_side.sh` runs Keras-JAX's same fit
//! beside it. `cargo bench --bench train_memory`

mod common;

use weft::nn::{FitOptions, Model};
use weft::prelude::*;

/// A field of /proc/self/status in MiB, or None off Linux.
fn status_mib(field: &str) -> Option<f64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with(field))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

fn main() -> Result<()> {
    let dev = Device::Cpu;
    let mut model = common::mlp(&dev)?;
    let (b, batches) = (256, 20);
    let x = Tensor::rand(0.0, 1.0, &[b * batches, 784], 1, &dev)?;
    let labels: Vec<u32> = (0..b * batches).map(|i| (i * 7 % 10) as u32).collect();
    let y = Tensor::from_vec(labels, &[b * batches], &dev)?;
    let fit = |model: &mut Model, epochs: usize| {
        let opts = FitOptions { epochs, batch_size: b, shuffle: false, verbose: false, ..Default::default() };
        model.fit(&x, &y, opts).map(drop)
    };
    fit(&mut model, 5)?; // 100 steps
    let early = status_mib("VmRSS:");
    fit(&mut model, 45)?; // 900 more
    let (late, peak) = (status_mib("VmRSS:"), status_mib("VmHWM:"));
    let size = "mlp784-1024-1024-10/b256";
    match (early, late, peak) {
        (Some(early), Some(late), Some(peak)) => {
            common::report("train_rss_100_steps", &dev, size, early, "MiB");
            common::report("train_rss_1000_steps", &dev, size, late, "MiB");
            common::report("train_peak_rss", &dev, size, peak, "MiB");
        }
        _ => eprintln!("note: no /proc/self/status here; resident memory is read on Linux only"),
    }
    Ok(())
}
