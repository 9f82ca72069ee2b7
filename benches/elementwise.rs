//! Memory bandwidth of elementwise work on 16M elements, in GB/s of bytes read and written, on
//! every device found: a broadcast add ([4096, 4096] + [4096]), a product of two, a difference
//! with one value repeated along each row ([4096, 4096] - [4096, 1], as `x - mean`), and a
//! transposed copy (`x.t().contiguous()`). `cargo bench --bench elementwise`

mod common;

use std::time::Duration;
use weft::prelude::*;

fn main() -> Result<()> {
    let n = 4096;
    for dev in common::devices() {
        let a = Tensor::rand(-1.0, 1.0, &[n, n], 1, &dev)?;
        let b = Tensor::rand(-1.0, 1.0, &[n], 2, &dev)?;
        let secs = common::time_per_call(&dev, Duration::from_secs(2), 3, || a.add(&b).map(drop))?;
        // Read a, write the result (b is 16 KiB and stays in cache).
        let bytes = 2.0 * (n * n * 4) as f64;
        common::report("broadcast_add", &dev, "4096x4096+4096", bytes / secs / 1e9, "GB/s");
        let secs = common::time_per_call(&dev, Duration::from_secs(2), 3, || a.mul(&a).map(drop))?;
        common::report("mul_same_shape", &dev, "4096x4096", 3.0 * (n * n * 4) as f64 / secs / 1e9, "GB/s");
        let col = Tensor::rand(-1.0, 1.0, &[n, 1], 3, &dev)?;
        let secs = common::time_per_call(&dev, Duration::from_secs(2), 3, || a.sub(&col).map(drop))?;
        common::report("row_repeated_sub", &dev, "4096x4096-4096x1", bytes / secs / 1e9, "GB/s");
        let secs = common::time_per_call(&dev, Duration::from_secs(2), 3, || a.t()?.contiguous().map(drop))?;
        common::report("transpose_copy", &dev, "4096x4096", bytes / secs / 1e9, "GB/s");
    }
    Ok(())
}
