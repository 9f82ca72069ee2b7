//! Shared by the benchmarks: the devices to measure, timing, and the JSON line format.
#![allow(dead_code)]

use std::time::{Duration, Instant};
use weft::prelude::*;

/// Cpu and a device on every adapter found (lavapipe included). `WEFT_BENCH_DEVICES=cpu,gpu:0`
/// restricts the list; `gpu` alone names every hardware adapter (not lavapipe).
pub fn devices() -> Vec<Device> {
    let filter = std::env::var("WEFT_BENCH_DEVICES").ok();
    let mut out = Vec::new();
    let wanted = |name: &str| filter.as_deref().is_none_or(|f| f.split(',').any(|x| x.trim() == name));
    if wanted("cpu") {
        out.push(Device::Cpu);
    }
    for a in weft::devices() {
        let hardware = filter.is_some() && wanted("gpu") && !a.is_software;
        if !wanted(&format!("gpu:{}", a.index)) && !hardware {
            continue;
        }
        match Device::gpu(a.index) {
            Ok(d) => out.push(d),
            Err(e) => eprintln!("skipping gpu:{} ({}): {e}", a.index, a.name),
        }
    }
    out
}

/// Seconds per call of `f`: one warm-up call, then calls (each waited for) until `budget` has
/// passed, at least `min_reps`; the fastest call is reported, since on a shared machine the
/// slower ones measure the neighbours.
pub fn time_per_call(
    dev: &Device,
    budget: Duration,
    min_reps: usize,
    mut f: impl FnMut() -> Result<()>,
) -> Result<f64> {
    f()?;
    dev.synchronize()?;
    let start = Instant::now();
    let mut best = f64::INFINITY;
    let mut reps = 0;
    while reps < min_reps.max(1) || start.elapsed() < budget {
        let t = Instant::now();
        f()?;
        dev.synchronize()?;
        best = best.min(t.elapsed().as_secs_f64());
        reps += 1;
    }
    Ok(best)
}

/// Calls of `f` a second, measured as the peer kit (`../shared/peers`) measures its peers: a
/// warm-up of at least 3 calls and 1 s, then a block of calls sized so that `blocks` blocks take
/// at least `min_secs`, and the median block's rate. Where a figure is set beside a peer's, this
/// one compares like with like ([`time_per_call`]'s fastest call would favour weft).
pub fn median_block_rate(dev: &Device, min_secs: f64, blocks: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    let start = Instant::now();
    let mut n = 0;
    while n < 3 || start.elapsed() < Duration::from_secs(1) {
        f()?;
        dev.synchronize()?;
        n += 1;
    }
    let blocks = blocks.max(1);
    let target = min_secs / blocks as f64;
    let mut k = 1usize;
    loop {
        let t = Instant::now();
        for _ in 0..k {
            f()?;
        }
        dev.synchronize()?;
        let dt = t.elapsed().as_secs_f64();
        if dt >= target {
            break;
        }
        k = (k * 2).max((k as f64 * target / dt.max(1e-6) * 1.2) as usize);
    }
    let mut rates = Vec::with_capacity(blocks);
    for _ in 0..blocks {
        let t = Instant::now();
        for _ in 0..k {
            f()?;
        }
        dev.synchronize()?;
        rates.push(k as f64 / t.elapsed().as_secs_f64());
    }
    rates.sort_by(f64::total_cmp);
    Ok(rates[blocks / 2])
}

/// Seconds the calling thread has run on a CPU (Linux's `/proc/thread-self/schedstat`, in ns);
/// `None` elsewhere. On a GPU, a step's share of it is the host's cost of recording and
/// submitting the step's work, which a real GPU pays as lavapipe does (lavapipe runs the kernels
/// on threads of its own).
pub fn thread_cpu_secs() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    Some(s.split_whitespace().next()?.parse::<f64>().ok()? * 1e-9)
}

/// One JSON line: `{"bench":..,"device":..,"size":..,"value":..,"unit":..}`.
pub fn report(bench: &str, dev: &Device, size: &str, value: f64, unit: &str) {
    let device = dev.describe().replace('"', "'");
    println!(
        "{{\"bench\":\"{bench}\",\"device\":\"{device}\",\"size\":\"{size}\",\"value\":{value:.3},\"unit\":\"{unit}\"}}"
    );
}

/// A product rate's share of the device's FMA ceiling (`Device::fma_peak`), as one JSON line in %.
pub fn report_share(bench: &str, dev: &Device, size: &str, flops_per_sec: f64, peak: f64) {
    report(bench, dev, size, 100.0 * flops_per_sec / peak, "%");
}

/// The widths of the peers' MLP: its input, then each dense layer's outputs.
pub const MLP_WIDTHS: [usize; 4] = [784, 1024, 1024, 10];

/// The peers' MLP on `dev` ([`MLP_WIDTHS`]: ReLU between layers), softmax cross-entropy on
/// logits, Adam 1e-3.
pub fn mlp(dev: &Device) -> Result<weft::nn::Model> {
    mlp_of(dev, &MLP_WIDTHS)
}

/// [`mlp`] of other widths: the input's, then each dense layer's outputs.
pub fn mlp_of(dev: &Device, widths: &[usize]) -> Result<weft::nn::Model> {
    use weft::nn::layers::Dense;
    use weft::nn::{Activation, Loss, Model, Sequential, optim::Adam};
    let last = widths.len() - 1;
    let net = (1..=last).fold(Sequential::new(), |net, l| {
        let dense = Dense::new(widths[l]);
        net.add(if l < last { dense.activation(Activation::Relu) } else { dense })
    });
    let mut model = Model::new(net, dev);
    model.compile(Adam::new(1e-3), Loss::SparseCategoricalCrossentropy { from_logits: true }, &[])?;
    Ok(model)
}
