//! f32 matmul throughput (GFLOP/s) on every device found (sizes: `WEFT_BENCH_SIZES`, default 256
//! to 2048), the device's FMA ceiling (`Device::fma_peak`) and each size's share of it; on GPUs
//! also each kernel variant at 1024; and small-batch inference products (a few rows times a
//! 384 x 1536 weight, without gradients, as `predict` runs them), and an encoder's dense layers
//! in inference with and without their weights in cache (`dense_stack`). `cargo bench --bench matmul`
//! (WEFT_BENCH_DEVICES=cpu,gpu:0 chooses the devices).

mod common;

use std::time::Duration;
use weft::prelude::*;

fn gflops(dev: &Device, batch: usize, n: usize) -> Result<f64> {
    let shape: Vec<usize> = if batch > 1 { vec![batch, n, n] } else { vec![n, n] };
    let a = Tensor::rand(-1.0, 1.0, &shape, 1, dev)?;
    let b = Tensor::rand(-1.0, 1.0, &shape, 2, dev)?;
    let secs = common::time_per_call(dev, Duration::from_secs(2), 1, || a.matmul(&b).map(drop))?;
    Ok(2.0 * (batch * n * n * n) as f64 / secs / 1e9)
}

/// The square sizes to measure: `WEFT_BENCH_SIZES=1024,4096,8192` (default 256 to 2048).
fn sizes() -> Result<Vec<usize>> {
    let Ok(list) = std::env::var("WEFT_BENCH_SIZES") else {
        return Ok(vec![256, 512, 1024, 2048]);
    };
    list.split(',').map(|s| s.trim().parse().map_err(|e| Error::Msg(format!("WEFT_BENCH_SIZES: {s:?}: {e}")))).collect()
}

fn main() -> Result<()> {
    // The thread count a user sets (RAYON_NUM_THREADS or one per core); this thread works on
    // each op beside weft's helpers.
    weft::set_num_threads(0)?;
    for dev in common::devices() {
        // The device's own limit: nothing but independent multiply-adds (on the Cpu, on every
        // thread of the pool, at the product kernel's vector width).
        let peak = dev.fma_peak()?;
        common::report("fma_peak", &dev, "-", peak / 1e9, "GFLOP/s");
        if let Device::Gpu(ctx) = &dev {
            let ranking: Vec<&str> = weft::core::gpu::matmul_ranking(ctx)?.iter().map(|v| v.kernel).collect();
            eprintln!("{}: matmul autotune ranking {ranking:?}", dev.describe());
            for v in weft::core::gpu::MATMUL_VARIANTS {
                let forced = Device::gpu(ctx.adapter_index())?;
                if let Device::Gpu(c) = &forced {
                    c.force_matmul(v.kernel)?;
                }
                common::report(&format!("matmul[{}]", v.kernel), &forced, "1024", gflops(&forced, 1, 1024)?, "GFLOP/s");
            }
        }
        for n in sizes()? {
            let g = gflops(&dev, 1, n)?;
            common::report("matmul", &dev, &n.to_string(), g, "GFLOP/s");
            common::report_share("matmul_of_fma_peak", &dev, &n.to_string(), g * 1e9, peak);
        }
        common::report("matmul", &dev, "16x256x256x256", gflops(&dev, 16, 256)?, "GFLOP/s");
        for rows in [1, 8, 32, 64, 128] {
            let x = Tensor::rand(-1.0, 1.0, &[rows, 384], 1, &dev)?;
            let w = Tensor::rand(-1.0, 1.0, &[384, 1536], 2, &dev)?;
            let secs = common::time_per_call(&dev, Duration::from_secs(1), 2, || no_grad(|| x.matmul(&w)).map(drop))?;
            let label = format!("{rows}x384x1536");
            common::report("matmul_infer", &dev, &label, 2.0 * (rows * 384 * 1536) as f64 / secs / 1e9, "GFLOP/s");
        }
        dense_stack(&dev)?;
    }
    Ok(())
}

/// An encoder's dense layers in inference, as MiniLM's six run them on 256 tokens (the fused
/// query-key-value projection, the attention's output, the feed-forward pair with GELU), each
/// layer with weights of its own, so that every product's weights come from L3 or memory the
/// first time its rows pass over them (`dense_stack`); and the same products over one layer's
/// weights six times, which stay in cache (`dense_stack_warm`): what the weights' first pass
/// costs is the difference.
fn dense_stack(dev: &Device) -> Result<()> {
    use weft::core::ops::UnaryOp;
    let shapes = [
        (384, 1152, UnaryOp::Identity),
        (384, 384, UnaryOp::Identity),
        (384, 1536, UnaryOp::GeluErf),
        (1536, 384, UnaryOp::Identity),
    ];
    let rows = 256;
    let mut layers = Vec::new();
    for l in 0..6u64 {
        for (i, &(k, n, op)) in shapes.iter().enumerate() {
            let w = Tensor::rand(-1.0, 1.0, &[k, n], 10 + 4 * l + i as u64, dev)?;
            let b = Tensor::rand(-1.0, 1.0, &[n], 100 + 4 * l + i as u64, dev)?;
            layers.push((w, b, op));
        }
    }
    let xs = [Tensor::rand(-1.0, 1.0, &[rows, 384], 1, dev)?, Tensor::rand(-1.0, 1.0, &[rows, 1536], 2, dev)?];
    let flops = 6.0 * shapes.iter().map(|&(k, n, _)| 2.0 * (rows * k * n) as f64).sum::<f64>();
    for (name, own) in [("dense_stack", true), ("dense_stack_warm", false)] {
        let run = || {
            no_grad(|| {
                for i in 0..24 {
                    let (w, b, op) = &layers[if own { i } else { i % 4 }];
                    xs[usize::from(i % 4 == 3)].matmul_add_unary(w, b, *op)?;
                }
                Ok(())
            })
        };
        let secs = common::time_per_call(dev, Duration::from_secs(2), 2, run)?;
        common::report(
            name,
            dev,
            "6x(256x384x1152,256x384x384,256x384x1536,256x1536x384)",
            flops / secs / 1e9,
            "GFLOP/s",
        );
    }
    Ok(())
}
