//! verify's options: batches drawn afresh from the rows, and `own_init`, which checks the weights
//! each rank draws for its part. (Long runs on fresh batches: tests/equivalence.rs.)

use super::{VerifyOptions, verify_with};
use crate::{AutoConfig, DeviceMesh};
use weft_core::{Device, Tensor};
use weft_nn::layers::{Dense, Embedding};
use weft_nn::optim::Adam;
use weft_nn::{Activation, Loss, Sequential};

#[test]
fn batches_from_rows_cycle_through_every_row_in_a_fresh_order_each_pass() {
    let x = Tensor::from_vec((0..10).map(|i| i as f32).collect(), &[10, 1], &Device::Cpu).unwrap();
    let y = Tensor::from_vec((0..10u32).collect(), &[10], &Device::Cpu).unwrap();
    let mut opts = VerifyOptions::rows(&x, &y, 4, 5).unwrap();
    let rows: Vec<Vec<u32>> =
        (0..5).map(|s| (opts.batches)(s).unwrap().1.entries()[0].1.to_vec::<u32>().unwrap()).collect();
    let first: Vec<u32> = rows.concat()[..10].to_vec();
    let mut sorted = first.clone();
    sorted.sort();
    assert_eq!(sorted, (0..10).collect::<Vec<u32>>(), "one pass holds every row once: {rows:?}");
    assert_ne!(rows.concat()[10..20], first[..], "the second pass has its own order");
    // The same step gives the same batch (both sides of verify read it).
    assert_eq!((opts.batches)(3).unwrap().1.entries()[0].1.to_vec::<u32>().unwrap(), rows[3]);
}

#[test]
fn own_init_draws_the_same_weights_as_one_device_at_step_zero() {
    // Uneven splits (3 devices) of a column/row pair, a gathered layer, and a vocabulary table.
    let net = || {
        Sequential::new()
            .add(Embedding::new(13, 10).named("tokens"))
            .add(Dense::new(22).activation(Activation::Relu))
            .add(Dense::new(10))
            .add(Dense::new(7))
    };
    let ids: Vec<u32> = (0..16 * 3).map(|i| (i * 5 + 1) % 13).collect();
    let x = Tensor::from_vec(ids, &[16, 3], &Device::Cpu).unwrap();
    let y = Tensor::rand(-1.0, 1.0, &[16, 3, 7], 4, &Device::Cpu).unwrap();
    let mesh = DeviceMesh::cpus(3).unwrap();
    let plan = AutoConfig::new().min_params(0).input_dtype(weft_core::DType::U32).plan(&net(), &[4, 3], 3, 1).unwrap();
    assert!(plan.layers.iter().filter(|l| l.style.name() != "replicated").count() >= 3, "{plan}");
    let opts = VerifyOptions { own_init: true, ..VerifyOptions::rows(&x, &y, 4, 5).unwrap() };
    let report = verify_with(net, &mesh, &plan, Adam::new(0.01), Loss::MeanSquaredError, opts).unwrap();
    let initial: Vec<_> = report.differences.iter().filter(|d| d.what == "initial weight").collect();
    assert_eq!(initial.len(), 7, "{report}");
    for d in initial {
        assert_eq!(d.max_abs, 0.0, "{} differs at step 0:\n{report}", d.path);
    }
    assert!(report.max_rel() < 1e-4, "{report}");
}
