//! Training-step time of tiny_gpt (2 blocks of width 64, tied vocabulary head) on 1 device and
//! split over 2 and 4, on Cpu devices and on virtual devices of each GPU adapter, with the
//! fraction of the step each rank spends in collectives (copies to and from the host included).
//!
//! `cargo bench --bench tp_step` (`WEFT_BENCH_DEVICES=cpu` for Cpu devices only)

mod common;

use std::time::Instant;
use weft::nn::optim::Adam;
use weft::nn::{Loss, Model};
use weft::parallel::{AutoConfig, DeviceMesh, ShardedModel};
use weft::prelude::*;

#[path = "../examples/common/answer_gpt.rs"]
mod answer_gpt;
use answer_gpt::{VOCAB, gpt};

fn batch(n: usize, step: u64) -> Result<(Tensor, Tensor)> {
    let key = weft::core::rng::seed_key(step);
    let x: Vec<u32> =
        (0..n * 11).map(|i| (weft::core::rng::uniform(key, i as u32) * VOCAB as f32) as u32 % VOCAB as u32).collect();
    let y: Vec<u32> =
        (0..n * 4).map(|i| (weft::core::rng::uniform(key, 1 << 20 | i as u32) * 10.0) as u32 % 10).collect();
    Ok((Tensor::from_vec(x, &[n, 11], &Device::Cpu)?, Tensor::from_vec(y, &[n, 4], &Device::Cpu)?))
}

const LOSS: Loss = Loss::SparseCategoricalCrossentropy { from_logits: true };

fn main() -> Result<()> {
    for base in common::devices() {
        let (n, warm, reps) = if base.is_gpu() { (32, 1, 2) } else { (128, 2, 6) };
        let (x, y) = batch(n, 1)?;
        // One device, no tensor parallelism.
        let mut one = Model::new(gpt(), &base);
        one.compile(Adam::new(1e-3), LOSS, &[])?;
        for _ in 0..warm {
            one.train_on_batch(&x, &y)?;
        }
        let t = Instant::now();
        for _ in 0..reps {
            one.train_on_batch(&x, &y)?;
        }
        let single = t.elapsed().as_secs_f64() / reps as f64;
        common::report("tp_step", &base, &format!("1 device, batch {n}"), single * 1e3, "ms/step");
        for ranks in [2, 4] {
            let mesh = match &base {
                Device::Gpu(_) => DeviceMesh::virtual_gpus(ranks)?,
                _ => DeviceMesh::cpus(ranks)?,
            };
            let plan = AutoConfig::new().min_params(0).input_dtype(DType::U32).plan(&gpt(), &[n, 11], ranks, 1)?;
            let mut model = ShardedModel::new(gpt, &mesh, &plan)?;
            model.compile(Adam::new(1e-3), LOSS, &[])?;
            for _ in 0..warm {
                model.train_on_batch(&x, &y)?;
            }
            let (t, c0) = (Instant::now(), model.collective_time());
            for _ in 0..reps {
                model.train_on_batch(&x, &y)?;
            }
            let step = t.elapsed().as_secs_f64() / reps as f64;
            let coll = (model.collective_time() - c0).as_secs_f64() / reps as f64;
            common::report("tp_step", &base, &format!("{ranks} devices, batch {n}"), step * 1e3, "ms/step");
            common::report(
                "tp_step/collectives",
                &base,
                &format!("{ranks} devices, batch {n}"),
                100.0 * coll / step,
                "% of step",
            );
        }
    }
    Ok(())
}
